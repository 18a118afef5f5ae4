"""The progress rules, driven by an injected clock, and the scanner over real files."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from asyncsoak._record._sink import SoakClock
from asyncsoak._sampling._watchdog import (
    MTIME_LATENESS_SECONDS,
    FileState,
    ProgressTracker,
    changed_at,
    scan_progress_dir,
)


def state(size: int, mtime_ns: int = 0, ino: int = 1) -> FileState:
    return FileState(dev=1, ino=ino, size=size, mtime_ns=mtime_ns)


def test_startup_deadline_then_stale_deadline() -> None:
    """Before any change the deadline is the startup limit; after, last change + stale limit."""
    tracker = ProgressTracker({}, startup_timeout=10.0, stale_after=3.0)
    assert tracker.deadline() == 10.0
    assert tracker.verdict(9.99) is None
    assert tracker.observe({"m": state(1)}, now=4.0) == ["m"]
    assert tracker.deadline() == 7.0
    assert tracker.verdict(6.9) is None
    reason, message = tracker.verdict(7.0) or ("", "")
    assert reason == "stale_progress"
    assert "stale_progress_seconds=3" in message


def test_no_change_by_the_startup_deadline_is_startup_timeout() -> None:
    """Scans that see only the baseline never count as progress."""
    tracker = ProgressTracker({"old": state(5)}, startup_timeout=2.0, stale_after=1.0)
    assert tracker.observe({"old": state(5)}, now=1.0) == []
    assert tracker.verdict(2.0) == (
        "startup_timeout",
        "no progress within startup_timeout_seconds=2",
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (state(5), state(6)),  # grew
        (state(5, mtime_ns=1), state(5, mtime_ns=2)),  # touched
        (state(5, ino=1), state(5, ino=2)),  # replaced atomically
    ],
    ids=["grew", "touched", "replaced"],
)
def test_every_kind_of_change_counts(before: FileState, after: FileState) -> None:
    """Growth, a new mtime or a new inode of a baseline file are all progress."""
    tracker = ProgressTracker({"m": before}, startup_timeout=9.0, stale_after=9.0)
    assert tracker.observe({"m": after}, now=1.0) == ["m"]
    assert tracker.first_change == 1.0


def test_time_of_change_is_when_seen_and_gaps_are_tracked() -> None:
    """The monitor's clock at the scan is the time of a change; the longest gap is kept."""
    tracker = ProgressTracker({}, startup_timeout=9.0, stale_after=9.0)
    tracker.observe({"a": state(1)}, now=1.0)
    tracker.observe({"a": state(2)}, now=6.0)
    tracker.observe({"a": state(3)}, now=7.5)
    assert (tracker.first_change, tracker.last_change, tracker.longest_gap) == (1.0, 7.5, 5.0)


def test_a_change_a_scan_finds_is_dated_by_its_mtime_within_the_scans() -> None:
    """Between two scans, a change is dated when its file was written (its mtime, late by the
    kernel's coarse clock at most, never early); an mtime outside the two scans (a wall clock
    that jumped, a file server's clock that lies) is not believed: the scan's time is."""
    clock = SoakClock(start=time.monotonic() - 10.0)
    tracker = ProgressTracker({"a": state(1), "b": state(1)}, startup_timeout=9.0, stale_after=9.0)
    now = time.monotonic() - clock.start
    since = now - 0.8

    def wall_ns(soak_seconds: float) -> int:
        return int((time.time() - time.monotonic() + clock.start + soak_seconds) * 1e9)

    written = now - 0.3
    files = {"a": state(2, mtime_ns=wall_ns(written)), "b": state(1)}
    at = changed_at(tracker, files, since=since, now=now, clock=clock)
    assert at == pytest.approx(written + MTIME_LATENESS_SECONDS, abs=0.002)
    assert written <= at <= now
    # An mtime from before the last scan (or from a server behind), one from the future:
    old = {"a": state(2, mtime_ns=wall_ns(since - 60.0))}
    assert changed_at(tracker, old, since=since, now=now, clock=clock) == now
    ahead = {"a": state(2, mtime_ns=wall_ns(now + 60.0))}
    assert changed_at(tracker, ahead, since=since, now=now, clock=clock) == now
    # Nothing changed: the scan's own time.
    same = {"a": state(1), "b": state(1)}
    assert changed_at(tracker, same, since=since, now=now, clock=clock) == now


def test_a_deleted_file_is_not_progress() -> None:
    """Files disappearing (log rotation) is not a sign of life."""
    tracker = ProgressTracker({"a": state(1)}, startup_timeout=9.0, stale_after=9.0)
    assert tracker.observe({}, now=1.0) == []


def test_scan_finds_nested_files_and_skips_symlinks_and_ignored(tmp_path: Path) -> None:
    """The scan recurses, never follows symlinks (no loops), and skips asyncsoak's own files."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.txt").write_text("x")
    (tmp_path / "top.txt").write_text("y")
    (tmp_path / "own.jsonl").write_text("journal")
    (tmp_path / "loop").symlink_to(tmp_path)
    (tmp_path / "link.txt").symlink_to(tmp_path / "top.txt")
    os.mkfifo(tmp_path / "fifo")
    own = (tmp_path / "own.jsonl").stat()
    result = scan_progress_dir(tmp_path, ignore={(own.st_dev, own.st_ino)})
    assert sorted(result.files) == ["a/b/deep.txt", "top.txt"]


def test_scan_of_a_missing_dir_is_empty(tmp_path: Path) -> None:
    """A progress dir the trainer has not created yet is allowed."""
    assert scan_progress_dir(tmp_path / "not-yet").files == {}


def test_scan_watches_extra_files_by_path(tmp_path: Path) -> None:
    """Files outside the progress dir (the log, when output is progress) are watched by path."""
    log = tmp_path / "soak.log"
    log.write_text("line\n")
    result = scan_progress_dir(tmp_path / "progress", also=[log])
    assert list(result.files) == [str(log)]


def test_scanner_survives_loops_deep_trees_and_vanishing_files(tmp_path: Path) -> None:
    """Symlink loops, a 200-deep tree and files deleted mid-scan never break a scan."""
    deep = tmp_path
    for i in range(200):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    churn = tmp_path / "churn"
    churn.mkdir()
    stop = threading.Event()

    def create_and_delete() -> None:
        i = 0
        while not stop.is_set():
            path = churn / f"f{i % 500}"
            path.write_text("x")
            path.unlink()
            i += 1

    worker = threading.Thread(target=create_and_delete)
    worker.start()
    try:
        for _ in range(20):
            files = scan_progress_dir(tmp_path).files
            assert any(name.endswith("bottom.txt") for name in files)
    finally:
        stop.set()
        worker.join()
