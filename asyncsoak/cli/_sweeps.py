"""The job queue's sweep and retry options: ``submit --after --array --not-before --gpus
--retry-on --no-retry-on``, ``worker --clear-fault``, and what the listings show of them."""

from __future__ import annotations

import argparse
import datetime
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._contract import MAX_SECONDS, exits
from ..queue import (
    DEPENDENCY_FAILED,
    MAX_INFRASTRUCTURE_RETRIES,
    RETRY_NAMES,
    Attempt,
    AttemptCause,
    GpuFault,
    Job,
    JobStore,
    Plan,
    check_plan,
    parse_array,
)
from . import UsageError, refused, typed

_DURATION = re.compile(r"^\+\s*([0-9]*\.?[0-9]+)\s*([smhd]?)$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def _ids(text: str) -> list[int]:
    expected = "job ids such as 3 or 3,4"
    ids = typed(lambda t: [int(part) for part in t.split(",") if part.strip()], text, expected)
    if not ids or min(ids) < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return ids


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _gpu_count(text: str) -> int:
    value = typed(int, text, "a number of GPUs")
    if value < 1:
        raise argparse.ArgumentTypeError(f"a job needs at least 1 GPU, got {text!r}")
    return value


def add_submit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--after",
        type=_ids,
        action="extend",
        default=[],
        metavar="ID[,ID...]",
        help="run only once these jobs succeeded (an array's id: all its jobs); cancelled when "
        "one fails or is cancelled",
    )
    p.add_argument(
        "--array",
        metavar="START-END[:STEP]",
        help="one job per index: %%a in the command and ASYNCSOAK_ARRAY_INDEX in its "
        "environment; prints every job's id, the first being the array's",
    )
    p.add_argument(
        "--not-before",
        metavar="TIME|+DURATION",
        help="not before this time: ISO 8601 (2026-05-01T02:00), HH:MM (the next one), or "
        "+90s, +30m, +2h, +1d from now",
    )
    p.add_argument(
        "--gpus",
        type=_gpu_count,
        metavar="N",
        help="GPUs the job needs on one worker (default: all of the worker's)",
    )
    for flag, help in (
        (
            "--retry-on",
            "retry failures with these reasons (or classes: infrastructure, job, run) "
            "even when their cause repeats",
        ),
        ("--no-retry-on", "never retry failures with these reasons (or classes)"),
    ):
        kinds: dict[str, Any] = {"type": _names, "action": "extend", "metavar": "REASON[,...]"}
        p.add_argument(flag, default=[], help=help, **kinds)


def parse_not_before(
    text: str,
    now: Callable[[], float],
    host_now: float | None = None,
    *,
    flag: str = "--not-before",
    ago: bool = False,
) -> float:
    """``--not-before`` in the queue's epoch seconds: ``+DURATION`` from ``now()``, ISO 8601
    (local unless it says) or the next ``HH:MM[:SS]``; ``ago`` (``goodput --since``) counts
    back, to the last ``HH:MM``."""
    match = _DURATION.match(text.strip())
    if match:
        ahead = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        if ahead > MAX_SECONDS:
            way = "back" if ago else "ahead"
            raise UsageError(f"{flag} {text!r}: at most a year {way} ({MAX_SECONDS:g}s)")
        return now() - ahead if ago else now() + ahead
    clock = _CLOCK.match(text.strip())
    if clock:
        hour, minute, second = (int(g or 0) for g in clock.groups())
        if hour > 23 or minute > 59 or second > 59:
            raise UsageError(f"{flag} {text!r}: not a time of day")
        current = datetime.datetime.fromtimestamp(host_now if host_now is not None else time.time())
        at = current.replace(hour=hour, minute=minute, second=second, microsecond=0)
        if (at > current) if ago else (at <= current):
            at += datetime.timedelta(days=-1 if ago else 1)
        return at.timestamp()
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        way = "ago" if ago else "from now"
        raise UsageError(
            f"{flag} {text!r}: expected an ISO 8601 time (2026-05-01T02:00), HH:MM, "
            f"or +DURATION (+90s, +30m, +2h, +1d {way})"
        ) from None


def sweep_options(args: argparse.Namespace) -> dict[str, Any]:
    """The submission's sweep options, without ``not_before`` (it needs the queue's clock)."""
    for flag, names in (("--retry-on", args.retry_on), ("--no-retry-on", args.no_retry_on)):
        unknown = sorted(set(names) - RETRY_NAMES)
        if unknown:
            raise UsageError(
                f"{flag}: unknown reason {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(RETRY_NAMES))})"
            )
    options = {key: getattr(args, key) for key in ("after", "gpus", "retry_on", "no_retry_on")}
    with refused():  # before the queue is opened (or created): a refused job changes nothing
        check_plan(**options)
        if args.array is not None:
            parse_array(args.array)
        if args.not_before is not None:
            parse_not_before(args.not_before, time.time)
    return {**options, "array": args.array}


