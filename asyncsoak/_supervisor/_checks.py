"""The checks of ``run_soak``'s values, one per kind of value: each raises
:class:`ValidationError` or :class:`ValidationTypeError` with a message naming the argument,
the value given and what is accepted."""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast, get_args

from .._contract import MAX_SECONDS, ValidationError, ValidationTypeError, bounded

StopMode = Literal["group", "leader", "stdin"]
STOP_MODES: tuple[StopMode, ...] = get_args(StopMode)
#: What a signal is given as, said when one is refused.
SIGNAL_FORMS = "a signal name or number, e.g. USR1, SIGUSR1 or 10"
#: The longest ``--step-key``/``--loss-key`` (and ``--checkpoint-glob``).
MAX_KEY_LENGTH = 200
#: The most ``--checkpoint-glob`` patterns.
MAX_GLOBS = 64


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
        raise ValidationError(f"{name} must be {bound}, got {out:g}")
    if out < minimum:
        raise ValidationError(f"{name} must be at least {minimum:g} seconds, got {out:g}")
    if out > MAX_SECONDS:
        raise ValidationError(
            f"{name} must be at most {MAX_SECONDS:g} seconds (a year), got {out:g}"
        )
    return out


def check_record_key(name: str, value: object) -> str | None:
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


def check_deadlines(name: str, value: object) -> dict[str, float] | None:
    """``{GLOB: SECONDS}`` (None or empty: no deadline): each GLOB printable text matched
    against one part of a path, so without ``/``; each SECONDS positive."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationTypeError(
            f"{name} must be a mapping of GLOB to seconds, not {type(value).__name__}"
        )
    out: dict[str, float] = {}
    for glob, every in value.items():
        if not isinstance(glob, str) or not glob or not glob.isprintable() or "/" in glob:
            raise ValidationError(
                f"{name}: the GLOB {glob!r} must be printable text without '/' (it is matched "
                "against each part of a path below the progress dir)"
            )
        out[glob] = seconds(f"{name}[{glob!r}]", every, allow_zero=False)
    return out or None


def check_globs(name: str, value: object) -> tuple[str, ...]:
    """File name patterns, each matched against one component of a path: printable text
    without a ``/``; at least one, at most :data:`MAX_GLOBS`."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValidationTypeError(f"{name} must be a list of patterns, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_GLOBS:
        raise ValidationError(f"{name} must hold 1 to {MAX_GLOBS} patterns, got {len(value)}")
    for item in value:
        if not isinstance(item, str):
            raise ValidationTypeError(f"{name} must be patterns (strings), not {item!r}")
        if not item or len(item) > MAX_KEY_LENGTH or not item.isprintable() or "/" in item:
            raise ValidationError(
                f"{name} takes a file name pattern (printable, no '/', matched against each "
                f"component of a path), got {item!r}"
            )
    return tuple(value)


def check_path(name: str, value: object) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise ValidationTypeError(f"{name} must be a path, not {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValidationError(f"{name} must be a non-empty path")
    if "\0" in text:
        raise ValidationError(f"{name} contains a NUL byte")
    return Path(text).absolute()


def check_progress_dir(value: object) -> Path:
    progress = check_path("progress_dir", value)
    if progress.exists() and not progress.is_dir():
        raise ValidationError(f"progress_dir exists but is not a directory: {progress}")
    return progress


def check_cwd(value: object) -> Path | None:
    work_dir = None if value is None else check_path("cwd", value)
    if work_dir is not None and not work_dir.is_dir():
        raise ValidationError(f"cwd is not a directory: {work_dir}")
    return work_dir


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> object:
    if value not in choices:
        raise ValidationError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_command(command: object) -> tuple[str, ...]:
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


def check_env(env: object) -> dict[str, str] | None:
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


def check_metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ValidationTypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
    try:
        data = json.loads(json.dumps(dict(metadata), allow_nan=False))
        too_deep = bounded.nested_too_deep(data, bounded.MAX_METADATA_DEPTH)
    except RecursionError:
        too_deep = True
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"metadata must be JSON-serialisable: {exc}") from None
    if too_deep:
        # Every reader refuses documents nested past a bound: the artifact and the journal
        # that hold the metadata must stay readable.
        raise ValidationError(
            f"metadata must not nest more than {bounded.MAX_METADATA_DEPTH} levels deep"
        )
    return cast(dict[str, Any], data)


def check_excluded(value: object) -> tuple[Path, ...]:
    if isinstance(value, str | bytes | os.PathLike) or not isinstance(value, Sequence):
        raise ValidationTypeError("progress_exclude must be a sequence of directory paths")
    return tuple(check_path(f"progress_exclude[{i}]", item) for i, item in enumerate(value))


def check_signals(name: str, values: object) -> tuple[int, ...]:
    """Signals to pass on to the command; SIGINT/SIGTERM stay the monitor's own stop."""
    if isinstance(values, str | int) or not isinstance(values, Sequence | frozenset | set):
        raise ValidationTypeError(f"{name} must be a list of signal numbers or names")
    out: list[int] = []
    for i, value in enumerate(values):
        if value is None:
            raise ValidationTypeError(f"{name}[{i}] must be a signal number or name, not None")
        sig = check_own_signal(f"{name}[{i}]", value)
        if sig is not None and sig not in out:
            out.append(sig)
    return tuple(out)


def check_own_signal(name: str, value: object) -> int | None:
    sig = check_signal(name, value)
    if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        raise ValidationError(
            f"{name} cannot be {signal.Signals(sig).name}: the monitor handles it itself"
        )
    return sig


def check_signal(name: str, value: object) -> int | None:
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
            raise ValidationError(
                f"{name}: unknown signal {value!r} (expected {SIGNAL_FORMS})"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationTypeError(
            f"{name} must be a signal number or name, not {type(value).__name__}"
        )
    try:
        sig = signal.Signals(value)
    except ValueError:
        raise ValidationError(
            f"{name}: {value!r} is not a signal (expected {SIGNAL_FORMS})"
        ) from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValidationError(f"{name} cannot be {sig.name}: it would end or freeze the run")
    return int(sig)
