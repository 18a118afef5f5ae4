"""Sweeps and retries in the store, for both backends: what a job waits for (``--after``,
``--not-before``, a retry's backoff, ``--gpus N``), arrays, each attempt's retry decision, and
faulted GPUs.  Its tables are created when missing, leaving the numbered schema alone.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._contract import ValidationError
from ._models import INTEGER_MAX, JobNotFoundError, QueueError, Sql, whole
from ._status import (
    CANCELLED,
    DEPENDENCY_FAILED,
    FAILED,
    QUEUED,
    Decision,
    Outcome,
    RetryPolicy,
    check_retry_names,
    decide,
)

#: The same text runs on SQLite and PostgreSQL.
EXTENSION_DDL: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS job_plans (job_id BIGINT PRIMARY KEY REFERENCES jobs (id), "
    "array_id BIGINT, array_index BIGINT, not_before DOUBLE PRECISION, "
    "gpus INTEGER CHECK (gpus IS NULL OR gpus >= 1), retry_on TEXT, no_retry_on TEXT, "
    "infra_failures INTEGER NOT NULL DEFAULT 0, retry_at DOUBLE PRECISION, avoid TEXT)",
    "CREATE INDEX IF NOT EXISTS job_plans_by_array ON job_plans (array_id)",
    "CREATE TABLE IF NOT EXISTS job_deps (job_id BIGINT NOT NULL REFERENCES jobs (id), "
    "after_id BIGINT NOT NULL REFERENCES jobs (id), PRIMARY KEY (job_id, after_id))",
    "CREATE INDEX IF NOT EXISTS job_deps_by_after ON job_deps (after_id)",
    "CREATE TABLE IF NOT EXISTS attempt_causes (job_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
    "gpus TEXT, failure_class TEXT, cause TEXT, counted INTEGER, PRIMARY KEY (job_id, attempt))",
    "CREATE TABLE IF NOT EXISTS worker_gpus (name TEXT PRIMARY KEY, gpus TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS gpu_faults (host TEXT NOT NULL, gpu TEXT NOT NULL, worker TEXT, "
    "job_id BIGINT, attempt INTEGER, at DOUBLE PRECISION NOT NULL, detail TEXT, "
    "PRIMARY KEY (host, gpu))",
    "CREATE TABLE IF NOT EXISTS job_requeues (job_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
    "at DOUBLE PRECISION NOT NULL, PRIMARY KEY (job_id, attempt))",
)
#: The table created last: present means every one is.
LAST_TABLE = "job_requeues"
#: Largest array (``--array START-END[:STEP]``) one submission may make.
MAX_ARRAY_JOBS = 10_000
#: The most GPUs one job may ask for (``--gpus N``), and one more than a worker's highest.
MAX_GPUS = 1024
#: The latest ``--not-before``: the last second of the year 9999 (epoch seconds).
LATEST_TIME = 253_402_300_799.0
#: How long a retried job waits for a worker with a GPU other than the one it failed on.
PREFER_OTHER_GPU_S = 30.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What a job waits for and how its failures are retried (all optional)."""

    after: tuple[int, ...] = ()
    #: Not before this time (the queue's clock, epoch seconds).
    not_before: float | None = None
    #: GPUs the job needs on one worker; None: all the worker's.
    gpus: int | None = None
    retry_on: frozenset[str] = frozenset()
    no_retry_on: frozenset[str] = frozenset()
    array_id: int | None = None
    array_index: int | None = None
    infra_failures: int = 0
    retry_at: float | None = None
    #: GPUs (``host:gpu``) the job failed on for the infrastructure: a retry prefers others.
    avoid: tuple[str, ...] = ()

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.retry_on, self.no_retry_on)


@dataclass(frozen=True, slots=True)
class AttemptCause:
    """How the retry rules judged one attempt (``job N``), and the GPUs it ran on."""

    gpus: tuple[str, ...] = ()
    failure_class: str | None = None
    cause: str | None = None
    counted: bool | None = None


