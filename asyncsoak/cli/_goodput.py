"""``asyncsoak goodput``: where the GPU-hours of runs (artifacts, joined by job), or of the
queue's jobs, went; the arithmetic is ``_analysis``'s, this module reads and prints."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._analysis import JobLedger, fleet_ledgers, fleet_total, join_runs, lost_by_cause, run_span
from .._contract import exits, format_duration, terminal_text
from .._view import goodput_line
from ..artifact import load
from ..queue import artifact_section, queue_goodput
from . import UsageError
from ._queue_db import _guarded, _read_queue, db_parser
from ._sweeps import parse_not_before

#: How many jobs the table of those that lost most shows.
TOP_JOBS = 10
#: A cause with less than this share of the time is left out of the table.
NEGLIGIBLE_SHARE = 0.0005


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "goodput",
        parents=[db_parser()],
        help="where the GPU-hours of runs, jobs or a queue went",
        description="The goodput ledger of runs (artifacts; a directory of them), of the "
        "jobs they make (a queue job's attempts, a SLURM requeue, a Kubernetes restart are "
        "joined), or of a whole queue (no argument: the default queue, or --db): the lost "
        "GPU-hours by cause, largest first, and the jobs that lost most.",
    )
    p.add_argument("paths", nargs="*", metavar="ARTIFACT|RUNS_DIR", help="soak.json files or dirs")
    p.add_argument(
        "--since",
        metavar="TIME|+DURATION",
        help="only what ran since: ISO 8601 (2026-05-01T02:00), HH:MM (the last one), or "
        "+90s, +30m, +2h, +1d ago",
    )
    p.add_argument("--json", action="store_true", help='{"jobs": [...], "total": {...}}')
    p.set_defaults(handler=_guarded(_goodput))


def _goodput(args: argparse.Namespace) -> int:
    if args.paths and args.db:
        raise UsageError("give artifacts (or a runs directory) or --db, not both")
    since = None
    if args.since is not None:
        since = parse_not_before(args.since, time.time, flag="--since", ago=True)
    jobs = _from_paths(args.paths, since) if args.paths else _from_queue(args, since)
    jobs.sort(key=lambda job: -_lost(job))
    if args.json:
        out = {"jobs": [job.to_json() for job in jobs], "total": fleet_total(jobs)}
        print(json.dumps(out, indent=2, sort_keys=True))
        return exits.EXIT_PASSED
    print(terminal_text(render(jobs), one_line=False), end="")
    return exits.EXIT_PASSED


def _from_queue(args: argparse.Namespace, since: float | None) -> list[JobLedger]:
    return _read_queue(args, lambda store: queue_goodput(store, since)) or []


def _artifact_files(paths: Sequence[str]) -> list[Path]:
    """The artifacts named, and those below the directories named (``*.json`` files that
    read as artifacts; others are skipped)."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.json") if p.is_file()))
        elif path.exists():
            files.append(path)
        else:
            raise UsageError(f"goodput: no such artifact or runs directory: {text}")
    return files


def _from_paths(paths: Sequence[str], since: float | None) -> list[JobLedger]:
    named = {Path(p) for p in paths}
    runs: list[tuple[str, Mapping[str, Any]]] = []
    for path in _artifact_files(paths):
        try:
            run: dict[str, Any] = dict(load(path))
        except (OSError, ValueError) as exc:
            if path in named:
                raise UsageError(f"goodput: {exc}") from None
            continue
        end = run_span(run)[1]
        if since is not None and end is not None and end < since:
            continue
        run["goodput"] = artifact_section(run)
        runs.append((str(path), run))
    return join_runs(runs, _regoodput)


def _regoodput(label: str, artifact: Mapping[str, Any], earlier: int) -> Mapping[str, Any] | None:
    """A later attempt's ledger divided again, its steps at or below ``earlier`` wasted:
    folded from its journal (None without one)."""
    if (artifact.get("config") or {}).get("earlier_highest_step") is not None:
        return None  # its worker passed the earlier attempts' step in: divided so already
    return artifact_section(artifact, earlier)


def _lost(job: JobLedger) -> float:
    gpu = job.gpu_seconds
    return job.lost_seconds if gpu is None else gpu.wall_seconds - gpu.productive_seconds


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole > 0 else "-"


def _amount(seconds: float, gpu: bool) -> str:
    return f"{seconds / 3600.0:.3f} GPU-h" if gpu else format_duration(seconds)


def render(jobs: Sequence[JobLedger]) -> str:
    """The lost GPU-hours (seconds, where some GPUs are unknown) by cause, largest first, and
    the jobs that lost most."""
    if not jobs:
        return "no runs: nothing to account for\n"
    total, gpu_total = fleet_ledgers(jobs)
    gpu = gpu_total is not None
    shown = gpu_total or total
    attempts = sum(job.attempts for job in jobs)
    lines = [
        goodput_line(total.to_json()),
        f"{len(jobs)} job(s), {attempts} attempt(s), {_amount(shown.wall_seconds, gpu)} in all"
        + ("" if gpu else " (GPUs unknown: seconds)"),
        "",
        "lost by cause:",
    ]
    causes = [
        f"  {kind:<12} {_amount(seconds, gpu):>14}  {_percent(seconds, shown.wall_seconds)}"
        for kind, seconds in lost_by_cause(shown)
        if seconds >= NEGLIGIBLE_SHARE * shown.wall_seconds
    ]
    lines += causes or ["  nothing"]
    lines += ["", "jobs that lost most:"]
    for job in jobs[:TOP_JOBS]:
        ratio = job.ledger.ratio
        share = "-" if ratio is None else f"{100.0 * ratio:.1f} %"
        lost = _amount(_lost(job), job.gpu_seconds is not None)
        lines.append(f"  {job.job:<28} lost {lost:>14}  goodput {share:>7}  {job.attempts} run(s)")
    unknown = [f"{job.job} {label}" for job in jobs for label in job.unknown]
    if unknown:
        lines += [
            "",
            "no ledger (running, or from before goodput without a journal): " + ", ".join(unknown),
        ]
    return "\n".join(lines) + "\n"
