"""Exit statuses: the plain contract, and one per failure reason for ``--detailed-exit-codes``
(3..125, clear of a shell's 126/127 and 128 + N, by tens: the command's end 1x, progress 2x,
resources 3x, training health 4x, the monitor 5x; never renumbered)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ._vocabulary import FailureReason

EXIT_PASSED = 0
#: A failed soak without ``--detailed-exit-codes``; with it, a failure without an artifact
#: (the artifact could not be written), whose reason is not known.
EXIT_FAILED = 1
EXIT_USAGE = 2
DETAILED_EXIT_CODES: Mapping[str, int] = MappingProxyType(
    {
        FailureReason.SPAWN_FAILED: 10,
        FailureReason.NONZERO_EXIT: 11,
        FailureReason.SIGNALED: 12,
        FailureReason.TOO_SHORT: 13,
        FailureReason.LEFTOVER_PROCESSES: 14,
        FailureReason.STARTUP_TIMEOUT: 20,
        FailureReason.STALE_PROGRESS: 21,
        FailureReason.NO_PROGRESS: 22,
        FailureReason.OVERDUE: 23,
        FailureReason.MEMORY_BUDGET: 30,
        FailureReason.MEMORY_LEAK: 31,
        FailureReason.DISK_LOW: 32,
        FailureReason.GPU_FAULT: 40,
        FailureReason.NONFINITE_LOSS: 41,
        FailureReason.MONITOR_ERROR: 50,
        FailureReason.MONITOR_LOST: 51,
    }
)


def detailed_exit_code(reason: str | None) -> int:
    """The detailed status of a failure's primary ``reason``; :data:`EXIT_FAILED` if unknown."""
    return EXIT_FAILED if reason is None else DETAILED_EXIT_CODES.get(reason, EXIT_FAILED)


def verdict_exit_code(status: str, reasons: Sequence[str], *, detailed: bool) -> int:
    """The exit status of a soak that ended with ``status`` and ``reasons`` (primary first),
    not by a signal: 0 for a pass or a requested stop, else 1 or the detailed status."""
    if status not in ("failed", "error"):
        return EXIT_PASSED
    if not detailed:
        return EXIT_FAILED
    return detailed_exit_code(reasons[0] if reasons else None)
