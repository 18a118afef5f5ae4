"""GPU sampling on a machine with an NVIDIA GPU: what it costs, and what a soak records.

Runs with the Python packages already on such a machine plus asyncsoak (standard library,
anyio, psutil; torch or cupy only if installed, to hold GPU memory in the soak).

1. CPU per sample of the GPU sampler in loop mode (one ``-lms`` process per query, steady
   state: start-up excluded by a warm-up), over 60 s, against one spawn of both queries per
   sample.  CPU is by the scheduler's clock (each process's CPU-time clock: nanoseconds,
   every thread, ended threads included): the nvidia-smi processes' plus the monitor's own
   (parsing, building samples).
2. If ``asyncsoak.run_soak`` exists: a short soak of a process that allocates 8 GiB of GPU
   memory (torch or cupy), printing the GPU series and the per-process GPU memory matched
   to the tree (read through ``asyncsoak.read_journal`` where it exists).
3. GPU health (``--health-only`` for this part alone, a few seconds): the health fields the
   sampler asks through ``--query-gpu`` (remapped rows, retired pages, PCIe link, ECC) and
   ``--query-remapped-rows``, each read with the sampler's own parsers and compared with the
   fixtures' format (``tests/fixtures/nvidia-smi/faults/``); fields this driver rejects, the
   two queries' agreement, and whether the kernel log can be followed for Xid errors.
   ``--save DIR`` writes the raw outputs there, to become fixtures.

    python benchmarks/gpu_check.py [--duration 60] [--period 1.0] [--nvidia-smi PATH]
    python benchmarks/gpu_check.py --health-only [--save DIR]

The whole run stays under three minutes with the defaults.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil

from asyncsoak._contract._sink import SoakClock, open_event_queue
from asyncsoak._process._commands import run_command
from asyncsoak._process._forensics import KernelLogFollower
from asyncsoak._sampling._gpu_sample import GpuSample
from asyncsoak._sampling._gpu_sampler import run_gpu_sampler
from asyncsoak._sampling._nvidia_smi import (
    APP_FIELDS,
    APPS_QUERY,
    GPU_QUERY,
    GPU_SAMPLE_FIELDS,
    HEALTH_FIELDS,
    REMAPPED_ROWS_FIELDS,
    REMAPPED_ROWS_QUERY,
    data_lines,
    parse_gpu_line,
    parse_process_line,
    parse_remapped_rows_line,
    query_args,
    rejected_field,
)

#: The target: loop mode costs at most this share of one spawn per sample.
TARGET_RATIO = 0.1


@dataclass
class Cost:
    mode: str
    samples: int
    seconds: float
    nvidia_smi_cpu_s: float
    monitor_cpu_s: float

    @property
    def per_sample_ms(self) -> float:
        return 1000 * (self.nvidia_smi_cpu_s + self.monitor_cpu_s) / max(1, self.samples)

    def line(self) -> str:
        n = max(1, self.samples)
        return (
            f"{self.mode:>6}: {self.samples} samples in {self.seconds:.1f} s: "
            f"nvidia-smi {1000 * self.nvidia_smi_cpu_s / n:.3f} ms + "
            f"monitor {1000 * self.monitor_cpu_s / n:.3f} ms = "
            f"{self.per_sample_ms:.3f} ms of CPU per sample"
        )


def task_cpu_seconds(pid: int) -> float:
    """CPU time of a whole process by the scheduler's clock: its CPU-time clock (nanoseconds,
    every thread, ended threads included), else the sum of its threads' schedstat, else ticks.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the process
    except OSError:
        pass
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e9
        return total
    except (OSError, ValueError, IndexError):
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)


def loop_pids() -> list[int]:
    """This process's nvidia-smi loop children."""
    return [child.pid for child in psutil.Process().children() if "-lms" in (child.cmdline() or [])]


