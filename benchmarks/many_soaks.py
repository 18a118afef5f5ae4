"""Many soaks in one process: sampling delay, CPU per soak and cancelling them all, at 1, 16, 64.

    python -m benchmarks --only many_soaks      (or: python -m benchmarks.many_soaks)

N soaks run in one event loop (``run_soak`` in one task group, as an orchestrator of a sweep
runs them), each over a light trainer (``sh`` appending a line to its progress file every
second), sampled every 0.5 s.  Once every soak has started and run a few seconds, for one
window:

- sampling delay: how late each sample's read started against its tick on the soak's grid
  (start + k * interval), from every soak's journal, p50 and p95; and the ticks of the window
  that got no sample (skipped), in percent;
- CPU per soak: the monitor process's CPU (every thread) over the window, divided by N and
  by the window, in percent of one core (the reapers and trainers are other processes);
- cancelling: the caller cancels the task group; the time until every ``run_soak`` has
  returned (each has stopped its tree and written its ``cancelled`` artifact).

Each N runs in a process of its own.  No target beside the issue's: every soak samples on
schedule, and 64 cancel together within a second (on a quiet machine; this one is shared).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Figure, Section, percentile

COUNTS = (1, 16, 64)
INTERVAL = 0.5
#: The 64 soaks' sampling delay at the 99th percentile must stay under this (issue 36).
P99_TARGET_SECONDS = 0.5
TRAINER = 'mkdir -p "$1" && while :; do echo step >> "$1/metrics"; sleep 1; done'
#: Seconds every soak runs before the window (the last soaks start late on a busy machine).
SETTLE_SECONDS = 3.0


def measure(count: int, window: float) -> dict[str, Any]:
    """In this process: ``count`` soaks, one window, then a cancel of them all."""
    import anyio

    import asyncsoak

    async def main(base: Path) -> dict[str, Any]:
        controls = [asyncsoak.SoakControl() for _ in range(count)]

        async def soak(index: int) -> None:
            run = base / f"soak-{index}"
            await asyncsoak.run_soak(
                command=["sh", "-c", TRAINER, "sh", str(run / "progress")],
                progress_dir=run / "progress",
                output_path=run / "soak.json",
                sample_interval_seconds=INTERVAL,
                startup_timeout_seconds=600.0,
                stale_progress_seconds=600.0,
                nvidia_smi=None,
                forensics=False,
                control=controls[index],
            )

        async with anyio.create_task_group() as tg:
            for index in range(count):
                tg.start_soon(soak, index)
            for control in controls:
                await control.started.wait()
            await anyio.sleep(SETTLE_SECONDS)
            window_start = time.monotonic()
            cpu = time.process_time()
            await anyio.sleep(window)
            cpu_used = time.process_time() - cpu
            window_end = time.monotonic()
            cancelled_at = time.monotonic()
            tg.cancel_scope.cancel()
        cancel_seconds = time.monotonic() - cancelled_at

        lateness: list[float] = []
        expected = got = 0
        for index in range(count):
            artifact = json.loads((base / f"soak-{index}" / "soak.json").read_text())
            start = artifact["monitor"]["monotonic_start"]
            first_tick = int((window_start - start) / INTERVAL) + 1
            last_tick = int((window_end - start) / INTERVAL)
            expected += last_tick - first_tick + 1
            ticks = set()
            for event in asyncsoak.read_journal(Path(artifact["monitor"]["journal_path"])):
                if event["kind"] != "sample":
                    continue
                tick = int(event["t"] / INTERVAL + 1e-9)
                if first_tick <= tick <= last_tick and tick not in ticks:
                    ticks.add(tick)
                    lateness.append(event["t"] - tick * INTERVAL)
            got += len(ticks)
        return {
            "count": count,
            "lateness": lateness,
            "skipped_percent": 100 * (expected - got) / expected,
            "cpu_per_soak_percent": 100 * cpu_used / window / count,
            "cancel_seconds": cancel_seconds,
        }

    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        return anyio.run(main, Path(tmp))


def run(quick: bool = False) -> Section:
    section = Section("many_soaks", "16. Many soaks per process")
    started = time.monotonic()
    window = 3.0 if quick else 15.0
    for count in COUNTS:
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.many_soaks", "--child", str(count), str(window)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if child.returncode != 0:
            raise RuntimeError(f"{count} soaks: {child.stderr.strip()[-2000:]}")
        result = json.loads(child.stdout.splitlines()[-1])
        late = result["lateness"]
        name = f"{count} soak{'s' if count > 1 else ''}"
        section.add(
            Figure(
                f"{name}: sampling delay p50 / p95",
                percentile(late, 50) * 1e3,
                "ms",
                reference=f"p95 {percentile(late, 95) * 1e3:.1f} ms",
            )
        )
        if count == max(COUNTS):
            p99 = percentile(late, 99)
            section.add(
                Figure(
                    f"{name}: sampling delay p99",
                    p99 * 1e3,
                    "ms",
                    reference="the interval",
                    ratio=p99 / INTERVAL,
                    target="p99 < 0.5 s",
                    met=p99 < P99_TARGET_SECONDS,
                )
            )
        section.add(Figure(f"{name}: ticks without a sample", result["skipped_percent"], "%"))
        section.add(
            Figure(f"{name}: monitor CPU per soak", result["cpu_per_soak_percent"], "% of a core")
        )
        section.add(Figure(f"{name}: all cancelled at once", result["cancel_seconds"], "s"))
    section.note(
        f"sh trainers appending once a second, sampled every {INTERVAL:g} s; one "
        f"{window:g} s window per count, {SETTLE_SECONDS:g} s after the last soak started; "
        "each count in a process of its own"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        from benchmarks.run import run_alone

        run_alone(run, __doc__)
