"""Names and units people read for the series fields, ``<what>_<unit>[_<qualifier>]``: known
fields have hand-written labels, any other is read from its name, so every view shows whatever
a sampler records."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .._contract import format_duration, parse_iso

#: The unit a name token stands for.
UNIT_TOKENS = {
    "bytes": "bytes",
    "percent": "%",
    "mib": "MiB",
    "w": "W",
    "c": "°C",
    "mhz": "MHz",
    "seconds": "s",
}

#: The labels a field's name does not say by itself.
_KNOWN_LABELS = {
    ("tree", "anon_bytes"): "anonymous + shared (judged)",
    ("tree", "anon_pss_bytes"): "anonymous + shared, PSS (judged)",
    ("tree", "uss_bytes"): "USS",
    ("tree", "pss_bytes"): "PSS",
    ("tree", "fds"): "open files",
    ("tree", "read_bytes"): "bytes read",
    ("tree", "write_bytes"): "bytes written",
    ("machine", "cpu_percent"): "CPU (all cores)",
    ("machine", "shm_used_bytes"): "shared memory in /dev/shm",
    ("machine", "load1"): "load (1 min)",
    ("gpu", "utilization_gpu_percent"): "utilisation",
    ("gpu", "utilization_memory_percent"): "memory bandwidth use",
    ("gpu", "power_draw_w"): "power",
    ("gpu", "temperature_gpu_c"): "temperature",
    ("gpu", "temperature_memory_c"): "memory temperature",
    ("gpu", "clocks_sm_mhz"): "SM clock",
    ("gpu", "clocks_mem_mhz"): "memory clock",
    ("gpu", "fan_speed_percent"): "fan",
    ("gpu", "ecc_corrected_volatile"): "ECC errors corrected",
    ("gpu", "ecc_uncorrected_volatile"): "ECC errors uncorrected",
    ("gpu_tree", "tree_gpu_processes"): "processes of the tree on a GPU",
    ("gpu_tree", "tree_gpu_memory_mib"): "GPU memory of the tree",
    ("gpu_tree", "other_gpu_memory_mib"): "GPU memory of other processes",
    ("progress_rate", "changes_per_minute"): "file changes per minute",
    ("progress_rate", "bytes_per_minute"): "bytes written",
}
_WORDS = {"cpu": "CPU", "gpu": "GPU", "sm": "SM", "rss": "RSS", "mem": "memory", "fds": "files"}
_GPU_GROUP = re.compile(r"^gpu(\d+)$")


@dataclass(frozen=True, slots=True)
class Field:
    """One series field as people read it."""

    group: str
    name: str
    #: ``"gpu"`` for every ``gpuN`` group, else the group itself.
    kind: str
    label: str
    #: One of :data:`UNIT_TOKENS`' values, or ``""`` for a plain count.
    unit: str
    #: What follows the unit in the name (``output`` in ``disk_free_bytes_output``).
    qualifier: str


def group_kind(group: str) -> str:
    return "gpu" if _GPU_GROUP.match(group) else group


def gpu_index(group: str) -> int | None:
    match = _GPU_GROUP.match(group)
    return int(match.group(1)) if match else None


_GROUP_LABELS = {
    "tree": "Process tree",
    "machine": "Machine",
    "gpu_tree": "GPU use",
    "progress_rate": "Progress",
}


def group_label(group: str) -> str:
    index = gpu_index(group)
    if index is not None:
        return f"GPU {index}"
    return _GROUP_LABELS.get(group, group.replace("_", " "))


def kind_title(kind: str) -> str:
    """A kind of group (:func:`group_kind`) as a title: ``GPU`` for the GPUs' groups."""
    return "GPU" if kind == "gpu" else group_label(kind)


def group_rank(group: str) -> int:
    """Where a group comes among others: the tree, the machine, each GPU, then the rest."""
    return {"tree": 0, "machine": 1}.get(group, 3 if gpu_index(group) is None else 2)


def describe(group: str, name: str) -> Field:
    kind = group_kind(group)
    tokens = name.split("_")
    at = next((i for i in reversed(range(len(tokens))) if tokens[i] in UNIT_TOKENS), len(tokens))
    unit = UNIT_TOKENS[tokens[at]] if at < len(tokens) else ""
    words, qualifier = tokens[:at], tokens[at + 1 :]
    label = _KNOWN_LABELS.get((kind, name)) or " ".join(_WORDS.get(w, w) for w in words) or name
    return Field(group, name, kind, label, unit, " ".join(qualifier))


def merge_twins(fields: Iterable[tuple[Field, object]]) -> list[Field]:
    """(field, its figures) in order, less each with a qualifier whose label and figures are
    those of one before it in its group: that one is named for both (``disk free a, b``)."""
    out: list[Field] = []
    seen: dict[tuple[str, str, object], int] = {}
    for f, figures in fields:
        key = (f.group, f.label, figures)
        if f.qualifier and key in seen:
            twin = out[seen[key]]
            out[seen[key]] = replace(twin, qualifier=f"{twin.qualifier}, {f.qualifier}")
            continue
        if f.qualifier:
            seen[key] = len(out)
        out.append(f)
    return out


def format_value(value: float | None, unit: str, *, like: float | None = None) -> str:
    """``value`` with its unit, scaled for reading; ``like``: scaled as that value would be,
    so figures shown together share one unit (``peak 1.1 GiB, mean 1.0 GiB``)."""
    if value is None:
        return "n/a"
    if unit == "bytes":
        return format_bytes(value, like=like)
    if unit == "MiB":
        return format_bytes(value * 2**20, like=None if like is None else like * 2**20)
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "s":
        return format_duration(value)
    number = f"{value:.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.2g}"
    return f"{number} {unit}" if unit else number


def format_bytes(value: float, *, like: float | None = None) -> str:
    """``1.5 GiB``; with ``like``, in the unit ``like`` would be shown in."""
    reference = abs(value if like is None else like)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if reference >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """``rows`` as lines of left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def format_clock(iso_time: str | None) -> str:
    """An artifact timestamp as ``2026-11-29 19:50:04 UTC``."""
    if not iso_time:
        return "n/a"
    try:
        moment = parse_iso(iso_time)
    except ValueError:
        return iso_time
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
