"""A job's final status, from how its command ended and what the soak decided; the statuses,
the worker's defaults (:class:`~asyncsoak.queue.WorkerConfig`'s) and an attempt's end in words.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .._contract import exits
from .._record import read_log_tail
from ..trainer import EXIT_INTERRUPTED

#: Period of polling and of heartbeats, in seconds.
POLL_S = 5.0
#: Heartbeat age beyond which a running job is an orphan.
STALE_AFTER_S = 60.0
#: Time the child gets to save once asked to stop, before its tree is killed.
STOP_TIMEOUT_S = 60.0
#: Time a job whose cancellation was requested gets to stop by itself.
CANCEL_GRACE_S = 60.0
#: Longest wait for the child to end after it is killed, in seconds.
KILL_WAIT_S = 10.0
#: Lines of ``train.log`` copied into a failed job's error.
ERROR_TAIL_LINES = 20
#: Bytes read at the end of ``train.log`` to find its last lines.
TAIL_BYTES = 64 * 1024
#: Longest step (seconds) between two checks of the child's end.
SLICE_S = 0.25
#: Attempts at writing the final status when the database is locked.
FINISH_RETRIES = 5
#: Wait (seconds) between two attempts at writing the final status.
FINISH_RETRY_WAIT_S = 2.0


class JobStatus(StrEnum):
    """A job's status, and an attempt's outcome: stored and printed, so they never change.
    Each member is its string, so a status read from a database compares equal."""

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
    #: rules of ``_retry.py``; None when nothing more precise than the reason is known.
    cause: str | None = None
