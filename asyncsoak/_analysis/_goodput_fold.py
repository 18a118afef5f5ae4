"""The goodput ledger's inputs folded from a run's events (step marks in arrays: a day at 10
steps/s is 864,000), and the live counters, which count a step's time by the ideal known when
the next arrives; the artifact's ledger divides the whole run again by the final ideal."""

from __future__ import annotations

import fnmatch
import itertools
import math
import re
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._goodput import (
    BADPUT_KINDS,
    Gap,
    Ledger,
    RunEnds,
    advance,
    divide,
    redone,
    slow_threshold,
)
from ._trends import median

#: The checkpoint paths' default patterns: a path below the progress directory any of whose
#: components matches one is a checkpoint's (``--checkpoint-glob``).
CHECKPOINT_GLOBS = ("checkpoint-*", "*.ckpt", "*.pt", "*.pth", "*.safetensors", "*.distcp")
#: The failure reasons whose time since the last step is a stall.
STALL_REASONS = frozenset({"stale_progress", "overdue"})
#: Checkpoint writes remembered (the newest): a write seen in every scan of a day is 86,400.
CHECKPOINT_TIMES_MAX = 100_000
#: The live ideal step is learned from the newest this many step durations.
LIVE_WINDOW = 256


def checkpoint_matcher(globs: Iterable[str]) -> re.Pattern[str]:
    """One pattern matching a path component that any of ``globs`` matches."""
    return re.compile("|".join(fnmatch.translate(g) for g in globs) or "(?!)")