@dataclass(frozen=True, slots=True)
class GpuFault:
    """A GPU taken out of service on a host until an operator clears it."""

    host: str
    gpu: str
    worker: str | None
    job_id: int | None
    attempt: int | None
    at: float
    detail: str | None


@dataclass(frozen=True, slots=True)
class GpuOffer:
    """What a claiming worker can give a job: its free healthy GPUs (``host:gpu``), and whether
    all of them are free (a job without ``--gpus`` takes them all)."""

    free: int = 0
    all_free: bool = True
    names: tuple[str, ...] = ()


def parse_array(text: str) -> range:
    """``START-END[:STEP]`` (both ends included) as a range; a clear error otherwise."""
    spec, _, step_text = text.partition(":")
    start_text, dash, end_text = spec.partition("-")
    try:
        start, end = int(start_text), int(end_text)
        step = int(step_text) if step_text else 1
    except ValueError:
        raise ValidationError(
            f"--array {text!r}: expected START-END[:STEP], such as 0-3 or 0-10:2"
        ) from None
    if not dash or start < 0 or end < start or step < 1 or end > INTEGER_MAX:
        raise ValidationError(
            f"--array {text!r}: expected START-END[:STEP] with 0 <= START <= END <= "
            f"{INTEGER_MAX} and STEP >= 1"
        )
    if (end - start) // step >= MAX_ARRAY_JOBS:
        raise ValidationError(f"--array {text!r}: at most {MAX_ARRAY_JOBS} jobs in one array")
    return range(start, end + 1, step)


def array_member(job: dict[str, Any], index: int) -> dict[str, Any]:
    """An array's job ``index``: ``%a`` in its command (``%%``: ``%``), and in its environment."""
    argv = job["argv"]
    if argv is not None:
        argv = [a.replace("%%", "\0").replace("%a", str(index)).replace("\0", "%") for a in argv]
    return {**job, "argv": argv, "env": {**job["env"], "ASYNCSOAK_ARRAY_INDEX": str(index)}}


def check_plan(
    *,
    after: Sequence[int] = (),
    not_before: float | None = None,
    gpus: int | None = None,
    retry_on: Sequence[str] = (),
    no_retry_on: Sequence[str] = (),
) -> Plan:
    """A submission's sweep options, checked (a clear ``ValidationError``)."""
    for job_id in after:
        if not whole(job_id, 1, INTEGER_MAX):
            raise ValidationError(f"--after: {job_id!r} is not a job id")
    if gpus is not None and not whole(gpus, 1, MAX_GPUS):
        raise ValidationError(f"--gpus: the number of GPUs must be an integer from 1 to {MAX_GPUS}")
    if not_before is not None and (
        not isinstance(not_before, int | float) or not 0 <= not_before <= LATEST_TIME
    ):
        raise ValidationError("--not-before must be a time before the year 10000")
    both = set(retry_on) & set(no_retry_on)
    if both:
        raise ValidationError(f"--retry-on and --no-retry-on both name {', '.join(sorted(both))}")
    return Plan(
        after=tuple(sorted(set(after))),
        not_before=None if not_before is None else float(not_before),
        gpus=gpus,
        retry_on=frozenset(check_retry_names("--retry-on", retry_on)),
        no_retry_on=frozenset(check_retry_names("--no-retry-on", no_retry_on)),
    )


def _names(value: str | None) -> list[Any]:
    loaded = json.loads(value) if value else []
    return loaded if isinstance(loaded, list) else []


def _names_json(names: Sequence[str]) -> str | None:
    return json.dumps(list(names)) if names else None


_PLAN_COLUMNS = (
    "job_id, array_id, array_index, not_before, gpus, retry_on, no_retry_on, infra_failures, "
    "retry_at, avoid"
)


def _plan_from_row(row: Sequence[Any], after: Sequence[int]) -> Plan:
    return Plan(
        after=tuple(sorted(after)),
        array_id=row[1],
        array_index=row[2],
        not_before=row[3],
        gpus=row[4],
        retry_on=frozenset(_names(row[5])),
        no_retry_on=frozenset(_names(row[6])),
        infra_failures=int(row[7] or 0),
        retry_at=row[8],
        avoid=tuple(_names(row[9])),
    )


