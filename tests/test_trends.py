"""The trend estimator over synthetic series of known ground truth (no clock, no processes)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any, cast

import pytest

from asyncsoak._analysis._activity import agreeing, describe_activity, tree_verdict
from asyncsoak._analysis._trendfold import TREE_MEMORY_SERIES
from asyncsoak._analysis._trends import (
    FLOORS,
    Trend,
    default_warm_up,
    describe_growth,
    estimate_trend,
    format_bytes,
    progress_slowing,
    theil_sen,
    windowed_minima,
)
from asyncsoak._analysis._trendwatch import TrendWatch, memory_not_judged
from asyncsoak._contract import events
from asyncsoak._contract._crash import describe_crash, find_exception
from asyncsoak._contract._units import check_size, format_duration, parse_size

from .trend_shapes import BASE, STABLE, GiB, MiB, detection_time, leak, times

MIN_GROWTH, MIN_RATIO = FLOORS["bytes"]
FIXTURES = Path(__file__).parent / "fixtures"


def judge(t: list[float], values: list[float], **options: Any) -> Trend:
    """The estimator with the memory floors."""
    return estimate_trend(t, values, min_growth=MIN_GROWTH, min_ratio=MIN_RATIO, **options)


def test_theil_sen_finds_a_line_through_outliers() -> None:
    """The median of pairwise slopes ignores a few wild points; the interval holds the truth."""
    t = [float(i) for i in range(30)]
    values = [3.0 * ti + 10 for ti in t]
    values[5] = 1e6
    values[20] = -1e6
    slope, lo, hi = theil_sen(t, values)
    assert slope == pytest.approx(3.0)
    assert lo <= 3.0 <= hi


def test_windowed_minima_keep_each_windows_floor() -> None:
    """A sawtooth's windows all share the same floor; missing values are skipped."""
    t = [float(i) for i in range(40)]
    values: list[float | None] = [float(i % 10) for i in range(40)]
    values[3] = None
    wt, wv = windowed_minima(t, values, windows=4)
    assert wv == [0.0, 0.0, 0.0, 0.0]
    assert len(wt) == 4
    assert wt == sorted(wt)


def test_a_steady_leak_is_a_leak_with_its_slope() -> None:
    """1 MiB/s for ten minutes: a leak, the interval holds 1 MiB/s, the growth is ~9 min of it."""
    rng = random.Random(1)
    t = times(600)
    trend = judge(t, leak(rng, t, MiB))
    assert trend.verdict == "leak"
    assert trend.slope_interval_per_hour is not None
    lo, hi = trend.slope_interval_per_hour
    assert lo <= 3600 * MiB <= hi
    assert trend.growth == pytest.approx(540 * MiB, rel=0.1)
    assert trend.analysed_from == pytest.approx(60.0, abs=1)  # 10 % warm-up
    seconds = trend.seconds_to(64 * GiB)
    assert seconds is not None
    assert trend.last is not None
    assert seconds == pytest.approx((64 * GiB - trend.last) / MiB, rel=0.1)


@pytest.mark.parametrize("shape", sorted(STABLE))
def test_stable_shapes_are_never_a_leak(shape: str) -> None:
    """100 seeded series of each stable shape, of several lengths: no leak at all."""
    leaks = 0
    for seed in range(100):
        rng = random.Random(seed)
        t = times(rng.choice([60, 200, 600, 1800]))
        trend = judge(t, STABLE[shape](rng, t))
        leaks += trend.verdict == "leak"
    assert leaks == 0


def test_a_leak_of_1_mib_per_second_is_caught_within_three_minutes() -> None:
    """At 1 s samples, judged every 5 s on the run so far: flagged well before 180 s."""
    found = [detection_time(random.Random(seed), MiB) for seed in range(10)]
    assert all(f is not None and f <= 180 for f in found), found


def late_leak(rng: random.Random, t: list[float], start: float, rate: float) -> list[float]:
    """Flat noise, then a leak of ``rate`` bytes per second from ``start`` to the end."""
    return [BASE + rate * max(0.0, ti - start) + rng.gauss(0, 8 * MiB) for ti in t]


def uneven_leak(rng: random.Random, t: list[float], paces: list[float]) -> list[float]:
    """A leak whose pace changes with the step rate: ``paces[i]`` bytes per second in the
    i-th equal part of the run (steps come slow, then fast)."""
    out, memory, previous = [], 0.0, t[0]
    for ti in t:
        part = min(len(paces) - 1, int(len(paces) * ti / t[-1]))
        memory += paces[part] * (ti - previous)
        previous = ti
        out.append(BASE + memory + rng.gauss(0, 8 * MiB))
    return out


