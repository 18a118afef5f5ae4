"""The soak's flags, shared by ``asyncsoak run`` and the queue's ``submit``: the limits (one
flag per field of :class:`SoakLimits`), the metrics, ``KEY=VALUE`` pairs, and the titled groups
``--help`` shows them in."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from .._contract import MAX_SECONDS, ValidationError, parse_size
from .._supervisor import SoakLimits, seconds
from . import UsageError


def parse_pairs(option: str, pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` options into a dict; a malformed one is a usage error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


#: The titled groups of ``run --help`` (and ``submit``'s), in the order a newcomer needs them.
HELP_GROUPS = {
    "essentials": "what to run and where its progress shows",
    "time": "sampling and time limits",
    "progress": "training progress: steps and losses",
    "memory": "memory and disk",
    "gpu": "GPUs",
    "scheduler": "distributed jobs, schedulers and containers",
    "outputs": "outputs, live views and metrics",
    "advanced": "advanced",
}
#: The group of each soak limit that is not about time.
_LIMIT_GROUPS = {
    "output_is_progress": "progress",
    "progress_source": "progress",
    "step_key": "progress",
    "loss_key": "progress",
    "loss_check": "progress",
    "expect_every": "progress",
    "warm_up_seconds": "memory",
    "leak_check": "memory",
    "max_rss_bytes": "memory",
    "min_disk_free_bytes": "memory",
    "detailed_memory": "memory",
    "max_gpu_memory_bytes": "gpu",
    "dump_signal": "advanced",
    "checkpoint_globs": "progress",
}
Groups = dict[str, "argparse._ArgumentGroup"]


def help_groups(parser: argparse.ArgumentParser) -> Groups:
    """The titled groups of :data:`HELP_GROUPS` on ``parser`` (an empty one is not shown)."""
    return {key: parser.add_argument_group(title) for key, title in HELP_GROUPS.items()}


def add_soak_limits(groups: Groups) -> None:
    """The soak's limits, shared by ``run`` and the job queue's ``submit``: one flag per
    field of :class:`SoakLimits` (durations, trend rules, budgets), with its help and default."""
    for spec in fields(SoakLimits):
        flag, kind = spec.metadata["flag"], spec.metadata["kind"]
        parser = groups[_LIMIT_GROUPS.get(spec.name, "time")]
        help = spec.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if kind == "switch":
            parser.add_argument(flag, action="store_true", help=help)
        elif kind == "choice":
            parser.add_argument(
                flag, choices=spec.metadata["choices"], default=spec.default, help=help
            )
        elif kind == "size":
            # Parsed by soak_limits, so a bad size is refused naming the flag.
            parser.add_argument(flag, default=None, metavar="SIZE", help=help)
        elif kind == "signal":
            parser.add_argument(flag, default=None, metavar="SIG", help=help)
        elif kind == "key":
            parser.add_argument(flag, default=None, metavar="KEY", help=help)
        elif kind == "deadlines":
            # Parsed by soak_limits, so a bad pair is refused naming the flag and the value.
            parser.add_argument(flag, action="append", metavar="GLOB=SECONDS", help=help)
        elif kind == "globs":
            parser.add_argument(flag, action="append", default=None, metavar="GLOB", help=help)
        elif spec.metadata["auto"]:
            shown = "" if spec.default is None else f" (default {spec.default:g})"
            parser.add_argument(
                flag,
                type=_seconds_or_auto,
                default=spec.default,
                metavar="S|auto",
                help=help + shown,
            )
        else:
            shown = "" if spec.default is None else f" (default {spec.default:g})"
            parser.add_argument(
                flag, type=seconds_arg, default=spec.default, metavar="S", help=help + shown
            )


def seconds_arg(text: str) -> float:
    """The argparse type of every duration flag: a number of seconds (its bounds are checked
    with :func:`seconds`, naming the flag)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds, e.g. 30 or 1.5, got {text!r}"
        ) from None


