"""The progress rules: :class:`ProgressTracker` judges startup and staleness over successive
scans (``now`` is an argument); and what the watchdog tells of them, in events."""

from __future__ import annotations

import re
import time
from collections.abc import Collection
from pathlib import Path

import anyio

from .._contract import BlockingCallTimeout, EventSink, SoakClock, events, run_blocking
from ._progress_scan import FileKey, FileState, Scanner, ScanResult, path_matches, stat_keys
from ._step_files import KIND_STATE, StepReading
from ._step_rules import ProgressSource, StaleLimit, StepTracker, StepUpdate
from ._steps import StepReader

#: A progress file that names a rank: ``rank1.jsonl``, ``metrics_rank_3.csv``, ``rank-0/``.
RANK_FILE = re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)


def rank_of_path(path: str) -> str | None:
    """The rank a progress file belongs to, from its path (the last part naming one)."""
    found = RANK_FILE.findall(path)
    return str(int(found[-1])) if found else None


class ProgressTracker:
    """The startup and staleness rules over successive scans: ``startup_timeout`` until the
    first change, then the stale limit (``stale_after``, or what ``auto`` learned).  Where the
    step's advances count (:meth:`stepping`), a frozen step is a stall however files grow."""

    def __init__(
        self,
        baseline: dict[str, FileState],
        *,
        startup_timeout: float,
        stale_after: float,
        auto: StaleLimit | None = None,
        steps: StepTracker | None = None,
        source: ProgressSource = "auto",
    ) -> None:
        self._files = baseline
        self.startup_timeout = startup_timeout
        self.stale_after = stale_after
        self.auto = auto
        self.steps = steps
        self.source: ProgressSource = source if steps is not None else "files"
        self.step_notes = 0  # emitted so far (bounded: see STEP_NOTES_MAX)
        self.first_change: float | None = None
        self.last_change: float | None = None
        self.longest_gap = 0.0
        #: Bytes the last observation's changed files grew by, in all and per rank.
        self.grown_bytes = 0
        self.rank_grown_bytes: dict[str, int] = {}
        self.skipped_dirs = 0  # directories a scan could not read, as last warned of
        #: The paths that changed last, newest first; replaced whole, as a thread reads it.
        self.recent: tuple[str, ...] = ()
        self.missing_dir: Path | None = None  # the progress directory while it is missing
        #: ``--expect-every``'s and ``--checkpoint-glob``'s GLOBs (see ``named_paths``).
        self.named_globs: tuple[str, ...] = ()

    def changed(self, files: dict[str, FileState]) -> list[str]:
        """The paths of ``files`` that differ from when they were last seen (nothing recorded)."""
        return [path for path, state in files.items() if self._differs(path, state)]

    def observe(self, files: dict[str, FileState], now: float) -> list[str]:
        """Record a full scan; return the paths that changed since they were last seen."""
        changed = self.changed(files)
        self._count_growth({path: files[path] for path in changed})
        self._files = files
        return self._record(changed, now)

    def observe_some(self, updates: dict[str, FileState | None], now: float) -> list[str]:
        """Record fresh states of a few paths (None: gone); return those that changed."""
        changed = {p: s for p, s in updates.items() if s is not None and self._differs(p, s)}
        self._count_growth(changed)
        for path, state in updates.items():
            if state is None:
                self._files.pop(path, None)
        self._files.update(changed)
        return self._record(sorted(changed), now)

    def _differs(self, path: str, state: FileState) -> bool:
        old = self._files.get(path)
        if old is None or old.ino != state.ino:
            return True
        return old.size != state.size or old.mtime_ns != state.mtime_ns

    def _count_growth(self, changed: dict[str, FileState]) -> None:
        self.grown_bytes = 0
        self.rank_grown_bytes = {}
        for path, state in changed.items():
            old = self._files.get(path)
            grown = state.size
            if old is not None and old.ino == state.ino:
                grown = max(0, state.size - old.size)
            self.grown_bytes += grown
            rank = rank_of_path(path)
            if rank is not None:
                self.rank_grown_bytes[rank] = self.rank_grown_bytes.get(rank, 0) + grown

    def _record(self, changed: list[str], now: float) -> list[str]:
        if changed:
            self.recent = tuple(dict.fromkeys([*changed, *self.recent]))[:RECENT_PATHS]
            gap = None
            if self.first_change is None:
                self.first_change = now
            else:
                assert self.last_change is not None
                gap = now - self.last_change
                self.longest_gap = max(self.longest_gap, gap)
            self.last_change = now
            if self.auto is not None and not self.stepping():
                self.auto.advance(now, gap)
        return sorted(changed)

    def stepping(self) -> bool:
        """Whether the step's advances are the progress that counts (else file changes).  Under
        ``auto``, a step from ``trainer_state.json`` alone does not: it moves only at checkpoint
        saves, and a limit set for file changes would kill the run between two."""
        if self.steps is None or self.source == "files":
            return False
        if self.source == "steps":
            return True
        return self.steps.step is not None and self.steps.kind != KIND_STATE

    def observe_steps(self, reading: StepReading, now: float) -> StepUpdate:
        """Fold what the step sources wrote since the last scan."""
        assert self.steps is not None
        was_stepping = self.stepping()
        update = self.steps.observe(reading, now)
        if update.advanced and self.auto is not None and self.stepping():
            if not was_stepping:
                self.auto.reset()  # learned from file changes until now: steps from here
            self.auto.advance(now, update.gap if was_stepping else None)
        return update

    def limit(self) -> float:
        """The stale limit in force: ``stale_after``, or the one ``auto`` learned."""
        return self.stale_after if self.auto is None else self.auto.limit

    def deadline(self) -> float:
        last = self.last_change
        if self.stepping():
            assert self.steps is not None
            last = self.steps.last_advance
        if last is None:
            return self.startup_timeout
        return last + self.limit()

    def _limit_text(self) -> str:
        if self.auto is None:
            return f"stale_progress_seconds={self.stale_after:g}"
        limit = f"stale_progress_seconds=auto, {self.limit():.1f} s"
        if self.auto.learned is None:
            return f"{limit} (the startup limit)"
        # A first pause longer than any before it is the usual false kill: say what was seen.
        return (
            f"{limit} learned from gaps of at most {self.auto.longest:.1f} s; a "
            "--startup-timeout longer than the run's first checkpoint or evaluation lets the "
            "warm-up see it"
        )

    def _cadence_hint(self) -> str:
        """Why a fixed limit may be shorter than the trainer's logging interval, when the steps
        seen say so."""
        assert self.steps is not None
        if self.auto is not None or any(self.steps.lines_since_advance.values()):
            return ""
        if self.steps.longest_gap <= 0:
            seen = "no second step yet"
        elif self.steps.longest_gap >= self.stale_after / 2:
            seen = f"steps came up to {self.steps.longest_gap:.1f} s apart"
        else:
            return ""
        return (
            f"; {seen} in {self.steps.source}: if the trainer logs its step less often than "
            f"every {self.stale_after:g} s, set --stale-progress above its logging interval, "
            "or auto"
        )

    def verdict(self, now: float) -> tuple[str, str] | None:
        """The rule broken at ``now``, as (reason, message), if any."""
        if now < self.deadline():
            return None
        if self.stepping():
            assert self.steps is not None
            if self.steps.last_advance is None:
                seen = "" if self.last_change is None else " although files changed"
                keyless = self.steps.sources_without_step()
                if keyless:
                    wanted = repr(self.steps.step_key) if self.steps.step_key else "a step key"
                    seen += f" (no record of {', '.join(keyless)} carries {wanted})"
                return (
                    "startup_timeout",
                    f"no training step within startup_timeout_seconds="
                    f"{self.startup_timeout:g}{seen}",
                )
            return (
                "stale_progress",
                f"{self.steps.stall_message(now)} ({self._limit_text()}{self._cadence_hint()})",
            )
        if self.last_change is None:
            missing = self.missing_dir
            return (
                "startup_timeout",
                f"no progress within startup_timeout_seconds={self.startup_timeout:g}"
                + ("" if missing is None else f": the progress directory {missing} does not exist"),
            )
        return (
            "stale_progress",
            f"no progress for {self._limit_text()} (last change at {self.last_change:.1f}s)",
        )


