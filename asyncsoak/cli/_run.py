"""``asyncsoak run`` and ``asyncsoak demo``: one supervised soak from the command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio

from .._contract import (
    FailureReason,
    SoakFailureError,
    SoakStatus,
    StopCause,
    ValidationError,
    exits,
    terminal_text,
)
from .._supervisor import STOP_MODES, SoakLimits, seconds
from . import VIEW_MODES, UsageError, _container, _flags, refused, release_collector, unwritable

if TYPE_CHECKING:
    from .._contract import Artifact
    from .._supervisor import SoakControl

#: Signals that stop the soak: Ctrl-C, a service manager, and a closed terminal or ssh session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="run a command under supervision and write its artifact",
        usage="asyncsoak run --progress-dir DIR --output FILE [options] -- COMMAND [ARG...]",
    )
    groups = _flags.help_groups(run)
    essentials = groups["essentials"]
    essentials.add_argument(
        "--progress-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="where the training shows progress (its metrics, logs or checkpoints); required",
    )
    essentials.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="the artifact (JSON) to write; its journal goes beside it; required",
    )
    essentials.add_argument("--cwd", type=Path, metavar="DIR", help="run the command there")
    essentials.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a variable in the command's environment (repeatable)",
    )
    _flags.add_soak_limits(groups)
    groups["gpu"].add_argument(
        "--nvidia-smi", default="nvidia-smi", metavar="PATH", help="nvidia-smi to sample GPUs with"
    )
    groups["gpu"].add_argument("--no-gpu", action="store_true", help="do not sample GPUs")
    outputs = groups["outputs"]
    outputs.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a fact recorded in the artifact's metadata (repeatable)",
    )
    outputs.add_argument("--quiet", action="store_true", help="no live status on stderr")
    outputs.add_argument(
        "--view",
        choices=VIEW_MODES,
        default="line",
        help="the live status on a terminal: one line (line, the default), the full screen "
        "(screen), or the full screen when the terminal is tall enough (auto)",
    )
    outputs.add_argument(
        "--status-interval",
        type=_flags.seconds_arg,
        default=60.0,
        metavar="S",
        help="seconds between status lines when stderr is not a terminal (default 60)",
    )
    _flags.add_metrics_flags(outputs)
    outputs.add_argument(
        "--metrics-textfile",
        type=Path,
        metavar="DIR",
        help="write asyncsoak_<soak id>.prom there for node_exporter's textfile collector",
    )
    outputs.add_argument(
        "--metrics-linger",
        type=_flags.seconds_arg,
        default=0.0,
        metavar="S",
        help="after the soak, keep serving metrics until one scrape read the final status, "
        "at most S seconds (default 0)",
    )
    _container.add_scheduler_options(groups["scheduler"])
    groups["advanced"].add_argument(
        "--stop-mode",
        choices=STOP_MODES,
        default="group",
        help="how the command is asked to stop: SIGTERM to its process group (default), "
        "to its leader alone, or its stdin closed",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    run.set_defaults(handler=run_command, hold_collector=True)

    demo = subparsers.add_parser(
        "demo", help="soak a small bundled training loop (about 15 seconds) and show the result"
    )
    demo.add_argument(
        "--dir", type=Path, default=Path("asyncsoak-demo"), help="where the run and artifact go"
    )
    demo.add_argument(
        "--seconds", type=_flags.seconds_arg, default=15.0, help="how long the demo trains"
    )
    demo.set_defaults(handler=demo_command)


def check_run_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``run``'s flags checked as the soak would check them, as :func:`supervise`'s keywords
    (but the paths); a :class:`UsageError` for the first bad one, nothing started."""
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if not command:
        raise UsageError("no command given: asyncsoak run [options] -- COMMAND [ARG...]")
    env = dict(os.environ)
    env.update(_flags.parse_pairs("--env", args.env))
    with refused():
        status_interval = seconds("--status-interval", args.status_interval, allow_zero=False)
        limits = _flags.soak_limits(args)
        SoakLimits(**limits)  # each limit within its bounds, named by its flag's field
    return {
        "command": command,
        "env": env,
        **limits,
        "metadata": _flags.parse_pairs("--metadata", args.metadata),
        "status_interval": status_interval,
        "metrics": _flags.metrics_from_args(args, args.metrics_textfile),
        "termination_log": _container.termination_log_path(args.termination_log),
        "scheduler_grace_seconds": _container.scheduler_grace(args.scheduler_grace),
    }