def claim_filter(offer: GpuOffer, now: float) -> tuple[str, list[Any]]:
    """The SQL condition (and its parameters) a claimable ``jobs`` row meets: its ``--after``
    jobs succeeded, its time came, its retry's backoff passed, its GPUs fit."""
    plan = "SELECT 1 FROM job_plans AS p WHERE p.job_id = jobs.id AND "
    sql = (
        " AND NOT EXISTS (SELECT 1 FROM job_deps AS d JOIN jobs AS dep ON dep.id = d.after_id "
        "WHERE d.job_id = jobs.id AND dep.status <> 'succeeded')"
        f" AND NOT EXISTS ({plan}("
        "p.not_before > ? OR p.retry_at > ? OR (p.gpus IS NOT NULL AND p.gpus > ?)))"
        f" AND (? = 1 OR EXISTS ({plan}p.gpus IS NOT NULL))"
    )
    params: list[Any] = [now, now, offer.free, 1 if offer.all_free else 0]
    # Workers with only the GPUs a retry failed on leave it for PREFER_OTHER_GPU_S.
    if offer.names:
        like = "".join(" AND p.avoid LIKE ?" for _ in offer.names)
        sql += (
            f" AND NOT EXISTS ({plan}p.avoid IS NOT NULL AND p.retry_at IS NOT NULL "
            f"AND p.retry_at > ?{like})"
        )
        params += [now - PREFER_OTHER_GPU_S, *(f'%"{name}"%' for name in offer.names)]
    return sql, params


def pick_gpus(need: int | None, free: Sequence[str], avoid: Sequence[str], host: str) -> list[str]:
    """``need`` of ``free`` (all when None) for a claimed job, those it did not fail on first."""
    if need is None:
        return list(free)
    ranked = sorted(free, key=lambda gpu: f"{host}:{gpu}" in avoid)
    return sorted(ranked[:need], key=list(free).index)


