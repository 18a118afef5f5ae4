"""Trends: how soon a leak is caught, how often a stable series is called one, what it costs.

    python -m benchmarks --only trends      (or: python -m benchmarks.trends)

Nothing waits for wall time: series are simulated at a 1 s interval and fed to the soak's own
trend fold (``TrendWatch``, as the serializer feeds it) and estimator, judged as the running
soak judges them (every ``TREND_EVERY_INTERVALS`` samples, with the live warm-up).

1. Time to detect a leak of 1 MiB/s on a 1 GiB process at 1 s samples (target: within 3 min),
   over 20 seeds, against the earliest a leak *could* be called: the live warm-up plus the time
   the growth takes to clear the floors (10 % of 1 GiB).
2. The stable shapes of ``tests/trend_shapes.py`` (flat noise, spikes, warm-up ramp then
   plateau, sawtooth, one-time step, slow wander, periodic swing) judged live, every 5 s
   through the run, for context: a warm-up ramp is growth until it plateaus, and the live
   judgement waits out a longer warm-up for that reason.  Whether a shape is flagged at the
   end, leaks and stable shapes alike, is the leak corpus's table (``leak_corpus.py``).
3. CPU of the trend evaluation over a day of samples (86,400 samples of a 10-process tree),
   as a share of the monitor's own CPU at a 1 s interval (target: under 5 %): the monitor's
   reference is, in the same run, what one sample costs it anyway (a real ``ProcSampler.read``
   of a 10-process tree, its journal line and the artifact fold).
"""

from __future__ import annotations

import random
import statistics
import time

from asyncsoak._analysis._trends import FLOORS
from asyncsoak._analysis._trendwatch import LIVE_WARM_UP_INTERVALS, TrendWatch
from asyncsoak._contract import events
from asyncsoak._contract._vocabulary import EventKind
from asyncsoak._record._artifact import RunState
from asyncsoak._record._serializer import journal_line
from asyncsoak._sampling._proc_sampler import ProcSampler
from asyncsoak._supervisor._judge import TREND_EVERY_INTERVALS, TREND_LAG_FRACTION
from benchmarks._common import Figure, Section
from benchmarks.proc_sampling import sleeping_tree
from tests.trend_shapes import BASE, STABLE, GiB, MiB, times

INTERVAL = 1.0
DAY = 86_400
TARGET_DETECT_SECONDS = 180.0
TARGET_COST_SHARE = 5.0
LEAK_PID = 29987


def sample(t: float, rss: float, others: int = 0) -> events.SampleJson:
    """A process sample as the journal holds it: the leaking process (and ``others``)."""
    processes = [
        {
            "pid": LEAK_PID,
            "name": "python",
            "state": "sleeping",
            "cpu_percent": 95.0,
            "rss_bytes": int(rss),
            "threads": 12,
        }
    ] + [
        {
            "pid": LEAK_PID + 1 + i,
            "name": "pt_data_worker",
            "state": "sleeping",
            "cpu_percent": 3.0,
            "rss_bytes": 419 * MiB,
            "threads": 4,
        }
        for i in range(others)
    ]
    return {
        "t": t,
        "kind": EventKind.SAMPLE,
        "root_pid": LEAK_PID,
        "tree": {
            "processes": len(processes),
            "cpu_percent": 100.0,
            "rss_bytes": sum(p["rss_bytes"] for p in processes),
            "threads": sum(p["threads"] for p in processes),
            "fds": 40,
        },
        "processes": processes,
        "machine": {"memory_used_bytes": 40 * GiB},
        "disks": {"output": {"path": "/data", "free_bytes": 500 * GiB}},
    }


def watch() -> TrendWatch:
    tw = TrendWatch()
    tw.configure({"sample_interval_seconds": INTERVAL})
    tw.add_limits(
        {
            "t": 0.0,
            "kind": EventKind.LIMITS,
            "memory_total_bytes": 64 * GiB,
            "cgroup_memory_max_bytes": None,
            "disk_total_bytes": {"output": 2**40},
        }
    )
    return tw


def detection_time(seed: int, per_second: float = MiB, horizon: float = 600.0) -> float | None:
    rng = random.Random(seed)
    tw = watch()
    every = TREND_EVERY_INTERVALS * INTERVAL
    next_judgement = every
    for i in range(int(horizon / INTERVAL)):
        t = i * INTERVAL
        rss = GiB + per_second * t + 30 * MiB * ((t % 17) / 17) + rng.gauss(0, 8 * MiB)
        tw.add_sample(t, sample(t, rss, others=2))
        if t >= next_judgement:
            next_judgement = t + max(every, t * TREND_LAG_FRACTION)
            entry = tw.evaluate(lambda _: None, live=True).get(f"process.{LEAK_PID}.rss_bytes")
            if entry is not None and entry["verdict"] == "leak":
                return t
    return None


