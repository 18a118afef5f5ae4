"""Talking to ``nvidia-smi`` and reading what it prints (CSV without units, read by position;
an odd value is None and an entry in ``errors``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .._process import CommandResult, run_command_sync

GPU_QUERY = "--query-gpu"
APPS_QUERY = "--query-compute-apps"
#: ``nvidia-smi --query-remapped-rows``: the same figures as the ``remapped_rows.*`` GPU fields;
#: ``benchmarks/gpu_check.py`` compares both.
REMAPPED_ROWS_QUERY = "--query-remapped-rows"
REMAPPED_ROWS_FIELDS: tuple[str, ...] = (
    "gpu_bus_id",
    "gpu_uuid",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
#: The sampler's compute-apps query (``timestamp`` first groups the lines of one iteration).
APP_FIELDS: tuple[str, ...] = (
    "timestamp",
    "pid",
    "process_name",
    "used_gpu_memory",
    "gpu_uuid",
    "gpu_bus_id",
)
#: What the runtime snapshot records about each GPU.
INVENTORY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "power.limit",
    "clocks.max.sm",
    "compute_mode",
    "persistence_mode",
    "mig.mode.current",
)
#: An older name to ask for when nvidia-smi rejects a field (drivers before the rename).
FIELD_FALLBACKS: dict[str, str] = {
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "pcie.link.gen.gpucurrent": "pcie.link.gen.current",
}
#: Fields without which a row means nothing: a rejection of one of them cannot be worked around.
REQUIRED_FIELDS = frozenset({"timestamp", "index", "pid"})
#: nvidia-smi's exit status when it sees no GPU.
NO_DEVICES_EXIT = 6

#: What nvidia-smi prints for a value that does not apply here: recorded, but not an error.
UNAVAILABLE = frozenset({"[N/A]", "[Not Supported]", "N/A"})
#: What a GPU that needs a reset (after Xid 79, 48 or 119) reads in place of its values.
RESET_VALUES = frozenset({"[GPU requires reset]", "[Unknown Error]", "ERR!"})
#: The readings that all read one of :data:`RESET_VALUES` on such a GPU.
RESET_FIELDS: tuple[str, ...] = ("utilization.gpu", "memory.used", "temperature.gpu", "power.draw")

#: NVML's names of the clock event (throttle) reason bits, lowest first.
CLOCK_EVENT_REASONS: dict[int, str] = {
    1 << bit: name
    for bit, name in enumerate(
        (
            "gpu_idle",
            "applications_clocks_setting",
            "sw_power_cap",
            "hw_slowdown",
            "sync_boost",
            "sw_thermal_slowdown",
            "hw_thermal_slowdown",
            "hw_power_brake_slowdown",
            "display_clock_setting",
        )
    )
}
#: Reasons a user must see: the hardware, the temperature or the power supply slows the GPU.
ATTENTION_CLOCK_EVENT_REASONS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
#: Normal operation: idle, clocks set by hand or an application, the power cap of a GPU
#: working flat out, boost synchronised across GPUs.
NORMAL_CLOCK_EVENT_REASONS = frozenset(CLOCK_EVENT_REASONS.values()) - ATTENTION_CLOCK_EVENT_REASONS

_REJECTED_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)(?: (?:%|MiB|W|MHz|C))?$")
_SEPARATOR = ", "


class SmiParseError(ValueError):
    """A line that is not a row of the query (an error message, garbage, a torn line)."""


def _asked(query: str) -> Any:
    """An attribute that the query field ``query`` gives."""
    return field(default=None, metadata={"query": query})


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU in one iteration.  ``errors`` maps a query field to why its value is None;
    ``index`` is -1 when it could not be read (the GPU is known by ``uuid`` or ``bus_id``)."""

    index: int = field(metadata={"query": "index"})
    uuid: str | None = _asked("uuid")
    name: str | None = _asked("name")
    bus_id: str | None = _asked("pci.bus_id")
    pstate: str | None = _asked("pstate")
    utilization_gpu_percent: float | None = _asked("utilization.gpu")
    utilization_memory_percent: float | None = _asked("utilization.memory")
    memory_total_mib: float | None = _asked("memory.total")
    memory_used_mib: float | None = _asked("memory.used")
    memory_free_mib: float | None = _asked("memory.free")
    temperature_gpu_c: float | None = _asked("temperature.gpu")
    temperature_memory_c: float | None = _asked("temperature.memory")
    power_draw_w: float | None = _asked("power.draw")
    power_limit_w: float | None = _asked("power.limit")
    clocks_sm_mhz: float | None = _asked("clocks.sm")
    clocks_mem_mhz: float | None = _asked("clocks.mem")
    clocks_max_sm_mhz: float | None = _asked("clocks.max.sm")
    fan_speed_percent: float | None = _asked("fan.speed")
    clock_event_reasons: list[str] | None = field(
        default=None, metadata={"query": "clocks_event_reasons.active"}
    )
    ecc_uncorrected_volatile: int | None = _asked("ecc.errors.uncorrected.volatile.total")
    ecc_corrected_volatile: int | None = _asked("ecc.errors.corrected.volatile.total")
    remapped_rows_pending: bool | None = _asked("remapped_rows.pending")
    remapped_rows_failure: bool | None = _asked("remapped_rows.failure")
    remapped_rows_correctable: int | None = _asked("remapped_rows.correctable")
    remapped_rows_uncorrectable: int | None = _asked("remapped_rows.uncorrectable")
    retired_pages_pending: bool | None = _asked("retired_pages.pending")
    pcie_link_gen_current: int | None = _asked("pcie.link.gen.gpucurrent")
    pcie_link_gen_max: int | None = _asked("pcie.link.gen.max")
    pcie_link_width_current: int | None = _asked("pcie.link.width.current")
    pcie_link_width_max: int | None = _asked("pcie.link.width.max")
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process holding GPU memory, as ``--query-compute-apps`` reports it (``pid`` is the
    host's: ``in_tree`` is decided by pid only)."""

    pid: int = field(metadata={"query": "pid"})
    name: str | None = _asked("process_name")
    used_gpu_memory_mib: float | None = _asked("used_gpu_memory")
    gpu_uuid: str | None = _asked("gpu_uuid")
    gpu_bus_id: str | None = _asked("gpu_bus_id")
    #: The label (``gpu0``) of the GPU that ``gpu_uuid`` or ``gpu_bus_id`` names.
    gpu_index: int | None = None
    in_tree: bool = False
    errors: dict[str, str] = field(default_factory=dict)


def _number(raw: str) -> float:
    match = _NUMBER.match(raw)
    if match is None:
        raise ValueError(raw)
    return float(match.group(1))


def _integer(raw: str) -> int:
    value = _number(raw)
    if not value.is_integer():
        raise ValueError(raw)
    return int(value)


def _yes_no(raw: str) -> bool:
    if raw in ("Yes", "No"):
        return raw == "Yes"
    raise ValueError(raw)


def decode_clock_event_reasons(mask: int) -> list[str]:
    """NVML's names for the bits set in a clock event reason mask (unknown bits by value)."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"unknown_0x{bit:x}"))
        bit <<= 1
    return names


_Spec = dict[str, tuple[str, Callable[[str], Any]]]

_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "int": _integer,
    "int | None": _integer,
    "str | None": str,
    "float | None": _number,
    "bool | None": _yes_no,
    "list[str] | None": lambda raw: decode_clock_event_reasons(int(raw, 16)),
}


def _spec(cls: type) -> _Spec:
    """Each field a query asks, in the order asked: its attribute of ``cls``, read as the
    attribute's type says."""
    asked = (f for f in fields(cls) if f.metadata)
    return {f.metadata["query"]: (f.name, _CONVERTERS[str(f.type)]) for f in asked}


_GPU_SPEC = _spec(GpuReading)
GPU_FIELDS: tuple[str, ...] = tuple(_GPU_SPEC)
#: Each GPU field's attribute of :class:`GpuReading`.
GPU_ATTRIBUTES = {name: attribute for name, (attribute, _) in _GPU_SPEC.items()}
#: What a GPU says about its own health beyond the ECC counters (see ``_gpu_health``): each is
#: dropped, with a note, by an nvidia-smi that does not know it.
HEALTH_FIELDS: tuple[str, ...] = GPU_FIELDS[GPU_FIELDS.index("remapped_rows.pending") :]
#: The sampler's GPU query: ``timestamp`` first groups the lines of one loop iteration.
GPU_SAMPLE_FIELDS: tuple[str, ...] = ("timestamp", *GPU_FIELDS)
_GPU_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "pcie.link.gen.current": "pcie.link.gen.gpucurrent",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
}
_APP_SPEC = _spec(GpuProcess)
_APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def needs_attention(reason: str) -> bool:
    """Whether a clock event reason is one a user must see (an unknown bit is, to be safe)."""
    return reason not in NORMAL_CLOCK_EVENT_REASONS


