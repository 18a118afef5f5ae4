"""The job queue's records, errors and schema (each backend's DDL derived from the records'
fields), and the checks of a submission, shared by both stores."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypedDict, Unpack

from .._analysis import artifact_gpus, highest_step
from .._contract import (
    AsyncsoakError,
    Masker,
    ValidationError,
    argv_secrets,
    redact_mapping,
    secret_values,
)
from .._supervisor import StopMode, validate_job
from ..trainer import Job as Job
from ..trainer import column, select_list
from ._status import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED

#: Statuses a job can be in; ``interrupted`` is an attempt's outcome (the job returns to queued).
JOB_STATUSES: tuple[str, ...] = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL_STATUSES: tuple[str, ...] = (SUCCEEDED, FAILED, CANCELLED)
DEFAULT_MAX_ATTEMPTS = 3
#: Priorities and job ids are signed 64-bit (SQLite's INTEGER, PostgreSQL's bigint).
INTEGER_MAX = 2**63 - 1
#: The most ``--max-attempts`` and ``--finish-retries``.
MAX_TRIES = 1000
BUSY_TIMEOUT_SECONDS = 5.0
SCHEMA_VERSION = 2
#: First and longest wait before reconnecting to a database that went away, in seconds.
BACKOFF_MIN_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0


class QueueError(AsyncsoakError):
    """Base of the job queue's errors: bad input or state, reported without changing anything."""


class QueueDatabaseError(QueueError):
    """The queue database cannot be used (missing, corrupt, too new, on a network filesystem)."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"queue database {path}: {problem}")


class QueueMissingError(QueueDatabaseError):
    """The database holds no queue yet: readers show an empty queue, workers create it."""


class QueueDatabaseLostError(QueueDatabaseError):
    """The worker's SQLite file was deleted or replaced while it ran: it claimed no more jobs
    and stopped once its running ones ended."""


class DatabaseUnreachableError(QueueDatabaseError):
    """The database server cannot be reached: a worker waits for it (``--wait-for-db``), the
    other commands for a few seconds."""


class QueueUnavailableError(QueueError):
    """The database cannot be reached now (locked past the busy timeout, connection lost):
    the call changed nothing and may be tried again later."""

    def __init__(self, location: Path | str, detail: str) -> None:
        self.location = location
        self.detail = detail
        super().__init__(f"queue database {location} unavailable: {detail}")


class JobNotFoundError(QueueError):
    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id}")


class JobStateError(QueueError):
    """The job's status does not allow the action (cancelling a finished job...)."""

    def __init__(self, job_id: int, status: str, action: str, allowed: Sequence[str]) -> None:
        self.job_id = job_id
        self.status = status
        only = " or ".join(allowed)
        super().__init__(f"job {job_id} is {status}; only {only} jobs can be {action}")


class WorkerNameInUseError(QueueError):
    def __init__(self, name: str, host: str, pid: int) -> None:
        self.name = name
        super().__init__(
            f"a live worker named {name!r} already runs (pid {pid} on {host}); "
            "choose another --name"
        )


def public_job(job: Job) -> dict[str, Any]:
    """The job for printing: its environment's names only, secrets masked and redacted."""
    data = dataclasses.asdict(job)
    data["env"] = sorted(job.env)
    if job.argv is not None:
        secrets = secret_values(os.environ, job.env) | argv_secrets(job.argv)
        data["argv"] = Masker(secrets).argv(job.argv)
    if job.config is not None:
        data["config"] = redact_mapping(job.config)
    return data


