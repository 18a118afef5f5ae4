"""The job queue's read commands: ``jobs``, ``job``, ``logs`` and ``workers``: tables for
people, ``--json`` for scripts; a job's environment values are never printed, only names."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._analysis import CHECKPOINT_GLOBS, JobLedger, format_bytes
from .._contract import Masker, argv_secrets, exits, format_duration, secret_values, terminal_text
from .._supervisor import seconds
from .._view import goodput_line
from ..queue import (
    FAILED,
    KILLED_BEFORE_SAVING,
    LOG_TAIL_HEADER,
    LOST,
    PRUNE_AFTER_S,
    SUCCEEDED,
    WARNINGS_HEADER,
    Attempt,
    GpuFault,
    Job,
    JobStore,
    Plan,
    WorkerInfo,
    WorkerView,
    describe_exit,
    job_goodput,
    process_alive,
    public_job,
    worker_views,
)
from . import UsageError, _sweeps, refused
from ._queue_db import _existing_for, _queue_call, _read_queue

_FOLLOW_INTERVAL_SECONDS = 0.5
_NAME_WIDTH = 28
_NOTE_WIDTH = 90


def _age(ts: float | None, now: float) -> str:
    if ts is None or not math.isfinite(now - ts):
        return "-"
    seconds = max(0.0, now - ts)
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    unit, size = ("m", 60) if seconds < 3600 else ("h", 3600) if seconds < 86400 else ("d", 86400)
    return f"{seconds // size:.0f}{unit} ago"


def _indented(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _when(ts: float | None, now: float) -> str:
    return "-" if ts is None else f"{_sweeps.local_time(ts)} ({_age(ts, now)})"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    table = [list(headers), *([terminal_text(str(cell)) for cell in row] for row in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in table
    )


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
        note = f"{job.reason or 'failed'}: {_exit_words(job)}"
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


def _print_json(data: Any) -> int:
    print(json.dumps(data, indent=2, sort_keys=True))
    return exits.EXIT_PASSED


def _jobs(args: argparse.Namespace) -> int:
    def read(store: JobStore) -> tuple[list[Job], float, dict[int, Plan], dict[int, Job]]:
        # Ages against the queue's clock (the database's on PostgreSQL), not this host's.
        plans = store.plans()
        by_id = {job.id: job for job in store.jobs()} if plans else {}
        return store.jobs(args.status), store.now(), plans, by_id

    jobs, now, plans, by_id = _read_queue(args, read) or ([], time.time(), {}, {})
    if args.array is not None:
        jobs = [job for job in jobs if job.id in plans and plans[job.id].array_id == args.array]
    if args.json:
        return _print_json(
            [{**public_job(job), **_sweeps.plan_dict(plans.get(job.id))} for job in jobs]
        )
    if not jobs:
        print("no jobs" + (f" {args.status}" if args.status else ""))
        return exits.EXIT_PASSED
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
                    n
                    for n in (_sweeps.job_note(job, plans.get(job.id), by_id, now), _note(job, now))
                    if n
                ),
                _NOTE_WIDTH,
            ),
        ]
        for job in jobs
    ]
    headers = ["ID", "NAME", "STATUS", "PRI", "RUNS", "SUBMITTED", "FINISHED", "WORKER", "NOTE"]
    print(_table(headers, rows, right=(0, 3, 4)))
    return exits.EXIT_PASSED


def _job(args: argparse.Namespace) -> int:
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.get(args.id))
        attempts = _queue_call(lambda: store.attempts(args.id))
        now = _queue_call(store.now)
        plan = _queue_call(lambda: store.plan(args.id))
        causes = _queue_call(lambda: store.attempt_causes(args.id))
        ledger = _queue_call(lambda: job_goodput(store, job, attempts))
    masker = _masker(job)
    if args.json:
        data = {**public_job(job), **_sweeps.plan_dict(plan), "goodput": ledger.to_json()}
        data["exit_code"] = queue_exit_code(job.status, job.reason)
        data["attempts"] = [
            {**_attempt_dict(a), **_cause_dict(causes.get(a.attempt))} for a in attempts
        ]
        return _print_json(data)
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
        ("exit", _exit_words(job) if job.attempt and job.status != "running" else "-"),
        ("artifact", job.artifact or "-"),
        ("goodput", _goodput_text(ledger)),
        *_sweeps.plan_fields(plan, now),
    ]
    why = _sweeps.why_not_retried(job, attempts)
    if why:
        fields.insert(1, ("why", why))
    print(f"job {job.id}" + (f"  {terminal_text(job.name)}" if job.name else ""))
    for key, value in fields:
        print(f"  {key:<13} {terminal_text(value)}")
    # A succeeded job's warnings are listed with its attempts, below.
    if job.error and not job.error.startswith(WARNINGS_HEADER):
        print("\nerror:\n" + _indented(terminal_text(job.error, one_line=False)))
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
                *_sweeps.attempt_cells(causes.get(a.attempt)),
            ]
            for a in attempts
        ]
        headers = ["#", "WORKER", "HOST", "STARTED", "TOOK", "OUTCOME", "REASON", "RC"]
        headers += ["CLASS", "COUNTED", "GPUS"]
        print(_indented(_table(headers, rows, right=(0,))))
        for a in attempts:
            lines = _attempt_details(a, masker)
            if lines:
                print(f"\nattempt {a.attempt}:")
                print("\n".join("  " + terminal_text(line) for line in lines))
    return exits.EXIT_PASSED


def _goodput_text(ledger: JobLedger) -> str:
    """The job's ledger in one line; "-" before any attempt has one (queued, running)."""
    if len(ledger.unknown) == ledger.attempts:
        return "-"
    return goodput_line(ledger.ledger.to_json()).removeprefix("goodput ")


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
_QUIET_DEFAULTS = {
    "progress_source": "auto",
    "loss_check": "fail",
    "checkpoint_globs": list(CHECKPOINT_GLOBS),
}


