"""CPU cost of one proc sample, against the floor and against psrecord, for growing trees.

    python -m benchmarks.proc_sampling [--sizes 10 100 1000]
    python -m benchmarks --only proc_sampling      (the runner's figures and ratios)

For trees of 10, 100 and 1000 sleeping processes it measures the CPU time (user + system)
of one sample, median over several runs in this one process:

- floor: reading, without parsing, the very files the sampler reads for the same pids
  (children files, stat, io, the fd directory, the machine files, statvfs), with the same
  raw ``os.open``/``os.read`` calls, in a tight loop;
- sampler: ``ProcSampler.read`` in a tight loop (the tree walked afresh every time);
- runner: ``run_proc_sampler`` end to end (worker thread, event queue), samples as fast as
  it can;
- psrecord: ``psrecord ROOT --include-children`` as a subprocess, its CPU from ``wait4``;
  per sample = (CPU of a long run - CPU of a short run) / (their difference in samples), so
  interpreter start-up cancels out.  psrecord reads less (CPU and memory, through psutil,
  plus a scan of every process on the machine to find the children).

Columns: CPU per sample (us) of each, the ratios, and per process: the floor, the sampler,
parse (sampler - floor: what the sampler adds to the reads themselves) and psrecord.

Targets: sampler <= 2x floor, sampler <= 1/3 of psrecord, cost per process flat with size.
Never imported by the tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from asyncsoak._contract._sink import SoakClock, open_event_queue
from asyncsoak._sampling._proc_sample import ProcSample
from asyncsoak._sampling._proc_sampler import ProcSampler
from asyncsoak._sampling._proc_task import run_proc_sampler
from asyncsoak._sampling._procfs import PROC, read_proc_file
from benchmarks._common import Figure, Section

# Forks n children that sleep in read(0): EOF on stdin ends all of them, PDEATHSIG backs it up.
TREE_BUILDER = r"""
import ctypes, gc, os, signal, sys
n = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
gc.freeze()
r, w = os.pipe()
for _ in range(n):
    if os.fork() == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.close(r)
        os.write(w, b".")
        os.read(0, 1)
        os._exit(0)
os.close(w)
got = 0
while got < n:
    got += len(os.read(r, 65536))
print("ready", flush=True)
os.read(0, 1)
for _ in range(n):
    os.wait()
