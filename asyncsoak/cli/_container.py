"""``asyncsoak run`` under a scheduler: a SLURM job's flags, path patterns and stop, a
container's detailed exit statuses and the termination message Kubernetes shows."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from .._contract import EXECUTOR, terminal_text
from .._supervisor import forwarded_signals, kubernetes, seconds, slurm
from . import UsageError, refused
from ._flags import flag_error, seconds_arg

if TYPE_CHECKING:
    from .._supervisor import SoakControl

#: Where Kubernetes has a container write why it ended (``terminationMessagePath``'s default).
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
#: What Kubernetes keeps of a termination message.
TERMINATION_MESSAGE_MAX_BYTES = 4096
#: Bound on writing the termination message (a file on the container's own filesystem).
TERMINATION_WRITE_TIMEOUT_SECONDS = 5.0


def add_scheduler_options(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--forward-signal",
        action="append",
        default=[],
        metavar="SIG",
        help="pass this signal on to the command when the monitor receives it (repeatable; "
        "e.g. USR1 from sbatch --signal=B:USR1@90, so the trainer checkpoints)",
    )
    parser.add_argument(
        "--requeue-on",
        metavar="SIG",
        help="forward this signal, wait for the command to exit, then requeue the SLURM job "
        "(scontrol requeue); the artifact says cancelled, cause requeued",
    )
    parser.add_argument(
        "--detailed-exit-codes",
        action="store_true",
        help="exit with the primary failure reason's own status (3..125; see `asyncsoak "
        "exit-codes`) instead of 1, for a Kubernetes podFailurePolicy or a CI step",
    )
    parser.add_argument(
        "--termination-log",
        metavar="PATH",
        help="write the verdict, the reason, the exit status and the artifact's path there "
        f"before exiting (at most {TERMINATION_MESSAGE_MAX_BYTES} bytes); default "
        f"{DEFAULT_TERMINATION_LOG} when it exists and is writable; 'none' disables",
    )
    parser.add_argument(
        "--scheduler-grace",
        type=seconds_arg,
        metavar="S",
        help="seconds between the scheduler's SIGTERM and its SIGKILL (the pod's "
        "terminationGracePeriodSeconds); default: the downward API's annotation, SLURM's "
        "KillWait, or 30",
    )


def hold_forwarded_signals(args: argparse.Namespace) -> None:
    """Signals to forward are held from the start: one arriving before the command runs is
    forwarded once it does, instead of ending the monitor."""
    with refused(flag_error):
        signals = forwarded_signals(args.forward_signal, args.requeue_on)
    slurm.catch_early(signals)


def scheduler_paths(progress_dir: Path, output: Path) -> tuple[Path, Path]:
    """The paths with the scheduler's patterns filled in (SLURM's %j %A %a %N %t %r, a pod's
    %p %i %J %n %N); a requeued run's artifact gets its restart count in its name unless
    ``output`` says where with %r."""
    try:
        return slurm.expand_path(progress_dir), slurm.expand_path(output, restart_suffix=True)
    except slurm.PatternError as exc:
        raise UsageError(str(exc)) from None


def stop_by_scheduler(signum: int, control: SoakControl) -> bool:
    """SIGTERM inside a SLURM job or a Kubernetes pod is the scheduler's stop: a graceful stop
    with cause ``scheduler``, its grace kept under the scheduler's; False for an ordinary
    stop (the caller cancels the soak)."""
    if signum != signal.SIGTERM or not (slurm.in_job() or kubernetes.in_pod()):
        return False
    control.request_stop(reason="stopped by the scheduler", cause=slurm.CAUSE_SCHEDULER)
    return True


def worker_in_allocation(args: argparse.Namespace) -> float | None:
    """``asyncsoak worker`` inside a SLURM job: the allocation's GPUs and a name with the job
    id unless given, a stop timeout under ``KillWait``; the allocation's end (wall clock) when
    known, so that no job is taken that would not fit."""
    if not slurm.in_job():
        return None
    # Before the event loop starts: two scontrol queries, each under its deadline.
    info = slurm.scheduler_snapshot() or {}
    if args.gpus is None:
        args.gpus = slurm.allocation_gpus()
    if args.name is None:
        args.name = slurm.worker_name(info, socket.gethostname())
    args.stop_timeout_seconds = slurm.stop_grace(args.stop_timeout_seconds, info)
    end = info.get("end_time_epoch")
    return float(end) if isinstance(end, int | float) else None


def termination_log_path(value: str | None, default: Path = DEFAULT_TERMINATION_LOG) -> Path | None:
    """Where the termination message goes: ``value``, or ``default`` when it exists and can
    be written, or nowhere (``none``); a path whose directory is missing is a usage error."""
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
    with refused():
        return None if value is None else seconds("--scheduler-grace", value)


class Ending:
    """How ``asyncsoak run`` ended, as the termination message says it (a plain slotted class:
    a dataclass would cost every start 0.6 ms to make)."""

    __slots__ = ("artifact", "exit_code", "reason", "verdict")

    def __init__(
        self, verdict: str, exit_code: int, reason: str | None, artifact: Path | None
    ) -> None:
        #: The verdict's first line, as on stderr.
        self.verdict = verdict
        self.exit_code = exit_code
        self.reason = reason
        self.artifact = artifact


def termination_message(ending: Ending, limit: int = TERMINATION_MESSAGE_MAX_BYTES) -> bytes:
    """The verdict's first line, then ``reason:``, ``exit_code:`` and ``artifact:`` lines,
    within ``limit`` bytes: the verdict cut short first (the other lines are a script's)."""
    artifact = terminal_text(str(ending.artifact.absolute())) if ending.artifact else "-"
    tail = (
        f"reason: {ending.reason or '-'}\nexit_code: {ending.exit_code}\nartifact: {artifact}\n"
    ).encode()
    if len(tail) > limit // 2:
        tail = tail[: limit // 2].decode(errors="ignore").encode()
    room = limit - len(tail) - 1
    verdict = terminal_text(ending.verdict).encode()
    if len(verdict) > room:
        verdict = verdict[: room - 3].decode(errors="ignore").encode() + b"..."
    return verdict + b"\n" + tail


def write_termination_log(path: Path, ending: Ending) -> str | None:
    """Write the termination message to ``path`` in place (Kubernetes' file is bind-mounted,
    so it is truncated, not replaced); the error, or None."""
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
