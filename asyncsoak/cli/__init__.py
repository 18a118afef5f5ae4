"""The ``asyncsoak`` command line: each module of :data:`COMMANDS` has ``register(subparsers)``,
which adds its subcommands with a ``handler`` (``(args) -> int``, the exit status) on each."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn, TypeVar

from .._contract import ValidationError, exits, terminal_text

#: The module of each subcommand, in the order ``--help`` lists them (a newcomer's).  ``run``
#: imports its module alone (a soak's start pays for neither the queue nor the report);
#: ``--help`` and an unknown command import them all.  tests/test_cli.py holds this table.
COMMANDS = {
    "demo": "_run",
    "run": "_run",
    "watch": "_watch",
    "summary": "_report",
    "report": "_report",
    "compare": "_report",
    "recover": "_report",
    "exit-codes": "_exit_codes",
    "snapshot": "_exit_codes",
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
#: ``--view``: ``auto`` (the full screen on a terminal tall enough, else the line), or one.
VIEW_MODES = ("auto", "line", "screen")


#: Whether :func:`entry` holds the cyclic garbage collector off (see :func:`release_collector`).
_collector_held = False


def release_collector() -> None:
    """Collect garbage again, the start-up's objects frozen (they live as long as the process:
    no collection need scan them); a no-op unless :func:`entry` held the collector off."""
    global _collector_held
    if _collector_held:
        _collector_held = False
        gc.freeze()
        gc.enable()


class UsageError(Exception):
    """Bad usage or input: reported on stderr with exit status 2, nothing changed."""


_T = TypeVar("_T")


def typed(convert: Callable[[str], _T], text: str, expected: str) -> _T:
    """``convert(text)`` for an argparse type, or its error saying what was expected."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


@contextlib.contextmanager
def refused(told: Callable[[ValidationError], UsageError] | None = None) -> Iterator[None]:
    """A :class:`ValidationError` inside told as a usage error: by ``told``, else as it is."""
    try:
        yield
    except ValidationError as exc:
        raise (UsageError(str(exc)) if told is None else told(exc)) from None


def unwritable(flag: str, path: object, exc: OSError) -> UsageError:
    return UsageError(f"{flag} {path}: unwritable ({exc.strerror})")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command``'s module only when it is one."""
    parser = argparse.ArgumentParser(
        prog="asyncsoak", description="Supervise long training runs and explain them afterwards."
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    order = list(COMMANDS)
    subparsers._choices_actions.sort(key=lambda action: order.index(action.dest))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    # The subcommand comes first (the top level has no option but --help).
    parser = build_parser(arguments[0] if arguments else None)
    args, unknown = parser.parse_known_args(arguments)
    if unknown:
        _refuse_unknown(parser, args.subcommand, unknown)
    if not getattr(args, "hold_collector", False):
        release_collector()  # ``run`` releases it once its command runs
    try:
        status: int = args.handler(args)
    except UsageError as exc:
        # One line, whatever the input held: a file name or a field may carry escapes.
        print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
        return exits.EXIT_USAGE
    return status


def _refuse_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> NoReturn:
    """Unknown options, refused by the subcommand's own parser (its usage, its name) with the
    nearest of its options when one is close (``--outptu``: ``--output``), the names compared
    without their dashes (which every option shares)."""
    [choices] = [a.choices for a in parser._actions if isinstance(a.choices, dict)]
    subparser = choices[command]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    typed = next((a[2:].split("=", 1)[0] for a in unknown if a.startswith("--")), "")
    known = [o[2:] for a in subparser._actions for o in a.option_strings if o.startswith("--")]
    near = [f"--{name}" for name in difflib.get_close_matches(typed, known, n=3, cutoff=0.7)]
    if near:
        listed = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
        message += f" (did you mean {listed}?)"
    subparser.error(message)
    raise AssertionError("argparse's error() exits")


def quiet_stdout() -> None:
    """Stdout to /dev/null: its reader went away (``jobs | head -1``) having what it wanted."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def entry() -> NoReturn:
    """The program: :func:`main`, then out without the interpreter's teardown (a short soak
    would pay for it in wall time); every stream is flushed first.  The start-up's imports
    allocate much and free little: the garbage collector waits (10 ms of a short soak)."""
    global _collector_held
    _collector_held = True
    gc.disable()
    try:
        status = main()
    except BrokenPipeError:
        quiet_stdout()
        status = 0
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)
