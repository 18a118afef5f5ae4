"""The report of a day-long run: how long a browser takes to load and draw it.

    python -m benchmarks --only report_render      (or: python -m benchmarks.report_render)

A soak of a day keeps at most 1,000 points per series in its artifact (SERIES_POINTS) and its
events' head and tail (EVENTS_HEAD + EVENTS_TAIL); the journal beside it has every progress
change, one a second here (86,400).  This builds such an artifact (tree, machine, two GPUs,
the GPU use of the tree, the progress rate, eight processes with their own memory, trends)
and such a journal, renders the report with ``render_report`` as ``asyncsoak report`` does,
and opens it in headless Chromium, offline, at 1400x900.  The page records when its figure
is drawn (``performance.now()`` from the start of navigation, in the render marker): that is
the load-and-draw time, measured five times (three with ``--quick``).

Target: under 3 s.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import Figure, Section

DAY = 86_400
POINTS = 1_000
#: What ``asyncsoak report`` is given to draw at most, as the artifact keeps it.
EVENTS_KEPT = 2_000
TARGET_SECONDS = 3.0


def day_artifact(journal: Path) -> dict[str, Any]:
    """A passed soak of a day, as the artifact builder would have kept it."""
    t = [round(DAY * i / (POINTS - 1), 3) for i in range(POINTS)]

    def wave(base: float, amp: float, period: float = 5_000.0) -> list[float]:
        return [round(base + amp * math.sin(x / period), 3) for x in t]

    def ramp(start: float, end: float) -> list[float]:
        return [round(start + (end - start) * x / DAY, 1) for x in t]

    series: dict[str, dict[str, list[float]]] = {
        "tree": {
            "t": t,
            "cpu_percent": wave(380, 40),
            "rss_bytes": ramp(6 * 2**30, 9 * 2**30),
            "processes": wave(10, 0.4),
            "threads": wave(120, 6),
            "fds": wave(300, 20),
            "read_bytes": ramp(0, 2**40),
            "write_bytes": ramp(0, 2**39),
        },
        "machine": {
            "t": t,
            "cpu_percent": wave(40, 5),
            "memory_used_bytes": ramp(30 * 2**30, 34 * 2**30),
            "memory_available_bytes": ramp(220 * 2**30, 216 * 2**30),
            "load1": wave(4, 1),
            "disk_free_bytes_progress": ramp(800 * 2**30, 600 * 2**30),
            "disk_free_bytes_output": ramp(800 * 2**30, 600 * 2**30),
            "swap_percent": wave(0.5, 0.1),
        },
        "gpu_tree": {
            "t": t,
            "tree_gpu_processes": wave(2, 0.1),
            "tree_gpu_memory_mib": wave(70_000, 2_000),
            "other_gpu_memory_mib": wave(0, 0),
        },
        "progress_rate": {
            "t": t,
            "changes_per_minute": wave(60, 5),
            "bytes_per_minute": wave(6_000, 500),
        },
    }
    for g in range(2):
        series[f"gpu{g}"] = {
            "t": t,
            "utilization_gpu_percent": wave(90, 8),
            "memory_used_mib": wave(70_000, 2_000),
            "memory_total_mib": wave(143_771, 0),
            "power_draw_w": wave(620, 40),
            "power_limit_w": wave(700, 0),
            "temperature_gpu_c": wave(66, 3),
            "clocks_sm_mhz": wave(1_900, 60),
        }
    summary = {
        group: {
            name: {"max": max(v), "min": min(v), "mean": statistics.fmean(v), "last": v[-1]}
            for name, v in fields.items()
            if name != "t"
        }
        for group, fields in series.items()
    }
    events: list[dict[str, Any]] = [{"t": 0.1, "kind": "started", "pid": 100, "reaper_pid": 99}]
    head = [
        {"t": float(s), "kind": "progress", "changed": 1, "paths": ["metrics.jsonl"]}
        for s in range(1, 500)
    ]
    tail = [
        {"t": float(s), "kind": "progress", "changed": 2}
        | {"paths": [f"checkpoint-{s // 600}/trainer_state.json", "metrics.jsonl"]}
        for s in range(DAY - 1_498, DAY)
    ]
    events += head + tail
    events += [
        {"t": DAY + 0.5, "kind": "exited", "pid": 100, "returncode": 0, "signal": None},
        {"t": DAY + 0.6, "kind": "finished", "status": "passed"},
    ]
    processes = [
        {
            "pid": 100 + i,
            "name": "python" if i == 0 else "pt_data_worker",
            "first_rss_bytes": 2**30,
            "peak_rss_bytes": 2**30 + 2**27 * i,
            "last_rss_bytes": 2**30,
            "mean_cpu_percent": 90.0,
            "peak_gpu_memory_bytes": None,
            "peak_threads": 12,
            "first_t": 0.0,
            "last_t": float(DAY),
            "series": {"t": t[::5], "rss_bytes": ramp(2**30, 2**30 + 2**27 * i)[::5]},
        }
        for i in range(8)
    ]
    return {
        "schema_version": 2,
        "status": "passed",
        "failures": [],
        "warnings": [],
        "command": ["python", "train.py"],
        "cwd": "/runs/day",
        "config": {
            "progress_dir": "/runs/day",
            "output_path": "/runs/day/soak.json",
            "sample_interval_seconds": 1.0,
            "startup_timeout_seconds": 1800.0,
            "stale_progress_seconds": 600.0,
            "post_shutdown_grace_seconds": 5.0,
            "min_duration_seconds": None,
        },
        "metadata": {},
        "started_at": "2026-01-01T00:00:00.000Z",
        "ended_at": "2026-01-02T00:00:01.000Z",
        "duration_seconds": DAY + 1.0,
        "exit": {"returncode": 0, "signal": None, "pid": 100, "exception": None},
        "snapshot": {},
        "progress": {
            "dir": "/runs/day",
            "changes": DAY,
            "longest_gap_seconds": 1.0,
            "first_change_at": "2026-01-01T00:00:01.000Z",
            "last_change_at": "2026-01-01T23:59:59.000Z",
        },
        "series": series,
        "summary": summary,
        "events": events,
        "events_dropped": DAY - EVENTS_KEPT,
        "trends": {},
        "processes": processes,
        "leftover_processes": [],
        "abandoned_processes": [],
        "oom_kills": [],
        "forensics": None,
        "log": {"path": "/runs/day/soak.log", "tail": "step 86399\n" * 40},
        "monitor": {"journal_path": str(journal)},
    }


def day_journal(path: Path) -> None:
    """Every progress change of the day (one a second), as journal lines."""
    with path.open("w") as out:
        out.write(json.dumps({"t": 0.0, "kind": "header", "started_at": "2026-01-01T00:00:00Z"}))
        out.write("\n")
        for s in range(1, DAY):
            paths = ["metrics.jsonl"] + ([f"checkpoint-{s // 600}/x"] if s % 600 == 0 else [])
            line = {"t": float(s), "kind": "progress", "changed": len(paths), "paths": paths}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")


def draw_ms(chromium: str, page: Path) -> tuple[float, float, float]:
    """(ms from navigation to the figure drawn, seconds of the whole browser run, CPU
    seconds the browser's processes used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,900",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            # The page decompresses plotly.js before it draws: wait for that.
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r'data-drawn-ms="(\d+)"', result.stdout)
    if result.returncode != 0 or found is None or 'data-state="rendered"' not in result.stdout:
        raise RuntimeError(f"the report did not draw: {result.stderr[-500:]}")
    return float(found.group(1)), wall, cpu


