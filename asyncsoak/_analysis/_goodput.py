"""Goodput from outside the trainer: a run's wall time split into productive time and badput,
by pure functions that the live fold, the artifact, ``recover`` and ``asyncsoak goodput`` share
(definitions: docs/goodput.md)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._trends import median

#: The badput kinds of one run, in the artifact's order (a queue job adds QUEUE_KINDS).
BADPUT_KINDS = ("startup", "slow_steps", "checkpoint", "stall", "wasted", "shutdown", "other")
QUEUE_KINDS = ("queue_wait", "recovery")
#: A step is slow when its duration is above the median + this many median absolute deviations.
SLOW_STEP_MADS = 3.0
#: How far the trainer's own span of time may differ from the monitor's, beyond a scan and a
#: tenth, before its clock is not trusted (a clock of another rate, or not of the epoch).
AHEAD_SECONDS = 1.0
NO_STEPS = "goodput needs training steps: write a step (and its time) in the progress directory"


class StepMark(NamedTuple):
    """A step as the monitor saw it (seconds since launch) and the trainer's time of it."""

    step: int
    seen_t: float
    trainer_time: float | None = None


class RunEnds(NamedTuple):
    """The instants the ledger divides by (seconds since launch): the tree's end, the failure
    (and whether it was a stall) and a stop request."""

    end_t: float
    failure_t: float | None = None
    stalled: bool = False
    stop_t: float | None = None


@dataclass(slots=True)
class Ledger:
    """One run's time: ``wall_seconds`` = ``productive_seconds`` + the badput parts."""

    wall_seconds: float
    productive_seconds: float = 0.0
    ideal_step_seconds: float | None = None
    steps: int = 0
    badput_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(BADPUT_KINDS, 0.0)
    )
    note: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.ideal_step_seconds is None or self.wall_seconds <= 0:
            return None
        return self.productive_seconds / self.wall_seconds

    def to_json(self) -> dict[str, Any]:
        ratio = self.ratio
        out: dict[str, Any] = {
            "wall_seconds": round(self.wall_seconds, 3),
            "productive_seconds": round(self.productive_seconds, 3),
            "ratio": None if ratio is None else round(ratio, 4),
            "ideal_step_seconds": (
                None if self.ideal_step_seconds is None else round(self.ideal_step_seconds, 6)
            ),
            "steps": self.steps,
            "badput_seconds": {k: round(v, 3) for k, v in self.badput_seconds.items()},
        }
        if self.note:
            out["note"] = self.note
        return out


def step_times(marks: Sequence[StepMark], lag_seconds: float = 0.0) -> list[float]:
    """Each mark's time on the monitor's clock (see :func:`times_of`)."""
    return times_of([m.seen_t for m in marks], [m.trainer_time for m in marks], lag_seconds)


def times_of(
    seen: Sequence[float], stamps: Sequence[float | None], lag_seconds: float = 0.0
) -> list[float]:
    """The trainer's own ``stamps`` shifted by the smallest delay the monitor saw one with, when
    all are there, run forward and span what the monitor's ``seen`` span; else ``seen``."""
    if not stamps or any(t is None or t != t for t in stamps):
        return list(seen)
    first = stamps[0] or 0.0
    own = [(t or 0.0) - first for t in stamps]
    span = seen[-1] - seen[0]
    if any(b < a for a, b in itertools.pairwise(own)) or abs(own[-1] - span) > (
        lag_seconds + AHEAD_SECONDS + 0.1 * span
    ):
        return list(seen)
    shift = min(t - o for t, o in zip(seen, own, strict=True))
    return [shift + o for o in own]


def slow_threshold(durations: Iterable[float]) -> float:
    """The median step duration plus SLOW_STEP_MADS median absolute deviations."""
    values = list(durations)
    mid = median(values)
    return mid + SLOW_STEP_MADS * median([abs(v - mid) for v in values])


@dataclass(slots=True)
class Gap:
    """``count`` steps ending at ``step`` between two instants the monitor tells apart (after a
    counter that went back: to ``reset_low``, from ``reset_from``)."""

    count: int
    step: int
    start: float
    stop: float
    reset_low: int | None = None
    reset_from: int = 0

    @property
    def each(self) -> float:
        return (self.stop - self.start) / self.count


def stride_of(steps: Sequence[int]) -> int:
    """The trainer's usual step between two records (1, or 10 when it logs every 10th)."""
    diffs = [float(b - a) for a, b in itertools.pairwise(steps) if b > a]
    return max(1, round(median(diffs))) if diffs else 1


