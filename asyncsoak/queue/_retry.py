"""An attempt's end judged: its outcome from the soak's artifact, and what it does to its job.

Each failed attempt is classified by its reason and cause: **infrastructure** (the worker
died, the scheduler stopped it, a GPU faulted: not counted, retried after a backoff, preferably
on another GPU), **job** (deterministic: a job failing twice with the same cause is not retried)
or **run** (counted, retried while attempts remain).  ``--retry-on`` / ``--no-retry-on``
override by reason or class; every decision is written into the attempt's note
(docs/sweeps.md tells the rules).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .._contract import FailureReason, StopCause, ValidationError, exits
from ._status import (
    CANCELLED,
    FAILED,
    INTERRUPTED,
    KILLED_BEFORE_SAVING,
    LOG_TAIL_HEADER,
    NOT_STARTED,
    OUTCOME_LOST,
    QUEUED,
    SUCCEEDED,
    WARNINGS_HEADER,
    Outcome,
    describe_exit,
    final_status,
    with_soak_verdict,
)

#: Failure classes.
INFRASTRUCTURE = "infrastructure"
JOB = "job"
RUN = "run"
CLASSES = (INFRASTRUCTURE, JOB, RUN)

#: Reasons of the queue's own (beside the soak's ``FailureReason``s): an attempt whose worker
#: stopped heartbeating before writing its outcome; a run stopped by the scheduler (the
#: artifact's ``stop.cause``); inputs ``run_soak`` refused (a missing cwd...); exit status 2
#: with argparse's ``usage:`` line; an attempt the monitor itself could not run; a worker
#: cancelled before the soak wrote its artifact.
ORPHANED = "orphaned"
SCHEDULER = "scheduler"
INVALID_JOB = "invalid_job"
USAGE_ERROR = "usage_error"
MONITOR_ERROR = FailureReason.MONITOR_ERROR.value
WORKER_CANCELLED = "worker_cancelled"
#: The reason of a job cancelled because a job it ran ``--after`` did not succeed.
DEPENDENCY_FAILED = "dependency_failed"

GPU_FAULT = FailureReason.GPU_FAULT.value
#: The infrastructure's reasons: never the job's fault.
INFRASTRUCTURE_REASONS = frozenset({ORPHANED, SCHEDULER, GPU_FAULT, FailureReason.MONITOR_LOST})
#: The job's reasons: deterministic, the same cause twice stops the retries.
JOB_REASONS = frozenset(
    {FailureReason.SPAWN_FAILED, FailureReason.NO_PROGRESS, INVALID_JOB, USAGE_ERROR}
)

#: Infrastructure failures a job may have before it is failed all the same.
MAX_INFRASTRUCTURE_RETRIES = 10
#: Wait before the second infrastructure retry (the first is at once: a worker killed once is
#: no pattern), doubling for each later one up to :data:`INFRASTRUCTURE_BACKOFF_MAX_S`.
INFRASTRUCTURE_BACKOFF_S = 10.0
INFRASTRUCTURE_BACKOFF_MAX_S = 600.0

#: Every name ``--retry-on`` / ``--no-retry-on`` accept: the failure reasons, the queue's own,
#: and the class names (which stand for all their reasons).
RETRY_NAMES = frozenset(
    {*FailureReason, ORPHANED, SCHEDULER, INVALID_JOB, USAGE_ERROR, OUTCOME_LOST, *CLASSES}
)

_USAGE_LINE = re.compile(r"^usage: ", re.MULTILINE)
#: The cause's prefix when the host ran out of memory (the artifact's ``oom_kills``, a
#: Python ``MemoryError``): a kind, so the run's class, never the job's same-cause rule.
OOM = "oom"
_OUT_OF_MEMORY = frozenset({"MemoryError"})
#: The cause's prefix of a launcher's exception (``subprocess.CalledProcessError``...): it
#: reports that the command it ran failed, not why.
LAUNCHER = "launcher"
#: The cause's prefix of an exception raised while the run was being stopped on request.
STOPPED = "stopped"
_ASKED_TO_STOP = frozenset({StopCause.REQUESTED.value, StopCause.CANCELLED.value})


def check_retry_names(flag: str, names: Collection[str]) -> list[str]:
    """``names`` checked and sorted; a clear ``ValidationError`` for an unknown one."""
    unknown = sorted(set(names) - RETRY_NAMES)
    if unknown:
        raise ValidationError(
            f"{flag}: unknown reason {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(RETRY_NAMES))})"
        )
    return sorted(set(names))


def cause_of(artifact: Mapping[str, Any], reason: str | None, log_tail: str) -> str | None:
    """What exactly failed, for the same-cause rule and for people: ``scheduler``,
    ``ValueError at train.py:12``, ``usage_error``... None when nothing more precise than the
    reason is known."""
    # A GPU fault among the failures explains the rest (a trainer dies of its lost GPU).
    failures = artifact.get("failures") or []
    if any(isinstance(f, Mapping) and f.get("reason") == GPU_FAULT for f in failures):
        return GPU_FAULT
    stop = artifact.get("stop") or {}
    if stop.get("cause") == SCHEDULER:
        return SCHEDULER
    exit_info = artifact.get("exit") or {}
    exception = exit_info.get("exception")
    if isinstance(exception, Mapping) and exception.get("type"):
        where = exception.get("where")
        kind = exception.get("kind") or "python"
        if artifact.get("oom_kills") or exception["type"] in _OUT_OF_MEMORY:
            # Out of host memory, the run's: a DataLoader worker the OOM killer took raises
            # the same RuntimeError at the same line in the trainer each time.
            kind = OOM
        elif exception["type"] in exits.LAUNCHER_EXCEPTIONS:
            # A wrapper's ``check_call`` or torchrun's ChildFailedError: every failure of the
            # command it ran (a signal, another exception) ends at that same line.
            kind = LAUNCHER
        elif stop.get("cause") in _ASKED_TO_STOP:
            # Raised in answer to a stop someone asked for (a worker's Ctrl-C): the same
            # KeyboardInterrupt at the same line is no deterministic failure of the job.
            kind = STOPPED
        text = f"{exception['type']} at {where}" if where else str(exception["type"])
        return text if kind == "python" else f"{kind}: {text}"
    if artifact.get("oom_kills"):
        return OOM
    if exit_info.get("returncode") == 2 and _USAGE_LINE.search(log_tail):
        return USAGE_ERROR
    return reason


def classify(outcome: Outcome) -> str:
    """The class of a failed attempt (see the module docstring)."""
    cause = outcome.cause or ""
    if outcome.reason in INFRASTRUCTURE_REASONS or cause in (SCHEDULER, GPU_FAULT):
        return INFRASTRUCTURE
    if outcome.reason in JOB_REASONS or cause == USAGE_ERROR:
        return JOB
    # A Python exception is the job's (deterministic); CUDA's OOM, NCCL and the OOM killer
    # carry a kind prefix and are the run's.
    if (
        outcome.reason == FailureReason.NONZERO_EXIT.value
        and " at " in cause
        and ":" not in (cause.split(" at ", 1)[0])
    ):
        return JOB
    return RUN


def infrastructure_backoff(failures: int, base: float = INFRASTRUCTURE_BACKOFF_S) -> float:
    """Seconds before the retry after the ``failures``-th infrastructure failure."""
    if failures <= 1 or base <= 0:
        return 0.0
    return float(min(base * 2.0 ** (failures - 2), INFRASTRUCTURE_BACKOFF_MAX_S))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A job's overrides (``--retry-on`` / ``--no-retry-on``)."""

    retry_on: frozenset[str] = frozenset()
    no_retry_on: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    """What an attempt's end does to its job."""

    status: str
    attempts: int
    infrastructure_failures: int
    counted: bool
    failure_class: str | None
    cause: str | None
    #: Seconds before the job may run again (a backoff), or 0.
    retry_in: float
    note: str | None