_OUTCOMES = "'succeeded', 'failed', 'cancelled', 'interrupted'"


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job; kept for ever, written once when it ends."""

    TABLE: ClassVar[str] = "attempts"
    CONSTRAINTS: ClassVar[tuple[str, ...]] = ("PRIMARY KEY (job_id, attempt)",)

    job_id: int = column("bigint", required=True, references="jobs")
    attempt: int = column("int", required=True)
    worker: str = column("text", required=True)
    host: str = column("text", required=True)
    started_at: float = column("real", required=True)
    finished_at: float | None = column("real")
    outcome: str | None = column("text", check=f"outcome IN ({_OUTCOMES})")
    reason: str | None = column("text")
    returncode: int | None = column("int")
    error: str | None = column("text")
    artifact: str = column("text", required=True)
    #: What its artifact said (:func:`artifact_summary`), for every host to show.
    summary: dict[str, Any] | None = column("json", since=2)
    #: What the worker that ended it wants a reader to know (a takeover, a late spool).
    note: str | None = column("text", since=2)

    @property
    def directory(self) -> Path:
        """``<runs>/<id>/attempts/<k>/``: its ``train.log``, ``soak.json`` and journal."""
        return Path(self.artifact).parent


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo:
    TABLE: ClassVar[str] = "workers"
    CONSTRAINTS: ClassVar[tuple[str, ...]] = ("PRIMARY KEY (name)",)

    name: str = column("text", required=True)
    host: str = column("text", required=True)
    pid: int = column("int", required=True)
    pid_start: int | None = column("bigint")
    started_at: float = column("real", required=True)
    heartbeat_at: float = column("real", required=True)
    stopped_at: float | None = column("real")
    job_id: int | None = column("bigint")


JOB_COLUMNS = select_list(Job)
ATTEMPT_COLUMNS = select_list(Attempt)
WORKER_COLUMNS = select_list(WorkerInfo)
JOB_KINDS = {f.name: f.metadata.get("kind") for f in dataclasses.fields(Job)}

#: A column kind's SQL type: (SQLite's, PostgreSQL's).
SQL_TYPES = {
    "key": ("INTEGER PRIMARY KEY AUTOINCREMENT", "bigserial PRIMARY KEY"),
    "text": ("TEXT", "text"),
    "json": ("TEXT", "jsonb"),
    "int": ("INTEGER", "integer"),
    "bigint": ("INTEGER", "bigint"),
    "real": ("REAL", "double precision"),
    "bool": ("INTEGER", "boolean"),
}


def _column_ddl(spec: dataclasses.Field[Any], postgres: bool, prefix: str) -> str:
    meta = spec.metadata
    ddl = [spec.name, SQL_TYPES[meta["kind"]][postgres]]
    if meta["references"]:
        ddl.append(f"REFERENCES {prefix}{meta['references']} (id)")
    if meta["required"] and meta["kind"] != "key":
        ddl.append("NOT NULL")
    default = meta["default"]
    if isinstance(default, bool):
        ddl.append(f"DEFAULT {str(default).lower() if postgres else int(default)}")
    elif isinstance(default, int):
        ddl.append(f"DEFAULT {default}")
    elif default is not None:
        text = default if isinstance(default, str) else json.dumps(default)
        ddl.append("DEFAULT '" + text.replace("'", "''") + "'")
    if meta["check"]:
        ddl.append(f"CHECK ({meta['check']})")
    return " ".join(ddl)


def schema_statements(dialect: str, version: int, prefix: str = "") -> list[str]:
    """What brings the queue's tables from schema ``version`` (0: none yet) to
    :data:`SCHEMA_VERSION` on ``dialect``, tables named with ``prefix``."""
    postgres = dialect == "postgres"
    statements = []
    for record in (Job, Attempt, WorkerInfo):
        columns = [f for f in dataclasses.fields(record) if "kind" in f.metadata]
        table = prefix + record.TABLE
        if version == 0:
            body = [_column_ddl(f, postgres, prefix) for f in columns] + list(record.CONSTRAINTS)
            statements.append(f"CREATE TABLE {table} ({', '.join(body)})")
        else:
            statements += [
                f"ALTER TABLE {table} ADD COLUMN {_column_ddl(f, postgres, prefix)}"
                for f in columns
                if f.metadata["since"] > version
            ]
    if version == 0:
        index = f"jobs_by_claim_order ON {prefix}jobs (status, priority DESC, id)"
        statements.append(f"CREATE INDEX {index}")
    return statements


def known_version(version: int, where: Path | str) -> int:
    """``version``, or a :class:`QueueDatabaseError` when newer than this code's schema."""
    if version > SCHEMA_VERSION:
        raise QueueDatabaseError(
            where,
            f"has schema version {version}, newer than this asyncsoak understands "
            f"({SCHEMA_VERSION}); upgrade asyncsoak",
        )
    return version