@pytest.mark.parametrize(
    ("samples", "rate", "start_fraction"),
    [(61, 8 * MiB, 0.4), (601, MiB, 0.4), (601, MiB, 0.6), (3601, MiB, 0.75)],
)
def test_a_leak_that_starts_late_is_a_leak_from_its_onset(
    samples: int, rate: float, start_fraction: float
) -> None:
    """A leak from 40 % of a minute, or from 40 %, 60 % or 75 % of a longer run: a leak,
    judged over the recent part where it runs; the old estimator said "stable" (the rise is
    confined to part of the span)."""
    for seed in range(20):
        rng = random.Random(seed)
        t = times(samples)
        start = start_fraction * t[-1]
        trend = judge(t, late_leak(rng, t, start, rate))
        assert trend.verdict == "leak", (seed, trend)
        assert trend.onset is not None
        assert trend.analysed_from is not None
        # The judged part starts after the warm-up, and no later than half way into the leak.
        assert trend.analysed_from < trend.onset <= start + (t[-1] - start) / 2
        assert trend.slope_per_hour == pytest.approx(3600 * rate, rel=0.35)


@pytest.mark.parametrize("paces", [[2.0, 1.0, 4.0], [4.0, 1.0, 2.0], [1.0, 0.5, 1.0, 2.0]])
def test_a_leak_that_follows_an_uneven_step_rate_is_a_leak(paces: list[float]) -> None:
    """Memory kept per step, with the step rate halving and doubling: the pace of the rise
    changes, the rise never stops."""
    for seed in range(20):
        rng = random.Random(seed)
        t = times(91)
        trend = judge(t, uneven_leak(rng, t, [p * 3 * MiB for p in paces]))
        assert trend.verdict == "leak", (seed, paces, trend)


def test_a_leak_that_stopped_is_no_longer_a_leak() -> None:
    """Rising for the first half, then flat: memory is no longer rising at the end."""
    for seed in range(20):
        rng = random.Random(seed)
        t = times(121)
        values = [BASE + 8 * MiB * min(ti, 60.0) + rng.gauss(0, 8 * MiB) for ti in t]
        assert judge(t, values).verdict != "leak", seed


def test_a_ramp_of_steps_that_plateaus_is_no_leak() -> None:
    """Four 160 MiB steps in the first 40 % of the run, then flat (a caching allocator)."""
    for seed in range(20):
        rng = random.Random(seed)
        t = times(121)
        values = [BASE + 160 * MiB * min(4, int(ti / 12)) + rng.gauss(0, 8 * MiB) for ti in t]
        assert judge(t, values).verdict != "leak", seed


def test_a_leak_below_the_floors_is_stable() -> None:
    """10 MiB over ten minutes is a confident rise but below 64 MiB: not a leak."""
    t = times(600)
    trend = judge(t, [BASE + 10 * MiB * ti / 600 for ti in t])
    assert trend.verdict == "stable"


