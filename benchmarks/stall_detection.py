"""Stall detection latency: from the moment a rule's deadline passes to the ``failure`` event.

    python -m benchmarks --only stall_detection      (or: python -m benchmarks.stall_detection)

The deadline is taken from the child's side.  For ``stale_progress`` the child appends to a
file in the progress directory, records (``time.monotonic()``, system-wide) when its last write
returned, and then stalls: the deadline is that moment plus ``stale_progress_seconds``.  For
``startup_timeout`` the child never writes: the deadline is the soak's start (the artifact's
``monitor.monotonic_start``, taken just before the spawn) plus ``startup_timeout_seconds``.
The failure's time is ``monotonic_start + t`` of the ``failure`` event.

Each rule runs at sample intervals of 0.5 s and 5 s (the watchdog scans the directory every
interval, and waits on inotify in between); p50 and p95 over 20 soaks each.  Hang forensics
are off: they run after the failure is recorded and only lengthen the soak.

Target: p95 under 100 ms whatever the sample interval.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import anyio

from benchmarks._common import (
    Figure,
    Section,
    events_of,
    median,
    percentile,
    read_stamp,
    stalling_tree,
)

TARGET_P95_SECONDS = 0.100
#: Short rules, so a soak lasts about a second; the latency does not depend on them.
STALE_SECONDS = 0.5
STARTUP_SECONDS = 0.5
INTERVALS = (0.5, 5.0)


async def one_latency(work: Path, rule: str, interval: float) -> float:
    """Seconds from the rule's deadline, as the child sees it, to the failure event."""
    from asyncsoak import SoakFailureError, run_soak

    progress = work / "progress"
    progress.mkdir()
    stamp = work / "stamp.json"
    writes = 2 if rule == "stale_progress" else 0
    try:
        await run_soak(
            command=stalling_tree(progress / "metrics.jsonl", stamp, size=1, writes=writes),
            progress_dir=progress,
            output_path=work / "soak.json",
            sample_interval_seconds=interval,
            startup_timeout_seconds=STARTUP_SECONDS if rule == "startup_timeout" else 30.0,
            stale_progress_seconds=STALE_SECONDS,
            post_shutdown_grace_seconds=2.0,
            nvidia_smi=None,
            forensics=False,
        )
    except SoakFailureError as failure:
        artifact = failure.artifact
    else:
        raise RuntimeError(f"the soak did not fail with {rule}")
    failures = events_of(artifact, "failure")
    if failures[0]["reason"] != rule:
        raise RuntimeError(f"expected {rule}, got {failures[0]['reason']}")
    start = float(artifact["monitor"]["monotonic_start"])
    failed_at = start + float(failures[0]["t"])
    if rule == "stale_progress":
        deadline = float(read_stamp(stamp)["last_write"]) + STALE_SECONDS
    else:
        deadline = start + STARTUP_SECONDS
    return failed_at - deadline


def run(quick: bool = False) -> Section:
    runs = 5 if quick else 20
    section = Section("stall_detection", "3. Stall detection latency")
    started = time.monotonic()
    for rule in ("stale_progress", "startup_timeout"):
        for interval in INTERVALS:
            latencies = []
            for _ in range(runs):
                with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
                    latencies.append(anyio.run(one_latency, Path(tmp), rule, interval))
            p50 = percentile(latencies, 50)
            p95 = percentile(latencies, 95)
            label = f"{rule}, interval {interval:g} s"
            section.add(Figure(f"{label}: p50", p50 * 1e3, "ms"))
            section.add(
                Figure(
                    f"{label}: p95",
                    p95 * 1e3,
                    "ms",
                    reference="100 ms",
                    ratio=p95 / TARGET_P95_SECONDS,
                    target="p95 < 100 ms",
                    met=p95 < TARGET_P95_SECONDS,
                )
            )
            section.note(
                f"{label}: {runs} soaks, min {min(latencies) * 1e3:.1f} ms, "
                f"median {median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms"
            )
    section.note(
        f"stale_progress_seconds={STALE_SECONDS:g}, startup_timeout_seconds="
        f"{STARTUP_SECONDS:g}; forensics off (they come after the failure)"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
