"""The queue's jobs table, defined once: :class:`Job`'s fields are its columns (from which the
stores derive each backend's DDL), and :func:`select_job` reads a row for stores and trainers.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

#: The schema holding the queue's tables on PostgreSQL.
PG_SCHEMA = "asyncsoak"
#: How long a trainer's read of its job may wait for a lock or a connection.
READ_TIMEOUT_SECONDS = 5.0


def column(
    kind: str,
    *,
    required: bool = False,
    default: object = None,
    check: str | None = None,
    references: str | None = None,
    since: int = 1,
) -> Any:
    """A record's field that is a column of ``kind`` (``key``, ``text``, ``json``, ``int``,
    ``bigint``, ``real``, ``bool``); ``since``: the schema version that added it (then None)."""
    metadata = {
        "kind": kind,
        "required": required or default is not None,
        "default": default,
        "check": check,
        "references": references,
        "since": since,
    }
    if since > 1:
        return dataclasses.field(default=None, metadata=metadata)
    return dataclasses.field(metadata=metadata)


def derived(select: str) -> Any:
    """A record's field that no column holds: ``select`` computes it when the row is read."""
    return dataclasses.field(metadata={"select": select})


def select_list(record: type) -> str:
    """What a SELECT of ``record``'s rows lists, in its fields' order."""
    return ", ".join(f.metadata.get("select", f.name) for f in dataclasses.fields(record))


def decoded(record: type, row: Sequence[Any]) -> list[Any]:
    """A row's values as ``record``'s fields take them: JSON decoded, booleans as bool."""
    values = []
    for spec, value in zip(dataclasses.fields(record), row, strict=True):
        kind = spec.metadata.get("kind")
        if kind == "json" and isinstance(value, str):
            value = json.loads(value)
        elif kind == "bool":
            value = bool(value)
        values.append(value)
    return values


_STATUSES = "'queued', 'running', 'succeeded', 'failed', 'cancelled'"


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """A job as the store holds it.  ``attempt`` counts every claim (it fences writes);
    ``attempts`` counts the attempts that go against ``max_attempts`` (failures, orphans)."""

    TABLE: ClassVar[str] = "jobs"
    CONSTRAINTS: ClassVar[tuple[str, ...]] = ("CHECK ((argv IS NULL) != (config IS NULL))",)

    id: int = column("key")
    name: str | None = column("text")
    status: str = column("text", required=True, check=f"status IN ({_STATUSES})")
    argv: list[str] | None = column("json")
    config: dict[str, Any] | None = column("json")
    cwd: str | None = column("text")
    env: dict[str, str] = column("json", default={})
    progress_dir: str | None = column("text")
    soak: dict[str, Any] = column("json", default={})
    stop_mode: str = column(
        "text", default="stdin", check="stop_mode IN ('stdin', 'group', 'leader')"
    )
    priority: int = column("int", default=0)
    attempt: int = column("int", default=0)
    attempts: int = column("int", default=0)
    max_attempts: int = column("int", required=True, check="max_attempts >= 1")
    created_at: float = column("real", required=True)
    started_at: float | None = column("real")
    finished_at: float | None = column("real")
    heartbeat_at: float | None = column("real")
    worker: str | None = column("text")
    host: str | None = column("text")
    cancel_requested: bool = column("bool", default=False)
    returncode: int | None = column("int")
    reason: str | None = column("text")
    error: str | None = column("text")
    artifact: str | None = column("text")
    #: Attempts that ended ``interrupted``, and how the latest attempt ended (None: running).
    interruptions: int = derived(
        "(SELECT count(*) FROM attempts AS a WHERE a.job_id = jobs.id "
        "AND a.outcome = 'interrupted')"
    )
    last_outcome: str | None = derived(
        "(SELECT a.outcome FROM attempts AS a WHERE a.job_id = jobs.id "
        "AND a.attempt = jobs.attempt)"
    )


def select_job(execute: Callable[[str, tuple[Any, ...]], Any], job_id: int) -> Job | None:
    """Job ``job_id`` read through ``execute`` (SQL with ``?`` placeholders), or None."""
    row = execute(f"SELECT {select_list(Job)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else Job(*decoded(Job, row))


def read_job(db: str, job_id: int) -> Job:
    """Job ``job_id`` of the queue ``db`` (an SQLite path, read-only, or a PostgreSQL URL);
    RuntimeError when it holds no such job."""
    if db.startswith(("postgresql:", "postgres:")):
        import psycopg

        conninfo = "" if db.rstrip("/") in ("postgresql:", "postgres:") else db
        timeout = int(READ_TIMEOUT_SECONDS)
        with psycopg.connect(conninfo, connect_timeout=timeout, autocommit=True) as pg:
            pg.execute(f"SET search_path TO {PG_SCHEMA}")
            job = select_job(lambda sql, params: pg.execute(sql.replace("?", "%s"), params), job_id)
    else:
        import sqlite3  # here: the supervisor imports the trainer for its constants alone

        uri = f"file:{urllib.parse.quote(db)}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT_SECONDS)
        try:
            job = select_job(conn.execute, job_id)
        finally:
            conn.close()
    if job is None:
        raise RuntimeError(f"job {job_id} is not in the queue database {db}")
    return job