async def measure_loop(
    nvidia_smi: str, period: float, duration: float, warmup: float = 2.0
) -> Cost:
    """Run the sampler in loop mode; CPU per sample over ``duration`` after a warm-up."""
    sink, receive = open_event_queue(SoakClock())
    samples = 0
    counting = False
    cpu_loops = cpu_self = 0.0
    pids: list[int] = []
    started = 0.0
    with receive:
        async with anyio.create_task_group() as tg:

            async def sampler() -> None:
                async with sink:
                    await run_gpu_sampler(
                        sink,
                        interval=period,
                        tree_pids=lambda: (),
                        nvidia_smi=nvidia_smi,
                    )

            tg.start_soon(sampler)
            warm_until = None
            async for event in receive:
                if not isinstance(event, GpuSample) or event.source != "loop":
                    continue
                now = time.monotonic()
                if warm_until is None:
                    warm_until = now + warmup
                elif not counting and now >= warm_until:
                    pids = loop_pids()
                    cpu_loops = -sum(task_cpu_seconds(p) for p in pids)
                    cpu_self = -time.process_time()
                    started = now
                    counting = True
                elif counting:
                    samples += 1
                    if now - started >= duration:
                        cpu_loops += sum(task_cpu_seconds(p) for p in pids)
                        cpu_self += time.process_time()
                        tg.cancel_scope.cancel()
                        break
    return Cost("loop", samples, time.monotonic() - started, cpu_loops, cpu_self)


async def measure_spawn(nvidia_smi: str, samples: int) -> tuple[Cost, float]:
    """One spawn of each query per sample, parsed as the sampler does; and wall time per sample."""
    executable = shutil.which(nvidia_smi) or nvidia_smi
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_before = time.process_time()
    started = time.monotonic()
    walls = []
    for _ in range(samples):
        t0 = time.monotonic()
        gpu = await run_command(
            [executable, *query_args(GPU_QUERY, GPU_SAMPLE_FIELDS)], time_limit=10.0
        )
        apps = await run_command([executable, *query_args(APPS_QUERY, APP_FIELDS)], time_limit=10.0)
        for line in data_lines(gpu.output, GPU_SAMPLE_FIELDS):
            parse_gpu_line(line, GPU_SAMPLE_FIELDS)
        for line in data_lines(apps.output, APP_FIELDS):
            parse_process_line(line, APP_FIELDS)
        walls.append(time.monotonic() - t0)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (children_after.ru_utime - children_before.ru_utime) + (
        children_after.ru_stime - children_before.ru_stime
    )
    cost = Cost(
        "spawn",
        samples,
        time.monotonic() - started,
        children,
        time.process_time() - self_before,
    )
    return cost, statistics.median(walls)


async def compare(nvidia_smi: str, period: float, duration: float, spawns: int) -> float:
    """Print both costs and their ratio (loop / spawn); returns the ratio."""
    spawn, wall = await measure_spawn(nvidia_smi, spawns)
    loop = await measure_loop(nvidia_smi, period, duration)
    print(f"period {period:g} s, loop window {duration:g} s after a 2 s warm-up")
    print(loop.line())
    print(spawn.line() + f" (median wall {1000 * wall:.1f} ms per sample)")
    ratio = loop.per_sample_ms / spawn.per_sample_ms if spawn.per_sample_ms else float("nan")
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f" ratio: loop / spawn = {ratio:.4f} ({verdict} the target of {TARGET_RATIO:g})")
    return ratio


# -- a short soak of a process holding GPU memory ---------------------------------------------

ALLOCATOR = """\
import pathlib, sys, time
HELD_BYTES = 8 * 1024**3
progress = pathlib.Path(sys.argv[1])
seconds = float(sys.argv[2])
held = None
try:
    import torch
    held = torch.empty(HELD_BYTES, dtype=torch.uint8, device="cuda")
    print("holding 8 GiB through torch", flush=True)
except ImportError:
    try:
        import cupy
        held = cupy.empty(HELD_BYTES, dtype=cupy.uint8)
        print("holding 8 GiB through cupy", flush=True)
    except ImportError:
        print("no allocator (neither torch nor cupy): no GPU memory held", flush=True)
end = time.monotonic() + seconds
step = 0
while time.monotonic() < end:
    with open(progress / "metrics.jsonl", "a") as f:
        f.write(f'{{"step": {step}}}\\n')
    step += 1
    time.sleep(0.5)
"""


