"""``asyncsoak run`` inside a SLURM job: its flags, file name patterns and the scheduler's stop."""

from __future__ import annotations

import argparse
import signal
import socket
from pathlib import Path

from .._contract import ValidationError
from .._supervisor import SoakControl, forwarded_signals, kubernetes, slurm
from . import UsageError
from ._flags import flag_error


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
        default=None,
        metavar="SIG",
        help="forward this signal, wait for the command to exit, then requeue the SLURM job "
        "(scontrol requeue); the artifact says cancelled, cause requeued",
    )


def hold_forwarded_signals(args: argparse.Namespace) -> None:
    """Signals to forward are held from the start: one arriving before the command runs is
    forwarded once it does, instead of ending the monitor."""
    try:
        signals = forwarded_signals(args.forward_signal, args.requeue_on)
    except ValidationError as exc:
        raise flag_error(exc) from None
    slurm.catch_early(signals)


def scheduler_paths(progress_dir: Path, output: Path) -> tuple[Path, Path]:
    """The paths with the scheduler's patterns filled in (SLURM's %j %A %a %N %t %r, a pod's
    %p %i %J %n %N); a requeued run's artifact gets its restart count in its name unless
    ``output`` says where with %r."""
    try:
        return (
            slurm.expand_path(progress_dir),
            slurm.expand_path(output, restart_suffix=True),
        )
    except slurm.PatternError as exc:
        raise UsageError(str(exc)) from None


def stop_by_scheduler(signum: int, control: SoakControl) -> bool:
    """Inside a SLURM job, SIGTERM is the scheduler's stop (scancel, time limit, preemption):
    a graceful stop with cause ``scheduler``, its grace kept under ``KillWait``.  Inside a
    Kubernetes pod, the kubelet's (an eviction, a preemption, a drain, a deleted Job), its
    grace kept under the pod's ``terminationGracePeriodSeconds``.  False when the signal is
    an ordinary stop (the caller cancels the soak)."""
    if signum != signal.SIGTERM or not (slurm.in_job() or kubernetes.in_pod()):
        return False
    control.request_stop(reason="stopped by the scheduler", cause=slurm.CAUSE_SCHEDULER)
    return True


def worker_in_allocation(args: argparse.Namespace) -> float | None:
    """``asyncsoak worker`` inside a SLURM job: GPUs from the allocation and a name with the
    job id unless given, a stop timeout under ``KillWait`` (the scheduler's SIGTERM
    interrupts the running job the graceful way, so it is requeued, not failed).  Returns
    the allocation's end (wall clock) when known: no job is taken that would not fit."""
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
