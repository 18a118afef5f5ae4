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

#: The module that registers each subcommand.  ``asyncsoak run`` imports the run module alone,
#: so a soak's start pays for neither the queue nor the report; ``--help`` and an unknown
#: command import them all.  tests/test_cli.py holds this table to what the modules register.
COMMANDS = {
    "run": "_run",
    "demo": "_run",
    "snapshot": "_snapshot",
    "submit": "_queue",
    "workers": "_queue",
    "worker": "_queue",
    "jobs": "_queue",
    "job": "_queue",
    "cancel": "_queue",
    "requeue": "_queue",
    "logs": "_queue",
    "report": "_report",
    "compare": "_report",
    "summary": "_report",
    "recover": "_report",
    "exit-codes": "_exit_codes",
    "watch": "_watch",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))

#: Exit statuses shared by every subcommand.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad usage or input: reported on stderr with exit status 2, nothing changed."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command``'s module only when it is one."""
    parser = argparse.ArgumentParser(
        prog="asyncsoak",
        description="Supervise long training runs and explain them afterwards.",
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    # The subcommand comes first (the top level has no option but --help).
    parser = build_parser(arguments[0] if arguments else None)
    args = parser.parse_args(arguments)
    try:
        status: int = args.handler(args)
    except UsageError as exc:
        # One line, whatever the input held: a file name or a field may carry escapes.
        print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    return status
