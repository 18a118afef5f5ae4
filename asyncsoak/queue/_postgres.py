"""The job queue on PostgreSQL, shared by workers on many hosts: the SQLite store's tables in
schema ``asyncsoak``, claims ``FOR UPDATE SKIP LOCKED``, the database's ``now()`` as the clock,
``NOTIFY asyncsoak_queue`` as wake-ups, a lost connection reopened after a growing backoff.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from .._contract import public_conninfo, redact_url_passwords
from ..trainer import PG_SCHEMA
from ._models import (
    BACKOFF_MAX_SECONDS,
    BACKOFF_MIN_SECONDS,
    BUSY_TIMEOUT_SECONDS,
    SCHEMA_VERSION,
    DatabaseUnreachableError,
    QueueDatabaseError,
    QueueMissingError,
    QueueUnavailableError,
    Sql,
    known_version,
    schema_statements,
)
from ._store import JobStore, default_data_dir
from ._sweeps import EXTENSION_DDL, LAST_TABLE

_log = logging.getLogger("asyncsoak.queue")

CHANNEL = "asyncsoak_queue"
CONNECT_TIMEOUT_SECONDS = 10
#: Longest a statement may run (none of the queue's take more than a few).
STATEMENT_TIMEOUT_SECONDS = 30.0
SCHEMA = PG_SCHEMA
#: Key of the advisory lock that serialises migrations between workers starting at once.
_MIGRATION_LOCK = 0x61736F6B
_NOW = "extract(epoch FROM now())::float8"
_QUOTED = re.compile(r'"[^"]*"')
#: What a server says while it cannot take connections for now; any other "FATAL:" refusal
#: (no such database or role, a bad password) needs a person, not a retry.
_TRANSIENT_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery mode",
    "not yet accepting connections",
    "not accepting connections",
    "too many clients",
    "remaining connection slots",
)


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


def unreachable(detail: str) -> bool:
    """Whether a failed connection attempt (libpq's message) is worth retrying: the server
    was not reached, or said it cannot take connections for now."""
    return "FATAL:" not in detail or any(phrase in detail for phrase in _TRANSIENT_REFUSALS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresStore(JobStore):
    """The queue in a PostgreSQL database (psycopg 3) that ``db`` names: a ``postgresql://``
    URL, or ``postgresql:`` for libpq's ``PG*`` variables.  Its password is kept out of
    :attr:`location` (which children see) and handed to them as ``PGPASSWORD``."""

    _soak_max_duration = "soak->>'max_duration_seconds'"
    _claim_lock = " FOR UPDATE SKIP LOCKED"
    _same = "IS NOT DISTINCT FROM"

    def __init__(
        self,
        db: str,
        *,
        create: bool = True,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        clock: Callable[[], float] | None = None,  # SqliteStore's; here the database's now()
    ) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise QueueDatabaseError(
                public_conninfo(db), "PostgreSQL needs psycopg: pip install 'asyncsoak[postgres]'"
            ) from exc
        self._psycopg = psycopg
        self.busy_timeout = busy_timeout
        self._params = _conninfo(db)
        self.password = self._params.get("password")
        self.location = public_conninfo(db)
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
        except QueueDatabaseError:
            self.close()
            raise
        except psycopg.Error as exc:
            self.close()
            raise QueueDatabaseError(self.location, f"cannot be used as a queue ({exc})") from exc

    def _connect_kwargs(self) -> dict[str, Any]:
        options = [
            self._params.get("options"),
            f"-c search_path={SCHEMA}",
            f"-c lock_timeout={int(self.busy_timeout * 1000)}",
            f"-c statement_timeout={int(STATEMENT_TIMEOUT_SECONDS * 1000)}",
        ]
        return {
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
            "options": " ".join(filter(None, options)),
        }

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
            # The next attempt waits out a backoff that doubles.
            self._lost()
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_SECONDS)
            raise QueueUnavailableError(self.location, _first_line(exc)) from exc
        self._backoff = BACKOFF_MIN_SECONDS
        return self._conn

    def _lost(self) -> None:
        """Drop the connection (broken, or the store closing): the next call reconnects."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    @contextlib.contextmanager
    def _session(self, transaction: bool = False) -> Iterator[Any]:
        """The connection, inside a transaction if asked; a lost connection (or a lock
        held past ``busy_timeout``) becomes :class:`QueueUnavailableError`."""
        errors = self._psycopg.errors
        with self._lock:
            conn = self._connect()
            try:
                with conn.transaction() if transaction else contextlib.nullcontext():
                    yield conn
            except (self._psycopg.OperationalError, self._psycopg.InterfaceError) as exc:
                if not isinstance(exc, errors.LockNotAvailable | errors.QueryCanceled):
                    self._lost()
                raise QueueUnavailableError(self.location, _first_line(exc)) from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lost()

    def child_environment(self) -> dict[str, str]:
        password = {} if self.password is None else {"PGPASSWORD": self.password}
        return super().child_environment() | password

    def default_runs_dir(self) -> Path:
        return default_data_dir() / "queue.runs"

    def now(self) -> float:
        return float(self._rows(f"SELECT {_NOW}")[0][0])

    def _schema_version(self, conn: Any, create: bool) -> int:
        """The schema version (0: none yet, to be created), after refusing a database this
        code must not touch (or holding no queue, unless ``create``)."""
        if conn.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone()[0] is None:
            if not create:
                raise QueueMissingError(
                    self.location, "holds no job queue (submit a job first, or check --db)"
                )
            return 0
        if not conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.schema_version",)).fetchone()[0]:
            raise QueueDatabaseError(
                self.location, f"has a schema {SCHEMA!r} that is not asyncsoak's job queue"
            )
        version = conn.execute(f"SELECT version FROM {SCHEMA}.schema_version").fetchone()[0]
        return known_version(version, self.location)

    def _migrate(self, conn: Any, create: bool) -> None:
        """Bring the schema and the sweeps' tables up to date; only a database that needs it
        waits for the advisory lock, then reads the version again."""
        last = f"{SCHEMA}.{LAST_TABLE}"
        if (
            self._schema_version(conn, create) == SCHEMA_VERSION
            and conn.execute("SELECT to_regclass(%s)", (last,)).fetchone()[0]
        ):
            return
        # Before the transaction: one begun before the lock was granted could read the catalog
        # as it was then (not seeing a schema just created) and create it again.
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            with conn.transaction():
                version = self._schema_version(conn, create)
                if version == 0:
                    self.created = True
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                    conn.execute(f"CREATE TABLE {SCHEMA}.schema_version (version integer NOT NULL)")
                    conn.execute(f"INSERT INTO {SCHEMA}.schema_version VALUES (0)")
                for statement in schema_statements("postgres", version, f"{SCHEMA}."):
                    conn.execute(statement)
                for statement in EXTENSION_DDL:
                    conn.execute(statement)
                conn.execute(f"UPDATE {SCHEMA}.schema_version SET version = %s", (SCHEMA_VERSION,))
        finally:
            # A broken connection releases the lock itself, and its error is the one to see.
            with contextlib.suppress(self._psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Sql]:
        with self._session(transaction=True) as conn:
            # now() is the transaction's start: the time every statement of it sees.
            now = conn.execute(f"SELECT {_NOW}").fetchone()[0]
            yield Sql(conn, "%s", now, " FOR SHARE", " FOR UPDATE")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Sql]:
        with self._session() as conn:
            yield Sql(conn, "%s", 0.0)

    def _announce(self, sql: Sql, event: str) -> None:
        sql("SELECT pg_notify(?, ?)", (CHANNEL, event))

    def _json(self, value: Any) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb(value)

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
            conn: Any = None
            try:
                # Shielded from the worker's stop (still bounded): a connect cancelled once the
                # server has answered leaves an open connection nobody can close.
                with anyio.CancelScope(shield=True), anyio.fail_after(CONNECT_TIMEOUT_SECONDS + 1):
                    conn = await psycopg.AsyncConnection.connect(
                        autocommit=True, **self._connect_kwargs()
                    )
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
                if conn is None and not started:
                    started = True
                    task_status.started()
            finally:
                # Shielded: once the worker stops, every await of its scope is cancelled, and
                # an unshielded close (``async with``'s) left the connection open.
                if conn is not None:
                    with anyio.move_on_after(CONNECT_TIMEOUT_SECONDS, shield=True):
                        await conn.close()
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
