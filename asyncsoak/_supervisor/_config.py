"""``run_soak``'s settings checked into one :class:`SoakConfig` before anything happens; the
same checks refuse a queued job at submit time (:func:`validate_job`), not hours later."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Literal, get_args

from .._analysis import CHECKPOINT_GLOBS
from .._contract import ValidationError, ValidationTypeError, check_size
from .._sampling import LOSS_CHECKS, PROGRESS_SOURCES, LossCheck, ProgressSource
from ._checks import (
    STOP_MODES,
    StopMode,
    check_choice,
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
    seconds,
)

LeakCheck = Literal["warn", "fail", "off"]
LEAK_CHECKS: tuple[LeakCheck, ...] = get_args(LeakCheck)
#: Default cap of the captured output log: the first and the last half are kept.
LOG_MAX_BYTES = 16 * 1024 * 1024
#: The shortest sample interval: below it the sampler is a busy loop that burns a core (a
#: sample of a small tree costs about a millisecond of CPU).
MIN_SAMPLE_INTERVAL_SECONDS = 0.05


#: What a job-settable limit holds: how it is checked and how its flag parses.
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
    """A job-settable soak limit: its default, CLI flag and help, kind (a bool's is a switch,
    one with choices a choice), and how it is checked."""
    kind = "switch" if isinstance(default, bool) else "choice" if choices else kind
    checks = {"allow_zero": allow_zero, "minimum": minimum, "auto": auto, "choices": choices}
    return field(default=default, metadata={"flag": flag, "help": help, "kind": kind, **checks})


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakLimits:
    """The ``run_soak`` settings a queued job may set, spelled once: the queue checks jobs with
    it, ``run_soak`` its arguments, and the CLI derives its flags from its fields."""

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
    )
    progress_source: ProgressSource = _limit(
        "auto",
        "--progress-source",
        "what counts as progress: training steps (from metrics files, trainer_state.json, "
        "metrics.csv, asyncsoak.trainer.report), file changes, or auto (steps once a step "
        "source is found, file changes until then)",
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
    name, meta = spec.name, spec.metadata
    if meta["kind"] in _KIND_CHECKS:
        return _KIND_CHECKS[meta["kind"]](name, value)
    if meta["kind"] == "choice":
        return check_choice(name, value, meta["choices"])
    if (value is None and spec.default is None) or (value == "auto" and meta["auto"]):
        return value
    return seconds(name, value, allow_zero=meta["allow_zero"], minimum=meta["minimum"])


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValidationTypeError(f"{name} must be a bool")
    return value


_KIND_CHECKS: dict[str, Callable[[str, Any], object]] = {
    "switch": _check_bool,
    "size": check_size,
    "signal": check_signal,
    "key": check_record_key,
    "deadlines": check_deadlines,
    "globs": check_globs,
}


#: The default of a field that None leaves to the check to fill (``log_path`` beside the artifact).
_FILLED: Any = None
#: The names of :class:`SoakLimits`' fields, in their order.
SOAK_LIMITS: tuple[str, ...] = tuple(spec.name for spec in fields(SoakLimits))


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig(SoakLimits):
    """Everything one soak runs with, checked when made (``run_soak(config=SoakConfig(...))``,
    or built from ``run_soak``'s keywords); :class:`asyncsoak.ValidationError` names the first
    bad argument.  Paths become absolute, durations floats, signals numbers, sizes bytes;
    ``log_path`` None means beside the artifact, ``snapshot_root`` None the working directory."""

    command: tuple[str, ...]
    progress_dir: Path
    output_path: Path
    #: Derived: the artifact's path with ``.jsonl``.
    journal_path: Path = field(init=False)
    #: Derived: where ``asyncsoak.trainer.report`` appends (the artifact's ``.steps.jsonl``).
    steps_path: Path = field(init=False)
    log_path: Path = _FILLED
    cwd: Path | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] = _FILLED
    stop_mode: StopMode = "group"
    snapshot_root: Path = _FILLED
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
        # Checked in the order of run_soak's documentation: the first bad argument is named.
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
        norm("stop_mode", check_choice("stop_mode", given.stop_mode, STOP_MODES))
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
        _check_bool("forensics", given.forensics)
        root = given.snapshot_root
        root = (work_dir or Path.cwd()) if root is None else check_path("snapshot_root", root)
        norm("snapshot_root", root)
        checks: tuple[tuple[str, Callable[[Any], object]], ...] = (
            ("env", check_env),
            ("metadata", check_metadata),
            ("kill_wait_seconds", partial(seconds, "kill_wait_seconds", allow_zero=False)),
            ("progress_exclude", check_excluded),
            ("forward_signals", partial(check_signals, "forward_signals")),
            ("requeue_on", partial(check_own_signal, "requeue_on")),
        )
        for name, check in checks:
            norm(name, check(getattr(self, name)))
        for name, allow_zero in (
            ("stale_progress_carried_seconds", False),
            ("scheduler_grace_seconds", True),
        ):
            if getattr(self, name) is not None:
                norm(name, seconds(name, getattr(self, name), allow_zero=allow_zero))
        earlier = given.earlier_highest_step
        if earlier is not None and (
            isinstance(earlier, bool) or not isinstance(earlier, int) or earlier < 0
        ):
            raise ValidationTypeError(
                f"earlier_highest_step must be a step (an int, 0 or more) or None, got {earlier!r}"
            )

    def effective(self) -> dict[str, Any]:
        """Every effective parameter, as the artifact's ``config`` records it."""
        kept = ((k, v) for k, v in asdict(self).items() if k not in ("command", "env", "metadata"))
        return {k: str(v) if isinstance(v, Path) else v for k, v in kept}


def validate_limits(limits: Mapping[str, object]) -> dict[str, Any]:
    """The soak limits a job carries (a subset of :data:`SOAK_LIMITS`), checked and normalised."""
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
    """What a queued job gives ``run_soak``, checked by its rules; returns the checked limits.
    ``command`` None: the worker's trainer command; ``progress_dir`` None: the run directory."""
    if command is not None:
        check_command(command)
    if progress_dir is not None:
        check_progress_dir(progress_dir)
    check_cwd(cwd)
    check_env(env)
    check_choice("stop_mode", stop_mode, STOP_MODES)
    return validate_limits(limits)


def forwarded_signals(forward_signals: object, requeue_on: object) -> tuple[int, ...]:
    """Every signal a soak passes on to its command, checked as ``run_soak`` checks them."""
    requeue = check_own_signal("requeue_on", requeue_on)
    forward = check_signals("forward_signals", forward_signals)
    return forward + ((requeue,) if requeue is not None and requeue not in forward else ())
