"""A worker's settings, :class:`WorkerConfig`: the one place they are spelled, from whose
fields' metadata ``asyncsoak worker`` derives its flags (spelling, help, default).
"""

from __future__ import annotations

import dataclasses
import sys
from functools import partial
from pathlib import Path
from typing import Any, Literal

from .._contract import ValidationError, ValidationTypeError
from .._supervisor import seconds
from ._models import MAX_TRIES, whole
from ._status import (
    CANCEL_GRACE_S,
    FINISH_RETRIES,
    FINISH_RETRY_WAIT_S,
    INFRASTRUCTURE_BACKOFF_S,
    KILL_WAIT_S,
    POLL_S,
    STALE_AFTER_S,
    STOP_TIMEOUT_S,
)

#: Trainer command for jobs submitted with a config; the worker appends
#: ``--job-id N --db PATH --watch-stdin``.
TRAIN_CMD = [sys.executable, "train.py"]

#: How a setting is written on the command line: seconds, a count, a path, a shell-quoted
#: command, text (a GPU list, a program), or nothing (``none``: not a flag, said why in help).
SettingKind = Literal["seconds", "count", "path", "command", "text", "none"]


def _setting(
    default: object,
    flag: str | None,
    help: str,
    *,
    kind: SettingKind = "seconds",
    allow_zero: bool = True,
    metavar: str | None = None,
) -> Any:
    """A worker setting: its default, its ``asyncsoak worker`` flag and help (the CLI adds
    the default of a number), its kind, and for seconds whether zero is allowed."""
    metadata = {"flag": flag, "help": help, "kind": kind, "allow_zero": allow_zero}
    metadata["metavar"] = metavar or (
        "S" if kind == "seconds" else "N" if kind == "count" else None
    )
    if isinstance(default, list):
        return dataclasses.field(default_factory=partial(list, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """How a worker runs its jobs, checked when it is made (a bad period raises
    ``ValidationError`` naming the field).  ``asyncsoak worker`` has one flag per field."""

    runs_dir: Path | None = _setting(
        None, "--runs-dir", "where runs live (default: beside the database)", kind="path"
    )
    cmd: list[str] = _setting(
        TRAIN_CMD,
        "--train-cmd",
        "trainer command for --config jobs, one shell-quoted string (default: python "
        "train.py); --job-id N --db PATH --watch-stdin are appended",
        kind="command",
    )
    gpus: str | None = _setting(
        None,
        "--gpus",
        "the GPUs it owns, e.g. 0 or 0,1,2,3: jobs run side by side on them, each with its "
        "own CUDA_VISIBLE_DEVICES (submit --gpus N), never sharing a GPU",
        kind="text",
    )
    poll_seconds: float = _setting(POLL_S, "--poll", "poll/heartbeat period", allow_zero=False)
    #: Also how long a worker on another host may be silent and still hold its name.
    orphan_after_seconds: float = _setting(
        STALE_AFTER_S, "--stale-after", "heartbeat age that makes a running job an orphan"
    )
    cancel_grace_seconds: float = _setting(
        CANCEL_GRACE_S, "--cancel-grace", "time a cancelled job gets to stop by itself"
    )
    stop_timeout_seconds: float = _setting(
        STOP_TIMEOUT_S,
        "--stop-timeout",
        "time a job gets to save once asked to stop, before it is killed",
    )
    kill_wait_seconds: float = _setting(
        KILL_WAIT_S,
        "--kill-wait",
        "longest wait for a killed job's processes to go",
        allow_zero=False,
    )
    finish_retries: int = _setting(
        FINISH_RETRIES,
        "--finish-retries",
        "attempts at writing a job's final status while the database is unavailable, before "
        "it is kept in the spool",
        kind="count",
    )
    finish_retry_wait_seconds: float = _setting(
        FINISH_RETRY_WAIT_S,
        "--finish-retry-wait",
        "wait between two attempts at writing a job's final status",
    )
    retry_backoff_seconds: float = _setting(
        INFRASTRUCTURE_BACKOFF_S,
        "--retry-backoff",
        "wait before a job's second infrastructure retry (the first is at once), doubling for "
        "each later one",
    )
    #: None: no GPU sampling (``--no-gpu``).
    nvidia_smi: str | None = _setting(
        "nvidia-smi", "--nvidia-smi", "nvidia-smi to sample GPUs with", kind="text", metavar="PATH"
    )
    #: Wall-clock end of the worker's allocation (a SLURM job): no job is taken that would not
    #: fit.  Not a flag: ``asyncsoak worker`` reads it from its SLURM job.
    until: float | None = _setting(
        None, None, "the end of the worker's SLURM allocation, read from the job", kind="none"
    )

    def __post_init__(self) -> None:
        norm = partial(object.__setattr__, self)
        norm("cmd", list(self.cmd))
        if self.runs_dir is not None:
            norm("runs_dir", Path(self.runs_dir).absolute())
        for spec in dataclasses.fields(self):
            norm(spec.name, checked(spec.name, spec, getattr(self, spec.name)))


def checked(label: str, spec: dataclasses.Field[Any], value: Any) -> Any:
    """``value`` for the setting ``spec`` if it is valid (normalised: seconds as floats),
    else a ``ValidationError`` naming ``label`` (a field, or its flag on the command line)."""
    kind = spec.metadata["kind"]
    if kind == "seconds":
        return seconds(label, value, allow_zero=spec.metadata["allow_zero"])
    if kind == "count":
        if not whole(value):
            raise ValidationTypeError(f"{label} must be an integer, not {type(value).__name__}")
        if value < 0:
            raise ValidationError(f"{label} must be zero or more, got {value!r}")
        if value > MAX_TRIES:
            raise ValidationError(f"{label} must be at most {MAX_TRIES}, got {value!r}")
    return value
