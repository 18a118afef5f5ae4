"""``asyncsoak watch --job N``: a queue job's latest attempt, found through the queue's
database (SQLite or PostgreSQL), on the host that runs it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from asyncsoak.queue import JobStore

from ..conftest import asyncsoak_cli, py

pytestmark = pytest.mark.slow

QUICK = """
import pathlib, sys, time
p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True, exist_ok=True)
for i in range(5):
    (p / "m").open("a").write("x"); time.sleep(0.05)
"""


def _claimed(store: JobStore, runs: Path, host: str) -> tuple[int, Path]:
    job_id = store.submit(argv=["python", "train.py"], name="resnet")
    job = store.claim("w1", host, runs)
    assert job is not None
    assert job.id == job_id
    (attempt,) = store.attempts(job_id)
    return job_id, Path(attempt.artifact)


def test_watch_a_job_by_its_id(store: JobStore, db: str, tmp_path: Path) -> None:
    """--job finds the attempt's journal through the queue: its frame, then its verdict."""
    job_id, artifact = _claimed(store, tmp_path / "runs", socket.gethostname())
    progress = artifact.parent / "progress"
    ran = asyncsoak_cli(
        "run", "--progress-dir", str(progress), "--output", str(artifact), "--no-gpu", "--quiet",
        "--sample-interval", "0.1", "--", *py(QUICK), str(progress), cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    once = asyncsoak_cli("watch", "--job", str(job_id), "--db", db, "--once", cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    assert "finished: passed" in once.stdout
    watched = asyncsoak_cli("watch", "--job", str(job_id), "--db", db, cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.splitlines()[-1].startswith("asyncsoak: PASSED: The soak passed")
    # The run directory names the same soak (its latest attempt).
    by_dir = asyncsoak_cli("watch", "--once", str(artifact.parent.parent.parent), cwd=tmp_path)
    assert by_dir.stdout == once.stdout


def test_watch_refuses_a_job_that_has_not_run_or_runs_elsewhere(
    store: JobStore, db: str, tmp_path: Path
) -> None:
    """A queued job: nothing to watch yet; a job on another host: watch it there."""
    queued = store.submit(argv=["python", "train.py"])
    result = asyncsoak_cli("watch", "--job", str(queued), "--db", db, cwd=tmp_path)
    assert result.returncode == 2
    assert f"job {queued} has not started yet" in result.stderr
    store.cancel(queued)
    elsewhere, _ = _claimed(store, tmp_path / "runs", "gpu-node-9")
    result = asyncsoak_cli("watch", "--job", str(elsewhere), "--db", db, cwd=tmp_path)
    assert result.returncode == 2
    assert "runs on gpu-node-9: watch it there" in result.stderr


def test_watch_of_a_job_whose_queue_server_is_unreachable_exits_75(tmp_path: Path) -> None:
    """No server there: watch --job --wait-for-db 0.5 exits 75 as the queue's commands do,
    its password hidden (it failed with a traceback on the queue's --wait-for-db)."""
    secret = "hunter2pass"
    url = f"postgresql://me@/queue?host={tmp_path}&port=1&password={secret}"
    done = asyncsoak_cli("watch", "--job", "1", "--db", url, "--wait-for-db", "0.5", cwd=tmp_path)
    assert done.returncode == 75, done.stderr
    assert "cannot connect" in done.stderr
    assert "Traceback" not in done.stderr
    assert secret not in done.stdout + done.stderr
