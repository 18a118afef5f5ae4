"""The watchdog: file growth in the progress directory is the run's sign of life.

A regular file below ``progress_dir`` (recursively, symlinks not followed) that is created,
grows, or whose mtime changes counts as progress; files present at the start are the baseline,
so their later growth counts too.  asyncsoak's own files (journal, artifact, the captured log
unless asked) never count, matched by device and inode.

The time of a change is on the monitor's monotonic clock: when inotify told of it, or, for a
change a scan finds, its file's mtime if that falls between the scan and the one before (the
window in which the monitor saw the change happen), else the scan's own time: a wall clock
that jumps, or a file server's clock that lies, never dates a change outside what the
monitor saw, nor before it happened.

:class:`ProgressTracker` holds the rules and takes ``now`` as an argument, so tests drive it
with any clock.  :func:`run_watchdog` sleeps until the next scan or the next deadline,
whichever comes first, so a stall is caught when its deadline passes, not at the next tick.  In
a soak the scan every interval rides on the proc sampler's tick (no timer of the watchdog's
own).  With scans a second apart or less, inotify is not listened to between them (a trainer
that writes often would wake the monitor at each write): its queue is read when the scan comes
back.  With scans further apart, inotify is listened to and a change is looked at when told.

The stall rules are judged on time whatever the scans do: a scan that does not come back (a
hung mount, a pool whose threads are all stuck) leaves the deadline to :func:`_judge_on_time`,
which calls the rule :data:`JUDGE_GRACE_SECONDS` plus one interval after the deadline if no
scan showed progress by then (fail closed: the monitor that cannot see never passes a stall).
A scan still running is never joined by a second one beside it.

A huge tree (100,000 files cost 0.35 s of CPU a scan here, 0.7 of a core at 0.5 s) is
scanned whole less often: where inotify watches the whole tree, full scans are spaced so that
they take at most :data:`SCAN_CPU_SHARE` of a core (:func:`full_scan_period`, a multiple of
the interval, at most :data:`MAX_FULL_SCAN_PERIOD_SECONDS`), inotify is listened to between
them (a new or grown file is looked at when told), and every deadline still gets a full scan
of its own before a stall is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import stat
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import anyio

from .._contract import (
    EXECUTOR,
    BlockingCallTimeout,
    EventSink,
    Progress,
    Ride,
    Rides,
    SamplerNote,
    SoakClock,
    StepProgress,
    WarningEvent,
    ride_or_run,
    run_blocking,
)
from ._inotify import Inotify
from ._step_rules import ProgressSource, StaleLimit, StepTracker, StepUpdate
from ._steps import KIND_STATE, StepReader, StepReading, source_kind

#: How many changed paths a progress event names.
PATHS_PER_EVENT = 5
#: A progress file that names a rank: ``rank1.jsonl``, ``metrics_rank_3.csv``, ``rank-0/``.
RANK_FILE = re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)


def rank_of_path(path: str) -> str | None:
    """The rank a progress file belongs to, from its path (the last part naming one)."""
    found = RANK_FILE.findall(path)
    return str(int(found[-1])) if found else None


FileKey = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True, slots=True)
class FileState:
    dev: int
    ino: int
    size: int
    mtime_ns: int


@dataclass(slots=True)
class ScanResult:
    files: dict[str, FileState]
    errors: int = 0
    #: What the step sources wrote since the last scan (None without a step reader).
    steps: StepReading | None = None


def scan_progress_dir(
    root: Path, ignore: Collection[FileKey] = (), also: Collection[Path] = ()
) -> ScanResult:
    """Every regular file below ``root`` by relative path, plus the files in ``also``.

    ``ignore`` holds the (device, inode) keys of files that never count and of directories
    skipped whole.  A directory that cannot be opened or listed to the end (``/proc/1/map_files``
    below ``--progress-dir /``) is counted in ``errors``, never raised: the scan goes on around it.
    """
    result = ScanResult(files={})
    for path in also:
        try:
            st = path.stat()
        except OSError:
            continue
        result.files[str(path)] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if not root.is_dir():
        return result
    # Inodes come free with each directory entry: a directory is stat'ed only on a match.
    ignored_inodes = {ino for _dev, ino in ignore}
    stack = [(str(root), "")]
    while stack:
        directory, rel = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            result.errors += 1
            continue
        with entries:
            while True:
                try:
                    entry = next(entries)
                except StopIteration:
                    break
                except OSError:
                    # Listing failed half-way (EACCES from /proc, EIO): skip the rest.
                    result.errors += 1
                    break
                name = f"{rel}{entry.name}"
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.inode() in ignored_inodes and _key(entry) in ignore:
                            continue
                        stack.append((entry.path, name + "/"))
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    # Vanished between listing and stat, or unreadable: not an error here.
                    continue
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in ignore:
                    continue
                result.files[name] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return result


class _Scanner:
    """The watchdog's scan of the progress tree, with whether one is running (in a thread)
    and since when: a scan that hangs is not joined by another, so one soak over a dead mount
    holds one thread, not one more per interval."""

    def __init__(
        self,
        progress_dir: Path,
        ignore: Callable[[], Collection[FileKey]],
        also: Collection[Path],
        steps: StepReader | None = None,
    ) -> None:
        self._progress_dir = progress_dir
        self._ignore = ignore
        self._also = also
        self.steps = steps
        #: ``time.monotonic()`` when the scan under way started; None when none runs.
        self.running_since: float | None = None
        #: The CPU time (of its thread) the last scan took.
        self.last_cost = 0.0

    def __call__(self) -> ScanResult:
        self.running_since = time.monotonic()
        cpu = time.thread_time()
        try:
            result = scan_progress_dir(self._progress_dir, self._ignore(), self._also)
            if self.steps is not None:
                # In the same thread hop as the scan: the steps ride the sampler's tick too.
                result.steps = self.steps.read(result.files)
            return result
        finally:
            self.last_cost = time.thread_time() - cpu
            self.running_since = None


def full_scan_period(cost: float, interval: float) -> float:
    """The period of full scans of a tree whose scan costs ``cost`` seconds of CPU: one
    interval, or as many as keep the scans within :data:`SCAN_CPU_SHARE` of a core (on the
    sampler's grid), at most :data:`MAX_FULL_SCAN_PERIOD_SECONDS`."""
    wanted = min(cost / SCAN_CPU_SHARE, MAX_FULL_SCAN_PERIOD_SECONDS)
    return max(1, math.ceil(wanted / interval)) * interval


def _key(entry: os.DirEntry[str]) -> FileKey:
    st = entry.stat(follow_symlinks=False)
    return (st.st_dev, st.st_ino)


class ProgressTracker:
    """The startup and staleness rules over successive scans.

    ``now`` is seconds since the soak's start.  Before the first change the deadline is
    ``startup_timeout``; after it, the last change plus the stale limit (``stale_after``, or
    what ``auto`` learned).  With ``steps`` and ``source`` ``"steps"`` (or ``"auto"`` once a
    step was read), the changes that count are the step's advances: a frozen step is a stall
    however the files grow, and startup ends at the first step.
    """

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
        #: Step notes emitted so far (they are bounded: see :data:`STEP_NOTES_MAX`).
        self.step_notes = 0
        self.first_change: float | None = None
        self.last_change: float | None = None
        self.longest_gap = 0.0
        #: Bytes the files changed by the last observation grew by.
        self.grown_bytes = 0
        #: The same, for the files that name a rank (``rank1.jsonl``), by rank.
        self.rank_grown_bytes: dict[str, int] = {}
        #: Directories a scan could not read, as last reported in a warning.
        self.skipped_dirs = 0
        #: The paths that changed last, the newest first (:func:`latest_change_age` looks
        #: at them); replaced whole, never changed in place: a thread reads it.
        self.recent: tuple[str, ...] = ()

    def changed(self, files: dict[str, FileState]) -> list[str]:
        """The paths of ``files`` that differ from when they were last seen (nothing recorded)."""
        return [path for path, state in files.items() if self._differs(path, state)]

    def observe(self, files: dict[str, FileState], now: float) -> list[str]:
        """Record a full scan; return the paths that changed since they were last seen."""
        changed = self.changed(files)
        self.grown_bytes = 0
        self.rank_grown_bytes = {}
        for path in changed:
            self._count_growth(path, files[path])
        self._files = files
        return self._record(changed, now)

    def observe_some(self, updates: dict[str, FileState | None], now: float) -> list[str]:
        """Record fresh states of a few paths (None: gone); return those that changed."""
        changed = []
        self.grown_bytes = 0
        self.rank_grown_bytes = {}
        for path, state in updates.items():
            if state is None:
                self._files.pop(path, None)
            elif self._differs(path, state):
                changed.append(path)
                self._count_growth(path, state)
                self._files[path] = state
        return self._record(sorted(changed), now)

    def _differs(self, path: str, state: FileState) -> bool:
        old = self._files.get(path)
        return (
            old is None
            or old.ino != state.ino
            or old.size != state.size
            or old.mtime_ns != state.mtime_ns
        )

    def _count_growth(self, path: str, state: FileState) -> None:
        grown = self._growth(path, state)
        self.grown_bytes += grown
        rank = rank_of_path(path)
        if rank is not None:
            self.rank_grown_bytes[rank] = self.rank_grown_bytes.get(rank, 0) + grown

    def _growth(self, path: str, state: FileState) -> int:
        old = self._files.get(path)
        if old is None or old.ino != state.ino:
            return state.size
        return max(0, state.size - old.size)

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
        """Whether the step's advances are the progress that counts (else file changes).

        Under ``auto``, a step from ``trainer_state.json`` alone does not: it moves only at
        checkpoint saves, and a limit set for file changes would kill the run between two.
        """
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
        """Why a fixed limit may be shorter than the trainer's logging interval, when the
        steps seen say so (one step only, or steps nearly a limit apart, and nothing logged
        since): a hang after steady steps, or lines logged at a frozen step, get no such hint."""
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
            return (
                "startup_timeout",
                f"no progress within startup_timeout_seconds={self.startup_timeout:g}",
            )
        return (
            "stale_progress",
            f"no progress for {self._limit_text()} (last change at {self.last_change:.1f}s)",
        )


def stat_keys(
    root: Path, keys: Collection[str], ignore: Collection[FileKey]
) -> dict[str, FileState | None]:
    """Fresh states of files named by scan keys (relative to ``root``, or absolute)."""
    out: dict[str, FileState | None] = {}
    for key in keys:
        try:
            st = os.stat(root / key, follow_symlinks=False)
        except OSError:
            out[key] = None
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in ignore:
            out[key] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def stat_and_read(
    root: Path, keys: Collection[str], ignore: Collection[FileKey], steps: StepReader | None
) -> tuple[dict[str, FileState | None], StepReading | None]:
    """Fresh states of the files inotify told of, and, when one of them is a step source,
    what the step sources wrote (not waiting for a scan that holds the reader)."""
    updates = stat_keys(root, keys, ignore)
    if steps is None or not any(source_kind(key) is not None for key in keys):
        return updates, None
    present = {key: state for key, state in updates.items() if state is not None}
    return updates, steps.read(present, wait=0, whole_tree=False)


#: Paths :attr:`ProgressTracker.recent` keeps: a trainer writes its progress to a few files.
RECENT_PATHS = 4


def latest_change_age(
    tracker: ProgressTracker, root: Path, ignore: Collection[FileKey]
) -> float | None:
    """Seconds since the newest change to the files that changed last, by their mtimes, or
    None: a stat of a few files, run in a thread.

    A look between the scans for the live view, which draws on a thread hop of its own: the
    time since the last progress it shows is the monitor's when the line is drawn, not up to
    one scan interval late (nor the date of a change heard of before the scan that found the
    file grown again), at no wake-up of the watchdog's.  Nothing is recorded: the scans alone
    decide the stall rules.  An mtime in the future (a file server's clock that lies) says
    nothing, and neither does any file once the step's advances are the progress that counts
    (a file that grows while the step is frozen is a stall).
    """
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


def open_inotify() -> Inotify | None:
    """An inotify instance without watches, or None where inotify is unavailable."""
    try:
        return Inotify()
    except OSError:
        return None


def watch_progress(
    watcher: Inotify, progress_dir: Path, also: Collection[Path], ignore: Collection[FileKey] = ()
) -> list[str]:
    """Watch the progress tree and the extra files (a walk: run it in a thread), never the
    directories in ``ignore``.

    Returns the keys of the files found below: they may have been written after the baseline
    scan but before their watch was in place (a trainer that writes at once).
    """
    watcher.skip = frozenset(ignore)
    for path in also:
        watcher.watch_file(path)
    if progress_dir.is_dir():
        return watcher.watch_tree(progress_dir)
    if progress_dir.parent.is_dir():
        watcher.watch_for_creation(progress_dir)
    return []


async def run_watchdog(
    sink: EventSink,
    *,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Callable[[], Collection[FileKey]],
    also: Collection[Path] = (),
    scan_interval: float,
    limiter: anyio.CapacityLimiter,
    on_failure: Callable[[str, str], Awaitable[None]],
    scan_timeout: float = 60.0,
    use_inotify: bool = True,
    rides: Rides | None = None,
    steps: StepReader | None = None,
) -> None:
    """Watch until a rule fires (then call ``on_failure``) or the task is cancelled.

    Between scans it waits on inotify, so a change is dated when it happens; a scan runs every
    ``scan_interval`` and at each deadline, and decides whether the deadline was met.  With
    ``rides`` (the proc sampler's, on the same grid) the scans ride on the sampler's thread hop.
    With ``steps`` (and a tracker that holds a :class:`StepTracker`), each scan also reads
    what the step sources wrote, in the same thread hop.
    """
    watcher = open_inotify() if use_inotify else None
    scanner = _Scanner(progress_dir, ignore, also, steps)
    fired = False

    async def fail(reason: str, message: str) -> None:
        nonlocal fired
        if not fired:
            fired = True
            await on_failure(reason, message)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                _judge_on_time,
                sink,
                tracker,
                scanner,
                progress_dir,
                scan_interval + JUDGE_GRACE_SECONDS,
                fail,
                tg.cancel_scope,
            )
            watches_placed = anyio.Event()
            if watcher is not None:
                # The first walk of a big (or hung) tree must not hold up the scans, which
                # are the authority: the watches are put in place beside them.
                tg.start_soon(
                    _first_watches,
                    sink,
                    watcher,
                    progress_dir,
                    tracker,
                    ignore,
                    also,
                    scan_timeout,
                    watches_placed,
                )
            await _WatchLoop(
                sink,
                watcher,
                progress_dir,
                tracker,
                ignore,
                scanner,
                scan_interval,
                limiter,
                fail,
                scan_timeout,
                rides,
                watches_placed,
            ).run()
            tg.cancel_scope.cancel()
    finally:
        if watcher is not None:
            # Closing an inotify instance waits for the kernel's RCU grace period (2 to 20 ms):
            # on the event loop, 64 soaks cancelled together would wait for them one by one.
            # Nobody waits for it: the descriptor is closed in the pool, soon.
            EXECUTOR.submit(watcher.close)


