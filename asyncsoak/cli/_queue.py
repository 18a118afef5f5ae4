"""The job queue's commands: submit, jobs, job, cancel, requeue, logs, workers, worker.

``--db`` defaults to ``$ASYNCSOAK_DB``, else ``queue.db`` in the user's data directory; a
``postgresql://`` URL (or ``postgresql:`` with libpq's ``PG*`` variables) is a PostgreSQL
queue shared by many hosts.  Runs live beside an SQLite database (``queue.runs/``), or in the
user's data directory for PostgreSQL, unless ``asyncsoak worker --runs-dir`` says otherwise.
Tables are for people (aligned, ages like "3m ago"), ``--json`` is for scripts.
Job environment values are never printed, only their names.

A database server that cannot be reached is waited for (``--wait-for-db``: for ever by a
worker, a few seconds by the other commands); when the wait is over the command exits with
:data:`EXIT_DB_UNAVAILABLE`, not the usage error's 2, having changed nothing.  A queue that
does not exist yet lists as empty, and a worker creates it (``queue/_fleet.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import re
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from .._analysis import format_bytes
from .._contract import (
    EXIT_PASSED,
    Masker,
    ValidationError,
    argv_secrets,
    detailed_exit_code,
    format_duration,
    secret_values,
    signal_name,
    terminal_text,
)
from .._supervisor import STOP_MODES, seconds
from ..queue import (
    COMMAND_WAIT_FOR_DB_S,
    FAILED,
    INTEGER_MAX,
    KILLED_BEFORE_SAVING,
    LOG_TAIL_HEADER,
    LOST,
    LOST_AFTER_S,
    PRUNE_AFTER_S,
    SUCCEEDED,
    WARNINGS_HEADER,
    WORKER_WAIT_FOR_DB_S,
    Attempt,
    DatabaseUnreachableError,
    GpuFault,
    Job,
    JobNotFoundError,
    JobStatus,
    JobStore,
    Plan,
    QueueError,
    QueueMissingError,
    QueueUnavailableError,
    WorkerConfig,
    WorkerView,
    checked,
    default_data_dir,
    describe_exit,
    open_for_worker,
    open_when_reachable,
    process_alive,
    validate_submission,
    worker_views,
)
from . import EXIT_OK, UsageError
from ._run import add_metrics_flags, add_soak_limits, metrics_from_args, parse_pairs, soak_limits
from ._slurm import worker_in_allocation
from ._sweeps import (
    add_submit_flags,
    add_worker_flags,
    attempt_cells,
    clear_faults,
    fault_dicts,
    job_note,
    parse_not_before,
    plan_dict,
    plan_fields,
    print_submitted,
    sweep_options,
    why_not_retried,
    worker_gpu_text,
)

_GPU_LIST = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)(,(\d+|(GPU|MIG)-[0-9A-Za-z-]+))*$")
_FOLLOW_INTERVAL_SECONDS = 0.5
_NAME_WIDTH = 28
_NOTE_WIDTH = 90
#: Exit status of a queue command whose database could not be reached in time (sysexits'
#: EX_TEMPFAIL: try again later), apart from bad usage's 2, so a service manager restarts it.
EXIT_DB_UNAVAILABLE = 75


def default_db() -> str:
    """``$ASYNCSOAK_DB``, else ``asyncsoak/queue.db`` in ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    return os.environ.get("ASYNCSOAK_DB") or str(default_data_dir() / "queue.db")


def _integer(text: str, *, minimum: int = -INTEGER_MAX) -> int:
    """An argparse type: an integer the database can hold (SQLite's are 64-bit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not minimum <= value <= INTEGER_MAX:
        raise argparse.ArgumentTypeError(f"{text} is out of range ({minimum} to {INTEGER_MAX})")
    return value


def _job_id(text: str) -> int:
    return _integer(text, minimum=1)


def _count_arg(text: str) -> int:
    return _integer(text, minimum=0)


def db_parser() -> argparse.ArgumentParser:
    """The ``--db`` and ``--wait-for-db`` flags of every command that opens the queue
    (``watch --job`` too)."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument(
        "--db",
        default=None,
        metavar="PATH|URL",
        help="queue database: an SQLite file, or postgresql://... for a queue shared by many "
        "hosts (default: $ASYNCSOAK_DB, else ~/.local/share/asyncsoak/queue.db)",
    )
    db.add_argument(
        "--wait-for-db",
        type=_wait_seconds,
        default=None,
        metavar="S",
        help="how long to wait for a database server that cannot be reached, retrying with "
        f"backoff ('inf': for ever; default: for ever for a worker, {COMMAND_WAIT_FOR_DB_S:g}s "
        f"for the other commands); then exit {EXIT_DB_UNAVAILABLE}",
    )
    return db


