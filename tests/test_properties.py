"""Property-based tests: spaces of bad inputs, and the scanner against random file operations."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncsoak import run_soak
from asyncsoak._sampling._progress_rules import ProgressTracker
from asyncsoak._sampling._progress_scan import scan_progress_dir

DURATIONS = [
    "sample_interval_seconds",
    "startup_timeout_seconds",
    "stale_progress_seconds",
    "post_shutdown_grace_seconds",
    "min_duration_seconds",
    "max_duration_seconds",
    "kill_wait_seconds",
]

bad_numbers = st.one_of(
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    st.integers(max_value=-1),
    st.just(math.nan),
    st.just(math.inf),
    st.just(-math.inf),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DURATIONS), value=bad_numbers)
def test_any_bad_duration_is_refused_before_anything_happens(name: str, value: object) -> None:
    """Negative, NaN, infinite or non-numeric limits raise TypeError/ValueError; nothing runs."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        kwargs: dict[str, Any] = {
            "command": ["/bin/sh", "-c", f"touch {base / 'launched'}"],
            "progress_dir": base / "progress",
            "output_path": base / "out" / "soak.json",
            "nvidia_smi": None,
            name: value,
        }
        with pytest.raises((TypeError, ValueError)):
            anyio.run(lambda: run_soak(**kwargs))
        assert os.listdir(base) == []


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    command=st.one_of(
        st.text(),
        st.just([]),
        st.lists(st.one_of(st.integers(), st.none(), st.binary()), min_size=1, max_size=3),
        st.lists(st.text(), min_size=1, max_size=3).filter(
            lambda argv: not argv[0] or any("\0" in a for a in argv)
        ),
    )
)
def test_any_bad_command_is_refused(command: object) -> None:
    """Strings, empty argv, non-string items, NUL bytes: refused with TypeError/ValueError."""
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises((TypeError, ValueError)):
            anyio.run(
                lambda: run_soak(
                    command=command,  # type: ignore[arg-type]
                    progress_dir=Path(tmp) / "p",
                    output_path=Path(tmp) / "o.json",
                    nvidia_smi=None,
                )
            )
        assert os.listdir(tmp) == []