def allocator() -> str | None:
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


async def soak_check(nvidia_smi: str, seconds: float) -> None:
    import asyncsoak

    run_soak = getattr(asyncsoak, "run_soak", None)
    if run_soak is None:
        print("asyncsoak.run_soak is not available here: soak check skipped")
        return
    found = allocator()
    print(f"\nsoak: {seconds:g} s of a process holding GPU memory ({found or 'no allocator'})")
    with tempfile.TemporaryDirectory(prefix="asyncsoak-gpu-check-") as tmp:
        work = Path(tmp)
        progress = work / "progress"
        progress.mkdir()
        output = work / "soak.json"
        artifact: dict[str, Any] = await run_soak(
            command=[sys.executable, "-c", ALLOCATOR, str(progress), str(seconds)],
            progress_dir=progress,
            output_path=output,
            sample_interval_seconds=1.0,
            startup_timeout_seconds=120.0,
            stale_progress_seconds=60.0,
            post_shutdown_grace_seconds=5.0,
            nvidia_smi=nvidia_smi,
        )
        print(f"status: {artifact['status']}; log: {artifact['log']['tail'].strip()[:200]}")
        series = artifact.get("series", {})
        for group in sorted(g for g in series if g.startswith("gpu")):
            fields = series[group]
            print(f"series {group}:")
            for name in sorted(fields):
                values = [v for v in fields[name] if v is not None]
                if name != "t" and values:
                    print(f"  {name:28} last {values[-1]:>10}  max {max(values):>10}")
        notes = [
            e for e in artifact.get("events", []) if str(e.get("kind", "")).startswith("sampler")
        ]
        for note in notes:
            print(f"event {note['kind']}: {note.get('message')}")
        journal = output.with_suffix(".jsonl")
        read_journal = getattr(asyncsoak, "read_journal", None)
        if read_journal is not None:
            events = list(read_journal(journal))  # compact lines and segments decoded
        else:
            events = [json.loads(text) for text in journal.read_text().splitlines() if text]
        gpu_samples = [e for e in events if e.get("kind") == "gpu_sample"]
        print(f"journal: {len(gpu_samples)} GPU samples")
        if not gpu_samples:
            print("  none: this run_soak does not sample GPUs (or nvidia-smi gave nothing)")
        if gpu_samples:
            peak = max(
                gpu_samples,
                key=lambda s: sum(p["used_gpu_memory_mib"] or 0 for p in s["processes"] or []),
            )
            for proc in peak["processes"] or []:
                print(
                    f"  pid {proc['pid']} {proc['name']}: {proc['used_gpu_memory_mib']} MiB "
                    f"on gpu{proc['gpu_index']}, in the tree: {proc['in_tree']}"
                )
            in_tree = [p for p in peak["processes"] or [] if p.get("in_tree")]
            held = max((p["used_gpu_memory_mib"] or 0 for p in in_tree), default=0)
            print(
                f"per-process GPU memory of the allocating process (in the tree): {held} MiB "
                f"(8192 MiB allocated, plus the CUDA context): "
                f"{'matched' if held >= 8192 else 'NOT matched'}"
            )


#: The fixture the real ``--query-remapped-rows`` output is compared with.
REMAPPED_FIXTURE = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "nvidia-smi"
    / "faults"
    / "remapped_rows.txt"
)


