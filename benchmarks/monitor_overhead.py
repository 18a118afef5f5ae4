"""Whole-monitor overhead: the monitor's CPU during a soak of a 100-process tree at a 1 s
sample interval, over 60 s, as a share of one core.

    python -m benchmarks --only monitor_overhead      (or: python -m benchmarks.monitor_overhead)

The soak runs in a process of its own (``--child``), so its CPU is the monitor's alone: every
task of ``run_soak`` (proc sampler, GPU sampler, watchdog on inotify plus a scan every
interval, serializer writing the journal) and their worker threads.  The reaper, a process of
its own, counts too.  The command forks 99 children that sleep and appends a line to a file
in the progress directory every second, as a healthy trainer does.  The GPU sampler runs on
``nvidia-smi`` where there is one, else on the fake one that replays the H200 captures (a
process on the GPU, as under training); the nvidia-smi processes' own CPU is reported apart
(item 6 says what the real one costs).

After a warm-up, the child reads its own CPU clock (``CLOCK_PROCESS_CPUTIME_ID``: every
thread, nanoseconds), its threads' wake-ups (voluntary context switches) and the reaper's CPU
(``schedstat``), waits the window, reads them again, then stops the soak.  Beside it, over
the same window and so under the same load, run in processes of their own:

- psrecord on the same tree at the same interval (``--include-children --interval 1``);
- a floor that wakes every second and reads the tree's /proc files raw (item 1's floor);
- a floor that wakes every second and does nothing: the price of one wake-up here.

Target: under 1% of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import (
    REPO,
    Figure,
    Section,
    parent_pid,
    python_child,
    thread_cpu_seconds,
)

TREE_SIZE = 100
INTERVAL = 1.0
TARGET_SHARE = 0.01
#: The fewest wake-ups a second any monitor doing this job needs: one for each thing that
#: happens on a clock of its own (the sample timer, nvidia-smi's loop line, the trainer's
#: write), if everything else (reads, the journal, the scan) rode on them.
MIN_WAKEUPS = 3

#: The trainer: 99 sleeping children, a line of progress every second.
TRAINER = r"""
import os, signal, sys, time
progress, size = sys.argv[1], int(sys.argv[2])
for _ in range(size - 1):
    if os.fork() == 0:
        while True:
            signal.pause()
step = 0
while True:
    with open(progress, "a") as f:
        f.write('{"step": %d}\n' % step)
    step += 1
    time.sleep(1.0)
"""


def nvidia_smi_pids(monitor_pid: int) -> list[int]:
    """Children of the monitor that are nvidia-smi loops (not the reaper)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        if ppid == monitor_pid and b"nvidia" in cmdline:
            out.append(int(name))
    return out