def register(subparsers: Any) -> None:
    db = db_parser()

    p = subparsers.add_parser(
        "submit",
        parents=[db],
        help="queue a training job",
        description="Queue a training job and print its id.  The command may contain {job_id}, "
        "{db} and {run_dir}; it runs in --cwd (default: the current directory).",
    )
    p.add_argument("--name", help="a name to recognise the job by")
    p.add_argument("--priority", type=_integer, default=0, help="higher runs first (default 0)")
    p.add_argument(
        "--max-attempts",
        type=_count_arg,
        default=None,
        metavar="K",
        help="runs that fail (or lose their worker) before the job is failed (default 3)",
    )
    p.add_argument("--cwd", type=Path, help="working directory (default: the current one)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="environment override for the job (repeatable; values are never printed)",
    )
    p.add_argument("--progress-dir", type=Path, help="liveness directory (default: the run dir)")
    p.add_argument(
        "--stop-mode",
        choices=STOP_MODES,
        default="stdin",
        help="how the worker asks the job to stop: close its stdin (default), or SIGTERM "
        "to its process group or to its leader",
    )
    add_soak_limits(p)
    add_submit_flags(p)
    p.add_argument("--config", type=Path, help="a JSON config for the worker's trainer command")
    p.add_argument("command", nargs="*", help="after --: the command and its arguments")
    p.set_defaults(handler=_guarded(_submit))

    p = subparsers.add_parser("jobs", parents=[db], help="list jobs")
    statuses = [status.value for status in JobStatus]  # as stored, attempts' interrupted too
    p.add_argument("--status", choices=statuses, help="only these jobs")
    p.add_argument("--array", type=_job_id, metavar="ID", help="only the jobs of this array")
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    p.set_defaults(handler=_guarded(_jobs))

    p = subparsers.add_parser("job", parents=[db], help="show one job and its attempts")
    p.add_argument("id", type=_job_id)
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    p.set_defaults(handler=_guarded(_job))

    p = subparsers.add_parser("cancel", parents=[db], help="cancel a queued or running job")
    p.add_argument("id", type=_job_id)
    p.add_argument(
        "--array", action="store_true", help="ID is an array's: cancel all of its jobs not ended"
    )
    p.set_defaults(handler=_guarded(_cancel))

    p = subparsers.add_parser("requeue", parents=[db], help="queue a finished job again")
    p.add_argument("id", type=_job_id)
    p.set_defaults(handler=_guarded(_requeue))

    p = subparsers.add_parser("logs", parents=[db], help="print a job's train.log")
    p.add_argument("id", type=_job_id)
    p.add_argument("--attempt", type=_job_id, metavar="K", help="which attempt (default: the last)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--lines", "-n", type=_count_arg, metavar="N", help="only the last N lines")
    p.set_defaults(handler=_guarded(_logs))

    p = subparsers.add_parser(
        "workers",
        parents=[db],
        help="list workers",
        description="List workers: alive, stopped, or lost (silent for longer than "
        "--stale-after, or its process gone on this host), with when each was last seen.  "
        f"Workers gone for more than {PRUNE_AFTER_S / 3600:g}h are left out unless --all.",
    )
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    p.add_argument("--all", action="store_true", help="also workers gone for long")
    p.add_argument(
        "--stale-after",
        type=float,
        default=LOST_AFTER_S,
        metavar="S",
        help=f"heartbeat age that makes a worker lost (default {LOST_AFTER_S:g})",
    )
    p.set_defaults(handler=_guarded(_workers))

    p = subparsers.add_parser(
        "worker",
        parents=[db],
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
    add_worker_flags(p)
    add_metrics_flags(p)
    p.set_defaults(handler=_guarded(_worker))


# --- helpers ---------------------------------------------------------------------------


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
            # Checked by _checked_worker_flags, so a bad value is refused naming the flag.
            parse: Callable[[str], Any] = float if kind == "seconds" else _integer
            help = f"{help} (default {spec.default:g})"
        else:
            parse = Path if kind == "path" else str
        default = spec.default if kind in ("seconds", "count", "text") else None
        p.add_argument(
            flag, dest=spec.name, type=parse, default=default, metavar=metavar, help=help
        )


def _checked_worker_flags(args: argparse.Namespace) -> None:
    """Refuse a bad duration or count among the worker's flags, naming the flag."""
    for spec in _worker_flags():
        try:
            checked(spec.metadata["flag"], spec, getattr(args, spec.name))
        except ValidationError as exc:
            raise UsageError(str(exc)) from None


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
    try:
        return WorkerConfig(**settings, until=until)
    except ValidationError as exc:
        raise UsageError(str(exc)) from None


def _wait_seconds(text: str) -> float:
    """An argparse type: seconds to wait, ``inf`` for ever."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'inf', got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'inf', got {text!r}")
    return value


def _wait_for_db(args: argparse.Namespace, default: float = COMMAND_WAIT_FOR_DB_S) -> float:
    wait: float | None = args.wait_for_db
    return default if wait is None else wait


def _open(args: argparse.Namespace, *, create: bool = False) -> JobStore:
    try:
        return open_when_reachable(args.db or default_db(), wait=_wait_for_db(args), create=create)
    except (DatabaseUnreachableError, QueueUnavailableError):
        raise
    except QueueError as exc:
        raise UsageError(str(exc)) from exc


def _open_existing(args: argparse.Namespace) -> JobStore | None:
    """The queue for a command that only reads or changes what is there: None when there is
    no queue yet (an empty queue, not an error)."""
    try:
        return _open(args)
    except UsageError as exc:
        if isinstance(exc.__cause__, QueueMissingError):
            return None
        raise


def _queue_call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except QueueUnavailableError:
        raise
    except QueueError as exc:
        raise UsageError(str(exc)) from exc


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler``, exiting :data:`EXIT_DB_UNAVAILABLE` when its database cannot be reached."""

    @functools.wraps(handler)
    def guarded(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (DatabaseUnreachableError, QueueUnavailableError) as exc:
            print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
            return EXIT_DB_UNAVAILABLE

    return guarded


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, now - ts)
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h ago"
    return f"{seconds // 86400:.0f}d ago"


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({_age(ts, now)})"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class _TerminalFormatter(logging.Formatter):
    """The worker's log lines as they reach its terminal: what a job put in them (a reason,
    a path, an error) with its control characters spelled out."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_text(super().format(record), one_line=False)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    rows = [[terminal_text(str(cell)) for cell in row] for row in rows]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [
            str(cell).rjust(widths[i]) if i in right else str(cell).ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _masker(job: Job) -> Masker:
    return Masker(secret_values(os.environ, job.env) | argv_secrets(job.argv or ()))


def _label(job: Job) -> str:
    if job.name:
        return job.name
    if job.argv is not None:
        return shlex.join(_masker(job).argv(job.argv))
    return "(config)"


def _note(job: Job, now: float) -> str:
    """One line saying what a person most needs to know about the job."""
    if job.status == "running":
        note = f"heartbeat {_age(job.heartbeat_at, now)}"
        if job.cancel_requested:
            note += ", cancel requested"
        return note
    if job.status == "queued":
        if job.attempt == 0:
            return ""
        if job.last_outcome == "interrupted":
            killed = job.reason == KILLED_BEFORE_SAVING
            return "interrupted" + (", killed before saving" if killed else "") + "; resumes next"
        if job.reason is None:
            return "requeued"
        return f"retrying after {job.reason} ({job.attempts}/{job.max_attempts} attempts used)"
    if job.status == "failed":
        note = f"{job.reason or 'failed'}: {describe_exit(job.returncode)}"
        if job.error and LOG_TAIL_HEADER in job.error:
            note += "; log: " + job.error.rstrip().splitlines()[-1].strip()
        return note
    if job.status == "cancelled":
        return "cancelled before it ran" if job.attempt == 0 else "cancelled while running"
    notes = []
    if job.interruptions:
        notes.append(f"resumed after {_count(job.interruptions, 'interruption')}")
    if job.attempts:
        notes.append(f"after {_count(job.attempts, 'failed attempt')}")
    if job.error and job.error.startswith(WARNINGS_HEADER):
        # A leak or a slowdown in a job that succeeded (the whole list: `asyncsoak job ID`).
        warnings = job.error.splitlines()[1:]
        more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
        notes.append(f"warning: {warnings[0]}{more}")
    return ", ".join(notes)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("s" if n != 1 else "")


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


# --- commands --------------------------------------------------------------------------


def _submit(args: argparse.Namespace) -> int:
    command: list[str] = args.command
    if bool(command) == (args.config is not None):
        raise UsageError("give either a command after -- or --config FILE.json (one of them)")
    env = parse_pairs("--env", args.env)
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
    if args.max_attempts is not None and args.max_attempts < 1:
        raise UsageError("--max-attempts must be at least 1")
    try:
        soak = soak_limits(args)
    except ValidationError as exc:
        raise UsageError(str(exc)) from exc
    job: dict[str, Any] = {
        "argv": command or None,
        "config": config,
        "cwd": cwd,
        "env": env,
        "progress_dir": args.progress_dir.absolute() if args.progress_dir else None,
        "soak": soak,
        "stop_mode": args.stop_mode,
        "priority": args.priority,
    }
    if args.max_attempts is not None:
        job["max_attempts"] = args.max_attempts
    sweeps = sweep_options(args)
    try:
        # Before the database is opened (or created): a refused job changes nothing.
        validate_submission(**job)
        with _open(args, create=True) as store:
            if args.not_before is not None:
                sweeps["not_before"] = parse_not_before(args.not_before, store.now)
            job_id = _queue_call(lambda: store.submit(name=args.name, **job, **sweeps))
            print_submitted(store, job_id, args.array)
    except ValidationError as exc:
        raise UsageError(str(exc)) from exc
    return EXIT_OK


def _jobs(args: argparse.Namespace) -> int:
    store = _open_existing(args)
    plans: dict[int, Plan] = {}
    by_id: dict[int, Job] = {}
    if store is None:
        jobs: list[Job] = []
        now = time.time()
    else:
        with store:
            jobs = _queue_call(lambda: store.jobs(args.status))
            # Ages against the queue's clock (the database's on PostgreSQL), not this host's.
            now = _queue_call(store.now)
            plans = _queue_call(store.plans)
            by_id = {job.id: job for job in _queue_call(store.jobs)} if plans else {}
    if args.array is not None:
        jobs = [job for job in jobs if job.id in plans and plans[job.id].array_id == args.array]
    if args.json:
        _print_json([{**job.to_public_dict(), **plan_dict(plans.get(job.id))} for job in jobs])
        return EXIT_OK
    if not jobs:
        print("no jobs" + (f" {args.status}" if args.status else ""))
        return EXIT_OK
    rows = [
        [
            str(job.id),
            _clip(_label(job), _NAME_WIDTH),
            job.status,
            str(job.priority),
            str(job.attempt),
            _age(job.created_at, now),
            _age(job.finished_at, now) if job.finished_at else "-",
            job.worker or "-",
            _clip(
                "; ".join(
                    n for n in (job_note(job, plans.get(job.id), by_id, now), _note(job, now)) if n
                ),
                _NOTE_WIDTH,
            ),
        ]
        for job in jobs
    ]
    headers = ["ID", "NAME", "STATUS", "PRI", "RUNS", "SUBMITTED", "FINISHED", "WORKER", "NOTE"]
    print(_table(headers, rows, right=(0, 3, 4)))
    return EXIT_OK


def _job(args: argparse.Namespace) -> int:
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.get(args.id))
        attempts = _queue_call(lambda: store.attempts(args.id))
        now = _queue_call(store.now)
        plan = _queue_call(lambda: store.plan(args.id))
        causes = _queue_call(lambda: store.attempt_causes(args.id))
    masker = _masker(job)
    if args.json:
        data = {**job.to_public_dict(), **plan_dict(plan)}
        data["exit_code"] = queue_exit_code(job.status, job.reason)
        data["attempts"] = [
            {**_attempt_dict(a), **_cause_dict(causes.get(a.attempt))} for a in attempts
        ]
        _print_json(data)
        return EXIT_OK
    status = job.status + (f" ({job.reason})" if job.reason else "")
    if job.cancel_requested and job.status == "running":
        status += ", cancel requested"
    fields = [
        ("status", status),
        (
            "command",
            shlex.join(masker.argv(job.argv)) if job.argv else "(trainer command, --config)",
        ),
        ("cwd", job.cwd or "-"),
        ("env", ", ".join(sorted(job.env)) + " (values hidden)" if job.env else "-"),
        ("priority", str(job.priority)),
        ("attempts", f"{job.attempts} of {job.max_attempts} counted, {job.attempt} run(s)"),
        ("stop mode", job.stop_mode),
        ("progress dir", job.progress_dir or "(the run dir)"),
        ("soak limits", _soak_text(job.soak)),
        ("submitted", _when(job.created_at, now)),
        ("started", _when(job.started_at, now)),
        ("finished", _when(job.finished_at, now)),
        ("worker", f"{job.worker} on {job.host}" if job.worker else "-"),
        ("exit", describe_exit(job.returncode) if job.attempt and job.status != "running" else "-"),
        ("artifact", job.artifact or "-"),
        *plan_fields(plan, now),
    ]
    why = why_not_retried(job, attempts)
    if why:
        fields.insert(1, ("why", why))
    print(f"job {job.id}" + (f"  {terminal_text(job.name)}" if job.name else ""))
    for key, value in fields:
        print(f"  {key:<13} {terminal_text(value)}")
    # A succeeded job's warnings are listed with its attempts, below.
    if job.error and not job.error.startswith(WARNINGS_HEADER):
        print("\nerror:")
        print(
            "\n".join("  " + line for line in terminal_text(job.error, one_line=False).splitlines())
        )
    if attempts:
        print("\nattempts:")
        rows = [
            [
                str(a.attempt),
                a.worker,
                a.host,
                _age(a.started_at, now),
                format_duration((a.finished_at or now) - a.started_at),
                a.outcome or "running",
                a.reason or "-",
                "-" if a.returncode is None else str(a.returncode),
                *attempt_cells(causes.get(a.attempt)),
            ]
            for a in attempts
        ]
        headers = ["#", "WORKER", "HOST", "STARTED", "TOOK", "OUTCOME", "REASON", "RC"]
        headers += ["CLASS", "COUNTED", "GPUS"]
        print("\n".join("  " + line for line in _table(headers, rows, right=(0,)).splitlines()))
        for a in attempts:
            lines = _attempt_details(a, masker)
            if lines:
                print(f"\nattempt {a.attempt}:")
                print("\n".join("  " + terminal_text(line) for line in lines))
    return EXIT_OK


def _attempt_details(a: Attempt, masker: Masker) -> list[str]:
    """What the attempt's artifact said, as the database keeps it (any host can read it)."""
    lines = []
    summary = a.summary or {}
    if summary.get("verdict"):
        lines.append(f"soak verdict  {summary['verdict']}")
    for failure in summary.get("failures") or []:
        lines.append(
            f"failure       {failure.get('reason')}: {masker(str(failure.get('message')))}"
        )
    for warning in summary.get("warnings") or []:
        lines.append(f"warning       {masker(str(warning))}")
    for key, trend in sorted((summary.get("trends") or {}).items()):
        if trend.get("verdict") == "leak":
            slope = trend.get("slope_per_hour")
            unit = trend.get("unit") or ""
            rate = f" (+{slope:.3g} {unit}/h)" if isinstance(slope, int | float) else ""
            lines.append(f"trend         {key}: leak{rate}")
    if a.note:
        lines.append(f"note          {a.note}")
    return lines


#: Settings whose default goes without saying in a job's limits (the steps read as progress).
_QUIET_DEFAULTS = {"progress_source": "auto", "loss_check": "fail"}


def _soak_text(soak: dict[str, Any]) -> str:
    """``leak_check=fail max_rss=1.0GiB ... stale_progress=300s``: the limits a job carries."""
    shown = []
    for key, value in sorted(soak.items()):
        if value is None or value is False or _QUIET_DEFAULTS.get(key) == value:
            continue
        if value is True:
            shown.append(key)
        elif key.endswith("_seconds"):
            seconds = value if value == "auto" else f"{value:g}s"
            shown.append(f"{key.removesuffix('_seconds')}={seconds}")
        elif key.endswith("_signal"):
            shown.append(f"{key}={signal_name(value)}")
        elif key.endswith("_bytes"):
            size = format_bytes(value).replace(" ", "")
            shown.append(f"{key.removesuffix('_bytes')}={size}")
        else:
            shown.append(f"{key}={value}")
    return " ".join(shown) or "defaults"


def _attempt_dict(a: Attempt) -> dict[str, Any]:
    return {
        **dataclasses.asdict(a),
        "log": str(a.directory / "train.log"),
        "exit_code": queue_exit_code(a.outcome, a.reason),
    }


def queue_exit_code(status: str | None, reason: str | None) -> int | None:
    """The status ``asyncsoak run --detailed-exit-codes`` gives the same end: 0 succeeded, a
    failure's reason's (1 for a queue's own reason, an outcome lost say); None otherwise."""
    if status == SUCCEEDED:
        return EXIT_PASSED
    if status == FAILED:
        return detailed_exit_code(reason)
    return None


def _cause_dict(cause: Any) -> dict[str, Any]:
    if cause is None:
        return {"failure_class": None, "cause": None, "counted": None, "gpus": []}
    return {
        "failure_class": cause.failure_class,
        "cause": cause.cause,
        "counted": cause.counted,
        "gpus": list(cause.gpus),
    }


def _log_elsewhere(job: Job, a: Attempt, path: Path) -> str:
    """Why ``path`` is not here: on which host it is, when the attempt ran on another."""
    if a.host != socket.gethostname():
        return (
            f"job {job.id} attempt {a.attempt} ran on host {a.host}: its log is there, at "
            f"{a.host}:{path} (run asyncsoak logs on {a.host}, or keep --runs-dir on shared "
            "storage)"
        )
    return f"job {job.id} attempt {a.attempt}: no log at {path}"


def _existing_for(args: argparse.Namespace) -> JobStore:
    """The queue holding job ``args.id``; no queue at all holds no job either."""
    store = _open_existing(args)
    if store is None:
        raise UsageError(str(JobNotFoundError(args.id)))
    return store


def _cancel(args: argparse.Namespace) -> int:
    if args.array:
        return _cancel_array(args)
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.cancel(args.id))
    if job.status == "cancelled":
        print(f"job {job.id} cancelled")
    else:
        print(
            f"job {job.id}: cancel requested; it is running on {terminal_text(job.worker or '?')}, "
            "which stops it "
            "(it may stop itself first)"
        )
    return EXIT_OK


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
    return EXIT_OK


