"""The job queue on PostgreSQL: one database shared by workers on many hosts.

Same tables and rules as the SQLite store (``_sqlite.py``), in their own schema
(``asyncsoak``) so the queue can live in a database that holds other things.  What differs:

- Claims lock the chosen row with ``FOR UPDATE SKIP LOCKED``: workers claiming at once take
  different jobs without waiting on each other.
- Every time (submitted, started, heartbeats, finished) is the database's ``now()``, never a
  host's clock, so staleness is right when hosts' clocks disagree.
- Submit, cancel, requeue and a retry's requeue send ``NOTIFY asyncsoak_queue`` with the
  transaction; :meth:`PostgresStore.listen` turns them into wake-ups for idle workers.
- A lost connection is reopened on the next call, after a backoff that grows while the
  server stays away; calls made during the backoff fail at once with
  :class:`QueueUnavailableError`, so nothing waits on a dead server.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from .._contract import public_conninfo, redact_url_passwords
from ._models import (
    ATTEMPT_COLUMNS,
    BACKOFF_MAX_SECONDS,
    BACKOFF_MIN_SECONDS,
    BUSY_TIMEOUT_SECONDS,
    JOB_COLUMNS,
    JOB_STATUSES,
    QUEUED,
    RUNNING,
    SCHEMA_VERSION,
    TERMINAL_STATUSES,
    WORKER_COLUMNS,
    Attempt,
    DatabaseUnreachableError,
    Job,
    JobNotFoundError,
    JobStateError,
    QueueDatabaseError,
    QueueMissingError,
    QueueUnavailableError,
    Submission,
    WorkerInfo,
    WorkerNameInUseError,
    attempt_from_row,
    job_from_row,
)
from ._status import Outcome
from ._store import JobStore, default_data_dir
from ._sweeps import LAST_TABLE, GpuOffer, Sql, claim_filter

_log = logging.getLogger("asyncsoak.queue")

#: The channel of the queue's wake-ups.
CHANNEL = "asyncsoak_queue"
#: Seconds a connection attempt may take.
CONNECT_TIMEOUT_SECONDS = 10
#: Longest a statement may run, in milliseconds (none of the queue's take more than a few).
STATEMENT_TIMEOUT_MS = 30_000
#: The schema holding the queue's tables.
SCHEMA = "asyncsoak"
#: Key of the advisory lock that serialises migrations between workers starting at once.
_MIGRATION_LOCK = 0x61736F6B

_NOW = "extract(epoch FROM now())::float8"

# Each entry migrates the schema from version i to i + 1, in one transaction; version 2 is
# the SQLite store's version 2 (the attempt's summary and note).
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
        f"CREATE TABLE {SCHEMA}.schema_version (version integer NOT NULL)",
        f"INSERT INTO {SCHEMA}.schema_version VALUES (0)",
        f"""
        CREATE TABLE {SCHEMA}.jobs (
            id bigserial PRIMARY KEY,
            name text,
            status text NOT NULL
                CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
            argv jsonb,
            config jsonb,
            cwd text,
            env jsonb NOT NULL DEFAULT '{{}}',
            progress_dir text,
            soak jsonb NOT NULL DEFAULT '{{}}',
            stop_mode text NOT NULL DEFAULT 'stdin'
                CHECK (stop_mode IN ('stdin', 'group', 'leader')),
            priority integer NOT NULL DEFAULT 0,
            attempt integer NOT NULL DEFAULT 0,
            attempts integer NOT NULL DEFAULT 0,
            max_attempts integer NOT NULL CHECK (max_attempts >= 1),
            created_at double precision NOT NULL,
            started_at double precision,
            finished_at double precision,
            heartbeat_at double precision,
            worker text,
            host text,
            cancel_requested boolean NOT NULL DEFAULT false,
            returncode integer,
            reason text,
            error text,
            artifact text,
            CHECK ((argv IS NULL) != (config IS NULL))
        )
        """,
        f"CREATE INDEX jobs_by_claim_order ON {SCHEMA}.jobs (status, priority DESC, id)",
        f"""
        CREATE TABLE {SCHEMA}.attempts (
            job_id bigint NOT NULL REFERENCES {SCHEMA}.jobs (id),
            attempt integer NOT NULL,
            worker text NOT NULL,
            host text NOT NULL,
            started_at double precision NOT NULL,
            finished_at double precision,
            outcome text
                CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'interrupted')),
            reason text,
            returncode integer,
            error text,
            artifact text NOT NULL,
            PRIMARY KEY (job_id, attempt)
        )
        """,
        f"""
        CREATE TABLE {SCHEMA}.workers (
            name text PRIMARY KEY,
            host text NOT NULL,
            pid integer NOT NULL,
            pid_start bigint,
            started_at double precision NOT NULL,
            heartbeat_at double precision NOT NULL,
            stopped_at double precision,
            job_id bigint
        )
        """,
    ),
    (
        f"ALTER TABLE {SCHEMA}.attempts ADD COLUMN summary jsonb",
        f"ALTER TABLE {SCHEMA}.attempts ADD COLUMN note text",
    ),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _conninfo(db: str) -> dict[str, str]:
    """libpq's parameters from ``db``; ``postgresql:`` alone leaves everything to ``PG*``."""
    from psycopg.conninfo import conninfo_to_dict

    if db.rstrip("/") in ("postgresql:", "postgres:"):
        return {}
    try:
        params = conninfo_to_dict(db)
    except Exception as exc:  # psycopg.ProgrammingError: the URL cannot be parsed
        # libpq quotes the words it could not parse, which may be a password's.
        detail = _QUOTED.sub('"…"', redact_url_passwords(str(exc)))
        raise QueueDatabaseError(public_conninfo(db), f"is not a valid URL ({detail})") from None
    return {k: str(v) for k, v in params.items() if v is not None}