def wakeups() -> int:
    """Times this process's threads went to sleep and were woken (voluntary switches)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue  # a worker thread that just ended
    return total


async def floor_loop(root_pid: int, reads: bool) -> None:
    """An anyio program that wakes every interval and, with ``reads``, reads the tree's /proc
    files raw (the floor of item 1): what sampling at this interval costs at the least."""
    import anyio

    from asyncsoak._proc_sampler import ProcSampler
    from benchmarks.proc_sampling import floor_reader

    read_all = None
    if reads:
        sampler = ProcSampler(root_pid)
        sample = sampler.read(0.0)
        assert sample is not None
        read_all = floor_reader(sampler, sample)
    tick = anyio.current_time()
    while True:
        if read_all is not None:
            read_all()
        tick += INTERVAL
        await anyio.sleep_until(tick)


def psrecord_command(pid: int) -> list[str]:
    psrecord = shutil.which("psrecord", path=str(Path(sys.executable).parent))
    if psrecord is None:
        raise RuntimeError("psrecord is missing: pip install psrecord")
    return [psrecord, str(pid), "--include-children", "--interval", str(INTERVAL)]


async def soak_and_measure(
    work: Path, warmup: float, window: float, nvidia_smi: str | None
) -> dict[str, Any]:
    """Run the soak; over the window, measure it and, beside it on the same tree, psrecord
    and the two floors (all under the same load)."""
    import anyio
    from anyio.abc import Process

    from asyncsoak import SoakControl, run_soak
    from asyncsoak._tree import descendants

    progress = work / "progress"
    progress.mkdir()
    control = SoakControl()
    measured: dict[str, Any] = {}

    async def measure() -> None:
        with anyio.fail_after(60):
            await control.started.wait()
        assert control.pid is not None
        reaper = parent_pid(control.pid)
        for _ in range(600):  # the trainer forks its children: wait for the whole tree
            if len(descendants(reaper)) >= TREE_SIZE:
                break
            await anyio.sleep(0.05)
        me = [sys.executable, "-m", "benchmarks.monitor_overhead", "--root", str(reaper)]
        peers: dict[str, Process] = {
            "psrecord": await anyio.open_process(
                psrecord_command(control.pid), stdout=subprocess.DEVNULL
            ),
            "floor_reads": await anyio.open_process([*me, "--floor", "reads"], cwd=REPO),
            "floor_idle": await anyio.open_process([*me, "--floor", "idle"], cwd=REPO),
        }
        try:
            await anyio.sleep(warmup)
            smi = nvidia_smi_pids(os.getpid())
            wall0 = time.monotonic()
            cpu0 = time.process_time()
            wakeups0 = wakeups()
            reaper0 = thread_cpu_seconds(reaper)
            smi0 = sum(thread_cpu_seconds(p) for p in smi)
            peers0 = {name: thread_cpu_seconds(p.pid) for name, p in peers.items()}
            await anyio.sleep(window)
            wall = time.monotonic() - wall0
            measured.update(
                wall=wall,
                monitor_cpu=time.process_time() - cpu0,
                monitor_wakeups=wakeups() - wakeups0,
                reaper_cpu=thread_cpu_seconds(reaper) - reaper0,
                nvidia_smi_cpu=sum(thread_cpu_seconds(p) for p in smi) - smi0,
                nvidia_smi_processes=len(smi),
                peers={name: thread_cpu_seconds(p.pid) - peers0[name] for name, p in peers.items()},
            )
        finally:
            for process in peers.values():
                process.terminate()
                with anyio.move_on_after(10, shield=True):
                    await process.wait()
        control.request_stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(measure)
        artifact = await run_soak(
            command=python_child(TRAINER, str(progress / "metrics.jsonl"), str(TREE_SIZE)),
            progress_dir=progress,
            output_path=work / "soak.json",
            sample_interval_seconds=INTERVAL,
            startup_timeout_seconds=60.0,
            stale_progress_seconds=60.0,
            post_shutdown_grace_seconds=5.0,
            nvidia_smi=nvidia_smi,
            control=control,
        )
    summary = artifact["summary"]
    measured.update(
        status=artifact["status"],
        samples=artifact["monitor"]["samples"],
        dropped=artifact["monitor"]["dropped_samples"],
        tree_processes=summary.get("tree", {}).get("processes", {}).get("max"),
        gpu_groups=sorted(g for g in summary if g.startswith("gpu")),
    )
    return measured


def child_main(args: argparse.Namespace) -> None:
    import anyio

    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        result = anyio.run(soak_and_measure, Path(tmp), args.warmup, args.window, args.nvidia_smi)
    print(json.dumps(result))


@dataclass
class Running:
    """The measurement running in its own process."""

    child: subprocess.Popen[str]
    window: float
    fake_gpu: bool
    fake_dir: tempfile.TemporaryDirectory[str] | None

    def finish(self) -> Section:
        try:
            out, _ = self.child.communicate(timeout=self.window + 120)
        finally:
            if self.fake_dir is not None:
                self.fake_dir.cleanup()
        if self.child.returncode != 0:
            raise RuntimeError(f"the monitor process exited with {self.child.returncode}")
        return section_from(json.loads(out.strip().splitlines()[-1]), self.fake_gpu)


def start(quick: bool = False) -> Running:
    """Start the soak in its own process; ``finish()`` waits for it and gives the figures.

    The GPU sampler runs on ``nvidia-smi`` when there is one, else on the fake one.
    """
    window = 10.0 if quick else 60.0
    command = [
        sys.executable,
        "-m",
        "benchmarks.monitor_overhead",
        "--child",
        "--window",
        str(window),
        "--warmup",
        "3" if quick else "5",
    ]
    fake_dir = None
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        from tests.gpu_support import install_fake_nvidia_smi

        fake_dir = tempfile.TemporaryDirectory(prefix="asyncsoak-bench-")
        nvidia_smi = str(install_fake_nvidia_smi(Path(fake_dir.name)).path)
    command += ["--nvidia-smi", nvidia_smi]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    return Running(child, window, fake_dir is not None, fake_dir)


def section_from(m: dict[str, Any], fake_gpu: bool) -> Section:
    section = Section("monitor_overhead", "2. Whole-monitor overhead")
    wall = float(m["wall"])
    total = (m["monitor_cpu"] + m["reaper_cpu"]) / wall
    peers = {name: cpu / wall for name, cpu in m["peers"].items()}
    section.add(
        Figure(
            "monitor + reaper CPU, share of one core",
            100 * total,
            "%",
            reference="one core",
            ratio=total,
            target="< 1% of one core",
            met=total < TARGET_SHARE,
        )
    )
    section.add(
        Figure(
            "psrecord on the same tree at the same interval, share of one core",
            100 * peers["psrecord"],
            "%",
            reference="monitor + reaper / psrecord",
            ratio=total / peers["psrecord"],
        )
    )
    section.add(
        Figure(
            "floor: wake every second and read the tree's /proc files raw",
            100 * peers["floor_reads"],
            "%",
            reference="monitor + reaper / floor",
            ratio=total / peers["floor_reads"],
        )
    )
    section.add(Figure("floor: wake every second, nothing else", 100 * peers["floor_idle"], "%"))
    per_wakeup = peers["floor_idle"] * wall / (wall / INTERVAL)
    rate = m["monitor_wakeups"] / wall
    section.add(
        Figure(
            "monitor wake-ups per second (all threads)",
            rate,
            "/s",
            reference=f"one idle wake-up costs {per_wakeup * 1e3:.2f} ms here",
        )
    )
    section.add(
        Figure(
            "those wake-ups alone, at the idle cost, share of one core",
            100 * rate * per_wakeup,
            "%",
            reference="monitor + reaper",
            ratio=rate * per_wakeup / total,
        )
    )
    job_floor = MIN_WAKEUPS * per_wakeup / INTERVAL + peers["floor_reads"] - peers["floor_idle"]
    section.add(
        Figure(
            f"floor of the whole job: {MIN_WAKEUPS} wake-ups a second at the idle cost, "
            "plus the raw reads",
            100 * job_floor,
            "%",
            reference="monitor + reaper / this floor",
            ratio=total / job_floor,
        )
    )
    section.add(
        Figure("monitor process CPU, share of one core", 100 * m["monitor_cpu"] / wall, "%")
    )
    section.add(Figure("reaper CPU, share of one core", 100 * m["reaper_cpu"] / wall, "%"))
    if m["nvidia_smi_processes"]:
        section.add(
            Figure(
                "nvidia-smi loops' own CPU (fake nvidia-smi)"
                if fake_gpu
                else "nvidia-smi loops' own CPU",
                100 * m["nvidia_smi_cpu"] / wall,
                "% of one core",
            )
        )
    section.note(
        f"{wall:.0f} s window after a warm-up; tree of {m['tree_processes']} processes sampled "
        f"every {INTERVAL:g} s, a line of progress every second; samples in the whole soak: "
        f"{m['samples']}, dropped: {m['dropped']}; status {m['status']}"
    )
    section.note(
        "psrecord and the floors ran beside the soak over the same window, on the same tree, "
        "so they saw the same load; each is a process of its own, its CPU from /proc"
    )
    section.note(
        f"floor of the whole job: sampling every second, hearing nvidia-smi's lines and the "
        f"trainer's writes as they come takes at least {MIN_WAKEUPS} wake-ups a second (three "
        "clocks of their own), priced at the idle floor's wake-up, plus reading the tree's "
        "/proc files (the raw-read floor less the idle one)"
    )
    if m["gpu_groups"]:
        source = "the fake nvidia-smi replaying the H200 captures" if fake_gpu else "nvidia-smi"
        section.note(f"GPU sampler on ({source}): {', '.join(m['gpu_groups'])}")
    else:
        section.note("GPU sampler off (no nvidia-smi)")
    return section


def run(quick: bool = False) -> Section:
    return start(quick).finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--nvidia-smi", default=None)
    parser.add_argument("--floor", choices=("reads", "idle"), help=argparse.SUPPRESS)
    parser.add_argument("--root", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    if args.floor is not None:
        import anyio

        anyio.run(floor_loop, args.root, args.floor == "reads")
        return
    from benchmarks.run import print_sections

    print_sections([run(args.quick)])


if __name__ == "__main__":
    main()
