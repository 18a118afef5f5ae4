"""The progress rules, driven by an injected clock, and the scanner over real files."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import SoakFailureError, run_soak
from asyncsoak._contract._sink import SoakClock
from asyncsoak._sampling import _inotify, _progress_scan, _watchdog
from asyncsoak._sampling._progress_rules import MTIME_LATENESS_SECONDS, ProgressTracker, changed_at
from asyncsoak._sampling._progress_scan import FileState, scan_progress_dir


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


def test_a_directory_deleted_as_it_is_scanned_is_no_unreadable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint directory the trainer rotates away (``save_total_limit``) between the
    listing of its parent and its own scan is gone, not unreadable: no skipped-directory
    warning for it."""
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "state.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("{}")
    real_scandir = os.scandir

    def rotating_scandir(path: Any) -> Any:
        if isinstance(path, str) and path.endswith("checkpoint-1"):
            shutil.rmtree(path)  # the trainer's rotation, just before this directory's turn
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", rotating_scandir)
    result = scan_progress_dir(tmp_path)
    assert list(result.files) == ["train.jsonl"]
    assert result.errors == 0


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


#: Waits, writes a new file into the progress dir now and then (noting when, on the
#: system-wide monotonic clock, in a file outside it), then stalls.
WRITES_A_FEW_NEW_FILES_THEN_STALLS = """
import json, pathlib, sys, time
progress, notes = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
written = {}
time.sleep(1.5)
for step in range(4):
    (progress / f"new-{step}").write_text("step")
    written[f"new-{step}"] = time.monotonic()
    notes.write_text(json.dumps(written))
    time.sleep(0.7)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_progress_dir_created_as_its_parent_is_being_watched_is_seen_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer creates the progress dir and writes in it just before the watch on its
    parent is in place (the parent's creation event never comes): the write is still seen
    when the watches are placed, not at the next scan 5 s later, so the stall after it is
    called at its deadline."""
    progress = tmp_path / "progress"
    real_watch = _inotify.Inotify.watch_for_creation

    def created_meanwhile(watcher: _inotify.Inotify, root: Path) -> None:
        root.mkdir()  # the trainer, between the monitor's look and its watch
        (root / "metrics.txt").write_text("step\n")
        real_watch(watcher, root)

    monkeypatch.setattr(_inotify.Inotify, "watch_for_creation", created_meanwhile)
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
            progress_dir=progress,
            output_path=tmp_path / "out" / "soak.json",
            sample_interval_seconds=5.0,
            startup_timeout_seconds=30.0,
            stale_progress_seconds=0.5,
            nvidia_smi=None,
            forensics=False,
        )
    assert info.value.reason == "stale_progress"
    events = info.value.artifact["events"]
    failure_t = next(e["t"] for e in events if e["kind"] == "failure")
    assert failure_t < 4.0  # at the stall's deadline, not after the first 5 s scan


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_huge_tree_is_scanned_whole_rarely_yet_progress_and_stalls_are_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progress dir of 20,000 files: full scans are spaced out (inotify watches the tree
    between them), yet each new file is seen before the next full scan, and the stall is
    called by a full scan of its own at its deadline, not at the next spaced-out one."""
    # Spaced out far enough to tell apart on any machine (a 20,000-file scan takes 10 ms or
    # more of CPU: full scans 5 s apart or more, against 0.5 s intervals).
    monkeypatch.setattr(_watchdog, "SCAN_CPU_SHARE", 0.002)
    scans: list[float] = []
    real_scan = _progress_scan.scan_progress_dir

    def counted_scan(*args: Any, **kwargs: Any) -> _progress_scan.ScanResult:
        scans.append(time.monotonic())
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(_progress_scan, "scan_progress_dir", counted_scan)
    progress = tmp_path / "progress"
    for a in range(20):
        directory = progress / f"a{a}"
        directory.mkdir(parents=True)
        for f in range(1000):
            os.close(os.open(directory / f"f{f}", os.O_WRONLY | os.O_CREAT, 0o600))
    notes = tmp_path / "written.json"
    command = [
        sys.executable,
        "-c",
        textwrap.dedent(WRITES_A_FEW_NEW_FILES_THEN_STALLS),
        str(progress),
        str(notes),
    ]
    with anyio.fail_after(90), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=command,
            progress_dir=progress,
            output_path=tmp_path / "out" / "soak.json",
            sample_interval_seconds=0.5,
            startup_timeout_seconds=20.0,
            stale_progress_seconds=3.0,
            nvidia_smi=None,
            forensics=False,
        )
    artifact = info.value.artifact
    assert info.value.reason == "stale_progress"
    assert "had not come back" not in artifact["failures"][0]["message"]
    assert artifact["stop"]["cause"] == "failure"  # before the trainer's own end

    start = artifact["monitor"]["monotonic_start"]
    progress_events = [e for e in artifact["events"] if e["kind"] == "progress"]
    written = json.loads(notes.read_text())
    for name, at in written.items():
        seen = next(start + e["t"] for e in progress_events if name in e["paths"])
        # Seen through inotify: no full scan started between the write and its sighting.
        assert not [scan for scan in scans if at < scan <= seen], (name, at, seen, scans)

    [failure] = [e for e in artifact["events"] if e["kind"] == "failure"]
    deadline = start + progress_events[-1]["t"] + 3.0
    # The stall was decided by a full scan started at its deadline.
    assert [scan for scan in scans if deadline <= scan <= start + failure["t"]]
    intervals = artifact["duration_seconds"] / 0.5
    assert len(scans) <= 4 < intervals / 3, (len(scans), intervals)
