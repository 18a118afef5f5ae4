"""The queue's store: the one interface the worker and the command line use, two backends.

:class:`SqliteStore` (``_sqlite.py``) keeps the queue in one file on one host, the embedded
default.  :class:`PostgresStore` (``_postgres.py``) keeps it in a PostgreSQL database shared
by workers on many hosts.  Both keep the same records (``_models.py``) under the same rules:
every method is one short transaction, none is held while a child runs, and every write a
worker makes about an attempt is fenced on ``(id, attempt, worker)`` with its row count
checked, so a worker that lost its job can never overwrite a newer attempt.

``JobStore(db)`` (or :func:`open_store`) opens the backend ``db`` names: a
``postgresql://`` / ``postgres://`` URL, ``postgresql:`` for libpq's ``PG*`` variables, or a
keyword string (``host=db1 dbname=queue``) is PostgreSQL; anything else is the path of an
SQLite file.
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .._supervisor import StopMode
from ._models import (
    BUSY_TIMEOUT_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    Attempt,
    Job,
    Submission,
    WorkerInfo,
    validate_submission,
)
from ._status import Outcome
from ._sweeps import GpuOffer, SweepStore, check_plan, parse_array

#: A libpq keyword connection string ("host=db1 dbname=queue user=me"): it starts with one
#: of libpq's keywords and "=", which no sensible SQLite file name does.
_KEYWORD_CONNINFO = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options"
    r"|connect_timeout|application_name|target_session_attrs)\s*="
)


def is_postgres(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a PostgreSQL database rather than an SQLite file: a URL, or a
    keyword connection string."""
    return isinstance(db, str) and (
        db.startswith(("postgresql:", "postgres:")) or bool(_KEYWORD_CONNINFO.match(db))
    )


