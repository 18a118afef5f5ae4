"""The soak's flags, shared by ``run`` and the queue's ``submit``: one flag per field of
:class:`SoakLimits`, the metrics, ``KEY=VALUE`` pairs, and the groups ``--help`` shows."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from .._contract import MAX_SECONDS, ValidationError, parse_size
from .._supervisor import SoakLimits, seconds
from . import UsageError, refused, typed


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
#: The soak limits of each group but "time" (the rest).
_LIMIT_GROUPS = {
    "progress": "output_is_progress progress_source step_key loss_key loss_check expect_every "
    "checkpoint_globs",
    "memory": "warm_up_seconds leak_check max_rss_bytes min_disk_free_bytes detailed_memory",
    "gpu": "max_gpu_memory_bytes",
    "advanced": "dump_signal",
}
_GROUP_OF = {name: group for group, names in _LIMIT_GROUPS.items() for name in names.split()}
#: The argparse keywords of each kind of limit but durations and choices (a size or a deadline
#: is parsed by soak_limits, so a bad one is refused naming the flag).
_KINDS: dict[str, dict[str, Any]] = {
    "switch": {"action": "store_true"},
    "size": {"metavar": "SIZE"},
    "signal": {"metavar": "SIG"},
    "key": {"metavar": "KEY"},
    "deadlines": {"action": "append", "metavar": "GLOB=SECONDS"},
    "globs": {"action": "append", "metavar": "GLOB"},
}
Groups = dict[str, "argparse._ArgumentGroup"]


def help_groups(parser: argparse.ArgumentParser) -> Groups:
    """The titled groups of :data:`HELP_GROUPS` on ``parser`` (an empty one is not shown)."""
    return {key: parser.add_argument_group(title) for key, title in HELP_GROUPS.items()}


def add_soak_limits(groups: Groups) -> None:
    """One flag per field of :class:`SoakLimits`, with its help and default."""
    for spec in fields(SoakLimits):
        meta, kind = spec.metadata, spec.metadata["kind"]
        help = meta["help"].replace("%", "%%")  # argparse formats help with %
        if kind == "choice":
            options: dict[str, Any] = {"choices": meta["choices"], "default": spec.default}
        elif kind in _KINDS:
            options = _KINDS[kind]
        else:
            auto = meta["auto"]
            type = _seconds_or_auto if auto else seconds_arg
            options = {"type": type, "default": spec.default, "metavar": "S|auto" if auto else "S"}
            help += "" if spec.default is None else f" (default {spec.default:g})"
        groups[_GROUP_OF.get(spec.name, "time")].add_argument(meta["flag"], help=help, **options)


def seconds_arg(text: str) -> float:
    """A duration flag's type (its bounds are checked by :func:`seconds`, naming the flag)."""
    return typed(float, text, "seconds, e.g. 30 or 1.5")


def _seconds_or_auto(text: str) -> float | str:
    """A duration flag that also takes ``auto`` (the limit learned from the run)."""
    return text if text == "auto" else typed(float, text, "seconds or 'auto', e.g. 30 or 1.5")


def soak_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limits the flags of :func:`add_soak_limits` gave, as ``run_soak`` names them; a
    bad one is a :class:`ValidationError` naming its flag."""
    limits: dict[str, Any] = {}
    for spec in fields(SoakLimits):
        flag, kind = spec.metadata["flag"], spec.metadata["kind"]
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if kind == "size" and value is not None:
            value = parse_size(value, name=flag)
        if kind == "deadlines" and value is not None:
            value = _deadline_pairs(flag, value)
        if kind == "globs":
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
    """A refusal naming a ``run_soak`` keyword (``cwd is not a directory``) told by the flag
    the user typed (``--cwd is not a directory``)."""
    text = str(exc)
    for name, flag in _FLAGS.items():
        rest = re.sub(r"^\[\d+\]", "", text.removeprefix(name))
        if text.startswith(name) and not rest[:1].isalnum() and rest[:1] != "_":
            return UsageError(flag + rest)
    return UsageError(text)


def _deadline_pairs(flag: str, pairs: list[str]) -> dict[str, float]:
    """``GLOB=SECONDS`` values (split at the last ``=``); a malformed one is refused naming
    ``flag`` and the value as typed."""
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
        type=lambda text: typed(int, text, "a port number from 1 to 65535"),
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics are served on (default 127.0.0.1: this host only)",
    )


def metrics_from_args(args: argparse.Namespace, textfile: Path | None = None) -> Any:
    """The ``Metrics`` the flags ask for, or None; refused at once when they make no sense."""
    linger = getattr(args, "metrics_linger", 0.0)
    with refused(flag_error):
        seconds("--metrics-linger", linger)
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
                linger_seconds=linger,
            )
        )
    except MetricsUnavailableError:  # a ValidationError: told by the flag that asked for it
        flag = "--metrics-port" if args.metrics_port is not None else "--metrics-textfile"
        raise UsageError(str(MetricsUnavailableError(flag))) from None
    except ValidationError as exc:
        raise flag_error(exc) from None
