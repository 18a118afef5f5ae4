"""The job queue's side of a training script, standard library only (psycopg on PostgreSQL):
a trainer saves and exits :data:`EXIT_INTERRUPTED` once ``stop_requested().is_set() or
cancel_requested()``, reads its ``--config`` with :func:`load_config`, says its step with
:func:`report` (docs/queue.md).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the job table's names, for the queue: served by __getattr__ on first use
    from ._jobs import PG_SCHEMA as PG_SCHEMA
    from ._jobs import Job as Job
    from ._jobs import column as column
    from ._jobs import decoded as decoded
    from ._jobs import derived as derived
    from ._jobs import select_job as select_job
    from ._jobs import select_list as select_list

__all__ = [
    "EXIT_INTERRUPTED",
    "attempt",
    "cancel_requested",
    "job_id",
    "load_config",
    "report",
    "run_dir",
    "stop_requested",
]


def __getattr__(name: str) -> Any:
    """The job table's names, imported on the queue's first use (a trainer needs none)."""
    if not name.startswith("_"):
        from . import _jobs

        if hasattr(_jobs, name):
            return getattr(_jobs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Exit status of a trainer that saved its state and stopped because it was asked to.
EXIT_INTERRUPTED = 4

_stop_lock = threading.Lock()
_stop_event: threading.Event | None = None
_cancel_checked_at = float("-inf")
_cancel_seen = False


#: Where :func:`report` appends (the monitor sets it: the artifact's ``.steps.jsonl``).
STEPS_FILE_VARIABLE = "ASYNCSOAK_STEPS_FILE"
#: :func:`report` writes at most one line per this many seconds (the newest step wins; a
#: non-finite loss and the last step at exit are written at once).
REPORT_MIN_INTERVAL_SECONDS = 0.1

_report_lock = threading.Lock()
_report_fd: int | None = None
_report_written_at = float("-inf")
_report_pending: bytes | None = None


def report(step: int, **metrics: float) -> None:
    """Tell the monitor this process is at ``step``, with figures such as ``loss``,
    ``tokens`` or ``samples`` (cumulative), ``learning_rate``.  Cheap enough for every step;
    a bad step or figure raises ``TypeError``/``ValueError``, a write failure is ignored."""
    global _report_written_at, _report_pending
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    path = os.environ.get(STEPS_FILE_VARIABLE)
    if not path:
        return
    loss = metrics.get("loss")
    urgent = loss is not None and not math.isfinite(loss)
    # json writes NaN and Infinity as Python's json reads them back (the monitor does).
    line = (json.dumps({"step": step, **metrics}, separators=(",", ":")) + "\n").encode()
    now = time.monotonic()
    with _report_lock:
        if not urgent and now - _report_written_at < REPORT_MIN_INTERVAL_SECONDS:
            _report_pending = line
            return
        _report_pending = None
        _report_written_at = now
        _write_report(path, line)


def _write_report(path: str, line: bytes) -> None:
    global _report_fd
    with contextlib.suppress(OSError):
        if _report_fd is None:
            _report_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            atexit.register(_flush_report)
        os.write(_report_fd, line)


def _flush_report() -> None:
    global _report_pending
    path = os.environ.get(STEPS_FILE_VARIABLE)
    with _report_lock:
        if _report_pending is not None and path:
            _write_report(path, _report_pending)
        _report_pending = None


def job_id() -> int | None:
    """The id of the job this process runs, or None outside the queue."""
    return _int_variable("ASYNCSOAK_JOB_ID")


def attempt() -> int | None:
    """This attempt's number (1 for the first run, counting interrupted runs), or None."""
    return _int_variable("ASYNCSOAK_ATTEMPT")


def _int_variable(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def run_dir() -> Path | None:
    """The job's run directory, kept across attempts (checkpoints go here), or None."""
    value = os.environ.get("ASYNCSOAK_RUN_DIR")
    return Path(value) if value else None


def stop_requested() -> threading.Event:
    """The one event set when the worker asks this process to save and stop: stdin's end of
    file (``ASYNCSOAK_STOP_MODE=stdin`` or ``--watch-stdin``), else SIGTERM."""
    global _stop_event
    with _stop_lock:
        if _stop_event is not None:
            return _stop_event
        event = threading.Event()
        if os.environ.get("ASYNCSOAK_STOP_MODE") == "stdin" or "--watch-stdin" in sys.argv:
            threading.Thread(
                target=_watch_stdin, args=(event,), name="asyncsoak-stdin", daemon=True
            ).start()
        elif threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
        _stop_event = event
        return event


def _watch_stdin(event: threading.Event) -> None:
    # Whatever the worker writes is ignored: only end of file means something.
    with contextlib.suppress(OSError):
        while os.read(0, 65536):
            pass
    event.set()


def cancel_requested(min_interval: float = 1.0) -> bool:
    """Whether this job's cancellation was requested (False outside the queue, or while the
    database is unreadable), read at most once per ``min_interval`` seconds; stays True."""
    global _cancel_checked_at, _cancel_seen
    if _cancel_seen:
        return True
    now = time.monotonic()
    if now - _cancel_checked_at < min_interval:
        return False
    _cancel_checked_at = now
    ident, db = job_id(), os.environ.get("ASYNCSOAK_DB")
    if ident is None or not db:
        return False
    from ._jobs import read_job

    try:
        _cancel_seen = read_job(db, ident).cancel_requested
    except Exception:  # sqlite3 or psycopg: the worker still enforces it
        return False
    return _cancel_seen


def load_config(job: int | None = None, db: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The JSON config of a job submitted with ``--config`` (this process's job by default)."""
    ident = job if job is not None else job_id()
    path = db if db is not None else os.environ.get("ASYNCSOAK_DB")
    if ident is None or not path:
        raise RuntimeError(
            "no job to read a config for: ASYNCSOAK_JOB_ID and ASYNCSOAK_DB are unset "
            "(this process was not started by an asyncsoak worker)"
        )
    from ._jobs import read_job

    config = read_job(os.fspath(path), ident).config
    if config is None:
        raise RuntimeError(f"job {ident} was submitted with a command, not a config")
    return config
