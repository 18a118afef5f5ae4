"""The watchdog: file growth in the progress directory is the run's sign of life, judged on
time even when a scan does not come back (docs/architecture.md, "The watchdog")."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import anyio

from .._contract import EXECUTOR, BlockingCallTimeout, EventSink, events, run_blocking
from ._inotify import Inotify
from ._progress_rules import (
    ProgressTracker,
    auto_limit,
    changed_at,
    note_missing_dir,
    report_progress,
    report_steps,
    skipped_message,
)
from ._progress_scan import FileKey, Scanner, ScanResult, stat_and_read, stat_keys
from ._steps import StepReader

#: How long past a deadline, beyond one scan interval, the stall rules wait for the scans to
#: settle it before they fire on their own (a scan that does not come back sees nothing).
JUDGE_GRACE_SECONDS = 2.0
#: A change inotify hears of this close to the next scan waits for it; one further off is
#: looked at at once, so that the progress events of a soak sampled rarely come when they do.
HEARD_WAIT_SECONDS = 1.0
#: The share of a core the full scans of a huge tree may take (where inotify watches it).
SCAN_CPU_SHARE = 0.02
#: Bound on a scan, a stat or the placing of watches (a hung filesystem: fail closed).
SCAN_TIMEOUT_SECONDS = 60.0
#: Full scans are never further apart than this, however costly.
MAX_FULL_SCAN_PERIOD_SECONDS = 60.0

Verdict = tuple[str, str] | None
_T = TypeVar("_T")


async def run_watchdog(
    sink: EventSink,
    *,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Callable[[], Collection[FileKey]],
    also: Collection[Path] = (),
    scan_interval: float,
    limiter: anyio.CapacityLimiter,
    steps: StepReader | None = None,
) -> None:
    """Watch until a rule fires (a ``rule_broken`` event) or the task is cancelled: a scan
    every ``scan_interval`` and at each deadline (with ``steps``, the step sources read in the
    same thread hop), inotify between them."""
    watcher = None
    with contextlib.suppress(OSError):  # no inotify here: the scans alone keep watch
        watcher = Inotify()
    scanner = Scanner(progress_dir, ignore, also, steps)
    loop = _WatchLoop(sink, watcher, scanner, tracker, scan_interval, limiter)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.judge_on_time, tg.cancel_scope)
            if watcher is not None:
                # The first walk of a big (or hung) tree must not hold up the scans, which
                # are the authority: the watches are put in place beside them.
                tg.start_soon(loop.first_watches)
            broken = await loop.run()
            if broken is not None:
                await loop.fail(*broken)
            tg.cancel_scope.cancel()
    finally:
        if watcher is not None:
            # Closing an inotify instance waits for the kernel's RCU grace period (2 to 20 ms):
            # on the event loop, 64 soaks cancelled together would wait for them one by one.
            # Nobody waits for it: the descriptor is closed in the pool, soon.
            EXECUTOR.submit(watcher.close)


@dataclass(eq=False)
class _WatchLoop:
    """Wait for the next scan (or the deadline), listening to inotify when the scan is far
    off; report what changed and judge the rules."""

    sink: EventSink
    watcher: Inotify | None
    scanner: Scanner
    tracker: ProgressTracker
    scan_interval: float
    limiter: anyio.CapacityLimiter
    watches_placed: anyio.Event = field(default_factory=anyio.Event)
    fired: bool = False
    root_watched: bool = False  # the progress directory exists (and so is watched)
    #: Scan key -> when inotify last told of a change to it, since the last scan.
    heard: dict[str, float] = field(default_factory=dict)
    rescan: bool = False  # inotify lost events: scan at once, not at the next tick
    #: The wait on inotify under way: cut short (setting ``replan``) when the first watches'
    #: look at the files moved the deadline.
    waiting: anyio.CancelScope | None = None
    replan: bool = False

    def __post_init__(self) -> None:
        self.progress_dir = self.scanner.progress_dir
        self.ignore = self.scanner.ignore
        self.next_scan = _next_on_grid(self.sink.elapsed(), self.scan_interval)
        self.scanned_at = self.sink.elapsed()

    async def fail(self, reason: str, message: str) -> None:
        if not self.fired:
            self.fired = True
            await self.sink.emit(events.RuleBroken(self.sink.elapsed(), reason, message))

    async def judge_on_time(self, scope: anyio.CancelScope) -> None:
        """The stall rules on their own clock: a grace after the deadline, a rule the scans
        have not settled (a scan did not come back) fires."""
        tracker, sink = self.tracker, self.sink
        while True:
            deadline = tracker.deadline()
            grace = self.scan_interval + JUDGE_GRACE_SECONDS
            await anyio.sleep(max(0.0, deadline + grace - sink.elapsed()))
            broken = tracker.verdict(sink.elapsed())
            if tracker.deadline() == deadline and broken is not None:
                break  # else progress was seen meanwhile: a new deadline
        reason, message = broken
        since = self.scanner.running_since
        if since is not None:
            message += (
                f"; the scan of {self.progress_dir} had not come back after "
                f"{time.monotonic() - since:.1f}s, so no progress could be seen"
            )
        await self.fail(reason, message)
        scope.cancel()

    async def first_watches(self) -> None:
        """Watch the progress tree and the extra files (never the ignored directories), then
        look once at the files found meanwhile: they may be written before their watch."""
        watcher = self.watcher
        assert watcher is not None

        def watch(ignore: Collection[FileKey]) -> list[str]:
            watcher.skip = frozenset(ignore)
            for path in self.scanner.also:
                watcher.watch_file(path)
            if not self.progress_dir.is_dir() and self.progress_dir.parent.is_dir():
                watcher.watch_for_creation(self.progress_dir)
            # Looked at again once the parent is watched: created just before, no event comes.
            if self.progress_dir.is_dir():
                return watcher.watch_tree(self.progress_dir)
            return []

        what = f"watching {self.progress_dir} with inotify"
        found = await self._blocking(watch, what, self.ignore())
        if found is not None:
            self.watches_placed.set()
            await self._seed(found)

    async def _seed(self, found: Collection[str]) -> None:
        if not found:
            return
        now = self.sink.elapsed()
        previous = self.tracker.last_change
        what = "a stat of the files found"
        updates = await self._blocking(stat_keys, what, self.progress_dir, found, self.ignore())
        if updates is None:
            return
        changed = self.tracker.observe_some(updates, now)
        await report_progress(self.sink, self.tracker, changed, now, previous)
        if changed and self.waiting is not None:
            self.replan = True
            self.waiting.cancel()

    async def run(self) -> Verdict:
        what = f"a stat of {self.progress_dir}"
        exists = await self._blocking(os.path.isdir, what, self.progress_dir)
        self.root_watched = bool(exists)
        if exists is not None:
            await note_missing_dir(self.sink, self.tracker, self.progress_dir, missing=not exists)
        while True:
            wake = min(self.next_scan, self.tracker.deadline())
            # With the next scan near, inotify is read as the scan comes back (a change dated
            # by its mtime), so that a trainer's every write does not wake the monitor.
            near = self.next_scan - self.sink.elapsed() <= HEARD_WAIT_SECONDS
            if self.watcher is not None and (self.rescan or not near):
                with anyio.move_on_after(max(0.0, wake - self.sink.elapsed())) as waiting:
                    self.waiting = waiting
                    try:
                        await anyio.wait_readable(self.watcher.fd)
                    finally:
                        self.waiting = None
                    broken = await self._hear_inotify()
                    if broken is not None:
                        return broken
                    continue
                if self.replan:
                    self.replan = False
                    continue  # a new deadline: wait for it instead
            else:
                await anyio.sleep(max(0.0, wake - self.sink.elapsed()))
            result = None
            if self.scanner.running_since is None:  # else the last scan is stuck: none
                result = await self._blocking(
                    self.scanner, f"the scan of {self.progress_dir}", limiter=self.limiter
                )
            now = self.sink.elapsed()
            self._plan_next_scan(now)
            if self.watcher is not None:
                # New directories to watch, lost events (the scan saw the changes).
                self.watcher.read(self.progress_dir)
                await self._catch_up(now)
            broken = await self._take_scan(result, now)
            if broken is not None:
                return broken
            if self.watcher is not None and not self.root_watched:
                await self._watch_progress_dir_once_created()

    async def _catch_up(self, now: float) -> list[str]:
        """Rescan at ``now`` if inotify lost events; watch the new directories it saw (the
        keys of their files)."""
        assert self.watcher is not None
        if self.watcher.overflowed:
            self.watcher.overflowed = False
            self.next_scan = now
            self.rescan = True
        if not self.watcher.pending:
            return []
        return await self._blocking(self.watcher.watch_pending, "watching new directories") or []

    async def _hear_inotify(self) -> Verdict:
        """Take what inotify told: near the next scan, left for it (dated now); else looked
        at now.  The rule their steps broke, if any."""
        assert self.watcher is not None
        touched = self.watcher.read(self.progress_dir)
        now = self.sink.elapsed()  # the change is dated when it was heard of
        touched.update(await self._catch_up(now))
        if self.next_scan - now <= HEARD_WAIT_SECONDS:
            self.heard.update(dict.fromkeys(touched, now))
            return None
        if not touched:
            return None
        tracker = self.tracker
        previous = tracker.last_change
        args = (self.progress_dir, touched, self.ignore(), self.scanner.steps)
        looked = await self._blocking(stat_and_read, "a stat of the files that changed", *args)
        if looked is None:
            return None
        updates, reading = looked
        await report_progress(self.sink, tracker, tracker.observe_some(updates, now), now, previous)
        if reading is not None and tracker.steps is not None:
            return await report_steps(self.sink, tracker, reading, now)
        return None

    def _plan_next_scan(self, now: float) -> None:
        """The next scan on the grid: one interval on, or :func:`full_scan_period` where
        inotify watches the whole tree."""
        period = self.scan_interval
        watcher = self.watcher
        if watcher and not watcher.full and self.root_watched and self.watches_placed.is_set():
            period = full_scan_period(self.scanner.last_cost, self.scan_interval)
        self.next_scan = _next_on_grid(now, period)
        self.rescan = False

    async def _take_scan(self, result: ScanResult | None, now: float) -> Verdict:
        """Report what the scan found and judge the rules: the rule broken, if any."""
        # A scan that cannot finish (a hung network filesystem) sees no progress: fail closed.
        tracker, sink = self.tracker, self.sink
        if result is not None:
            # What inotify heard of since the last scan: dated when heard, an event each.
            by_time: dict[float, list[str]] = {}
            for key, at in self.heard.items():
                by_time.setdefault(at, []).append(key)
            for at in sorted(by_time):
                previous = tracker.last_change
                some = tracker.observe_some({k: result.files.get(k) for k in by_time[at]}, at)
                await report_progress(sink, tracker, some, at, previous)
            self.heard.clear()
            previous = tracker.last_change
            at = changed_at(tracker, result.files, since=self.scanned_at, now=now, clock=sink.clock)
            changed = tracker.observe(result.files, at)
            self.scanned_at = now
            await note_missing_dir(sink, tracker, self.progress_dir, missing=result.missing)
            if result.errors > tracker.skipped_dirs:
                tracker.skipped_dirs = result.errors
                message = skipped_message(self.progress_dir, result)
                await sink.emit(events.WarningEvent(t=now, message=message))
            await report_progress(sink, tracker, changed, at, previous, auto_limit(tracker, False))
            if result.steps is not None and tracker.steps is not None:
                broken = await report_steps(sink, tracker, result.steps, now)
                if broken is not None:
                    return broken
        # Judged after every scan, changes or not: files that grow do not hide a frozen step.
        return tracker.verdict(now)

    async def _blocking(
        self,
        call: Callable[..., _T],
        what: str,
        *args: object,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> _T | None:
        """``call(*args)`` in a thread under the scan timeout; None if it did not come back."""
        with contextlib.suppress(BlockingCallTimeout):
            timeout = SCAN_TIMEOUT_SECONDS
            return await run_blocking(call, *args, timeout=timeout, what=what, limiter=limiter)
        return None

    async def _watch_progress_dir_once_created(self) -> None:
        """Watch the progress dir the trainer created after the start (what came between
        the scan and the watch is looked at now)."""
        watcher = self.watcher
        assert watcher is not None
        self.root_watched = bool(await self._blocking(os.path.isdir, "a stat", self.progress_dir))
        if not self.root_watched:
            return
        watcher.pending.append((self.progress_dir, ""))
        found = await self._blocking(watcher.watch_pending, "inotify watches")
        if found is not None:
            await self._seed(found)


def full_scan_period(cost: float, interval: float) -> float:
    """The period of full scans costing ``cost`` CPU seconds each: whole intervals, enough to
    keep within :data:`SCAN_CPU_SHARE` of a core, at most the maximum period."""
    wanted = min(cost / SCAN_CPU_SHARE, MAX_FULL_SCAN_PERIOD_SECONDS)
    return max(1, math.ceil(wanted / interval)) * interval


def _next_on_grid(now: float, interval: float) -> float:
    """The first multiple of ``interval`` after ``now``: the proc sampler's grid, so that a
    scan and a sample wake the event loop once."""
    return (math.floor(now / interval) + 1) * interval
