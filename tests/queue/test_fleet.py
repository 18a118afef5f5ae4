"""A fleet: workers started before any job and before their database, the truth about dead
workers, SQLite wake-ups, and passwords in database URLs (issue 25, items 1-3, 6, 7).

Workers run as users run them (``python -m asyncsoak worker``), on real SQLite files and a
real PostgreSQL server; their log lines on stderr are what the tests wait for.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from anyio.abc import Process

from asyncsoak._contract._redact import public_conninfo, redact_url_passwords, secret_values
from asyncsoak.queue import JobStore, SqliteStore, open_store
from asyncsoak.queue._fleet import open_for_worker, open_when_reachable

from ..conftest import CLI_ENV, REPO, ReadyFifo, asyncsoak_cli
from .helpers import FAST_SOAK, JOB_ENV, kill_worker_and_its_reapers, write_script
from .pg_cluster import PgCluster
from .test_queue_postgres import host_argv, second_hosts
from .test_queue_worker import LIMIT_S

__all__ = ["second_hosts"]  # the fixture, used by name below

#: Says which attempt started, then runs until a file exists (every attempt).
WAITING_TRAINER = """
from pathlib import Path
from asyncsoak import trainer
tell(f"started {trainer.attempt()}")
while not Path(sys.argv[1]).exists():
    time.sleep(0.02)
"""


class LoggedWorker:
    """An ``asyncsoak worker`` process whose stderr (its log) the test reads line by line."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._partial = b""

    async def until(self, text: str, timeout: float = LIMIT_S) -> str:
        """The first log line holding ``text``, reading more of the log until it comes."""
        assert self.process.stderr is not None
        with anyio.fail_after(timeout):
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                chunk = await self.process.stderr.receive()
                *whole, self._partial = (self._partial + chunk).split(b"\n")
                self.lines.extend(part.decode(errors="replace") for part in whole)

    async def stop(self) -> str:
        """SIGTERM, then the whole log."""
        assert self.process.stderr is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(LIMIT_S):
            rest = b"".join([chunk async for chunk in self.process.stderr])
            await self.process.wait()
        self.lines.extend((self._partial + rest).decode(errors="replace").splitlines())
        self._partial = b""
        return "\n".join(self.lines)


@asynccontextmanager
async def worker_process(db: str, tmp_path: Path, *options: str) -> AsyncIterator[LoggedWorker]:
    """``asyncsoak worker --db DB`` (no GPU sampling, runs in the test's directory), stopped
    and reaped at the end whatever happened."""
    argv = [sys.executable, "-m", "asyncsoak", "worker", "--db", db, "--no-gpu",
            "--runs-dir", str(tmp_path / "runs"), *options]  # fmt: skip
    process = await anyio.open_process(argv, cwd=REPO, env=CLI_ENV, stdout=subprocess.DEVNULL)
    worker = LoggedWorker(process)
    try:
        yield worker
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.fail_after(LIMIT_S):
                await process.wait()
        await process.aclose()


def submit_waiting(store: JobStore, tmp_path: Path, ready: ReadyFifo, go: Path, **kw: Any) -> int:
    argv = write_script(tmp_path, "waiting.py", WAITING_TRAINER)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    return store.submit(argv=[*argv, str(go)], env=env, soak=FAST_SOAK, **kw)


async def until_status(store: JobStore, job_id: int, *statuses: str) -> None:
    """Until the job is in one of ``statuses`` (read from the database)."""
    with anyio.fail_after(LIMIT_S):
        while True:
            if store.get(job_id).status in statuses:
                return
            await anyio.sleep(0.005)


# --- workers first ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_worker_on_a_new_sqlite_path_waits_and_is_woken_for_each_job(
    tmp_path: Path,
) -> None:
    """A worker started where no queue exists creates it (saying so once), waits, and is woken
    for each job submitted on this host (its wake-up file), not by its poll.  How soon is
    benchmark item 12's figure (idle worker, submit-to-claim latency)."""
    db = tmp_path / "queue.db"
    # A poll far longer than the test's wait: a job that starts at all was woken for.
    poll = str(10 * LIMIT_S)
    async with worker_process(str(db), tmp_path, "--poll", poll) as worker:
        await worker.until("started on")
        with SqliteStore(db, create=False) as store:
            for _ in range(3):
                job_id = store.submit(argv=["true"], soak=FAST_SOAK)
                await until_status(store, job_id, "succeeded", "failed")
                job = store.get(job_id)
                assert job.status == "succeeded"
                assert job.started_at is not None
        log = await worker.stop()
    assert log.count("did not exist: created an empty queue") == 1
    assert (tmp_path / "queue.db-wake").exists()


