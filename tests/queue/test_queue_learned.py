"""--stale-progress auto in the queue: the limit a job's last run learned, carried by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsoak.queue._kept import LEARNED_DIR, carried_limit, remember_limit

from .test_queue_cli import cli

#: Steps every 0.05 s for 2.5 s, past a 1 s warm-up: the learned limit is the floor.
STEPPER = """\
import json, os, pathlib, time
metrics = pathlib.Path(os.environ["ASYNCSOAK_RUN_DIR"]) / "metrics.jsonl"
for step in range(50):
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
    time.sleep(0.05)
"""


def artifact(
    learned: float | None, *, stale: object = "auto", startup: float = 600.0
) -> dict[str, Any]:
    return {
        "config": {"stale_progress_seconds": stale, "startup_timeout_seconds": startup},
        "progress": {"stale_limit_seconds": learned},
    }


def test_a_learned_limit_is_carried_to_the_next_job_of_the_same_name(tmp_path: Path) -> None:
    """What one run learned is the next run's starting limit; another name starts afresh."""
    assert carried_limit(tmp_path, "sft") is None
    remember_limit(tmp_path, "sft", artifact(42.5))
    assert carried_limit(tmp_path, "sft") == 42.5
    assert carried_limit(tmp_path, "pretrain") is None
    assert carried_limit(tmp_path, None) is None
    # The file is named by a hash: a name is never a path.
    remember_limit(tmp_path, "../../etc/passwd", artifact(9.0))
    assert carried_limit(tmp_path, "../../etc/passwd") == 9.0
    assert {p.parent.name for p in tmp_path.rglob("*.json")} == {LEARNED_DIR}


def test_nothing_is_kept_that_was_not_learned(tmp_path: Path) -> None:
    """A fixed limit, a warm-up that never ended, no limit at all: nothing is remembered;
    a damaged file reads as nothing."""
    remember_limit(tmp_path, "a", artifact(30.0, stale=120.0))
    remember_limit(tmp_path, "b", artifact(600.0))  # still the startup limit
    remember_limit(tmp_path, "c", artifact(None))
    remember_limit(tmp_path, "d", None)
    assert [carried_limit(tmp_path, n) for n in "abcd"] == [None] * 4
    remember_limit(tmp_path, "e", artifact(12.0))
    (path,) = (tmp_path / LEARNED_DIR).glob("*.json")
    path.write_text("{not json")
    assert carried_limit(tmp_path, "e") is None


@pytest.mark.slow
def test_the_worker_carries_a_job_names_learned_limit(tmp_path: Path) -> None:
    """Two jobs named alike under --stale-progress auto: the second soak starts from the
    limit the first learned (its config records the carried limit)."""
    db, runs = tmp_path / "q.db", tmp_path / "runs"
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    flags = ["--stale-progress", "auto", "--startup-timeout", "1", "--sample-interval", "0.1"]
    for _ in range(2):
        cli(db, "submit", "--name", "sft", *flags, "--", sys.executable, str(script))
    cli(db, "worker", "--no-gpu", "--once", "--poll", "0.1", "--runs-dir", str(runs))
    first = json.loads(cli(db, "job", "1", "--json").stdout)
    assert first["status"] == "succeeded", first
    learned = json.loads(Path(first["artifact"]).read_text())["progress"]["stale_limit_seconds"]
    assert learned == 10.0  # AUTO_FLOOR_SECONDS: 3 x 0.1 s gaps is less
    cli(db, "worker", "--no-gpu", "--once", "--poll", "0.1", "--runs-dir", str(runs))
    second = json.loads(cli(db, "job", "2", "--json").stdout)
    config = json.loads(Path(second["artifact"]).read_text())["config"]
    assert config["stale_progress_carried_seconds"] == learned