def _gaps(steps: Sequence[int], times: Sequence[float]) -> tuple[Gap, list[Gap]]:
    """The first step's batch and the gaps after it; marks at one instant are one gap, and a
    counter that goes back counts its new steps from there (an epoch's, or a restart)."""
    stride = stride_of(steps)
    first = Gap(stride, steps[0], 0.0, times[0])
    gaps: list[Gap] = []
    current, high, prev = first, steps[0], steps[0]
    for step, t in zip(steps[1:], times[1:], strict=True):
        if step == prev:
            continue  # a loss logged again at the same step is no step
        if t > current.stop:
            current = Gap(0, prev, current.stop, t)
            gaps.append(current)
        advance(current, prev, step, stride, high)
        high, prev = max(high, step), step
    return first, gaps


def advance(gap: Gap, prev: int, step: int, stride: int, high: int) -> None:
    """Count into ``gap`` the steps from ``prev`` to ``step`` (a counter gone back to
    ``step`` did ``step`` steps, at most a stride, since it went back from ``high``)."""
    if step > prev:
        gap.count += step - prev
    else:
        gap.count += min(stride, max(1, step))
        gap.reset_low, gap.reset_from = step, high
    gap.step = step


def redone(gap: Gap, high: int) -> int:
    """How many of ``gap``'s steps are at or below ``high`` (done before, so redone)."""
    low = gap.step - gap.count if gap.reset_low is None else gap.reset_low - 1
    return min(gap.count, max(0, min(gap.step, high) - low))


def ledger(
    marks: Sequence[StepMark],
    ends: RunEnds,
    *,
    checkpoint_times: Sequence[float] = (),
    lag_seconds: float = 0.0,
    earlier_highest_step: int | None = None,
) -> Ledger:
    """:func:`divide` of ``marks``."""
    return divide(
        [m.step for m in marks],
        [m.seen_t for m in marks],
        [m.trainer_time for m in marks],
        ends,
        checkpoint_times=checkpoint_times,
        lag_seconds=lag_seconds,
        earlier_highest_step=earlier_highest_step,
    )


def divide(
    steps: Sequence[int],
    seen: Sequence[float],
    stamps: Sequence[float | None],
    ends: RunEnds,
    *,
    checkpoint_times: Sequence[float] = (),
    lag_seconds: float = 0.0,
    earlier_highest_step: int | None = None,
) -> Ledger:
    """Divide launch -> ``ends.end_t`` into productive time and badput (docs/goodput.md): a
    slow step is a checkpoint's when a checkpoint path grew during it or a scan after it; steps
    at or below ``earlier_highest_step`` (an earlier attempt's), or redone after a restart (a
    counter gone back after a slow gap), are wasted."""
    wall = max(ends.end_t, 0.0)
    out = Ledger(wall_seconds=wall)
    if not steps:
        out.badput_seconds["other"] = wall
        out.note = NO_STEPS
        return out
    times = [min(max(t, 0.0), wall) for t in times_of(seen, stamps, lag_seconds)]
    first, gaps = _gaps(steps, times)
    if gaps:
        threshold = slow_threshold(g.each for g in gaps)
        normal = [g for g in gaps if g.each <= threshold]
        ideal = sum(g.stop - g.start for g in normal) / sum(g.count for g in normal)
    else:
        threshold, ideal = math.inf, times[0] / first.count
    out.ideal_step_seconds = ideal
    parts = out.badput_seconds
    high = -1 if earlier_highest_step is None else earlier_highest_step
    old = redone(first, high)
    parts["wasted"] += min(ideal * old, times[0])
    new_steps = first.count - old
    writes = sorted(checkpoint_times)
    for gap in gaps:
        if gap.reset_low is not None:
            # A restart redoes what it had done; an epoch's counter starts its steps anew.
            high = max(high, gap.reset_from) if gap.each > threshold else -1
        old = redone(gap, high)
        parts["wasted"] += gap.each * old
        fresh = gap.count - old
        new_steps += fresh
        if gap.each > threshold and fresh:
            index = bisect.bisect_right(writes, gap.start)
            writing = index < len(writes) and writes[index] <= gap.stop + lag_seconds
            parts["checkpoint" if writing else "slow_steps"] += (gap.each - ideal) * fresh
    out.steps = new_steps
    out.productive_seconds = ideal * new_steps
    parts["startup"] = max(0.0, times[0] - ideal * first.count)
    last = times[-1]
    stopped = max([last, *(t for t in (ends.failure_t, ends.stop_t) if t is not None)])
    if ends.stalled and ends.failure_t is not None and ends.failure_t > last:
        parts["stall"] = min(ends.failure_t, wall) - last
    parts["shutdown"] = max(0.0, wall - min(stopped, wall))
    rest = wall - out.productive_seconds - sum(parts.values())
    if rest < 0:
        # Only when steps ran faster than the ideal at the start: productive gives it back.
        out.productive_seconds = max(0.0, out.productive_seconds + rest)
        rest = wall - out.productive_seconds - sum(parts.values())
    parts["other"] = max(0.0, rest)
    return out