def decide(
    outcome: Outcome,
    *,
    attempts: int,
    max_attempts: int,
    cancel_requested: bool,
    infrastructure_failures: int,
    previous_causes: Mapping[str, int],
    policy: RetryPolicy,
    backoff: float = 0.0,
) -> Decision:
    """The job's next status after an attempt ended with ``outcome``: an interruption requeues
    it, uncounted; a failure as its class says (the module's docstring).  ``previous_causes``:
    the causes of the job's earlier counted failures, each with the attempt it was seen in;
    ``backoff``: :data:`INFRASTRUCTURE_BACKOFF_S` or a worker's own."""
    if outcome.status != FAILED:
        status = outcome.status
        if status == INTERRUPTED:
            status = CANCELLED if cancel_requested else QUEUED
        return Decision(status, attempts, infrastructure_failures, False, None, None, 0.0, None)
    kind = classify(outcome)
    cause = outcome.cause or outcome.reason
    names = {n for n in (outcome.reason, outcome.cause, kind) if n}
    refused = ",".join(sorted(names & policy.no_retry_on))
    forced = ",".join(sorted(names & policy.retry_on))
    infra = kind == INFRASTRUCTURE
    counted = not infra and not cancel_requested
    used = attempts + counted
    failures = infrastructure_failures + (infra and not cancel_requested and not refused)
    limit = MAX_INFRASTRUCTURE_RETRIES
    status, retry_in = FAILED, 0.0
    if cancel_requested:
        status, why = CANCELLED, "; cancel requested: not retried"
    elif refused:
        why = f"; not retried: the job says --no-retry-on {refused}"
    elif infra and failures > limit:
        why = f"; not retried: {failures} infrastructure failures, more than the limit of {limit}"
    elif infra:
        status, retry_in = QUEUED, infrastructure_backoff(failures, backoff)
        when = f"retrying in {retry_in:g}s" if retry_in else "retrying now"
        why = (
            f": not counted against --max-attempts ({attempts}/{max_attempts} used; "
            f"infrastructure retry {failures} of {limit}); {when}, preferably on another GPU"
        )
    elif kind == JOB and cause is not None and cause in previous_causes and not forced:
        why = (
            f"; not retried: the same cause ({cause}) as attempt {previous_causes[cause]}, a "
            f"deterministic failure (--retry-on {outcome.reason} overrides)"
        )
    elif used >= max_attempts:
        why = f": counted, {used}/{max_attempts} attempts used; no attempts left"
    else:
        status = QUEUED
        why = f": counted, {used}/{max_attempts} attempts used; retrying"
        why += f" (--retry-on {forced})" if forced else ""
    words = outcome.reason or cause or "unknown"
    if cause and outcome.reason and cause != outcome.reason:
        words = f"{outcome.reason}: {cause}"
    note = f"{kind} failure ({words}){why}"
    return Decision(status, used, failures, counted, kind, cause, retry_in, note)