def _requeue(args: argparse.Namespace) -> int:
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.requeue(args.id))
    print(f"job {job.id} queued again")
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    if args.lines is not None and args.lines < 0:
        raise UsageError("--lines must be at least 0")
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.get(args.id))
        attempts = store.attempts(args.id)
        if not attempts:
            raise UsageError(f"job {job.id} has not run yet: no logs")
        if args.attempt is None:
            chosen = attempts[-1]
        else:
            matching = [a for a in attempts if a.attempt == args.attempt]
            if not matching:
                known = ", ".join(str(a.attempt) for a in attempts)
                raise UsageError(f"job {job.id} has no attempt {args.attempt} (it has {known})")
            chosen = matching[0]
        masker = _masker(job)
        path = chosen.directory / "train.log"
        try:
            with open(path, "rb") as f:
                data = f.read()
                text = data.decode("utf-8", errors="replace")
                if args.lines is not None:
                    lines = text.splitlines(keepends=True)
                    text = "".join(lines[-args.lines :]) if args.lines else ""
                sys.stdout.write(masker(text))
                sys.stdout.flush()
                if args.follow:
                    _follow(f, masker, lambda: _attempt_running(store, chosen))
        except FileNotFoundError:
            if not args.follow or chosen.host != socket.gethostname():
                raise UsageError(_log_elsewhere(job, chosen, path)) from None
        except KeyboardInterrupt:
            pass
    return EXIT_OK