async def health_check(nvidia_smi: str, save: Path | None) -> int:
    """The health fields and the remapped-rows query on the hardware, against the fixtures'
    format; returns the number of mismatches."""
    problems = 0
    fields = ["index", "pci.bus_id", *HEALTH_FIELDS, "ecc.errors.uncorrected.volatile.total"]
    print("\nGPU health fields (--query-gpu):")
    while True:
        result = await run_command([nvidia_smi, *query_args(GPU_QUERY, fields)], time_limit=10.0)
        rejected = rejected_field(result)
        if rejected is None or rejected not in fields:
            break
        print(f"  REJECTED by this nvidia-smi: {rejected} (the sampler drops it, with a note)")
        problems += 1
        fields.remove(rejected)
    if save is not None:
        (save / "health_query_gpu.txt").write_text(result.output)
    print(f"  exit {result.returncode}: {' '.join(query_args(GPU_QUERY, fields))}")
    by_bus: dict[str, Any] = {}
    for line in data_lines(result.output, fields):
        print(f"  raw: {line}")
        _, reading = parse_gpu_line(line, fields)
        by_bus[reading.bus_id or ""] = reading
        for field in HEALTH_FIELDS:
            if field not in fields:
                continue
            attr = field.replace(".", "_").replace("gpucurrent", "current")
            value = getattr(reading, attr, None)
            error = reading.errors.get(field)
            shown = f"{value!r}" if error is None else f"null ({error})"
            print(f"    gpu{reading.index} {field:28} {shown}")
            if error is not None and error.startswith("unparsable"):
                print("      MISMATCH: the sampler cannot read this value")
                problems += 1
    print("\nremapped rows (--query-remapped-rows):")
    args = [
        f"{REMAPPED_ROWS_QUERY}={','.join(REMAPPED_ROWS_FIELDS)}",
        "--format=csv,noheader,nounits",
    ]
    remapped = await run_command([nvidia_smi, *args], time_limit=10.0)
    if save is not None:
        (save / "remapped_rows.txt").write_text(remapped.output)
    print(f"  exit {remapped.returncode}: nvidia-smi {' '.join(args)}")
    fixture = [line for line in REMAPPED_FIXTURE.read_text().splitlines() if line.strip()]
    expected = parse_remapped_rows_line(fixture[0])
    for line in data_lines(remapped.output, REMAPPED_ROWS_FIELDS):
        print(f"  raw: {line}")
        try:
            row = parse_remapped_rows_line(line)
        except ValueError as exc:
            print(f"  MISMATCH with the fixture's format: {exc}")
            problems += 1
            continue
        shapes = {k: type(v).__name__ for k, v in row.items() if k != "errors"}
        if shapes != {k: type(v).__name__ for k, v in expected.items() if k != "errors"}:
            print(f"  MISMATCH with the fixture's value types: {shapes}")
            problems += 1
        sampled = by_bus.get(row.get("bus_id") or "")
        if sampled is not None:
            for name in ("remapped_rows_pending", "remapped_rows_failure"):
                if getattr(sampled, name) != row.get(name):
                    print(f"  the two queries disagree on {name}")
                    problems += 1
        print(f"  read: {row}")
    follower = KernelLogFollower.open()
    print(
        "\nkernel log: "
        + ("followed (Xid errors are watched)" if follower else "NOT readable here (no Xid watch)")
    )
    if follower is not None:
        follower.close()
    print(f"\nhealth check: {problems} mismatch(es) with the fixtures' format")
    return problems


def main(argv: Collection[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--duration", type=float, default=60.0, help="loop window, seconds")
    parser.add_argument("--period", type=float, default=1.0, help="sample period, seconds")
    parser.add_argument("--spawns", type=int, default=20, help="samples taken by spawning")
    parser.add_argument("--soak-seconds", type=float, default=15.0)
    parser.add_argument("--no-soak", action="store_true")
    parser.add_argument("--health-only", action="store_true", help="only the GPU health part")
    parser.add_argument("--save", type=Path, help="write the health queries' raw output here")
    args = parser.parse_args(None if argv is None else list(argv))
    if shutil.which(args.nvidia_smi) is None:
        print(f"{args.nvidia_smi!r} not found: this check needs a machine with an NVIDIA GPU")
        return 2
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
    mismatches = anyio.run(health_check, args.nvidia_smi, args.save)
    if args.health_only:
        return 1 if mismatches else 0
    anyio.run(partial(compare, args.nvidia_smi, args.period, args.duration, args.spawns))
    if not args.no_soak:
        anyio.run(soak_check, args.nvidia_smi, args.soak_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