def plotly_alone(path: Path) -> Path:
    """A page with only plotly.js inlined, marking when it is parsed: the floor of any
    offline plotly page."""
    import plotly.offline

    path.write_text(
        "<!DOCTYPE html><html><body><script>"
        + plotly.offline.get_plotlyjs()
        + '</script><span id="render-status" data-state="rendered"></span><script>'
        + 'document.getElementById("render-status").dataset.drawnMs = '
        + "String(Math.round(performance.now()));</script></body></html>"
    )
    return path


def run(quick: bool = False) -> Section:
    from asyncsoak._record._artifact_io import check_artifact
    from asyncsoak._view.report import render_report

    section = Section("report_render", "14. Report load and draw")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        section.note("skipped: no chromium on PATH")
        return section
    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "soak.jsonl"
        day_journal(journal)
        artifact = check_artifact(day_artifact(journal))
        started = time.monotonic()
        page = Path(tmp) / "day.html"
        page.write_text(render_report(artifact, journal=journal))
        render_seconds = time.monotonic() - started
        floor_page = plotly_alone(Path(tmp) / "plotly.html")
        runs: list[tuple[float, float, float]] = []
        floors: list[tuple[float, float, float]] = []
        for _ in range(3 if quick else 5):
            # In turns, so that a change of the machine's load weighs on both alike.
            runs.append(draw_ms(chromium, page))
            floors.append(draw_ms(chromium, floor_page))
        size = page.stat().st_size
    drawn = statistics.median(r[0] for r in runs) / 1000
    floor = statistics.median(r[0] for r in floors) / 1000
    section.add(
        Figure(
            "load and draw in Chromium (p50)",
            round(drawn, 2),
            "s",
            target=f"< {TARGET_SECONDS:g} s",
            met=drawn < TARGET_SECONDS,
        )
    )
    cpu = statistics.median(r[2] for r in runs)
    floor_cpu = statistics.median(r[2] for r in floors)
    section.add(
        Figure(
            "plotly.js alone: parsed (p50)",
            round(floor, 2),
            "s",
            reference="the report",
            ratio=round(drawn / floor, 2) if floor else None,
        )
    )
    section.add(
        Figure(
            "browser CPU for the report (p50)",
            round(cpu, 2),
            "s",
            reference="plotly.js alone",
            ratio=round(cpu / floor_cpu, 2) if floor_cpu else None,
        )
    )
    section.add(
        Figure(
            "browser run, start to exit (p50)", round(statistics.median(r[1] for r in runs), 2), "s"
        )
    )
    section.add(Figure("render_report (Python)", round(render_seconds, 2), "s"))
    section.add(Figure("page size", round(size / 2**20, 1), "MiB"))
    section.note(
        f"a day at {POINTS} points per series, {len(artifact['series'])} groups, "
        f"{len(artifact['events'])} events kept, {DAY - 1} progress changes in the journal, "
        "8 processes; 1400x900, offline"
    )
    section.note(
        f"load average when measured: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
        "(plotly.js alone is the floor of any such page on this machine at this load)"
    )
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
