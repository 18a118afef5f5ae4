"""The job queue's records and errors, shared by both stores: jobs, attempts, workers, and the
rules every backend applies the same way (what a submission may hold, how an attempt's end
moves its job)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._contract import (
    AsyncsoakError,
    Masker,
    ValidationError,
    argv_secrets,
    redact_mapping,
    secret_values,
)
from .._supervisor import SOAK_LIMITS as SOAK_LIMITS
from .._supervisor import StopMode, validate_job
from ._status import CANCELLED, FAILED, INTERRUPTED, SUCCEEDED, Outcome
from ._status import QUEUED as QUEUED
from ._status import RUNNING as RUNNING

#: Statuses a job can be in; ``interrupted`` is an attempt's outcome (the job returns to queued).
JOB_STATUSES: tuple[str, ...] = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL_STATUSES: tuple[str, ...] = (SUCCEEDED, FAILED, CANCELLED)
DEFAULT_MAX_ATTEMPTS = 3
#: Priorities and job ids are SQLite INTEGERs: signed 64-bit (PostgreSQL's bigint too).
INTEGER_MAX = 2**63 - 1
#: How long a statement waits for another connection's write lock, in seconds.
BUSY_TIMEOUT_SECONDS = 5.0
#: The version of the queue's schema this code reads and writes (every backend has it).
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
    """The database holds no queue yet (an SQLite file not created, a PostgreSQL database
    without the queue's schema): readers show an empty queue, workers create it."""


class DatabaseUnreachableError(QueueDatabaseError):
    """The database server cannot be reached (down, booting, cut off): a worker waits for it
    (``--wait-for-db``), the other commands for a few seconds."""


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
        super().__init__(
            f"job {job_id} is {status}; only {' or '.join(allowed)} jobs can be {action}"
        )


class WorkerNameInUseError(QueueError):
    def __init__(self, name: str, host: str, pid: int) -> None:
        self.name = name
        super().__init__(
            f"a live worker named {name!r} already runs (pid {pid} on {host}); "
            "choose another --name"
        )


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the store holds it.  ``attempt`` counts every claim (it fences writes);
    ``attempts`` counts the attempts that go against ``max_attempts`` (failures, orphans)."""

    id: int
    name: str | None
    status: str
    argv: list[str] | None
    config: dict[str, Any] | None
    cwd: str | None
    env: dict[str, str]
    progress_dir: str | None
    soak: dict[str, Any]
    stop_mode: StopMode
    priority: int
    attempt: int
    attempts: int
    max_attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    worker: str | None
    host: str | None
    cancel_requested: bool
    returncode: int | None
    reason: str | None
    error: str | None
    artifact: str | None
    #: Attempts that ended ``interrupted``, and how the latest attempt ended (None: running).
    interruptions: int
    last_outcome: str | None

    def to_public_dict(self) -> dict[str, Any]:
        """The job for printing: environment values are never shown, only their names, and
        secrets are masked in the command and redacted in the config."""
        data = asdict(self)
        data["env"] = sorted(self.env)
        if self.argv is not None:
            secrets = secret_values(os.environ, self.env) | argv_secrets(self.argv)
            data["argv"] = Masker(secrets).argv(self.argv)
        if self.config is not None:
            data["config"] = redact_mapping(self.config)
        return data


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job; kept for ever, written once when it ends."""

    job_id: int
    attempt: int
    worker: str
    host: str
    started_at: float
    finished_at: float | None
    outcome: str | None
    reason: str | None
    returncode: int | None
    error: str | None
    artifact: str
    #: What the attempt's artifact said (verdict, failures, warnings, trends), kept in the
    #: database so every host can show it; None while it runs or when no artifact was written.
    summary: dict[str, Any] | None = None
    #: What the worker that ended the attempt wants a reader to know (a takeover from
    #: another host, an outcome delivered late from the spool).
    note: str | None = None

    @property
    def directory(self) -> Path:
        """``<runs>/<id>/attempts/<k>/``: its ``train.log``, ``soak.json`` and journal."""
        return Path(self.artifact).parent


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    name: str
    host: str
    pid: int
    pid_start: int | None
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    job_id: int | None


JOB_COLUMNS = (
    "id, name, status, argv, config, cwd, env, progress_dir, soak, stop_mode, priority, attempt, "
    "attempts, max_attempts, created_at, started_at, finished_at, heartbeat_at, worker, host, "
    "cancel_requested, returncode, reason, error, artifact, "
    "(SELECT count(*) FROM attempts AS a WHERE a.job_id = jobs.id AND a.outcome = 'interrupted'), "
    "(SELECT a.outcome FROM attempts AS a WHERE a.job_id = jobs.id AND a.attempt = jobs.attempt)"
)


ATTEMPT_COLUMNS = (
    "job_id, attempt, worker, host, started_at, finished_at, outcome, reason, returncode, "
    "error, artifact, summary, note"
)
WORKER_COLUMNS = "name, host, pid, pid_start, started_at, heartbeat_at, stopped_at, job_id"


def _from_json(value: Any) -> Any:
    # SQLite keeps JSON as text; PostgreSQL's jsonb arrives decoded.
    return json.loads(value) if isinstance(value, str) else value


def job_from_row(row: Sequence[Any]) -> Job:
    values = list(row)
    for index in (3, 4, 6, 8):  # argv, config, env, soak
        values[index] = _from_json(values[index])
    values[20] = bool(values[20])
    return Job(*values)


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    values = list(row)
    values[11] = _from_json(values[11])
    return Attempt(*values)


def attempt_outcome(
    outcome: Outcome, attempts: int, max_attempts: int, cancel_requested: bool
) -> tuple[str, int]:
    """The job's status after an attempt ended with ``outcome``, and its counted attempts.

    A failure counts against ``max_attempts`` and requeues the job while attempts remain; an
    interruption requeues it without counting.
    """
    if outcome.status == FAILED:
        attempts += 1
        return (QUEUED if attempts < max_attempts and not cancel_requested else FAILED), attempts
    if outcome.status == INTERRUPTED:
        return (CANCELLED if cancel_requested else QUEUED), attempts
    return outcome.status, attempts


def artifact_summary(artifact: Mapping[str, Any]) -> dict[str, Any]:
    """What every host should see of an attempt's artifact, which lives on one host only."""
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
    warnings = [str(w) for w in artifact.get("warnings") or []]
    return {
        "verdict": artifact.get("status"),
        "failures": failures,
        "warnings": warnings,
        "trends": trends,
    }


@dataclass(frozen=True, slots=True)
class Submission:
    """A job as checked at submit time, ready for a backend to insert."""

    name: str | None
    argv: list[str] | None
    config: dict[str, Any] | None
    cwd: str | None
    env: dict[str, str]
    progress_dir: str | None
    soak: dict[str, Any]
    stop_mode: str
    priority: int
    max_attempts: int


def validate_submission(
    *,
    argv: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress_dir: str | os.PathLike[str] | None = None,
    soak: Mapping[str, Any] | None = None,
    stop_mode: str = "stdin",
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> dict[str, Any]:
    """Refuse, at submit time, what ``run_soak`` would refuse when the job runs (the same
    checks); returns the checked soak limits."""
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
        limits=soak or {},
    )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError("the priority must be an integer")
    if not -INTEGER_MAX <= priority <= INTEGER_MAX:
        raise ValidationError(f"the priority must be between {-INTEGER_MAX} and {INTEGER_MAX}")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValidationError("max attempts must be an integer >= 1")
    if max_attempts > INTEGER_MAX:
        raise ValidationError(f"max attempts must be at most {INTEGER_MAX}")
    return limits