@pytest.mark.slow
def test_worker_refuses_an_sqlite_path_whose_directory_does_not_exist(tmp_path: Path) -> None:
    """A typo in --db's directory is refused at once (status 2), nothing created."""
    typo = tmp_path / "qeue" / "queue.db"
    done = asyncsoak_cli("worker", "--db", str(typo), "--no-gpu", "--once", cwd=tmp_path)
    assert done.returncode == 2
    assert f"its directory {typo.parent} does not exist (check --db" in done.stderr
    assert not typo.parent.exists()


@pytest.mark.slow
def test_every_backend_opens_with_the_same_options(db: str) -> None:
    """open_store and open_when_reachable hand their options to either backend: code written
    against SQLite (a clock, a busy timeout) opens a PostgreSQL queue unchanged."""
    with open_store(db, clock=time.time, busy_timeout=5.0) as store:
        assert store.jobs() == []
    with open_when_reachable(db, wait=0.0, clock=time.time, busy_timeout=5.0) as store:
        assert store.jobs() == []


def test_readers_list_an_absent_queue_as_empty(tmp_path: Path, db: str) -> None:
    """jobs and workers on a queue that does not exist yet list nothing, job says there is no
    such job; none of them creates the queue."""
    for args, out in ((["jobs"], "no jobs\n"), (["workers", "--json"], "[]\n")):
        done = asyncsoak_cli(*args, "--db", db, cwd=tmp_path)
        assert (done.returncode, done.stdout, done.stderr) == (0, out, ""), args
    done = asyncsoak_cli("job", "1", "--db", db, cwd=tmp_path)
    assert done.returncode == 2
    assert "no job 1" in done.stderr
    if db.startswith("postgresql:"):
        with psycopg.connect(db, autocommit=True) as conn:
            found = conn.execute("SELECT to_regnamespace('asyncsoak')").fetchone()
        assert found == (None,)
    else:
        assert not Path(db).exists()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_worker_on_a_fresh_postgres_database_creates_the_schema_and_runs_the_first_job(
    tmp_path: Path, pg_cluster: PgCluster, ready: ReadyFifo
) -> None:
    """A worker on a database without the queue creates its schema, waits, and runs the
    first job submitted from the command line."""
    url = pg_cluster.create_database()
    go = tmp_path / "go"
    go.touch()
    script = write_script(tmp_path, "waiting.py", WAITING_TRAINER)
    async with worker_process(url, tmp_path, "--poll", "0.2") as worker:
        await worker.until("created its schema")
        await worker.until("started on")
        submit = ["submit", "--db", url, "--env", f"TEST_SIGNALS={ready.path}",
                  "--env", f"PYTHONPATH={REPO}", "--", *script, str(go)]  # fmt: skip
        submitted = await anyio.to_thread.run_sync(lambda: asyncsoak_cli(*submit, cwd=tmp_path))
        assert submitted.returncode == 0, submitted.stderr
        assert await ready.line() == "started 1"
        with open_store(url) as store:
            await until_status(store, int(submitted.stdout), "succeeded", "failed")
            assert store.get(int(submitted.stdout)).status == "succeeded"
        await worker.stop()


