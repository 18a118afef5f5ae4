"""A job that succeeds with a leak: the queue's ``jobs`` and ``job`` say so in the job's note."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsoak.queue._status import WARNINGS_HEADER, outcome_from_artifact

from ..conftest import REPO
from .test_queue_cli import LIMIT_S, cli

#: Paced by the clock: a step every 50 ms however loaded the machine is late in the run (slept
#: 50 ms after each step, a busy suite slowed the last quarter's steps threefold: "progress
#: slowing" came before the leak's warning in the job's note).
LEAKER = """\
import os, pathlib, time
progress = pathlib.Path(os.environ["ASYNCSOAK_RUN_DIR"])
keep = [bytearray(100 * 2**20)]
start = time.monotonic()
for step in range(60):
    keep.append(bytearray(6 * 2**20))
    with open(progress / "metrics.txt", "a") as f:
        f.write(f"step {step}\\n")
    time.sleep(max(0.0, start + 0.05 * (step + 1) - time.monotonic()))
"""


@pytest.mark.slow
def test_a_leaking_job_that_succeeds_shows_the_warning(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    script = tmp_path / "leaker.py"
    script.write_text(LEAKER)
    cli(db, "submit", "--name", "leaky", "--sample-interval", "0.05", "--grace", "0.5", "--",
        sys.executable, str(script))  # fmt: skip
    subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncsoak",
            "worker",
            "--db",
            str(db),
            "--no-gpu",
            "--once",
            "--poll",
            "0.1",
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        capture_output=True,
        timeout=LIMIT_S,
        check=True,
    )
    job = json.loads(cli(db, "job", "1", "--json").stdout)
    assert job["status"] == "succeeded"
    assert job["error"].startswith(WARNINGS_HEADER)
    table = cli(db, "jobs").stdout
    assert "warning: memory of pid " in table
    shown = cli(db, "job", "1").stdout
    assert "  warning       memory of pid " in shown
    assert "\nerror:" not in shown


def test_only_a_succeeded_attempt_carries_warnings() -> None:
    """A failed attempt keeps its error; a clean success has none."""
    base = {
        "status": "passed",
        "exit": {"returncode": 0, "pid": 1},
        "stop": {"cause": "exited"},
        "failures": [],
    }
    clean = outcome_from_artifact(
        {**base, "warnings": []}, cancel_requested=False, stopping=False, log_tail=""
    )
    assert clean.error is None
    warned = outcome_from_artifact(
        {**base, "warnings": ["tree memory grew 1.0 GiB in 70 s (+0.9 GiB/min)"]},
        cancel_requested=False,
        stopping=False,
        log_tail="",
    )
    assert warned.status == "succeeded"
    assert warned.error == WARNINGS_HEADER + "\ntree memory grew 1.0 GiB in 70 s (+0.9 GiB/min)"
