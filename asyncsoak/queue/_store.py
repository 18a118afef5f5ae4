"""The queue's store, the worker's and the command line's one interface, implemented by
:class:`SqliteStore` (one host) and :class:`PostgresStore` (many): every method is one short
transaction, and every write about an attempt is fenced on ``(id, attempt, worker)``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import anyio
import anyio.abc

from ..trainer import Job, decoded, select_job
from ._models import (
    ATTEMPT_COLUMNS,
    BUSY_TIMEOUT_SECONDS,
    JOB_COLUMNS,
    JOB_KINDS,
    JOB_STATUSES,
    TERMINAL_STATUSES,
    WORKER_COLUMNS,
    Attempt,
    JobNotFoundError,
    JobOptions,
    JobStateError,
    Sql,
    WorkerInfo,
    WorkerNameInUseError,
    validate_submission,
)
from ._status import INTERRUPTED, QUEUED, RUNNING, Outcome
from ._sweeps import GpuOffer, Plan, SweepStore, array_member, check_plan, claim_filter, parse_array


def default_data_dir() -> Path:
    """``asyncsoak`` in ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "asyncsoak"


class JobStore(SweepStore):
    """The queue database; thread-safe methods, each one short transaction.  Driver errors
    never escape: an unreachable or locked database raises ``QueueUnavailableError`` (nothing
    changed; try again), bad input or state the other ``QueueError`` subclasses."""

    busy_timeout: float = BUSY_TIMEOUT_SECONDS
    #: How child processes and messages name this database (never with a password).
    location: str
    #: The backend's SQL for: a job's ``max_duration_seconds``; the end of a claim's choice
    #: (PostgreSQL skips locked rows); two values being the same, NULL included.
    _soak_max_duration: str
    _claim_lock: str = ""
    _same: str = "IS"

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; the store cannot be used afterwards."""

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @abc.abstractmethod
    def now(self) -> float:
        """The queue's current time (epoch seconds), the clock of its heartbeats."""

    @abc.abstractmethod
    def default_runs_dir(self) -> Path:
        """Where a worker keeps its runs unless told (``--runs-dir``)."""

    def file_lost(self) -> str | None:
        """How the database's file left its path since it was opened, or None."""
        return None

    def child_environment(self) -> dict[str, str]:
        """What a job's processes need to reach this database (``ASYNCSOAK_DB``...)."""
        return {"ASYNCSOAK_DB": self.location}

    async def listen(
        self,
        wake: Callable[[str], None],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``wake(what)`` whenever a job may be waiting, until cancelled.  A backend
        without notifications returns at once: its workers find new jobs by polling."""
        task_status.started()

    @abc.abstractmethod
    def _json(self, value: Any) -> Any:
        """``value`` as the backend's JSON columns take it."""

    def _announce(self, sql: Sql, event: str) -> None:
        """Tell idle workers ``event`` (``submit 7``...) in ``sql``'s transaction (NOTIFY)."""

    def _after_submit(self) -> None:
        """A wake-up that must follow a committed submission (SQLite's)."""

    def submit(
        self,
        *,
        name: str | None = None,
        after: Sequence[int] = (),
        array: str | None = None,
        not_before: float | None = None,
        gpus: int | None = None,
        retry_on: Sequence[str] = (),
        no_retry_on: Sequence[str] = (),
        **options: Unpack[JobOptions],
    ) -> int:
        """Queue a job (an array of jobs: the first's id, the array's); returns its id.
        ``argv`` may contain ``{job_id}``, ``{db}``, ``{run_dir}`` and in an array ``%a``."""
        plan = check_plan(
            after=after,
            not_before=not_before,
            gpus=gpus,
            retry_on=retry_on,
            no_retry_on=no_retry_on,
        )
        indices = None if array is None else parse_array(array)
        job = validate_submission(**options)
        job["name"] = name
        with self._transaction() as sql:
            after_ids = self._check_after(sql, plan.after)
            ids: list[int] = []
            for index in [None] if indices is None else indices:
                member = job if index is None else array_member(job, index)
                values = {
                    k: self._json(v) if JOB_KINDS[k] == "json" and v is not None else v
                    for k, v in member.items()
                }
                values.update(status="queued", created_at=sql.now)
                row = sql(
                    f"INSERT INTO jobs ({', '.join(values)}) "
                    f"VALUES ({', '.join('?' * len(values))}) RETURNING id",
                    tuple(values.values()),
                ).fetchone()
                ids.append(int(row[0]))
                if indices is not None or plan != Plan():
                    self._insert_plan(sql, ids[-1], plan, ids[0], index, after_ids)
                self._announce(sql, f"submit {ids[-1]}")
        self._after_submit()
        return ids[0]

    def get(self, job_id: int) -> Job:
        """One job; :class:`JobNotFoundError` when there is none."""
        with self._reading() as sql:
            job = select_job(sql, job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    def jobs(self, status: str | None = None) -> list[Job]:
        """Jobs in id order; ``status`` may also be ``interrupted``: queued jobs whose last
        attempt was interrupted, waiting to resume."""
        where = ""
        params: tuple[str, ...] = ()
        if status == INTERRUPTED:
            where = (
                " WHERE status = 'queued' AND EXISTS (SELECT 1 FROM attempts AS a WHERE "
                "a.job_id = jobs.id AND a.attempt = jobs.attempt AND a.outcome = 'interrupted')"
            )
        elif status is not None:
            where, params = " WHERE status = ?", (status,)
        rows = self._rows(f"SELECT {JOB_COLUMNS} FROM jobs{where} ORDER BY id", params)
        return [Job(*decoded(Job, row)) for row in rows]

    def count_by_status(self) -> dict[str, int]:
        """How many jobs are in each status (every status present, 0 when none)."""
        rows = self._rows("SELECT status, count(*) FROM jobs GROUP BY status")
        return dict.fromkeys(JOB_STATUSES, 0) | {str(s): int(n) for s, n in rows}

    def attempts(self, job_id: int) -> list[Attempt]:
        """A job's attempts, first first."""
        query = f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY attempt"
        return [Attempt(*decoded(Attempt, row)) for row in self._rows(query, (job_id,))]

    def _status_for_update(self, sql: Sql, job_id: int) -> str:
        """A job's status, its row locked for the rest of the transaction."""
        row = sql(f"SELECT status FROM jobs WHERE id = ?{sql.for_update}", (job_id,)).fetchone()
        if row is None:
            raise JobNotFoundError(job_id)
        return str(row[0])

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job at once, or ask a running one to stop (the worker enforces it)."""
        with self._transaction() as sql:
            status = self._status_for_update(sql, job_id)
            if status == QUEUED:
                sql(
                    "UPDATE jobs SET status = 'cancelled', cancel_requested = TRUE, "
                    "finished_at = ?, reason = 'cancelled' WHERE id = ?",
                    (sql.now, job_id),
                )
                self._cancel_dependents(sql, job_id, "cancelled")
            elif status == RUNNING:
                sql("UPDATE jobs SET cancel_requested = TRUE WHERE id = ?", (job_id,))
            else:
                raise JobStateError(job_id, status, "cancelled", (QUEUED, RUNNING))
            self._announce(sql, f"cancel {job_id}")
        return self.get(job_id)

    def requeue(self, job_id: int) -> Job:
        """Queue a finished job again, with its attempts against ``max_attempts`` reset."""
        with self._transaction() as sql:
            status = self._status_for_update(sql, job_id)
            if status not in TERMINAL_STATUSES:
                raise JobStateError(job_id, status, "requeued", TERMINAL_STATUSES)
            self._requeued(sql, job_id)
            # The job's next wait (its ledger's queue_wait) starts now.
            attempt = sql("SELECT attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            sql.upsert("job_requeues", "job_id, attempt, at", 2, (job_id, attempt, sql.now))
            sql(
                "UPDATE jobs SET status = 'queued', cancel_requested = FALSE, attempts = 0, "
                "finished_at = NULL, returncode = NULL, reason = NULL, error = NULL "
                "WHERE id = ?",
                (job_id,),
            )
            self._announce(sql, f"requeue {job_id}")
        self._after_submit()
        return self.get(job_id)

    def requeue_times(self) -> dict[int, dict[int, float]]:
        """When each finished job was queued again, by job and the attempt it followed."""
        out: dict[int, dict[int, float]] = {}
        for job_id, attempt, at in self._rows("SELECT job_id, attempt, at FROM job_requeues"):
            out.setdefault(int(job_id), {})[int(attempt)] = float(at)
        return out

    def workers(self) -> list[WorkerInfo]:
        """Every worker that ever registered, by name."""
        rows = self._rows(f"SELECT {WORKER_COLUMNS} FROM workers ORDER BY name")
        return [WorkerInfo(*row) for row in rows]

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
        with self._transaction() as sql:
            row = sql(
                f"SELECT {WORKER_COLUMNS} FROM workers WHERE name = ?{sql.for_update}", (name,)
            ).fetchone()
            if row is not None:
                previous = WorkerInfo(*row)
                if previous.stopped_at is None and alive(previous):
                    raise WorkerNameInUseError(name, previous.host, previous.pid)
            row = (name, host, pid, pid_start, sql.now, sql.now, None, None)
            sql.upsert("workers", WORKER_COLUMNS, 1, row)

    def worker_heartbeat(self, name: str) -> None:
        """Refresh a worker's heartbeat (its current job is set by claim and finish)."""
        with self._transaction() as sql:
            sql("UPDATE workers SET heartbeat_at = ? WHERE name = ?", (sql.now, name))

    def worker_stopped(self, name: str) -> None:
        """Record a worker's clean stop."""
        with self._transaction() as sql:
            sql(
                "UPDATE workers SET heartbeat_at = ?, stopped_at = ?, job_id = NULL WHERE name = ?",
                (sql.now, sql.now, name),
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
        """Take the next queued job (highest priority, then lowest id) that may run now and
        fits in ``max_duration`` seconds (a SLURM allocation), or None; its attempt goes up."""
        # Typed casts: PostgreSQL cannot infer the type of a parameter that may be NULL.
        limit = f"CAST({self._soak_max_duration} AS double precision)"
        with self._transaction() as sql:
            ready, ready_params = claim_filter(offer or GpuOffer(), sql.now)
            row = sql(
                "UPDATE jobs SET status = 'running', attempt = attempt + 1, worker = ?, host = ?, "
                "started_at = ?, heartbeat_at = ?, finished_at = NULL "
                "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' "
                f"AND (CAST(? AS double precision) IS NULL OR {limit} IS NULL OR {limit} <= ?)"
                f"{ready} ORDER BY priority DESC, id LIMIT 1{self._claim_lock}) "
                "RETURNING id, attempt",
                (worker, host, sql.now, sql.now, max_duration, max_duration, *ready_params),
            ).fetchone()
            if row is None:
                return None
            job_id, attempt = row
            artifact = str(runs_dir / str(job_id) / "attempts" / str(attempt) / "soak.json")
            sql("UPDATE jobs SET artifact = ? WHERE id = ?", (artifact, job_id))
            sql(
                "INSERT INTO attempts (job_id, attempt, worker, host, started_at, artifact) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, attempt, worker, host, sql.now, artifact),
            )
            sql(
                "UPDATE workers SET job_id = ?, heartbeat_at = ? WHERE name = ?",
                (job_id, sql.now, worker),
            )
            return select_job(sql, job_id)

    def heartbeat(self, job_id: int, attempt: int, worker: str) -> bool | None:
        """Refresh a running job's heartbeat; returns its cancel request, or None when this
        worker no longer owns the attempt (fenced: stop the child, write nothing more)."""
        with self._transaction() as sql:
            row = sql(
                "UPDATE jobs SET heartbeat_at = ? WHERE id = ? AND attempt = ? AND worker = ? "
                "AND status = 'running' RETURNING cancel_requested",
                (sql.now, job_id, attempt, worker),
            ).fetchone()
        return None if row is None else bool(row[0])

    def cancel_requested(self, job_id: int) -> bool:
        """Whether the job's cancellation was asked for."""
        rows = self._rows("SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,))
        return bool(rows and rows[0][0])

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
        """Record how an attempt ended; False (nothing written) when fenced.  The job's next
        status follows ``_retry.decide`` (whose note is added) with ``backoff``."""
        with self._transaction() as sql:
            row = sql(
                "SELECT attempts, max_attempts, cancel_requested, host FROM jobs "
                f"WHERE id = ? AND attempt = ? AND worker = ? AND status = 'running'"
                f"{sql.for_update}",
                (job_id, attempt, worker),
            ).fetchone()
            if row is None:
                return False
            decision = self._judge(sql, job_id, attempt, outcome, row, backoff)
            status = decision.status
            done = sql.now if status in TERMINAL_STATUSES else None
            rc, reason, error = outcome.returncode, outcome.reason, outcome.error
            sql(
                "UPDATE jobs SET status = ?, attempts = ?, finished_at = ?, heartbeat_at = NULL, "
                "returncode = ?, reason = ?, error = ? WHERE id = ?",
                (status, decision.attempts, done, rc, reason, error, job_id),
            )
            kept = None if summary is None else self._json(dict(summary))
            note = "; ".join(n for n in (note, decision.note) if n) or None
            sql(
                "UPDATE attempts SET finished_at = ?, outcome = ?, reason = ?, returncode = ?, "
                "error = ?, summary = ?, note = ? WHERE job_id = ? AND attempt = ? "
                "AND outcome IS NULL",
                (sql.now, outcome.status, reason, rc, error, kept, note, job_id, attempt),
            )
            sql("UPDATE workers SET job_id = NULL WHERE name = ? AND job_id = ?", (worker, job_id))
            if status == QUEUED:
                self._announce(sql, f"requeue {job_id}")
        return True

    def running(self) -> list[tuple[Job, WorkerInfo | None]]:
        """Running jobs with the worker that holds each (for orphan detection)."""
        jobs = self.jobs(RUNNING)
        by_name = {w.name: w for w in self.workers()}
        return [(job, by_name.get(job.worker or "")) for job in jobs]

    def take_over(self, job: Job, worker: str) -> bool:
        """Take an orphan from its silent worker if its heartbeat has not moved since ``job``
        was read (compare and swap), fencing that worker out."""
        same = self._same
        with self._transaction() as sql:
            row = sql(
                f"UPDATE jobs SET worker = ?, heartbeat_at = ? WHERE id = ? AND attempt = ? "
                f"AND worker {same} ? AND status = 'running' AND heartbeat_at {same} ? "
                "RETURNING id",
                (worker, sql.now, job.id, job.attempt, job.worker, job.heartbeat_at),
            ).fetchone()
        return row is not None