"""


@contextmanager
def sleeping_tree(size: int) -> Iterator[int]:
    """A root process with ``size`` sleeping children; yields the root's pid."""
    root = subprocess.Popen(
        [sys.executable, "-c", TREE_BUILDER, str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert root.stdout is not None
        line = root.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"tree builder failed: {line!r}")
        yield root.pid
    finally:
        assert root.stdin is not None
        root.stdin.close()
        try:
            root.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(root.pid, signal.SIGKILL)
            root.wait(timeout=10)
        if root.stdout is not None:
            root.stdout.close()


def floor_reader(sampler: ProcSampler, sample: ProcSample) -> Callable[[], None]:
    """A function that reads, unparsed, the files ``sampler.read`` reads for ``sample``,
    the same way (``one_piece`` files in one read, ``children`` files until EOF)."""
    if not sampler.has_children_files:
        raise SystemExit("this floor follows children files; this kernel has none")
    proc = str(PROC)
    root_task = f"{proc}/{sample.root_pid}/task"
    listings = [root_task]
    pieces: list[str] = []  # read with one_piece=True
    records = [f"{root_task}/{tid}/children" for tid in os.listdir(root_task)]
    fd_dirs: list[str] = []
    for p in sample.processes:
        pieces += [f"{proc}/{p.pid}/stat", f"{proc}/{p.pid}/io"]
        fd_dirs.append(f"{proc}/{p.pid}/fd")
        if p.threads == 1:
            records.append(f"{proc}/{p.pid}/task/{p.pid}/children")
        else:
            listings.append(f"{proc}/{p.pid}/task")
            tids = os.listdir(f"{proc}/{p.pid}/task")
            records += [f"{proc}/{p.pid}/task/{t}/children" for t in tids]
    pieces += [f"{proc}/stat", f"{proc}/meminfo", f"{proc}/loadavg"]
    disks = [str(path) for path in sampler.disk_paths.values()]
    count_by_size = sampler.counts_fds_by_size

    def read_all() -> None:
        for path in listings:
            os.listdir(path)
        for path in records:
            read_proc_file(path)
        for path in pieces:
            read_proc_file(path, one_piece=True)
        for path in fd_dirs:
            if count_by_size:
                os.stat(path)
            else:
                os.listdir(path)
        for path in disks:
            os.statvfs(path)

    return read_all


def cpu_per_call(function: Callable[[], object], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        function()
    return (time.process_time() - started) / calls


def runner_cpu_per_sample(root_pid: int, disk_paths: dict[str, Path], samples: int) -> float:
    """CPU of this process per sample taken through ``run_proc_sampler``."""

    async def main() -> float:
        sink, receive = open_event_queue(SoakClock())
        seen = 0
        started = 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_proc_sampler(
                    sink,
                    root_pid=root_pid,
                    interval=1e-4,
                    disk_paths=disk_paths,
                )
            )
            async with receive:
                async for event in receive:
                    if not isinstance(event, ProcSample):
                        continue
                    seen += 1
                    if seen == 2:  # past the first sample, which reads every cmdline
                        started = time.process_time()
                    elif seen == samples + 2:
                        tg.cancel_scope.cancel()
                        break
        return (time.process_time() - started) / samples

    return anyio.run(main)


def psrecord_run(root_pid: int, duration: float, interval: float) -> tuple[float, int]:
    """(CPU seconds, samples) of one psrecord run over the tree."""
    psrecord = shutil.which("psrecord", path=str(Path(sys.executable).parent))
    if psrecord is None:
        raise SystemExit("psrecord is missing: pip install psrecord")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "psrecord.csv"
        child = subprocess.Popen(
            [
                psrecord,
                str(root_pid),
                "--include-children",
                "--interval",
                str(interval),
                "--duration",
                str(duration),
                "--log",
                str(log),
                "--log-format",
                "csv",
            ],
            stdout=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise RuntimeError(f"psrecord exited with {child.returncode}")
        samples = len(log.read_text().splitlines()) - 1
    return usage.ru_utime + usage.ru_stime, samples


def psrecord_cpu_per_sample(root_pid: int, size: int, runs: int) -> float:
    interval = 0.01
    short, long = (1.0, 3.0) if size < 1000 else (2.0, 6.0)
    per_sample: list[float] = []
    for _ in range(runs):
        cpu_short, n_short = psrecord_run(root_pid, short, interval)
        cpu_long, n_long = psrecord_run(root_pid, long, interval)
        per_sample.append((cpu_long - cpu_short) / (n_long - n_short))
    return statistics.median(per_sample)


def measure(size: int, runs: int, psrecord_runs: int) -> dict[str, float]:
    with sleeping_tree(size) as root_pid:
        with tempfile.TemporaryDirectory() as tmp:
            disk_paths = {"progress": Path(tmp) / "progress", "output": Path(tmp)}
            disk_paths["progress"].mkdir()
            sampler = ProcSampler(root_pid, disk_paths=disk_paths)
            first = sampler.read(0.0)
            assert first is not None
            if first.tree.processes != size:
                raise RuntimeError(f"sampled {first.tree.processes} processes, built {size}")
            floor = floor_reader(sampler, first)
            calls = max(5, 2000 // size)
            floors: list[float] = []
            samplers: list[float] = []
            for _ in range(runs):
                floors.append(cpu_per_call(floor, calls))
                samplers.append(cpu_per_call(lambda: sampler.read(0.0), calls))
            runner = statistics.median(
                runner_cpu_per_sample(root_pid, disk_paths, calls) for _ in range(3)
            )
        psrecord = psrecord_cpu_per_sample(root_pid, size, psrecord_runs)
    return {
        "floor": statistics.median(floors),
        "sampler": statistics.median(samplers),
        "runner": runner,
        "psrecord": psrecord,
    }


TARGET_FLOOR_RATIO = 2.0
TARGET_PSRECORD_RATIO = 1 / 3
SIZES = (10, 100, 1000)


def run(quick: bool = False) -> Section:
    """Item 1 for the runner (``python -m benchmarks``): every size, figures and ratios."""
    section = Section("proc_sampling", "1. Process-tree sampling")
    started = time.monotonic()
    runs, psrecord_runs = (3, 1) if quick else (7, 3)
    results = {size: measure(size, runs, psrecord_runs) for size in SIZES}
    for size, r in results.items():
        section.add(
            Figure(
                f"tree of {size}: sampler CPU per sample",
                r["sampler"] * 1e6,
                "us",
                reference=f"floor {r['floor'] * 1e6:.0f} us",
                ratio=r["sampler"] / r["floor"],
                target="<= 2x floor",
                met=r["sampler"] <= TARGET_FLOOR_RATIO * r["floor"],
            )
        )
        section.add(
            Figure(
                f"tree of {size}: sampler against psrecord",
                r["sampler"] * 1e6,
                "us",
                reference=f"psrecord {r['psrecord'] * 1e6:.0f} us",
                ratio=r["sampler"] / r["psrecord"],
                target="<= 1/3 of psrecord",
                met=r["sampler"] <= TARGET_PSRECORD_RATIO * r["psrecord"],
            )
        )
        section.add(
            Figure(
                f"tree of {size}: end to end (worker thread, event queue)",
                r["runner"] * 1e6,
                "us",
                reference="sampler",
                ratio=r["runner"] / r["sampler"],
            )
        )
    small, middle, large = (results[size] for size in SIZES)
    for key, label in (("sampler", "sampler"), ("floor", "floor")):
        first = (middle[key] - small[key]) / (SIZES[1] - SIZES[0])
        second = (large[key] - middle[key]) / (SIZES[2] - SIZES[1])
        section.add(
            Figure(
                f"growth, {label}: cost per added process, 100-1000 against 10-100",
                second * 1e6,
                "us",
                reference=f"10-100: {first * 1e6:.1f} us",
                ratio=second / first,
            )
        )
    section.note(
        f"CPU per sample, medians of {runs} runs in this process (psrecord: {psrecord_runs} "
        "pairs of runs, start-up cancelled out); growth ratio 1.0 is linear"
    )
    section.note(
        "floor: the same /proc files read raw; psrecord reads less per process (CPU and "
        "memory through psutil) but scans every process of the machine to find the children"
    )
    section.seconds = time.monotonic() - started
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--psrecord-runs", type=int, default=3)
    args = parser.parse_args()

    machine_processes = sum(1 for name in os.listdir(PROC) if name.isdigit())
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, kernel {os.uname().release}")
    print(f"processes on the machine before the trees: {machine_processes}")
    print(f"median of {args.runs} runs (psrecord: {args.psrecord_runs}); CPU per sample in us\n")
    header = (
        f"{'tree':>5} {'floor':>9} {'sampler':>9} {'runner':>9} {'psrecord':>10} "
        f"{'smp/floor':>9} {'smp/psrec':>9} {'floor/proc':>10} {'smp/proc':>9} "
        f"{'parse/proc':>10} {'psrec/proc':>10}"
    )
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        r = measure(size, args.runs, args.psrecord_runs)
        us = {k: v * 1e6 for k, v in r.items()}
        print(
            f"{size:>5} {us['floor']:>9.0f} {us['sampler']:>9.0f} {us['runner']:>9.0f} "
            f"{us['psrecord']:>10.0f} {r['sampler'] / r['floor']:>9.2f} "
            f"{r['sampler'] / r['psrecord']:>9.3f} {us['floor'] / size:>10.1f} "
            f"{us['sampler'] / size:>9.1f} {(us['sampler'] - us['floor']) / size:>10.1f} "
            f"{us['psrecord'] / size:>10.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