@dataclasses.dataclass(slots=True)
class Sql:
    """One transaction's connection, for SQL with ``?`` placeholders, and its time;
    ``for_share`` / ``for_update``: PostgreSQL's row locks (SQLite holds everything)."""

    conn: Any
    placeholder: str
    now: float
    for_share: str = ""
    for_update: str = ""

    def __call__(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql.replace("?", self.placeholder), tuple(params))

    def upsert(self, table: str, columns: str, keys: int, params: Sequence[Any]) -> None:
        """Insert a row into ``table``, or update the one whose first ``keys`` columns match."""
        names = columns.split(", ")
        update = ", ".join(f"{c} = excluded.{c}" for c in names[keys:])
        self(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT ({', '.join(names[:keys])}) DO UPDATE SET {update}",
            params,
        )


def artifact_summary(artifact: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What every host should see of an attempt's artifact, which lives on one host only."""
    if artifact is None:
        return None
    failures = [
        {key: f.get(key) for key in ("reason", "message") if key in f}
        for f in artifact.get("failures") or []
        if isinstance(f, Mapping)
    ]
    trends = {
        key: {k: t.get(k) for k in ("verdict", "slope_per_hour", "unit") if k in t}
        for key, t in (artifact.get("trends") or {}).items()
        if isinstance(t, Mapping)
    }
    return {
        "verdict": artifact.get("status"),
        "failures": failures,
        "warnings": [str(w) for w in artifact.get("warnings") or []],
        "trends": trends,
        "goodput": artifact.get("goodput"),
        "step": highest_step(artifact),
        "gpus": artifact_gpus(artifact),
    }


def whole(value: object, low: float = -math.inf, high: float = math.inf) -> bool:
    """Whether ``value`` is an integer (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class JobOptions(TypedDict, total=False):
    """A submission's options: ``JobStore.submit`` and ``validate_submission`` take them."""

    argv: Sequence[str] | None
    config: Mapping[str, Any] | None
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    progress_dir: str | os.PathLike[str] | None
    soak: Mapping[str, Any] | None
    stop_mode: StopMode
    priority: int
    max_attempts: int


def validate_submission(**options: Unpack[JobOptions]) -> dict[str, Any]:
    """Refuse at submit time what ``run_soak`` would refuse; returns the job's columns."""
    if unknown := sorted(options.keys() - JobOptions.__annotations__.keys()):
        raise TypeError(f"submit() got an unexpected keyword argument {unknown[0]!r}")
    argv, config = options.get("argv"), options.get("config")
    cwd, progress_dir = options.get("cwd"), options.get("progress_dir")
    env, stop_mode = options.get("env"), options.get("stop_mode", "stdin")
    priority = options.get("priority", 0)
    max_attempts = options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if (argv is None) == (config is None):
        raise ValidationError("a job needs either a command or a config, not both")
    if config is not None and not isinstance(config, Mapping):
        raise ValidationError("a job's config must be a JSON object")
    limits = validate_job(
        command=argv,
        progress_dir=progress_dir,
        cwd=cwd,
        env=env,
        stop_mode=stop_mode,
        limits=options.get("soak") or {},
    )
    if not whole(priority):
        raise ValidationError("the priority must be an integer")
    if not -INTEGER_MAX <= priority <= INTEGER_MAX:
        raise ValidationError(f"the priority must be between {-INTEGER_MAX} and {INTEGER_MAX}")
    if not whole(max_attempts) or max_attempts < 1:
        raise ValidationError("max attempts must be an integer >= 1")
    if max_attempts > MAX_TRIES:
        raise ValidationError(f"--max-attempts must be at most {MAX_TRIES}, got {max_attempts}")
    return {
        "argv": None if argv is None else list(argv),
        "config": None if config is None else dict(config),
        "cwd": None if cwd is None else os.fspath(cwd),
        "env": dict(env or {}),
        "progress_dir": None if progress_dir is None else os.fspath(progress_dir),
        "soak": limits,
        "stop_mode": stop_mode,
        "priority": priority,
        "max_attempts": max_attempts,
    }