#: Paths :attr:`ProgressTracker.recent` keeps: a trainer writes its progress to a few files.
RECENT_PATHS = 4


def latest_change_age(
    tracker: ProgressTracker, root: Path, ignore: Collection[FileKey]
) -> float | None:
    """Seconds since the newest change to the files that changed last, by their mtimes, or
    None: the live view's look between scans (blocking)."""
    if tracker.stepping():
        return None
    now = time.time()
    newest = max(
        (s.mtime_ns for s in stat_keys(root, tracker.recent, ignore).values() if s is not None),
        default=None,
    )
    if newest is None:
        return None
    age = now - newest / 1e9 - MTIME_LATENESS_SECONDS
    return None if age < -FUTURE_MTIME_SECONDS else max(0.0, age)


#: An mtime this far ahead of the wall clock is a lying clock's, not a change just made.
FUTURE_MTIME_SECONDS = 1.0


def changed_at(
    tracker: ProgressTracker,
    files: dict[str, FileState],
    *,
    since: float,
    now: float,
    clock: SoakClock,
) -> float:
    """When the newest change a scan found happened, in the soak's seconds: its file's mtime
    if between the previous scan (``since``) and ``now``, else (a lying clock) ``now``."""
    newest = max((files[key].mtime_ns for key in tracker.changed(files)), default=None)
    if newest is None:
        return now
    wall_to_soak = time.time() - time.monotonic() + clock.start
    at = newest / 1e9 + MTIME_LATENESS_SECONDS - wall_to_soak
    return at if since <= at <= now else now


