"""The ``asyncsoak`` command line: one module per group of subcommands.

Each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds its
subcommands and sets ``handler`` (``(args) -> int``, the exit status) on each.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .._contract import terminal_text

COMMAND_MODULES = ("_run", "_snapshot", "_queue", "_report", "_exit_codes", "_watch")

#: Exit statuses shared by every subcommand.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad usage or input: reported on stderr with exit status 2, nothing changed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncsoak",
        description="Supervise long training runs and explain them afterwards.",
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except UsageError as exc:
        # One line, whatever the input held: a file name or a field may carry escapes.
        print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    return status