def outcome_from_artifact(
    artifact: dict[str, Any],
    *,
    cancel_requested: bool,
    stopping: bool,
    log_tail: str,
    killed_by_worker: bool = False,
) -> Outcome:
    """An attempt's outcome from its soak artifact (``killed_by_worker``: the worker killed
    the group itself, which the artifact cannot know).  When the monitor ended the run (a rule
    fired, ``max_duration_seconds``), the soak's verdict decides, not the exit status: a
    trainer that saves and exits 4 when stopped for a stall is ``failed``, not requeued."""
    exit_info = artifact.get("exit") or {}
    stop = artifact.get("stop") or {}
    rc: int | None = exit_info.get("returncode")
    killed = bool(stop.get("killed")) or killed_by_worker
    sent = exits.signals_sent(artifact, killed_by_worker=killed_by_worker)
    exit_text = describe_exit(rc, sent=sent, forwarded=exits.forwarded_signals(artifact))
    failures = artifact.get("failures") or []
    soak_reason: str | None = failures[0].get("reason") if failures else None
    if artifact.get("status") == "error" and soak_reason is None:
        soak_reason = "monitor_error"
    soak_failed = artifact.get("status") in ("failed", "error")

    if artifact.get("status") == "cancelled" and exit_info.get("pid") is None:
        # Stopped before the command started: nothing ran, so nothing counts as a failure.
        if cancel_requested:
            return Outcome(CANCELLED, None, None, None)
        return Outcome(INTERRUPTED, None, NOT_STARTED, None)
    status: str
    if stop.get("cause") in ("failure", "max_duration"):
        status = (
            CANCELLED if cancel_requested and rc != 0 else (FAILED if soak_failed else SUCCEEDED)
        )
    else:
        status = with_soak_verdict(
            final_status(rc, cancel_requested, stopping, killed), soak_failed
        )

    if status == FAILED:
        reason = soak_reason or (OUTCOME_LOST if rc is None else "nonzero_exit")
        # The soak's primary reason, the decoded exit status, the log tail.
        message = failures[0].get("message") if failures else None
        parts = [f"{reason}: {message}" if message else reason, exit_text]
        if log_tail:
            parts.append(f"{LOG_TAIL_HEADER}\n{log_tail}")
        return Outcome(status, rc, reason, "\n".join(parts), cause_of(artifact, reason, log_tail))
    if status == INTERRUPTED and killed:
        return Outcome(status, rc, KILLED_BEFORE_SAVING, exit_text)
    warnings = [str(w) for w in artifact.get("warnings") or []]
    if status == SUCCEEDED and warnings:
        return Outcome(status, rc, None, "\n".join([WARNINGS_HEADER, *warnings]))
    return Outcome(status, rc, None, None)
