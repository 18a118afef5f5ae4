"""Whole-monitor overhead: the monitor's CPU during a soak of a 100-process tree at a 1 s
sample interval, over 60 s, as a share of one core.

    python -m benchmarks --only monitor_overhead      (or: python -m benchmarks.monitor_overhead)

The soak runs in a process of its own (``--child``), so its CPU is the monitor's alone: every
task of ``run_soak`` (proc sampler, GPU sampler, watchdog on inotify plus a scan every
interval, serializer writing the journal) and their worker threads.  The reaper, a process of
its own, counts too.  The command forks 99 children that sleep and appends a line to a file
in the progress directory every second, as a healthy trainer does.  After a warm-up, the
child reads its own CPU clock (``CLOCK_PROCESS_CPUTIME_ID``, every thread, nanoseconds) and
the reaper's (``schedstat``), waits the window, reads them again, then stops the soak.

Where a ``nvidia-smi`` is given (``--nvidia-smi``; the runner gives the fake one that replays
the H200 captures when there is no GPU), the GPU sampler runs too; the nvidia-smi processes'
own CPU is reported apart (see item 6 for what the real one costs).

Target: under 1% of one core.
"""

from __future__ import annotations

import argparse
import json
import os
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
    process_cpu_seconds,
    python_child,
    thread_cpu_seconds,
)

TREE_SIZE = 100
INTERVAL = 1.0
TARGET_SHARE = 0.01

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


async def soak_and_measure(
    work: Path, warmup: float, window: float, nvidia_smi: str | None
) -> dict[str, Any]:
    import anyio

    from asyncsoak import SoakControl, run_soak

    progress = work / "progress"
    progress.mkdir()
    control = SoakControl()
    measured: dict[str, Any] = {}

    async def measure() -> None:
        with anyio.fail_after(60):
            await control.started.wait()
        assert control.pid is not None
        reaper = parent_pid(control.pid)
        await anyio.sleep(warmup)
        smi = nvidia_smi_pids(os.getpid())
        wall0 = time.monotonic()
        cpu0 = time.process_time()
        reaper0 = thread_cpu_seconds(reaper)
        smi0 = sum(process_cpu_seconds(p) for p in smi)
        await anyio.sleep(window)
        wall = time.monotonic() - wall0
        measured.update(
            wall=wall,
            monitor_cpu=time.process_time() - cpu0,
            reaper_cpu=thread_cpu_seconds(reaper) - reaper0,
            nvidia_smi_cpu=sum(process_cpu_seconds(p) for p in smi) - smi0,
            nvidia_smi_processes=len(smi),
        )
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
    started: float

    def finish(self) -> Section:
        out, _ = self.child.communicate(timeout=self.window + 120)
        if self.child.returncode != 0:
            raise RuntimeError(f"the monitor process exited with {self.child.returncode}")
        return section_from(json.loads(out.strip().splitlines()[-1]), self.fake_gpu)


def start(quick: bool = False, nvidia_smi: str | None = None, fake_gpu: bool = False) -> Running:
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
    if nvidia_smi is not None:
        command += ["--nvidia-smi", nvidia_smi]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    return Running(child, window, fake_gpu, time.monotonic())


def section_from(m: dict[str, Any], fake_gpu: bool) -> Section:
    section = Section("monitor_overhead", "2. Whole-monitor overhead")
    wall = float(m["wall"])
    total = (m["monitor_cpu"] + m["reaper_cpu"]) / wall
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
        Figure("monitor process CPU, share of one core", 100 * m["monitor_cpu"] / wall, "%")
    )
    section.add(Figure("reaper CPU, share of one core", 100 * m["reaper_cpu"] / wall, "%"))
    samples = int(m["samples"].get("sample", 0))
    if samples:
        section.add(Figure("monitor CPU per second of soak", 1e3 * m["monitor_cpu"] / wall, "ms"))
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
        f"every {INTERVAL:g} s; samples in the whole soak: {m['samples']}, dropped: "
        f"{m['dropped']}; status {m['status']}"
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
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    from benchmarks.run import print_sections

    print_sections([run(args.quick)])


if __name__ == "__main__":
    main()
