"""Progress scan: the cost of one watchdog scan of a directory of 100,000 files, and how it
grows with the file count.

    python -m benchmarks --only progress_scan      (or: python -m benchmarks.progress_scan)

The directory is a tree ``a0..a9/b0..b9/f0..f999`` (100,000 files; ``a0`` holds 10,000 and
``a0/b0`` 1,000), so the three sizes are scanned in the same filesystem, with a warm dentry
and inode cache as in a running soak.  For each size, median over several runs, in this one
process:

- scan: ``scan_progress_dir`` (what the watchdog runs in a worker thread at each scan);
- scan + compare: the scan and ``ProgressTracker.observe`` against the previous scan, the
  watchdog's whole work for one scan;
- floor: the same walk with nothing kept (``os.scandir`` and one ``lstat`` per entry, which
  the scan needs for size, mtime, device and inode);
- find: ``find DIR -type f -printf '%s %T@ %D %i\\n'`` (the same facts), its CPU from
  ``wait4``, as an outside reference.

Growth is the cost per file at each size (flat means linear).  No target: the figure says
what a progress directory of that size costs the monitor at a given sample interval.

Then the watchdog itself (``run_watchdog``, inotify on) over the 100,000 files at 0.5 s for a
window after its first watches are in place, the process's CPU over the window: with the
full scans spaced out for a huge tree (``SCAN_CPU_SHARE``, what runs now), and with a full
scan at every interval (``SCAN_CPU_SHARE`` set to infinity: the cadence before).
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks._common import Figure, Section, median

SIZES = (1_000, 10_000, 100_000)


def build_tree(root: Path) -> dict[int, Path]:
    """100,000 empty files; the directory holding each size."""
    for a in range(10):
        for b in range(10):
            directory = root / f"a{a}" / f"b{b}"
            directory.mkdir(parents=True)
            for f in range(1000):
                os.close(os.open(directory / f"f{f}", os.O_WRONLY | os.O_CREAT, 0o600))
    return {1_000: root / "a0" / "b0", 10_000: root / "a0", 100_000: root}


def floor_walk(root: Path) -> int:
    count = 0
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    entry.stat(follow_symlinks=False)
                    count += 1
    return count


def cpu_of(function: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.process_time()
        function()
        samples.append(time.process_time() - started)
    return median(samples)


def find_cpu(root: Path, runs: int) -> float:
    samples = []
    for _ in range(runs):
        child = subprocess.Popen(
            ["find", str(root), "-type", "f", "-printf", "%s %T@ %D %i\n"],
            stdout=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise RuntimeError(f"find exited with {child.returncode}")
        samples.append(usage.ru_utime + usage.ru_stime)
    return median(samples)


#: Seconds the watchdog runs before its window: its first watches and their look at every file.
WATCHDOG_WARM_UP_SECONDS = 3.0


def watchdog_share(root: Path, seconds: float, *, spaced: bool) -> float:
    """The share of a core the watchdog takes over ``root`` at 0.5 s, after its warm-up."""
    import anyio

    from asyncsoak._contract._sink import SoakClock, open_event_queue
    from asyncsoak._sampling import _watchdog
    from asyncsoak._sampling._progress_rules import ProgressTracker
    from asyncsoak._sampling._progress_scan import scan_progress_dir

    async def measure() -> float:
        sink, receive = open_event_queue(SoakClock())
        tracker = ProgressTracker(
            scan_progress_dir(root).files, startup_timeout=3600.0, stale_after=3600.0
        )

        async def drain() -> None:
            async with receive:
                async for event in receive:
                    if event.KIND == "rule_broken":
                        raise RuntimeError(f"no rule should fire here: {event}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            tg.start_soon(
                partial(
                    _watchdog.run_watchdog,
                    sink,
                    progress_dir=root,
                    tracker=tracker,
                    ignore=lambda: (),
                    scan_interval=0.5,
                    limiter=anyio.CapacityLimiter(4),
                )
            )
            await anyio.sleep(WATCHDOG_WARM_UP_SECONDS)
            cpu = time.process_time()
            await anyio.sleep(seconds)
            used = time.process_time() - cpu
            tg.cancel_scope.cancel()
        return used / seconds

    saved = _watchdog.SCAN_CPU_SHARE
    if not spaced:
        _watchdog.SCAN_CPU_SHARE = math.inf  # every full scan one interval after the last
    try:
        return anyio.run(measure)
    finally:
        _watchdog.SCAN_CPU_SHARE = saved


def run(quick: bool = False) -> Section:
    from asyncsoak._sampling._progress_rules import ProgressTracker
    from asyncsoak._sampling._progress_scan import scan_progress_dir

    section = Section("progress_scan", "9. Progress scan")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        build_started = time.monotonic()
        directories = build_tree(Path(tmp))
        built_in = time.monotonic() - build_started
        per_file: dict[int, float] = {}
        for size in SIZES:
            directory = directories[size]
            runs = 3 if quick else (5 if size == 100_000 else 11)
            found = len(scan_progress_dir(directory).files)
            if found != size:
                raise RuntimeError(f"scanned {found} files, built {size}")
            tracker = ProgressTracker(
                scan_progress_dir(directory).files, startup_timeout=60.0, stale_after=60.0
            )

            def scan_and_compare(
                directory: Path = directory, tracker: ProgressTracker = tracker
            ) -> None:
                tracker.observe(scan_progress_dir(directory).files, 1.0)

            scan = cpu_of(partial(scan_progress_dir, directory), runs)
            whole = cpu_of(scan_and_compare, runs)
            floor = cpu_of(partial(floor_walk, directory), runs)
            find = find_cpu(directory, runs)
            per_file[size] = whole / size
            section.add(
                Figure(
                    f"{size:,} files: scan + compare, CPU",
                    whole * 1e3,
                    "ms",
                    reference=f"floor {floor * 1e3:.1f} ms",
                    ratio=whole / floor,
                )
            )
            section.add(
                Figure(
                    f"{size:,} files: scan alone, CPU",
                    scan * 1e3,
                    "ms",
                    reference=f"find {find * 1e3:.1f} ms",
                    ratio=scan / find,
                )
            )
            section.add(
                Figure(f"{size:,} files: scan + compare, per file", whole / size * 1e6, "us")
            )
        smallest, largest = per_file[SIZES[0]], per_file[SIZES[-1]]
        section.add(
            Figure(
                "growth: cost per file at 100,000 / at 1,000",
                largest / smallest,
                "x",
                reference="1.0 = linear",
                ratio=largest / smallest,
            )
        )
        whole_100k = per_file[100_000] * 100_000
        for interval in (5.0, 1.0):
            section.add(
                Figure(
                    f"100,000 files scanned every {interval:g} s: share of one core",
                    100 * whole_100k / interval,
                    "%",
                )
            )
        window = 3.0 if quick else 12.0
        every_interval = watchdog_share(directories[100_000], window, spaced=False)
        spaced = watchdog_share(directories[100_000], window, spaced=True)
        section.add(
            Figure(
                "watchdog over 100,000 files at 0.5 s, full scan every interval (before)",
                100 * every_interval,
                "% of a core",
            )
        )
        section.add(
            Figure(
                "watchdog over 100,000 files at 0.5 s, full scans spaced out (inotify between)",
                100 * spaced,
                "% of a core",
                reference=f"every interval {100 * every_interval:.1f} %",
                ratio=spaced / every_interval,
            )
        )
    section.note(
        f"tree of 100 directories of 1,000 empty files, built in {built_in:.1f} s; "
        "CPU medians (5 to 11 runs per size); the watchdog's share over one "
        f"{3.0 if quick else 12.0:g} s window each, after {WATCHDOG_WARM_UP_SECONDS:g} s"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
