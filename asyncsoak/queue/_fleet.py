"""Opening the queue (its backend, a server not up yet waited for, a worker's queue created),
and what ``asyncsoak workers`` shows of a fleet."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._models import (
    BACKOFF_MAX_SECONDS,
    BACKOFF_MIN_SECONDS,
    DatabaseUnreachableError,
    Job,
    QueueDatabaseError,
    WorkerInfo,
)
from ._status import STALE_AFTER_S
from ._store import JobStore

_log = logging.getLogger("asyncsoak.queue")

#: While a database cannot be reached, one log line per this many seconds says so.
DB_WAIT_REPORT_SECONDS = 30.0
#: How long ``submit``, ``jobs`` and the other short commands wait for a database server
#: that cannot be reached (``--wait-for-db``); a worker waits for ever by default.
COMMAND_WAIT_FOR_DB_S = 5.0
WORKER_WAIT_FOR_DB_S = math.inf
#: A worker whose heartbeat is older than this is ``lost``: its jobs' orphan limit.
LOST_AFTER_S = STALE_AFTER_S
#: Gone workers last seen longer ago than this are left out of ``asyncsoak workers``.
PRUNE_AFTER_S = 24 * 3600.0

ALIVE = "alive"
LOST = "lost"
STOPPED = "stopped"

#: A libpq keyword connection string ("host=db1 dbname=queue user=me"): it starts with one
#: of libpq's keywords and "=", which no sensible SQLite file name does.
_KEYWORD_CONNINFO = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options"
    r"|connect_timeout|application_name|target_session_attrs)\s*="
)


def is_postgres(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a PostgreSQL database (a URL, ``postgresql:``, a keyword string)."""
    return isinstance(db, str) and (
        db.startswith(("postgresql:", "postgres:")) or bool(_KEYWORD_CONNINFO.match(db))
    )


def open_store(db: str | os.PathLike[str], **options: Any) -> JobStore:
    """The store ``db`` names; ``options`` (``create``, ``busy_timeout``...) go to it."""
    if is_postgres(db):
        from ._postgres import PostgresStore

        return PostgresStore(str(db), **options)
    from ._sqlite import SqliteStore

    return SqliteStore(db, **options)


def open_when_reachable(db: str, *, wait: float, create: bool = False, **options: Any) -> JobStore:
    """Open ``db``, waiting up to ``wait`` seconds (``math.inf``: for ever), with a growing
    backoff, for a server that cannot be reached yet; any other refusal raises at once.
    ``options`` go to :func:`open_store`."""
    deadline = time.monotonic() + wait
    backoff = BACKOFF_MIN_SECONDS
    first_failure: float | None = None
    next_report = 0.0
    while True:
        try:
            store = open_store(db, create=create, **options)
        except DatabaseUnreachableError as exc:
            now = time.monotonic()
            if first_failure is None:
                first_failure = now
            if now >= deadline:
                raise
            if now >= next_report:
                until = "for ever" if math.isinf(wait) else f"up to {wait:g}s"
                _log.warning(
                    "queue database %s cannot be reached (%s); waiting %s, retrying with "
                    "backoff (%.0fs so far)",
                    exc.path,
                    exc.problem,
                    until,
                    now - first_failure,
                )
                next_report = now + DB_WAIT_REPORT_SECONDS
            time.sleep(min(backoff, max(0.0, deadline - now)))
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
            continue
        except QueueDatabaseError as exc:
            _say_reached(exc.path, first_failure)
            raise
        _say_reached(store.location, first_failure)
        return store


def _say_reached(where: object, first_failure: float | None) -> None:
    if first_failure is not None:
        waited = time.monotonic() - first_failure
        _log.warning("queue database %s reached after %.0fs", where, waited)


def open_for_worker(db: str, *, wait: float, default_location: bool = False) -> JobStore:
    """The queue a worker serves, created (saying so: a typo in ``--db`` shows) where missing;
    an SQLite file only in an existing directory, unless it is the ``default_location``."""
    if is_postgres(db):
        store = open_when_reachable(db, wait=wait, create=True)
        made = "held no job queue: created its schema" if getattr(store, "created", 0) else ""
    else:
        path = Path(db).expanduser()
        made = "" if path.exists() else "did not exist: created an empty queue"
        if made and not path.parent.is_dir() and not default_location:
            raise QueueDatabaseError(
                path,
                f"its directory {path.parent} does not exist (check --db; a worker creates "
                "a new queue only in an existing directory)",
            )
        store = open_store(db, create=True)
    if made:
        _log.warning(
            "queue database %s %s; waiting for jobs (check --db if you expected an existing queue)",
            store.location,
            made,
        )
    return store


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker as ``asyncsoak workers`` shows it."""

    info: WorkerInfo
    #: ``alive``, ``lost`` (silent past the limit, or its process gone) or ``stopped``.
    state: str
    #: Its last heartbeat (or its stop): when it was last known to be there.
    last_seen: float
    #: The running jobs the jobs table says it holds (a job taken over is its new worker's).
    jobs: list[int] = field(default_factory=list)


def worker_views(
    workers: Iterable[WorkerInfo],
    running: Iterable[Job],
    now: float,
    *,
    lost_after: float = LOST_AFTER_S,
    show_all: bool = False,
    this_host: str | None = None,
    process_alive: Callable[[int, int | None], bool] | None = None,
) -> tuple[list[WorkerView], int]:
    """The workers to show, and how many were left out (gone past :data:`PRUNE_AFTER_S`).
    A worker is lost once silent past ``lost_after``, or its process on ``this_host`` is gone."""
    held: dict[str, list[int]] = {}
    for job in running:
        if job.worker is not None:
            held.setdefault(job.worker, []).append(job.id)
    shown: list[WorkerView] = []
    pruned = 0
    for w in workers:
        state = ALIVE
        if w.stopped_at is not None:
            state = STOPPED
        elif now - w.heartbeat_at > lost_after or (
            # /proc is read only for the workers still alive by their heartbeat
            process_alive is not None
            and w.host == this_host
            and not process_alive(w.pid, w.pid_start)
        ):
            state = LOST
        last_seen = w.heartbeat_at if w.stopped_at is None else max(w.heartbeat_at, w.stopped_at)
        if state != ALIVE and now - last_seen > PRUNE_AFTER_S and not show_all:
            pruned += 1
        else:
            shown.append(WorkerView(w, state, last_seen, sorted(held.get(w.name, []))))
    return shown, pruned
