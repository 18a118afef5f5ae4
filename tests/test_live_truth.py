"""The live line tells the truth: the time since the last progress is the monitor's own
knowledge when the line is drawn, whatever the sample interval, and no figure is shown
before the tree was sampled with one."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._record._journal import read_journal
from asyncsoak._sampling._progress_rules import ProgressTracker, latest_change_age
from asyncsoak._sampling._progress_scan import scan_progress_dir
from asyncsoak._sampling._step_rules import StepTracker
from asyncsoak._view._live_line import Status, render_rich
from asyncsoak._view._live_state import LiveState

from .conftest import CLI_ENV, asyncsoak_cli, py
from .soak_runs import sample_lines

needs_rich = pytest.mark.skipif(
    importlib.util.find_spec("rich") is None,
    reason="the terminal view needs the live extra (pip install 'asyncsoak[live]')",
)

#: Appends to a progress file every 0.3 s for about two sample intervals (``SECONDS``), and
#: notes the monotonic time of each write outside the progress dir (the truth the line is
#: held against).
WRITER = """
import pathlib, sys, time
p = pathlib.Path("progress"); p.mkdir(exist_ok=True)
end = time.monotonic() + float(sys.argv[1])
with open("writes.txt", "a") as writes:
    while time.monotonic() < end:
        with (p / "metrics.jsonl").open("a") as f:
            f.write("{}\\n")
        writes.write(f"{time.monotonic()}\\n"); writes.flush()
        time.sleep(0.3)
"""
LINE = re.compile(r"^asyncsoak: (?P<elapsed>[\d.]+)s running \| last progress (?P<age>[\d.]+)s ago")
#: The line's figures are rounded to 0.1 s: two of them are compared.
SHOWN_ROUNDING = 0.1


@pytest.mark.slow
@pytest.mark.parametrize(("interval", "seconds"), [(None, 10.6), (0.5, 4.0)])
def test_the_age_of_the_last_progress_is_accurate_to_half_a_second(
    tmp_path: Path, interval: float | None, seconds: float
) -> None:
    """With a trainer writing every 0.3 s, every line's age of the last progress is within
    0.5 s of the time since the trainer's last write, at the default 5 s interval and at
    0.5 s (the journal lags up to two intervals; the scans, up to one)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncsoak",
            "run",
            "--progress-dir",
            str(tmp_path / "progress"),
            "--output",
            str(tmp_path / "soak.json"),
            "--no-gpu",
            "--status-interval",
            "0.1",
            *([] if interval is None else ["--sample-interval", str(interval)]),
            "--",
            *py(WRITER),
            str(seconds),
        ],
        cwd=tmp_path,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    header = next(read_journal(tmp_path / "soak.jsonl"))
    writes = [
        float(t) - header["monotonic_start"] for t in (tmp_path / "writes.txt").read_text().split()
    ]
    lines = result.stderr.splitlines()
    errors = []
    for line in lines:
        assert "n/a" not in line, line  # no placeholder figure, ever
        match = LINE.match(line)
        if match is None:
            assert " running" not in line, f"a running line without its age: {line}"
            continue
        drawn_at = float(match["elapsed"])
        last_write = max(w for w in writes if w <= drawn_at + SHOWN_ROUNDING)
        errors.append(round(float(match["age"]) - (drawn_at - last_write), 2))
    # Before the first sample with figures, the line says so rather than show a placeholder.
    assert any("CPU/RSS starting" in line for line in lines[:3]), lines[:3]
    # Lines come every 0.5 s once the first progress was seen.
    assert len(errors) >= 2 * seconds - 3, lines
    assert max(map(abs, errors)) <= 0.5 + SHOWN_ROUNDING


