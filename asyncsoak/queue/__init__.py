"""The durable training-job queue: a store (SQLite on one host, PostgreSQL for many), a worker
that runs each job under ``run_soak``, and the final status rules.  Names load on first use, so
the store and the read-only commands skip the soak core; the worker's defaults (``POLL_S``...)
are importable here, outside ``__all__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from .__main__ import main as main
    from ._attempt import run_job as run_job
    from ._fleet import COMMAND_WAIT_FOR_DB_S as COMMAND_WAIT_FOR_DB_S
    from ._fleet import LOST as LOST
    from ._fleet import LOST_AFTER_S as LOST_AFTER_S
    from ._fleet import PRUNE_AFTER_S as PRUNE_AFTER_S
    from ._fleet import WORKER_WAIT_FOR_DB_S as WORKER_WAIT_FOR_DB_S
    from ._fleet import WorkerView as WorkerView
    from ._fleet import open_for_worker as open_for_worker
    from ._fleet import open_store as open_store
    from ._fleet import open_when_reachable as open_when_reachable
    from ._fleet import worker_views as worker_views
    from ._goodput import artifact_section as artifact_section
    from ._goodput import job_goodput as job_goodput
    from ._goodput import queue_goodput as queue_goodput
    from ._models import INTEGER_MAX as INTEGER_MAX
    from ._models import JOB_STATUSES as JOB_STATUSES
    from ._models import MAX_TRIES as MAX_TRIES
    from ._models import Attempt as Attempt
    from ._models import DatabaseUnreachableError as DatabaseUnreachableError
    from ._models import Job as Job
    from ._models import JobNotFoundError as JobNotFoundError
    from ._models import JobOptions as JobOptions
    from ._models import JobStateError as JobStateError
    from ._models import QueueDatabaseError as QueueDatabaseError
    from ._models import QueueDatabaseLostError as QueueDatabaseLostError
    from ._models import QueueError as QueueError
    from ._models import QueueMissingError as QueueMissingError
    from ._models import QueueUnavailableError as QueueUnavailableError
    from ._models import WorkerInfo as WorkerInfo
    from ._models import WorkerNameInUseError as WorkerNameInUseError
    from ._models import public_job as public_job
    from ._models import validate_submission as validate_submission
    from ._orphans import process_alive as process_alive
    from ._postgres import PostgresStore as PostgresStore
    from ._settings import TRAIN_CMD as TRAIN_CMD
    from ._settings import WorkerConfig as WorkerConfig
    from ._settings import checked as checked
    from ._sqlite import SqliteStore as SqliteStore
    from ._status import CANCEL_GRACE_S as CANCEL_GRACE_S
    from ._status import DEPENDENCY_FAILED as DEPENDENCY_FAILED
    from ._status import ERROR_TAIL_LINES as ERROR_TAIL_LINES
    from ._status import FAILED as FAILED
    from ._status import FINISH_RETRIES as FINISH_RETRIES
    from ._status import FINISH_RETRY_WAIT_S as FINISH_RETRY_WAIT_S
    from ._status import INFRASTRUCTURE_BACKOFF_S as INFRASTRUCTURE_BACKOFF_S
    from ._status import KILL_WAIT_S as KILL_WAIT_S
    from ._status import KILLED_BEFORE_SAVING as KILLED_BEFORE_SAVING
    from ._status import LOG_TAIL_HEADER as LOG_TAIL_HEADER
    from ._status import MAX_INFRASTRUCTURE_RETRIES as MAX_INFRASTRUCTURE_RETRIES
    from ._status import POLL_S as POLL_S
    from ._status import RETRY_NAMES as RETRY_NAMES
    from ._status import SLICE_S as SLICE_S
    from ._status import STALE_AFTER_S as STALE_AFTER_S
    from ._status import STOP_TIMEOUT_S as STOP_TIMEOUT_S
    from ._status import SUCCEEDED as SUCCEEDED
    from ._status import TAIL_BYTES as TAIL_BYTES
    from ._status import WARNINGS_HEADER as WARNINGS_HEADER
    from ._status import JobStatus as JobStatus
    from ._status import Outcome as Outcome
    from ._status import describe_exit as describe_exit
    from ._status import final_status as final_status
    from ._status import tail as tail
    from ._status import with_soak_verdict as with_soak_verdict
    from ._store import JobStore as JobStore
    from ._store import default_data_dir as default_data_dir
    from ._sweeps import MAX_GPUS as MAX_GPUS
    from ._sweeps import AttemptCause as AttemptCause
    from ._sweeps import GpuFault as GpuFault
    from ._sweeps import Plan as Plan
    from ._sweeps import check_plan as check_plan
    from ._sweeps import parse_array as parse_array
    from ._worker import prepare_runs_dir as prepare_runs_dir
    from ._worker import run_worker as run_worker

__getattr__, __dir__ = lazy_door(__name__, __file__)

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
    "QueueDatabaseLostError",
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
