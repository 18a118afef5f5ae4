"""The inotify watches on the progress tree, placed beside the scans, and a first look at the
files found while placing them (written before their watch)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from pathlib import Path

import anyio

from .._contract import BlockingCallTimeout, EventSink, run_blocking
from ._inotify import Inotify
from ._progress_report import report_progress
from ._progress_rules import ProgressTracker
from ._progress_scan import FileKey, stat_keys


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


async def first_watches(
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
        await seed(sink, progress_dir, tracker, ignore(), found, bound)


async def seed(
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
    await report_progress(sink, tracker, tracker.observe_some(updates, now), now, previous)
