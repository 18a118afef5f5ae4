"""Bounded, peak-preserving time series (full, neighbours merge in pairs keeping the maximum:
a spike is never averaged away) and running statistics (means over every sample)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: Points per series group in the artifact (a day at 1 s is 86,400 samples).
SERIES_POINTS = 1000


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None or a >= b else b


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None or a <= b else b


Combine = Callable[[float | None, float | None], float | None]


class SeriesBuffer:
    """One group's series (fields sharing a time axis), bounded in points; ``keep="min"``
    merges a bucket into its minimum instead (the trend rules want floors)."""

    def __init__(
        self, max_points: int = SERIES_POINTS, *, keep: Literal["max", "min"] = "max"
    ) -> None:
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        self._combine: Combine = _max if keep == "max" else _min
        self._max_points = max_points
        self._t: list[float] = []
        self._values: dict[str, list[float | None]] = {}
        self.samples_per_point = 1
        self._in_last = 0  # samples merged into the last point
        #: The values last added, when the last point holds them (merging them again is a no-op).
        self._last_values: Mapping[str, float | None] | None = None

    def add(self, t: float, values: Mapping[str, float | None]) -> None:
        """Add a point; ``values`` given again (the same object, unchanged) costs no merge."""
        if values is self._last_values and self._in_last < self.samples_per_point:
            self._in_last += 1
            return
        again, self._last_values = values is self._last_values, values
        columns = self._values
        if not again and not columns.keys() >= values.keys():  # a new field (no set built)
            for name in values.keys() - columns.keys():
                columns[name] = [None] * len(self._t)
        if self._t and self._in_last < self.samples_per_point:
            combine = self._combine
            for name, column in columns.items():
                column[-1] = combine(column[-1], values.get(name))
            self._in_last += 1
            return
        if len(self._t) == self._max_points:
            self._halve()
            self.add(t, values)
            return
        self._t.append(t)
        for name, column in self._values.items():
            column.append(values.get(name))
        self._in_last = 1

    def _halve(self) -> None:
        n = len(self._t)
        combine = self._combine
        self._t = self._t[::2]
        for name, column in self._values.items():
            self._values[name] = [
                combine(column[i], column[i + 1] if i + 1 < n else None) for i in range(0, n, 2)
            ]
        # The merged last point may still have room for more samples.
        self._in_last = self.samples_per_point * (2 if n % 2 == 0 else 1)
        self.samples_per_point *= 2
        self._last_values = None

    @property
    def times(self) -> list[float]:
        return self._t

    def column(self, name: str) -> list[float | None]:
        """One field's values, aligned with :attr:`times` (empty when never seen)."""
        return self._values.get(name, [])

    def to_json(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"t": [round(t, 3) for t in self._t]}
        for name, column in sorted(self._values.items()):
            out[name] = [None if v is None else round(v, 4) for v in column]
        return out


class ProgressBins:
    """Every progress change in at most ``max_bins`` bins (merged in pairs when full), what the
    report draws of progress without the journal: a bin's first and last change, how many,
    the longest gap that ended in it and when, the files of its last change."""

    def __init__(self, max_bins: int = SERIES_POINTS) -> None:
        self._max_bins = max_bins
        #: [first_t, last_t, changes, longest_gap_seconds, longest_gap_t, files]
        self._bins: list[list[Any]] = []
        self._per_bin = 1
        self._last_t = 0.0

    def add(self, t: float, paths: Sequence[str]) -> None:
        gap, self._last_t = t - self._last_t, t
        bins = self._bins
        if not bins or bins[-1][2] >= self._per_bin:
            if len(bins) == self._max_bins:
                self._halve()
            if not bins or bins[-1][2] >= self._per_bin:
                bins.append([t, t, 0, gap, t, ""])
        last = bins[-1]
        last[1], last[2], last[5] = t, last[2] + 1, file_names(paths)
        if gap > last[3]:
            last[3], last[4] = gap, t

    def _halve(self) -> None:
        bins, merged = self._bins, []
        for i in range(0, len(bins), 2):
            a, b = bins[i], bins[min(i + 1, len(bins) - 1)]
            longest = a if a[3] >= b[3] or a is b else b
            changes = a[2] + (b[2] if b is not a else 0)
            merged.append([a[0], b[1], changes, longest[3], longest[4], b[5]])
        self._bins[:] = merged
        self._per_bin *= 2

    def to_json(self) -> dict[str, list[Any]]:
        columns = zip(*self._bins, strict=True) if self._bins else [()] * 6
        names = ("first_t", "last_t", "changes", "longest_gap_seconds", "longest_gap_t", "files")
        return {
            name: [round(v, 3) if isinstance(v, float) else v for v in values]
            for name, values in zip(names, columns, strict=True)
        }


def file_names(paths: object, shown: int = 3) -> str:
    """``checkpoint-30/trainer_state.json, metrics.jsonl`` (and how many more)."""
    if not isinstance(paths, list | tuple) or not paths:
        return ""
    names = ", ".join(str(p) for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


@dataclass(slots=True)
class RunningStats:
    count: int = 0
    total: float = 0.0
    max: float | None = None
    min: float | None = None
    last: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.count += 1
        self.total += value
        self.max = value if self.max is None or value > self.max else self.max
        self.min = value if self.min is None or value < self.min else self.min
        self.last = value

    def to_json(self) -> dict[str, float | None]:
        mean = self.total / self.count if self.count else None
        return {
            "max": self.max,
            "mean": None if mean is None else round(mean, 4),
            "min": self.min,
            "last": self.last,
        }