def is_error_value(message: str) -> bool:
    """Whether an ``errors`` entry is a real error rather than a value that does not apply."""
    return message not in UNAVAILABLE


def query_args(query: str, fields: Sequence[str], loop_ms: int | None = None) -> list[str]:
    """Arguments for one query (``GPU_QUERY`` or ``APPS_QUERY``), looping every ``loop_ms``."""
    args = [f"{query}={','.join(fields)}", "--format=csv,noheader,nounits"]
    return args if loop_ms is None else [*args, "-lms", str(loop_ms)]


def line_timestamp(line: str) -> str:
    """The first column: the timestamp shared by every line of one loop iteration."""
    return line.split(",", 1)[0].strip()


def line_gpu_index(line: str, fields: Sequence[str]) -> int | None:
    """The ``index`` column of a GPU row; None when it cannot be read."""
    parts = line.split(",")
    position = fields.index("index") if "index" in fields else len(parts)
    value = parts[position].strip() if position < len(parts) else ""
    return int(value) if value.isdigit() else None


def rejected_field(result: CommandResult) -> str | None:
    """The field nvidia-smi refused (exit status 2, message on stdout), if that is the failure."""
    match = None if result.returncode == 0 else _REJECTED_FIELD.search(result.output)
    return match.group(1) if match else None


