"""The artifact's time series stay bounded and keep their peaks however long the run."""

from __future__ import annotations

from asyncsoak._contract._series import RunningStats, SeriesBuffer


def test_series_is_bounded_and_keeps_every_peak() -> None:
    """86,400 samples fit in the cap; a one-sample spike survives every halving."""
    series = SeriesBuffer(max_points=1000)
    for i in range(86_400):
        series.add(float(i), {"cpu": 1000.0 if i == 54_321 else float(i % 7)})
    out = series.to_json()
    assert len(out["t"]) <= 1000
    assert max(v for v in out["cpu"] if v is not None) == 1000.0
    assert out["t"] == sorted(out["t"])
    assert out["t"][0] == 0.0
    assert series.samples_per_point * len(out["t"]) >= 86_400


def test_short_series_are_kept_at_full_resolution() -> None:
    """Below the cap every sample is a point."""
    series = SeriesBuffer(max_points=10)
    for i in range(5):
        series.add(float(i), {"rss": float(i * 10)})
    assert series.to_json() == {
        "t": [0.0, 1.0, 2.0, 3.0, 4.0],
        "rss": [0.0, 10.0, 20.0, 30.0, 40.0],
    }


def test_fields_appearing_later_are_padded_with_nulls() -> None:
    """A GPU field first seen mid-run lines up with the shared time axis."""
    series = SeriesBuffer(max_points=10)
    series.add(0.0, {"a": 1.0})
    series.add(1.0, {"a": 2.0, "b": 5.0})
    assert series.to_json() == {"t": [0.0, 1.0], "a": [1.0, 2.0], "b": [None, 5.0]}


def test_running_stats_ignore_missing_values() -> None:
    """Mean, max, min and last skip None ([N/A] readings)."""
    stats = RunningStats()
    for value in (2.0, None, 4.0, 0.0):
        stats.add(value)
    assert stats.to_json() == {"max": 4.0, "mean": 2.0, "min": 0.0, "last": 0.0}