async def _judge_on_time(
    sink: EventSink,
    tracker: ProgressTracker,
    scanner: _Scanner,
    progress_dir: Path,
    grace: float,
    fail: Callable[[str, str], Awaitable[None]],
    scope: anyio.CancelScope,
) -> None:
    """The stall rules on their own clock: ``grace`` after the deadline, a rule the scans
    have not settled (no progress seen meanwhile, no verdict of their own: a scan or a stat
    that did not come back) fires, and the watchdog ends.  One wake-up per deadline."""
    while True:
        deadline = tracker.deadline()
        await anyio.sleep(max(0.0, deadline + grace - sink.elapsed()))
        now = sink.elapsed()
        broken = tracker.verdict(now)
        if tracker.deadline() != deadline or broken is None:
            continue  # progress was seen meanwhile: a new deadline
        reason, message = broken
        since = scanner.running_since
        if since is not None:
            message += (
                f"; the scan of {progress_dir} had not come back after "
                f"{time.monotonic() - since:.1f}s, so no progress could be seen"
            )
        await fail(reason, message)
        scope.cancel()
        return


async def _first_watches(
    sink: EventSink,
    watcher: Inotify,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Callable[[], Collection[FileKey]],
    also: Collection[Path],
    bound: float,
    placed: anyio.Event,
) -> None:
    with contextlib.suppress(BlockingCallTimeout):
        found = await run_blocking(
            watch_progress,
            watcher,
            progress_dir,
            also,
            ignore(),
            timeout=bound,
            what=f"watching {progress_dir} with inotify",
        )
        placed.set()
        await _seed(sink, progress_dir, tracker, ignore(), found, bound)


