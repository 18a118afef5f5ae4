"""The training's own figures in words: step, rate, loss and ETA, one spelling for every view.

Read from a ``step`` journal line or from the artifact's ``progress.steps``: both hold every
key read here (the step event's fields, null where the trainer's files do not say):
``step 1,150/1,200 | 55 steps/s | loss 6.15 | ETA 1m00s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._contract import format_duration


def step_text(steps: Mapping[str, Any]) -> str:
    """``step 1,150 of 1,200`` (or ``step 1,150`` when the total is unknown)."""
    step, total = steps["step"], steps["max_steps"]
    if not isinstance(step, int):
        return ""
    return f"step {step:,}" + (f" of {total:,}" if isinstance(total, int) and total else "")


def rate_text(steps: Mapping[str, Any]) -> str:
    """``55 steps/s`` (``0.021 steps/s``, ``1.2e+04 tokens/s`` beside it when logged)."""
    out = []
    for key, unit in (
        ("steps_per_second", "steps/s"),
        ("tokens_per_second", "tokens/s"),
        ("samples_per_second", "samples/s"),
    ):
        value = steps[key]
        if isinstance(value, int | float):
            out.append(f"{_figure(value)} {unit}")
    return ", ".join(out)


def loss_text(steps: Mapping[str, Any]) -> str:
    loss = steps["loss"]
    return f"loss {loss:.4g}" if isinstance(loss, int | float) else ""


def eta_text(steps: Mapping[str, Any]) -> str:
    eta = steps["eta_seconds"]
    return f"ETA {format_duration(eta)}" if isinstance(eta, int | float) else ""


def training_parts(steps: Mapping[str, Any] | None) -> list[str]:
    """The pieces that are known: step, rate, loss, ETA."""
    if not steps:
        return []
    parts = (step_text(steps), rate_text(steps), loss_text(steps), eta_text(steps))
    return [part for part in parts if part]


def training_line(steps: Mapping[str, Any] | None, separator: str = ", ") -> str:
    """``step 1,150 of 1,200, 55 steps/s, loss 6.15, ETA 1m00s``; empty without steps."""
    return separator.join(training_parts(steps))


def _figure(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
