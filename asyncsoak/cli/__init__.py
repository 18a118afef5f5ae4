"""The ``asyncsoak`` command line: one module per group of subcommands.

Each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds its
subcommands and sets ``handler`` (``(args) -> int``, the exit status) on each.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .._contract import terminal_text

#: The module that registers each subcommand, in the order ``--help`` lists them: the order a
#: newcomer meets them.  ``asyncsoak run`` imports the run module alone, so a soak's start
#: pays for neither the queue nor the report; ``--help`` and an unknown command import them
#: all.  tests/test_cli.py holds this table to what the modules register.
COMMANDS = {
    "demo": "_run",
    "run": "_run",
    "watch": "_watch",
    "summary": "_report",
    "report": "_report",
    "compare": "_report",
    "recover": "_report",
    "exit-codes": "_exit_codes",
    "snapshot": "_snapshot",
    "submit": "_queue",
    "worker": "_queue",
    "jobs": "_queue",
    "job": "_queue",
    "goodput": "_goodput",
    "logs": "_queue",
    "cancel": "_queue",
    "requeue": "_queue",
    "workers": "_queue",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))

#: Exit statuses shared by every subcommand.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad usage or input: reported on stderr with exit status 2, nothing changed."""


def unwritable(flag: str, path: object, exc: OSError) -> UsageError:
    """``flag`` names a path that cannot be written: the flag, the path, and why."""
    return UsageError(f"{flag} {path}: unwritable ({exc.strerror})")


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
    order = list(COMMANDS)
    subparsers._choices_actions.sort(key=lambda action: order.index(action.dest))
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


def entry() -> NoReturn:
    """The program (``asyncsoak``, ``python -m asyncsoak``): :func:`main`, then out without the
    interpreter's teardown, which a short soak would pay for in wall time (every stream is
    flushed first; :func:`main` returns only once its files are written and closed)."""
    try:
        status = main()
    except BrokenPipeError:
        # The reader went away (``asyncsoak jobs | head -1``): it had what it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 0
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)