_QUOTED = re.compile(r'"[^"]*"')
#: What a server says while it cannot take connections yet (or for now): worth waiting for.
#: Any other refusal from the server itself ("FATAL:": no such database or role, a bad
#: password) needs a person, not a retry.
_TRANSIENT_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery mode",
    "not yet accepting connections",
    "not accepting connections",
    "too many clients",
    "remaining connection slots",
)


def unreachable(detail: str) -> bool:
    """Whether a failed connection attempt (libpq's message) is worth retrying: the server
    was not reached, or said it cannot take connections for now."""
    if "FATAL:" not in detail:
        return True
    return any(phrase in detail for phrase in _TRANSIENT_REFUSALS)


class PostgresStore(JobStore):
    """The queue in a PostgreSQL database (psycopg 3: ``pip install 'asyncsoak[postgres]'``).

    ``db`` is a ``postgresql://`` / ``postgres://`` URL, or ``postgresql:`` to take every
    parameter from libpq's ``PG*`` environment variables.  A password in the URL is kept out
    of :attr:`location` (which child processes see) and handed to them as ``PGPASSWORD``.
    """

    def __init__(
        self,
        db: str,
        *,
        create: bool = True,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise QueueDatabaseError(
                public_conninfo(db),
                "PostgreSQL needs psycopg: pip install 'asyncsoak[postgres]'",
            ) from exc
        self._psycopg = psycopg
        self.clock = clock
        self.busy_timeout = busy_timeout
        params = _conninfo(db)
        self.password = params.pop("password", None)
        self.location = public_conninfo(db)
        self._params = params
        self._lock = threading.RLock()
        self._conn: Any = None
        self._backoff = BACKOFF_MIN_SECONDS
        self._retry_at = 0.0
        self._closed = False
        #: Whether this store created the queue's schema (a fresh database, ``create``).
        self.created = False
        try:
            conn = self._connect()
        except QueueUnavailableError as exc:
            error = DatabaseUnreachableError if unreachable(exc.detail) else QueueDatabaseError
            raise error(self.location, f"cannot connect: {exc.detail}") from None
        try:
            self._migrate(conn, create)
            self._extend(conn)
        except QueueDatabaseError:
            self.close()
            raise
        except psycopg.Error as exc:
            self.close()
            raise QueueDatabaseError(self.location, f"cannot be used as a queue ({exc})") from exc

    # --- connections -------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        options = " ".join(
            filter(
                None,
                (
                    self._params.get("options"),
                    f"-c search_path={SCHEMA}",
                    f"-c lock_timeout={int(self.busy_timeout * 1000)}",
                    f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                ),
            )
        )
        kwargs: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "application_name": "asyncsoak",
            # A server that vanished without closing the connection (a cut network) is
            # noticed within seconds instead of at TCP's default of many minutes.
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.busy_timeout * 2000),
            **self._params,
            "options": options,
        }
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs

    def _connect(self) -> Any:
        """The open connection, opening one if needed; backs off while the server is away."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._closed:
            raise QueueUnavailableError(self.location, "the store is closed")
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            raise QueueUnavailableError(self.location, f"reconnecting in {wait:.1f}s")
        try:
            self._conn = self._psycopg.connect(autocommit=True, **self._connect_kwargs())
        except self._psycopg.Error as exc:
            self._failed()
            raise QueueUnavailableError(self.location, _first_line(exc)) from exc
        self._backoff = BACKOFF_MIN_SECONDS
        return self._conn

    def _failed(self) -> None:
        """A connection attempt failed: the next waits out a backoff that doubles."""
        self._lost()
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_SECONDS)

    def _lost(self) -> None:
        """An open connection broke (the server restarted...): the next call reconnects at
        once, and backs off only if that fails."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    @contextlib.contextmanager
    def _session(self, transaction: bool = False) -> Iterator[Any]:
        """The connection, inside a transaction if asked; a lost connection (or a lock
        held past ``busy_timeout``) becomes :class:`QueueUnavailableError`."""
        psycopg = self._psycopg
        with self._lock:
            conn = self._connect()
            try:
                if transaction:
                    with conn.transaction():
                        yield conn
                else:
                    yield conn
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
                    raise QueueUnavailableError(self.location, _first_line(exc)) from exc
                self._lost()
                raise QueueUnavailableError(self.location, _first_line(exc)) from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None

    def child_environment(self) -> dict[str, str]:
        env = {"ASYNCSOAK_DB": self.location}
        if self.password is not None:
            env["PGPASSWORD"] = self.password
        return env

    def default_runs_dir(self) -> Path:
        return default_data_dir() / "queue.runs"

    def now(self) -> float:
        with self._session() as conn:
            now: float = conn.execute(f"SELECT {_NOW}").fetchone()[0]
        return now

    # --- schema --------------------------------------------------------------------------

    def _schema_version(self, conn: Any) -> int | None:
        """The schema version, or None where the queue's schema does not exist yet."""
        if conn.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone()[0] is None:
            return None
        if conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.schema_version",)).fetchone()[0]:
            version: int = conn.execute(f"SELECT version FROM {SCHEMA}.schema_version").fetchone()[
                0
            ]
            return version
        raise QueueDatabaseError(
            self.location, f"has a schema {SCHEMA!r} that is not asyncsoak's job queue"
        )

    def _check_version(self, version: int | None, create: bool) -> int:
        if version is None:
            if not create:
                raise QueueMissingError(
                    self.location, "holds no job queue (submit a job first, or check --db)"
                )
            return 0
        if version > SCHEMA_VERSION:
            raise QueueDatabaseError(
                self.location,
                f"has schema version {version}, newer than this asyncsoak understands "
                f"({SCHEMA_VERSION}); upgrade asyncsoak",
            )
        return version

    def _migrate(self, conn: Any, create: bool) -> None:
        # Reading the version needs no lock; only a database that needs migrating waits for
        # the advisory lock, then reads the version again (another worker may have done it).
        if self._check_version(self._schema_version(conn), create) == SCHEMA_VERSION:
            return
        # The session's lock, taken before the transaction: a transaction that began before
        # the lock was granted could read the catalog as it was then (a schema just created
        # by another worker not seen) and create it again.
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            with conn.transaction():
                found = self._schema_version(conn)
                self.created = found is None
                version = self._check_version(found, create)
                for statements in _MIGRATIONS[version:]:
                    for statement in statements:
                        conn.execute(statement)
                if version < SCHEMA_VERSION:
                    conn.execute(
                        f"UPDATE {SCHEMA}.schema_version SET version = %s", (SCHEMA_VERSION,)
                    )
        finally:
            # A broken connection releases the lock itself, and its error is the one to see.
            with contextlib.suppress(self._psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

    def _extend(self, conn: Any) -> None:
        """Create the sweep and retry tables (``_sweeps.py``) where they are missing, under
        the migrations' advisory lock (workers starting at once create them once)."""
        if conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.{LAST_TABLE}",)).fetchone()[0]:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            self._ensure_extension(Sql(conn, "%s", 0.0))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Sql]:
        with self._session(transaction=True) as conn:
            yield Sql(conn, "%s", conn.execute(f"SELECT {_NOW}").fetchone()[0], " FOR SHARE")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Sql]:
        with self._session() as conn:
            yield Sql(conn, "%s", 0.0)

    def _submitted(self, sql: Sql, job_ids: Sequence[int]) -> None:
        for job_id in job_ids:
            sql("SELECT pg_notify(?, ?)", (CHANNEL, f"submit {job_id}"))

    # --- the command line's side ---------------------------------------------------------

    def _insert(self, job: Submission) -> int:
        with self._transaction() as sql:
            job_id = self._insert_row(sql, job)
            self._submitted(sql, [job_id])
        return job_id

    def _insert_row(self, sql: Sql, job: Submission) -> int:
        jsonb = _jsonb_type()
        conn = sql.conn
        job_id: int = conn.execute(
            "INSERT INTO jobs (name, status, argv, config, cwd, env, progress_dir, soak, "
            "stop_mode, priority, max_attempts, created_at) "
            f"VALUES (%s, 'queued', %s, %s, %s, %s, %s, %s, %s, %s, %s, {_NOW}) RETURNING id",
            (
                job.name,
                None if job.argv is None else jsonb(job.argv),
                None if job.config is None else jsonb(job.config),
                job.cwd,
                jsonb(job.env),
                job.progress_dir,
                jsonb(job.soak),
                job.stop_mode,
                job.priority,
                job.max_attempts,
            ),
        ).fetchone()[0]
        return job_id

    def get(self, job_id: int) -> Job:
        with self._session() as conn:
            row = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)
            ).fetchone()
        if row is None:
            raise JobNotFoundError(job_id)
        return job_from_row(row)

    def jobs(self, status: str | None = None) -> list[Job]:
        with self._session() as conn:
            if status is None:
                rows = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY id").fetchall()
            elif status == "interrupted":
                rows = conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'queued' AND EXISTS ("
                    "SELECT 1 FROM attempts AS a WHERE a.job_id = jobs.id "
                    "AND a.attempt = jobs.attempt AND a.outcome = 'interrupted') ORDER BY id"
                ).fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE status = %s ORDER BY id", (status,)
                ).fetchall()
        return [job_from_row(row) for row in rows]

    def count_by_status(self) -> dict[str, int]:
        counts = dict.fromkeys(JOB_STATUSES, 0)
        with self._session() as conn:
            for status, count in conn.execute(
                "SELECT status, count(*) FROM jobs GROUP BY status"
            ).fetchall():
                counts[str(status)] = int(count)
        return counts

    def attempts(self, job_id: int) -> list[Attempt]:
        with self._session() as conn:
            rows = conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = %s ORDER BY attempt",
                (job_id,),
            ).fetchall()
        return [attempt_from_row(row) for row in rows]

    def _status_for_update(self, conn: Any, job_id: int) -> str:
        row = conn.execute("SELECT status FROM jobs WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
        if row is None:
            raise JobNotFoundError(job_id)
        status: str = row[0]
        return status

    def cancel(self, job_id: int) -> Job:
        with self._session(transaction=True) as conn:
            status = self._status_for_update(conn, job_id)
            if status == QUEUED:
                conn.execute(
                    "UPDATE jobs SET status = 'cancelled', cancel_requested = true, "
                    f"finished_at = {_NOW}, reason = 'cancelled' WHERE id = %s",
                    (job_id,),
                )
                now = conn.execute(f"SELECT {_NOW}").fetchone()[0]
                self._cancel_dependents(Sql(conn, "%s", now), job_id, "cancelled")
            elif status == RUNNING:
                conn.execute("UPDATE jobs SET cancel_requested = true WHERE id = %s", (job_id,))
            else:
                raise JobStateError(job_id, status, "cancelled", (QUEUED, RUNNING))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"cancel {job_id}"))
        return self.get(job_id)

    def requeue(self, job_id: int) -> Job:
        with self._session(transaction=True) as conn:
            status = self._status_for_update(conn, job_id)
            if status not in TERMINAL_STATUSES:
                raise JobStateError(job_id, status, "requeued", TERMINAL_STATUSES)
            self._requeued(Sql(conn, "%s", conn.execute(f"SELECT {_NOW}").fetchone()[0]), job_id)
            conn.execute(
                "UPDATE jobs SET status = 'queued', cancel_requested = false, attempts = 0, "
                "finished_at = NULL, returncode = NULL, reason = NULL, error = NULL "
                "WHERE id = %s",
                (job_id,),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"requeue {job_id}"))
        return self.get(job_id)

    def workers(self) -> list[WorkerInfo]:
        with self._session() as conn:
            rows = conn.execute(f"SELECT {WORKER_COLUMNS} FROM workers ORDER BY name").fetchall()
        return [WorkerInfo(*row) for row in rows]

    # --- the worker's side -----------------------------------------------------------------

    def register_worker(
        self,
        name: str,
        *,
        host: str,
        pid: int,
        pid_start: int | None,
        alive: Callable[[WorkerInfo], bool],
    ) -> None:
        with self._session(transaction=True) as conn:
            row = conn.execute(
                f"SELECT {WORKER_COLUMNS} FROM workers WHERE name = %s FOR UPDATE", (name,)
            ).fetchone()
            if row is not None:
                previous = WorkerInfo(*row)
                if previous.stopped_at is None and alive(previous):
                    raise WorkerNameInUseError(name, previous.host, previous.pid)
            conn.execute(
                f"INSERT INTO workers ({WORKER_COLUMNS}) "
                f"VALUES (%s, %s, %s, %s, {_NOW}, {_NOW}, NULL, NULL) "
                "ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
                "pid_start = excluded.pid_start, started_at = excluded.started_at, "
                "heartbeat_at = excluded.heartbeat_at, stopped_at = NULL, job_id = NULL",
                (name, host, pid, pid_start),
            )

    def worker_heartbeat(self, name: str) -> None:
        with self._session() as conn:
            conn.execute(f"UPDATE workers SET heartbeat_at = {_NOW} WHERE name = %s", (name,))

    def worker_stopped(self, name: str) -> None:
        with self._session() as conn:
            conn.execute(
                f"UPDATE workers SET heartbeat_at = {_NOW}, stopped_at = {_NOW}, job_id = NULL "
                "WHERE name = %s",
                (name,),
            )

    def claim(
        self,
        worker: str,
        host: str,
        runs_dir: Path,
        *,
        max_duration: float | None = None,
        offer: GpuOffer | None = None,
    ) -> Job | None:
        with self._transaction() as sql:
            conn = sql.conn
            ready, ready_params = claim_filter(offer or GpuOffer(), sql.now)
            row = conn.execute(
                "UPDATE jobs SET status = 'running', attempt = attempt + 1, worker = %s, "
                f"host = %s, started_at = {_NOW}, heartbeat_at = {_NOW}, finished_at = NULL "
                "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' "
                "AND (%s::float8 IS NULL OR soak->>'max_duration_seconds' IS NULL "
                f"OR (soak->>'max_duration_seconds')::float8 <= %s){ready.replace('?', '%s')} "
                "ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) "
                "RETURNING id, attempt",
                (worker, host, max_duration, max_duration, *ready_params),
            ).fetchone()
            if row is None:
                return None
            job_id, attempt = row
            artifact = str(
                runs_dir / str(int(job_id)) / "attempts" / str(int(attempt)) / "soak.json"
            )
            conn.execute("UPDATE jobs SET artifact = %s WHERE id = %s", (artifact, job_id))
            conn.execute(
                "INSERT INTO attempts (job_id, attempt, worker, host, started_at, artifact) "
                f"VALUES (%s, %s, %s, %s, {_NOW}, %s)",
                (job_id, attempt, worker, host, artifact),
            )
            conn.execute(
                f"UPDATE workers SET job_id = %s, heartbeat_at = {_NOW} WHERE name = %s",
                (job_id, worker),
            )
            job = job_from_row(
                conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone()
            )
        return job

    def heartbeat(self, job_id: int, attempt: int, worker: str) -> bool | None:
        with self._session() as conn:
            row = conn.execute(
                f"UPDATE jobs SET heartbeat_at = {_NOW} "
                "WHERE id = %s AND attempt = %s AND worker = %s AND status = 'running' "
                "RETURNING cancel_requested",
                (job_id, attempt, worker),
            ).fetchone()
        return None if row is None else bool(row[0])

    def cancel_requested(self, job_id: int) -> bool:
        with self._session() as conn:
            row = conn.execute(
                "SELECT cancel_requested FROM jobs WHERE id = %s", (job_id,)
            ).fetchone()
        return bool(row and row[0])

    def finish(
        self,
        job_id: int,
        attempt: int,
        worker: str,
        outcome: Outcome,
        summary: Mapping[str, Any] | None = None,
        note: str | None = None,
        *,
        backoff: float = 0.0,
    ) -> bool:
        with self._transaction() as sql:
            conn = sql.conn
            row = conn.execute(
                "SELECT attempts, max_attempts, cancel_requested, host FROM jobs "
                "WHERE id = %s AND attempt = %s AND worker = %s AND status = 'running' FOR UPDATE",
                (job_id, attempt, worker),
            ).fetchone()
            if row is None:
                return False
            decision = self._decide(sql, job_id, attempt, outcome, row[0], row[1], row[2], backoff)
            status, attempts = decision.status, decision.attempts
            note = "; ".join(n for n in (note, decision.note) if n) or None
            conn.execute(
                "UPDATE jobs SET status = %s, attempts = %s, "
                f"finished_at = CASE WHEN %s THEN {_NOW} END, heartbeat_at = NULL, "
                "returncode = %s, reason = %s, error = %s WHERE id = %s",
                (
                    status,
                    attempts,
                    status in TERMINAL_STATUSES,
                    outcome.returncode,
                    outcome.reason,
                    outcome.error,
                    job_id,
                ),
            )
            conn.execute(
                f"UPDATE attempts SET finished_at = {_NOW}, outcome = %s, reason = %s, "
                "returncode = %s, error = %s, summary = %s, note = %s "
                "WHERE job_id = %s AND attempt = %s AND outcome IS NULL",
                (
                    outcome.status,
                    outcome.reason,
                    outcome.returncode,
                    outcome.error,
                    None if summary is None else _jsonb_type()(dict(summary)),
                    note,
                    job_id,
                    attempt,
                ),
            )
            conn.execute(
                "UPDATE workers SET job_id = NULL WHERE name = %s AND job_id = %s", (worker, job_id)
            )
            self._record_decision(sql, job_id, attempt, decision, row[3])
            if status == QUEUED:
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"requeue {job_id}"))
        return True

    def running(self) -> list[tuple[Job, WorkerInfo | None]]:
        with self._session() as conn:
            rows = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'running' ORDER BY id"
            ).fetchall()
            workers = conn.execute(f"SELECT {WORKER_COLUMNS} FROM workers").fetchall()
        by_name = {w.name: w for w in (WorkerInfo(*w) for w in workers)}
        jobs = [job_from_row(row) for row in rows]
        return [(job, by_name.get(job.worker or "")) for job in jobs]

    def take_over(self, job: Job, worker: str) -> bool:
        with self._session() as conn:
            row = conn.execute(
                f"UPDATE jobs SET worker = %s, heartbeat_at = {_NOW} "
                "WHERE id = %s AND attempt = %s AND worker IS NOT DISTINCT FROM %s "
                "AND status = 'running' AND heartbeat_at IS NOT DISTINCT FROM %s RETURNING id",
                (worker, job.id, job.attempt, job.worker, job.heartbeat_at),
            ).fetchone()
        return row is not None

    # --- wake-ups --------------------------------------------------------------------------

    async def listen(
        self,
        wake: Callable[[str], None],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``wake(payload)`` for every notification (``submit 7``, ``cancel 7``...), for
        ever.  A lost connection is reopened after a growing backoff; ``wake("reconnected")``
        then says notifications may have been missed meanwhile."""
        psycopg = self._psycopg
        backoff = BACKOFF_MIN_SECONDS
        started = False
        while True:
            try:
                with anyio.fail_after(CONNECT_TIMEOUT_SECONDS + 1):
                    conn = await psycopg.AsyncConnection.connect(
                        autocommit=True, **self._connect_kwargs()
                    )
            except (psycopg.Error, TimeoutError):
                if not started:
                    started = True
                    task_status.started()
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
                continue
            try:
                async with conn:
                    with anyio.fail_after(self.busy_timeout + 1):
                        await conn.execute(f"LISTEN {CHANNEL}")
                    backoff = BACKOFF_MIN_SECONDS
                    if started:
                        _log.info("queue database %s: listening for new jobs again", self.location)
                        wake("reconnected")
                    else:
                        started = True
                        task_status.started()
                    async for notify in conn.notifies():
                        wake(notify.payload)
            except (psycopg.Error, TimeoutError):
                pass
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)


def _jsonb_type() -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