def _attempt_running(store: JobStore, attempt: Attempt) -> bool:
    return any(
        a.attempt == attempt.attempt and a.outcome is None for a in store.attempts(attempt.job_id)
    )


def _follow(f: Any, masker: Masker, running: Callable[[], bool]) -> None:
    # The log grows by whole lines in practice; a line cut by a read is printed in two parts.
    while True:
        still_running = running()
        chunk = f.read()
        if chunk:
            sys.stdout.write(masker(chunk.decode("utf-8", errors="replace")))
            sys.stdout.flush()
        elif not still_running:
            return
        else:
            time.sleep(_FOLLOW_INTERVAL_SECONDS)


def _workers(args: argparse.Namespace) -> int:
    try:
        seconds("--stale-after", args.stale_after)
    except ValidationError as exc:
        raise UsageError(str(exc)) from None
    views: list[WorkerView] = []
    pruned, now = 0, time.time()
    owned: dict[str, list[str]] = {}
    faults: list[GpuFault] = []
    store = _open_existing(args)
    if store is not None:
        with store:
            workers = _queue_call(store.workers)
            running = [job for job, _holder in _queue_call(store.running)]
            now = _queue_call(store.now)
            owned = _queue_call(store.worker_gpus)
            faults = _queue_call(store.gpu_faults)
        views, pruned = worker_views(
            workers,
            running,
            now,
            lost_after=args.stale_after,
            show_all=args.all,
            this_host=socket.gethostname(),
            process_alive=process_alive,
        )
    on_host = {v.info.host: [f for f in faults if f.host == v.info.host] for v in views}
    if args.json:
        _print_json(
            [
                {
                    **_worker_dict(v),
                    "gpus": owned.get(v.info.name, []),
                    "gpu_faults": fault_dicts(on_host[v.info.host]),
                }
                for v in views
            ]
        )
        return EXIT_OK
    if not views:
        print("no workers")
    else:
        rows = [
            [
                v.info.name,
                v.info.host,
                str(v.info.pid),
                _age(v.info.started_at, now),
                _age(v.last_seen, now),
                _worker_state_text(v, now),
                ",".join(map(str, v.jobs)) or "-",
                worker_gpu_text(owned.get(v.info.name, []), on_host[v.info.host]),
            ]
            for v in views
        ]
        headers = ["NAME", "HOST", "PID", "STARTED", "LAST SEEN", "STATE", "JOB", "GPUS"]
        print(_table(headers, rows, right=(2,)))
    if pruned:
        print(
            f"({_count(pruned, 'worker')} gone for more than {PRUNE_AFTER_S / 3600:g}h not shown: "
            "--all lists them)"
        )
    return EXIT_OK