@pytest.mark.slow
def test_eight_workers_starting_at_once_create_the_schema_once(
    pg_cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight workers opening a fresh database at the same moment all get the queue; its
    schema is created once (the advisory lock) and one of them says so."""
    url = pg_cluster.create_database()
    barrier = threading.Barrier(8)
    stores: list[JobStore] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait(timeout=LIMIT_S)
            stores.append(open_for_worker(url, wait=10.0))
        except BaseException as exc:
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="asyncsoak.queue")
    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LIMIT_S)
    try:
        assert errors == []
        assert len(stores) == 8
        assert caplog.text.count("created its schema") == 1
        job_id = stores[0].submit(argv=["true"])
        assert [s.get(job_id).id for s in stores] == [job_id] * 8
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM asyncsoak.schema_version").fetchone() == (1,)
    finally:
        for store in stores:
            store.close()


# --- databases that come late or go away ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_worker_started_with_postgres_down_runs_a_job_once_it_starts(
    tmp_path: Path, own_pg_cluster: PgCluster, ready: ReadyFifo
) -> None:
    """A worker whose server is down waits (saying so once), and runs the first job submitted
    once the server is up."""
    url = own_pg_cluster.create_database()
    go = tmp_path / "go"
    go.touch()
    await anyio.to_thread.run_sync(own_pg_cluster.stop)
    async with worker_process(url, tmp_path, "--poll", "0.2") as worker:
        await worker.until("cannot be reached")
        await anyio.to_thread.run_sync(own_pg_cluster.start)
        await worker.until("reached after")
        await worker.until("started on")
        with open_store(url) as store:
            job_id = submit_waiting(store, tmp_path, ready, go)
            assert await ready.line() == "started 1"
            await until_status(store, job_id, "succeeded", "failed")
            assert store.get(job_id).status == "succeeded"
        log = await worker.stop()
    assert log.count("cannot be reached") == 1
    assert "waiting for ever" in log


@pytest.mark.slow
def test_commands_give_up_on_an_unreachable_server_with_their_own_status(
    tmp_path: Path, pg_cluster: PgCluster
) -> None:
    """With no server there, submit, jobs and a worker told --wait-for-db 0.5 exit 75 (not
    2) with the URL's password hidden; a server that refuses the database is not waited for."""
    secret = "hunter2pass"
    url = f"postgresql://me@/queue?host={tmp_path}&port=1&password={secret}"
    for args in (
        ["submit", "--", "true"],
        ["jobs"],
        ["worker", "--no-gpu", "--once"],
    ):
        started = time.monotonic()
        done = asyncsoak_cli(args[0], "--db", url, "--wait-for-db", "0.5", *args[1:], cwd=tmp_path)
        assert done.returncode == 75, (args, done.stderr)
        assert "cannot connect" in done.stderr
        assert secret not in done.stdout + done.stderr
        assert time.monotonic() - started < LIMIT_S
    missing = pg_cluster.url("no_such_database")
    started = time.monotonic()
    refused = asyncsoak_cli("jobs", "--db", missing, "--wait-for-db", "inf", cwd=tmp_path)
    assert refused.returncode == 2
    assert 'database "no_such_database" does not exist' in refused.stderr


@pytest.mark.slow
def test_a_bad_wait_for_db_is_refused(tmp_path: Path) -> None:
    """--wait-for-db takes seconds >= 0 or inf: NaN and negatives are usage errors."""
    for value in ("nan", "-1"):
        done = asyncsoak_cli("jobs", "--db", str(tmp_path / "q.db"), "--wait-for-db", value,
                             cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2
        assert "--wait-for-db" in done.stderr


# --- the truth about workers ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("second_hosts")
@pytest.mark.asyncio
async def test_sigkilled_worker_is_lost_and_its_job_shown_under_the_new_worker_only(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A SIGKILLed worker is lost at once on its host (its process is gone) and, seen from
    another host, once its heartbeat is older than --stale-after; the job another worker took
    over is listed under that worker only."""
    db = tmp_path / "queue.db"
    go = tmp_path / "go"
    store = SqliteStore(db)
    job_id = submit_waiting(store, tmp_path, ready, go, max_attempts=3)

    async def workers(*args: str, host: str | None = None) -> Any:
        """``asyncsoak workers ARGS`` (on another host's name): JSON by name, or the table."""
        argv = [sys.executable, "-m", "asyncsoak", "workers", "--db", str(db), *args]
        done = await anyio.run_process(
            host_argv(host, *argv) if host else argv, cwd=tmp_path, env=CLI_ENV, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
        if "--json" in args:
            return {w["name"]: w for w in json.loads(done.stdout)}
        return done.stdout.decode()

    try:
        async with worker_process(str(db), tmp_path, "--poll", "0.1", "--name", "a") as a:
            assert await ready.line() == "started 1"
            assert (await workers("--json"))["a"]["state"] == "alive"
            kill_worker_and_its_reapers(a.process.pid)
            with anyio.fail_after(LIMIT_S):
                await a.process.wait()
        killed_at = time.time()
        here = (await workers("--json"))["a"]
        assert here["state"] == "lost"
        assert killed_at - 1.0 < here["last_seen"] <= killed_at
        table = await workers()
        print(table)
        assert "lost (last seen 20" in table
        # From a host where its pid means nothing: lost once the heartbeat is 1 s old.
        with anyio.fail_after(LIMIT_S):
            while True:
                far = await workers("--json", "--stale-after", "1", host="far")
                if far["a"]["state"] == "lost":
                    break
                await anyio.sleep(0.1)
        assert time.time() - far["a"]["last_seen"] > 1.0
        async with worker_process(str(db), tmp_path, "--poll", "0.1", "--name", "b") as b:
            # b takes the orphan over (its worker's process is gone) and runs it again.
            assert await ready.line() == "started 2"
            listed = await workers("--json")
            assert (listed["a"]["state"], listed["a"]["jobs"], listed["a"]["job_id"]) == (
                "lost",
                [],
                None,
            )
            assert (listed["b"]["state"], listed["b"]["jobs"]) == ("alive", [job_id])
            go.touch()
            await until_status(store, job_id, "succeeded", "failed")
            await b.stop()
        assert [(a.worker, a.reason) for a in store.attempts(job_id)] == [
            ("a", "orphaned"),
            ("b", None),
        ]
    finally:
        store.close()


@pytest.mark.slow
def test_workers_gone_for_a_day_are_left_out_unless_all(tmp_path: Path) -> None:
    """A worker last seen two days ago is not listed (a line says how many are not), and
    --all lists it as lost with the time it was last seen."""
    db = tmp_path / "queue.db"
    two_days_ago = time.time() - 2 * 86400
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=LIMIT_S, check=True)  # fmt: skip
    with SqliteStore(db, clock=lambda: two_days_ago) as old:
        old.register_worker(
            "old", host="elsewhere", pid=int(gone.stdout), pid_start=None, alive=lambda w: False
        )
    with SqliteStore(db) as store:
        store.register_worker("new", host="elsewhere", pid=1, pid_start=None, alive=lambda w: False)
    shown = asyncsoak_cli("workers", "--db", str(db), cwd=tmp_path)
    assert shown.returncode == 0
    assert "new" in shown.stdout
    assert "old" not in shown.stdout
    assert "(1 worker gone for more than 24h not shown: --all lists them)" in shown.stdout
    every = asyncsoak_cli("workers", "--db", str(db), "--all", "--json", cwd=tmp_path)
    listed = {w["name"]: w for w in json.loads(every.stdout)}
    assert (listed["old"]["state"], listed["new"]["state"]) == ("lost", "alive")
    assert listed["old"]["last_seen"] == pytest.approx(two_days_ago)


# --- secrets in database URLs ---------------------------------------------------------------


def test_public_conninfo_drops_a_password_in_every_form() -> None:
    """user:PW@, ?password=PW and password=PW (quoted or not) leave a URL or a keyword string
    that names the same database; free text loses them too."""
    cases = {
        "postgresql://me:s3cret!x@db1:5432/q?sslmode=require": "postgresql://me@db1:5432/q?sslmode=require",
        "postgresql://me@db1/q?password=s3cret!x&port=5433": "postgresql://me@db1/q?port=5433",
        "postgres://db1/q?password=s3cret!x": "postgres://db1/q",
        "host=db1 password=s3cret!x dbname=q": "host=db1 dbname=q",
        "host=db1 password = 's3cret!x y' dbname=q": "host=db1 dbname=q",
        "postgresql:": "postgresql:",
    }
    for db, public in cases.items():
        assert public_conninfo(db) == public
        assert "s3cret" not in redact_url_passwords(f"cannot connect to {db}: refused")
        if db != "postgresql:":
            assert any(v.startswith("s3cret!x") for v in secret_values({"ASYNCSOAK_DB": db}))


@pytest.mark.slow
def test_password_in_any_form_of_url_never_printed_handed_on_or_recorded(
    tmp_path: Path, pg_cluster: PgCluster
) -> None:
    """Whatever form carries the password, the trainer gets it only as PGPASSWORD, and no
    output, log, artifact or journal holds it."""
    secret = "Hunter2Secret"
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys\n"
        "print('ASYNCSOAK_DB=' + os.environ['ASYNCSOAK_DB'])\n"
        f"ok = os.environ.get('PGPASSWORD') == {secret!r}\n"
        "print('PGPASSWORD ok' if ok else 'no PGPASSWORD')\n"
        "print('argv db=' + sys.argv[1])\n"
    )
    for form in ("userinfo", "query", "keywords"):
        url = pg_cluster.create_database()
        name = url.split("/")[3].split("?")[0]
        where = f"host={pg_cluster.dir}&port={pg_cluster.port}"
        db = {
            "userinfo": f"postgresql://postgres:{secret}@/{name}?{where}",
            "query": f"postgresql://postgres@/{name}?{where}&password={secret}",
            "keywords": f"host={pg_cluster.dir} port={pg_cluster.port} dbname={name} "
            f"user=postgres password={secret}",
        }[form]
        runs = tmp_path / form
        outputs = []
        submitted = asyncsoak_cli(
            "submit",
            "--db",
            db,
            "--sample-interval",
            "0.2",
            "--",
            sys.executable,
            str(script),
            "{db}",
            cwd=tmp_path,
        )
        assert submitted.returncode == 0, submitted.stderr
        worker = asyncsoak_cli(
            "worker", "--db", db, "--no-gpu", "--once", "--runs-dir", str(runs), cwd=tmp_path
        )
        assert worker.returncode == 0, worker.stderr
        outputs += [submitted.stdout, submitted.stderr, worker.stdout, worker.stderr]
        # The views print what the database holds, the same for every form: one form will do.
        views = (["jobs"], ["job", "1"], ["workers", "--json"], ["logs", "1"])
        for args in views if form == "query" else ():
            shown = asyncsoak_cli(*args, "--db", db, cwd=tmp_path)
            assert shown.returncode == 0, (args, shown.stderr)
            outputs.append(shown.stdout + shown.stderr)
        log = (runs / "1" / "attempts" / "1" / "train.log").read_text()
        public = public_conninfo(db)
        assert f"ASYNCSOAK_DB={public}\n" in log, form
        assert f"argv db={public}\n" in log, form
        assert "PGPASSWORD ok" in log, form
        recorded = [p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file()]
        for text in outputs + recorded:
            assert secret not in text, form


def test_ages_in_the_tables_read_whole_units_and_a_time_out_of_range_as_unknown() -> None:
    """A worker's or job's age: seconds, then whole minutes, hours and days; a stored time that
    is not a finite number (a row written by hand or by a broken clock) reads as "-", not as a
    crash of ``workers`` or ``jobs``."""
    from asyncsoak.cli._queue_show import _age

    now = 1_800_000_000.0
    assert [_age(now - s, now) for s in (5, 125, 7300, 3 * 86400 + 5)] == [
        "5s ago",
        "2m ago",
        "2h ago",
        "3d ago",
    ]
    assert _age(None, now) == "-"
    assert _age(float("-inf"), now) == "-"
    assert _age(float("nan"), now) == "-"


def test_workers_reads_proc_only_for_the_workers_alive_by_their_heartbeat() -> None:
    """``workers`` on a host with a long history: a stopped worker or one whose heartbeat is
    already stale is judged without a look at /proc; a live one whose process is gone is lost
    at once."""
    from asyncsoak.queue import WorkerInfo, worker_views

    now = 1_800_000_000.0
    history = [
        WorkerInfo(f"old-{i}", "here", 1000 + i, None, now - 9000, now - 8000, now - 7000, None)
        for i in range(500)
    ]
    stale = WorkerInfo("stale", "here", 7, None, now - 600, now - 500, None, None)
    live = WorkerInfo("live", "here", 8, None, now - 60, now - 1, None, None)
    looked: list[int] = []

    def alive(pid: int, start: int | None) -> bool:
        looked.append(pid)
        return False

    views, _ = worker_views(
        [*history, stale, live], [], now, show_all=True, this_host="here", process_alive=alive
    )
    assert looked == [8]
    assert {v.info.name: v.state for v in views}["live"] == "lost"
    assert {v.state for v in views if v.info.name != "live"} == {"stopped", "lost"}
