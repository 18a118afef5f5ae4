"""The rules over the steps a trainer writes: advance, rate, ETA, loss, and a learned limit
(docs/progress.md, "A learned stall limit").  Clock-free: every call takes ``now``."""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from ._step_files import KIND_NAMES, KIND_STATE, StepReading, StepRecord

ProgressSource = Literal["files", "steps", "auto"]
PROGRESS_SOURCES: tuple[ProgressSource, ...] = ("auto", "files", "steps")
LossCheck = Literal["fail", "warn", "off"]
LOSS_CHECKS: tuple[LossCheck, ...] = ("fail", "warn", "off")

#: The learned limit: this factor times the time-weighted quantile of the gaps (kept in
#: logarithmic buckets), within the floor and cap, after at least AUTO_MIN_GAPS gaps.
AUTO_SAFETY_FACTOR = 3.0
AUTO_QUANTILE = 0.99
AUTO_FLOOR_SECONDS = 10.0
AUTO_CAP_SECONDS = 6 * 3600.0
AUTO_MIN_GAPS = 10
_BUCKET_RATIO = 1.05

#: Steps per second over the last RATE_WINDOW_SECONDS or RATE_WINDOW_STEPS steps, whichever
#: is shorter; 0 once no step came for RATE_STALE_GAPS x the window's median gap.
RATE_WINDOW_SECONDS = 30.0
RATE_WINDOW_STEPS = 10
RATE_STALE_GAPS = 3.0
#: Divergence: the median of the last DIVERGENCE_WINDOW losses above DIVERGENCE_FACTOR x the
#: run's best such median, after DIVERGENCE_MIN_LOSSES losses, having given back more than
#: DIVERGENCE_GIVEN_BACK of what it learned (a loss near zero may wobble to twice its best).
DIVERGENCE_WINDOW = 10
DIVERGENCE_FACTOR = 2.0
DIVERGENCE_MIN_LOSSES = 20
DIVERGENCE_GIVEN_BACK = 0.1
#: A gradient norm non-finite at this many logged steps in a row (after a finite one) fails
#: the run, as a NaN filter logs its loss as 0.0; fewer are loss scaling's skips: counted.
NONFINITE_GRAD_NORM_STEPS = 5


class StaleLimit:
    """``--stale-progress auto``: the limit learned from the gaps between advances."""

    def __init__(self, *, startup_limit: float, carried: float | None = None) -> None:
        self.startup_limit = startup_limit
        self.carried = carried
        self.reset()

    def reset(self) -> None:
        """Start over (the progress signal changed from file changes to steps)."""
        self._first: float | None = None
        self._gaps = 0
        self.longest = 0.0
        self._buckets: dict[int, float] = {}
        self.limit = self.carried if self.carried is not None else self.startup_limit
        self.learned: float | None = None

    def advance(self, now: float, gap: float | None) -> None:
        """An advance at ``now``, ``gap`` after the one before (None for the first)."""
        if self._first is None:
            self._first = now
        if gap is None or not 0 < gap < math.inf:
            return
        self._gaps += 1
        self.longest = max(self.longest, gap)
        index = math.floor(math.log(gap) / math.log(_BUCKET_RATIO))
        self._buckets[index] = self._buckets.get(index, 0.0) + gap
        if self._gaps < AUTO_MIN_GAPS or now - self._first < self.startup_limit:
            return
        learned = min(AUTO_CAP_SECONDS, max(AUTO_FLOOR_SECONDS, AUTO_SAFETY_FACTOR * self.high()))
        if self.carried is not None:
            learned = max(learned, self.carried)
        self.learned = self.limit = learned

    def high(self) -> float:
        """The gap below which :data:`AUTO_QUANTILE` of the time between advances was spent."""
        wanted = AUTO_QUANTILE * sum(self._buckets.values())
        seen = 0.0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= wanted:
                return min(self.longest, _BUCKET_RATIO ** (index + 1))
        return self.longest


@dataclass(slots=True)
class StepUpdate:
    """What one reading changed, for the watchdog to emit."""

    advanced: bool = False
    gap: float | None = None  # since the advance before (None for the first step)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    nonfinite: str | None = None  # the first non-finite loss: its message
    changed: bool = False  # the figures (loss, max_steps) changed without an advance
    #: (step, trainer time) of each record that raised its source's step.
    marks: list[tuple[int, float | None]] = field(default_factory=list)