def clear_faults(args: argparse.Namespace, store: JobStore) -> int:
    host = socket.gethostname()
    wanted = _names(args.clear_fault) or None
    cleared = store.clear_gpu_faults(host, wanted)
    if not cleared:
        print(
            f"no GPU of {host} is out of service" + (f" among {args.clear_fault}" if wanted else "")
        )
        return exits.EXIT_PASSED
    for fault in cleared:
        what = f"fault of job {fault.job_id}: {fault.detail}"
        print(f"GPU {fault.gpu} of {host} back in service ({what})")
    return exits.EXIT_PASSED


def job_note(job: Job, plan: Plan | None, jobs_by_id: Mapping[int, Job], now: float) -> str | None:
    """``jobs``' note for what only sweeps know (a wait, a dependency that failed), or None."""
    if job.status == "cancelled" and job.reason == DEPENDENCY_FAILED:
        return f"{DEPENDENCY_FAILED}: {job.error}" if job.error else DEPENDENCY_FAILED
    if plan is None or job.status != "queued":
        return None
    return plan_note(plan, jobs_by_id, now) or None


def local_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def plan_fields(plan: Plan, now: float) -> list[tuple[str, str]]:
    """``job N``'s lines about its plan."""
    retry_in = plan.retry_at is not None and plan.retry_at > now
    fields: list[tuple[str, Any]] = [
        ("array", plan.array_id is not None and f"{plan.array_id} index {plan.array_index}"),
        ("after", plan.after and ids_text(plan.after, ", ")),
        ("not before", plan.not_before is not None and local_time(plan.not_before)),
        ("gpus", plan.gpus is not None and str(plan.gpus)),
        ("retry on", ",".join(sorted(plan.retry_on))),
        ("no retry on", ",".join(sorted(plan.no_retry_on))),
        (
            "infra retries",
            plan.infra_failures
            and f"{plan.infra_failures} of {MAX_INFRASTRUCTURE_RETRIES} (not counted)",
        ),
        ("retry in", retry_in and f"{(plan.retry_at or now) - now:.0f}s (backoff)"),
    ]
    return [(key, value) for key, value in fields if value]


def attempt_cells(cause: AttemptCause | None) -> list[str]:
    """``job N``'s extra attempt columns: CLASS, COUNTED, GPUS."""
    if cause is None:
        return ["-", "-", "-"]
    counted = "-" if cause.counted is None else ("yes" if cause.counted else "no")
    return [cause.failure_class or "-", counted, ",".join(cause.gpus) or "-"]


def why_not_retried(job: Job, attempts: Sequence[Attempt]) -> str | None:
    """Why a failed job is not retried again: its last attempt's decision."""
    if job.status != "failed" or not attempts or not attempts[-1].note:
        return None
    for part in attempts[-1].note.split("; "):
        if part.startswith(("not retried", "no attempts left")) or "attempts used; no" in part:
            return part
    return None


def plan_dict(plan: Plan | None) -> dict[str, Any]:
    """The plan's keys in ``--json`` listings."""
    plan = plan or Plan()
    same = ("array_id", "array_index", "not_before", "gpus", "retry_at")
    return {key: getattr(plan, key) for key in same} | {
        "after": list(plan.after),
        "retry_on": sorted(plan.retry_on),
        "no_retry_on": sorted(plan.no_retry_on),
        "infrastructure_failures": plan.infra_failures,
    }


def worker_gpu_text(gpus: Sequence[str], faults: Sequence[GpuFault]) -> str:
    """``0,1,2,3 (2 faulted)`` for ``workers``."""
    on_host = {f.gpu for f in faults}
    faulted = sorted(on_host & set(gpus) | ({"all"} & on_host) if gpus else on_host)
    text = ",".join(gpus) or "-"
    return text + (f" ({','.join(faulted)} faulted)" if faulted else "")


def fault_dicts(faults: Sequence[GpuFault]) -> list[dict[str, Any]]:
    return [
        {"gpu": f.gpu, "job_id": f.job_id, "attempt": f.attempt, "at": f.at, "detail": f.detail}
        for f in faults
    ]


#: Job ids shown at most in a note (a job ``--after`` an array waits for each of its jobs).
IDS_SHOWN = 8


def ids_text(ids: Sequence[int], separator: str) -> str:
    """``ids`` for people: the first :data:`IDS_SHOWN`, then how many more."""
    shown = separator.join(str(i) for i in ids[:IDS_SHOWN])
    more = len(ids) - IDS_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def plan_note(plan: Plan, jobs_by_id: Mapping[int, Job], now: float) -> str:
    """What a queued job waits for, in words (``jobs``' note): "" when nothing."""
    waits = []
    pending = [a for a in plan.after if a not in jobs_by_id or jobs_by_id[a].status != "succeeded"]
    if pending:
        waits.append("after " + ids_text(pending, ","))
    if plan.not_before is not None and plan.not_before > now:
        waits.append(f"not before {plan.not_before - now:.0f}s from now")
    if plan.retry_at is not None and plan.retry_at > now:
        waits.append(f"retry backoff {plan.retry_at - now:.0f}s")
    note = f"waits: {', '.join(waits)}" if waits else ""
    if plan.gpus is not None:
        needs = f"needs {plan.gpus} GPU{'s' if plan.gpus != 1 else ''}"
        note = f"{note}; {needs}" if note else needs
    return note
