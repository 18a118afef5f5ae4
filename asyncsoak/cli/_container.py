"""``asyncsoak run`` as a container's entrypoint: detailed exit statuses, the termination
message Kubernetes shows for a stopped container, and the scheduler's grace period."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from .._contract import EXECUTOR, ValidationError, terminal_text
from .._supervisor import seconds
from . import UsageError
from ._flags import seconds_arg

#: Where Kubernetes has a container write why it ended (``terminationMessagePath``'s default).
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
#: What Kubernetes keeps of a termination message.
TERMINATION_MESSAGE_MAX_BYTES = 4096
#: Bound on writing the termination message (a file on the container's own filesystem).
TERMINATION_WRITE_TIMEOUT_SECONDS = 5.0


def add_container_options(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--detailed-exit-codes",
        action="store_true",
        help="exit with the primary failure reason's own status (3..125; see `asyncsoak "
        "exit-codes`) instead of 1, for a Kubernetes podFailurePolicy or a CI step",
    )
    parser.add_argument(
        "--termination-log",
        default=None,
        metavar="PATH",
        help="write the verdict, the reason, the exit status and the artifact's path there "
        f"before exiting (at most {TERMINATION_MESSAGE_MAX_BYTES} bytes); default "
        f"{DEFAULT_TERMINATION_LOG} when it exists and is writable; 'none' disables",
    )
    parser.add_argument(
        "--scheduler-grace",
        type=seconds_arg,
        default=None,
        metavar="S",
        help="seconds between the scheduler's SIGTERM and its SIGKILL (the pod's "
        "terminationGracePeriodSeconds); default: the downward API's annotation, SLURM's "
        "KillWait, or 30",
    )


def termination_log_path(value: str | None, default: Path = DEFAULT_TERMINATION_LOG) -> Path | None:
    """Where the termination message goes: ``value``, or ``default`` when it exists and
    can be written, or nowhere (``none``).  A given path whose directory is missing is a
    usage error, found before anything runs."""
    if value is None:
        return default if default.is_file() and os.access(default, os.W_OK) else None
    if value.lower() == "none":
        return None
    if not value:
        raise UsageError("--termination-log needs a path (or none)")
    path = Path(value).absolute()
    if path.is_dir():
        raise UsageError(f"--termination-log is a directory: {path}")
    if not path.parent.is_dir():
        raise UsageError(f"--termination-log: no directory {path.parent}")
    return path


def scheduler_grace(value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return seconds("--scheduler-grace", value)
    except ValidationError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Ending:
    """How ``asyncsoak run`` ended, as the termination message says it."""

    #: The verdict's first line, as on stderr.
    verdict: str
    exit_code: int
    reason: str | None
    artifact: Path | None


def termination_message(ending: Ending, limit: int = TERMINATION_MESSAGE_MAX_BYTES) -> bytes:
    """The termination message: the verdict's first line, then ``reason:``, ``exit_code:``
    and ``artifact:`` lines; within ``limit`` bytes, the verdict cut short first (the other
    lines are what a script reads)."""
    tail = (
        f"reason: {ending.reason or '-'}\n"
        f"exit_code: {ending.exit_code}\n"
        f"artifact: {terminal_text(str(ending.artifact.absolute())) if ending.artifact else '-'}\n"
    ).encode()
    if len(tail) > limit // 2:
        tail = tail[: limit // 2].decode(errors="ignore").encode()
    room = limit - len(tail) - 1
    verdict = terminal_text(ending.verdict).encode()
    if len(verdict) > room:
        verdict = verdict[: room - 3].decode(errors="ignore").encode() + b"..."
    return verdict + b"\n" + tail


def write_termination_log(path: Path, ending: Ending) -> str | None:
    """Write the termination message to ``path`` (truncating what is there: Kubernetes'
    file is bind-mounted, so it is written in place, not replaced); the error, or None."""
    data = termination_message(ending)

    def write() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    try:
        EXECUTOR.submit(write).result(timeout=TERMINATION_WRITE_TIMEOUT_SECONDS)
    except TimeoutError:
        return f"writing {path} took longer than {TERMINATION_WRITE_TIMEOUT_SECONDS:g}s"
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
