"""The job queue's commands: submit, cancel, requeue and worker here, the read commands
(jobs, job, logs, workers) in ``_queue_show.py``, opening the queue in ``_queue_db.py``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from .._contract import ValidationError, exits, terminal_text
from .._supervisor import STOP_MODES
from ..queue import (
    LOST_AFTER_S,
    MAX_GPUS,
    MAX_TRIES,
    PRUNE_AFTER_S,
    WORKER_WAIT_FOR_DB_S,
    JobOptions,
    JobStatus,
    JobStore,
    QueueDatabaseLostError,
    QueueError,
    QueueUnavailableError,
    WorkerConfig,
    checked,
    open_for_worker,
    validate_submission,
)
from . import UsageError, _flags, refused
from ._container import worker_in_allocation
from ._queue_db import (
    UNAVAILABLE,
    _count_arg,
    _existing_for,
    _guarded,
    _integer,
    _job_id,
    _open,
    _queue_call,
    _wait_for_db,
    db_parser,
    default_db,
)
from ._queue_show import _job, _jobs, _logs, _workers
from ._sweeps import add_submit_flags, clear_faults, parse_not_before, sweep_options

_GPU_LIST = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)(,(\d+|(GPU|MIG)-[0-9A-Za-z-]+))*$")


def register(subparsers: Any) -> None:
    db = db_parser()

    def command(name: str, handler: Any, **options: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subparsers.add_parser(name, parents=[db], **options)
        parser.set_defaults(handler=_guarded(handler))
        return parser

    p = command(
        "submit",
        _submit,
        help="queue a training job",
        description="Queue a training job and print its id.  The command may contain {job_id}, "
        "{db} and {run_dir}; it runs in --cwd (default: the current directory).",
    )
    p.add_argument("--name", help="a name to recognise the job by")
    p.add_argument("--priority", type=_integer, default=0, help="higher runs first (default 0)")
    p.add_argument(
        "--max-attempts",
        type=_count_arg,
        metavar="K",
        help="runs that fail (or lose their worker) before the job is failed (default 3)",
    )
    groups = _flags.help_groups(p)
    essentials = groups["essentials"]
    essentials.add_argument("--cwd", type=Path, help="working directory (default: the current one)")
    essentials.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="environment override for the job (repeatable; values are never printed)",
    )
    essentials.add_argument(
        "--progress-dir", type=Path, help="liveness directory (default: the run dir)"
    )
    groups["advanced"].add_argument(
        "--stop-mode",
        choices=STOP_MODES,
        default="stdin",
        help="how the worker asks the job to stop: close its stdin (default), or SIGTERM "
        "to its process group or to its leader",
    )
    _flags.add_soak_limits(groups)
    add_submit_flags(p)
    p.add_argument("--config", type=Path, help="a JSON config for the worker's trainer command")
    p.add_argument("command", nargs="*", help="after --: the command and its arguments")

    p = command("jobs", _jobs, help="list jobs")
    statuses = [status.value for status in JobStatus]  # as stored, attempts' interrupted too
    p.add_argument("--status", choices=statuses, help="only these jobs")
    p.add_argument("--array", type=_job_id, metavar="ID", help="only the jobs of this array")
    p.add_argument("--json", action="store_true", help="JSON for scripts")

    p = command("job", _job, help="show one job and its attempts")
    p.add_argument("id", type=_job_id)
    p.add_argument("--json", action="store_true", help="JSON for scripts")

    p = command("cancel", _cancel, help="cancel a queued or running job")
    p.add_argument("id", type=_job_id)
    p.add_argument(
        "--array", action="store_true", help="ID is an array's: cancel all of its jobs not ended"
    )

    command("requeue", _requeue, help="queue a finished job again").add_argument("id", type=_job_id)

    p = command("logs", _logs, help="print a job's train.log")
    p.add_argument("id", type=_job_id)
    p.add_argument("--attempt", type=_job_id, metavar="K", help="which attempt (default: the last)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--lines", "-n", type=_count_arg, metavar="N", help="only the last N lines")

    p = command(
        "workers",
        _workers,
        help="list workers",
        description="List workers: alive, stopped, or lost (silent for longer than "
        "--stale-after, or its process gone on this host), with when each was last seen.  "
        f"Workers gone for more than {PRUNE_AFTER_S / 3600:g}h are left out unless --all.",
    )
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    p.add_argument("--all", action="store_true", help="also workers gone for long")
    p.add_argument(
        "--stale-after",
        type=_flags.seconds_arg,
        default=LOST_AFTER_S,
        metavar="S",
        help=f"heartbeat age that makes a worker lost (default {LOST_AFTER_S:g})",
    )

    p = command(
        "worker",
        _worker,
        help="run queued jobs (one at a time, or side by side on several --gpus)",
        description="Run queued jobs, each under the soak monitor: one at a time, or side by "
        "side on the GPUs of --gpus (submit --gpus N).  SIGINT, SIGTERM or SIGHUP stops the "
        "running jobs the graceful way (they are requeued) and then the worker; a second signal "
        "kills them at once.",
    )
    p.add_argument("--once", action="store_true", help="drain what is queued, then exit")
    p.add_argument("--name", help="worker name (default: host:gpuN with --gpus, else host:pid)")
    add_worker_settings(p)
    p.add_argument("--no-gpu", action="store_true", help="do not sample GPUs")
    p.add_argument(
        "--clear-fault",
        nargs="?",
        const="",
        metavar="GPU[,GPU]",
        help="put this host's GPUs that had a fault back in service (all of them without a "
        "list), then exit",
    )
    _flags.add_metrics_flags(p)


def _worker_flags() -> list[dataclasses.Field[Any]]:
    """The fields of :class:`WorkerConfig` that are ``asyncsoak worker`` flags."""
    return [spec for spec in dataclasses.fields(WorkerConfig) if spec.metadata["flag"]]


def add_worker_settings(p: argparse.ArgumentParser) -> None:
    """One flag per setting of :class:`WorkerConfig` (its spelling, help and default), each
    parsed into the field's name: the config and its flags cannot drift apart."""
    for spec in _worker_flags():
        flag, kind = spec.metadata["flag"], spec.metadata["kind"]
        help = spec.metadata["help"].replace("%", "%%")  # argparse formats help with %
        metavar = spec.metadata["metavar"] or flag.lstrip("-").replace("-", "_").upper()
        if kind in ("seconds", "count"):
            # Checked by _worker, so a bad value is refused naming the flag.
            parse: Callable[[str], Any] = _flags.seconds_arg if kind == "seconds" else _integer
            help = f"{help} (default {spec.default:g})"
        else:
            parse = Path if kind == "path" else str
        default = spec.default if kind in ("seconds", "count", "text") else None
        p.add_argument(
            flag, dest=spec.name, type=parse, default=default, metavar=metavar, help=help
        )


