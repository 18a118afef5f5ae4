"""A job carries every soak setting ``asyncsoak run`` offers: the trend rules and budgets too.

The flags come from one dataclass (``SoakLimits``); ``submit`` stores them with the job and the
worker hands them to the soak, on both backends.
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from asyncsoak._supervisor._config import SoakLimits
from asyncsoak.cli import build_parser

from .test_queue_cli import cli

MiB = 2**20

#: Holds 160 MiB (written, so resident) and makes progress until it is stopped; exits 0 after
#: 30 s if no budget stops it first.
HOG = """\
import os, pathlib, time
progress = pathlib.Path(os.environ["ASYNCSOAK_RUN_DIR"]) / "metrics.txt"
keep = b"x" * (160 * 2**20)
for step in range(600):
    with open(progress, "a") as f:
        f.write(f"step {step}\\n")
    time.sleep(0.05)
"""


def test_run_and_submit_offer_the_same_soak_flags() -> None:
    """Every field of SoakLimits is a flag of both ``run`` and ``submit``, parsed alike."""
    given = ["--max-rss", "1GiB", "--leak-check", "fail", "--warm-up", "30", "--detailed-memory",
             "--dump-signal", "USR1", "--", "true"]  # fmt: skip
    run = build_parser().parse_args(["run", "--progress-dir", "p", "--output", "o", *given])
    submit = build_parser().parse_args(["submit", *given])
    for spec in fields(SoakLimits):
        dest = spec.metadata["flag"].removeprefix("--").replace("-", "_")
        assert getattr(run, dest) == getattr(submit, dest), spec.name
    assert (submit.max_rss, submit.leak_check, submit.warm_up) == ("1GiB", "fail", 30.0)
    assert (submit.detailed_memory, submit.dump_signal) == (True, "USR1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad",
    [
        ["--max-rss", "lots"],
        ["--max-rss", "-1G"],
        ["--max-gpu-memory", "5XB"],
        ["--min-disk-free", "nan"],
        ["--warm-up", "-1"],
        ["--leak-check", "maybe"],
        ["--dump-signal", "SIGKILL"],
    ],
)
def test_bad_soak_flags_are_refused_at_submit(tmp_path: Path, bad: list[str]) -> None:
    """A malformed size, duration, choice or signal: exit status 2, the flag named, no
    database."""
    db = tmp_path / "q.db"
    refused = cli(db, "submit", *bad, "--", "true", expect=2)
    assert bad[0].lstrip("-").split("-")[0] in refused.stderr.lower().replace("_", "-")
    assert not db.exists()


@pytest.mark.slow
def test_a_job_over_its_rss_budget_fails_with_memory_budget(tmp_path: Path, db: str) -> None:
    """``submit --max-rss 64MiB``: the worker's soak stops the 160 MiB job, which fails with
    memory_budget; the job and its artifact hold the limits it was submitted with."""
    script = tmp_path / "hog.py"
    script.write_text(HOG)
    limits = ["--max-rss", "64MiB", "--leak-check", "off", "--dump-signal", "USR1"]
    fast = ["--sample-interval", "0.1", "--grace", "0.5"]
    cli(db, "submit", "--name", "hog", *limits, *fast, "--", sys.executable, str(script))
    job = json.loads(cli(db, "job", "1", "--json").stdout)
    soak = job["soak"]
    assert (soak["max_rss_bytes"], soak["leak_check"], soak["dump_signal"]) == (
        64 * MiB,
        "off",
        signal.SIGUSR1,
    )
    assert "dump_signal=SIGUSR1 leak_check=off max_rss=64.0MiB" in cli(db, "job", "1").stdout

    cli(db, "worker", "--no-gpu", "--once", "--poll", "0.1", "--runs-dir", str(tmp_path / "runs"))

    job = json.loads(cli(db, "job", "1", "--json").stdout)
    assert (job["status"], job["reason"]) == ("failed", "memory_budget"), job
    artifact = json.loads(Path(job["artifact"]).read_text())
    assert artifact["failures"][0]["reason"] == "memory_budget"
    config = artifact["config"]
    assert (config["max_rss_bytes"], config["leak_check"], config["dump_signal"]) == (
        64 * MiB,
        "off",
        signal.SIGUSR1,
    )
