"""A queue job's goodput: its attempts' ledgers, the waits before and between them
(``queue_wait``, ``recovery``), GPU-hours, ``asyncsoak goodput`` and ``job N``."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._analysis import job_ledger
from asyncsoak.queue import Attempt, JobStore, Outcome, SqliteStore
from asyncsoak.queue._goodput import earlier_highest_step, job_parts
from asyncsoak.queue._sweeps import AttemptCause, Plan

from ..test_goodput_jobs import RESUMING
from .test_queue_cli import cli


@pytest.mark.slow
def test_a_resumed_job_counts_its_redone_steps_as_wasted(tmp_path: Path) -> None:
    """Checkpoint at 20, crash at 30, resume from 20: about 1 s of ``wasted`` (the redone
    steps 21-30), the wait before the first claim and the recovery between the attempts."""
    db, runs = tmp_path / "q.db", tmp_path / "runs"
    script = tmp_path / "resuming.py"
    script.write_text(RESUMING)
    flags = ["--sample-interval", "0.1", "--grace", "0.5"]
    cli(db, "submit", "--name", "resume", *flags, "--", sys.executable, str(script))
    # GPU 0 is the worker's to give (CUDA_VISIBLE_DEVICES); --no-gpu: nvidia-smi is not read.
    cli(db, "worker", "--no-gpu", "--gpus", "0", "--once", "--poll", "0.1", "--runs-dir", str(runs))
    shown = json.loads(cli(db, "job", "1", "--json").stdout)
    assert shown["status"] == "succeeded", shown
    assert [a["outcome"] for a in shown["attempts"]] == ["failed", "succeeded"]
    second = json.loads(Path(shown["attempts"][1]["artifact"]).read_text())
    assert second["config"]["earlier_highest_step"] == 30  # the worker passed it in
    assert second["metadata"]["gpus"] == ["0"]

    out = json.loads(cli(db, "goodput", "--json").stdout)
    (job,) = out["jobs"]
    assert (job["job"], job["attempts"], job["unknown"]) == ("job 1 resume", 2, [])
    badput = job["badput_seconds"]
    assert 0.6 <= badput["wasted"] <= 1.6, job
    assert min(badput["queue_wait"], badput["recovery"]) > 0, job
    assert job["steps"] == 40  # 30 new steps, then 10 more: the redone ones are not new
    parts = job["productive_seconds"] + sum(badput.values())
    assert parts == pytest.approx(job["wall_seconds"], abs=0.01)
    assert job["gpu_hours"]["wall"] == pytest.approx(job["wall_seconds"] / 3600, abs=2e-4)
    total = out["total"]
    assert (total["badput_seconds"], total["jobs"]) == (badput, 1)
    assert shown["goodput"]["badput_seconds"] == badput

    # The runs directory's artifacts: the job's attempts joined by the job's id.
    (from_files,) = json.loads(cli(db, "goodput", str(runs), "--json").stdout)["jobs"]
    assert from_files["job"] == "job 1 resume"
    assert 0.6 <= from_files["badput_seconds"]["wasted"] <= 1.6, from_files

    text = cli(db, "goodput").stdout
    assert all(word in text for word in ("wasted", "queue_wait", "job 1 resume")), text
    assert "goodput " in cli(db, "job", "1").stdout


def _attempt(number: int, start: float, end: float | None, **summary: Any) -> Attempt:
    return Attempt(
        job_id=7,
        attempt=number,
        worker="w",
        host="h",
        started_at=start,
        finished_at=end,
        outcome=None if end is None else "failed",
        reason=None,
        returncode=None,
        error=None,
        artifact=f"/nowhere/{number}/soak.json",
        summary=summary or None,
    )


def _section(wall: float, productive: float, steps: int, **badput: float) -> dict[str, Any]:
    return {
        "wall_seconds": wall,
        "productive_seconds": productive,
        "steps": steps,
        "badput_seconds": badput,
    }


def test_a_jobs_waits_come_from_its_submission_its_requeue_and_its_last_attempt() -> None:
    """The first attempt waited from the submission (its --not-before when later), one after
    a requeue from the requeue, one after a retry from the previous attempt's end."""
    attempts = [
        _attempt(1, 110.0, 120.0, goodput=_section(10.0, 8.0, 80, startup=2.0)),
        _attempt(2, 123.0, 133.0, goodput=_section(10.0, 9.0, 90, wasted=1.0)),
        _attempt(3, 500.0, 510.0, goodput=_section(10.0, 10.0, 100)),
    ]
    parts = job_parts(
        attempts,
        submitted_at=100.0,
        causes={1: AttemptCause(gpus=("0", "1")), 2: AttemptCause(gpus=("0", "1"))},
        requeued={2: 490.0},
        plan=Plan(not_before=104.0),
    )
    assert [(p.queued_at, p.gpus) for p in parts] == [(104.0, 2), (None, 2), (490.0, None)]
    ledger = job_ledger("job 7", parts)
    badput = ledger.ledger.badput_seconds
    assert (badput["queue_wait"], badput["recovery"]) == (6.0 + 10.0, 3.0)
    assert ledger.ledger.wall_seconds == 30.0 + 19.0
    assert ledger.gpu_seconds is None  # attempt 3's GPUs are unknown: seconds only


def test_the_earlier_attempts_highest_step_is_what_the_store_kept() -> None:
    attempts = [_attempt(1, 1.0, 2.0, step=30), _attempt(2, 3.0, 4.0, step=12)]
    assert earlier_highest_step(attempts) == 30
    assert earlier_highest_step([]) is None
    # Nothing kept and no artifact on this host: unknown.
    assert earlier_highest_step([_attempt(1, 1.0, 2.0)]) is None


def test_a_requeue_is_recorded_with_the_attempt_it_follows(store: JobStore) -> None:
    job_id = store.submit(argv=["true"])
    claimed = store.claim("w", "h", Path("/runs"))
    assert claimed is not None
    assert store.finish(job_id, claimed.attempt, "w", Outcome("succeeded", 0, None, None))
    assert store.requeue_times() == {}
    store.requeue(job_id)
    (at,) = store.requeue_times()[job_id].items()
    assert at[0] == 1  # after attempt 1
    assert at[1] >= claimed.created_at


def test_a_queue_from_before_requeue_times_gets_their_table_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE job_requeues")
    with SqliteStore(path) as store:
        assert store.requeue_times() == {}


def test_a_job_that_has_not_run_has_no_ledger_yet(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    cli(db, "submit", "--", "true")
    (line,) = [line for line in cli(db, "job", "1").stdout.splitlines() if "goodput" in line]
    assert line.split() == ["goodput", "-"]
    ledger = json.loads(cli(db, "job", "1", "--json").stdout)["goodput"]
    assert (ledger["attempts"], ledger["wall_seconds"]) == (0, 0.0)
    assert json.loads(cli(db, "goodput", "--json").stdout)["jobs"] == []