def _worker_state_text(v: WorkerView, now: float) -> str:
    if v.state == LOST:
        return f"lost (last seen {_when(v.last_seen, now)})"
    return v.state


def _worker_dict(v: WorkerView) -> dict[str, Any]:
    # "job_id" is the job the jobs table says it holds: a job taken over is its new worker's.
    return {
        **dataclasses.asdict(v.info),
        "state": v.state,
        "last_seen": v.last_seen,
        "job_id": v.jobs[0] if v.jobs else None,
        "jobs": v.jobs,
    }


def _worker(args: argparse.Namespace) -> int:
    _checked_worker_flags(args)
    metrics_from_args(args)  # refused before the database is opened
    until = worker_in_allocation(args)
    if args.gpus is not None and not _GPU_LIST.match(args.gpus):
        raise UsageError(f"--gpus {args.gpus!r}: expected a list such as 0 or 2,3 (or GPU UUIDs)")
    if args.clear_fault is not None:
        with _open(args) as store:
            return int(_queue_call(lambda: clear_faults(args, store)))
    config = worker_config(args, until=until)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_TerminalFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    import anyio

    from ..queue import default_runs_dir, prepare_runs_dir

    db = args.db or default_db()
    try:
        # Workers first: a queue that does not exist yet is created, a server that is not
        # up yet waited for.
        store = open_for_worker(
            db,
            wait=_wait_for_db(args, WORKER_WAIT_FOR_DB_S),
            default_location=args.db is None and not os.environ.get("ASYNCSOAK_DB"),
        )
    except (DatabaseUnreachableError, QueueUnavailableError):
        raise
    except QueueError as exc:
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt:
        return 130
    with store:
        runs_dir = (config.runs_dir or default_runs_dir(store)).absolute()
        _queue_call(lambda: prepare_runs_dir(runs_dir))
        config = dataclasses.replace(config, runs_dir=runs_dir)
        try:
            anyio.run(_work, args, store, config)
        except BaseExceptionGroup as group:
            inner: BaseException = group
            while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
                inner = inner.exceptions[0]
            # The database gone again before the worker registered: try again later (75).
            if isinstance(inner, QueueUnavailableError):
                raise inner from group
            # A metrics port already taken is found once the worker starts: still exit 2.
            if isinstance(inner, QueueError | ValidationError):
                raise UsageError(str(inner)) from inner
            raise
        except QueueUnavailableError:
            raise
        except (QueueError, ValidationError) as exc:
            raise UsageError(str(exc)) from exc
    return EXIT_OK


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
                name = signal_name(signum)
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
                metrics=metrics_from_args(args),
            )
        finally:
            tg.cancel_scope.cancel()
