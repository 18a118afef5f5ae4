"""Synthetic memory series of known ground truth, for the trend estimator's tests and benchmarks.

Each stable shape is something real training does without leaking: noise around a level, a
warm-up ramp that plateaus, a garbage collector's sawtooth, a one-time large allocation, rare
spikes, slow mean-reverting wander, a periodic swing.  ``leak`` adds a constant slope.  Times
are seconds at a fixed interval; every series is drawn from a seeded ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

MiB = 2**20
GiB = 2**30
BASE = 1 * GiB

Shape = Callable[[random.Random, list[float]], list[float]]


def times(samples: int, interval: float = 1.0) -> list[float]:
    return [i * interval for i in range(samples)]


def flat(rng: random.Random, t: list[float]) -> list[float]:
    return [BASE + rng.gauss(0, 8 * MiB) for _ in t]


def spikes(rng: random.Random, t: list[float]) -> list[float]:
    return [
        BASE + rng.gauss(0, 4 * MiB) + (rng.uniform(0, 500 * MiB) if rng.random() < 0.05 else 0)
        for _ in t
    ]


def ramp_plateau(rng: random.Random, t: list[float]) -> list[float]:
    """A warm-up that fills caches over the first 5-40 % of the run, then holds."""
    end = t[-1] * rng.uniform(0.05, 0.4)
    rise = rng.uniform(100, 600) * MiB
    return [BASE + rise * min(1.0, ti / end) + rng.gauss(0, 8 * MiB) for ti in t]


def sawtooth(rng: random.Random, t: list[float]) -> list[float]:
    """Allocate, then free it all: at least four teeth in the run."""
    period = rng.uniform(2, t[-1] / 4)
    height = rng.uniform(100, 600) * MiB
    return [BASE + height * ((ti % period) / period) + rng.gauss(0, 4 * MiB) for ti in t]


def step(rng: random.Random, t: list[float]) -> list[float]:
    """One large allocation, kept: a step anywhere in the run."""
    at = t[-1] * rng.uniform(0.1, 0.9)
    size = rng.uniform(100, 1000) * MiB
    return [BASE + (size if ti >= at else 0) + rng.gauss(0, 8 * MiB) for ti in t]


def wander(rng: random.Random, t: list[float]) -> list[float]:
    """Mean-reverting AR(1) noise (an allocator's slow drift back and forth)."""
    x = 0.0
    out = []
    for _ in t:
        x = 0.95 * x + rng.gauss(0, 10 * MiB)
        out.append(BASE + x)
    return out


def swing(rng: random.Random, t: list[float]) -> list[float]:
    period = rng.uniform(10, max(11.0, t[-1] / 3))
    amplitude = rng.uniform(50, 300) * MiB
    phase = rng.uniform(0, 2 * math.pi)
    return [
        BASE + amplitude * math.sin(2 * math.pi * ti / period + phase) + rng.gauss(0, 4 * MiB)
        for ti in t
    ]


STABLE: dict[str, Shape] = {
    "flat": flat,
    "spikes": spikes,
    "ramp_plateau": ramp_plateau,
    "sawtooth": sawtooth,
    "step": step,
    "wander": wander,
    "swing": swing,
}


def leak(rng: random.Random, t: list[float], bytes_per_second: float) -> list[float]:
    """A steady leak on top of noise and a small sawtooth."""
    return [
        BASE + bytes_per_second * ti + 30 * MiB * ((ti % 17) / 17) + rng.gauss(0, 8 * MiB)
        for ti in t
    ]


def detection_time(
    rng: random.Random,
    bytes_per_second: float,
    *,
    interval: float = 1.0,
    horizon: float = 600.0,
    every: float = 5.0,
) -> float | None:
    """Seconds until the estimator, run every ``every`` seconds on the run so far, says leak."""
    from asyncsoak._analysis._trends import FLOORS, estimate_trend

    t = times(int(horizon / interval) + 1, interval)
    values = leak(rng, t, bytes_per_second)
    min_growth, min_ratio = FLOORS["bytes"]
    step_samples = max(1, int(every / interval))
    for n in range(step_samples, len(t) + 1, step_samples):
        verdict = estimate_trend(t[:n], values[:n], min_growth=min_growth, min_ratio=min_ratio)
        if verdict.verdict == "leak":
            return t[n - 1]
    return None