def _seconds_or_auto(text: str) -> float | str:
    """A duration flag that also takes ``auto`` (the limit learned from the run)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds or 'auto', e.g. 30 or 1.5, got {text!r}"
        ) from None


def soak_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The soak limits the flags of :func:`add_soak_limits` gave, as ``run_soak`` names them;
    sizes in bytes (a malformed one is a :class:`ValidationError` naming its flag)."""
    limits: dict[str, Any] = {}
    for spec in fields(SoakLimits):
        flag = spec.metadata["flag"]
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if spec.metadata["kind"] == "size" and value is not None:
            value = parse_size(value, name=flag)
        if spec.metadata["kind"] == "deadlines" and value is not None:
            value = _deadline_pairs(flag, value)
        if spec.metadata["kind"] == "globs":
            value = spec.default if value is None else tuple(value)
        try:
            SoakLimits(**{spec.name: value})
        except ValidationError as exc:  # named by the flag as typed, not the field
            raise ValidationError(flag + str(exc).removeprefix(spec.name)) from None
        limits[spec.name] = value
    return limits


#: The flag of each ``run_soak`` keyword (and ``Metrics`` setting) as its refusals begin.
_FLAGS = {
    **{spec.name: spec.metadata["flag"] for spec in fields(SoakLimits)},
    "progress_dir": "--progress-dir",
    "output_path": "--output",
    "cwd": "--cwd",
    "stop_mode": "--stop-mode",
    "nvidia_smi": "--nvidia-smi",
    "forward_signals": "--forward-signal",
    "requeue_on": "--requeue-on",
    "scheduler_grace_seconds": "--scheduler-grace",
    "metrics port": "--metrics-port",
    "metrics address": "--metrics-address",
    "metrics textfile directory": "--metrics-textfile",
    "metrics linger_seconds": "--metrics-linger",
}


def flag_error(exc: ValidationError) -> UsageError:
    """A refusal that names a ``run_soak`` keyword (``cwd is not a directory: ...``), told as
    the command line's user typed it: by the flag (``--cwd is not a directory: ...``)."""
    text = str(exc)
    for name, flag in _FLAGS.items():
        rest = re.sub(r"^\[\d+\]", "", text.removeprefix(name))
        if text.startswith(name) and not rest[:1].isalnum() and rest[:1] != "_":
            return UsageError(flag + rest)
    return UsageError(text)


def _deadline_pairs(flag: str, pairs: list[str]) -> dict[str, float]:
    """``GLOB=SECONDS`` values (split at the last ``=``) into a dict; a malformed one is refused
    naming ``flag`` and the value as typed."""
    out: dict[str, float] = {}
    for pair in pairs:
        glob, _, every = pair.rpartition("=")
        try:
            out[glob] = seconds(flag, float(every), allow_zero=False)
        except ValueError:  # not a number, or not a positive one (a ValidationError)
            glob = ""
        if not glob:
            raise ValidationError(
                f"{flag} expects GLOB=SECONDS, SECONDS above 0 and at most {MAX_SECONDS:g} "
                f"(a year), got {pair!r}"
            )
    return out


def add_metrics_flags(parser: argparse._ActionsContainer) -> None:
    """``--metrics-port`` and ``--metrics-address``, shared by ``run`` and ``worker``."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics are served on (default 127.0.0.1: this host only)",
    )


def _port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a port number from 1 to 65535, got {text!r}"
        ) from None


def metrics_from_args(args: argparse.Namespace, textfile: Path | None = None) -> Any:
    """The ``Metrics`` the flags ask for, or None; refused at once when they make no sense."""
    try:
        seconds("--metrics-linger", getattr(args, "metrics_linger", 0.0))
    except ValidationError as exc:
        raise flag_error(exc) from None
    if args.metrics_port is None and textfile is None:
        if args.metrics_address != "127.0.0.1":
            raise UsageError("--metrics-address needs --metrics-port")
        return None
    from .._export import Metrics, MetricsUnavailableError, validate_metrics

    try:
        return validate_metrics(
            Metrics(
                port=args.metrics_port,
                address=args.metrics_address,
                textfile_dir=textfile,
                linger_seconds=getattr(args, "metrics_linger", 0.0),
            )
        )
    except MetricsUnavailableError:
        flag = "--metrics-port" if args.metrics_port is not None else "--metrics-textfile"
        raise UsageError(str(MetricsUnavailableError(flag))) from None
    except ValidationError as exc:
        raise flag_error(exc) from None
