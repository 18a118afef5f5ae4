"""The live line tells the truth: the time since the last progress is the monitor's own
knowledge when the line is drawn, whatever the sample interval, and no figure is shown
before the tree was sampled with one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import CLI_ENV, py

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
