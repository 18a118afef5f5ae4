"""The live line tells the truth: the time since the last progress is the monitor's own
knowledge when the line is drawn, whatever the sample interval, and no figure is shown
before the tree was sampled with one."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._view._live import LiveState, Status, render_rich

from .conftest import CLI_ENV, py
from .soak_runs import sample_lines

needs_rich = pytest.mark.skipif(
    importlib.util.find_spec("rich") is None,
    reason="the terminal view needs the live extra (pip install 'asyncsoak[live]')",
)

#: Appends to a progress file every 0.3 s for about two default sample intervals (5 s each).
WRITER = """
import pathlib, time
p = pathlib.Path("progress"); p.mkdir(exist_ok=True)
end = time.monotonic() + 10.6
while time.monotonic() < end:
    with (p / "metrics.jsonl").open("a") as f:
        f.write("{}\\n")
    time.sleep(0.3)
"""
LINE = re.compile(r"^asyncsoak: (?P<elapsed>\S+) running \| last progress (?P<age>[\d.]+)s ago")


def test_the_age_of_the_last_progress_is_the_monitors_own(tmp_path: Path) -> None:
    """At the default 5 s interval with a trainer writing every 0.3 s, the line's age of the
    last progress never exceeds 1.5 s once the tree was sampled (the journal lags 5-10 s)."""
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
            "--",
            *py(WRITER),
        ],
        cwd=tmp_path,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    sampled = False
    ages = []
    for line in lines:
        assert "n/a" not in line, line  # no placeholder figure, ever
        sampled = sampled or " | CPU " in line
        match = LINE.match(line)
        if match and sampled:
            ages.append(float(match["age"]))
        elif match is None and "running" in line:
            raise AssertionError(f"a running line without its age: {line}")
    # Before the first sample with figures, the line says so rather than show a placeholder.
    assert any("CPU/RSS starting" in line for line in lines[:3]), lines[:3]
    # Lines come every 0.5 s; the tree is sampled with figures from 5 s on.
    assert len(ages) >= 8, lines
    assert max(ages) <= 1.5, [line for line in lines if LINE.match(line)]


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
