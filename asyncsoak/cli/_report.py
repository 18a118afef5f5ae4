"""``asyncsoak report``, ``summary`` and ``recover``: look at a run after it ended; ``summary``
and ``report`` given several artifacts of one job (SLURM, or one torchrun rendezvous)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._contract import exits, terminal_text
from . import UsageError, quiet_stdout, unwritable

if TYPE_CHECKING:
    from .._contract import Artifact


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report with plots (needs asyncsoak[report])",
        description="Write one HTML file that opens offline: the verdict, provenance, "
        "zoomable plots on one time axis, events, leftovers and the log tail.",
    )
    add_runs(report)
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="REPORT.html",
        help="where to write it (default: beside the artifact, ending in .html)",
    )
    report.add_argument(
        "--compare",
        type=Path,
        metavar="BASELINE",
        help="draw this earlier run's series beneath the run's own, and its figures beside",
    )
    report.set_defaults(handler=report_command)

    compare = subparsers.add_parser(
        "compare",
        help="two runs of the same training side by side, and what regressed",
        description="Compare a candidate run with a baseline (a nightly against last week's, "
        "a commit against main): duration, verdict, peak and final tree memory, leak slope, "
        "progress rate, GPU utilisation and memory, each with its change; a figure worse by "
        "more than the threshold is flagged as a regression.",
    )
    compare.add_argument("baseline", type=Path, metavar="BASELINE", help="the reference run")
    compare.add_argument("candidate", type=Path, metavar="CANDIDATE", help="the run to judge")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.add_argument(
        "--threshold",
        default="10",
        metavar="PERCENT",
        help="how much worse a figure must be to regress (default 10)",
    )
    compare.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit with status 1 when something regressed",
    )
    compare.set_defaults(handler=compare_command)

    summary = subparsers.add_parser(
        "summary", help="the verdict and what to look at first, on one screen"
    )
    add_runs(summary)
    summary.add_argument("--json", action="store_true", help="print the summary as JSON")
    summary.set_defaults(handler=summary_command)

    recover = subparsers.add_parser(
        "recover", help="rebuild the artifact of a run whose monitor died, from its journal"
    )
    recover.add_argument("journal", type=Path, metavar="JOURNAL", help="the run's soak.jsonl")
    recover.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="ARTIFACT",
        help="where to write it (default: the journal's path ending in .json, if free)",
    )
    recover.set_defaults(handler=recover_command)


def add_runs(parser: argparse.ArgumentParser) -> None:
    runs = "a run's artifact (soak.json) or journal; several of one SLURM job are shown as one"
    parser.add_argument("run", type=Path, nargs="+", metavar="ARTIFACT", help=runs)


def load_run(path: Path) -> tuple[Artifact, Path | None]:
    """The artifact of an artifact or journal file, and the journal when one was read (a
    missing ``soak.json`` is rebuilt from its ``soak.jsonl``: the monitor died first)."""
    from .._record import is_journal

    if not path.exists():
        journal = path.with_suffix(".jsonl")
        if path.suffix == ".json" and journal.is_file():
            why = "is missing (the monitor did not finish); reading its journal"
            print(terminal_text(f"asyncsoak: {path} {why} {journal}"), file=sys.stderr)
            path = journal
        else:
            raise UsageError(f"{path}: no such file")
    from .._contract import bounded
    from ..artifact import ArtifactError, load

    try:
        # Never blocks (a FIFO) nor reads without end (/dev/zero): refused at once.
        bounded.open_regular(path).close()
        return load(path), path if is_journal(path) else None
    except (bounded.UnreadableFileError, ArtifactError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def report_command(args: argparse.Namespace) -> int:
    from .._view import ReportUnavailableError, render_job_report, write_report

    first: Path = args.run[0]
    write: Callable[[], None]
    if len(args.run) > 1:
        combined, artifacts = _combined(args)
        output: Path = args.output or first.with_name(f"job-{combined['job_id']}.html")

        def write() -> None:
            from .._record import FILE_MODE

            text = render_job_report(combined, artifacts)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.touch(mode=FILE_MODE)
            output.write_text(text, encoding="utf-8")

    else:
        artifact, journal = load_run(first)
        baseline = load_run(args.compare)[0] if args.compare is not None else None
        output = args.output or first.with_suffix(".html")
        write = functools.partial(
            write_report,
            artifact,
            output,
            journal=journal,
            source=str(first),
            baseline=baseline,
            baseline_source=str(args.compare) if args.compare is not None else None,
        )
    try:
        write()
    except ReportUnavailableError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise unwritable("--output", output, exc) from None
    print(f"asyncsoak: report written; open it in a browser: {output.absolute().as_uri()}")
    return exits.EXIT_PASSED


def compare_command(args: argparse.Namespace) -> int:
    from .._view import compare, format_comparison

    try:
        threshold = float(args.threshold)
    except ValueError:
        threshold = math.nan
    if not math.isfinite(threshold) or threshold < 0:
        raise UsageError(f"--threshold must be a percentage of 0 or more, not {args.threshold!r}")
    baseline, _ = load_run(args.baseline)
    candidate, _ = load_run(args.candidate)
    comparison = compare(
        baseline,
        candidate,
        baseline_name=str(args.baseline),
        candidate_name=str(args.candidate),
        threshold=threshold / 100.0,
    )
    if args.json:
        print(json.dumps(comparison.as_json(), indent=1))
    else:
        print_text(format_comparison(comparison))
    regressed = args.fail_on_regression and comparison.regressions
    return exits.EXIT_FAILED if regressed else exits.EXIT_PASSED


def summary_command(args: argparse.Namespace) -> int:
    from .._view import format_combined, format_summary, summarize

    if len(args.run) > 1:
        summary, text = _combined(args)[0], format_combined
    else:
        summary = summarize(load_run(args.run[0])[0])
        width = min(120, shutil.get_terminal_size().columns) - 1
        text = functools.partial(format_summary, artifact_path=str(args.run[0]), width=width)
    print_text(json.dumps(summary, indent=1, default=str) if args.json else text(summary))
    return exits.EXIT_PASSED


def print_text(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # handled here: compare's exit status still says what regressed
        quiet_stdout()


def recover_command(args: argparse.Namespace) -> int:
    from .._contract import bounded
    from .._record import JournalError, artifact_from_journal, monitor_holds, write_artifact

    journal: Path = args.journal
    output: Path = args.output or journal.with_suffix(".json")
    if monitor_holds(journal):
        raise UsageError(
            f"{journal}: its soak is still running (its monitor holds the journal's lock); "
            "nothing to recover: watch it with: asyncsoak watch " + str(journal)
        )
    if args.output is None and output.exists():
        raise UsageError(f"{output} already exists: pass -o to choose where the rebuilt one goes")
    try:
        artifact = artifact_from_journal(journal)
    except FileNotFoundError:
        raise UsageError(f"{journal}: no such file") from None
    except (OSError, JournalError, bounded.UnreadableFileError) as exc:
        raise UsageError(str(exc)) from None
    try:
        write_artifact(artifact, output)
    except OSError as exc:
        raise unwritable("--output", output, exc) from None
    reasons = ", ".join(f["reason"] for f in artifact["failures"]) or "none"
    rebuilt = f"{output} (status {artifact['status']}; reasons: {reasons})"
    print(terminal_text(f"asyncsoak: artifact rebuilt: {rebuilt}"))
    return exits.EXIT_PASSED


def _combined(args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    from .._view import NotOneJobError, combine

    artifacts = [(str(path), load_run(path)[0]) for path in args.run]
    try:
        return combine(artifacts), artifacts
    except NotOneJobError as exc:
        raise UsageError(str(exc)) from None