def false_leaks_live(shape: str, runs: int, samples: int = 600) -> int:
    leaks = 0
    every = TREND_EVERY_INTERVALS
    for seed in range(runs):
        rng = random.Random(seed)
        t = times(samples)
        values = STABLE[shape](rng, t)
        tw = watch()
        for i, (ti, v) in enumerate(zip(t, values, strict=True)):
            tw.add_sample(ti, sample(ti, v))
            if i and i % every == 0:
                entry = tw.evaluate(lambda _: None, live=True).get(f"process.{LEAK_PID}.rss_bytes")
                if entry is not None and entry["verdict"] == "leak":
                    leaks += 1
                    break
    return leaks


def evaluation_cost(quick: bool) -> tuple[float, float, float]:
    """(seconds per evaluation, fold seconds per sample) after a day of samples; and the
    seconds one sample costs the monitor otherwise."""
    tw = watch()
    rng = random.Random(0)
    started = time.process_time()
    for i in range(DAY):
        tw.add_sample(float(i), sample(float(i), BASE + rng.gauss(0, 8 * MiB), others=9))
    fold = (time.process_time() - started) / DAY
    runs = 5 if quick else 20
    costs = []
    for _ in range(runs):
        started = time.process_time()
        tw.evaluate(lambda _: None, live=True)
        costs.append(time.process_time() - started)
    # The reference: what one sample costs the monitor (read, journal line, the artifact's
    # fold, trend fold included), on a real tree of 10 processes.
    reference = []
    with sleeping_tree(9) as root:
        sampler = ProcSampler(root)
        builder = RunState()
        for i in range(60 if quick else 300):
            began = time.process_time()
            event = sampler.read(float(i))
            assert event is not None
            _, data = journal_line(event)
            builder.add(data)
            reference.append(time.process_time() - began)
    return statistics.median(costs), fold, statistics.median(reference)


def day_judgements() -> int:
    """How many times the running soak judges its trends over a day at 1 s."""
    every = TREND_EVERY_INTERVALS * INTERVAL
    t, count = every, 0
    while t <= DAY:
        count += 1
        t += max(every, t * TREND_LAG_FRACTION)
    return count


def run(quick: bool = False) -> Section:
    started = time.monotonic()
    section = Section("trends", "13. Trends")
    seeds = range(5 if quick else 20)
    found = [detection_time(seed) for seed in seeds]
    caught = [f for f in found if f is not None]
    floor_seconds = LIVE_WARM_UP_INTERVALS * INTERVAL + FLOORS["bytes"][1] * GiB / MiB
    worst = max(caught) if len(caught) == len(found) else float("inf")
    section.add(
        Figure(
            "1 MiB/s leak on 1 GiB at 1 s: time to flag (median)",
            statistics.median(caught) if caught else float("inf"),
            "s",
            reference=f"earliest possible {floor_seconds:.0f} s",
            ratio=(statistics.median(caught) / floor_seconds) if caught else None,
        )
    )
    section.add(
        Figure(
            f"1 MiB/s leak on 1 GiB at 1 s: time to flag (worst of {len(found)})",
            worst,
            "s",
            target=f"<= {TARGET_DETECT_SECONDS:.0f} s",
            met=worst <= TARGET_DETECT_SECONDS,
        )
    )
    live_runs = 20 if quick else 100
    for shape in sorted(STABLE):
        section.add(
            Figure(
                f"live rises (trend event, no warning) in 10 min: {shape} ({live_runs} runs)",
                false_leaks_live(shape, live_runs),
                "runs",
            )
        )
    per_evaluation, fold, reference = evaluation_cost(quick)
    # At the end of a day the soak judges every 2 % of its age (29 min); over the whole day,
    # the evaluations are spread evenly in log time: sum over judgements / the day.
    judgements = day_judgements()
    evaluations_per_second = judgements / DAY
    trend_per_second = per_evaluation * evaluations_per_second
    # The reference sample already includes the trend fold; the evaluations come on top.
    monitor_per_second = reference / INTERVAL + trend_per_second
    share = 100 * trend_per_second / monitor_per_second
    section.add(Figure("one evaluation after a day of samples", per_evaluation * 1e3, "ms"))
    section.add(Figure("evaluations over a day at 1 s", judgements, "evaluations"))
    section.add(
        Figure(
            "trend fold per sample (10 processes), share of the monitor",
            100 * fold / reference,
            "%",
            reference=f"fold {fold * 1e6:.0f} us per sample",
        )
    )
    section.add(Figure("the monitor per sample (10 processes)", reference * 1e6, "us"))
    section.add(
        Figure(
            "trend evaluations: share of the monitor's CPU at 1 s over a day",
            share,
            "%",
            reference="monitor per second",
            ratio=trend_per_second / monitor_per_second,
            target=f"< {TARGET_COST_SHARE:g} %",
            met=share < TARGET_COST_SHARE,
        )
    )
    section.note(
        f"judged every {TREND_EVERY_INTERVALS} samples, live warm-up {LIVE_WARM_UP_INTERVALS} "
        "samples; CPU medians (process_time)"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