def run_command(args: argparse.Namespace) -> int:
    soak = check_run_flags(args)
    progress_dir, output = _container.scheduler_paths(args.progress_dir, args.output)
    _container.hold_forwarded_signals(args)
    status_interval = soak.pop("status_interval")
    termination_log = soak.pop("termination_log")
    ending = supervise(
        **soak,
        progress_dir=progress_dir,
        output_path=output,
        stop_mode=args.stop_mode,
        cwd=args.cwd,
        nvidia_smi=None if args.no_gpu else args.nvidia_smi,
        forward_signals=args.forward_signal,
        requeue_on=args.requeue_on,
        status=None if args.quiet else _live_status(status_interval, args.view),
        detailed=args.detailed_exit_codes,
    )
    if termination_log is not None:
        error = _container.write_termination_log(termination_log, ending)
        if error is not None:
            tell(f"asyncsoak: termination message not written: {error}")
    return ending.exit_code


def _live_status(status_interval: float = 60.0, mode: str = "line") -> Any:
    """The live view (imported only when shown: ``--quiet`` pays nothing for it)."""
    from .._view import live_status

    return live_status(status_interval=status_interval, mode=mode)


def supervise(
    *,
    report: Callable[[dict[str, Any]], None] | None = None,
    status: Callable[[SoakControl], Callable[[], Coroutine[Any, Any, Any]]] | None = None,
    detailed: bool = False,
    **soak: Any,
) -> _container.Ending:
    """Run one soak that SIGINT, SIGTERM or SIGHUP stops (a second one kills the tree at once);
    how it ended gives the exit status.  ``status`` (the live view) gets the soak's control
    and returns a task run beside the soak."""
    from .._supervisor import SoakControl, run_soak

    control = soak.setdefault("control", SoakControl())
    view = status(control) if status is not None else None
    received: list[int] = []
    artifact: dict[str, Any] | None = None
    output = Path(soak["output_path"])

    async def main() -> None:
        nonlocal artifact
        error: Exception | None = None
        if "stop_mode" in soak:
            # The reaper starts now, beside the supervisor's imports: the wait before the
            # command runs otherwise.
            await control._launch_reaper(soak["stop_mode"])
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with anyio.create_task_group() as tg:
                soak_scope = anyio.CancelScope()

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        received.append(signum)
                        name = exits.signal_name(signum)
                        if len(received) > 1:
                            tell(f"asyncsoak: {name} again: killing the tree now")
                            control.kill_now()
                            return
                        if not _container.stop_by_scheduler(signum, control):
                            soak_scope.cancel()
                        tell(f"asyncsoak: {name}: stopping the command (again to kill it now)")

                tg.start_soon(stop_on_signal)
                tg.start_soon(_release_collector_once_started, control)
                if view is not None:
                    tg.start_soon(view)
                with soak_scope:
                    try:
                        # Read below as the plain dict it is, like a failed soak's.
                        artifact = cast("dict[str, Any]", await run_soak(**soak))
                    except Exception as exc:
                        # Re-raised outside the task group, so it is never wrapped in a group.
                        error = exc
                    finally:
                        await control._drop_reaper()  # a soak refused before it began
                tg.cancel_scope.cancel()
        if error is not None:
            raise error

    try:
        anyio.run(main)
    except ValidationError as exc:
        raise _flags.flag_error(exc) from None
    except SoakFailureError as exc:
        first = f"asyncsoak: soak failed: {exc.reason}: {exc.failures[0]['message']}"
        tell(first)
        for failure in exc.failures[1:]:
            tell(f"asyncsoak:   also {failure['reason']}: {failure['message']}")
        tell(f"asyncsoak: artifact: {exc.artifact_path}")
        if report is not None:
            report(exc.artifact)
        code = exits.verdict_exit_code(
            exc.artifact["status"], [f["reason"] for f in exc.failures], detailed=detailed
        )
        return _container.Ending(first, code, exc.reason, Path(exc.artifact_path))
    except OSError as exc:
        # The artifact could not be written (the disk filled up during the run): the tree was
        # stopped and the message says where the journal is.
        tell(f"asyncsoak: {exc}")
        return _container.Ending(f"asyncsoak: {exc}", exits.EXIT_FAILED, None, None)
    except Exception as exc:
        # Not the input: the monitor itself broke.  Its artifact says ``error``.
        traceback.print_exc()
        first = f"asyncsoak: monitor error: {type(exc).__name__}: {exc}"
        tell(first)
        written = output.exists()
        if written:
            tell(f"asyncsoak: artifact: {output}")
        reason = FailureReason.MONITOR_ERROR
        code = exits.verdict_exit_code(SoakStatus.ERROR, [reason], detailed=detailed)
        return _container.Ending(first, code, reason, output if written else None)
    if received:
        reasons = [] if artifact is None else [f["reason"] for f in artifact["failures"]]
        name = exits.signal_name(received[0])
        stop = None if artifact is None else artifact.get("stop")
        cause = stop.get("cause") if isinstance(stop, dict) else None
        by = "the scheduler" if cause == StopCause.SCHEDULER else name
        line = f"asyncsoak: stopped by {by}" + (f" ({name})" if by != name else "")
        tell(f"{line}; artifact: {output}")
        # 128 + its number, as shells report a process a signal stopped.
        code = exits.SHELL_SIGNAL_BASE + received[0]
        return _container.Ending(line, code, reasons[0] if reasons else None, output)
    assert artifact is not None
    line = verdict_line(artifact, output)
    tell(line)
    if report is not None:
        report(artifact)
    return _container.Ending(line, exits.EXIT_PASSED, None, output)


