"""Each GPU's health over a run, folded from ``gpu_sample`` and ``gpu_fault`` events in
bounded memory: the artifact's ``gpu_health`` (``recover`` rebuilds it too)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Clock event reasons that mean the hardware or the heat held the GPU back.
HARMFUL_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
#: Reasons that say nothing about being held back.
QUIET_THROTTLE = frozenset({"gpu_idle"})
#: The share of a run's samples above which a harmful throttle is a warning.
THROTTLE_WARN_SHARE = 0.10
#: Faults kept per GPU (the journal holds them all).
MAX_FAULTS = 100
#: Buckets of the throttle timeline at most (neighbours merge, width doubling, when full).
THROTTLE_BUCKETS = 256


@dataclass(slots=True)
class _Bucket:
    start: float
    samples: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


class ThrottleTimeline:
    """Clock event reasons over time, in buckets that widen as the run grows."""

    def __init__(self, width: float = 1.0) -> None:
        self.width = width
        self._buckets: list[_Bucket] = []
        self._first_t: float | None = None
        self._last_t = 0.0

    def add(self, t: float, reasons: list[str]) -> None:
        self._first_t = t if self._first_t is None else self._first_t
        self._last_t = t
        start = t - t % self.width
        if not self._buckets or start >= self._buckets[-1].start + self.width:
            self._buckets.append(_Bucket(start))
            if len(self._buckets) > THROTTLE_BUCKETS:
                self._merge()
        bucket = self._buckets[-1]
        bucket.samples += 1
        bucket.reasons.update(reasons)

    def _merge(self) -> None:
        self.width *= 2
        merged: list[_Bucket] = []
        for bucket in self._buckets:
            start = bucket.start - bucket.start % self.width
            if not merged or merged[-1].start != start:
                merged.append(_Bucket(start))
            merged[-1].samples += bucket.samples
            merged[-1].reasons.update(bucket.reasons)
        self._buckets = merged

    def spans(self) -> list[dict[str, Any]]:
        """The stretches of neighbouring buckets with the same reasons (gpu_idle left out;
        a reason any sample of a bucket had counts), within the first and last sample: the
        report's "held back" lane, to a bucket's width."""
        found: list[dict[str, Any]] = []
        for bucket in self._buckets:
            reasons = sorted(set(bucket.reasons) - QUIET_THROTTLE)
            start = max(bucket.start, self._first_t or 0.0)
            end = min(bucket.start + self.width, self._last_t)
            if found and found[-1]["reasons"] == reasons and found[-1]["end"] >= start:
                found[-1]["end"] = end
            elif reasons:
                found.append({"start": start, "end": end, "reasons": reasons})
        return [
            {**span, "start": round(span["start"], 3), "end": round(span["end"], 3)}
            for span in found
        ]

    def shares(self, since: float = float("-inf"), until: float = float("inf")) -> dict[str, float]:
        """Each reason's share of the samples in the buckets that start within the span."""
        samples = 0
        counts: Counter[str] = Counter()
        for bucket in self._buckets:
            if since - self.width < bucket.start <= until:
                samples += bucket.samples
                counts.update(bucket.reasons)
        if not samples:
            return {}
        return {
            reason: round(count / samples, 4)
            for reason, count in sorted(counts.items())
            if reason not in QUIET_THROTTLE
        }


#: The counters a GPU's readings carry, kept as their first and last value.
_COUNTERS = (
    "ecc_uncorrected_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "retired_pages_pending",
)


@dataclass(slots=True)
class _GpuHealth:
    index: int
    uuid: str | None = None
    bus_id: str | None = None
    samples: int = 0
    counters: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {name: {"start": None, "end": None} for name in _COUNTERS}
    )
    link: dict[str, Any] = field(default_factory=dict)
    throttle: ThrottleTimeline = field(default_factory=ThrottleTimeline)
    faults: list[dict[str, Any]] = field(default_factory=list)
    faults_seen: int = 0
    lost: bool = False
    #: Whether a fault that fails a run was seen; Xid code -> errors seen (all, not only kept).
    failed: bool = False
    xids: Counter[str] = field(default_factory=Counter)

    def to_json(self, wall: Callable[[float | None], str | None]) -> dict[str, Any]:
        counters = {name: dict(figures) for name, figures in self.counters.items()}
        return {
            "index": self.index,
            "uuid": self.uuid,
            "bus_id": self.bus_id,
            "samples": self.samples,
            "lost": self.lost,
            "faults": [{**f, "at": wall(f["t"])} for f in self.faults],
            "faults_dropped": self.faults_seen - len(self.faults),
            "xid": [
                {"t": f["t"], "at": wall(f["t"]), "code": f["xid"]}
                | {key: f[key] for key in ("meaning", "action", "fails")}
                for f in self.faults
                if f["fault"] == "xid"
            ],
            "ecc_uncorrected": counters.pop("ecc_uncorrected_volatile"),
            "remapped_rows": {
                kind: counters.pop(f"remapped_rows_{kind}")
                for kind in ("correctable", "uncorrectable", "pending", "failure")
            },
            "retired_pages_pending": counters.pop("retired_pages_pending"),
            "pcie_link": dict(self.link),
            "throttle_shares": self.throttle.shares(),
            "throttle_spans": self.throttle.spans(),
        }


