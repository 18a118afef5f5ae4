"""A day of samples in flat memory: 86,400 samples through the serializer, then the artifact.

    python -m benchmarks --only day_of_samples      (or: python -m benchmarks.day_of_samples)

A soak of a day at a 1 s interval takes 86,400 process samples, as many GPU samples, and
(for a trainer that writes every second) as many progress events.  Waiting a day is not
needed: this drives the soak's real serializer (``Serializer``: journal on disk, artifact
builder in memory) through the real event queue with events from the real samplers, stamped
one second apart, as fast as they come:

- process samples: ``ProcSampler.read`` of a live tree of 10 processes, every time afresh;
- GPU samples: the GPU sampler's own parsing of the H200 captures
  (``tests/fixtures/nvidia-smi/h200/``), idle and under load in turns, when the GPU
  sampler is there;
- progress events, as the watchdog emits them.

The monitor's RSS (this process's, from ``/proc/self/statm``) is read after a warm-up of
2,000 seconds of soak and at the end; then the artifact is finalised as ``run_soak`` does
(``RunState.build`` and ``write_artifact``: JSON, fsync, rename) and timed.

The journal is written as ``run_soak`` writes it: compact sample lines, rotated into
segments that are gzipped once closed; its size is every segment's on disk.

Then ``asyncsoak report`` of the artifact (its journal beside it) is timed, as a person runs it
(a fresh interpreter), in turns with the report of the same artifact as written before
``progress.bins`` and ``throttle_spans`` (its report reads the journal's progress and GPU
sample lines): the reference, median of each.

Targets: RSS grows by under 10 MB after the warm-up; the artifact stays under 10 MB;
finalising takes under 2 s; the journal of the day is at most 40 MB; the report takes at most
2 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from benchmarks._common import Figure, Section
from benchmarks.proc_sampling import sleeping_tree

DAY = 86_400
WARMUP = 2_000
TREE_SIZE = 10
TARGET_RSS_GROWTH = 10 * 1024 * 1024
TARGET_ARTIFACT_BYTES = 10 * 1024 * 1024
TARGET_FINALISE_SECONDS = 2.0
TARGET_JOURNAL_BYTES = 40 * 1000 * 1000
TARGET_REPORT_SECONDS = 2.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


def gpu_samples() -> Callable[[float], Any] | None:
    """A function making a real GPU sample for time ``t``, or None without the GPU sampler."""
    try:
        from benchmarks.gpu_sampling import fixture_gpu_sample_maker
    except ImportError:
        return None
    maker: Callable[[float], Any] = fixture_gpu_sample_maker()
    return maker


async def drained(receive: MemoryObjectReceiveStream[Any]) -> None:
    """Wait until the serializer has taken every queued event, so RSS readings compare."""
    # The serializer has no event to wait on; a benchmark may poll.
    while receive.statistics().current_buffer_used:  # noqa: ASYNC110
        await anyio.sleep(0.001)


async def drive(
    work: Path, root_pid: int, samples: int, make_gpu_sample: Callable[[float], Any] | None
) -> dict[str, Any]:
    from asyncsoak._contract import events
    from asyncsoak._contract._sink import SoakClock, open_event_queue
    from asyncsoak._record._artifact import RunState
    from asyncsoak._record._artifact_io import create_private_file, write_artifact
    from asyncsoak._record._journal import journal_segments
    from asyncsoak._record._serializer import Serializer
    from asyncsoak._sampling._proc_sampler import ProcSampler

    progress = work / "progress"
    progress.mkdir()
    journal = work / "soak.jsonl"
    output = work / "soak.json"
    sampler = ProcSampler(root_pid, disk_paths={"progress": progress, "output": work})
    clock = SoakClock()
    sink, receive = open_event_queue(clock)
    builder = RunState()
    serializer = Serializer(create_private_file(journal), builder, journal_path=journal)
    measured: dict[str, Any] = {}

    def second_of_events(t: float) -> Iterator[Any]:
        sample = sampler.read(t)
        assert sample is not None
        yield sample
        if make_gpu_sample is not None:
            yield make_gpu_sample(t)
        yield events.Progress(t=t + 0.5, changed=1, paths=["metrics.jsonl"], gap_seconds=1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serializer.run, receive)
        async with sink:
            await sink.emit(
                events.Header(
                    t=0.0,
                    command=["python", "train.py"],
                    cwd=str(work),
                    config={
                        "progress_dir": str(progress),
                        "output_path": str(output),
                        "sample_interval_seconds": 1.0,
                        "startup_timeout_seconds": 600.0,
                        "stale_progress_seconds": 600.0,
                        "post_shutdown_grace_seconds": 5.0,
                        "min_duration_seconds": None,
                    },
                    metadata={},
                    started_at="2026-11-29T00:00:00.000Z",
                    journal_path=str(journal),
                    log_path=str(work / "soak.log"),
                    output_path=str(output),
                    monitor_pid=os.getpid(),
                    monotonic_start=clock.start,
                )
            )
            started = time.monotonic()
            for second in range(samples):
                for event in second_of_events(float(second)):
                    await sink.emit(event)
                if second == WARMUP:
                    await drained(receive)
                    measured["rss_warm"] = rss_bytes()
            await drained(receive)
            measured["rss_end"] = rss_bytes()
            measured["drive_seconds"] = time.monotonic() - started
    finalise_started = time.monotonic()
    artifact = builder.build(status="passed", ended_t=float(samples), log_tail="", monitor={})
    write_artifact(artifact, output)
    measured["finalise_seconds"] = time.monotonic() - finalise_started
    measured["rss_after_finalise"] = rss_bytes()
    measured["artifact_bytes"] = output.stat().st_size
    for compression in serializer._compressions:
        compression.result(timeout=60)
    segments = journal_segments(journal)
    measured["journal_bytes"] = sum(segment.stat().st_size for segment in segments)
    measured["journal_segments"] = len(segments)
    measured["journal_open_bytes"] = journal.stat().st_size
    for fd in serializer.lock_fds:
        os.close(fd)
    measured["events"] = serializer.events
    measured["journal_error"] = serializer.journal_error
    measured["samples"] = artifact["monitor"]["samples"]
    measured["series_points"] = {g: len(s["t"]) for g, s in artifact["series"].items()}
    measured["artifact_events"] = len(artifact["events"])
    return measured


def report_seconds(work: Path, runs: int) -> tuple[float, float]:
    """Median wall seconds of ``asyncsoak report`` of the day's artifact, and of the same
    artifact as written before the report's sections (the reference), taken in turns."""
    artifact = json.loads((work / "soak.json").read_text())
    del artifact["progress"]["bins"]
    for health in artifact.get("gpu_health", {}).values():
        del health["throttle_spans"]
    (work / "before.json").write_text(json.dumps(artifact))
    timings: dict[str, list[float]] = {"soak": [], "before": []}
    for _ in range(runs):
        for name, times in timings.items():
            command = [sys.executable, "-m", "asyncsoak", "report", f"{work}/{name}.json"]
            started = time.monotonic()
            subprocess.run([*command, "-o", f"{work}/{name}.html"], check=True, capture_output=True)
            times.append(time.monotonic() - started)
    return statistics.median(timings["soak"]), statistics.median(timings["before"])


