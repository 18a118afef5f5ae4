"""Which panels the figure has: every series field placed in a known panel or grouped by unit."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .._fields import (
    Field,
    describe,
    format_bytes,
    format_value,
    gpu_index,
    group_rank,
    kind_title,
    merge_twins,
)

_TREE_MEMORY = "tree.rss_bytes tree.anon_bytes tree.anon_pss_bytes tree.pss_bytes tree.uss_bytes"
_MACHINE_MEMORY = "machine.memory_used_bytes machine.memory_available_bytes machine.swap_used_bytes"
#: The known panels: (key, title, unit, the ``kind.pattern`` of its fields (group kind, field
#: name pattern) space-separated, and what its y axis measures, titled with the unit drawn).
PANELS = (
    ("tree_cpu", "Process tree CPU (100% = one core)", "%", "tree.cpu_percent", "CPU"),
    ("tree_memory", "Process tree memory", "bytes", _TREE_MEMORY, "memory"),
    (
        "tree_counts",
        "Processes and threads in the tree",
        "",
        "tree.processes tree.threads",
        "processes, threads",
    ),
    ("machine_cpu", "Machine CPU (100% = every core)", "%", "machine.cpu_percent", "CPU"),
    ("machine_memory", "Machine memory", "bytes", _MACHINE_MEMORY, "memory"),
    (
        "tree_io",
        "Process tree I/O: reads and writes per second",
        "bytes/s",
        "tree.read_bytes tree.write_bytes",
        "I/O",
    ),
    (
        "progress_rate",
        "Progress rate: file changes per minute",
        "changes/min",
        "progress_rate.changes_per_minute",
        "rate",
    ),
    (
        "progress_bytes",
        "Progress: bytes written to the progress directory per minute",
        "bytes/min",
        "progress_rate.bytes_per_minute",
        "written",
    ),
    # The training's own figures, as the trainer's files say (the ``steps`` series).
    ("loss", "Training loss", "", "steps.loss", "loss"),
    ("step_rate", "Training steps per second", "", "steps.steps_per_second", "steps/s"),
    (
        "throughput",
        "Tokens and samples per second",
        "",
        "steps.tokens_per_second steps.samples_per_second",
        "tokens, samples/s",
    ),
    ("step", "Training step", "", "steps.step", "step"),
    ("stale_limit", "Learned stale-progress limit", "s", "stale_limit.seconds", "limit"),
    ("disk_free", "Disk free", "bytes", "machine.disk_free_bytes*", "free"),
    ("gpu_util", "GPU utilisation", "%", "gpu.utilization_gpu_percent", "utilisation"),
    (
        "gpu_memory",
        "GPU memory used",
        "MiB",
        "gpu.memory_used_mib gpu.memory_total_mib",
        "memory",
    ),
    ("gpu_power", "GPU power", "W", "gpu.power_draw_w gpu.power_limit_w", "power"),
    ("gpu_temp", "GPU temperature", "°C", "gpu.temperature_gpu_c", "temperature"),
)


#: Counters that count up from the start: drawn as rates (bytes per second).
COUNTERS = frozenset({("tree", "read_bytes"), ("tree", "write_bytes")})

#: Fields that are already rates, by the unit they are drawn in (their name's unit is
#: ``bytes``, its qualifier ``per minute``).
RATES = {("progress_rate", "bytes_per_minute"): "bytes/min"}

#: Units whose axis is scaled from the data (B, KiB, MiB, GiB, TiB), by their suffix.
BYTE_UNITS = {"bytes": "", "MiB": "", "bytes/s": "/s", "bytes/min": "/min"}

#: Fields left out when the field beside them is there: the same fact in another unit.
SAME_AS = {("machine", "memory_percent"): ("machine", "memory_used_bytes")}

#: A line that stays within this share of its peak is "steady": folded out of its panel.
STEADY_SHARE = 0.01

#: Panels drawn even when flat: flat CPU or memory is itself a finding.
ALWAYS_DRAWN = frozenset(
    {"tree_cpu", "tree_memory", "machine_memory", "progress_rate", "loss", "step_rate"}
)


@dataclass(slots=True)
class Panel:
    key: str
    title: str
    unit: str
    fields: list[Field] = field(default_factory=list)
    is_gpu: bool = False
    quantity: str = ""


def plan_panels(series: Mapping[str, Mapping[str, Sequence[Any]]]) -> list[Panel]:
    """Every field of every group, placed in a known panel or one per (group kind, unit); a
    field with the same values as one before it in its group is one line named for both."""
    candidates = [
        (describe(group, name), repr(list(values)))
        for group in sorted(series, key=group_sort_key)
        for name, values in sorted(series[group].items())
        if name != "t"
        and any(v is not None for v in values)
        and not ((same := SAME_AS.get((group, name))) and same[1] in series.get(same[0], {}))
    ]
    fields = merge_twins(candidates)
    panels: dict[str, Panel] = {}
    placed: set[tuple[str, str]] = set()
    for key, title, unit, patterns, quantity in PANELS:
        for kind, _, pattern in (f.partition(".") for f in patterns.split()):
            for f in fields:
                if f.kind == kind and fnmatch.fnmatchcase(f.name, pattern):
                    new = Panel(key, title, unit, [], kind == "gpu", quantity)
                    panels.setdefault(key, new).fields.append(f)
                    placed.add((f.group, f.name))
    ordered = [panels[key] for key, *_ in PANELS if key in panels]
    others: dict[tuple[str, str], Panel] = {}
    for f in fields:
        if (f.group, f.name) not in placed:
            new = Panel(f"{f.kind}:{f.unit}", "", f.unit, [], f.kind == "gpu")
            others.setdefault((f.kind, f.unit), new).fields.append(f)
    for panel in others.values():
        panel.title = other_title(panel)
        ordered.append(panel)
    return ordered


def other_title(panel: Panel) -> str:
    """``Machine: CPU (all cores), swap (%)``: the group kind, the fields and the unit (a
    size's unit is left to the axis, which chooses it from the data)."""
    kind = panel.fields[0].kind
    labels = list(dict.fromkeys(field_label(f) for f in panel.fields))
    what = ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")
    unit = "" if panel.unit in BYTE_UNITS else panel.unit
    return f"{kind_title(kind)}: {what}" + (f" ({unit})" if unit else "")


def axis_title(panel: Panel, unit: str) -> str:
    """``memory (GiB)``, ``loss``: a panel's y axis, what it measures and the unit drawn (a
    panel of unknown fields measures its fields)."""
    labels = dict.fromkeys(field_label(f) for f in panel.fields)
    quantity = panel.quantity or ", ".join(list(labels)[:2])
    return f"{quantity} ({unit})" if unit else quantity


def field_unit(f: Field) -> str:
    """The unit a field is drawn in: counters as rates, rates in their own unit."""
    if (f.group, f.name) in COUNTERS:
        return "bytes/s"
    return RATES.get((f.group, f.name), f.unit)


def field_label(f: Field) -> str:
    """``bytes written``, ``memory used``: the label and its qualifier, less what the unit
    already says (a rate's ``per minute``)."""
    if (f.group, f.name) in RATES:
        return f.label
    return f"{f.label} {f.qualifier}".strip()


def format_in_unit(value: float, unit: str) -> str:
    """``3.0 KiB/min``, ``1.2 MiB/s``, ``95%``: a value in a field's drawn unit."""
    if unit in BYTE_UNITS:
        base = value * 2**20 if unit == "MiB" else value
        return format_bytes(base) + BYTE_UNITS[unit]
    return format_value(value, unit)


def group_sort_key(group: str) -> tuple[int, int, str]:
    return (group_rank(group), gpu_index(group) or 0, group)


@dataclass(frozen=True, slots=True)
class Scale:
    """How a panel's values are shown: divided by ``divisor`` and labelled ``unit``."""

    divisor: float
    unit: str


#: The sizes an axis of bytes is drawn in, largest first.
_SIZES = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def scale_for(unit: str, peak: float) -> Scale:
    """One unit for a whole axis, the largest its peak reaches (a size: B to TiB)."""
    if unit not in BYTE_UNITS:
        return Scale(1, unit)
    # Values in MiB (nvidia-smi's) are scaled as the bytes they stand for.
    per = 2**20 if unit == "MiB" else 1
    suffix = BYTE_UNITS[unit]
    for name, size in _SIZES:
        if peak * per >= size:
            return Scale(size / per, name + suffix)
    return Scale(1 / per, "B" + suffix)


def is_reference(f: Field) -> bool:
    """A limit or a total: drawn dotted beside the line it bounds."""
    return any(word in f.name for word in ("limit", "total"))


def rates(times: Sequence[float], counter: Sequence[float | None]) -> list[float | None]:
    """A counter's rate per second between samples; a counter that went down (a process
    left the tree, taking its count) gives no rate there."""
    steps = zip(pairwise(times), pairwise(counter), strict=False)
    return [None] + [
        None if b is None or a is None or t1 <= t0 or a < b else (a - b) / (t1 - t0)
        for (t0, t1), (b, a) in steps
    ]
