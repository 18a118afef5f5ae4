"""The durable training-job queue: a store (SQLite on one host, PostgreSQL for many), a
worker that runs each job under ``run_soak`` with a :class:`WorkerConfig`, and the final
status rules (:class:`JobStatus`).

The worker's names load lazily, so the store and the command line's read-only commands do
not import the soak core; ``main`` (``python -m asyncsoak.queue``) loads the command line.

The worker's defaults stay importable here under their reference names (``POLL_S``,
``STALE_AFTER_S``, ``CANCEL_GRACE_S``, ``STOP_TIMEOUT_S``, ``KILL_WAIT_S``, ``FINISH_RETRIES``,
``FINISH_RETRY_WAIT_S``, ``SLICE_S``, ``ERROR_TAIL_LINES``, ``TAIL_BYTES``, ``TRAIN_CMD``);
they are :class:`WorkerConfig`'s defaults, not names of their own in ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._models import Attempt as Attempt
from ._models import DatabaseUnreachableError as DatabaseUnreachableError
from ._models import Job as Job
from ._models import JobNotFoundError as JobNotFoundError
from ._models import JobStateError as JobStateError
from ._models import QueueDatabaseError as QueueDatabaseError
from ._models import QueueError as QueueError
from ._models import QueueMissingError as QueueMissingError
from ._models import QueueUnavailableError as QueueUnavailableError
from ._models import WorkerInfo as WorkerInfo
from ._models import WorkerNameInUseError as WorkerNameInUseError
from ._postgres import PostgresStore as PostgresStore
from ._settings import TRAIN_CMD as TRAIN_CMD
from ._settings import WorkerConfig as WorkerConfig
from ._sqlite import SqliteStore as SqliteStore
from ._status import CANCEL_GRACE_S as CANCEL_GRACE_S
from ._status import ERROR_TAIL_LINES as ERROR_TAIL_LINES
from ._status import FINISH_RETRIES as FINISH_RETRIES
from ._status import FINISH_RETRY_WAIT_S as FINISH_RETRY_WAIT_S
from ._status import KILL_WAIT_S as KILL_WAIT_S
from ._status import POLL_S as POLL_S
from ._status import SLICE_S as SLICE_S
from ._status import STALE_AFTER_S as STALE_AFTER_S
from ._status import STOP_TIMEOUT_S as STOP_TIMEOUT_S
from ._status import TAIL_BYTES as TAIL_BYTES
from ._status import JobStatus as JobStatus
from ._status import Outcome as Outcome
from ._status import describe_exit as describe_exit
from ._status import final_status as final_status
from ._status import tail as tail
from ._status import with_soak_verdict as with_soak_verdict
from ._store import JobStore as JobStore
from ._store import open_store as open_store

if TYPE_CHECKING:
    from .__main__ import main as main
    from ._worker import run_job as run_job
    from ._worker import run_worker as run_worker

__all__ = [
    "Attempt",
    "DatabaseUnreachableError",
    "Job",
    "JobNotFoundError",
    "JobStateError",
    "JobStatus",
    "JobStore",
    "Outcome",
    "PostgresStore",
    "QueueDatabaseError",
    "QueueError",
    "QueueMissingError",
    "QueueUnavailableError",
    "SqliteStore",
    "WorkerConfig",
    "WorkerInfo",
    "WorkerNameInUseError",
    "describe_exit",
    "final_status",
    "main",
    "open_store",
    "run_job",
    "run_worker",
    "tail",
    "with_soak_verdict",
]

#: Names loaded on first use, each from its module: the worker's (the soak core) and the
#: entry point's (the command line).
_LAZY = {"run_job": "._worker", "run_worker": "._worker", "main": ".__main__"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'asyncsoak.queue' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
