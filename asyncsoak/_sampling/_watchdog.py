"""The watchdog: file growth in the progress directory is the run's sign of life.

A regular file below ``progress_dir`` that is created, grows or whose mtime changes is progress;
asyncsoak's own files never count.  :func:`run_watchdog` wakes at the next scan or the next
deadline, so a stall is caught when its deadline passes, and judges on time even when a scan
does not come back (fail closed: a monitor that cannot see never passes a stall).  A huge tree
is scanned whole less often, inotify heard between its scans.  When inotify is listened to, and
how scans are spaced: docs/architecture.md, "The watchdog".
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import anyio

from .._contract import EXECUTOR, BlockingCallTimeout, EventSink, events, run_blocking
from ._inotify import Inotify
from ._progress_report import (
    auto_limit,
    note_missing_dir,
    report_progress,
    report_steps,
    skipped_message,
)
from ._progress_rules import ProgressTracker, changed_at
from ._progress_scan import FileKey, Scanner, ScanResult, stat_and_read
from ._progress_watches import first_watches, open_inotify, seed
from ._steps import StepReader

#: How long past a deadline, beyond one scan interval, the stall rules wait for the scans to
#: settle it before they fire on their own (a scan that does not come back sees nothing).
JUDGE_GRACE_SECONDS = 2.0
#: A change inotify hears of this close to the next scan waits for it; one further off is
#: looked at at once, so that the progress events of a soak sampled rarely come when they do.
HEARD_WAIT_SECONDS = 1.0


async def run_watchdog(
    sink: EventSink,
    *,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Callable[[], Collection[FileKey]],
    also: Collection[Path] = (),
    scan_interval: float,
    limiter: anyio.CapacityLimiter,
    scan_timeout: float = 60.0,
    use_inotify: bool = True,
    steps: StepReader | None = None,
) -> None:
    """Watch until a rule fires (then post it, a ``rule_broken`` event) or the task is cancelled.

    Between scans it waits on inotify, so a change is dated when it happens; a scan runs every
    ``scan_interval`` and at each deadline, and decides whether the deadline was met.
    With ``steps`` (and a tracker that holds a :class:`StepTracker`), each scan also reads
    what the step sources wrote, in the same thread hop.
    """
    watcher = open_inotify() if use_inotify else None
    scanner = Scanner(progress_dir, ignore, also, steps)
    fired = False

    async def fail(reason: str, message: str) -> None:
        nonlocal fired
        if not fired:
            fired = True
            await sink.emit(events.RuleBroken(t=sink.elapsed(), reason=reason, message=message))

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
                    first_watches,
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
    scanner: Scanner,
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
        scanner: Scanner,
        scan_interval: float,
        limiter: anyio.CapacityLimiter,
        on_failure: Callable[[str, str], Awaitable[None]],
        scan_timeout: float,
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
        self.watches_placed = watches_placed
        self.next_scan = _next_on_grid(sink.elapsed(), scan_interval)
        #: The period of full scans: the interval, or longer for a huge tree that inotify
        #: watches whole.
        self.period = scan_interval
        #: Whether the progress directory exists (and so is watched, with inotify).
        self.root_watched = False
        #: Scan key -> when inotify last told of a change to it, since the last scan.
        self.heard: dict[str, float] = {}
        #: inotify lost events: scan at once rather than at the next tick.
        self.rescan = False
        #: When the last scan came back: a change a scan finds happened after it.
        self.scanned_at = sink.elapsed()

    async def run(self) -> None:
        exists = await self._progress_dir_exists(f"a stat of {self.progress_dir}")
        self.root_watched = bool(exists)
        if exists is not None:
            await note_missing_dir(self.sink, self.tracker, self.progress_dir, missing=not exists)
        while True:
            wake = min(self.next_scan, self.tracker.deadline())
            if self._listening():
                assert self.watcher is not None
                with anyio.move_on_after(max(0.0, wake - self.sink.elapsed())):
                    await anyio.wait_readable(self.watcher.fd)
                    broken = await self._hear_inotify()
                    if broken is not None:
                        await self.on_failure(*broken)
                        return
                    continue
            else:
                # A plain sleep until the next scan or the deadline: no scope to cancel.
                await anyio.sleep(max(0.0, wake - self.sink.elapsed()))
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

    def _listening(self) -> bool:
        """Whether to listen to inotify while waiting.

        With the next scan near (an interval of a second or less), inotify is not listened
        to: what it has is read when the scan comes back, and a change is dated by its
        file's mtime, so a trainer's every write does not wake the monitor.
        """
        return self.watcher is not None and (
            self.rescan or self.next_scan - self.sink.elapsed() > HEARD_WAIT_SECONDS
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
            # Looked at by the next scan, not by a thread hop of its own for every write of
            # the trainer's.
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
            await report_progress(self.sink, tracker, changed, now, previous)
            if reading is not None and tracker.steps is not None:
                # Scans far apart (a huge tree): the steps are read when written.
                return await report_steps(self.sink, tracker, reading, now)
        return None

    async def _scan(self) -> ScanResult | None:
        """The scan of this interval, in a thread; None if it did not come back in time, or if
        the last scan is still stuck (this interval has no scan: the deadline is judged as if
        nothing changed)."""
        what = f"the scan of {self.progress_dir}"
        with contextlib.suppress(BlockingCallTimeout):
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
            await report_progress(self.sink, tracker, some, at, previous)
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
        await note_missing_dir(self.sink, tracker, self.progress_dir, missing=result.missing)
        if result.errors > tracker.skipped_dirs:
            tracker.skipped_dirs = result.errors
            await self.sink.emit(
                events.WarningEvent(t=now, message=skipped_message(self.progress_dir, result))
            )
        stale_limit = auto_limit(tracker, False)
        await report_progress(self.sink, tracker, changed, at, previous, stale_limit)

    async def _progress_dir_exists(self, what: str) -> bool | None:
        """Whether the progress directory exists; None when the stat did not come back."""
        with contextlib.suppress(BlockingCallTimeout):
            return await run_blocking(
                os.path.isdir, self.progress_dir, timeout=self.scan_timeout, what=what
            )
        return None

    async def _watch_progress_dir_once_created(self) -> None:
        """The trainer created the progress dir after the start: watch it from now on (what
        is already in it was seen by the scan; what came between, seen now)."""
        watcher = self.watcher
        assert watcher is not None
        self.root_watched = bool(await self._progress_dir_exists("a stat"))
        if not self.root_watched:
            return
        watcher.pending.append((self.progress_dir, ""))
        with contextlib.suppress(BlockingCallTimeout):
            found = await run_blocking(
                watcher.watch_pending, timeout=self.scan_timeout, what="inotify watches"
            )
            await seed(
                self.sink, self.progress_dir, self.tracker, self.ignore(), found, self.scan_timeout
            )


#: The share of a core the full scans of a huge tree may take (where inotify watches it).
SCAN_CPU_SHARE = 0.02
#: Full scans are never further apart than this, however costly.
MAX_FULL_SCAN_PERIOD_SECONDS = 60.0


def full_scan_period(cost: float, interval: float) -> float:
    """The period of full scans of a tree whose scan costs ``cost`` seconds of CPU: one
    interval, or as many as keep the scans within :data:`SCAN_CPU_SHARE` of a core (on the
    sampler's grid), at most :data:`MAX_FULL_SCAN_PERIOD_SECONDS`."""
    wanted = min(cost / SCAN_CPU_SHARE, MAX_FULL_SCAN_PERIOD_SECONDS)
    return max(1, math.ceil(wanted / interval)) * interval


def _next_on_grid(now: float, interval: float) -> float:
    """The first multiple of ``interval`` (seconds since the start) after ``now``.

    The proc sampler ticks on the same grid, so a scan and a sample wake the event loop once,
    not twice: in an idle monitor wake-ups are most of the cost.
    """
    return (math.floor(now / interval) + 1) * interval