def replace_rejected(fields: Sequence[str], rejected: str) -> list[str] | None:
    """The field list without a rejected field (or with its older name); None when required."""
    if rejected not in fields or rejected in REQUIRED_FIELDS:
        return None
    fallback = FIELD_FALLBACKS.get(rejected)
    if fallback is None:
        return [f for f in fields if f != rejected]
    return [fallback if f == rejected else f for f in fields]


def no_devices(result: CommandResult) -> bool:
    return result.returncode == NO_DEVICES_EXIT or "No devices were found" in result.output


def _split(line: str, fields: Sequence[str], free_text: str | None) -> list[str]:
    parts = [part.strip() for part in line.rstrip("\r\n").split(_SEPARATOR)]
    extra = len(parts) - len(fields)
    if extra > 0 and free_text in fields:
        # A process name may itself contain ", ": the other columns are fixed, so the surplus
        # belongs to the free-text one.
        i = fields.index(free_text)
        parts = [*parts[:i], _SEPARATOR.join(parts[i : i + extra + 1]), *parts[i + extra + 1 :]]
    if len(parts) != len(fields):
        raise SmiParseError(f"expected {len(fields)} values, got {len(parts)}: {line.strip()!r}")
    return parts


def _convert(
    line: str, fields: Sequence[str], spec: _Spec, aliases: dict[str, str], free_text: str = ""
) -> tuple[str | None, dict[str, Any], dict[str, str]]:
    canonical = [aliases.get(name, name) for name in fields]
    timestamp = None
    kwargs: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, raw in zip(canonical, _split(line, canonical, free_text), strict=True):
        if name == "timestamp":
            timestamp = raw
        elif name in spec:
            attr, convert = spec[name]
            kwargs[attr] = None
            if raw in UNAVAILABLE or raw == "ERR!" or (raw.startswith("[") and raw.endswith("]")):
                errors[name] = raw
                continue
            try:
                kwargs[attr] = convert(raw)
            except ValueError:
                errors[name] = f"unparsable {raw!r}"
    return timestamp, kwargs, errors


