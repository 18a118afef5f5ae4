"""``asyncsoak summary`` and ``report`` given several artifacts of one job (SLURM, or one
torchrun rendezvous)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import EXIT_OK, UsageError


def _combined(args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    from .._view import NotOneJobError, combine
    from ._report import load_run

    artifacts = [(str(path), load_run(path)[0]) for path in args.run]
    try:
        return combine(artifacts), artifacts
    except NotOneJobError as exc:
        raise UsageError(str(exc)) from None


def job_summary(args: argparse.Namespace) -> int:
    from .._view import format_combined
    from ._report import print_text

    combined, _ = _combined(args)
    if args.json:
        print_text(json.dumps(combined, indent=1, default=str))
    else:
        print_text(format_combined(combined))
    return EXIT_OK


def job_report(args: argparse.Namespace) -> int:
    from .._record import FILE_MODE
    from .._view import ReportUnavailableError, render_job_report

    combined, artifacts = _combined(args)
    output: Path = args.output or Path(args.run[0]).with_name(f"job-{combined['job_id']}.html")
    try:
        text = render_job_report(combined, artifacts)
    except ReportUnavailableError as exc:
        raise UsageError(str(exc)) from None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.touch(mode=FILE_MODE)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror}") from None
    print(f"asyncsoak: report written; open it in a browser: {output.absolute().as_uri()}")
    return EXIT_OK