def run(quick: bool = False) -> Section:
    samples = 10_000 if quick else DAY
    section = Section("day_of_samples", "5. A day of samples")
    started = time.monotonic()
    make_gpu_sample = gpu_samples()
    with (
        sleeping_tree(TREE_SIZE) as root,
        tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp,
    ):
        m = anyio.run(drive, Path(tmp), root, samples, make_gpu_sample)
        if importlib.util.find_spec("plotly") is not None:
            m["report_seconds"], m["report_before_seconds"] = report_seconds(
                Path(tmp), 3 if quick else 5
            )
    growth = m["rss_end"] - m["rss_warm"]
    mb = 1024 * 1024
    section.add(
        Figure(
            f"RSS growth from {WARMUP:,} to {samples:,} s of soak",
            growth / mb,
            "MB",
            reference=f"RSS after warm-up {m['rss_warm'] / mb:.1f} MB",
            ratio=m["rss_end"] / m["rss_warm"],
            target="< 10 MB",
            met=growth < TARGET_RSS_GROWTH,
        )
    )
    section.add(
        Figure(
            "artifact size",
            m["artifact_bytes"] / mb,
            "MB",
            reference=f"journal {m['journal_bytes'] / mb:.0f} MB",
            ratio=m["artifact_bytes"] / m["journal_bytes"],
            target="< 10 MB",
            met=m["artifact_bytes"] < TARGET_ARTIFACT_BYTES,
        )
    )
    section.add(
        Figure(
            "finalising the artifact (build + write)",
            m["finalise_seconds"],
            "s",
            reference=f"{samples:,} samples driven in {m['drive_seconds']:.0f} s",
            ratio=m["finalise_seconds"] / m["drive_seconds"],
            target="< 2 s",
            met=m["finalise_seconds"] < TARGET_FINALISE_SECONDS,
        )
    )
    section.add(
        Figure(
            "RSS after finalising, growth over the warm-up",
            (m["rss_after_finalise"] - m["rss_warm"]) / mb,
            "MB",
        )
    )
    # The target is for a day; a shorter (quick) run is scaled to a day.
    per_day = m["journal_bytes"] * DAY / samples
    section.add(
        Figure(
            f"journal on disk for {samples:,} s of soak, all segments",
            m["journal_bytes"] / mb,
            "MB",
            reference=f"{m['journal_segments']} segments, the open one "
            f"{m['journal_open_bytes'] / mb:.1f} MB",
        )
    )
    section.add(
        Figure(
            "journal for a day at 1 s (10 processes, one GPU)",
            per_day / mb,
            "MB",
            reference="324 MB before (full JSON lines, one file)",
            ratio=per_day / (324 * mb),
            target="<= 40 MB",
            met=per_day <= TARGET_JOURNAL_BYTES,
        )
    )
    section.note(
        f"serializer and artifact builder driven directly (not run_soak at a tiny interval): "
        f"{m['events']:,} events ({m['samples']}), one simulated second apart; "
        f"series points per group: {m['series_points']}; events kept in the artifact: "
        f"{m['artifact_events']}"
    )
    section.note(
        f"process samples: real reads of a live tree of {TREE_SIZE} processes; "
        + (
            "GPU samples: the GPU sampler's parsing of the H200 captures"
            if make_gpu_sample is not None
            else "no GPU samples (the GPU sampler is not in this tree)"
        )
    )
    if "report_seconds" in m:
        section.add(
            Figure(
                f"asyncsoak report of {samples:,} s of soak (wall, a fresh interpreter, median)",
                m["report_seconds"],
                "s",
                reference=f"before progress.bins (journal read) {m['report_before_seconds']:.2f} s",
                ratio=m["report_seconds"] / m["report_before_seconds"],
                target="<= 2 s",
                met=m["report_seconds"] <= TARGET_REPORT_SECONDS,
            )
        )
    if m["journal_error"]:
        section.note(f"journal error: {m['journal_error']}")
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