#: A journal header with the usual limits, and a leak with its projected breach.
HEADER = {
    "t": 0,
    "kind": "header",
    "started_at": "2026-01-01T00:00:00Z",
    "config": {"stale_progress_seconds": 120.0, "startup_timeout_seconds": 600.0},
}
LEAK = [
    {"t": 9.0, "kind": "trend", "series": "process.29987.rss_bytes", "verdict": "leak"}
    | {"slope_per_hour": 54 * 2**30, "growth": 2**30, "projected_limit_at": None},
    {"t": 9.5, "kind": "trend", "series": "process.29987.rss_bytes"}
    | {"verdict": "breach_projected", "slope_per_hour": 54 * 2**30, "growth": 2**30}
    | {"projected_limit_at": "2026-01-01T00:41:00Z"},
]


def _status(*extra: dict[str, Any]) -> Status:
    state = LiveState()
    for event in [
        HEADER,
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 2.0, "kind": "progress", "changed": 1},
        *sample_lines(end=10.0, stall_at=None, gpus=2),
        *extra,
    ]:
        state.add(event)
    assert state.started_at is not None
    return state.status(now=state.started_at + 92.0)


def _drawn(status: Status, width: int) -> str:
    from rich.console import Console

    console = Console(record=True, width=width, color_system=None)
    console.print(render_rich(status, width))
    (line,) = console.export_text().rstrip("\n").splitlines()
    return line.rstrip()


@needs_rich
@pytest.mark.parametrize("width", [50, 60, 80])
def test_a_narrow_line_keeps_the_leak_and_the_stall_countdown(width: int) -> None:
    """Short of room, the figures go first: the LEAK warning and the stall countdown stay
    (at 50 columns only the LEAK has room beside the phase)."""
    line = _drawn(_status(*LEAK), width)
    assert len(line) <= width
    assert line.startswith("1m32s running  LEAK pid 29987"), line
    if width >= 60:
        assert "no progress 1m30s/2m00s" in line, line
    if width >= 80:
        assert "LEAK pid 29987 +921.6 MiB/min" in line, line


@needs_rich
def test_a_wide_line_uses_the_width() -> None:
    """At 200 columns the line says more (long wordings, the progress count) in the room."""
    line = _drawn(_status(), 200)
    assert len(line) >= 150, line
    assert "last progress 1m30s ago (stale limit 2m00s)" in line
    assert "1 progress change" in line
    assert "gpu1 " in line


def test_a_pass_with_warnings_looks_like_one() -> None:
    """A warning during the run is counted on the line; the last line says the pass carries
    warnings, as the summary will."""
    status = _status({"t": 8.0, "kind": "warning", "message": "memory of pid 7 grew"})
    assert "| 1 warning |" in status.plain()
    state = LiveState()
    for event in [HEADER, {"t": 8.0, "kind": "warning", "message": "x"}]:
        state.add(event)
    state.add({"t": 11.0, "kind": "finished", "status": "passed"})
    assert state.phase() == "finished: passed with warnings"


def test_the_look_between_scans_dates_by_mtime_and_ignores_a_clock_ahead(tmp_path: Path) -> None:
    """The draw's look at the files that changed last dates a change by its mtime; a file
    dated an hour ahead (a file server's clock) never makes the line say "just now", nor does
    a file that grew when the step is the progress that counts."""
    progress = tmp_path / "metrics.jsonl"
    progress.write_text("{}\n")
    tracker = ProgressTracker({}, startup_timeout=60.0, stale_after=60.0)
    assert latest_change_age(tracker, tmp_path, ()) is None  # nothing counted yet
    tracker.observe(scan_progress_dir(tmp_path).files, 1.0)
    os.utime(progress, (time.time() - 30.0,) * 2)
    age = latest_change_age(tracker, tmp_path, ())
    assert age is not None
    assert 29.0 <= age <= 31.0, age
    os.utime(progress, (time.time() + 3600.0,) * 2)
    assert latest_change_age(tracker, tmp_path, ()) is None
    os.utime(progress)
    stepped = ProgressTracker(
        {}, startup_timeout=60.0, stale_after=60.0, steps=StepTracker(), source="steps"
    )
    stepped.observe(scan_progress_dir(tmp_path).files, 1.0)
    assert latest_change_age(stepped, tmp_path, ()) is None  # the step is the progress
    stalled = _status()
    assert stalled.quiet_for == pytest.approx(90.0)
    assert stalled.with_progress_age(0.4).quiet_for == 0.4
    assert stalled.with_progress_age(None) == stalled
    assert stalled.with_progress_age(200.0) == stalled  # the events know better