class StepTracker:
    """The steps of one run: where it is, how fast, its loss, and what is wrong with it."""

    def __init__(self, *, loss_check: LossCheck = "fail", step_key: str | None = None) -> None:
        self.loss_check = loss_check
        self.step_key = step_key
        self.step: int | None = None
        self.kind: int | None = None  # the step source's (``_step_files.KIND_*``)
        self.source: str | None = None
        self.last_advance: float | None = None
        self.longest_gap = 0.0
        self.max_steps: int | None = None
        self.loss: float | None = None
        self.loss_step: int | None = None
        self.nonfinite_loss: str | None = None
        self.steps_per_second: float | None = None
        self.tokens_per_second: float | None = None
        self.samples_per_second: float | None = None
        self.lines_since_advance: dict[str, int] = {}  # per source, since the last advance
        self.nonfinite_seen = False
        self.diverged = False
        self.nonfinite_grad_norms = 0  # isolated ones: counted, not failed
        #: Per history (all trainer_state.json copies are one): (non-finite norms in a row,
        #: the first's step); and those that logged a finite one (a streak counts from then).
        self._grad_run: dict[str, tuple[int, int]] = {}
        self._grad_finite: set[str] = set()
        #: Sources that gave this run a step, and those that gave a loss.
        self._stepped: set[str] = set()
        self._lossy: set[str] = set()
        self._last_by_source: dict[str, int] = {}
        #: The highest step each present source reached since the last resume: the run's
        #: step is their maximum, and any of them rising is progress.
        self._high_by_source: dict[str, int] = {}
        #: The newest step an earlier run left in each source (where this one resumes from).
        self._before_start: dict[str, int] = {}
        self._epoch_by_source: dict[str, float] = {}
        self._per_epoch: set[str] = set()  # sources that count their step per epoch
        #: Sources that went back while another was ahead: their own counter (said once each);
        #: sources that have held the run's step (a resume of one of those is the run's).
        self._own_counter: set[str] = set()
        self._led: set[str] = set()
        self._state_high = -1
        self._window: deque[tuple[float, int, float | None, float | None]] = deque()
        self._losses: deque[float] = deque(maxlen=DIVERGENCE_WINDOW)
        self._loss_count = 0
        self._best_median = math.inf
        self._first_median: float | None = None
        self._warned_keys: set[str] = set()
        self._counts: tuple[float | None, float | None] = (None, None)  # tokens, samples
        self._raised: frozenset[str] = frozenset()  # what the rules raised (said once)

    @property
    def source_kind(self) -> str | None:
        return None if self.kind is None else KIND_NAMES[self.kind]

    def eta_seconds(self) -> float | None:
        """Seconds to ``max_steps`` at the current rate; None when either is unknown."""
        rate, total, step = self.steps_per_second, self.max_steps, self.step
        if not rate or total is None or step is None or rate <= 0:
            return None
        return max(0.0, (total - step) / rate)

    def observe(self, reading: StepReading, now: float) -> StepUpdate:
        """Fold one reading; one a rule raises on (a bug, not the run's fault) goes unjudged,
        with a note once."""
        try:
            return self._observe(reading, now)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            told, self._raised = error in self._raised, self._raised | {error}
            note = f"the step rules raised {error}: readings they raise on are not judged"
            return StepUpdate(notes=[] if told else [note])

    def _observe(self, reading: StepReading, now: float) -> StepUpdate:
        update = StepUpdate(notes=list(reading.notes), warnings=list(reading.warnings))
        for name in reading.gone:
            self._forget(name)
        if reading.gone and self._high_by_source:
            # A deleted source (a prep file, a rotated checkpoint) holds the step no longer.
            source = max(self._high_by_source, key=self._high_by_source.__getitem__)
            if self._high_by_source[source] != self.step:
                self._window.clear()  # a rate across two counters means nothing
            update.changed |= (self.step, self.source) != (self._high_by_source[source], source)
            self.step, self.source = self._high_by_source[source], source
        for max_steps in (reading.max_steps, *(r.max_steps for r in reading.records)):
            if max_steps and max_steps != self.max_steps:
                self.max_steps, update.changed = max_steps, True
        for name, count in reading.lines.items():
            self.lines_since_advance[name] = self.lines_since_advance.get(name, 0) + count
        kinds = [r.kind for r in reading.records if not r.before_start]
        if kinds and (self.kind is None or min(kinds) < self.kind):
            self.kind = min(kinds)
        previous, moved = self.step, False
        for record in reading.records:
            if record.kind == KIND_STATE:
                # Every checkpoint-N/ holds the whole history up to N, and one scan may
                # read several copies (newest first): an older copy's entries, or its
                # global_step below one seen, are the past again, not the run going back.
                if record.step < self._state_high or (
                    record.step == self._state_high and record.where != "global_step"
                ):
                    continue
                self._state_high = record.step
            if record.before_start:
                # An earlier run's: not this run's first step (its startup goes on), nor a
                # loss to judge it by (a NaN there is why it was resumed).
                self._before_start[record.source] = record.step
                continue
            if record.where != "global_step" and record.source not in self._stepped:
                self._stepped.add(record.source)
                update.changed = True
            if record.loss is not None:
                self._lossy.add(record.source)
            self._check_loss(record, update)
            self._check_grad_norm(record, update)
            if record.kind != self.kind:
                continue
            if self._follow(record, update):
                moved = True
                update.marks.append((record.step, record.trainer_time))
        if self.source is not None:
            # Judged once a reading is folded: the order files are read in does not matter.
            self._led.add(self.source)
        if self.step is None and reading.without_step:
            self._warn_keys(reading, update)
        if moved:
            # Any source's step rising is progress: one that stopped higher (a prep file, an
            # eval loop's own counter) never freezes the run.
            update.advanced = True
            if self.last_advance is not None:
                update.gap = now - self.last_advance
                self.longest_gap = max(self.longest_gap, update.gap)
            self.last_advance = now
            self.lines_since_advance = {}
        if self.step is not None and self.step != previous:
            self._rate(now)
        elif self._rate_is_stale(now):
            self.steps_per_second = 0.0
            update.changed = True
        return update

    def _rate_is_stale(self, now: float) -> bool:
        """No step for RATE_STALE_GAPS x the median gap of the rate's window."""
        times = [t for t, *_ in self._window]
        if not self.steps_per_second or len(times) < 2:
            return False
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        return now - times[-1] > RATE_STALE_GAPS * gaps[len(gaps) // 2]

    def _follow(self, record: StepRecord, update: StepUpdate) -> bool:
        """Fold one record of the followed kind; whether its source's step rose."""
        last = self._last_by_source.get(record.source, self._before_start.pop(record.source, None))
        epoch = self._epoch_by_source.get(record.source)
        if record.epoch is not None:
            self._epoch_by_source[record.source] = record.epoch
        behind = self.step is not None and record.source not in self._led
        if last is not None and record.step < last and behind:
            # Another file has always been ahead: this one counts something of its own (an
            # eval loop's batches), and its going back neither moves the run nor resumes it.
            if record.source not in self._own_counter:
                self._own_counter.add(record.source)
                update.notes.append(
                    f"the step went back from {last} to {record.step} in {record.source} "
                    f"({record.where}) while the run is at step {self.step} in {self.source}: "
                    "read as that file's own counter"
                )
        elif last is not None and record.step < last:
            if epoch is not None and record.epoch is not None and record.epoch > epoch:
                # A loop that counts its step within each epoch: the restart is progress.
                if record.source not in self._per_epoch:
                    self._per_epoch.add(record.source)
                    update.notes.append(
                        f"{record.source} counts its step within each epoch (it restarted "
                        f"at epoch {record.epoch:g})"
                    )
            else:
                update.notes.append(
                    f"the step went back from {last} to {record.step} in {record.source} "
                    f"({record.where}): a resume from an earlier checkpoint?"
                )
            self._window.clear()
            # Every source restarts from here: the run is back at this step.
            self._last_by_source, self._high_by_source = {}, {}
        self._last_by_source[record.source] = record.step
        high = self._high_by_source.get(record.source)
        rose = high is None or record.step > high
        if rose:
            self._high_by_source[record.source] = record.step
        # The highest any present source reached: one that stopped holds nothing back.
        self.step = max(self._high_by_source.values())
        if record.step == self.step:
            self.source = record.source
        if record.loss is not None and math.isfinite(record.loss):
            if self.loss != record.loss:
                update.changed = True
            self.loss, self.loss_step = record.loss, record.step
        if record.tokens_per_second is not None:
            self.tokens_per_second = record.tokens_per_second
        if record.samples_per_second is not None:
            self.samples_per_second = record.samples_per_second
        if record.tokens is not None or record.samples is not None:
            self._counts = (record.tokens, record.samples)
        return rose

    def _rate(self, now: float) -> None:
        assert self.step is not None
        tokens, samples = self._counts
        self._window.append((now, self.step, tokens, samples))
        while len(self._window) > 2 and (
            now - self._window[1][0] >= RATE_WINDOW_SECONDS
            or self.step - self._window[1][1] >= RATE_WINDOW_STEPS
        ):
            self._window.popleft()
        if len(self._window) < 2:
            return
        t0, step0, tokens0, samples0 = self._window[0]
        span = now - t0
        if span <= 0:
            return
        self.steps_per_second = max(0.0, (self.step - step0) / span)
        if tokens is not None and tokens0 is not None:
            self.tokens_per_second = max(0.0, (tokens - tokens0) / span)
        if samples is not None and samples0 is not None:
            self.samples_per_second = max(0.0, (samples - samples0) / span)

    def _check_loss(self, record: StepRecord, update: StepUpdate) -> None:
        loss = record.loss
        if loss is None or self.loss_check == "off":
            return
        if not math.isfinite(loss):
            where = f"at step {record.step} ({record.source} {record.where})"
            self._fail(loss, f"the loss is {_spell(loss)} {where}", update)
            return
        self._losses.append(loss)
        self._loss_count += 1
        if len(self._losses) < DIVERGENCE_WINDOW:
            return
        median = sorted(self._losses)[len(self._losses) // 2]
        best = self._best_median = min(median, self._best_median)
        if self._first_median is None:
            self._first_median = median
        learned = max(0.0, self._first_median - best)
        if (
            not self.diverged
            and self._loss_count >= DIVERGENCE_MIN_LOSSES
            and best > 0
            and median > DIVERGENCE_FACTOR * best
            and median - best > DIVERGENCE_GIVEN_BACK * learned
        ):
            self.diverged = True
            update.warnings.append(
                f"the loss is diverging: the median of the last {DIVERGENCE_WINDOW} losses "
                f"is {median:.4g} at step {record.step}, above {DIVERGENCE_FACTOR:g} x the "
                f"run's best ({best:.4g})"
            )

    def _check_grad_norm(self, record: StepRecord, update: StepUpdate) -> None:
        norm = record.grad_norm
        if norm is None or self.loss_check == "off":
            return
        history = KIND_NAMES[KIND_STATE] if record.kind == KIND_STATE else record.source
        if math.isfinite(norm):
            self._grad_run.pop(history, None)
            self._grad_finite.add(history)
            return
        self.nonfinite_grad_norms += 1
        update.changed = True
        if history not in self._grad_finite:
            return  # loss scaling's start-up search, not a divergence
        count, first = self._grad_run.get(history, (0, record.step))
        self._grad_run[history] = (count + 1, first)
        if count + 1 == NONFINITE_GRAD_NORM_STEPS:
            beside = "" if record.loss is None else f"; the loss beside it is {record.loss:g}"
            message = (
                f"the grad_norm is {_spell(norm)} at {NONFINITE_GRAD_NORM_STEPS} logged steps "
                f"in a row, steps {first} to {record.step} ({record.source} {record.where})"
            )
            self._fail(norm, message + beside, update)

    def _fail(self, value: float, message: str, update: StepUpdate) -> None:
        """The run's first non-finite loss (or grad_norm streak)."""
        if not self.nonfinite_seen:
            self.nonfinite_seen = True
            if self.loss_check == "fail":
                self.nonfinite_loss = str(value)
                update.changed = True
            update.nonfinite = message

    def _forget(self, name: str) -> None:
        kept = (self._last_by_source, self._high_by_source, self._epoch_by_source, self._grad_run)
        for values in kept:
            values.pop(name, None)
        names = (self._led, self._own_counter, self._per_epoch, self._stepped, self._lossy)
        for held in (*names, self._grad_finite):
            held.discard(name)

    def sources_without_loss(self) -> list[str]:
        """The files that gave steps but never a loss (``--loss-key`` wrong?)."""
        return sorted(self._stepped - self._lossy)

    def _warn_keys(self, reading: StepReading, update: StepUpdate) -> None:
        for name, keys in sorted(reading.without_step.items()):
            if name in self._warned_keys:
                continue
            self._warned_keys.add(name)
            wanted = repr(self.step_key) if self.step_key else "a step key"
            message = f"no record of {name} carries {wanted} (its keys: {', '.join(keys)})"
            (update.warnings if self.step_key else update.notes).append(message)

    def sources_without_step(self) -> list[str]:
        """The files whose records carry no step key (``--step-key`` wrong?)."""
        return sorted(self._warned_keys)

    def stall_message(self, now: float) -> str:
        """Why the step counts as frozen: how long, and what grew meanwhile."""
        assert self.step is not None
        assert self.last_advance is not None
        message = f"step {self.step} has not advanced for {now - self.last_advance:.1f} s"
        grown = {k: v for k, v in self.lines_since_advance.items() if v}
        if grown:
            name = max(grown, key=lambda k: grown[k])
            unit = "entries" if name.endswith("trainer_state.json") else "lines"
            message += f" although {name} grew {grown[name]} {unit}"
        return message


def _spell(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