async def _seed(
    sink: EventSink,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Collection[FileKey],
    found: Collection[str],
    bound: float,
) -> None:
    """Look once at the files found while placing watches: written before their watch."""
    if not found:
        return
    now = sink.elapsed()
    previous = tracker.last_change
    updates = await run_blocking(
        stat_keys, progress_dir, found, ignore, timeout=bound, what="a stat of the files found"
    )
    await _report(
        sink,
        tracker.observe_some(updates, now),
        now,
        previous,
        tracker.grown_bytes,
        tracker.rank_grown_bytes,
    )


class _WatchLoop:
    """The watchdog's loop: wait for the next scan (or the deadline), listening to inotify
    when the scan is far off; take the scan's result, report what changed and judge the
    rules; until a rule is broken (then ``on_failure``) or the task is cancelled."""

    def __init__(
        self,
        sink: EventSink,
        watcher: Inotify | None,
        progress_dir: Path,
        tracker: ProgressTracker,
        ignore: Callable[[], Collection[FileKey]],
        scanner: _Scanner,
        scan_interval: float,
        limiter: anyio.CapacityLimiter,
        on_failure: Callable[[str, str], Awaitable[None]],
        scan_timeout: float,
        rides: Rides | None = None,
        watches_placed: anyio.Event | None = None,
    ) -> None:
        self.sink = sink
        self.watcher = watcher
        self.progress_dir = progress_dir
        self.tracker = tracker
        self.ignore = ignore
        self.scanner = scanner
        self.scan_interval = scan_interval
        self.limiter = limiter
        self.on_failure = on_failure
        self.scan_timeout = scan_timeout
        self.rides = rides
        self.watches_placed = watches_placed
        self.next_scan = _next_on_grid(sink.elapsed(), scan_interval)
        #: The period of full scans: the interval, or longer for a huge tree that inotify
        #: watches whole (then the scans run on their own hop, not on the sampler's).
        self.period = scan_interval
        #: Whether the progress directory exists (and so is watched, with inotify).
        self.root_watched = False
        #: The scan posted to ride on the sampler's next tick, until it is taken.
        self.ride: Ride[ScanResult] | None = None
        #: Scan key -> when inotify last told of a change to it, since the last scan.
        self.heard: dict[str, float] = {}
        #: inotify lost events: scan at once rather than at the next tick.
        self.rescan = False
        #: When the last scan came back: a change a scan finds happened after it.
        self.scanned_at = sink.elapsed()

    async def run(self) -> None:
        self.root_watched = await self._progress_dir_exists(f"a stat of {self.progress_dir}")
        while True:
            self._post_riding_scan()
            wake = self._wake_at()
            listening = self._listening()
            with anyio.move_on_after(max(0.0, wake - self.sink.elapsed())):
                if await _inotify_or_scan(self.watcher if listening else None, self.ride):
                    broken = await self._hear_inotify()
                    if broken is not None:
                        await self.on_failure(*broken)
                        return
                    continue
            result = await self._scan()
            now = self.sink.elapsed()
            self._plan_next_scan(now)
            await self._catch_up_with_inotify(now)
            broken = await self._take_scan(result, now)
            if broken is not None:
                await self.on_failure(*broken)
                return
            if self.watcher is not None and not self.root_watched:
                await self._watch_progress_dir_once_created()

    def _post_riding_scan(self) -> None:
        """Post the next scan to the sampler's tick, when scans ride on it (a full scan each
        interval) and none is posted or running."""
        if self.rides is None or self.period != self.scan_interval:
            return
        if self.ride is None and self.scanner.running_since is None:
            # Posted ahead, so the sampler's hop at the next tick takes it.
            self.ride = self.rides.post(self.scanner, self.scan_timeout)

    def _wake_at(self) -> float:
        """When to stop waiting: the deadline, or the next scan's time if it is this loop's
        to run.  A riding scan comes back with the sampler's tick: no timer of the watchdog's
        own wakes the loop for it, only the deadline (or an overflow, which wants a scan now)."""
        deadline = self.tracker.deadline()
        if self.ride is None or self.rescan:
            return min(self.next_scan, deadline)
        # A riding scan that has not come back one interval after its tick (the tick's
        # thread held up by a read of a huge tree on a starved machine) is hurried.
        return min(self.next_scan + self.scan_interval, deadline)

    def _listening(self) -> bool:
        """Whether to listen to inotify while waiting.

        With the next scan near (an interval of a second or less), inotify is not listened
        to: what it has is read when the scan comes back, and a change is dated by its
        file's mtime, so a trainer's every write does not wake the monitor.
        """
        return self.watcher is not None and (
            self.ride is None
            or self.rescan
            or self.next_scan - self.sink.elapsed() > HEARD_WAIT_SECONDS
        )

    async def _hear_inotify(self) -> tuple[str, str] | None:
        """Take what inotify told: near the next scan, left for it (dated now); else the
        files are looked at now.  Returns the rule their steps broke, if any."""
        watcher = self.watcher
        assert watcher is not None
        touched = watcher.read(self.progress_dir)
        self._rescan_if_overflowed(self.sink.elapsed())
        now = self.sink.elapsed()  # the change is dated when it was heard of
        if watcher.pending:
            touched.update(await self._watch_new_directories())
        if self.next_scan - now <= HEARD_WAIT_SECONDS:
            # Looked at by the next scan (on the sampler's hop at the next tick), not by a
            # thread hop of its own for every write of the trainer's.
            for key in touched:
                self.heard[key] = now
            return None
        if touched:
            return await self._look_at(touched, now)
        return None

    async def _look_at(self, touched: Collection[str], now: float) -> tuple[str, str] | None:
        """Report the changes to the files inotify told of, and what the step sources wrote
        if one of them is a step source; returns the rule the steps broke, if any."""
        tracker = self.tracker
        with contextlib.suppress(BlockingCallTimeout):
            previous = tracker.last_change
            updates, reading = await run_blocking(
                stat_and_read,
                self.progress_dir,
                touched,
                self.ignore(),
                self.scanner.steps,
                timeout=self.scan_timeout,
                what="a stat of the files that changed",
            )
            changed = tracker.observe_some(updates, now)
            await _report(
                self.sink, changed, now, previous, tracker.grown_bytes, tracker.rank_grown_bytes
            )
            if reading is not None and tracker.steps is not None:
                # Scans far apart (a huge tree): the steps are read when written.
                return await report_steps(self.sink, tracker, reading, now)
        return None

    async def _scan(self) -> ScanResult | None:
        """The scan of this interval: the riding one (hurried if its tick is late), else one
        in a thread of its own; None if it did not come back in time, or if the last scan is
        still stuck (this interval has no scan: the deadline is judged as if nothing changed)."""
        what = f"the scan of {self.progress_dir}"
        with contextlib.suppress(BlockingCallTimeout):
            if self.rides is not None and self.ride is not None:
                taking, self.ride = self.ride, None
                return await ride_or_run(self.rides, taking, what=what, limiter=self.limiter)
            if self.scanner.running_since is None:
                return await run_blocking(
                    self.scanner, timeout=self.scan_timeout, what=what, limiter=self.limiter
                )
        return None

    def _plan_next_scan(self, now: float) -> None:
        """The next scan on the sampler's grid: one interval on, or a longer period (see
        :func:`full_scan_period`) where inotify watches the whole tree."""
        watcher = self.watcher
        whole_tree_watched = (
            watcher is not None
            and not watcher.full
            and self.root_watched
            and self.watches_placed is not None
            and self.watches_placed.is_set()
        )
        self.period = (
            full_scan_period(self.scanner.last_cost, self.scan_interval)
            if whole_tree_watched
            else self.scan_interval
        )
        self.next_scan = _next_on_grid(now, self.period)
        self.rescan = False

    async def _catch_up_with_inotify(self, now: float) -> None:
        """What inotify told meanwhile, unheard: new directories to watch, lost events (the
        changes themselves the scan has seen)."""
        if self.watcher is None:
            return
        self.watcher.read(self.progress_dir)
        self._rescan_if_overflowed(now)
        if self.watcher.pending:
            await self._watch_new_directories()

    def _rescan_if_overflowed(self, now: float) -> None:
        """inotify lost events: scan at ``now`` rather than at the next tick."""
        assert self.watcher is not None
        if self.watcher.overflowed:
            self.watcher.overflowed = False
            self.next_scan = now
            self.rescan = True

    async def _watch_new_directories(self) -> list[str]:
        """Watch the directories inotify saw created (a walk, in a thread); the keys of the
        files found in them (none if the walk did not come back in time)."""
        assert self.watcher is not None
        with contextlib.suppress(BlockingCallTimeout):
            return await run_blocking(
                self.watcher.watch_pending,
                timeout=self.scan_timeout,
                what="watching new directories with inotify",
            )
        return []

    async def _take_scan(self, result: ScanResult | None, now: float) -> tuple[str, str] | None:
        """Report what the scan found and judge the rules: the rule broken, if any."""
        # A scan that cannot finish (a hung network filesystem) sees no progress: fail closed.
        if result is not None:
            await self._report_heard(result)
            await self._report_scanned(result, now)
            if result.steps is not None and self.tracker.steps is not None:
                broken = await report_steps(self.sink, self.tracker, result.steps, now)
                if broken is not None:
                    return broken
        # Judged after every scan, changes or not: files that grow do not hide a frozen step.
        return self.tracker.verdict(now)

    async def _report_heard(self, result: ScanResult) -> None:
        """The changes inotify heard of since the last scan, as the scan found their files:
        dated (and reported) when heard, one event per hearing, as when each was looked at
        on its own."""
        tracker = self.tracker
        by_time: dict[float, list[str]] = {}
        for key, at in self.heard.items():
            by_time.setdefault(at, []).append(key)
        for at in sorted(by_time):
            previous = tracker.last_change
            some = tracker.observe_some({k: result.files.get(k) for k in by_time[at]}, at)
            await _report(
                self.sink, some, at, previous, tracker.grown_bytes, tracker.rank_grown_bytes
            )
        self.heard.clear()

    async def _report_scanned(self, result: ScanResult, now: float) -> None:
        """The rest of what changed, dated by :func:`changed_at`, and the directories the
        scan could not read (when more than told before)."""
        tracker = self.tracker
        previous = tracker.last_change
        at = changed_at(
            tracker, result.files, since=self.scanned_at, now=now, clock=self.sink.clock
        )
        changed = tracker.observe(result.files, at)
        self.scanned_at = now
        if result.errors > tracker.skipped_dirs:
            tracker.skipped_dirs = result.errors
            await self.sink.emit(
                WarningEvent(t=now, message=skipped_message(self.progress_dir, result))
            )
        if changed:
            await _report(
                self.sink,
                changed,
                at,
                previous,
                tracker.grown_bytes,
                tracker.rank_grown_bytes,
                stale_limit=_auto_limit(tracker, False),
            )

    async def _progress_dir_exists(self, what: str) -> bool:
        with contextlib.suppress(BlockingCallTimeout):
            return await run_blocking(
                os.path.isdir, self.progress_dir, timeout=self.scan_timeout, what=what
            )
        return False

    async def _watch_progress_dir_once_created(self) -> None:
        """The trainer created the progress dir after the start: watch it from now on (what
        is already in it was seen by the scan; what came between, seen now)."""
        watcher = self.watcher
        assert watcher is not None
        self.root_watched = await self._progress_dir_exists("a stat")
        if not self.root_watched:
            return
        watcher.pending.append((self.progress_dir, ""))
        with contextlib.suppress(BlockingCallTimeout):
            found = await run_blocking(
                watcher.watch_pending, timeout=self.scan_timeout, what="inotify watches"
            )
            await _seed(
                self.sink, self.progress_dir, self.tracker, self.ignore(), found, self.scan_timeout
            )


