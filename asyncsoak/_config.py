"""Validate ``run_soak``'s arguments into one :class:`SoakConfig`, before anything happens.

Every check raises ``TypeError`` or ``ValueError`` with a message naming the argument; nothing
is launched or written until all of them pass.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

StopMode = Literal["group", "leader", "stdin"]
STOP_MODES: tuple[StopMode, ...] = ("group", "leader", "stdin")
#: Default cap of the captured output log: the first and the last half are kept.
LOG_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakConfig:
    command: tuple[str, ...]
    progress_dir: Path
    output_path: Path
    journal_path: Path
    log_path: Path
    sample_interval_seconds: float
    startup_timeout_seconds: float
    stale_progress_seconds: float
    post_shutdown_grace_seconds: float
    min_duration_seconds: float
    max_duration_seconds: float | None
    cwd: Path | None
    env: dict[str, str] | None
    metadata: dict[str, Any]
    stop_mode: StopMode
    output_is_progress: bool
    snapshot_root: Path
    nvidia_smi: str | None
    kill_wait_seconds: float
    log_max_bytes: int
    dump_signal: int | None
    forensics: bool
    detailed_memory: bool

    def effective(self) -> dict[str, Any]:
        """Every effective parameter, as the artifact's ``config`` records it."""
        out = asdict(self)
        for key in ("command", "env", "metadata"):
            out.pop(key)
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


def _duration(name: str, value: object, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "positive" if not allow_zero else "zero or more"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return seconds


def _path(name: str, value: object) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a path, not {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name} must be a non-empty path")
    return Path(text).absolute()


def _command(command: object) -> tuple[str, ...]:
    if isinstance(command, str | bytes):
        raise TypeError(
            "command must be a sequence of arguments (argv), not a string: "
            "asyncsoak never runs commands through a shell"
        )
    if not isinstance(command, Sequence):
        raise TypeError(f"command must be a sequence of strings, not {type(command).__name__}")
    if not command:
        raise ValueError("command must not be empty")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise TypeError(f"command[{i}] must be a string, not {type(arg).__name__}")
        if "\0" in arg:
            raise ValueError(f"command[{i}] contains a NUL byte")
    if not command[0]:
        raise ValueError("command[0] (the program) must not be empty")
    return tuple(command)


def _env(env: object) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of strings, not {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env keys and values must be strings, got {key!r}: {value!r}")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"env has an invalid variable name or value: {key!r}")
        out[key] = value
    return out


def _metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
    try:
        data = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serialisable: {exc}") from None
    return cast(dict[str, Any], data)


def validate(
    *,
    command: object,
    progress_dir: object,
    output_path: object,
    sample_interval_seconds: object,
    startup_timeout_seconds: object,
    stale_progress_seconds: object,
    post_shutdown_grace_seconds: object,
    min_duration_seconds: object,
    max_duration_seconds: object,
    cwd: object,
    env: object,
    metadata: object,
    stop_mode: object,
    output_is_progress: object,
    log_path: object,
    snapshot_root: object,
    nvidia_smi: object,
    kill_wait_seconds: object,
    log_max_bytes: object,
    dump_signal: object = None,
    forensics: object = True,
    detailed_memory: object = False,
) -> SoakConfig:
    argv = _command(command)
    progress = _path("progress_dir", progress_dir)
    if progress.exists() and not progress.is_dir():
        raise ValueError(f"progress_dir exists but is not a directory: {progress}")
    output = _path("output_path", output_path)
    if output.is_dir():
        raise ValueError(f"output_path is a directory: {output}")
    if output.suffix in (".jsonl", ".log"):
        raise ValueError(
            f"output_path must not end in {output.suffix}: the journal and the log "
            "are written beside it with those suffixes"
        )
    if output.parent.exists() and not output.parent.is_dir():
        raise ValueError(f"output_path's parent is not a directory: {output.parent}")
    log = output.with_suffix(".log") if log_path is None else _path("log_path", log_path)
    if log.is_dir():
        raise ValueError(f"log_path is a directory: {log}")
    work_dir = None if cwd is None else _path("cwd", cwd)
    if work_dir is not None and not work_dir.is_dir():
        raise ValueError(f"cwd is not a directory: {work_dir}")
    if stop_mode not in STOP_MODES:
        raise ValueError(f"stop_mode must be one of {', '.join(STOP_MODES)}, got {stop_mode!r}")
    if not isinstance(output_is_progress, bool):
        raise TypeError("output_is_progress must be a bool")
    if nvidia_smi is not None and (not isinstance(nvidia_smi, str) or not nvidia_smi):
        raise TypeError("nvidia_smi must be a command name or path, or None to disable GPUs")
    if isinstance(log_max_bytes, bool) or not isinstance(log_max_bytes, int):
        raise TypeError("log_max_bytes must be an int")
    if log_max_bytes < 4096:
        raise ValueError("log_max_bytes must be at least 4096")
    if not isinstance(forensics, bool) or not isinstance(detailed_memory, bool):
        raise TypeError("forensics and detailed_memory must be bools")
    max_duration = (
        None
        if max_duration_seconds is None
        else _duration("max_duration_seconds", max_duration_seconds, allow_zero=False)
    )
    root = work_dir or Path.cwd()
    if snapshot_root is not None:
        root = _path("snapshot_root", snapshot_root)
    return SoakConfig(
        command=argv,
        progress_dir=progress,
        output_path=output,
        journal_path=output.with_suffix(".jsonl"),
        log_path=log,
        sample_interval_seconds=_duration(
            "sample_interval_seconds", sample_interval_seconds, allow_zero=False
        ),
        startup_timeout_seconds=_duration("startup_timeout_seconds", startup_timeout_seconds),
        stale_progress_seconds=_duration("stale_progress_seconds", stale_progress_seconds),
        post_shutdown_grace_seconds=_duration(
            "post_shutdown_grace_seconds", post_shutdown_grace_seconds
        ),
        min_duration_seconds=_duration("min_duration_seconds", min_duration_seconds),
        max_duration_seconds=max_duration,
        cwd=work_dir,
        env=_env(env),
        metadata=_metadata(metadata),
        stop_mode=stop_mode,
        output_is_progress=output_is_progress,
        snapshot_root=root,
        nvidia_smi=nvidia_smi,
        kill_wait_seconds=_duration("kill_wait_seconds", kill_wait_seconds, allow_zero=False),
        log_max_bytes=log_max_bytes,
        dump_signal=_signal("dump_signal", dump_signal),
        forensics=forensics,
        detailed_memory=detailed_memory,
    )


def _signal(name: str, value: object) -> int | None:
    """A signal given by number, ``signal.Signals`` member or name (``"SIGUSR1"``, ``"USR1"``)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.upper()
        text = text if text.startswith("SIG") else "SIG" + text
        try:
            value = signal.Signals[text]
        except KeyError:
            raise ValueError(f"{name}: unknown signal {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a signal number or name, not {type(value).__name__}")
    try:
        sig = signal.Signals(value)
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not a signal") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{name} cannot be {sig.name}: it would end or freeze the run")
    return int(sig)
