"""``asyncsoak exit-codes [--json]``: what each exit status of ``asyncsoak run`` means."""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

from .._contract import FailureReason, exits
from .._view import REASON_TITLES
from . import EXIT_OK

#: The statuses that hold with or without ``--detailed-exit-codes``.
FIXED_STATUSES: tuple[tuple[int, str], ...] = (
    (exits.EXIT_PASSED, "the soak passed (or was stopped on request without a signal)"),
    (
        exits.EXIT_FAILED,
        "the soak failed; with --detailed-exit-codes: it failed and its artifact could not "
        "be written",
    ),
    (exits.EXIT_USAGE, "bad usage or input: nothing ran, nothing was written"),
    (
        exits.SHELL_SIGNAL_BASE + signal.SIGHUP,
        "SIGHUP stopped the monitor; the artifact says cancelled",
    ),
    (
        exits.SHELL_SIGNAL_BASE + signal.SIGINT,
        "SIGINT stopped the monitor; the artifact says cancelled",
    ),
    (
        exits.SHELL_SIGNAL_BASE + signal.SIGTERM,
        "SIGTERM stopped the monitor (in a pod or a SLURM job: the scheduler's stop); the "
        "artifact says cancelled",
    ),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "exit-codes",
        help="print the exit statuses of `asyncsoak run` (one per failure reason with "
        "--detailed-exit-codes)",
    )
    parser.add_argument("--json", action="store_true", help="JSON for scripts")
    parser.set_defaults(handler=exit_codes_command)


def exit_code_table() -> list[dict[str, Any]]:
    """Every failure reason with its detailed status and what it means, by status."""
    return [
        {"exit_code": code, "reason": str(reason), "title": REASON_TITLES[FailureReason(reason)]}
        for reason, code in sorted(exits.DETAILED_EXIT_CODES.items(), key=lambda item: item[1])
    ]


def exit_codes_command(args: argparse.Namespace) -> int:
    table = exit_code_table()
    if args.json:
        fixed = [{"exit_code": code, "meaning": meaning} for code, meaning in FIXED_STATUSES]
        print(json.dumps({"reasons": table, "statuses": fixed}, indent=2))
        return EXIT_OK
    print("asyncsoak run exits with (128+N when signal N stopped it):")
    for code, meaning in FIXED_STATUSES:
        print(f"  {code:>6}  {meaning}")
    print("\nWith --detailed-exit-codes, a failed soak exits with its primary reason's status:")
    width = max(len(row["reason"]) for row in table)
    for row in table:
        print(f"  {row['exit_code']:>6}  {row['reason']:<{width}}  {row['title']}")
    return EXIT_OK
