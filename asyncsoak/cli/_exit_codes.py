"""``asyncsoak exit-codes``: what each exit status of ``asyncsoak run`` means; and ``asyncsoak
snapshot``: the runtime snapshot of a source tree and this machine."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from .._contract import FailureReason, exits

#: The statuses that hold with or without ``--detailed-exit-codes``.
FIXED_STATUSES: tuple[tuple[int, str], ...] = (
    (exits.EXIT_PASSED, "the soak passed (or was stopped on request without a signal)"),
    (
        exits.EXIT_FAILED,
        "the soak failed; with --detailed-exit-codes: it failed and its artifact could not "
        "be written",
    ),
    (exits.EXIT_USAGE, "bad usage or input: nothing ran, nothing was written"),
    *(
        (
            exits.SHELL_SIGNAL_BASE + signum,
            f"{signum.name} stopped the monitor{why}; the artifact says cancelled",
        )
        for signum, why in (
            (signal.SIGHUP, ""),
            (signal.SIGINT, ""),
            (signal.SIGTERM, " (in a pod or a SLURM job: the scheduler's stop)"),
        )
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
    parser = subparsers.add_parser(
        "snapshot", help="print the source, GPU, software, host and environment provenance as JSON"
    )
    parser.add_argument(
        "root", nargs="?", type=Path, default=Path("."), help="source tree (default: .)"
    )
    parser.add_argument(
        "--nvidia-smi", default="nvidia-smi", metavar="PATH", help="nvidia-smi to ask"
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="bound on each external command"
    )
    parser.set_defaults(handler=snapshot_command)


def exit_codes_command(args: argparse.Namespace) -> int:
    from .._view import REASON_TITLES

    table: list[dict[str, Any]] = [
        {"exit_code": code, "reason": str(reason), "title": REASON_TITLES[FailureReason(reason)]}
        for reason, code in sorted(exits.DETAILED_EXIT_CODES.items(), key=lambda item: item[1])
    ]
    if args.json:
        fixed = [{"exit_code": code, "meaning": meaning} for code, meaning in FIXED_STATUSES]
        print(json.dumps({"reasons": table, "statuses": fixed}, indent=2))
        return exits.EXIT_PASSED
    print("asyncsoak run exits with (128+N when signal N stopped it):")
    for code, meaning in FIXED_STATUSES:
        print(f"  {code:>6}  {meaning}")
    print("\nWith --detailed-exit-codes, a failed soak exits with its primary reason's status:")
    width = max(len(row["reason"]) for row in table)
    for row in table:
        print(f"  {row['exit_code']:>6}  {row['reason']:<{width}}  {row['title']}")
    return exits.EXIT_PASSED


def snapshot_command(args: argparse.Namespace) -> int:
    from .._sampling import collect_snapshot

    snapshot = collect_snapshot(args.root, nvidia_smi=args.nvidia_smi, timeout=args.timeout)
    print(json.dumps(snapshot, indent=2, allow_nan=False))
    return exits.EXIT_PASSED