# One step of a random workload on a progress directory.
operations = st.lists(
    st.tuples(
        st.sampled_from(["create", "append", "touch", "delete", "rename", "mkdir", "own"]),
        st.integers(min_value=0, max_value=5),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(ops=operations)
def test_scanner_sees_exactly_the_changes_that_count(ops: list[tuple[str, int]]) -> None:
    """After each random operation a scan reports progress iff a regular file was written to."""
    root = Path(tempfile.mkdtemp())
    try:
        own = root / "own.jsonl"
        own.write_text("")
        own_key = (own.stat().st_dev, own.stat().st_ino)
        tracker = ProgressTracker(
            scan_progress_dir(root, {own_key}).files, startup_timeout=1e9, stale_after=1e9
        )
        for step, (op, n) in enumerate(ops, start=1):
            name = root / f"f{n}"
            expect_change = False
            if op == "create" and not name.exists():
                name.write_text("new")
                expect_change = True
            elif op == "append" and name.is_file():
                with name.open("a") as f:
                    f.write("more")
                expect_change = True
            elif op == "touch" and name.is_file():
                st_ = name.stat()
                os.utime(name, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
                expect_change = True
            elif op == "delete" and name.is_file():
                name.unlink()
            elif op == "rename" and name.is_file():
                target = root / f"renamed{step}"
                name.rename(target)
                expect_change = True  # a new name holding data is new progress
            elif op == "mkdir" and not name.exists():
                name.mkdir()
            elif op == "own":
                with own.open("a") as f:
                    f.write("journal line\n")
            changed = tracker.observe(scan_progress_dir(root, {own_key}).files, now=float(step))
            assert bool(changed) == expect_change, (op, n, changed)
            assert "own.jsonl" not in changed
    finally:
        shutil.rmtree(root)


# -- degenerate series: every estimator and rule judges them or says it cannot, never raises --

#: Times as samplers write them, and as they go wrong: repeated (a clock in whole seconds),
#: out of order, far apart, and not numbers at all.
some_times = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0]),
    st.floats(min_value=0, max_value=1e7),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
#: Values: memory-sized numbers of either sign, missing ones and non-finite ones.
some_values = st.one_of(
    st.none(),
    st.floats(min_value=-1e15, max_value=1e15),
    st.sampled_from([0.0, math.nan, math.inf, -math.inf]),
)
points = st.lists(st.tuples(some_times, some_values), max_size=80)


def degenerate_series() -> st.SearchStrategy[tuple[list[float], list[float | None]]]:
    """A series as given (any order), sorted, or with one value repeated throughout."""

    def shape(pairs: list[tuple[float, float | None]], how: str) -> Any:
        if how == "sorted":
            pairs = sorted(pairs, key=lambda p: (math.isnan(p[0]), p[0]))
        elif how == "constant":
            pairs = [(t, 5.0 * 2**30) for t, _ in pairs]
        return [t for t, _ in pairs], [v for _, v in pairs]

    return st.builds(shape, points, st.sampled_from(["as given", "sorted", "constant"]))


def _finite_or_none(*figures: float | None) -> bool:
    return all(f is None or math.isfinite(f) for f in figures)


@settings(max_examples=400, deadline=None)
@given(series=degenerate_series(), direction=st.sampled_from(["up", "down"]))
def test_the_estimator_judges_any_series_or_says_it_cannot(
    series: tuple[list[float], list[float | None]], direction: Any
) -> None:
    """Repeated or non-increasing times, one point, constant or non-finite values: a verdict
    with finite figures (``inconclusive`` with too few distinct times), never an exception."""
    from asyncsoak._analysis._trends import (
        MIN_WINDOWS,
        default_warm_up,
        estimate_trend,
        progress_slowing,
        theil_sen,
        windowed_minima,
    )

    t, values = series
    trend = estimate_trend(t, values, min_growth=1.0, min_ratio=0.1, direction=direction)
    assert trend.verdict in ("leak", "stable", "inconclusive")
    interval = trend.slope_interval_per_hour or (None, None)
    assert _finite_or_none(trend.slope_per_hour, *interval, trend.growth, trend.first, trend.last)
    assert math.isfinite(trend.span_seconds)
    finite = [
        (ti, v) for ti, v in zip(t, values, strict=True) if v is not None and math.isfinite(ti + v)
    ]
    if len({ti for ti, _ in finite}) < MIN_WINDOWS:
        assert trend.verdict == "inconclusive"
    if len({v for _, v in finite}) <= 1:
        assert trend.verdict != "leak"
    assert trend.seconds_to(1e16) is None or math.isfinite(trend.seconds_to(1e16) or 0.0)
    wt, wv = windowed_minima(t, values, windows=6)
    assert len(wt) == len(wv) <= 6
    progress_slowing(t, values)
    default_warm_up(sorted(ti for ti, _ in finite))
    try:
        slope, lo, hi = theil_sen(t, [math.nan if v is None else v for v in values])
    except ValueError:
        assert len({ti for ti, _ in finite}) < 2  # its one documented refusal
    else:
        assert lo <= slope <= hi


#: A fold's figures as the journal carries them: numbers or null (NaN is written as null).
figure = st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40))
#: Steps between two samples' times: mostly none (readings sharing a whole-second stamp), a
#: sample interval, a second, or back in time.
time_step = st.sampled_from([0.0, 0.0, 0.0, 0.1, 1.0, -0.5])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    samples=st.lists(
        st.tuples(
            time_step, figure, figure, st.booleans(), st.one_of(st.none(), st.floats(0, 1e3))
        ),
        min_size=20,
        max_size=150,
    ),
    leak_check=st.sampled_from(["fail", "warn"]),
)
def test_the_trends_and_rules_judge_any_fold_and_never_raise(
    samples: list[tuple[float, int | None, int | None, bool, float | None]], leak_check: str
) -> None:
    """Samples and GPU samples at repeated or going-back times with missing or odd figures,
    judged live after each and at the end: every series judged (none left out by an
    exception), entries the artifact can hold (finite numbers), and the rules over them
    (leaks, budgets, stall activity) never raise."""
    import json

    from asyncsoak._analysis import TrendWatch, describe_activity
    from asyncsoak._supervisor._config import SoakConfig
    from asyncsoak._supervisor._judge import budget_breach, trend_findings

    cfg = SoakConfig(
        command=("true",),
        progress_dir=Path("/nonexistent"),
        output_path=Path("/nonexistent/soak.json"),
        leak_check=leak_check,  # type: ignore[arg-type]
        max_rss_bytes=2**30,
        max_gpu_memory_bytes=2**30,
        min_disk_free_bytes=2**30,
    )
    watch = TrendWatch()
    watch.configure({"sample_interval_seconds": 0.1})
    t = 0.0
    for i, (step, memory, gpu, alive, cpu) in enumerate(samples):
        t += step
        process = {"pid": 7, "name": "python", "rss_bytes": memory, "anon_bytes": memory}
        event: Any = {
            "tree": {"processes": int(alive), "anon_bytes": memory, "fds": gpu, "cpu_percent": cpu},
            "processes": [process] if alive else [],
            "disks": {"output": {"path": "/", "free_bytes": gpu}},
        }
        watch.add_sample(t, event)
        app = {"pid": 7, "in_tree": True, "gpu_index": 0, "used_gpu_memory_mib": gpu}
        gpus: Any = {
            "gpus": [{"index": 0, "memory_used_mib": gpu, "utilization_gpu_percent": cpu}],
            "processes": [app] * (1 + i % 10),  # a second's iterations sharing a stamp
        }
        watch.add_gpu_sample(t, gpus)
        watch.add_step_rate(t, cpu)
        trends = watch.evaluate(lambda _: None, live=True)
        trend_findings(cfg, trends)
    watch.end(t)
    trends = watch.evaluate(lambda _: None)
    assert watch.not_judged == {}
    json.dumps(trends, allow_nan=False)
    for found in trend_findings(cfg, trends):
        assert found.message
    budget_breach(cfg, watch)
    describe_activity(watch.activity())


