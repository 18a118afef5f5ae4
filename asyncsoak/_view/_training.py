"""The training's own figures in words, one spelling for every view, from a ``step`` line or
the artifact's ``progress.steps``: ``step 1,150/1,200 | 55 steps/s | loss 6.15 | ETA 1m00s``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._contract import format_duration


def step_text(steps: Mapping[str, Any]) -> str:
    """``step 1,150 of 1,200`` (or ``step 1,150`` when the total is unknown)."""
    step, total = steps["step"], steps.get("max_steps")
    if not isinstance(step, int):
        return ""
    return f"step {step:,}" + (f" of {total:,}" if isinstance(total, int) and total else "")


def loss_text(steps: Mapping[str, Any]) -> str:
    """``loss 6.15``; ``loss nan`` for a run that failed on that loss (whatever came after)."""
    loss = steps.get("nonfinite_loss") or steps.get("loss")
    if isinstance(loss, str):
        return f"loss {loss}"
    return f"loss {loss:.4g}" if isinstance(loss, int | float) else ""


def training_line(steps: Mapping[str, Any] | None, separator: str = ", ") -> str:
    """``step 1,150 of 1,200, 55 steps/s, loss 6.15, ETA 1m00s``: the pieces that are known
    (``1.2e+04 tokens/s`` beside the step rate when logged); empty without steps."""
    if not steps:
        return ""
    rates = ((steps.get(f"{what}_per_second"), what) for what in ("steps", "tokens", "samples"))
    rate = ", ".join(
        f"{v:,.0f} {what}/s" if v >= 100 else f"{v:.3g} {what}/s"
        for v, what in rates
        if isinstance(v, int | float)
    )
    eta = steps.get("eta_seconds")
    eta_text = f"ETA {format_duration(eta)}" if isinstance(eta, int | float) else ""
    parts = (step_text(steps), rate, loss_text(steps), eta_text)
    return separator.join(part for part in parts if part)


#: The badput kinds as the goodput line names them.
LOST_WORDS = {
    "startup": "start-up",
    "slow_steps": "slow steps",
    "checkpoint": "checkpoints",
    "stall": "stall",
    "wasted": "redone steps",
    "shutdown": "shutdown",
    "other": "other",
    "queue_wait": "queue wait",
    "recovery": "recovery",
}


def goodput_line(goodput: Mapping[str, Any] | None) -> str:
    """``goodput 78.6 %: lost 5.1 % start-up, 3.3 % checkpoints, 1.5 % slow steps`` (the
    three largest lost parts, as shares of the wall time); empty without a ledger."""
    if not goodput:
        return ""
    ratio, wall = goodput.get("ratio"), goodput.get("wall_seconds") or 0.0
    if not isinstance(ratio, int | float) or wall <= 0:
        return str(goodput.get("note") or "goodput needs training steps")
    lost = sorted(
        ((v, k) for k, v in (goodput.get("badput_seconds") or {}).items() if v >= 0.0005 * wall),
        reverse=True,
    )[:3]
    parts = ", ".join(f"{100 * v / wall:.1f} % {LOST_WORDS.get(k, k)}" for v, k in lost)
    return f"goodput {100 * ratio:.1f} %" + (f": lost {parts}" if parts else "")