class GoodputFold:
    """The run's step marks, checkpoint writes and ends, and the live counters of its time."""

    def __init__(self) -> None:
        self._checkpoint = checkpoint_matcher(CHECKPOINT_GLOBS)
        self.lag_seconds = 0.0
        self._steps: array[int] = array("q")
        self._seen: array[float] = array("d")
        self._trainer: array[float] = array("d")  # NaN where the record had no time
        self.checkpoint_times: deque[float] = deque(maxlen=CHECKPOINT_TIMES_MAX)
        self.failure_t: float | None = None
        self.stalled = False
        self.stop_t: float | None = None
        self.end_t: float | None = None
        #: Live: seconds counted productive and lost, by kind; they only grow.
        self.productive_seconds = 0.0
        self.badput_seconds = dict.fromkeys(BADPUT_KINDS, 0.0)
        self._recent: deque[float] = deque(maxlen=LIVE_WINDOW)
        self._last_t: float | None = None  # the newest step event's time
        self._first_t: float | None = None  # the first's, until its start-up is counted
        self._strides: deque[int] = deque(maxlen=LIVE_WINDOW)
        self._high_seen = -1  # the highest step seen
        self._high = -1  # steps at or below it are redone (an earlier attempt's, a restart's)
        self._high_configured = -1  # the earlier attempt's, as the header said

    def configure(self, config: Mapping[str, Any]) -> None:
        """Take the run's checkpoint patterns and scan interval from its header's config."""
        globs = config.get("checkpoint_globs")
        if isinstance(globs, list | tuple):
            self._checkpoint = checkpoint_matcher(str(g) for g in globs)
        earlier = config.get("earlier_highest_step")
        self._high = self._high_configured = earlier if isinstance(earlier, int) else -1
        interval = config.get("sample_interval_seconds")
        if isinstance(interval, int | float) and math.isfinite(interval):
            self.lag_seconds = float(interval)

    def add_progress(self, t: float, paths: Iterable[str]) -> None:
        """Note a scan that saw a checkpoint path change."""
        match = self._checkpoint.fullmatch
        if any(match(part) for path in paths for part in path.split("/") if part):
            self.checkpoint_times.append(t)

    def add_steps(self, t: float, marks: Iterable[Sequence[Any]]) -> None:
        """Keep the marks of a step event seen at ``t`` (each step record its scan read), and
        count live the time since the previous event's: one gap of the steps done in it."""
        last = self._steps[-1] if self._steps else None
        gap = Gap(0, last or 0, self._last_t or 0.0, t)
        for step, stamp in marks:
            step = int(step)
            if step == (self._steps[-1] if self._steps else None):
                continue  # a loss logged again at the same step is no step
            if self._steps:
                advance(gap, self._steps[-1], step, self._stride(step), self._high_seen)
            self._high_seen = max(self._high_seen, step)
            self._steps.append(step)
            self._seen.append(t)
            self._trainer.append(math.nan if stamp is None else float(stamp))
        if last is None and self._steps:
            self._first_t, self._last_t = t, t
        elif gap.count and self._last_t is not None and t > self._last_t:
            self._recent.append(gap.each)
            self._count(gap)
            self._last_t = t

    def _stride(self, step: int) -> int:
        """The trainer's usual step between records, as the newest ones show."""
        if step > self._steps[-1]:
            self._strides.append(step - self._steps[-1])
        return max(1, round(median([float(d) for d in self._strides]))) if self._strides else 1

    def _count(self, gap: Gap) -> None:
        """Count a gap's time, final now, by the ideal known now (the start-up too, at first)."""
        threshold = slow_threshold(self._recent)
        normal = [v for v in self._recent if v <= threshold]
        ideal = sum(normal) / len(normal)
        parts = self.badput_seconds
        if self._first_t is not None:
            self.productive_seconds += min(self._first_t, ideal)
            parts["startup"] += max(0.0, self._first_t - ideal)
            self._first_t = None
        if gap.reset_low is not None:
            restart = gap.each > threshold
            self._high = max(self._high, gap.reset_from) if restart else -1
        old = redone(gap, self._high)
        parts["wasted"] += gap.each * old
        fresh = gap.count - old
        seconds = gap.each * fresh
        worth = min(seconds, ideal * fresh)
        self.productive_seconds += worth
        if gap.each <= threshold:
            parts["other"] += seconds - worth
            return
        writing = any(
            gap.start < c <= gap.stop + self.lag_seconds for c in self._newest_writes(gap.start)
        )
        parts["checkpoint" if writing else "slow_steps"] += seconds - worth

    def _newest_writes(self, since: float) -> list[float]:
        """The checkpoint writes seen after ``since`` (the newest looked at)."""
        return list(itertools.takewhile(lambda c: c > since, reversed(self.checkpoint_times)))

    def fail(self, t: float, reason: str) -> None:
        """The run's first failure: a stall's time since the last step is final now."""
        if self.failure_t is not None:
            return
        self.failure_t, self.stalled = t, reason in STALL_REASONS
        if self.stalled and self._last_t is not None and t > self._last_t:
            self.badput_seconds["stall"] += t - self._last_t

    def stop(self, t: float) -> None:
        if self.stop_t is None:
            self.stop_t = t

    def end(self, t: float) -> None:
        """The tree's end: the shutdown since the last step (or the stop) is final now."""
        if self.end_t is not None:
            return
        self.end_t = t
        if self._last_t is None:
            return
        since = max(self._last_t, self.failure_t or 0.0, self.stop_t or 0.0)
        self.badput_seconds["shutdown"] += max(0.0, t - since)

    def ledger(self, end_t: float, earlier_highest_step: int | None = None) -> Ledger:
        """The run's ledger, launch -> its tree's end (``end_t`` when not folded yet); an earlier
        attempt's highest step, else the header's (the queue's worker sets it)."""
        if earlier_highest_step is None and self._high_configured >= 0:
            earlier_highest_step = self._high_configured
        end = self.end_t if self.end_t is not None else end_t
        ends = RunEnds(end, self.failure_t, self.stalled, self.stop_t)
        return divide(
            self._steps,
            self._seen,
            self._trainer,
            ends,
            checkpoint_times=self.checkpoint_times,
            lag_seconds=self.lag_seconds,
            earlier_highest_step=earlier_highest_step,
        )