def default_data_dir() -> Path:
    """``asyncsoak`` in ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "asyncsoak"


def backend(db: str | os.PathLike[str]) -> type[JobStore]:
    """The store class for ``db`` (see the module docstring)."""
    if is_postgres(db):
        from ._postgres import PostgresStore

        return PostgresStore
    from ._sqlite import SqliteStore

    return SqliteStore


def open_store(db: str | os.PathLike[str], **options: Any) -> JobStore:
    """The store ``db`` names; ``options`` (``create``, ``busy_timeout``...) go to it."""
    return backend(db)(db, **options)


class JobStore(SweepStore):
    """The queue database.  Methods are thread-safe; each is one short transaction.

    Driver errors never escape: a database that cannot be reached or is locked too long
    raises :class:`~asyncsoak.queue.QueueUnavailableError` (nothing was changed; try again),
    bad input or state the other :class:`~asyncsoak.queue.QueueError` subclasses.
    """

    #: How long a statement waits for another connection's lock, in seconds.
    busy_timeout: float = BUSY_TIMEOUT_SECONDS
    #: How child processes and messages name this database (never with a password).
    location: str

    def __new__(cls, *args: Any, **kwargs: Any) -> JobStore:
        # ``JobStore(db)`` opens the backend ``db`` names; the backends construct normally.
        # Python then runs the chosen class's ``__init__`` with the same arguments.
        if cls is JobStore:
            cls = backend(args[0] if args else kwargs.get("db", kwargs.get("path", "")))
        return super().__new__(cls)

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; the store cannot be used afterwards."""

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- where things are --------------------------------------------------------------

    @abc.abstractmethod
    def now(self) -> float:
        """The queue's current time (epoch seconds), the clock its heartbeats are written
        with: the database's own on PostgreSQL, so hosts' clocks never matter."""

    @abc.abstractmethod
    def default_runs_dir(self) -> Path:
        """Where a worker keeps its runs unless told (``--runs-dir``)."""

    def child_environment(self) -> dict[str, str]:
        """What a job's processes need to reach this database (``ASYNCSOAK_DB``...)."""
        return {"ASYNCSOAK_DB": self.location}

    async def listen(
        self,
        wake: Callable[[str], None],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``wake(what)`` whenever a job may be waiting (submitted, cancelled,
        requeued), until cancelled.  A backend without notifications returns at once: its
        workers find new jobs by polling."""
        task_status.started()

    # --- the command line's side ---------------------------------------------------------

    def submit(
        self,
        *,
        argv: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        progress_dir: str | os.PathLike[str] | None = None,
        soak: Mapping[str, Any] | None = None,
        stop_mode: StopMode = "stdin",
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        after: Sequence[int] = (),
        array: str | None = None,
        not_before: float | None = None,
        gpus: int | None = None,
        retry_on: Sequence[str] = (),
        no_retry_on: Sequence[str] = (),
    ) -> int:
        """Queue a job; returns its id.

        ``argv`` may contain ``{job_id}``, ``{db}`` and ``{run_dir}``, replaced when it runs.

        Sweeps (``_sweeps.py``): ``after`` (ids of jobs that must succeed first), ``array``
        (``START-END[:STEP]``: one job per index, ``%a`` in ``argv`` and
        ``ASYNCSOAK_ARRAY_INDEX`` in the environment; the first job's id, returned, is the
        array's), ``not_before`` (the queue's epoch seconds), ``gpus`` (GPUs the job needs
        on one worker), ``retry_on`` / ``no_retry_on`` (reasons, see ``_retry.py``).
        """
        plan = check_plan(
            after=after,
            not_before=not_before,
            gpus=gpus,
            retry_on=retry_on,
            no_retry_on=no_retry_on,
        )
        indices = None if array is None else parse_array(array)
        env = dict(env or {})
        limits = validate_submission(
            argv=argv,
            config=config,
            cwd=cwd,
            env=env,
            progress_dir=progress_dir,
            soak=soak,
            stop_mode=stop_mode,
            priority=priority,
            max_attempts=max_attempts,
        )
        submission = Submission(
            name=name,
            argv=None if argv is None else list(argv),
            config=None if config is None else dict(config),
            cwd=None if cwd is None else os.fspath(cwd),
            env=env,
            progress_dir=None if progress_dir is None else os.fspath(progress_dir),
            soak=limits,
            stop_mode=stop_mode,
            priority=priority,
            max_attempts=max_attempts,
        )
        if plan.is_plain() and indices is None:
            return self._insert(submission)
        return self._insert_planned(submission, plan, indices)

    @abc.abstractmethod
    def _insert(self, job: Submission) -> int:
        """Insert a checked job as ``queued`` (and wake idle workers); returns its id."""

    @abc.abstractmethod
    def get(self, job_id: int) -> Job:
        """One job; :class:`JobNotFoundError` when there is none."""

    @abc.abstractmethod
    def jobs(self, status: str | None = None) -> list[Job]:
        """Jobs in id order; ``status`` may also be ``interrupted``: queued jobs whose last
        attempt was interrupted, waiting to resume."""

    @abc.abstractmethod
    def count_by_status(self) -> dict[str, int]:
        """How many jobs are in each status (every status present, 0 when none)."""

    @abc.abstractmethod
    def attempts(self, job_id: int) -> list[Attempt]:
        """A job's attempts, first first."""

    @abc.abstractmethod
    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job at once, or ask a running one to stop (the worker enforces it)."""

    @abc.abstractmethod
    def requeue(self, job_id: int) -> Job:
        """Queue a finished job again, with its attempts against ``max_attempts`` reset."""

    @abc.abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Every worker that ever registered, by name."""

    # --- the worker's side -----------------------------------------------------------------

    @abc.abstractmethod
    def register_worker(
        self,
        name: str,
        *,
        host: str,
        pid: int,
        pid_start: int | None,
        alive: Callable[[WorkerInfo], bool],
    ) -> None:
        """Record a starting worker; refuses a name held by a live worker (``alive`` decides)."""

    @abc.abstractmethod
    def worker_heartbeat(self, name: str) -> None:
        """Refresh a worker's heartbeat (its current job is set by claim and finish)."""

    @abc.abstractmethod
    def worker_stopped(self, name: str) -> None:
        """Record a worker's clean stop."""

    @abc.abstractmethod
    def claim(
        self,
        worker: str,
        host: str,
        runs_dir: Path,
        *,
        max_duration: float | None = None,
        offer: GpuOffer | None = None,
    ) -> Job | None:
        """Take the next queued job (highest priority, then lowest id) that may run now
        (``_sweeps.claim_filter``: its ``--after`` jobs succeeded, its ``--not-before`` and
        retry backoff passed, its GPUs fit ``offer``), or None; the attempt number is
        incremented in the same statement.

        ``max_duration``: only a job whose ``max_duration_seconds`` is at most this (or that
        sets none); the others are left for a worker with more time (a SLURM allocation
        that ends soon)."""

    @abc.abstractmethod
    def heartbeat(self, job_id: int, attempt: int, worker: str) -> bool | None:
        """Refresh a running job's heartbeat; returns its cancel request, or None when this
        worker no longer owns the attempt (fenced: stop the child, write nothing more)."""

    @abc.abstractmethod
    def cancel_requested(self, job_id: int) -> bool:
        """Whether the job's cancellation was asked for."""

    @abc.abstractmethod
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
        """Record how an attempt ended (with its artifact's ``summary`` and a ``note``);
        False (nothing written) when fenced.  The job's next status follows the retry rules
        (:func:`~asyncsoak.queue._retry.decide`, which explains itself in the note);
        ``backoff`` is the first wait of an infrastructure retry's backoff."""

    @abc.abstractmethod
    def running(self) -> list[tuple[Job, WorkerInfo | None]]:
        """Running jobs with the worker that holds each (for orphan detection)."""

    @abc.abstractmethod
    def take_over(self, job: Job, worker: str) -> bool:
        """Take an orphan from its silent worker, if its heartbeat has not moved since ``job``
        was read (compare and swap); the silent worker is fenced out from then on."""