class SweepStore(abc.ABC):
    """The store's sweep and retry side (the base of :class:`~._store.JobStore`)."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Sql]:
        """One write transaction."""

    @abc.abstractmethod
    def _reading(self) -> contextlib.AbstractContextManager[Sql]:
        """The connection for reads, outside any write transaction (``now`` unused)."""

    def _rows(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        """What one read returns, outside any write transaction."""
        with self._reading() as sql:
            return list(sql(query, params).fetchall())

    def _check_after(self, sql: Sql, after: Sequence[int]) -> list[int]:
        """The jobs a submission waits for (an array's id: all its jobs); one missing, failed
        or cancelled refuses it."""
        ids: list[int] = []
        for after_id in after:
            # Held until the dependents are in: a job failing meanwhile then cancels them.
            row = sql(
                f"SELECT status FROM jobs WHERE id = ?{sql.for_share}", (after_id,)
            ).fetchone()
            if row is None:
                raise JobNotFoundError(after_id)
            members = sql(
                "SELECT jobs.id, jobs.status FROM jobs JOIN job_plans AS p "
                f"ON p.job_id = jobs.id WHERE p.array_id = ? ORDER BY jobs.id{sql.for_share}",
                (after_id,),
            ).fetchall()
            for job_id, status in members or [(after_id, row[0])]:
                if status in (FAILED, CANCELLED):
                    raise ValidationError(
                        f"--after {after_id}: job {job_id} is {status}, so this job would "
                        f"never run (requeue job {job_id} first)"
                    )
                ids.append(int(job_id))
        return sorted(set(ids))

    def _insert_plan(
        self, sql: Sql, job_id: int, plan: Plan, array_id: int, index: int | None, after: list[int]
    ) -> None:
        sql(
            f"INSERT INTO job_plans ({_PLAN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 0, NULL, NULL)",
            (
                job_id,
                None if index is None else array_id,
                index,
                plan.not_before,
                plan.gpus,
                _names_json(sorted(plan.retry_on)),
                _names_json(sorted(plan.no_retry_on)),
            ),
        )
        for after_id in after:
            sql("INSERT INTO job_deps (job_id, after_id) VALUES (?, ?)", (job_id, after_id))

    def plans(self, job_ids: Sequence[int] | None = None) -> dict[int, Plan]:
        """The plans of these jobs (of all when None); a job submitted plain has none."""
        rows = self._rows(f"SELECT {_PLAN_COLUMNS} FROM job_plans")
        deps: dict[int, list[int]] = {}
        for job_id, after_id in self._rows("SELECT job_id, after_id FROM job_deps"):
            deps.setdefault(int(job_id), []).append(int(after_id))
        return {
            int(row[0]): _plan_from_row(row, deps.get(int(row[0]), ()))
            for row in rows
            if job_ids is None or int(row[0]) in job_ids
        }

    def plan(self, job_id: int) -> Plan:
        """One job's plan (an empty one for a job submitted plain)."""
        return self.plans([job_id]).get(job_id, Plan())

    def array_members(self, array_id: int) -> list[int]:
        """The jobs of an array, by index; [] when ``array_id`` is not an array's."""
        query = "SELECT job_id FROM job_plans WHERE array_id = ? ORDER BY array_index"
        return [int(row[0]) for row in self._rows(query, (array_id,))]

    def attempt_causes(self, job_id: int) -> dict[int, AttemptCause]:
        """How each attempt of a job was judged, by attempt number."""
        rows = self._rows(
            "SELECT attempt, gpus, failure_class, cause, counted FROM attempt_causes "
            "WHERE job_id = ?",
            (job_id,),
        )
        return {
            int(n): AttemptCause(tuple(_names(gpus)), kind, cause, None if c is None else bool(c))
            for n, gpus, kind, cause, c in rows
        }

    def set_worker_gpus(self, name: str, gpus: Sequence[str]) -> None:
        """Record the GPUs a worker owns (shown by ``workers``)."""
        with self._transaction() as sql:
            sql("DELETE FROM worker_gpus WHERE name = ?", (name,))
            if gpus:
                sql("INSERT INTO worker_gpus (name, gpus) VALUES (?, ?)", (name, _names_json(gpus)))

    def worker_gpus(self) -> dict[str, list[str]]:
        rows = self._rows("SELECT name, gpus FROM worker_gpus")
        return {str(name): [str(g) for g in _names(gpus)] for name, gpus in rows}

    def record_attempt_gpus(self, job_id: int, attempt: int, gpus: Sequence[str]) -> None:
        """The GPUs an attempt runs on (an infrastructure retry prefers others)."""
        with self._transaction() as sql:
            row = (job_id, attempt, json.dumps(list(gpus)))
            sql.upsert("attempt_causes", "job_id, attempt, gpus", 2, row)

    def record_gpu_fault(
        self,
        host: str,
        gpus: Sequence[str],
        *,
        worker: str | None,
        job_id: int | None,
        attempt: int | None,
        detail: str | None,
    ) -> None:
        """Take ``gpus`` of ``host`` out of service until :meth:`clear_gpu_faults`."""
        with self._transaction() as sql:
            for gpu in gpus:
                row = (host, gpu, worker, job_id, attempt, sql.now, detail)
                sql.upsert("gpu_faults", "host, gpu, worker, job_id, attempt, at, detail", 2, row)

    def gpu_faults(self, host: str | None = None) -> list[GpuFault]:
        """GPUs out of service (on ``host``, or everywhere), by host and GPU."""
        where, params = ("", ()) if host is None else (" WHERE host = ?", (host,))
        query = f"SELECT host, gpu, worker, job_id, attempt, at, detail FROM gpu_faults{where}"
        return [GpuFault(*row) for row in self._rows(f"{query} ORDER BY host, gpu", params)]

    def clear_gpu_faults(self, host: str, gpus: Sequence[str] | None = None) -> list[GpuFault]:
        """Put ``gpus`` of ``host`` (all when None) back in service; returns the faults cleared."""
        cleared = [f for f in self.gpu_faults(host) if gpus is None or f.gpu in gpus]
        with self._transaction() as sql:
            for fault in cleared:
                sql("DELETE FROM gpu_faults WHERE host = ? AND gpu = ?", (host, fault.gpu))
        return cleared

    def _requeued(self, sql: Sql, job_id: int) -> None:
        """Refuse a job whose ``--after`` job did not succeed; reset its infrastructure budget."""
        row = sql(
            "SELECT d.after_id, j.status FROM job_deps AS d JOIN jobs AS j ON j.id = d.after_id "
            "WHERE d.job_id = ? AND j.status IN ('failed', 'cancelled') ORDER BY d.after_id",
            (job_id,),
        ).fetchone()
        if row is not None:
            raise QueueError(
                f"job {job_id} runs --after job {row[0]}, which is {row[1]}: requeue job "
                f"{row[0]} first"
            )
        sql(
            "UPDATE job_plans SET infra_failures = 0, retry_at = NULL, avoid = NULL "
            "WHERE job_id = ?",
            (job_id,),
        )

    def _judge(
        self,
        sql: Sql,
        job_id: int,
        attempt: int,
        outcome: Outcome,
        job: Sequence[Any],
        backoff: float,
    ) -> Decision:
        """The retry rules' decision on an attempt (``job``: its attempts, max_attempts,
        cancel_requested and host), written with what follows from it."""
        attempts, max_attempts, cancel_requested, host = job
        row = sql(f"SELECT {_PLAN_COLUMNS} FROM job_plans WHERE job_id = ?", (job_id,)).fetchone()
        plan = Plan() if row is None else _plan_from_row(row, ())
        earlier = sql(
            "SELECT attempt, cause FROM attempt_causes WHERE job_id = ? AND attempt < ? "
            "AND counted = 1 AND failure_class = 'job' ORDER BY attempt DESC",
            (job_id, attempt),
        ).fetchall()
        decision = decide(
            outcome,
            attempts=attempts,
            max_attempts=max_attempts,
            cancel_requested=bool(cancel_requested),
            infrastructure_failures=plan.infra_failures,
            previous_causes={str(c): int(n) for n, c in earlier if c is not None},
            policy=plan.policy,
            backoff=backoff,
        )
        if decision.failure_class is not None:
            row = (job_id, attempt, decision.failure_class, decision.cause, int(decision.counted))
            sql.upsert("attempt_causes", "job_id, attempt, failure_class, cause, counted", 2, row)
        if decision.failure_class == "infrastructure":
            gpus = sql(
                "SELECT gpus FROM attempt_causes WHERE job_id = ? AND attempt = ?",
                (job_id, attempt),
            ).fetchone()
            avoid = _names_json([f"{host}:{gpu}" for gpu in _names(gpus[0] if gpus else None)])
            row = (job_id, decision.infrastructure_failures, sql.now + decision.retry_in, avoid)
            sql.upsert("job_plans", "job_id, infra_failures, retry_at, avoid", 1, row)
        if decision.status in (FAILED, CANCELLED):
            self._cancel_dependents(sql, job_id, decision.status)
        return decision

    def _cancel_dependents(self, sql: Sql, job_id: int, status: str) -> None:
        """Cancel the queued jobs ``--after`` ``job_id`` (ended ``status``), theirs in turn."""
        pending = [(job_id, status)]
        while pending:
            ended, how = pending.pop()
            rows = sql(
                "SELECT d.job_id FROM job_deps AS d JOIN jobs AS j ON j.id = d.job_id "
                "WHERE d.after_id = ? AND j.status = ? ORDER BY d.job_id",
                (ended, QUEUED),
            ).fetchall()
            for (dependent,) in rows:
                sql(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ?, reason = ?, "
                    "error = ? WHERE id = ? AND status = 'queued'",
                    (
                        sql.now,
                        DEPENDENCY_FAILED,
                        f"job {ended} {how}: this job ran --after it",
                        dependent,
                    ),
                )
                pending.append((int(dependent), CANCELLED))