_FAULT_KEYS = ("fault", "message", "fails", "used", "xid", "meaning", "action")
_LINK = (
    ("pcie_link_gen_current", "gen"),
    ("pcie_link_width_current", "width"),
)


class GpuHealthFold:
    """Every GPU's health, folded from ``gpu_sample`` and ``gpu_fault`` events (JSON form)."""

    def __init__(self) -> None:
        self.gpus: dict[int, _GpuHealth] = {}

    def _gpu(self, index: int, named: Mapping[str, Any]) -> _GpuHealth:
        """The GPU of ``index``, its uuid and bus id as ``named`` gives them (when it does)."""
        gpu = self.gpus.get(index)
        if gpu is None:
            gpu = self.gpus[index] = _GpuHealth(index)
        gpu.uuid = named.get("uuid") or gpu.uuid
        gpu.bus_id = named.get("bus_id") or gpu.bus_id
        return gpu

    def add_sample(self, t: float, event: Mapping[str, Any]) -> None:
        for reading in event.get("gpus") or []:
            index = reading.get("index")
            if not isinstance(index, int):
                continue
            gpu = self._gpu(index, reading)
            gpu.samples += 1
            for name, figures in gpu.counters.items():
                value = reading.get(name)
                if value is not None:
                    if figures["start"] is None:
                        figures["start"] = value
                    figures["end"] = value
            self._add_link(gpu, reading)
            reasons = reading.get("clock_event_reasons")
            if reasons is not None:
                gpu.throttle.add(t, [str(r) for r in reasons])

    @staticmethod
    def _add_link(gpu: _GpuHealth, reading: Mapping[str, Any]) -> None:
        busy = (reading.get("utilization_gpu_percent") or 0) >= 50
        for name, what in _LINK:
            current = reading.get(name)
            top = reading.get(name.replace("_current", "_max"))
            if top is not None:
                gpu.link[f"{what}_max"] = top
            if current is None:
                continue
            gpu.link[f"{what}_last"] = current
            if busy:
                key = f"{what}_min_under_load"
                gpu.link[key] = min(current, gpu.link.get(key, current))

    def add_fault(self, t: float, event: Mapping[str, Any]) -> None:
        index = event.get("gpu")
        gpu = self._gpu(index if isinstance(index, int) else -1, event)
        if event.get("fault") == "lost":
            gpu.lost = True
        gpu.faults_seen += 1
        gpu.failed = gpu.failed or bool(event.get("fails"))
        xid = event.get("xid")
        if xid is not None:
            gpu.xids[str(xid)] += 1
        if len(gpu.faults) < MAX_FAULTS:
            fault = {"t": t} | {key: event.get(key) for key in _FAULT_KEYS}
            fault["fails"], fault["used"] = bool(fault["fails"]), bool(fault["used"])
            gpu.faults.append(fault)

    def to_json(self, wall: Callable[[float | None], str | None]) -> dict[str, Any]:
        return {
            (f"gpu{index}" if index >= 0 else "unlisted"): gpu.to_json(wall)
            for index, gpu in sorted(self.gpus.items())
        }

    def held_back(self, since: float, until: float) -> str:
        """What held the GPUs back over a span: ``gpu0 by sw_power_cap 80% of the time``."""
        parts = []
        for index, gpu in sorted(self.gpus.items()):
            shares = gpu.throttle.shares(since, until)
            named = [f"{reason} {share:.0%}" for reason, share in shares.items() if share > 0]
            if named:
                parts.append(f"gpu{index} by {', '.join(named)} of the time")
        if not parts:
            return "the GPUs were not held back over the same span" if self.gpus else ""
        return "GPUs held back over the same span: " + "; ".join(parts)

    def throttle_warnings(self) -> list[str]:
        """Each GPU held back by HW slowdown or heat for more than the documented share."""
        out = []
        for index, gpu in sorted(self.gpus.items()):
            shares = gpu.throttle.shares()
            for reason in HARMFUL_THROTTLE:
                share = shares.get(reason, 0.0)
                if share > THROTTLE_WARN_SHARE:
                    out.append(
                        f"gpu{index} clocks held back by {reason} {share:.0%} of the run "
                        f"(more than {THROTTLE_WARN_SHARE:.0%}): check its cooling and power"
                    )
        return out
