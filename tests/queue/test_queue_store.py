"""JobStore on real SQLite files: claims, fencing, attempts, cancellation, refusals."""

from __future__ import annotations

import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from asyncsoak.queue import (
    JobNotFoundError,
    JobStateError,
    JobStore,
    Outcome,
    QueueDatabaseError,
    SqliteStore,
    WorkerNameInUseError,
    public_job,
)
from asyncsoak.queue._models import SCHEMA_VERSION
from asyncsoak.queue._sqlite import filesystem_type

RUNS = Path("/nonexistent/runs")


def _claim(store: JobStore, worker: str = "w1") -> int:
    job = store.claim(worker, "host-a", RUNS)
    assert job is not None
    return job.id


def test_submit_round_trip(store: JobStore) -> None:
    """A submitted job reads back with every field it was given and sane defaults."""
    job_id = store.submit(
        argv=["python", "train.py", "--lr", "3e-4"],
        name="lr",
        cwd="/work",
        env={"WANDB_API_KEY": "s3cret-value"},
        progress_dir="/work/progress",
        soak={"stale_progress_seconds": 600.0},
        stop_mode="group",
        priority=5,
        max_attempts=2,
    )
    job = store.get(job_id)
    assert (job.status, job.argv, job.name, job.cwd) == (
        "queued",
        ["python", "train.py", "--lr", "3e-4"],
        "lr",
        "/work",
    )
    assert job.env == {"WANDB_API_KEY": "s3cret-value"}
    assert (job.progress_dir, job.soak, job.stop_mode) == (
        "/work/progress",
        {"stale_progress_seconds": 600.0},
        "group",
    )
    assert (job.priority, job.max_attempts, job.attempt, job.attempts) == (5, 2, 0, 0)
    assert public_job(job)["env"] == ["WANDB_API_KEY"]


def test_database_is_owner_only_wal_and_versioned(tmp_path: Path) -> None:
    """A new database file is created 0600, in WAL mode, at the current schema version."""
    path = tmp_path / "sub" / "q.db"
    SqliteStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    SqliteStore(path).close()  # reopening an up-to-date database migrates nothing


def test_a_version_1_database_gains_the_attempts_summary_and_note(tmp_path: Path) -> None:
    """A queue of schema 1 (attempts without ``summary`` and ``note``) is migrated when opened:
    its jobs stay, and an attempt's summary and note are kept from then on."""
    path = tmp_path / "q.db"
    with SqliteStore(path) as store:
        job_id = store.submit(argv=["true"], name="old")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE attempts DROP COLUMN summary")
    conn.execute("ALTER TABLE attempts DROP COLUMN note")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with SqliteStore(path) as store:
        job = store.claim("w", "h", RUNS)
        assert job is not None
        assert (job.id, job.name) == (job_id, "old")
        outcome = Outcome("succeeded", 0, None, None)
        assert store.finish(job_id, job.attempt, "w", outcome, {"verdict": "passed"}, "a note")
        [attempt] = store.attempts(job_id)
    assert (attempt.summary, attempt.note) == ({"verdict": "passed"}, "a note")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_claim_order_priority_then_id(store: JobStore) -> None:
    """Claims take the highest priority first, then the lowest id."""
    low = store.submit(argv=["a"], priority=0)
    high = store.submit(argv=["b"], priority=9)
    low2 = store.submit(argv=["c"], priority=0)
    assert [_claim(store) for _ in range(3)] == [high, low, low2]
    assert store.claim("w1", "host-a", RUNS) is None


def test_interrupted_job_keeps_its_place(store: JobStore) -> None:
    """An interrupted job returns to queued with its id, ahead of newer same-priority jobs."""
    first = store.submit(argv=["a"])
    job = store.claim("w1", "host-a", RUNS)
    assert job is not None
    newer = store.submit(argv=["b"])
    assert store.finish(first, job.attempt, "w1", Outcome("interrupted", 4, None, None))
    again = store.claim("w2", "host-a", RUNS)
    assert again is not None
    assert (again.id, again.attempt, again.attempts) == (first, 2, 0)
    assert _claim(store) == newer