def changed_at(
    tracker: ProgressTracker,
    files: dict[str, FileState],
    *,
    since: float,
    now: float,
    clock: SoakClock,
) -> float:
    """When the newest of the changes a scan found happened, in the soak's seconds: its file's
    mtime (late by the kernel's coarse clock at most, so never early) if it falls between the
    previous scan (``since``) and this one (``now``), when the monitor saw the change happen;
    else (a wall clock that jumped, a file server's clock that lies) when the scan saw it."""
    newest = max((files[key].mtime_ns for key in tracker.changed(files)), default=None)
    if newest is None:
        return now
    wall_to_soak = time.time() - time.monotonic() + clock.start
    at = newest / 1e9 + MTIME_LATENESS_SECONDS - wall_to_soak
    return at if since <= at <= now else now


def _coarse_clock_resolution() -> float:
    try:
        return time.clock_getres(_CLOCK_REALTIME_COARSE)
    except OSError:
        return 0.01


#: ``CLOCK_REALTIME_COARSE`` of <linux/time.h>, which Python's time module does not name.
_CLOCK_REALTIME_COARSE = 5
#: How far behind a file's mtime may be (the kernel dates writes with its coarse clock, one
#: scheduler tick at most): added, so that a change is never dated before it happened.
MTIME_LATENESS_SECONDS = _coarse_clock_resolution()