def _soak_text(soak: dict[str, Any]) -> str:
    """``leak_check=fail max_rss=1.0GiB ... stale_progress=300s``: the limits a job carries."""
    shown = []
    for key, value in sorted(soak.items()):
        if isinstance(value, tuple):
            value = list(value)
        if value is None or value is False or _QUIET_DEFAULTS.get(key) == value:
            continue
        if value is True:
            shown.append(key)
        elif isinstance(value, dict):  # expect_every: GLOB -> seconds
            shown.extend(f"{key}={glob}={every:g}s" for glob, every in sorted(value.items()))
        elif isinstance(value, list):  # checkpoint_globs
            shown.append(f"{key}={','.join(map(str, value))}")
        elif key.endswith("_seconds"):
            seconds = value if value == "auto" else f"{value:g}s"
            shown.append(f"{key.removesuffix('_seconds')}={seconds}")
        elif key.endswith("_signal"):
            shown.append(f"{key}={exits.signal_name(value)}")
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
        return exits.EXIT_PASSED
    if status == FAILED:
        return exits.detailed_exit_code(reason)
    return None


def _cause_dict(cause: Any) -> dict[str, Any]:
    figures = {key: getattr(cause, key, None) for key in ("failure_class", "cause", "counted")}
    return figures | {"gpus": list(cause.gpus) if cause is not None else []}


def _log_elsewhere(job: Job, a: Attempt, path: Path) -> str:
    """Why ``path`` is not here: on which host it is, when the attempt ran on another."""
    if a.host != socket.gethostname():
        return (
            f"job {job.id} attempt {a.attempt} ran on host {a.host}: its log is there, at "
            f"{a.host}:{path} (run asyncsoak logs on {a.host}, or keep --runs-dir on shared "
            "storage)"
        )
    return f"job {job.id} attempt {a.attempt}: no log at {path}"


