"""The artifact's time series stay bounded and keep their peaks however long the run."""

from __future__ import annotations

from asyncsoak._contract._series import ProgressBins, RunningStats, SeriesBuffer


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


def test_values_given_again_add_as_copies_do_without_a_merge() -> None:
    """The same values object added again (a sleeping process's point) gives the series a
    copy gives, across halvings; merging it into the point that holds it is skipped."""
    given, copied = SeriesBuffer(max_points=8), SeriesBuffer(max_points=8)
    merges = 0

    def counting(a: float | None, b: float | None) -> float | None:
        nonlocal merges
        merges += 1
        return max(a, b) if a is not None and b is not None else a if b is None else b

    given._combine = counting  # the merges are what is measured
    low, high = {"v": 1.0}, {"v": 5.0}
    for i in range(100):
        values = high if i % 37 == 0 else low
        given.add(float(i), values)
        copied.add(float(i), dict(values))
    assert given.to_json() == copied.to_json()
    assert merges < 100 // 2


def test_running_stats_ignore_missing_values() -> None:
    """Mean, max, min and last skip None ([N/A] readings)."""
    stats = RunningStats()
    for value in (2.0, None, 4.0, 0.0):
        stats.add(value)
    assert stats.to_json() == {"max": 4.0, "mean": 2.0, "min": 0.0, "last": 0.0}


def test_progress_bins_hold_a_day_of_changes_with_the_longest_gap_where_it_ended() -> None:
    """A change a second for a day, one gap of 100 s: at most the cap of bins, every change
    counted, the gap kept with its time, the last change's files named."""
    bins = ProgressBins(max_bins=1000)
    t = 0.0
    for i in range(86_400):
        t += 100.0 if i == 54_321 else 1.0
        bins.add(t, ["metrics.jsonl", f"checkpoint-{i}/a", "b", "c"])
    out = bins.to_json()
    assert len(out["last_t"]) <= 1000
    assert sum(out["changes"]) == 86_400
    assert max(out["longest_gap_seconds"]) == 100.0
    peak = out["longest_gap_seconds"].index(100.0)
    assert out["longest_gap_t"][peak] == 54_322 + 99.0
    assert out["first_t"][0] == 1.0
    assert out["last_t"][-1] == t
    assert out["files"][-1] == "metrics.jsonl, checkpoint-86399/a, b and 1 more"


def test_few_progress_changes_are_each_a_bin() -> None:
    """Below the cap a bin is one change, its gap counted from the one before (or the start)."""
    bins = ProgressBins(max_bins=10)
    for t in (2.0, 3.0, 7.5):
        bins.add(t, ["m"])
    assert bins.to_json() == {
        "first_t": [2.0, 3.0, 7.5],
        "last_t": [2.0, 3.0, 7.5],
        "changes": [1, 1, 1],
        "longest_gap_seconds": [2.0, 1.0, 4.5],
        "longest_gap_t": [2.0, 3.0, 7.5],
        "files": ["m", "m", "m"],
    }
