"""Opening the job queue from the command line: ``--db`` and ``--wait-for-db``, the ids and
counts the commands take, and exit :data:`EXIT_DB_UNAVAILABLE` for a database that could not
be reached in time (having changed nothing)."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from .._contract import MAX_SECONDS, redact_url_passwords, terminal_text
from ..queue import (
    COMMAND_WAIT_FOR_DB_S,
    INTEGER_MAX,
    DatabaseUnreachableError,
    JobNotFoundError,
    JobStore,
    QueueError,
    QueueMissingError,
    QueueUnavailableError,
    default_data_dir,
    open_when_reachable,
)
from . import UsageError, typed

#: Exit status of a queue command whose database could not be reached in time (sysexits'
#: EX_TEMPFAIL: try again later), apart from bad usage's 2, so a service manager restarts it.
EXIT_DB_UNAVAILABLE = 75

_T = TypeVar("_T")
#: The queue's errors that mean "try again later" (exit :data:`EXIT_DB_UNAVAILABLE`).
UNAVAILABLE = (DatabaseUnreachableError, QueueUnavailableError)


def default_db() -> str:
    """``$ASYNCSOAK_DB``, else ``asyncsoak/queue.db`` in ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    return os.environ.get("ASYNCSOAK_DB") or str(default_data_dir() / "queue.db")


def _integer(text: str, *, minimum: int = -INTEGER_MAX) -> int:
    """An argparse type: an integer the database can hold (SQLite's are 64-bit)."""
    value = typed(int, text, "an integer")
    if not minimum <= value <= INTEGER_MAX:
        raise argparse.ArgumentTypeError(f"{text} is out of range ({minimum} to {INTEGER_MAX})")
    return value


_job_id = functools.partial(_integer, minimum=1)
_count_arg = functools.partial(_integer, minimum=0)


def db_parser() -> argparse.ArgumentParser:
    """The ``--db`` and ``--wait-for-db`` flags of every command that opens the queue."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument(
        "--db",
        metavar="PATH|URL",
        help="queue database: an SQLite file, or postgresql://... for a queue shared by many "
        "hosts (default: $ASYNCSOAK_DB, else ~/.local/share/asyncsoak/queue.db)",
    )
    db.add_argument(
        "--wait-for-db",
        type=_wait_seconds,
        metavar="S",
        help="how long to wait for a database server that cannot be reached, retrying with "
        f"backoff ('inf': for ever; default: for ever for a worker, {COMMAND_WAIT_FOR_DB_S:g}s "
        f"for the other commands); then exit {EXIT_DB_UNAVAILABLE}",
    )
    return db


def _wait_seconds(text: str) -> float:
    """An argparse type: seconds to wait, ``inf`` for ever."""
    value = typed(float, text, "seconds or 'inf'")
    if math.isnan(value) or value < 0 or MAX_SECONDS < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"expected seconds from 0 to {MAX_SECONDS:g} (a year), or 'inf', got {text!r}"
        )
    return value


def _wait_for_db(args: argparse.Namespace, default: float = COMMAND_WAIT_FOR_DB_S) -> float:
    return default if args.wait_for_db is None else float(args.wait_for_db)


def _open(args: argparse.Namespace, *, create: bool = False) -> JobStore:
    db = args.db or default_db()
    if db.partition("://")[0] not in (db, "postgresql", "postgres"):  # not an SQLite file
        raise UsageError(
            f"--db {redact_url_passwords(db)!r}: expected an SQLite file or a postgresql:// URL"
        )
    return _queue_call(
        lambda: open_when_reachable(db, wait=_wait_for_db(args), create=create), UNAVAILABLE
    )


def _open_existing(args: argparse.Namespace) -> JobStore | None:
    """The queue for a command that only reads or changes what is there: None when there is
    no queue yet (an empty queue, not an error)."""
    try:
        return _open(args)
    except UsageError as exc:
        if isinstance(exc.__cause__, QueueMissingError):
            return None
        raise


def _read_queue(args: argparse.Namespace, read: Callable[[JobStore], _T]) -> _T | None:
    """``read(store)`` of the queue, or None when there is no queue yet."""
    store = _open_existing(args)
    if store is None:
        return None
    with store:
        return _queue_call(lambda: read(store))


def _queue_call(
    fn: Callable[[], _T], unavailable: tuple[type[QueueError], ...] = (QueueUnavailableError,)
) -> _T:
    """``fn()``, a queue error as a usage error but ``unavailable`` (the caller's to tell)."""
    try:
        return fn()
    except unavailable:
        raise
    except QueueError as exc:
        raise UsageError(str(exc)) from exc


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler``, exiting :data:`EXIT_DB_UNAVAILABLE` when its database cannot be reached."""

    @functools.wraps(handler)
    def guarded(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UNAVAILABLE as exc:
            print(terminal_text(f"asyncsoak: error: {exc}"), file=sys.stderr)
            return EXIT_DB_UNAVAILABLE

    return guarded


def _existing_for(args: argparse.Namespace) -> JobStore:
    """The queue holding job ``args.id``; no queue at all holds no job either."""
    store = _open_existing(args)
    if store is None:
        raise UsageError(str(JobNotFoundError(args.id)))
    return store