#: A trainer logging a step every 0.05 s whose loss is NaN at step 15 only (finite after).
NAN_AT_15 = """
import json, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
    for step in range(400):
        loss = float("nan") if step == 15 else 2.0 / (step + 1)
        f.write(json.dumps({"step": step, "loss": loss}) + "\\n"); f.flush()
        time.sleep(0.05)
"""
#: A trainer whose step advances every 0.25 s to step 8, then stays there while its file grows.
FROZEN_AT_8 = """
import json, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
    for step in range(400):
        f.write(json.dumps({"step": min(step, 8), "loss": 1.0}) + "\\n"); f.flush()
        time.sleep(0.25)
"""


def _soak_views(tmp_path: Path, trainer: str, *flags: str) -> tuple[str, str, str, dict[str, Any]]:
    """A real soak of ``trainer`` from the CLI: its final live line, ``watch --once``'s frame,
    ``summary``'s text and ``summary --json``."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "asyncsoak", "run", "--progress-dir", str(tmp_path / "p")),
            *("--output", str(tmp_path / "soak.json"), "--no-gpu", "--sample-interval", "0.25"),
            *("--status-interval", "0.2", *flags, "--", *py(trainer), str(tmp_path / "p")),
        ],
        cwd=tmp_path,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stderr
    final = next(line for line in run.stderr.splitlines() if " finished: " in line)
    views = [
        asyncsoak_cli(*args, cwd=tmp_path)
        for args in (
            ("watch", "--once", str(tmp_path / "soak.jsonl")),
            ("summary", str(tmp_path / "soak.json")),
            ("summary", "--json", str(tmp_path / "soak.json")),
        )
    ]
    assert all(view.returncode == 0 for view in views), [view.stderr for view in views]
    once, summary, as_json = (view.stdout for view in views)
    return final, once, summary, json.loads(as_json)


def test_a_nan_runs_views_say_loss_nan(tmp_path: Path) -> None:
    """The loss is NaN at step 15 and finite after: the final line, ``watch --once`` and the
    summary all name the loss the run failed on, never the last finite one."""
    final, once, summary, data = _soak_views(tmp_path, NAN_AT_15)
    assert data["reasons"][0]["reason"] == "nonfinite_loss"
    for text in (final, once, summary):
        assert "loss nan" in text, text
    assert data["progress"]["steps"]["nonfinite_loss"] == "nan"


def test_a_frozen_steps_views_date_the_last_progress_at_its_last_advance(tmp_path: Path) -> None:
    """Step 8 freezes while its file grows: the summary dates the last progress at the step's
    last advance (at least the stale limit before the failure), its longest gap is the frozen
    one, and the final line shows no step rate from before the freeze."""
    final, _, summary, data = _soak_views(tmp_path, FROZEN_AT_8, "--stale-progress", "2")
    assert data["reasons"][0]["reason"] == "stale_progress"
    last = data["evidence"]["last_progress"]
    assert last["before_end"] >= 2.0, summary
    assert last["paths"] == ["metrics.jsonl"]
    assert data["progress"]["steps"]["longest_gap_seconds"] >= 2.0
    rates = re.findall(r"([\d.]+) steps/s", final)
    assert rates in ([], ["0"]), final
    progress = next(line for line in summary.splitlines() if line.startswith("progress: "))
    assert re.search(r"longest gap [2-9]\.\d+s; file growth: \d+ changes in ", progress), progress