#: How far behind a file's mtime may be (the kernel dates writes with its coarse clock, one
#: scheduler tick at most): added, so that a change is never dated before it happened.
try:
    # CLOCK_REALTIME_COARSE of <linux/time.h>, which Python's time module does not name.
    MTIME_LATENESS_SECONDS = time.clock_getres(5)
except OSError:
    MTIME_LATENESS_SECONDS = 0.01


#: How many changed paths a progress event names.
PATHS_PER_EVENT = 5
#: How many step marks a step event carries (the newest).
MARKS_PER_EVENT = 256


async def report_progress(
    sink: EventSink,
    tracker: ProgressTracker,
    changed: list[str],
    now: float,
    previous: float | None,
    stale_limit: float | None = None,
) -> None:
    """A ``progress`` event for the paths the tracker's last observation found changed."""
    if not changed:
        return
    await sink.emit(
        events.Progress(
            t=now,
            changed=len(changed),
            paths=named_paths(changed, tracker.named_globs),
            gap_seconds=None if previous is None else now - previous,
            grown_bytes=tracker.grown_bytes,
            rank_grown_bytes=dict(tracker.rank_grown_bytes),
            stale_limit_seconds=stale_limit,
        )
    )


def named_paths(changed: list[str], globs: Collection[str]) -> list[str]:
    """The first :data:`PATHS_PER_EVENT` paths, and the first match of each GLOB they leave
    out, so that the deadline and the goodput ledger see it."""
    named = changed[:PATHS_PER_EVENT]
    for glob in globs:
        if not any(path_matches(glob, path) for path in named):
            named += [path for path in changed if path_matches(glob, path)][:1]
    return named


async def note_missing_dir(
    sink: EventSink, tracker: ProgressTracker, progress_dir: Path, *, missing: bool
) -> None:
    """A ``sampler_note`` when the progress directory is found missing, or created after that."""
    if missing == (tracker.missing_dir is not None):
        return
    tracker.missing_dir = progress_dir if missing else None
    message = f"the progress directory {progress_dir} " + (
        "does not exist (yet)" if missing else "was created"
    )
    data = {"progress_dir": str(progress_dir), "exists": not missing}
    await sink.emit(
        events.SamplerNote(t=sink.elapsed(), sampler="watchdog", message=message, data=data)
    )