some_seconds = st.one_of(
    st.floats(min_value=-10, max_value=1e6), st.sampled_from([0.0, math.nan, math.inf])
)
some_losses = st.one_of(
    st.none(), st.floats(min_value=-1e300, max_value=1e300), st.sampled_from([math.nan, math.inf])
)
step_records = st.lists(
    st.tuples(
        st.integers(min_value=-5, max_value=2**62),
        st.sampled_from(["a.jsonl", "b.csv", "checkpoint-4/trainer_state.json"]),
        st.integers(min_value=0, max_value=3),
        some_losses,
        st.one_of(st.none(), st.floats(allow_nan=True)),
        st.booleans(),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    readings=st.lists(st.tuples(some_seconds, step_records), max_size=30),
    gaps=st.lists(st.tuples(some_seconds, st.one_of(st.none(), some_seconds)), max_size=30),
)
def test_the_step_rules_judge_any_records_and_never_raise(
    readings: list[tuple[float, list[tuple[int, str, int, float | None, float | None, bool]]]],
    gaps: list[tuple[float, float | None]],
) -> None:
    """Steps going back, repeated or huge, losses non-finite or huge, scans at repeated,
    going-back or non-finite times, gaps of any length: the step rules and the learned stale
    limit fold them all, and the limit stays a finite positive number."""
    from asyncsoak._sampling._step_files import StepReading, StepRecord
    from asyncsoak._sampling._step_rules import StaleLimit, StepTracker

    tracker = StepTracker()
    for now, records in readings:
        reading = StepReading(
            records=[
                StepRecord(step, source, kind, loss, epoch=epoch, before_start=before)
                for step, source, kind, loss, epoch, before in records
            ]
        )
        tracker.observe(reading, now)
        tracker.eta_seconds()
        if tracker.step is not None and tracker.last_advance is not None:
            tracker.stall_message(now)
    limit = StaleLimit(startup_limit=5.0)
    for now, gap in gaps:
        limit.advance(now, gap)
        assert 0 < limit.limit < math.inf