#: The share of a core the full scans of a huge tree may take (where inotify watches it).
SCAN_CPU_SHARE = 0.02
#: Full scans are never further apart than this, however costly.
MAX_FULL_SCAN_PERIOD_SECONDS = 60.0


#: How long past a deadline, beyond one scan interval, the stall rules wait for the scans to
#: settle it before they fire on their own (a scan that does not come back sees nothing).
JUDGE_GRACE_SECONDS = 2.0


#: A change inotify hears of this close to the next scan waits for it (which rides on the proc
#: sampler's thread hop); one further off is looked at at once, so that the progress events of
#: a soak sampled rarely come when the changes do.
HEARD_WAIT_SECONDS = 1.0


async def _inotify_or_scan(watcher: Inotify | None, ride: Ride[ScanResult] | None) -> bool:
    """Wait until inotify has news (True) or the riding scan is done (False).

    One wait on one event that either sets (inotify through the event loop's reader, the scan
    through the ride's ``on_done``): no task group per tick.
    """
    if ride is None:
        if watcher is None:
            await anyio.sleep_forever()
        assert watcher is not None
        await anyio.wait_readable(watcher.fd)
        return True
    if watcher is None or ride.done.is_set():
        await ride.done.wait()
        return False
    woken = anyio.Event()
    heard: list[bool] = []

    def readable() -> None:
        heard.append(True)
        woken.set()

    loop = asyncio.get_running_loop()
    loop.add_reader(watcher.fd, readable)
    ride.on_done = woken.set
    try:
        await woken.wait()
    finally:
        ride.on_done = None
        loop.remove_reader(watcher.fd)
    return bool(heard)


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
    """One last scan when the command has exited: what it wrote since the last scan counts,
    even when it lived less than one scan interval (its last steps too).  Returns the rule
    its last steps broke (a non-finite loss), if any."""
    previous = tracker.last_change

    def scan() -> ScanResult:
        result = scan_progress_dir(progress_dir, ignore, also)
        if steps is not None:
            # A scan of the watchdog's still stuck holds the reader: not waited for long.
            result.steps = steps.read(result.files, wait=scan_timeout / 2)
        return result

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
    await _report(
        sink,
        tracker.observe(result.files, now),
        now,
        previous,
        tracker.grown_bytes,
        tracker.rank_grown_bytes,
    )
    if result.steps is not None and tracker.steps is not None:
        return await report_steps(sink, tracker, result.steps, now)
    return None


