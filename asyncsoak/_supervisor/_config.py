"""Validate ``run_soak``'s arguments into one :class:`SoakConfig`, before anything happens.

Every check raises :class:`ValidationError` (a ``ValueError``) or :class:`ValidationTypeError`
(also a ``TypeError``) with a message naming the argument; nothing is launched or written until
all of them pass.  The same checks serve the job queue (:func:`validate_job`), so a job that
``run_soak`` would refuse is refused when it is submitted, not hours later by a worker.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

from .._contract import (
    MAX_METADATA_DEPTH,
    MAX_SECONDS,
    ValidationError,
    ValidationTypeError,
    check_size,
    nested_too_deep,
)
from .._sampling import LOSS_CHECKS, PROGRESS_SOURCES, LossCheck, ProgressSource

StopMode = Literal["group", "leader", "stdin"]
STOP_MODES: tuple[StopMode, ...] = ("group", "leader", "stdin")
LeakCheck = Literal["warn", "fail", "off"]
LEAK_CHECKS: tuple[LeakCheck, ...] = ("warn", "fail", "off")
#: Default cap of the captured output log: the first and the last half are kept.
LOG_MAX_BYTES = 16 * 1024 * 1024
#: The shortest sample interval: below it the sampler is a busy loop that burns a core (a
#: sample of a small tree costs about a millisecond of CPU).
MIN_SAMPLE_INTERVAL_SECONDS = 0.05


#: What a job-settable limit holds, which says how it is checked and how its flag parses:
#: seconds (``--grace 5``, or ``auto`` where the metadata allows it), a switch
#: (``--output-is-progress``), one of ``choices`` (``--leak-check fail``), a size
#: (``--max-rss 2GiB``), a signal (``--dump-signal USR1``) or a record key (``--step-key it``).
LimitKind = Literal["seconds", "switch", "choice", "size", "signal", "key"]
#: The longest ``--step-key``/``--loss-key``.
MAX_KEY_LENGTH = 200


def _limit(
    default: float | bool | str | None,
    flag: str,
    help: str,
    *,
    kind: LimitKind = "seconds",
    allow_zero: bool = True,
    minimum: float = 0.0,
    choices: tuple[str, ...] = (),
    auto: bool = False,
) -> Any:
    """A job-settable soak limit: its default (``run_soak``'s), its CLI flag and help, its
    kind, and for seconds whether zero is allowed and the least value (None is allowed where
    the default is None); every duration is at most :data:`MAX_SECONDS`."""
    metadata = {
        "flag": flag,
        "help": help,
        "kind": kind,
        "allow_zero": allow_zero,
        "minimum": minimum,
        "auto": auto,
    }
    return field(default=default, metadata={**metadata, "choices": choices})


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakLimits:
    """The ``run_soak`` parameters a queued job may set: the one place they are spelled.

    The queue checks a job's limits against it at submit time, ``run_soak`` checks its own
    arguments with it, and the CLI derives its flags (name, help, default) from its fields.
    """

    sample_interval_seconds: float = _limit(
        5.0,
        "--sample-interval",
        f"seconds between two samples (at least {MIN_SAMPLE_INTERVAL_SECONDS:g})",
        allow_zero=False,
        minimum=MIN_SAMPLE_INTERVAL_SECONDS,
    )
    startup_timeout_seconds: float = _limit(
        600.0, "--startup-timeout", "seconds the command may take to show its first progress"
    )
    stale_progress_seconds: float | Literal["auto"] = _limit(
        120.0,
        "--stale-progress",
        "seconds without progress before the soak fails, or 'auto' to learn the limit "
        "from the run's own gaps",
        auto=True,
    )
    post_shutdown_grace_seconds: float = _limit(
        5.0, "--grace", "seconds the command may take to exit once asked to stop"
    )
    min_duration_seconds: float = _limit(
        0.0, "--min-duration", "seconds the command must run for the soak to pass"
    )
    max_duration_seconds: float | None = _limit(
        None,
        "--max-duration",
        "seconds after which the soak stops the command (default: none)",
        allow_zero=False,
    )
    output_is_progress: bool = _limit(
        False,
        "--output-is-progress",
        "count the command's printed output as progress",
        kind="switch",
    )
    warm_up_seconds: float | None = _limit(
        None,
        "--warm-up",
        "seconds of the run not judged for trends (default: 10% of it, at most 600)",
    )
    leak_check: LeakCheck = _limit(
        "warn",
        "--leak-check",
        "a confident leak is a warning (default), fails the soak, or is not checked",
        kind="choice",
        choices=LEAK_CHECKS,
    )
    max_rss_bytes: int | None = _limit(
        None, "--max-rss", "fail when the tree's RSS exceeds SIZE", kind="size"
    )
    max_gpu_memory_bytes: int | None = _limit(
        None, "--max-gpu-memory", "fail when the tree's GPU memory exceeds SIZE", kind="size"
    )
    min_disk_free_bytes: int | None = _limit(
        None,
        "--min-disk-free",
        "fail when the progress or output filesystem has less than SIZE free",
        kind="size",
    )
    detailed_memory: bool = _limit(
        False,
        "--detailed-memory",
        "also read USS/PSS (reads smaps; can stall on a CUDA process)",
        kind="switch",
    )
    progress_source: ProgressSource = _limit(
        "auto",
        "--progress-source",
        "what counts as progress: training steps (from metrics files, trainer_state.json, "
        "metrics.csv, asyncsoak.trainer.report), file changes, or auto (steps once a step "
        "source is found, file changes until then)",
        kind="choice",
        choices=PROGRESS_SOURCES,
    )
    step_key: str | None = _limit(
        None, "--step-key", "the record key that carries the step (default: detected)", kind="key"
    )
    loss_key: str | None = _limit(
        None, "--loss-key", "the record key that carries the loss (default: detected)", kind="key"
    )
    loss_check: LossCheck = _limit(
        "fail",
        "--loss-check",
        "a NaN or infinite loss fails the soak (default), is a warning, or is not checked",
        kind="choice",
        choices=LOSS_CHECKS,
    )
    dump_signal: int | None = _limit(
        None,
        "--dump-signal",
        "signal sent to the command when it stalls, before forensics (e.g. SIGUSR1 for a "
        "trainer that registered faulthandler)",
        kind="signal",
    )

    def __post_init__(self) -> None:
        for spec in fields(SoakLimits):  # not the subclass's fields: SoakConfig checks those
            object.__setattr__(self, spec.name, _check_limit(spec, getattr(self, spec.name)))


def _check_limit(spec: Field[Any], value: object) -> object:
    """One job-settable limit checked as its kind says; sizes become bytes (``"2GiB"`` too)."""
    kind = spec.metadata["kind"]
    if kind == "switch":
        if not isinstance(value, bool):
            raise ValidationTypeError(f"{spec.name} must be a bool")
        return value
    if kind == "choice":
        choices = spec.metadata["choices"]
        if value not in choices:
            raise ValidationError(f"{spec.name} must be one of {', '.join(choices)}, got {value!r}")
        return value
    if kind == "size":
        return check_size(spec.name, value)
    if kind == "signal":
        return _signal(spec.name, value)
    if kind == "key":
        return _record_key(spec.name, value)
    if value is None and spec.default is None:
        return None
    if value == "auto" and spec.metadata["auto"]:
        return "auto"
    return seconds(
        spec.name, value, allow_zero=spec.metadata["allow_zero"], minimum=spec.metadata["minimum"]
    )


#: The names of :class:`SoakLimits`' fields, in their order.
SOAK_LIMITS: tuple[str, ...] = tuple(spec.name for spec in fields(SoakLimits))


def _given(default: object) -> Any:
    """A field given as ``run_soak``'s keyword of the same name is, with that default; the
    field's type is the checked value's (a path given as text becomes a ``Path``, None for
    ``log_path`` the path beside the artifact)."""
    return field(default=default)


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig(SoakLimits):
    """Everything one soak runs with, checked when it is made: :func:`asyncsoak.run_soak`
    builds it from its keyword arguments, whose documentation says what each one means, or
    takes it whole (``run_soak(config=SoakConfig(command=..., progress_dir=...,
    output_path=...))``); every other field has ``run_soak``'s default.

    Construction raises :class:`asyncsoak.ValidationError` naming the first bad argument;
    paths become absolute, durations floats, signals numbers and sizes bytes, ``log_path``
    None means beside the artifact and ``snapshot_root`` None the working directory.
    """

    command: tuple[str, ...]
    progress_dir: Path
    output_path: Path
    #: Derived: the artifact's path with ``.jsonl``.
    journal_path: Path = field(init=False)
    #: Derived: where ``asyncsoak.trainer.report`` appends (the artifact's ``.steps.jsonl``).
    steps_path: Path = field(init=False)
    log_path: Path = _given(None)
    cwd: Path | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] = _given(None)
    stop_mode: StopMode = "group"
    snapshot_root: Path = _given(None)
    nvidia_smi: str | None = "nvidia-smi"
    kill_wait_seconds: float = 5.0
    log_max_bytes: int = LOG_MAX_BYTES
    forensics: bool = True
    forward_signals: tuple[int, ...] = ()
    requeue_on: int | None = None
    progress_exclude: tuple[Path, ...] = ()
    #: ``stale_progress_seconds="auto"``: a limit learned by earlier runs of the same job.
    stale_progress_carried_seconds: float | None = None
    scheduler_grace_seconds: float | None = None

    def __post_init__(self) -> None:
        # The checks run in the order of run_soak's documentation, so the first bad argument
        # is the one named; each normalised value replaces the given one.
        given: Any = self
        norm = partial(object.__setattr__, self)
        norm("command", _command(given.command))
        norm("progress_dir", _progress_dir(given.progress_dir))
        output = _path("output_path", given.output_path)
        if output.is_dir():
            raise ValidationError(f"output_path is a directory: {output}")
        if output.suffix in (".jsonl", ".log"):
            raise ValidationError(
                f"output_path must not end in {output.suffix}: the journal and the log "
                "are written beside it with those suffixes"
            )
        if output.parent.exists() and not output.parent.is_dir():
            raise ValidationError(f"output_path's parent is not a directory: {output.parent}")
        norm("output_path", output)
        norm("journal_path", output.with_suffix(".jsonl"))
        norm("steps_path", output.with_name(f"{output.stem}.steps.jsonl"))
        log_path = given.log_path
        log = output.with_suffix(".log") if log_path is None else _path("log_path", log_path)
        if log.is_dir():
            raise ValidationError(f"log_path is a directory: {log}")
        if log in (output, output.with_suffix(".jsonl")):
            raise ValidationError(
                f"log_path must not be the artifact's or the journal's path: {log}"
            )
        norm("log_path", log)
        work_dir = _cwd(given.cwd)
        norm("cwd", work_dir)
        norm("stop_mode", _stop_mode(given.stop_mode))
        SoakLimits.__post_init__(self)
        nvidia_smi = given.nvidia_smi
        if nvidia_smi is not None and (not isinstance(nvidia_smi, str) or not nvidia_smi):
            raise ValidationTypeError(
                "nvidia_smi must be a command name or path, or None to disable GPUs"
            )
        log_max_bytes = given.log_max_bytes
        if isinstance(log_max_bytes, bool) or not isinstance(log_max_bytes, int):
            raise ValidationTypeError("log_max_bytes must be an int")
        if log_max_bytes < 4096:
            raise ValidationError("log_max_bytes must be at least 4096")
        if not isinstance(given.forensics, bool):
            raise ValidationTypeError("forensics must be a bool")
        snapshot_root = given.snapshot_root
        root = work_dir or Path.cwd()
        norm(
            "snapshot_root",
            root if snapshot_root is None else _path("snapshot_root", snapshot_root),
        )
        norm("env", _env(given.env))
        norm("metadata", _metadata(given.metadata))
        norm(
            "kill_wait_seconds",
            seconds("kill_wait_seconds", given.kill_wait_seconds, allow_zero=False),
        )
        norm("progress_exclude", _excluded(given.progress_exclude))
        norm("forward_signals", _signals("forward_signals", given.forward_signals))
        norm("requeue_on", _own_signal("requeue_on", given.requeue_on))
        carried = given.stale_progress_carried_seconds
        if carried is not None:
            norm(
                "stale_progress_carried_seconds",
                seconds("stale_progress_carried_seconds", carried, allow_zero=False),
            )
        if given.scheduler_grace_seconds is not None:
            norm(
                "scheduler_grace_seconds",
                seconds("scheduler_grace_seconds", given.scheduler_grace_seconds),
            )

    def effective(self) -> dict[str, Any]:
        """Every effective parameter, as the artifact's ``config`` records it."""
        out = asdict(self)
        for key in ("command", "env", "metadata"):
            out.pop(key)
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


def seconds(name: str, value: object, *, allow_zero: bool = True, minimum: float = 0.0) -> float:
    """A finite duration, ``>= 0`` (``> 0`` unless ``allow_zero``), at least ``minimum`` and
    at most :data:`MAX_SECONDS` (a year); also for CLI flags."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationTypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:  # an int past a float's range
        out = math.inf
    if math.isnan(out) or math.isinf(out):
        raise ValidationError(f"{name} must be a finite number of seconds, got {value!r}")
    if out < 0 or (out == 0 and not allow_zero):
        bound = "positive" if not allow_zero else "zero or more"
        raise ValidationError(f"{name} must be {bound}, got {value!r}")
    if out < minimum:
        raise ValidationError(f"{name} must be at least {minimum:g} seconds, got {value!r}")
    if out > MAX_SECONDS:
        raise ValidationError(
            f"{name} must be at most {MAX_SECONDS:g} seconds (a year), got {value!r}"
        )
    return out


def validate_limits(limits: Mapping[str, object]) -> dict[str, Any]:
    """The soak limits a job carries (a subset of :data:`SOAK_LIMITS`), checked as run_soak
    does; returns the given ones, normalised (durations as floats)."""
    for key in limits:
        if key not in SOAK_LIMITS:
            raise ValidationError(f"unknown soak limit {key!r} (known: {', '.join(SOAK_LIMITS)})")
    checked = SoakLimits(**limits)  # type: ignore[arg-type]  # checked in __post_init__
    return {key: getattr(checked, key) for key in limits}


def _record_key(name: str, value: object) -> str | None:
    """A key of the trainer's records (``--step-key``): printable text, or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationTypeError(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > MAX_KEY_LENGTH or not value.isprintable():
        raise ValidationError(
            f"{name} must be printable text of 1 to {MAX_KEY_LENGTH} characters, got {value!r}"
        )
    return value


def _path(name: str, value: object) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise ValidationTypeError(f"{name} must be a path, not {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValidationError(f"{name} must be a non-empty path")
    if "\0" in text:
        raise ValidationError(f"{name} contains a NUL byte")
    return Path(text).absolute()


def _progress_dir(value: object) -> Path:
    progress = _path("progress_dir", value)
    if progress.exists() and not progress.is_dir():
        raise ValidationError(f"progress_dir exists but is not a directory: {progress}")
    return progress


def _cwd(value: object) -> Path | None:
    work_dir = None if value is None else _path("cwd", value)
    if work_dir is not None and not work_dir.is_dir():
        raise ValidationError(f"cwd is not a directory: {work_dir}")
    return work_dir


def _stop_mode(value: object) -> StopMode:
    if value not in STOP_MODES:
        raise ValidationError(f"stop_mode must be one of {', '.join(STOP_MODES)}, got {value!r}")
    return value


def _command(command: object) -> tuple[str, ...]:
    if isinstance(command, str | bytes):
        raise ValidationTypeError(
            "command must be a sequence of arguments (argv), not a string: "
            "asyncsoak never runs commands through a shell"
        )
    if not isinstance(command, Sequence):
        raise ValidationTypeError(
            f"command must be a sequence of strings, not {type(command).__name__}"
        )
    if not command:
        raise ValidationError("command must not be empty")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise ValidationTypeError(f"command[{i}] must be a string, not {type(arg).__name__}")
        if "\0" in arg:
            raise ValidationError(f"command[{i}] contains a NUL byte")
    if not command[0]:
        raise ValidationError("command[0] (the program) must not be empty")
    return tuple(command)


def _env(env: object) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise ValidationTypeError(f"env must be a mapping of strings, not {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            # The value is not shown: it may be a secret.
            raise ValidationTypeError(f"env keys and values must be strings (variable {key!r})")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValidationError(f"env has an invalid variable name or value: {key!r}")
        out[key] = value
    return out


def _metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ValidationTypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
    try:
        data = json.loads(json.dumps(dict(metadata), allow_nan=False))
        too_deep = nested_too_deep(data, MAX_METADATA_DEPTH)
    except RecursionError:
        too_deep = True
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"metadata must be JSON-serialisable: {exc}") from None
    if too_deep:
        # Every reader refuses documents nested past a bound: the artifact and the journal
        # that hold the metadata must stay readable.
        raise ValidationError(f"metadata must not nest more than {MAX_METADATA_DEPTH} levels deep")
    return cast(dict[str, Any], data)


def _excluded(value: object) -> tuple[Path, ...]:
    if isinstance(value, str | bytes | os.PathLike) or not isinstance(value, Sequence):
        raise ValidationTypeError("progress_exclude must be a sequence of directory paths")
    return tuple(_path(f"progress_exclude[{i}]", item) for i, item in enumerate(value))


def validate_job(
    *,
    command: object,
    progress_dir: object,
    cwd: object,
    env: object,
    stop_mode: object,
    limits: Mapping[str, object],
) -> dict[str, Any]:
    """What a queued job gives ``run_soak``, checked with ``run_soak``'s own rules.

    ``command`` is None for a job run through the worker's trainer command (``--config``);
    ``progress_dir`` None means the run directory.  Returns the checked soak limits.
    """
    if command is not None:
        _command(command)
    if progress_dir is not None:
        _progress_dir(progress_dir)
    _cwd(cwd)
    _env(env)
    _stop_mode(stop_mode)
    return validate_limits(limits)


def forwarded_signals(forward_signals: object, requeue_on: object) -> tuple[int, ...]:
    """Every signal a soak passes on to its command, checked as ``run_soak`` checks them."""
    requeue = _own_signal("requeue_on", requeue_on)
    forward = _signals("forward_signals", forward_signals)
    return forward + ((requeue,) if requeue is not None and requeue not in forward else ())


def _signals(name: str, values: object) -> tuple[int, ...]:
    """Signals to pass on to the command; SIGINT/SIGTERM stay the monitor's own stop."""
    if isinstance(values, str | int) or not isinstance(values, Sequence | frozenset | set):
        raise ValidationTypeError(f"{name} must be a list of signal numbers or names")
    out: list[int] = []
    for i, value in enumerate(values):
        if value is None:
            raise ValidationTypeError(f"{name}[{i}] must be a signal number or name, not None")
        sig = _own_signal(f"{name}[{i}]", value)
        if sig is not None and sig not in out:
            out.append(sig)
    return tuple(out)


def _own_signal(name: str, value: object) -> int | None:
    sig = _signal(name, value)
    if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        raise ValidationError(
            f"{name} cannot be {signal.Signals(sig).name}: the monitor handles it itself"
        )
    return sig


def _signal(name: str, value: object) -> int | None:
    """A signal given by number (also as text, ``"10"``, as the command line gives it),
    ``signal.Signals`` member or name (``"SIGUSR1"``, ``"USR1"``)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, str):
        text = value.upper()
        text = text if text.startswith("SIG") else "SIG" + text
        try:
            value = signal.Signals[text]
        except KeyError:
            raise ValidationError(f"{name}: unknown signal {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationTypeError(
            f"{name} must be a signal number or name, not {type(value).__name__}"
        )
    try:
        sig = signal.Signals(value)
    except ValueError:
        raise ValidationError(f"{name}: {value!r} is not a signal") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValidationError(f"{name} cannot be {sig.name}: it would end or freeze the run")
    return int(sig)
