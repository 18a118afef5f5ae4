"""The queue on PostgreSQL: what only a shared database has (the behavioural suite runs on both
backends through the ``store`` and ``db`` fixtures).

Wake-ups by NOTIFY, workers on two hosts (a worker started under ``unshare --uts`` has a host
name of its own), the database restarted under a running job, the database away for longer
than ``--stale-after``, hosts whose clocks disagree, and the schema's refusals.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from asyncsoak.queue import (
    JobStore,
    Outcome,
    PostgresStore,
    QueueDatabaseError,
    QueueUnavailableError,
    open_store,
    run_worker,
)
from asyncsoak.queue._models import SCHEMA_VERSION

from ..conftest import CLI_ENV, REPO, ReadyFifo, alive, asyncsoak_cli
from .helpers import kill_worker_and_its_reapers
from .pg_cluster import PgCluster
from .test_queue_worker import LIMIT_S, runs_of, submit_trainer, worker_kwargs


class LogEvents(logging.Handler):
    """Sets an event when the worker logs a line containing a given text (the worker logs
    from the event loop's thread, so setting an anyio event here is safe)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[tuple[str, anyio.Event]] = []

    def event(self, text: str) -> anyio.Event:
        event = anyio.Event()
        self.waiting.append((text, event))
        return event

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for text, event in self.waiting:
            if text in message:
                event.set()


@pytest.fixture
def log_events() -> Iterator[LogEvents]:
    handler = LogEvents()
    logger = logging.getLogger("asyncsoak.queue")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.create_database()


async def wait_stale(store: JobStore, job_id: int, stale_after: float) -> None:
    """Until the job's heartbeat is older than ``stale_after`` by the database's clock."""
    with anyio.fail_after(LIMIT_S):
        while True:
            job = store.get(job_id)
            assert job.heartbeat_at is not None
            if store.now() - job.heartbeat_at > stale_after:
                return
            await anyio.sleep(0.05)


def host_argv(host: str, *argv: str) -> list[str]:
    """``argv`` run under a host name of its own (a new UTS namespace)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


@pytest.fixture(scope="session")
def second_hosts() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no second host name")
    probe = subprocess.run(host_argv("probe", "true"), capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a UTS namespace here: {probe.stderr.decode().strip()}")


# --- wake-ups --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_idle_worker_starts_a_new_job_on_notify(
    tmp_path: Path, pg_url: str, ready: ReadyFifo, log_events: LogEvents
) -> None:
    """An idle worker polling every 10 minutes starts a job submitted now: NOTIFY wakes it."""
    idle = log_events.event("started on")
    stop = anyio.Event()
    with open_store(pg_url) as store, anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            kwargs = worker_kwargs(tmp_path, poll_seconds=600.0, once=False, stop_event=stop)
            tg.start_soon(lambda: run_worker(store, **kwargs))
            await idle.wait()
            job_id = submit_trainer(store, tmp_path, ready, "exit0")
            assert await ready.line() == "started 1"
            stop.set()
        assert store.get(job_id).status == "succeeded"


@pytest.mark.asyncio
async def test_a_worker_says_it_started_once_its_listener_has(
    tmp_path: Path, pg_url: str, log_events: LogEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "started on" means a submission is heard from then on: it is said after the listener
    has connected (said before it, a server restarted meanwhile was the listener's first
    connection, and "listening again" never came: the reconnect test failed under load)."""
    said = log_events.event("started on")
    listened = anyio.Event()
    stop = anyio.Event()
    with open_store(pg_url) as store, anyio.fail_after(LIMIT_S):
        listen = store.listen

        async def slow_listen(wake: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            assert not said.is_set(), "started before its listener"
            listened.set()
            await listen(wake, task_status=task_status)

        monkeypatch.setattr(store, "listen", slow_listen)
        async with anyio.create_task_group() as tg:
            kwargs = worker_kwargs(tmp_path, poll_seconds=600.0, once=False, stop_event=stop)
            tg.start_soon(lambda: run_worker(store, **kwargs))
            await said.wait()
            assert listened.is_set()
            stop.set()


@pytest.mark.asyncio
async def test_a_cancelled_listener_closes_its_connection(pg_url: str) -> None:
    """A worker's stop cancels its listener: the connection is closed, not left to the
    garbage collector (an open one is a ResourceWarning, an error here)."""
    with open_store(pg_url) as store, anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            await tg.start(store.listen, lambda payload: None)
            tg.cancel_scope.cancel()
    gc.collect()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_lost_listening_connection_reconnects(
    tmp_path: Path, own_pg_cluster: PgCluster, ready: ReadyFifo, log_events: LogEvents
) -> None:
    """After a server restart the idle worker listens again (with backoff) and a job
    submitted then still starts at once, long before its 10-minute poll."""
    url = own_pg_cluster.create_database()
    idle = log_events.event("started on")
    again = log_events.event("listening for new jobs again")
    stop = anyio.Event()
    with open_store(url) as store, anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            kwargs = worker_kwargs(tmp_path, poll_seconds=600.0, once=False, stop_event=stop)
            tg.start_soon(lambda: run_worker(store, **kwargs))
            await idle.wait()
            await anyio.to_thread.run_sync(own_pg_cluster.restart)
            await again.wait()
            with open_store(url) as submitter:  # the worker's connection was cut: its own
                job_id = submit_trainer(submitter, tmp_path, ready, "exit0")
            assert await ready.line() == "started 1"
            stop.set()
        assert store.get(job_id).status == "succeeded"


# --- two hosts -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("second_hosts")
@pytest.mark.asyncio
async def test_orphan_of_another_host_is_requeued_without_touching_its_processes(
    tmp_path: Path, pg_url: str, ready: ReadyFifo
) -> None:
    """A job whose worker on host-a died becomes an orphan by heartbeat alone; the worker on
    host-b takes it over, leaves host-a's processes alone, notes so, and runs it again; every
    host reads the same history."""
    store = open_store(pg_url)
    job_id = submit_trainer(store, tmp_path, ready, "escaping-helper", max_attempts=2)
    runs = str(tmp_path / "runs")
    worker = [sys.executable, "-m", "asyncsoak", "worker", "--db", pg_url, "--no-gpu",
              "--poll", "0.1", "--stale-after", "1", "--runs-dir", runs]  # fmt: skip
    helper_pid = None
    try:
        async with await anyio.open_process(
            host_argv("host-a", *worker), cwd=REPO, env=CLI_ENV, stderr=subprocess.DEVNULL
        ) as worker_a:
            assert await ready.line() == "started 1"
            helper_pid = int(await ready.line())
            kill_worker_and_its_reapers(worker_a.pid)
            with anyio.fail_after(LIMIT_S):
                await worker_a.wait()
        assert store.get(job_id).host == "host-a"
        await wait_stale(store, job_id, 1.0)
        with anyio.fail_after(LIMIT_S):
            b = await anyio.run_process(
                host_argv("host-b", *worker, "--once"), cwd=REPO, env=CLI_ENV, check=False
            )
        assert b.returncode == 0, b.stderr.decode()
        assert await ready.line() == "started 2"
        # Process ids mean nothing on another host: host-a's helper was not touched.
        assert alive(helper_pid)
        history = store.attempts(job_id)
        assert [(a.host, a.outcome, a.reason) for a in history] == [
            ("host-a", "failed", "orphaned"),
            ("host-b", "succeeded", None),
        ]
        assert history[0].note is not None
        assert "ran on host-a, whose processes were not touched from host-b" in history[0].note
        assert history[1].summary is not None
        assert history[1].summary["verdict"] == "passed"

        def on_host_b(*args: str) -> str:
            done = subprocess.run(
                host_argv("host-b", sys.executable, "-m", "asyncsoak", *args, "--db", pg_url),
                cwd=REPO, env=CLI_ENV, capture_output=True, text=True, timeout=LIMIT_S,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout

        print(on_host_b("jobs"))
        [listed] = json.loads(on_host_b("jobs", "--json"))
        assert (listed["id"], listed["status"], listed["attempt"]) == (job_id, "succeeded", 2)
        assert listed["worker"].startswith("host-b:")
        shown = on_host_b("job", str(job_id))
        print(shown)
        assert "whose processes were not touched from host-b" in shown
        assert "soak verdict  passed" in shown
        assert runs_of(tmp_path) == [f"{job_id} 1", f"{job_id} 2"]
    finally:
        if helper_pid is not None and alive(helper_pid):
            os.kill(helper_pid, signal.SIGKILL)
        store.close()


# --- the database going away -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_database_restart_mid_job_loses_nothing(
    tmp_path: Path, own_pg_cluster: PgCluster, ready: ReadyFifo, log_events: LogEvents
) -> None:
    """``pg_ctl restart`` while a job runs: the job runs on, the worker reconnects, and the
    attempt's outcome is written once, by the worker that ran it."""
    url = own_pg_cluster.create_database()
    go = tmp_path / "go"
    back = log_events.event("the queue database is back")
    lost = log_events.event("the queue database is unavailable")
    with open_store(url) as store:
        job_id = submit_trainer(store, tmp_path, ready, "wait-go", str(go))
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_worker(store, **worker_kwargs(tmp_path, name="w")))
                assert await ready.line() == "started 1"
                await anyio.to_thread.run_sync(own_pg_cluster.restart)
                await lost.wait()
                await back.wait()
                go.touch()
        job = store.get(job_id)
        assert (job.status, job.attempt, job.worker) == ("succeeded", 1, "w")
        assert [(a.outcome, a.worker) for a in store.attempts(job_id)] == [("succeeded", "w")]
        assert runs_of(tmp_path) == [f"{job_id} 1"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cut_longer_than_stale_after_spools_the_outcome_and_delivers_it(
    tmp_path: Path, own_pg_cluster: PgCluster, ready: ReadyFifo, log_events: LogEvents
) -> None:
    """The database away for longer than --stale-after while a job ends: the soak finishes
    unsupervised by the database, the final write is retried, kept in the spool, and delivered
    when the database is back; the job is not rerun."""
    url = own_pg_cluster.create_database()
    go = tmp_path / "go"
    spooled = log_events.event("final status kept in")
    delivered = log_events.event("delivered from the spool")
    stop = anyio.Event()
    stale_after = 1.0
    with open_store(url) as store:
        job_id = submit_trainer(store, tmp_path, ready, "wait-go", str(go))
        kwargs = worker_kwargs(
            tmp_path, name="w", once=False, stop_event=stop, orphan_after_seconds=stale_after,
            finish_retries=2, finish_retry_wait_seconds=0.1,
        )  # fmt: skip
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_worker(store, **kwargs))
                assert await ready.line() == "started 1"
                await anyio.to_thread.run_sync(own_pg_cluster.stop)
                go.touch()
                await spooled.wait()
                assert list((tmp_path / "runs" / ".spool").iterdir())
                # The cut outlasts --stale-after: the job's heartbeat is stale when it ends.
                await anyio.sleep(stale_after + 0.5)
                await anyio.to_thread.run_sync(own_pg_cluster.start)
                await delivered.wait()
                stop.set()
        job = store.get(job_id)
        assert (job.status, job.attempt) == ("succeeded", 1)
        [attempt] = store.attempts(job_id)
        assert (attempt.outcome, attempt.worker) == ("succeeded", "w")
        assert attempt.summary is not None
        assert attempt.summary["verdict"] == "passed"
        assert attempt.note is not None
        assert "delivered late, from the spool" in attempt.note
        assert list((tmp_path / "runs" / ".spool").iterdir()) == []
        assert runs_of(tmp_path) == [f"{job_id} 1"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_job_taken_over_during_a_cut_is_stopped_on_reconnect(
    tmp_path: Path, own_pg_cluster: PgCluster, ready: ReadyFifo, log_events: LogEvents
) -> None:
    """A worker cut off from the database for longer than --stale-after, whose job another
    worker took over meanwhile, stops its trainer as soon as it reconnects and writes nothing."""
    url = own_pg_cluster.create_database()
    taken = log_events.event("taken over by another worker")
    with open_store(url) as store:
        job_id = submit_trainer(store, tmp_path, ready, "wait-stdin")
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_worker(store, **worker_kwargs(tmp_path, name="cut")))
                assert await ready.line() == "started 1"
                await anyio.to_thread.run_sync(own_pg_cluster.stop)
                await anyio.sleep(1.5)  # the cut outlasts a --stale-after of 1 s
                await anyio.to_thread.run_sync(own_pg_cluster.start)
                with open_store(url) as other:
                    # Another host's worker reaches the database first and takes the stale
                    # job over (a compare and swap on the heartbeat: read again if it moved).
                    assert any(other.take_over(other.get(job_id), "other") for _ in range(50))
                await taken.wait()
        job = store.get(job_id)
        assert (job.status, job.worker, job.attempt) == ("running", "other", 1)
        assert [a.outcome for a in store.attempts(job_id)] == [None]
        # The soak stopped the trainer at once (no grace) and recorded why.
        artifact = json.loads(
            (tmp_path / "runs" / str(job_id) / "attempts" / "1" / "soak.json").read_text()
        )
        assert artifact["stop"]["grace_seconds"] == 0
        assert not alive(artifact["exit"]["pid"])


@pytest.mark.slow
def test_calls_fail_fast_while_the_server_is_away(own_pg_cluster: PgCluster) -> None:
    """With the server stopped, store calls fail at once with QueueUnavailableError (backing
    off between connection attempts) and work again once it is back."""
    url = own_pg_cluster.create_database()
    with open_store(url) as store:
        job_id = store.submit(argv=["x"])
        own_pg_cluster.stop()
        started = time.monotonic()
        for _ in range(3):
            with pytest.raises(QueueUnavailableError):
                store.get(job_id)
        assert time.monotonic() - started < 10
        own_pg_cluster.start()
        deadline = time.monotonic() + LIMIT_S
        while True:  # the store reconnects once its backoff has passed
            try:
                assert store.get(job_id).status == "queued"
                break
            except QueueUnavailableError:
                assert time.monotonic() < deadline
                time.sleep(0.1)


# --- clocks ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_host_clock_ten_minutes_ahead_changes_nothing(
    tmp_path: Path, pg_url: str, ready: ReadyFifo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every time is the database's: a worker whose host clock runs ten minutes ahead neither
    takes a live job of another host for an orphan nor writes times from the future."""
    with open_store(pg_url) as store:
        busy = store.submit(argv=["x"], priority=1)
        assert store.claim("elsewhere:1", "elsewhere", tmp_path / "runs") is not None
        job_id = submit_trainer(store, tmp_path, ready, "exit0")
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 600)
        with anyio.fail_after(LIMIT_S):
            assert await run_worker(store, **worker_kwargs(tmp_path, orphan_after_seconds=60)) == 1
        db_now = store.now()
        assert abs(db_now - real_time()) < 60
        other = store.get(busy)
        assert (other.status, other.worker, other.attempt) == ("running", "elsewhere:1", 1)
        mine = store.get(job_id)
        assert mine.status == "succeeded"
        for when in (mine.created_at, mine.started_at, mine.finished_at):
            assert when is not None
            assert db_now - 60 < when <= db_now


# --- the schema ------------------------------------------------------------------------------


@pytest.mark.slow
def test_newer_schema_and_foreign_schema_refused(pg_url: str, pg_cluster: PgCluster) -> None:
    """A database of a newer schema, or with another program's "asyncsoak" schema, is
    refused and left as it was; a database without a queue is not created by readers."""
    with pytest.raises(QueueDatabaseError, match="holds no job queue"):
        open_store(pg_url, create=False)
    open_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE asyncsoak.schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(QueueDatabaseError, match="newer than this asyncsoak"):
        open_store(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        version = conn.execute("SELECT version FROM asyncsoak.schema_version").fetchone()
        assert version == (SCHEMA_VERSION + 1,)
    foreign = pg_cluster.create_database()
    with psycopg.connect(foreign, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA asyncsoak")
        conn.execute("CREATE TABLE asyncsoak.things (x int)")
    with pytest.raises(QueueDatabaseError, match="not asyncsoak's job queue"):
        open_store(foreign)


@pytest.mark.slow
def test_a_version_1_queue_gains_the_attempts_summary_and_note(pg_url: str) -> None:
    """A queue of schema 1 (attempts without ``summary`` and ``note``) is migrated when opened."""
    with open_store(pg_url) as store:
        job_id = store.submit(argv=["true"])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE asyncsoak.attempts DROP COLUMN summary, DROP COLUMN note")
        conn.execute("UPDATE asyncsoak.schema_version SET version = 1")
    with open_store(pg_url) as store:
        job = store.claim("w", "h", Path("/nonexistent/runs"))
        assert job is not None
        assert job.id == job_id
        outcome = Outcome("succeeded", 0, None, None)
        assert store.finish(job_id, job.attempt, "w", outcome, {"verdict": "passed"}, "a note")
        [attempt] = store.attempts(job_id)
    assert (attempt.summary, attempt.note) == ({"verdict": "passed"}, "a note")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        version = conn.execute("SELECT version FROM asyncsoak.schema_version").fetchone()
    assert version == (SCHEMA_VERSION,)


def test_unreachable_server_refused_with_the_password_hidden(tmp_path: Path) -> None:
    """A server that is not there is a clear error naming the URL without its password."""
    url = f"postgresql://me:hunter2@/queue?host={tmp_path}&port=1"
    with pytest.raises(QueueDatabaseError, match="cannot connect") as caught:
        PostgresStore(url)
    assert "hunter2" not in str(caught.value)
    assert "postgresql://me@" in str(caught.value)


# --- the command line ------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_on_postgres_by_url_environment_and_pg_variables(
    tmp_path: Path, pg_url: str, pg_cluster: PgCluster
) -> None:
    """--db URL, ASYNCSOAK_DB and ``postgresql:`` with PG* variables reach the same queue;
    ``logs`` of an attempt that ran elsewhere says which host has the file."""
    submitted = asyncsoak_cli("submit", "--db", pg_url, "--name", "a", "--", "true", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)
    dbname = pg_url.split("/")[3].split("?")[0]
    env: dict[str, Any] = {
        **CLI_ENV,
        "PGHOST": str(pg_cluster.dir),
        "PGPORT": str(pg_cluster.port),
        "PGUSER": "postgres",
        "PGDATABASE": dbname,
    }
    listing = subprocess.run(
        [sys.executable, "-m", "asyncsoak", "jobs", "--db", "postgresql:"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LIMIT_S,
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert f"{job_id}  a" in listing.stdout
    with open_store(pg_url) as store:
        assert store.claim("far:1", "far-host", tmp_path / "runs") is not None
    by_env = subprocess.run(
        [sys.executable, "-m", "asyncsoak", "logs", str(job_id)],
        cwd=tmp_path, env={**CLI_ENV, "ASYNCSOAK_DB": pg_url}, capture_output=True, text=True,
        timeout=LIMIT_S,
    )  # fmt: skip
    assert by_env.returncode == 2
    assert "ran on host far-host: its log is there" in by_env.stderr
    bad = asyncsoak_cli("jobs", "--db", "postgresql://[", cwd=tmp_path)
    assert bad.returncode == 2
    assert "queue database" in bad.stderr
