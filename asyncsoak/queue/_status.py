"""An attempt's end: the statuses, the worker's defaults, a job's final status from how its
command ended and what the soak decided, and the retry rules.  A failure's class is
**infrastructure** (not counted, retried after a backoff), **job** (deterministic: the same
cause twice is not retried) or **run** (counted); docs/sweeps.md.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from .._contract import FailureReason, StopCause, ValidationError, exits
from .._record import read_log_tail
from ..trainer import EXIT_INTERRUPTED

#: The worker's defaults (:class:`~asyncsoak.queue.WorkerConfig`'s fields say what each is).
POLL_S = 5.0
STALE_AFTER_S = 60.0
STOP_TIMEOUT_S = 60.0
CANCEL_GRACE_S = 60.0
KILL_WAIT_S = 10.0
FINISH_RETRIES = 5
FINISH_RETRY_WAIT_S = 2.0
#: Lines of ``train.log`` copied into a failed job's error.
ERROR_TAIL_LINES = 20
#: Bytes read at the end of ``train.log`` to find its last lines.
TAIL_BYTES = 64 * 1024
#: Longest step (seconds) between two checks of the child's end.
SLICE_S = 0.25


class JobStatus(StrEnum):
    """A job's status, and an attempt's outcome: stored and printed, so they never change;
    each member is its string (a status read from a database compares equal)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: An attempt's outcome only: the job itself returns to ``queued``.
    INTERRUPTED = "interrupted"


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, INTERRUPTED = JobStatus

#: Reason recorded when the stop killed the trainer before it could save.
KILLED_BEFORE_SAVING = "killed_before_saving"
#: Heads the log tail in a failed job's error.
LOG_TAIL_HEADER = "last lines of train.log:"
#: First line of a succeeded job's ``error``: the soak passed, but with these warnings (a
#: leak, a projected breach, progress slowing), one per line.
WARNINGS_HEADER = "the soak passed with warnings:"
#: Reason recorded when the attempt was stopped before its command started.
NOT_STARTED = "stopped_before_start"
#: Reason recorded when the outcome of an attempt is unknown (no exit status).
OUTCOME_LOST = "outcome_lost"


def tail(path: Path, n: int = ERROR_TAIL_LINES) -> str:
    """The last ``n`` lines of a text file (read from its last ``TAIL_BYTES``); "" when absent."""
    lines = read_log_tail(path, TAIL_BYTES).splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""


def final_status(rc: int | None, cancel_requested: bool, stopping: bool, killed: bool) -> str:
    """A job's final status from how its command ended (the table in docs/queue.md): ``rc``
    as Python reports it (None: unknown), ``stopping`` when the worker asked it to stop,
    ``killed`` when its tree was killed after the stop timeout."""
    if rc == 0:
        return SUCCEEDED
    if cancel_requested:
        return CANCELLED
    if rc == EXIT_INTERRUPTED and not killed:
        return INTERRUPTED
    if rc is not None and stopping and killed:
        return INTERRUPTED
    return FAILED


def with_soak_verdict(status: str, soak_failed: bool) -> str:
    """:func:`final_status` with the soak's verdict: a soak failure fails a finished job."""
    return FAILED if soak_failed and status in (SUCCEEDED, FAILED) else status


def describe_exit(
    rc: int | None, *, sent: Collection[str] | None = None, forwarded: Collection[str] = ()
) -> str:
    """An exit status in words (``exits.describe_exit_status``), the trainer's own
    ``EXIT_INTERRUPTED`` said as such."""
    if rc == EXIT_INTERRUPTED:
        return f"exit status {rc} (EXIT_INTERRUPTED: saved and stopped)"
    return exits.describe_exit_status(rc, sent=sent, forwarded=forwarded)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, as the store records it."""

    status: str
    returncode: int | None
    reason: str | None
    error: str | None
    #: What exactly failed (``ValueError at train.py:12``, ``scheduler``...), for the retry
    #: rules below; None when nothing more precise than the reason is known.
    cause: str | None = None


INFRASTRUCTURE = "infrastructure"
JOB = "job"
RUN = "run"
CLASSES = (INFRASTRUCTURE, JOB, RUN)

#: Reasons of the queue's own, beside the soak's ``FailureReason``s.
ORPHANED = "orphaned"
SCHEDULER = "scheduler"
INVALID_JOB = "invalid_job"
USAGE_ERROR = "usage_error"
MONITOR_ERROR = FailureReason.MONITOR_ERROR.value
WORKER_CANCELLED = "worker_cancelled"
#: The reason of a job cancelled because a job it ran ``--after`` did not succeed.
DEPENDENCY_FAILED = "dependency_failed"

GPU_FAULT = FailureReason.GPU_FAULT.value
INFRASTRUCTURE_REASONS = frozenset({ORPHANED, SCHEDULER, GPU_FAULT, FailureReason.MONITOR_LOST})
JOB_REASONS = frozenset(
    {FailureReason.SPAWN_FAILED, FailureReason.NO_PROGRESS, INVALID_JOB, USAGE_ERROR}
)

#: Infrastructure failures a job may have before it is failed all the same.
MAX_INFRASTRUCTURE_RETRIES = 10
#: Wait before the second infrastructure retry (the first is at once), doubling up to the max.
INFRASTRUCTURE_BACKOFF_S = 10.0
INFRASTRUCTURE_BACKOFF_MAX_S = 600.0

#: Every name ``--retry-on`` / ``--no-retry-on`` accept (a class stands for its reasons).
RETRY_NAMES = frozenset(
    {*FailureReason, ORPHANED, SCHEDULER, INVALID_JOB, USAGE_ERROR, OUTCOME_LOST, *CLASSES}
)

_USAGE_LINE = re.compile(r"^usage: ", re.MULTILINE)
#: Causes' prefixes (the run's class, never the job's same-cause rule): the host ran out of
#: memory; a launcher's exception reports that its command failed, not why; an exception
#: raised while the run was being stopped on request.
OOM = "oom"
_OUT_OF_MEMORY = frozenset({"MemoryError"})
LAUNCHER = "launcher"
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
    """What exactly failed (``ValueError at train.py:12``, ``scheduler``...), for the same-cause
    rule and for people; None when nothing more precise than the reason is known."""
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
            # A DataLoader worker the OOM killer took raises the same error at the same line.
            kind = OOM
        elif exception["type"] in exits.LAUNCHER_EXCEPTIONS:
            # ``check_call``, torchrun: every failure of the command ends at that same line.
            kind = LAUNCHER
        elif stop.get("cause") in _ASKED_TO_STOP:
            # In answer to a stop asked for (a worker's Ctrl-C): no failure of the job's.
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
    # A Python exception is the job's (deterministic); CUDA's OOM, NCCL and the OOM killer
    # carry a kind prefix and are the run's.
    python = " at " in cause and ":" not in cause.split(" at ", 1)[0]
    if outcome.reason in JOB_REASONS or cause == USAGE_ERROR:
        return JOB
    return JOB if python and outcome.reason == FailureReason.NONZERO_EXIT.value else RUN


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
    """The job's next status after an attempt ended with ``outcome`` (an interruption requeues
    it, uncounted); ``previous_causes``: the earlier counted failures' causes, by attempt."""
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
    """An attempt's outcome from its soak artifact (``killed_by_worker``: which it cannot know).
    When the monitor ended the run (a rule fired, ``max_duration_seconds``), the soak's verdict
    decides: a trainer that saves and exits 4 when stopped for a stall is ``failed``."""
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
        # Stopped before the command started: nothing ran.
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