def test_concurrent_claims_take_each_job_once(tmp_path: Path) -> None:
    """Four connections claiming at once from 200 jobs take every job exactly once."""
    path = tmp_path / "q.db"
    with SqliteStore(path) as setup:
        ids = [setup.submit(argv=["x"]) for _ in range(200)]
    claimed: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def claimer(index: int) -> None:
        with SqliteStore(path, busy_timeout=30.0) as mine:
            start.wait()
            while (job := mine.claim(f"w{index}", "host-a", RUNS)) is not None:
                claimed[index].append(job.id)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    everything = [job_id for part in claimed for job_id in part]
    assert sorted(everything) == ids


def test_failure_requeues_until_attempts_run_out(store: JobStore) -> None:
    """A failure counts against max_attempts: requeued while attempts remain, then failed."""
    job_id = store.submit(argv=["x"], max_attempts=2)
    failure = Outcome("failed", 1, "nonzero_exit", "exit status 1")
    job = store.claim("w1", "h", RUNS)
    assert job is not None
    store.finish(job_id, job.attempt, "w1", failure)
    assert (store.get(job_id).status, store.get(job_id).attempts) == ("queued", 1)
    job = store.claim("w1", "h", RUNS)
    assert job is not None
    store.finish(job_id, job.attempt, "w1", failure)
    final = store.get(job_id)
    assert (final.status, final.attempts, final.reason, final.returncode) == (
        "failed",
        2,
        "nonzero_exit",
        1,
    )
    history = store.attempts(job_id)
    assert [(a.attempt, a.outcome) for a in history] == [(1, "failed"), (2, "failed")]
    assert history[0].artifact == str(RUNS / str(job_id) / "attempts" / "1" / "soak.json")


def test_stale_attempt_is_fenced(store: JobStore) -> None:
    """A worker whose attempt was taken over can neither heartbeat nor write a final status."""
    job_id = store.submit(argv=["x"], max_attempts=3)
    first = store.claim("old", "h", RUNS)
    assert first is not None
    assert store.heartbeat(job_id, first.attempt, "old") is False
    assert store.take_over(store.get(job_id), "sweeper")
    assert store.finish(job_id, first.attempt, "sweeper", Outcome("failed", None, "orphaned", "x"))
    second = store.claim("new", "h", RUNS)
    assert second is not None
    assert store.heartbeat(job_id, first.attempt, "old") is None
    assert not store.finish(job_id, first.attempt, "old", Outcome("succeeded", 0, None, None))
    job = store.get(job_id)
    assert (job.status, job.worker, job.attempt) == ("running", "new", 2)
    assert [a.outcome for a in store.attempts(job_id)] == ["failed", None]


def test_take_over_refused_when_heartbeat_moved(store: JobStore) -> None:
    """Taking an orphan over is a compare and swap: a fresh heartbeat makes it fail."""
    job_id = store.submit(argv=["x"])
    claimed = store.claim("w1", "h", RUNS)
    assert claimed is not None
    seen = store.get(job_id)
    if isinstance(store, SqliteStore):  # PostgreSQL's clock moves by itself
        store.clock = lambda: seen.heartbeat_at + 1.0  # type: ignore[operator]
    store.heartbeat(job_id, claimed.attempt, "w1")
    assert not store.take_over(seen, "sweeper")
    assert store.get(job_id).worker == "w1"


def test_cancel_queued_running_and_finished(store: JobStore) -> None:
    """Cancelling a queued job ends it at once; a running one gets a request; a finished one
    is refused without change."""
    queued = store.submit(argv=["x"])
    running = store.submit(argv=["y"])
    store.cancel(queued)
    assert store.get(queued).status == "cancelled"
    job = store.claim("w1", "h", RUNS)
    assert job is not None
    assert job.id == running
    assert store.cancel(running).status == "running"
    assert store.heartbeat(running, job.attempt, "w1") is True
    with pytest.raises(JobStateError, match="job 1 is cancelled"):
        store.cancel(queued)
    with pytest.raises(JobNotFoundError, match="no job 99"):
        store.cancel(99)


