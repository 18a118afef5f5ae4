"""What a stalled run was doing: one verdict, taken when the stall's rule fires and recorded
in ``failures[].activity``, which the headline, the hints and the report all read; pure
functions of the figures (docs/architecture.md, "What a stall was doing")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Tree CPU (percent of one core) from which a stalled tree is busy, below which it is idle.
BUSY_CPU_PERCENT = 20.0
#: The share of samples with a process of the tree running or runnable that makes it busy
#: however small its CPU (a spinner starved of cores is runnable in nearly every sample; a
#: waiting trainer's short bursts, stretched on a loaded machine, in fewer)...
RUNNING_SHARE = 0.8
#: ...given at least this CPU (percent of one core): a tree that got none computed nothing.
RUNNING_CPU_PERCENT = 1.0
#: GPU utilisation (percent) from which a GPU is working.
GPU_BUSY_PERCENT = 10.0
#: Utilisation (percent) from which a GPU counts as fully busy...
GPU_FULL_PERCENT = 90.0
#: ...and the share of its power limit at or below which that busyness is spinning, not work.
LOW_POWER_RATIO = 0.35


def tree_verdict(
    cpu_percent: float | None,
    uninterruptible: Sequence[str] = (),
    running_share: float | None = None,
) -> str:
    """``uninterruptible``, ``busy``, ``idle`` or ``unknown`` (no figure)."""
    if uninterruptible:
        return "uninterruptible"
    if cpu_percent is None:
        return "unknown"
    if cpu_percent >= BUSY_CPU_PERCENT:
        return "busy"
    spinning = running_share is not None and running_share >= RUNNING_SHARE
    return "busy" if spinning and cpu_percent >= RUNNING_CPU_PERCENT else "idle"


def describe_tree(
    cpu_percent: float | None,
    uninterruptible: Sequence[str] = (),
    running_share: float | None = None,
    *,
    cpu_of: str = "tree",
) -> str:
    """The tree's verdict with its figures, as the stall's headline says it (``cpu_of``:
    ``ranks`` when they are the ranks' alone, ``tree`` otherwise)."""
    verdict = tree_verdict(cpu_percent, uninterruptible, running_share)
    if verdict == "uninterruptible":
        return "in uninterruptible sleep (I/O): " + ", ".join(uninterruptible[:4])
    whose = "the ranks' CPU" if cpu_of == "ranks" else "CPU"
    if verdict == "unknown" or cpu_percent is None:
        return f"of unknown activity ({whose} unknown: no sample yet)"
    figure = f"{whose} {cpu_percent:.0f}%"
    if running_share is not None and verdict == "busy" and cpu_percent < BUSY_CPU_PERCENT:
        figure += f", runnable in {running_share:.0%} of its samples"
    if verdict == "busy":
        return f"busy ({figure}): computing without progress, slow or spinning"
    return f"idle ({figure}): waiting, a deadlock, a hung collective or blocked I/O"


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """One GPU's typical figures over the stall."""

    index: int
    utilization_percent: float | None
    power_w: float | None = None
    power_limit_w: float | None = None

    @property
    def power_ratio(self) -> float | None:
        if self.power_w is None or not self.power_limit_w:
            return None
        return self.power_w / self.power_limit_w

    @property
    def verdict(self) -> str:
        """``spinning``, ``busy``, ``idle`` or ``unknown``."""
        util = self.utilization_percent
        if util is None:
            return "unknown"
        ratio = self.power_ratio
        if util >= GPU_FULL_PERCENT and ratio is not None and ratio <= LOW_POWER_RATIO:
            return "spinning"
        return "busy" if util >= GPU_BUSY_PERCENT else "idle"

    def figures(self) -> str:
        util = self.utilization_percent
        text = f"{util:.0f}% utilisation" if util is not None else "utilisation unknown"
        ratio = self.power_ratio
        if ratio is not None:
            text += (
                f" at {ratio:.0%} of its power limit "
                f"({self.power_w:.0f} W of {self.power_limit_w:.0f} W)"
            )
        return text


def describe_gpus(gpus: Sequence[GpuActivity]) -> str | None:
    """What the GPUs were doing over a stall, with the figures (``gpu0 busy with no progress
    (100% utilisation at 17% of its power limit ...``); None without GPU figures."""
    known = [g for g in gpus if g.verdict != "unknown"]
    if not known:
        return None
    if all(g.verdict == "idle" for g in known):
        figures = ", ".join(f"gpu{g.index} {g.utilization_percent:.0f}%" for g in known)
        return f"idle ({figures} utilisation)"
    text = ", ".join(
        f"gpu{gpu.index} {_GPU_WORDS[gpu.verdict]} ({gpu.figures()})"
        if gpu.verdict != "idle"
        # An idle GPU's power says nothing more.
        else f"gpu{gpu.index} idle ({gpu.utilization_percent:.0f}% utilisation)"
        for gpu in known
    )
    if any(g.verdict == "spinning" for g in known):
        text += (
            ": near-full utilisation at low power, the signature of a hung collective "
            "(a rank waiting for a peer) or a spinning kernel"
        )
    return text


_GPU_FIGURES = ("utilization_percent", "power_w", "power_limit_w")
_GPU_WORDS = {"spinning": "busy with no progress", "busy": "busy"}


def stall_activity(
    cpu_percent: float | None,
    uninterruptible: Sequence[str],
    running_share: float | None,
    gpus: Sequence[GpuActivity],
    *,
    cpu_of: str = "tree",
) -> dict[str, Any]:
    """The verdict and its figures, as ``failures[].activity`` records them."""
    return {
        "tree": tree_verdict(cpu_percent, uninterruptible, running_share),
        "cpu_of": cpu_of,
        "cpu_percent": None if cpu_percent is None else round(cpu_percent, 1),
        "running_share": None if running_share is None else round(running_share, 3),
        "uninterruptible": list(uninterruptible[:4]),
        "gpus": [
            {"index": g.index, "verdict": g.verdict}
            | {key: getattr(g, key) for key in _GPU_FIGURES}
            for g in gpus
        ],
    }


def recorded_gpus(activity: Mapping[str, Any]) -> list[GpuActivity]:
    """The GPUs of a recorded ``activity``."""
    return [
        GpuActivity(int(g["index"]), *(g.get(key) for key in _GPU_FIGURES))
        for g in activity.get("gpus") or []
    ]


def describe_activity(activity: Mapping[str, Any]) -> str | None:
    """A recorded ``activity`` as the stall's headline says it; None when nothing is known
    (too few samples, or a verdict the stack dump contradicted, and no GPU figures)."""
    gpus = describe_gpus(recorded_gpus(activity))
    if activity.get("tree") == "unknown":
        return None if gpus is None else f"of unknown activity; its GPUs: {gpus}"
    text = describe_tree(
        activity.get("cpu_percent"),
        activity.get("uninterruptible") or (),
        activity.get("running_share"),
        cpu_of=str(activity.get("cpu_of") or "tree"),
    )
    return text if gpus is None else f"{text}; its GPUs: {gpus}"


def agreeing(activity: dict[str, Any], processes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``activity`` with a ``busy`` verdict withdrawn (``unknown``) when the stack dump taken
    as the rule fired found every process asleep: busy never contradicts an idle cause line."""
    if activity.get("tree") != "busy" or not processes:
        return activity
    for process in processes:
        stack = str((process.get("python_stack") or {}).get("stack") or "")
        if process.get("state") == "running" or "(active" in stack:
            return activity
    return {**activity, "tree": "unknown"}