def test_too_few_samples_are_inconclusive() -> None:
    trend = judge([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert trend.verdict == "inconclusive"
    assert trend.slope_per_hour is None


def test_readings_sharing_a_few_times_are_not_judged_never_an_error() -> None:
    """nvidia-smi stamping whole seconds, sampled every 0.1 s: after the warm-up, 40 readings
    at two distinct times.  Too few distinct times to judge: ``inconclusive``, never the
    estimator's ``ValueError`` (which ended such soaks as ``error``)."""
    t = [100.0] * 20 + [101.0] * 20
    trend = judge(t, [21354.0 * MiB] * 40, warm_up_seconds=0)
    assert trend.verdict == "inconclusive"
    assert trend.slope_per_hour is None
    assert "distinct" in trend.reason
    # As the soak folded it: the trainer listed once per iteration sharing the stamp (1 to
    # 10 times), so its GPU memory track holds runs of one time; judged live at each sample.
    watch = TrendWatch()
    watch.configure({"sample_interval_seconds": 0.1})
    proc = {"pid": 42, "name": "python", "rss_bytes": 10**8, "anon_bytes": 10**8}
    app = {"pid": 42, "in_tree": True, "gpu_index": 0, "used_gpu_memory_mib": 21354}
    for i in range(140):
        watch.add_sample(
            i / 10, cast(events.SampleJson, {"tree": {"processes": 1}, "processes": [proc]})
        )
        gpus: Any = {
            "gpus": [{"index": 0, "memory_used_mib": 21354}],
            "processes": [app] * (1 + i % 10),
        }
        watch.add_gpu_sample(i / 10 + 0.05, gpus)
        trends = watch.evaluate(lambda _: None, live=True)
        assert all(entry["verdict"] != "leak" for entry in trends.values())


def test_an_explicit_warm_up_hides_a_long_ramp() -> None:
    """A ramp over the first 300 s of 600: without a warm-up it may look like growth; with
    warm_up_seconds=300 only the plateau is judged."""
    t = times(600)
    values = [BASE + 500 * MiB * min(1.0, ti / 300) for ti in t]
    assert judge(t, values, warm_up_seconds=300).verdict == "stable"


def test_free_disk_falling_is_judged_downwards() -> None:
    """direction="down": a filling disk is a confident fall with a projected time to zero."""
    t = times(300)
    free = [10 * GiB - 10 * MiB * ti for ti in t]
    trend = judge(t, free, direction="down")
    assert trend.verdict == "leak"
    assert trend.slope_per_hour == pytest.approx(-36000 * MiB, rel=0.01)
    seconds = trend.seconds_to(0)
    assert trend.last is not None
    assert seconds == pytest.approx(trend.last / (10 * MiB), rel=0.01)


def test_default_warm_up_is_a_tenth_at_most_ten_minutes_at_least_three_samples() -> None:
    assert default_warm_up(times(1000)) == pytest.approx(99.9)
    assert default_warm_up(times(100_000)) == 600.0
    assert default_warm_up(times(10)) == 3.0


def test_progress_slowing_compares_the_last_quarter_with_the_first() -> None:
    t = [float(i) for i in range(40)]
    assert progress_slowing(t, [60.0] * 20 + [10.0] * 20) == (60.0, 10.0)
    assert progress_slowing(t, [60.0] * 40) is None
    assert progress_slowing(t[:4], [60.0, 60.0, 1.0, 1.0]) is None  # too few points


def test_the_leak_sentence_reads_as_people_say_it() -> None:
    """The exact form of the warning on stderr."""
    text = describe_growth("memory of pid 29987 (python)", "bytes", GiB, 70, GiB / 70 * 3600)
    assert text == "memory of pid 29987 (python) grew 1.0 GiB in 1m10s (+0.9 GiB/min)"
    assert format_bytes(512 * MiB) == "512.0 MiB"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MiB", 512 * MiB),
        ("2GiB", 2 * GiB),
        ("1.5G", int(1.5 * GiB)),
        ("1048576", 1048576),
        ("64 mb", 64 * MiB),
        ("3k", 3072),
        ("10B", 10),
    ],
)
def test_sizes_parse_as_written(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-0.2, "0.0s"),
        (12.34, "12.3s"),
        (70, "1m10s"),
        (600, "10m00s"),
        (3600, "1h00m00s"),
        (7385, "2h03m05s"),
        (93784, "1d02h03m"),
    ],
)
def test_durations_read_the_same_everywhere(seconds: float, text: str) -> None:
    """One duration format for views, tables and messages: tenths under a minute, then
    minutes and seconds, hours, days."""
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["-1G", "nan", "NaN", "5XB", "", "1.5.2G", "GiB", "inf", "1e400"])
def test_bad_sizes_are_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="max_rss") as info:
        parse_size(text, name="max_rss")
    assert repr(text) in str(info.value)


def test_size_keywords_take_ints_and_strings_and_refuse_the_rest() -> None:
    assert check_size("m", None) is None
    assert check_size("m", 5) == 5
    assert check_size("m", "1KiB") == 1024
    with pytest.raises(ValueError, match="zero or more"):
        check_size("m", -1)
    with pytest.raises(ValueError, match="finite"):
        check_size("m", math.nan)
    with pytest.raises(TypeError):
        check_size("m", True)


TRACEBACK = """\
step 199
Traceback (most recent call last):
  File "/work/hf_train.py", line 40, in <module>
    main()
  File "/work/hf_train.py", line 28, in on_step_end
    raise RuntimeError(f"injected crash at step {step}")
RuntimeError: injected crash at step 200
"""


def test_the_last_traceback_gives_type_message_and_raising_frame() -> None:
    cause = find_exception(TRACEBACK)
    assert cause is not None
    assert (cause.type, cause.message, cause.where, cause.kind) == (
        "RuntimeError",
        "injected crash at step 200",
        "hf_train.py:28",
        "python",
    )
    assert describe_crash(cause) == "RuntimeError: injected crash at step 200 (hf_train.py:28)"


def test_a_chained_traceback_reports_the_last_exception() -> None:
    text = (
        TRACEBACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + 'Traceback (most recent call last):\n  File "x.py", line 3, in f\n    g()\n'
        + "KeyError: 'lr'\n"
    )
    cause = find_exception(text)
    assert cause is not None
    assert (cause.type, cause.where) == ("KeyError", "x.py:3")