async def _release_collector_once_started(control: SoakControl) -> None:
    """The garbage collector held off for the start-up (:func:`entry`) runs once the command
    does; a soak that never starts it ends soon."""
    await control.started.wait()
    release_collector()


def tell(text: str) -> None:
    """A message on stderr, the control characters of what the run put in it spelled out."""
    print(terminal_text(text, one_line=False), file=sys.stderr)


def verdict_line(artifact: dict[str, Any], output: Path) -> str:
    """The last line on stderr: the verdict, and the warnings when a passed soak had some."""
    # A leak first: it is what the soak exists to catch (the artifact keeps the event order).
    warnings = sorted(artifact.get("warnings") or [], key=lambda w: " grew " not in w)
    status = artifact["status"]
    if warnings:
        count = f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        return f"asyncsoak: soak {status} with {count}: {'; '.join(warnings)}; artifact: {output}"
    return f"asyncsoak: soak {status}; artifact: {output}"


def demo_command(args: argparse.Namespace) -> int:
    with refused():
        seconds("--seconds", args.seconds, allow_zero=False)
    base: Path = args.dir
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable("--dir", base, exc) from None
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    train = run_dir / "train"
    train.mkdir()  # the progress dir exists from the start, as a trainer's would
    output = run_dir / "soak.json"
    print(f"asyncsoak demo: training a small model for about {args.seconds:g}s under supervision")
    print(f"  progress dir: {train}  (metrics.jsonl: a step and its loss, 5 a second)")
    trainer = [sys.executable, "-m", "asyncsoak._demo_trainer", "--out", str(train)]
    status = supervise(
        command=[*trainer, "--seconds", str(args.seconds)],
        progress_dir=train,
        output_path=output,
        sample_interval_seconds=1.0,
        startup_timeout_seconds=60.0,
        stale_progress_seconds=15.0,
        min_duration_seconds=min(5.0, args.seconds / 2),
        metadata={"demo": "logistic regression, pure Python"},
        report=print_demo_summary,
        status=_live_status(),
    ).exit_code
    if status == exits.EXIT_PASSED:
        print(f"\nThe artifact explains the run: {output}")
        print(f"The training loop's own output: {output.with_suffix('.log')}")
    if output.exists():
        print_report_hint(output)
    return status if status != exits.EXIT_USAGE else exits.EXIT_FAILED


def print_demo_summary(artifact: dict[str, Any]) -> None:
    from .._view import exit_text, goodput_line, training_line

    progress = artifact["progress"]
    tree = artifact["summary"].get("tree", {})
    rss = (tree.get("rss_bytes") or {}).get("max")
    cpu = (tree.get("cpu_percent") or {}).get("mean")
    print(f"\nverdict: {artifact['status']}")
    for failure in artifact["failures"]:
        print(terminal_text(f"  {failure['reason']}: {failure['message']}"))
    training = training_line(progress.get("steps"))
    if training:  # what asyncsoak read in the trainer's own log
        print(f"training: {training}")
        print(goodput_line(artifact.get("goodput")))  # where the run's time went
    # run_soak's artifact, which the package built in the shape ``Artifact`` gives.
    print(f"ran for: {artifact['duration_seconds']:.1f}s, {exit_text(cast('Artifact', artifact))}")
    print(
        f"progress: {progress['changes']} file changes, "
        f"longest gap {progress['longest_gap_seconds']:.1f}s"
    )
    if rss is not None:
        print(f"peak memory of the tree: {rss / 2**20:.1f} MiB")
    if cpu is not None:
        print(f"mean CPU of the tree: {cpu:.0f}%")


def print_report_hint(artifact_path: Path) -> None:
    """Write the HTML report when plotly is there; otherwise say how to get it."""
    from .._view import ReportUnavailableError, write_report

    html_path = artifact_path.with_suffix(".html")
    try:
        write_report(json.loads(artifact_path.read_text()), html_path, source=str(artifact_path))
    except ReportUnavailableError:
        print("\nSee it in plots: pip install 'asyncsoak[report]', then")
        print(f"  asyncsoak report {artifact_path}")
        print(f"and open {html_path} in a browser.")
        return
    except (OSError, ValueError) as exc:
        print(f"\nThe report could not be written ({exc}); try: asyncsoak report {artifact_path}")
        return
    print(f"\nSee it in plots: open {html_path.absolute().as_uri()} in a browser")
    print(
        f"(made by: asyncsoak report {artifact_path}; in short: asyncsoak summary {artifact_path})"
    )