def parse_gpu_line(line: str, fields: Sequence[str]) -> tuple[str | None, GpuReading]:
    """One row of a GPU query asked with ``fields``: its timestamp (if asked) and reading."""
    timestamp, kwargs, errors = _convert(line, fields, _GPU_SPEC, _GPU_ALIASES)
    if kwargs.get("index") is None:
        if not (kwargs.get("uuid") or kwargs.get("bus_id")):
            raise SmiParseError(f"no GPU index, UUID or bus id in {line.strip()!r}")
        kwargs["index"] = -1
    return timestamp, GpuReading(**kwargs, errors=errors)


def parse_process_line(line: str, fields: Sequence[str]) -> tuple[str | None, GpuProcess]:
    """One row of a compute-apps query asked with ``fields``."""
    timestamp, kwargs, errors = _convert(line, fields, _APP_SPEC, _APP_ALIASES, "process_name")
    if kwargs.get("pid") is None:
        raise SmiParseError(f"no pid in {line.strip()!r}")
    return timestamp, GpuProcess(**kwargs, errors=errors)


def parse_remapped_rows_line(line: str) -> dict[str, Any]:
    """One row of ``--query-remapped-rows`` asked with :data:`REMAPPED_ROWS_FIELDS`:
    ``{"bus_id", "uuid", "remapped_rows_correctable", ..., "errors"}``."""
    spec: _Spec = {**_GPU_SPEC, "gpu_bus_id": ("bus_id", str), "gpu_uuid": ("uuid", str)}
    _, values, errors = _convert(line, REMAPPED_ROWS_FIELDS, spec, _GPU_ALIASES)
    return {**values, "errors": errors}


def data_lines(output: str, fields: Sequence[str]) -> list[str]:
    """The non-empty lines of an output, without a ``--format=csv`` header if there is one."""
    lines = [line for line in output.splitlines() if line.strip()]
    if lines and lines[0].split(_SEPARATOR, 1)[0].split(" [", 1)[0].strip() == fields[0]:
        return lines[1:]
    return lines


def parse_version(output: str) -> dict[str, str]:
    """``nvidia-smi --version``: ``{"nvidia_smi_version", "nvml_version", "driver_version",
    "cuda_version"}``."""
    out: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")] = value.strip()
    return out


def _inventory_entry(line: str, fields: Sequence[str]) -> dict[str, Any]:
    _, reading = parse_gpu_line(line, fields)
    texts = {
        name: None if value in UNAVAILABLE else value
        for name, value in zip(fields, _split(line, fields, None), strict=True)
    }
    read = ("uuid", "name", "bus_id", "memory_total_mib", "power_limit_w", "clocks_max_sm_mhz")
    texts["mig_mode"] = texts.get("mig.mode.current")
    told = ("driver_version", "compute_mode", "persistence_mode", "mig_mode")
    return {
        "index": None if reading.index < 0 else reading.index,
        **{name: getattr(reading, name) for name in read},
        **{name: texts.get(name) for name in told},
    }


def gpu_inventory(executable: str, timeout: float = 10.0) -> dict[str, Any]:
    """The machine's GPUs and driver for the runtime snapshot, asked of ``executable``; never
    raises for a bad GPU setup: ``{"available": False, "error": ...}`` when there is no GPU."""
    fields = list(INVENTORY_FIELDS)
    errors: list[str] = []
    while True:
        result = run_command_sync([executable, *query_args(GPU_QUERY, fields)], timeout=timeout)
        rejected = rejected_field(result)
        narrower = None if rejected is None else replace_rejected(fields, rejected)
        if narrower is None:
            break
        errors.append(f"nvidia-smi does not know the field {rejected!r}")
        fields = narrower
    if not result.ok:
        error = "no GPU data: " + result.describe()
        return {"available": False, "nvidia_smi": executable, "error": error}
    gpus = []
    for line in data_lines(result.output, fields):
        try:
            gpus.append(_inventory_entry(line, fields))
        except SmiParseError as exc:
            errors.append(str(exc))
    inventory: dict[str, Any] = {"available": True, "nvidia_smi": executable}
    version = run_command_sync([executable, "--version"], timeout=timeout)
    if version.ok:
        inventory.update(parse_version(version.output))
    else:
        errors.append("nvidia-smi --version: " + version.describe())
    inventory.setdefault("driver_version", next((g["driver_version"] for g in gpus), None))
    return {**inventory, "gpus": gpus, "errors": errors}