def test_launcher_prefixes_and_cuda_out_of_memory() -> None:
    """torchrun prefixes each rank's lines; another rank's lines interleave."""
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/t/train.py", line 12, in step\n'
        "[rank0]:     loss.backward()\n"
        "[rank1]: step 7\n"
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    cause = find_exception(text)
    assert cause is not None
    assert (cause.type, cause.where, cause.kind) == (
        "torch.OutOfMemoryError",
        "train.py:12",
        "cuda_oom",
    )


def test_nccl_errors_and_a_shells_killed_without_a_traceback() -> None:
    nccl = find_exception("x\nNCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    assert nccl is not None
    assert nccl.kind == "nccl"
    killed = find_exception("epoch 3\nbash: line 1: 4242 Killed    python train.py\n")
    assert killed is not None
    assert killed.kind == "killed"
    assert describe_crash(killed).startswith("Killed")
    for line in ("Killed", 'bash: 24430 Killed                  python3 -c "..."'):
        cause = find_exception(f"epoch 3\n{line}\n")
        assert cause is not None
        assert cause.kind == "killed"
    assert find_exception("all good\nbye\n") is None


def _torchrun_sample(
    processes: list[list[int | None]], fds: int, threads: int
) -> events.SampleJson:
    """A sample event of the recorded torchrun job: its processes and their tree (only what the
    trends read)."""
    sample: dict[str, Any] = {
        "tree": {
            "processes": len(processes),
            "anon_bytes": sum(p[1] or 0 for p in processes),
            "rss_bytes": sum(p[2] or 0 for p in processes),
            "fds": fds,
            "threads": threads,
        },
        "processes": [
            {
                "pid": pid,
                "name": "python",
                "state": "sleeping",
                "anon_bytes": anon,
                "rss_bytes": rss,
                "threads": count,
                "fds": files,
            }
            for pid, anon, rss, count, files in processes
        ],
    }
    return cast(events.SampleJson, sample)


def test_the_start_up_ramp_of_ranks_born_late_is_no_leak_live() -> None:
    """A real torchrun job (tests/fixtures/torchrun/startup_ramp.json): its ranks are born 5 s
    in and ramp for 5 s more (torch's import, the process group); judged live after every
    sample, no series is ever called a leak."""
    recorded = json.loads((FIXTURES / "torchrun" / "startup_ramp.json").read_text())
    watch = TrendWatch()
    watch.configure({"sample_interval_seconds": recorded["interval"]})
    calls = []
    for t, processes, fds, threads in recorded["samples"]:
        watch.add_sample(t, _torchrun_sample(processes, fds, threads))
        trends = watch.evaluate(lambda _: None, live=True)
        calls += [(t, key) for key, entry in trends.items() if entry["verdict"] == "leak"]
    assert calls == []


def _leaking_watch(interval: float, duration: float) -> TrendWatch:
    """The trends of a tree leaking 10 MiB/s, sampled every ``interval`` for ``duration``."""
    watch = TrendWatch()
    watch.configure({"sample_interval_seconds": interval})
    t = 0.0
    while t <= duration:
        memory = 64 * MiB + 10 * MiB * t
        sample = {"tree": {"processes": 1, "anon_bytes": memory, "rss_bytes": memory}}
        watch.add_sample(t, cast(events.SampleJson, sample))
        t += interval
    return watch


def test_a_leak_check_that_cannot_judge_says_how_much_memory_grew_and_what_to_change() -> None:
    """A 40 s run leaking 10 MiB/s at the default 5 s interval has too few samples after the
    warm-up to be judged: said with how much the judged memory grew after the warm-up and
    what to change; the same leak sampled every second for 60 s is judged (no such words)."""
    trends = _leaking_watch(5.0, 40.0).evaluate(lambda _: None)
    text = memory_not_judged(trends)
    assert text is not None
    grown = re.fullmatch(
        r"the leak check could not judge: memory grew ([\d.]+) MiB after the warm-up in "
        r"\d+ samples \(12 needed\); shorten --sample-interval or run longer",
        text,
    )
    assert grown is not None, text
    assert 200 <= float(grown.group(1)) <= 400
    assert memory_not_judged({}) is not None  # too short a run to sample at all
    assert memory_not_judged(_leaking_watch(1.0, 60.0).evaluate(lambda _: None)) is None


def test_a_leak_check_not_judged_for_another_reason_says_that_reason() -> None:
    """Samples enough but not to fit a slope to (their times repeat): the words say why, not
    to shorten the interval or run longer, which would not help."""
    trends = _leaking_watch(5.0, 40.0).evaluate(lambda _: None)
    key = next(k for k, _ in TREE_MEMORY_SERIES if k in trends)
    reason = "too few distinct sample times after the warm-up (3)"
    text = memory_not_judged({key: {**trends[key], "samples": 40, "reason": reason}})
    assert text is not None
    assert text.endswith(f"not judged: {reason}"), text
    assert "--sample-interval" not in text


def test_a_stalls_busy_or_idle_comes_from_enough_samples_and_agrees_with_the_dump() -> None:
    """Two samples of a sleeping tree, the first taken as it started up (runnable), say
    nothing of its activity; three (two of the stall) say idle.  A busy verdict that the stack
    dump contradicts (every process asleep, py-spy's threads idle) is withdrawn, and a running
    process keeps it."""
    watch = TrendWatch()
    watch.configure({"sample_interval_seconds": 1.0})
    for t, state in enumerate(("running", "sleeping", "sleeping", "sleeping")):
        process = {"pid": 7, "name": "python", "state": state}
        sample = {"tree": {"processes": 1, "cpu_percent": 0.2}, "processes": [process]}
        watch.add_sample(float(t), cast(events.SampleJson, sample))
        if t == 1:
            assert watch.activity()["tree"] == "unknown"
            assert describe_activity(watch.activity()) is None
    assert watch.activity()["tree"] == "idle"
    busy = {"tree": "busy", "cpu_percent": 0.2, "running_share": 0.5, "gpus": []}
    asleep = {"state": "sleeping", "python_stack": {"stack": "Thread 7 (idle)\n"}}
    assert agreeing(busy, [asleep])["tree"] == "unknown"
    assert agreeing(busy, [asleep, {"state": "running"}]) == busy
    assert agreeing(busy, []) == busy


@pytest.mark.parametrize(
    ("cpu", "share", "verdict"),
    [
        (25.0, 0.0, "busy"),  # computing
        (6.0, 1.0, "busy"),  # a spinner starved of cores on a loaded machine
        (0.4, 0.6, "idle"),  # a waiting trainer's bursts, stretched by a loaded machine
        (0.3, 1.0, "idle"),  # runnable but given no CPU at all: it computed nothing
        (5.0, 0.5, "idle"),
    ],
)
def test_a_stalled_trees_verdict_from_its_cpu_and_runnable_share(
    cpu: float, share: float, verdict: str
) -> None:
    assert tree_verdict(cpu, running_share=share) == verdict


def test_figures_given_again_fold_as_copies_of_them_do() -> None:
    """A sleeping process's figures, the same object at every live sample, fold as the
    copies a journal gives back do: same records, series and floors."""
    from asyncsoak._analysis._trendfold import TrendFold

    def process(pid: int, rss: int, cpu: float | None) -> dict[str, Any]:
        return {"pid": pid, "name": "w", "state": "sleeping", "rss_bytes": rss,
                "anon_bytes": rss // 2, "cpu_percent": cpu, "threads": 1}  # fmt: skip

    asleep = process(2, 8 * MiB, 0.0)
    # Long enough for the series to halve (200 points), with a GPU figure moving between.
    steps = [[process(2, 8 * MiB, None)]] + [[asleep]] * 450 + [[process(2, 9 * MiB, 3.0)]]
    live, replayed = TrendFold(), TrendFold()
    points = set()
    for t, processes in enumerate(steps):
        tree = {"processes": 1, "rss_bytes": 8 * MiB}
        for fold in (live, replayed):
            if t in (150, 300):
                gpu = {"pid": 2, "in_tree": True, "used_gpu_memory_mib": t, "gpu_index": 0}
                fold.add_gpu_sample(t - 0.5, cast(events.GpuSampleJson, {"processes": [gpu]}))
        live.add_sample(float(t), cast(events.SampleJson, {"tree": tree, "processes": processes}))
        copies = [dict(p) for p in processes]
        replayed.add_sample(float(t), cast(events.SampleJson, {"tree": tree, "processes": copies}))
        points.add(id(live.processes[2].point))
    assert live.processes[2].to_json() == replayed.processes[2].to_json()
    live_rss, replayed_rss = live.processes[2].rss, replayed.processes[2].rss
    assert live_rss is not None
    assert replayed_rss is not None
    assert live_rss.floors.to_json() == replayed_rss.floors.to_json()
    assert live.processes[2].cpu_count == len(steps) - 1
    # No point built per sample while asleep: one per change of figures (and of GPU memory).
    assert len(points) <= 5
