"""Validate ``run_soak``'s arguments into one :class:`SoakConfig`, before anything happens.

Every check raises :class:`ValidationError` (a ``ValueError``) or :class:`ValidationTypeError`
(also a ``TypeError``) with a message naming the argument; nothing is launched or written until
all of them pass.  The same checks serve the job queue (:func:`validate_job`), so a job that
``run_soak`` would refuse is refused when it is submitted, not hours later by a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Literal

from .._analysis import CHECKPOINT_GLOBS
from .._contract import ValidationError, ValidationTypeError, check_size
from .._sampling import LOSS_CHECKS, PROGRESS_SOURCES, LossCheck, ProgressSource
from ._checks import (
    StopMode,
    check_command,
    check_cwd,
    check_deadlines,
    check_env,
    check_excluded,
    check_globs,
    check_metadata,
    check_own_signal,
    check_path,
    check_progress_dir,
    check_record_key,
    check_signal,
    check_signals,
    check_stop_mode,
    seconds,
)

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
#: (``--max-rss 2GiB``), a signal (``--dump-signal USR1``), a record key (``--step-key it``) or
#: deadlines by path pattern (``--expect-every 'checkpoint-*=1800'``, repeatable) or
#: file name patterns (``--checkpoint-glob '*.ckpt'``, repeatable).
LimitKind = Literal["seconds", "switch", "choice", "size", "signal", "key", "deadlines", "globs"]


def _limit(
    default: float | bool | str | tuple[str, ...] | None,
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
    expect_every: dict[str, float] | None = _limit(
        None,
        "--expect-every",
        "a deadline the training keeps: a path below the progress dir with a part matching "
        "GLOB is new or changed within SECONDS of the first step, then at least every "
        "SECONDS, while the steps advance (repeatable; e.g. 'checkpoint-*=1800')",
        kind="deadlines",
    )

    checkpoint_globs: tuple[str, ...] = _limit(
        CHECKPOINT_GLOBS,
        "--checkpoint-glob",
        "a path below the progress directory any of whose components matches GLOB is a "
        "checkpoint's (repeatable; default: " + ", ".join(CHECKPOINT_GLOBS) + "): its writes "
        "are the goodput ledger's checkpoint time",
        kind="globs",
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
        return check_signal(spec.name, value)
    if kind == "key":
        return check_record_key(spec.name, value)
    if kind == "deadlines":
        return check_deadlines(spec.name, value)
    if kind == "globs":
        return check_globs(spec.name, value)
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
    #: The highest step an earlier attempt of the same job reached (the queue's worker sets
    #: it): the goodput ledger counts the steps at or below it as redone (``wasted``).
    earlier_highest_step: int | None = None

    def __post_init__(self) -> None:
        # The checks run in the order of run_soak's documentation, so the first bad argument
        # is the one named; each normalised value replaces the given one.
        given: Any = self
        norm = partial(object.__setattr__, self)
        norm("command", check_command(given.command))
        norm("progress_dir", check_progress_dir(given.progress_dir))
        output = check_path("output_path", given.output_path)
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
        log = output.with_suffix(".log") if log_path is None else check_path("log_path", log_path)
        if log.is_dir():
            raise ValidationError(f"log_path is a directory: {log}")
        if log in (output, output.with_suffix(".jsonl")):
            raise ValidationError(
                f"log_path must not be the artifact's or the journal's path: {log}"
            )
        norm("log_path", log)
        work_dir = check_cwd(given.cwd)
        norm("cwd", work_dir)
        norm("stop_mode", check_stop_mode(given.stop_mode))
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
            root if snapshot_root is None else check_path("snapshot_root", snapshot_root),
        )
        norm("env", check_env(given.env))
        norm("metadata", check_metadata(given.metadata))
        norm(
            "kill_wait_seconds",
            seconds("kill_wait_seconds", given.kill_wait_seconds, allow_zero=False),
        )
        norm("progress_exclude", check_excluded(given.progress_exclude))
        norm("forward_signals", check_signals("forward_signals", given.forward_signals))
        norm("requeue_on", check_own_signal("requeue_on", given.requeue_on))
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
        earlier = given.earlier_highest_step
        if earlier is not None and (
            isinstance(earlier, bool) or not isinstance(earlier, int) or earlier < 0
        ):
            raise ValidationTypeError(
                f"earlier_highest_step must be a step (an int, 0 or more) or None, got {earlier!r}"
            )

    def effective(self) -> dict[str, Any]:
        """Every effective parameter, as the artifact's ``config`` records it."""
        out = asdict(self)
        for key in ("command", "env", "metadata"):
            out.pop(key)
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


def validate_limits(limits: Mapping[str, object]) -> dict[str, Any]:
    """The soak limits a job carries (a subset of :data:`SOAK_LIMITS`), checked as run_soak
    does; returns the given ones, normalised (durations as floats)."""
    for key in limits:
        if key not in SOAK_LIMITS:
            raise ValidationError(f"unknown soak limit {key!r} (known: {', '.join(SOAK_LIMITS)})")
    checked = SoakLimits(**limits)  # type: ignore[arg-type]  # checked in __post_init__
    return {key: getattr(checked, key) for key in limits}


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
        check_command(command)
    if progress_dir is not None:
        check_progress_dir(progress_dir)
    check_cwd(cwd)
    check_env(env)
    check_stop_mode(stop_mode)
    return validate_limits(limits)


def forwarded_signals(forward_signals: object, requeue_on: object) -> tuple[int, ...]:
    """Every signal a soak passes on to its command, checked as ``run_soak`` checks them."""
    requeue = check_own_signal("requeue_on", requeue_on)
    forward = check_signals("forward_signals", forward_signals)
    return forward + ((requeue,) if requeue is not None and requeue not in forward else ())
