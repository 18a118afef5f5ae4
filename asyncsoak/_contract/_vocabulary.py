"""The words asyncsoak writes into its journal and artifact, one spelling each: a
:class:`~enum.StrEnum` member compares equal to the string read back from JSON."""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    """The ``kind`` of a journal line (and of an event kept in ``artifact.events``)."""

    HEADER = "header"
    SNAPSHOT = "snapshot"
    STARTED = "started"
    SPAWN_FAILED = "spawn_failed"
    EXITED = "exited"
    TREE_GONE = "tree_gone"
    PROGRESS = "progress"
    STEP = "step"
    FAILURE = "failure"
    WARNING = "warning"
    STOP = "stop"
    SIGNAL = "signal"
    FORWARDED = "forwarded"
    REQUEUE = "requeue"
    STDIN_CLOSED = "stdin_closed"
    LEFTOVER = "leftover"
    ABANDONED = "abandoned"
    FORENSICS = "forensics"
    OOM_KILL = "oom_kill"
    SAMPLER_DEGRADED = "sampler_degraded"
    SAMPLER_RECOVERED = "sampler_recovered"
    SAMPLER_NOTE = "sampler_note"
    TREND = "trend"
    EXCEPTION = "exception"
    LIMITS = "limits"
    FINISHED = "finished"
    SAMPLE = "sample"
    GPU_SAMPLE = "gpu_sample"
    GPU_FAULT = "gpu_fault"
    RULE_BROKEN = "rule_broken"


class SoakStatus(StrEnum):
    """``artifact.status``: the soak's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ERROR = "error"


class FailureReason(StrEnum):
    """``artifact.failures[].reason``: which fail-closed rule fired."""

    SPAWN_FAILED = "spawn_failed"
    STARTUP_TIMEOUT = "startup_timeout"
    STALE_PROGRESS = "stale_progress"
    NONZERO_EXIT = "nonzero_exit"
    SIGNALED = "signaled"
    TOO_SHORT = "too_short"
    LEFTOVER_PROCESSES = "leftover_processes"
    MONITOR_LOST = "monitor_lost"
    MONITOR_ERROR = "monitor_error"
    MEMORY_BUDGET = "memory_budget"
    DISK_LOW = "disk_low"
    MEMORY_LEAK = "memory_leak"
    GPU_FAULT = "gpu_fault"
    NONFINITE_LOSS = "nonfinite_loss"
    NO_PROGRESS = "no_progress"
    OVERDUE = "overdue"


class GpuFaultKind(StrEnum):
    """``gpu_fault`` events' ``fault`` (and ``artifact.gpu_health``): what a GPU said about its
    own health."""

    XID = "xid"
    ECC_UNCORRECTED = "ecc_uncorrected"
    REMAPPED_ROWS_PENDING = "remapped_rows_pending"
    REMAPPED_ROWS_FAILURE = "remapped_rows_failure"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    LOST = "lost"
    PCIE_LINK = "pcie_link"
    RESET_REQUIRED = "reset_required"


class StopCause(StrEnum):
    """``artifact.stop.cause``: why the stop sequence ran (null when it never did)."""

    EXITED = "exited"
    FAILURE = "failure"
    MAX_DURATION = "max_duration"
    REQUESTED = "requested"
    CANCELLED = "cancelled"
    SCHEDULER = "scheduler"
    REQUEUED = "requeued"