def worker_config(args: argparse.Namespace, *, until: float | None = None) -> WorkerConfig:
    """The :class:`WorkerConfig` of ``asyncsoak worker``'s flags (``until``: the end of its
    SLURM allocation).  A flag left out keeps the config's default."""
    settings = {spec.name: getattr(args, spec.name) for spec in _worker_flags()}
    if args.cmd is None:
        del settings["cmd"]
    else:
        settings["cmd"] = shlex.split(args.cmd)
        if not settings["cmd"]:
            raise UsageError("--train-cmd is empty")
    if args.no_gpu:
        settings["nvidia_smi"] = None
    with refused():
        return WorkerConfig(**settings, until=until)


class _TerminalFormatter(logging.Formatter):
    """The worker's log lines as they reach its terminal: what a job put in them (a reason,
    a path, an error) with its control characters spelled out."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_text(super().format(record), one_line=False)


def _submit(args: argparse.Namespace) -> int:
    command: list[str] = args.command
    if bool(command) == (args.config is not None):
        raise UsageError("give either a command after -- or --config FILE.json (one of them)")
    env = _flags.parse_pairs("--env", args.env)
    config = None
    if args.config is not None:
        try:
            config = json.loads(args.config.read_text())
        except OSError as exc:
            raise UsageError(f"--config {args.config}: {exc.strerror}") from exc
        except ValueError as exc:
            raise UsageError(f"--config {args.config}: not valid JSON ({exc})") from exc
        if not isinstance(config, dict):
            raise UsageError(f"--config {args.config}: must hold a JSON object")
    cwd = (args.cwd or Path.cwd()).absolute()
    if not cwd.is_dir():
        raise UsageError(f"--cwd {cwd}: not a directory")
    if args.max_attempts is not None and not 1 <= args.max_attempts <= MAX_TRIES:
        raise UsageError(
            f"--max-attempts must be between 1 and {MAX_TRIES}, got {args.max_attempts}"
        )
    with refused(_flags.flag_error):
        soak = _flags.soak_limits(args)
    job = JobOptions(
        argv=command or None,
        config=config,
        cwd=cwd,
        env=env,
        progress_dir=args.progress_dir.absolute() if args.progress_dir else None,
        soak=soak,
        stop_mode=args.stop_mode,
        priority=args.priority,
    )
    if args.max_attempts is not None:
        job["max_attempts"] = args.max_attempts
    sweeps = sweep_options(args)
    with refused(_flags.flag_error):
        # Before the database is opened (or created): a refused job changes nothing.
        validate_submission(**job)
        with _open(args, create=True) as store:
            if args.not_before is not None:
                sweeps["not_before"] = parse_not_before(args.not_before, store.now)
            job_id = _queue_call(lambda: store.submit(name=args.name, **job, **sweeps))
            for member in [job_id] if args.array is None else store.array_members(job_id):
                print(member)  # a new array's every id, the first being the array's
    return exits.EXIT_PASSED


def _cancel(args: argparse.Namespace) -> int:
    if args.array:
        return _cancel_array(args)
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.cancel(args.id))
    if job.status == "cancelled":
        print(f"job {job.id} cancelled")
    else:
        worker = terminal_text(job.worker or "?")
        print(
            f"job {job.id}: cancel requested; it is running on {worker}, which stops it "
            "(it may stop itself first)"
        )
    return exits.EXIT_PASSED


def _cancel_array(args: argparse.Namespace) -> int:
    with _open(args) as store:
        members = _queue_call(lambda: store.array_members(args.id))
        if not members:
            raise UsageError(f"no array {args.id} (an array's id is its first job's)")
        done = 0
        for job_id in members:
            job = _queue_call(partial(store.get, job_id))
            if job.status in ("queued", "running"):
                _queue_call(partial(store.cancel, job_id))
                done += 1
    print(f"array {args.id}: cancel sent to {done} of {len(members)} jobs (the others had ended)")
    return exits.EXIT_PASSED


def _requeue(args: argparse.Namespace) -> int:
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.requeue(args.id))
    print(f"job {job.id} queued again")
    return exits.EXIT_PASSED


def _worker(args: argparse.Namespace) -> int:
    with refused():  # a bad duration or count, named by its flag
        for spec in _worker_flags():
            checked(spec.metadata["flag"], spec, getattr(args, spec.name))
    _flags.metrics_from_args(args)  # refused before the database is opened
    until = worker_in_allocation(args)
    gpus = args.gpus.split(",") if args.gpus is not None else []
    if gpus and not _GPU_LIST.match(args.gpus):
        raise UsageError(f"--gpus {args.gpus!r}: expected a list such as 0 or 2,3 (or GPU UUIDs)")
    if any(g.isdigit() and int(g) >= MAX_GPUS for g in gpus):
        raise UsageError(f"--gpus {args.gpus!r}: a GPU index is below {MAX_GPUS}")
    if args.clear_fault is not None:
        with _open(args) as store:
            return _queue_call(lambda: clear_faults(args, store))
    config = worker_config(args, until=until)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_TerminalFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    import anyio

    from ..queue import prepare_runs_dir

    db = args.db or default_db()
    default_location = args.db is None and not os.environ.get("ASYNCSOAK_DB")
    wait = _wait_for_db(args, WORKER_WAIT_FOR_DB_S)
    try:
        # Workers first: a queue that does not exist yet is created, a server that is not
        # up yet waited for.
        opened = partial(open_for_worker, db, wait=wait, default_location=default_location)
        store = _queue_call(opened, UNAVAILABLE)
    except KeyboardInterrupt:
        return exits.SHELL_SIGNAL_BASE + signal.SIGINT
    with store:
        runs_dir = (config.runs_dir or store.default_runs_dir()).absolute()
        _queue_call(lambda: prepare_runs_dir(runs_dir))
        config = dataclasses.replace(config, runs_dir=runs_dir)
        try:
            try:
                anyio.run(_work, args, store, config)
            except BaseExceptionGroup as group:
                inner: BaseException = group
                while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
                    inner = inner.exceptions[0]
                if not isinstance(inner, QueueError | ValidationError):
                    raise
                raise inner from group
        # The database gone again before the worker registered: try again later (75).
        except QueueUnavailableError:
            raise
        except QueueDatabaseLostError as exc:
            # The SQLite file deleted or replaced under the worker: exit 1, not 75.
            print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
            return exits.EXIT_FAILED
        # A metrics port already taken is found once the worker starts: still exit 2.
        except (QueueError, ValidationError) as exc:
            raise UsageError(str(exc)) from exc
    return exits.EXIT_PASSED


async def _work(args: argparse.Namespace, store: JobStore, config: WorkerConfig) -> None:
    import anyio

    from ..queue import run_worker

    stop = anyio.Event()
    kill = anyio.Event()
    log = logging.getLogger("asyncsoak.queue")

    async def watch_signals() -> None:
        # SIGHUP (a closed terminal, a dropped ssh session) is a stop like SIGTERM: the job is
        # requeued as interrupted, never left to be found orphaned later.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                name = exits.signal_name(signum)
                if stop.is_set():
                    log.warning("%s again: killing the running job now", name)
                    kill.set()
                    return
                log.warning(
                    "%s: stopping after the running job saves (up to %gs); again to kill it now",
                    name,
                    config.stop_timeout_seconds,
                )
                stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals)
        try:
            await run_worker(
                store,
                config,
                once=args.once,
                stop_event=stop,
                kill_event=kill,
                name=args.name,
                metrics=_flags.metrics_from_args(args),
            )
        finally:
            tg.cancel_scope.cancel()