def test_requeue_finished_job(store: JobStore) -> None:
    """Requeueing a finished job queues it again with its attempt count reset."""
    job_id = store.submit(argv=["x"], max_attempts=1)
    job = store.claim("w1", "h", RUNS)
    assert job is not None
    with pytest.raises(JobStateError, match="is running"):
        store.requeue(job_id)
    store.finish(job_id, job.attempt, "w1", Outcome("failed", 2, "nonzero_exit", "boom"))
    again = store.requeue(job_id)
    assert (again.status, again.attempts, again.error, again.last_outcome) == (
        "queued",
        0,
        None,
        "failed",
    )


def test_worker_name_in_use(store: JobStore) -> None:
    """A name held by a live worker is refused; a dead holder's name can be taken."""
    store.register_worker("gpu0", host="h", pid=1, pid_start=None, alive=lambda w: True)
    with pytest.raises(WorkerNameInUseError):
        store.register_worker("gpu0", host="h", pid=2, pid_start=None, alive=lambda w: True)
    store.register_worker("gpu0", host="h", pid=3, pid_start=None, alive=lambda w: False)
    assert [w.pid for w in store.workers()] == [3]


def test_invalid_submissions_are_refused(store: JobStore) -> None:
    """Bad submissions raise ValueError and queue nothing."""
    with pytest.raises(ValueError, match="either a command or a config"):
        store.submit(argv=["x"], config={"a": 1})
    with pytest.raises(ValueError, match="unknown soak limit"):
        store.submit(argv=["x"], soak={"nope": 1})
    with pytest.raises(ValueError, match="stop_mode"):
        store.submit(argv=["x"], stop_mode="kill")  # type: ignore[arg-type]  # refused at run time
    with pytest.raises(ValueError, match="invalid variable name"):
        store.submit(argv=["x"], env={"A=B": "c"})
    with pytest.raises(ValueError, match="max attempts"):
        store.submit(argv=["x"], max_attempts=0)
    assert store.jobs() == []


def test_missing_database_refused_without_create(tmp_path: Path) -> None:
    """Opening a missing database with create=False fails clearly and creates nothing."""
    with pytest.raises(QueueDatabaseError, match="does not exist"):
        SqliteStore(tmp_path / "nope.db", create=False)
    assert not (tmp_path / "nope.db").exists()


def test_corrupt_and_foreign_databases_refused(tmp_path: Path) -> None:
    """A file that is not SQLite, or SQLite that is not a queue, is refused unchanged."""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(QueueDatabaseError, match="cannot be used"):
        SqliteStore(junk)
    assert junk.read_bytes() == b"definitely not sqlite" * 100
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(QueueDatabaseError, match="not a job queue"):
        SqliteStore(foreign)


def test_newer_schema_refused(tmp_path: Path) -> None:
    """A database from a newer schema is refused and left as it was."""
    path = tmp_path / "q.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(QueueDatabaseError, match="newer than this asyncsoak"):
        SqliteStore(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    conn.close()


def test_network_filesystem_refused(tmp_path: Path) -> None:
    """A database on an NFS mount is refused before any file is created."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"40 22 0:50 / {tmp_path}/nfs\\040share rw - nfs4 server:/export rw,vers=4.2\n"
    )
    shared = tmp_path / "nfs share"
    shared.mkdir()
    assert filesystem_type(tmp_path, mountinfo) == "ext4"
    with pytest.raises(QueueDatabaseError, match=r"network filesystem \(nfs4\)"):
        SqliteStore(shared / "q.db", mountinfo=mountinfo)
    assert list(shared.iterdir()) == []