#: Notes about the step sources (garbage, a step going back, a skipped backlog) a soak
#: records at most; the rest are counted in the last one.
STEP_NOTES_MAX = 20


def _auto_limit(tracker: ProgressTracker, steps: bool) -> float | None:
    """The learned limit to record with a progress (``steps``: a step) event, if auto."""
    if tracker.auto is None or tracker.stepping() != steps:
        return None
    return round(tracker.auto.limit, 3)


async def report_steps(
    sink: EventSink, tracker: ProgressTracker, reading: StepReading, now: float
) -> tuple[str, str] | None:
    """Fold and emit what the step sources wrote; a non-finite loss under
    ``--loss-check fail`` is returned as the rule it broke."""
    steps = tracker.steps
    assert steps is not None
    update = tracker.observe_steps(reading, now)
    for note in update.notes:
        tracker.step_notes += 1
        if tracker.step_notes < STEP_NOTES_MAX:
            await sink.emit(SamplerNote(t=now, sampler="steps", message=note))
        elif tracker.step_notes == STEP_NOTES_MAX:
            message = f"{note} (and no further notes about the step sources)"
            await sink.emit(SamplerNote(t=now, sampler="steps", message=message))
    for warning in update.warnings:
        await sink.emit(WarningEvent(t=now, message=warning))
    if (update.advanced or update.changed) and steps.step is not None:
        assert steps.source is not None
        assert steps.source_kind is not None
        await sink.emit(
            StepProgress(
                t=now,
                step=steps.step,
                source=steps.source,
                source_kind=steps.source_kind,
                gap_seconds=update.gap,
                max_steps=steps.max_steps,
                loss=steps.loss,
                loss_step=steps.loss_step,
                steps_per_second=_rounded(steps.steps_per_second),
                tokens_per_second=_rounded(steps.tokens_per_second),
                samples_per_second=_rounded(steps.samples_per_second),
                eta_seconds=_rounded(steps.eta_seconds()),
                stale_limit_seconds=_auto_limit(tracker, True),
                counts=tracker.stepping(),
            )
        )
    if update.nonfinite is not None:
        if steps.loss_check == "fail":
            return ("nonfinite_loss", f"{update.nonfinite} (loss_check=fail)")
        await sink.emit(WarningEvent(t=now, message=update.nonfinite))
    return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _next_on_grid(now: float, interval: float) -> float:
    """The first multiple of ``interval`` (seconds since the start) after ``now``.

    The proc sampler ticks on the same grid, so a scan and a sample wake the event loop once,
    not twice: in an idle monitor wake-ups are most of the cost.
    """
    return (math.floor(now / interval) + 1) * interval


async def _report(
    sink: EventSink,
    changed: list[str],
    now: float,
    previous: float | None,
    grown: int,
    rank_grown: dict[str, int] | None = None,
    stale_limit: float | None = None,
) -> None:
    if changed:
        gap = None if previous is None else now - previous
        await sink.emit(
            Progress(
                t=now,
                changed=len(changed),
                paths=changed[:PATHS_PER_EVENT],
                gap_seconds=gap,
                grown_bytes=grown,
                rank_grown_bytes=dict(rank_grown or {}),
                stale_limit_seconds=stale_limit,
            )
        )
