"""A queue job's goodput (``asyncsoak goodput``, ``job N``): its attempts' ledgers (as the
store's summary keeps them, else from the artifact or journal on this host), the waits before
and between them, and the GPUs each had (the worker's ``--gpus``, else the artifact's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._analysis import AttemptPart, JobLedger, highest_step, job_ledger
from .._contract import bounded
from .._record import JournalError, journal_goodput
from ..trainer import Job
from ._models import Attempt
from ._store import JobStore
from ._sweeps import AttemptCause, Plan

Section = Mapping[str, Any]


def read_artifact(path: Path) -> dict[str, Any] | None:
    """An attempt's ``soak.json`` if it was written (it is replaced atomically, so it is whole)."""
    try:
        data = bounded.read_json_file(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def artifact_section(
    artifact: Mapping[str, Any] | None, earlier_highest_step: int | None = None
) -> Section | None:
    """An artifact's ``goodput`` section; folded again from its journal (when it is still
    there) for an artifact from before the section, or to count its steps at or below
    ``earlier_highest_step`` as redone; else None (or the section as written)."""
    if artifact is None:
        return None
    written = artifact.get("goodput")
    section = dict(written) if isinstance(written, Mapping) else None
    if section is not None and earlier_highest_step is None:
        return section
    if earlier_highest_step is None:
        earlier = (artifact.get("config") or {}).get("earlier_highest_step")
        earlier_highest_step = earlier if isinstance(earlier, int) else None
    journal = (artifact.get("monitor") or {}).get("journal_path")
    if not journal:
        return section
    try:
        return journal_goodput(Path(journal), earlier_highest_step).to_json()
    except (JournalError, OSError, ValueError):
        return section


def attempt_section(attempt: Attempt) -> Section | None:
    """An attempt's ledger: as the store keeps it, else from its artifact (on this host)."""
    kept = (attempt.summary or {}).get("goodput")
    if isinstance(kept, Mapping):
        return kept
    if attempt.outcome is None:
        return None
    return artifact_section(read_artifact(Path(attempt.artifact)))


def earlier_highest_step(attempts: Sequence[Attempt]) -> int | None:
    """The highest step the ended ``attempts`` reached (as the store keeps it, else as their
    artifacts on this host say): a next attempt's steps at or below it are redone."""
    reached: list[int] = []
    for attempt in attempts:
        step = (attempt.summary or {}).get("step")
        if not isinstance(step, int) and attempt.outcome is not None:
            step = highest_step(read_artifact(Path(attempt.artifact)) or {})
        if isinstance(step, int):
            reached.append(step)
    return max(reached, default=None)


def job_parts(
    attempts: Sequence[Attempt],
    *,
    submitted_at: float,
    causes: Mapping[int, AttemptCause],
    requeued: Mapping[int, float],
    plan: Plan,
) -> list[AttemptPart]:
    """The job's attempts as a ledger adds them: the first waited from its submission (or
    its ``--not-before``), one after a requeue from the requeue, the others followed the
    previous attempt (``recovery``).  Its GPUs: those the worker gave it, else its summary's."""
    first = min((a.attempt for a in attempts), default=None)
    parts = []
    for a in attempts:
        queued = requeued.get(a.attempt - 1)
        if a.attempt == first:
            queued = max(submitted_at, plan.not_before or 0.0)
        cause, kept = causes.get(a.attempt), (a.summary or {}).get("gpus")
        gpus = len(cause.gpus) if cause and cause.gpus else kept if isinstance(kept, int) else None
        label = f"attempt {a.attempt}" + ("" if a.outcome else " (running)")
        parts.append(
            AttemptPart(label, attempt_section(a), a.started_at, a.finished_at, queued, gpus)
        )
    return parts


def job_goodput(
    store: JobStore,
    job: Job,
    attempts: Sequence[Attempt],
    *,
    requeues: Mapping[int, Mapping[int, float]] | None = None,
    plans: Mapping[int, Plan] | None = None,
) -> JobLedger:
    """One job's ledger, read from ``store`` (``requeues``, ``plans``: every job's, read once)."""
    requeues = store.requeue_times() if requeues is None else requeues
    plan = store.plan(job.id) if plans is None else plans.get(job.id, Plan())
    parts = job_parts(
        attempts,
        submitted_at=job.created_at,
        causes=store.attempt_causes(job.id),
        requeued=requeues.get(job.id, {}),
        plan=plan,
    )
    return job_ledger(f"job {job.id}" + (f" {job.name}" if job.name else ""), parts)


def queue_goodput(store: JobStore, since: float | None = None) -> list[JobLedger]:
    """The ledger of every job that ran (and, with ``since``, ran at or after it)."""
    requeues, plans = store.requeue_times(), store.plans()
    out = []
    for job in store.jobs():
        attempts = store.attempts(job.id)
        recent = since is None or any(
            a.finished_at is None or a.finished_at >= since for a in attempts
        )
        if attempts and recent:
            out.append(job_goodput(store, job, attempts, requeues=requeues, plans=plans))
    return out
