"""Bounded, peak-preserving time series and running statistics for the artifact.

The journal keeps every sample; the artifact keeps at most ``max_points`` per series group
however long the soak runs.  When a group fills up, neighbouring points are merged in pairs
and each later point covers twice as many samples: a point's time is its first sample's and
its value is the bucket's maximum, so a short spike is never averaged away.  Means live in
:class:`RunningStats`, over every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Points per series group in the artifact (a day at 1 s is 86,400 samples).
SERIES_POINTS = 1000


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


Combine = Callable[[float | None, float | None], float | None]


class SeriesBuffer:
    """One group's series (several fields sharing a time axis), bounded in points.

    ``keep="min"`` merges a bucket into its minimum instead: the trend rules want floors.
    """

    def __init__(self, max_points: int = SERIES_POINTS, *, keep: str = "max") -> None:
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        if keep not in ("max", "min"):
            raise ValueError("keep must be 'max' or 'min'")
        self._combine: Combine = _max if keep == "max" else _min
        self._max_points = max_points
        self._t: list[float] = []
        self._values: dict[str, list[float | None]] = {}
        self.samples_per_point = 1
        self._in_last = 0  # samples merged into the last point

    def add(self, t: float, values: Mapping[str, float | None]) -> None:
        for name in values.keys() - self._values.keys():
            self._values[name] = [None] * len(self._t)
        if self._t and self._in_last < self.samples_per_point:
            for name, column in self._values.items():
                column[-1] = self._combine(column[-1], values.get(name))
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