def skipped_message(progress_dir: Path, result: ScanResult) -> str:
    return (
        f"{result.errors} director{'y' if result.errors == 1 else 'ies'} below {progress_dir} "
        "could not be read and were skipped (their files are not watched for progress)"
    )


async def final_scan(
    sink: EventSink,
    *,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Collection[FileKey],
    also: Collection[Path] = (),
    limiter: anyio.CapacityLimiter,
    scan_timeout: float,
    steps: StepReader | None = None,
) -> tuple[str, str] | None:
    """One last scan once the command exited, so that its last writes count; the rule its
    last steps broke (a non-finite loss), if any."""
    previous = tracker.last_change
    # A scan of the watchdog's still stuck holds the step reader: not waited for long.
    scan = Scanner(progress_dir, lambda: ignore, also, steps, wait=scan_timeout / 2)
    try:
        result = await run_blocking(
            scan,
            timeout=scan_timeout,
            what="the final scan of the progress dir",
            limiter=limiter,
        )
    except BlockingCallTimeout:
        return None
    now = sink.elapsed()
    await note_missing_dir(sink, tracker, progress_dir, missing=result.missing)
    await report_progress(sink, tracker, tracker.observe(result.files, now), now, previous)
    if result.steps is not None and tracker.steps is not None:
        return await report_steps(sink, tracker, result.steps, now)
    return None


#: Notes about the step sources a soak records at most.
STEP_NOTES_MAX = 20


def auto_limit(tracker: ProgressTracker, steps: bool) -> float | None:
    """The learned limit to record with a progress (``steps``: a step) event, if auto."""
    if tracker.auto is None or tracker.stepping() != steps:
        return None
    return round(tracker.auto.limit, 3)


async def report_steps(
    sink: EventSink, tracker: ProgressTracker, reading: StepReading, now: float
) -> tuple[str, str] | None:
    """Fold and emit what the step sources wrote; the rule a non-finite loss broke, if any."""
    steps = tracker.steps
    assert steps is not None
    update = tracker.observe_steps(reading, now)
    for note in update.notes:
        tracker.step_notes += 1
        if tracker.step_notes == STEP_NOTES_MAX:
            note += " (and no further notes about the step sources)"
        if tracker.step_notes <= STEP_NOTES_MAX:
            await sink.emit(events.SamplerNote(t=now, sampler="steps", message=note))
    for warning in update.warnings:
        await sink.emit(events.WarningEvent(t=now, message=warning))
    if (update.advanced or update.changed) and steps.step is not None:
        assert steps.source is not None
        assert steps.source_kind is not None
        await sink.emit(
            events.StepProgress(
                t=now,
                step=steps.step,
                source=steps.source,
                source_kind=steps.source_kind,
                gap_seconds=update.gap,
                max_steps=steps.max_steps,
                loss=steps.loss,
                loss_step=steps.loss_step,
                nonfinite_loss=steps.nonfinite_loss,
                steps_per_second=_rounded(steps.steps_per_second),
                tokens_per_second=_rounded(steps.tokens_per_second),
                samples_per_second=_rounded(steps.samples_per_second),
                eta_seconds=_rounded(steps.eta_seconds()),
                stale_limit_seconds=auto_limit(tracker, True),
                counts=tracker.stepping(),
                nonfinite_grad_norms=steps.nonfinite_grad_norms,
                sources_without_loss=tuple(steps.sources_without_loss()),
                marks=tuple(update.marks[-MARKS_PER_EVENT:]),
            )
        )
    if update.nonfinite is not None:
        if steps.loss_check == "fail":
            return ("nonfinite_loss", f"{update.nonfinite} (loss_check=fail)")
        await sink.emit(events.WarningEvent(t=now, message=update.nonfinite))
    return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