def _logs(args: argparse.Namespace) -> int:
    if args.lines is not None and args.lines < 0:
        raise UsageError("--lines must be at least 0")
    with _existing_for(args) as store:
        job = _queue_call(lambda: store.get(args.id))
        attempts = store.attempts(args.id)
        if not attempts:
            raise UsageError(f"job {job.id} has not run yet: no logs")
        wanted = attempts[-1].attempt if args.attempt is None else args.attempt
        chosen = next((a for a in attempts if a.attempt == wanted), None)
        if chosen is None:
            known = ", ".join(str(a.attempt) for a in attempts)
            raise UsageError(f"job {job.id} has no attempt {args.attempt} (it has {known})")
        masker = _masker(job)
        path = chosen.directory / "train.log"
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
                if args.lines is not None:
                    lines = text.splitlines(keepends=True)
                    text = "".join(lines[-args.lines :]) if args.lines else ""
                _write(masker(text))
                if args.follow:
                    _follow(f, masker, lambda: _attempt_running(store, chosen))
        except FileNotFoundError:
            if not args.follow or chosen.host != socket.gethostname():
                raise UsageError(_log_elsewhere(job, chosen, path)) from None
        except KeyboardInterrupt:
            pass
    return exits.EXIT_PASSED


def _exit_words(job: Job) -> str:
    """How the job's command ended, in words; a signal that ended a job failed for another
    reason than ``signaled`` or ``nonzero_exit`` was the monitor's stop, never the OOM killer."""
    ended = exits.decode(job.returncode)
    number = ended.signal or ended.shell_signal
    ours = number is not None and job.reason not in (None, "signaled", "nonzero_exit")
    return describe_exit(
        job.returncode, sent=[exits.signal_name(number)] if ours and number else None
    )


def _attempt_running(store: JobStore, attempt: Attempt) -> bool:
    return any(
        a.attempt == attempt.attempt and a.outcome is None for a in store.attempts(attempt.job_id)
    )


def _write(text: str) -> None:
    sys.stdout.write(terminal_text(text, one_line=False))
    sys.stdout.flush()


def _follow(f: Any, masker: Masker, running: Callable[[], bool]) -> None:
    # The log grows by whole lines in practice; a line cut by a read is printed in two parts.
    while True:
        still_running = running()
        chunk = f.read()
        if chunk:
            _write(masker(chunk.decode("utf-8", errors="replace")))
        elif not still_running:
            return
        else:
            time.sleep(_FOLLOW_INTERVAL_SECONDS)


_Fleet = tuple[list[WorkerInfo], list[Job], float, dict[str, list[str]], list[GpuFault]]


def _workers(args: argparse.Namespace) -> int:
    with refused():
        seconds("--stale-after", args.stale_after)

    def read(store: JobStore) -> _Fleet:
        running = [job for job, _holder in store.running()]
        return store.workers(), running, store.now(), store.worker_gpus(), store.gpu_faults()

    workers, running, now, owned, faults = _read_queue(args, read) or ([], [], time.time(), {}, [])
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
        return _print_json(
            [
                {
                    **_worker_dict(v),
                    "gpus": owned.get(v.info.name, []),
                    "gpu_faults": _sweeps.fault_dicts(on_host[v.info.host]),
                }
                for v in views
            ]
        )
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
                f"lost (last seen {_when(v.last_seen, now)})" if v.state == LOST else v.state,
                ",".join(map(str, v.jobs)) or "-",
                _sweeps.worker_gpu_text(owned.get(v.info.name, []), on_host[v.info.host]),
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
    return exits.EXIT_PASSED


def _worker_dict(v: WorkerView) -> dict[str, Any]:
    # "job_id" is the job the jobs table says it holds: a job taken over is its new worker's.
    return {
        **dataclasses.asdict(v.info),
        "state": v.state,
        "last_seen": v.last_seen,
        "job_id": v.jobs[0] if v.jobs else None,
        "jobs": v.jobs,
    }
