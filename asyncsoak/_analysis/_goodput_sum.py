"""Goodput across attempts, jobs and a fleet: the attempts' ledgers added, with the time in
the queue (``queue_wait``) and between attempts (``recovery``), in seconds and GPU-seconds;
runs a scheduler restarted join one job by :func:`run_key` (docs/goodput.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._contract import epoch
from ._goodput import BADPUT_KINDS, QUEUE_KINDS, Ledger

#: A job's badput kinds: a run's, then the queue's.
JOB_KINDS = (*BADPUT_KINDS, *QUEUE_KINDS)
HOUR_SECONDS = 3600.0
_GPU_KEY = re.compile(r"^gpu\d+$")


@dataclass(frozen=True, slots=True)
class AttemptPart:
    """One attempt of a job: its ``goodput`` section, its start and end (epoch seconds), when
    it was queued (None: it followed the previous attempt) and its GPUs (None: unknown)."""

    label: str
    section: Mapping[str, Any] | None
    started_at: float | None = None
    ended_at: float | None = None
    queued_at: float | None = None
    gpus: int | None = None


@dataclass(slots=True)
class JobLedger:
    """A job's time (``ledger``) and its GPU-seconds (None when an attempt's GPUs are
    unknown), over ``attempts`` attempts of which ``unknown`` had no ledger."""

    job: str
    ledger: Ledger
    gpu_seconds: Ledger | None
    attempts: int = 0
    unknown: list[str] = field(default_factory=list)

    @property
    def lost_seconds(self) -> float:
        return self.ledger.wall_seconds - self.ledger.productive_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "attempts": self.attempts,
            "unknown": self.unknown,
            **self.ledger.to_json(),
            "gpu_hours": gpu_hours(self.gpu_seconds),
        }


def zero_ledger() -> Ledger:
    return Ledger(wall_seconds=0.0, badput_seconds=dict.fromkeys(JOB_KINDS, 0.0))


def section_ledger(section: Mapping[str, Any] | None) -> Ledger | None:
    """An artifact's ``goodput`` section as a :class:`Ledger`; None when it is not one."""
    if not isinstance(section, Mapping) or not isinstance(section.get("badput_seconds"), Mapping):
        return None
    try:
        return Ledger(
            wall_seconds=float(section["wall_seconds"]),
            productive_seconds=float(section["productive_seconds"]),
            ideal_step_seconds=section.get("ideal_step_seconds"),
            steps=int(section.get("steps") or 0),
            badput_seconds={k: float(v) for k, v in section["badput_seconds"].items()},
            note=section.get("note"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def add(into: Ledger, part: Ledger, scale: float = 1.0) -> None:
    """Add ``part`` x ``scale`` into ``into``; its ideal step becomes the step-weighted mean
    of the parts' (productive seconds over new steps)."""
    into.wall_seconds += part.wall_seconds * scale
    into.productive_seconds += part.productive_seconds * scale
    for kind, seconds in part.badput_seconds.items():
        into.badput_seconds[kind] = into.badput_seconds.get(kind, 0.0) + seconds * scale
    into.steps += part.steps
    if into.steps:
        into.ideal_step_seconds = into.productive_seconds / into.steps


def gpu_hours(gpu_seconds: Ledger | None) -> dict[str, Any] | None:
    """GPU-seconds as GPU-hours: the whole, the productive and each lost cause."""
    if gpu_seconds is None:
        return None
    return {
        "wall": round(gpu_seconds.wall_seconds / HOUR_SECONDS, 4),
        "productive": round(gpu_seconds.productive_seconds / HOUR_SECONDS, 4),
        "lost": {k: round(v / HOUR_SECONDS, 4) for k, v in gpu_seconds.badput_seconds.items()},
    }


def job_ledger(job: str, parts: Sequence[AttemptPart]) -> JobLedger:
    """Add a job's attempts (in the order they started) and the waits before and between."""
    out = JobLedger(job, zero_ledger(), zero_ledger(), attempts=len(parts))
    previous_end: float | None = None
    for part in sorted(parts, key=lambda p: (p.started_at is None, p.started_at or 0.0)):
        piece = zero_ledger()
        run = section_ledger(part.section)
        if run is None:
            out.unknown.append(part.label)
        else:
            add(piece, run)
        if part.started_at is not None:
            since = part.queued_at if part.queued_at is not None else previous_end
            kind = "queue_wait" if part.queued_at is not None else "recovery"
            if since is not None:
                waited = max(0.0, part.started_at - since)
                piece.badput_seconds[kind] += waited
                piece.wall_seconds += waited
        previous_end = part.ended_at if part.ended_at is not None else previous_end
        add(out.ledger, piece)
        if out.gpu_seconds is not None and part.gpus is not None:
            add(out.gpu_seconds, piece, part.gpus)
        else:
            out.gpu_seconds = None
    return out


def fleet_ledgers(jobs: Sequence[JobLedger]) -> tuple[Ledger, Ledger | None]:
    """The jobs' ledgers added, and their GPU-seconds (None when some job's are unknown)."""
    total, gpus = zero_ledger(), zero_ledger()
    for job in jobs:
        add(total, job.ledger)
        if job.gpu_seconds is not None:
            add(gpus, job.gpu_seconds)
    known = bool(jobs) and all(job.gpu_seconds is not None for job in jobs)
    return total, gpus if known else None


def fleet_total(jobs: Sequence[JobLedger]) -> dict[str, Any]:
    """The jobs' ledgers added, shaped like a run's ``goodput`` section, with the jobs counted
    and GPU-hours when every job's are known."""
    total, gpus = fleet_ledgers(jobs)
    return {
        **total.to_json(),
        "jobs": len(jobs),
        "unknown": sum(len(job.unknown) for job in jobs),
        "gpu_hours": gpu_hours(gpus),
    }


def lost_by_cause(ledger: Ledger) -> list[tuple[str, float]]:
    """The badput kinds with time in them, largest first."""
    lost = [(kind, seconds) for kind, seconds in ledger.badput_seconds.items() if seconds > 0]
    return sorted(lost, key=lambda item: -item[1])


def artifact_gpus(artifact: Mapping[str, Any]) -> int | None:
    """The GPUs a run had: those its worker gave it (``metadata.gpus``), SLURM's
    (``snapshot.scheduler.gpus``), else those the monitor watched (``gpu_health``); None."""
    given = (artifact.get("metadata") or {}).get("gpus")
    if isinstance(given, list) and given:
        return len(given)
    scheduler = (artifact.get("snapshot") or {}).get("scheduler") or {}
    listed = scheduler.get("gpus") if isinstance(scheduler, Mapping) else None
    if isinstance(listed, str) and listed.strip():
        return len([gpu for gpu in listed.split(",") if gpu.strip()])
    health = artifact.get("gpu_health") or {}
    watched = [key for key in health if _GPU_KEY.match(str(key))]
    return len(watched) or None


def highest_step(artifact: Mapping[str, Any]) -> int | None:
    """The highest step a run reached (``progress.steps.step``), or None."""
    steps = (artifact.get("progress") or {}).get("steps") or {}
    step = steps.get("step") if isinstance(steps, Mapping) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def run_key(artifact: Mapping[str, Any]) -> tuple[tuple[Any, ...], str] | None:
    """What a scheduler's restarts of one job share (a queue job's id, a SLURM job's id and
    name, a Kubernetes Job's namespace, name and index, a bare pod's name) and how ``goodput``
    names that job; None: none."""
    metadata = artifact.get("metadata") or {}
    job_id, name = metadata.get("job_id"), metadata.get("job_name")
    if job_id is not None and "attempt" in metadata:
        return ("queue", job_id, name), f"job {job_id}" + (f" {name}" if name else "")
    facts = (artifact.get("snapshot") or {}).get("scheduler") or {}
    if not isinstance(facts, Mapping):
        return None
    job_id, name = facts.get("job_id"), facts.get("job_name")
    if facts.get("kind") == "slurm" and job_id is not None:
        label = f"slurm job {job_id}" + (f" {name}" if name else "")
        return ("slurm", facts.get("cluster"), job_id, name), label
    name = name or facts.get("pod_name")
    if facts.get("kind") != "kubernetes" or name is None:
        return None
    index = (facts.get("completion_index"), facts.get("job_index"))
    key = ("kubernetes", facts.get("namespace"), facts.get("jobset_name"), name, *index)
    return key, "kubernetes " + "/".join(str(p) for p in key[1:] if p is not None)


def run_span(artifact: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A run's start and end, epoch seconds."""
    return epoch(artifact.get("started_at")), epoch(artifact.get("ended_at"))


def join_runs(
    runs: Sequence[tuple[str, Mapping[str, Any]]],
    regoodput: Callable[[str, Mapping[str, Any], int], Mapping[str, Any] | None],
) -> list[JobLedger]:
    """The ledgers of ``(label, artifact)`` runs, one job's joined; a later attempt's divided
    again by ``regoodput(label, artifact, earlier_highest_step)`` (None: kept as it is)."""
    groups: dict[Any, tuple[str, list[tuple[str, Mapping[str, Any]]]]] = {}
    for label, artifact in runs:
        key, name = run_key(artifact) or (("alone", label), label)
        groups.setdefault(key, (name, []))[1].append((label, artifact))
    out = []
    for name, members in groups.values():
        members.sort(key=lambda m: run_span(m[1])[0] or 0.0)
        parts, earlier = [], None
        for label, artifact in members:
            section = artifact.get("goodput")
            if earlier is not None:
                section = regoodput(label, artifact, earlier) or section
            start, end = run_span(artifact)
            parts.append(AttemptPart(label, section, start, end, None, artifact_gpus(artifact)))
            reached = highest_step(artifact)
            if reached is not None:
                earlier = reached if earlier is None else max(earlier, reached)
        out.append(job_ledger(name, parts))
    return out
