"""The trend estimator: is a series (memory, open files, free disk) rising for good?  Pure
functions, so every view judges alike (the method: docs/architecture.md, "Trends")."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

from .._contract import format_duration

Verdict = Literal["leak", "stable", "inconclusive"]
Direction = Literal["up", "down"]

#: Two-sided 99 % normal quantile: the interval's lower bound is a 0.5 % one-sided test.
Z_99 = 2.5758293035489
#: Growth floors per unit, (absolute, relative to the first window's value).
FLOORS: dict[str, tuple[float, float]] = {
    "bytes": (64 * 2**20, 0.10),
    "count": (8.0, 0.25),
}
#: The default warm-up: 10 % of the span, at most this long, at least three samples.
WARM_UP_MAX_SECONDS = 600.0
#: Windows of the analysed span: at most MAX_WINDOWS (the fit is quadratic in windows), at
#: least MIN_WINDOWS of SAMPLES_PER_WINDOW samples, or the verdict is ``inconclusive``.
MAX_WINDOWS = 24
MIN_WINDOWS = 6
SAMPLES_PER_WINDOW = 2
#: The recent parts tried, longest first, when the whole span is no leak.
RECENT_FRACTIONS = (0.75, 0.5, 0.375, 0.25)


class Trend(NamedTuple):
    """The judgement of one series: slopes per hour in its unit, ``growth`` over the judged span,
    ``first`` and ``last`` its first and last window's floor (sample, when too few), ``onset``
    where the judged rise starts, ``reason`` why, for people."""

    verdict: Verdict
    span_seconds: float
    samples: int
    reason: str
    analysed_from: float | None
    first: float | None
    last: float | None
    slope_per_hour: float | None = None
    slope_interval_per_hour: tuple[float, float] | None = None
    growth: float | None = None
    windows: int = 0
    onset: float | None = None

    def seconds_to(self, limit: float) -> float | None:
        """Projected seconds from ``last`` until the series reaches ``limit`` at this slope."""
        if self.slope_per_hour is None or self.last is None or self.slope_per_hour == 0:
            return None
        remaining = (limit - self.last) / (self.slope_per_hour / 3600.0)
        return remaining if 0 <= remaining < math.inf else None


def default_warm_up(t: Sequence[float]) -> float:
    """Seconds of warm-up skipped by default for samples at times ``t`` (sorted)."""
    if not t:
        return 0.0
    span = t[-1] - t[0]
    warm = min(WARM_UP_MAX_SECONDS, 0.10 * span)
    if len(t) > 3:
        warm = max(warm, t[3] - t[0])
    return warm


def windowed_minima(
    t: Sequence[float], values: Sequence[float | None], *, windows: int
) -> tuple[list[float], list[float]]:
    """The minimum of each of ``windows`` equal windows over ``t``'s span, at window centres;
    non-finite points are skipped and an empty window is left out."""
    if windows < 1:
        raise ValueError("windows must be at least 1")
    pairs = _finite(t, values)
    if not pairs:
        return [], []
    start, end = min(pairs)[0], max(pairs)[0]
    width = (end - start) / windows
    mins: list[float | None] = [None] * windows
    for ti, v in pairs:
        i = windows - 1 if width <= 0 else min(windows - 1, int((ti - start) / width))
        if (m := mins[i]) is None or v < m:
            mins[i] = v
    kept = [(start + (i + 0.5) * width, m) for i, m in enumerate(mins) if m is not None]
    return [ti for ti, _ in kept], [m for _, m in kept]


def theil_sen(
    t: Sequence[float], values: Sequence[float], *, z: float = Z_99
) -> tuple[float, float, float]:
    """Theil-Sen slope per unit of ``t`` and Sen's confidence interval: ``(slope, lo, hi)``
    (the ranks ``(N -+ z*s)/2`` of the sorted pairwise slopes, ``s**2 = n(n-1)(2n+5)/18``).
    Fewer than two distinct finite times is a ``ValueError``."""
    if len(t) != len(values):
        raise ValueError("t and values must have the same length")
    points = _finite(t, values)
    t, values = [p[0] for p in points], [p[1] for p in points]
    n = len(t)
    slopes = sorted(
        (values[j] - values[i]) / (t[j] - t[i])
        for i in range(n)
        for j in range(i + 1, n)
        if t[j] != t[i]
    )
    if not slopes:
        raise ValueError("theil_sen needs at least two distinct times")
    count, slope = len(slopes), median(slopes)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    lo_rank = max(0, math.floor((count - c) / 2))
    hi_rank = min(count - 1, math.ceil((count + c) / 2))
    return slope, slopes[lo_rank], slopes[hi_rank]


def estimate_trend(
    t: Sequence[float],
    values: Sequence[float | None],
    *,
    min_growth: float,
    min_ratio: float,
    warm_up_seconds: float | None = None,
    direction: Direction = "up",
) -> Trend:
    """Judge one series (``direction="down"``: one whose fall matters, free disk); every
    figure is finite, and a series that cannot be judged is ``inconclusive``."""
    sign = 1.0 if direction == "up" else -1.0
    pairs = sorted((ti, sign * v) for ti, v in _finite(t, values))
    times = [p[0] for p in pairs]
    if warm_up_seconds is None:
        warm_up_seconds = default_warm_up(times)
    start = times[0] + warm_up_seconds if times else 0.0
    analysed = [p for p in pairs if p[0] >= start]
    trend = _judge_span(analysed, min_growth=min_growth, min_ratio=min_ratio)
    if trend.verdict != "leak" and analysed:
        # A leak that started late: judged over the recent part where it runs.
        end = analysed[-1][0]
        span = end - analysed[0][0]
        for fraction in RECENT_FRACTIONS:
            cut = end - fraction * span
            recent = [p for p in analysed if p[0] >= cut]
            if len(recent) < 12:
                break
            # Stricter, as several parts are tried: a 99.9 % interval, clear of the noise.
            part = _judge_span(
                recent, min_growth=min_growth, min_ratio=min_ratio, z=3.2905267314919, noise=20.0
            )
            if part.verdict == "leak":
                # Growth, slope and span are the recent part's: what the leak did.
                trend = part._replace(
                    analysed_from=trend.analysed_from,
                    reason="the floor rose steadily through the last "
                    f"{format_duration(part.span_seconds)} of the analysed span",
                )
                break
    if sign < 0:
        interval = trend.slope_interval_per_hour
        trend = trend._replace(
            slope_per_hour=_negated(trend.slope_per_hour),
            slope_interval_per_hour=None if interval is None else (-interval[1], -interval[0]),
            growth=_negated(trend.growth),
            first=_negated(trend.first),
            last=_negated(trend.last),
        )
    return trend


def _negated(value: float | None) -> float | None:
    return None if value is None else -value


def _judge_span(
    analysed: Sequence[tuple[float, float]],
    *,
    min_growth: float,
    min_ratio: float,
    z: float = Z_99,
    noise: float = 0.0,
) -> Trend:
    """Judge the ``analysed`` (time, value) pairs as one span, rising = up."""
    samples = len(analysed)
    span = analysed[-1][0] - analysed[0][0] if analysed else 0.0
    windows = min(MAX_WINDOWS, samples // SAMPLES_PER_WINDOW)
    if windows < MIN_WINDOWS or not 0 < span < math.inf:
        return _not_judged(analysed, span, f"too few samples after the warm-up ({samples})")
    wt, wv = windowed_minima([p[0] for p in analysed], [p[1] for p in analysed], windows=windows)
    if len(wt) < MIN_WINDOWS:
        # Readings that share a few times (a clock in whole seconds) leave most windows empty.
        return _not_judged(
            analysed, span, f"too few distinct sample times after the warm-up ({len(wt)})"
        )
    slope, lo, hi = theil_sen(wt, wv, z=z)
    growth = slope * span
    if not all(math.isfinite(x) for x in (slope * 3600.0, lo * 3600.0, hi * 3600.0, growth)):
        return _not_judged(analysed, span, "values too large to fit a slope to")
    first, last = wv[0], wv[-1]
    # Each third must rise too: a ramp or a one-time step rises in one or two, never three.
    third = len(wt) / 3
    cuts = [0, round(third), round(2 * third), len(wt)]
    part_slopes = [theil_sen(wt[a : b + 1], wv[a : b + 1])[0] for a, b in itertools.pairwise(cuts)]
    floor = max(min_growth, min_ratio * abs(first))
    verdict: Verdict
    if lo > 0 and min(growth, last - first) >= floor:
        if min(part_slopes) >= 0.5 * slope and _clear_of_noise(wt, wv, slope, growth, noise):
            verdict, reason = "leak", "the floor rose steadily through the analysed span"
        else:
            verdict, reason = "stable", "the rise is confined to part of the span (a step or ramp)"
    elif lo > 0:
        verdict, reason = "stable", "rising, but by less than the growth floors"
    elif hi * span >= floor:
        verdict, reason = "inconclusive", "too noisy to rule out a rise above the floors"
    else:
        verdict, reason = "stable", "no rise of the floor"
    return Trend(
        verdict=verdict,
        slope_per_hour=slope * 3600.0,
        slope_interval_per_hour=(lo * 3600.0, hi * 3600.0),
        growth=growth,
        span_seconds=span,
        analysed_from=analysed[0][0],
        first=first,
        last=last,
        samples=samples,
        windows=len(wt),
        reason=reason,
        onset=analysed[0][0],
    )


def _finite(t: Sequence[float], values: Sequence[float | None]) -> list[tuple[float, float]]:
    """The (time, value) points whose time and value are both finite numbers."""
    return [
        (ti, v)
        for ti, v in zip(t, values, strict=True)
        if v is not None and math.isfinite(ti) and math.isfinite(v)
    ]


def _not_judged(analysed: Sequence[tuple[float, float]], span: float, reason: str) -> Trend:
    """The ``inconclusive`` verdict of a span that cannot be judged, saying why."""
    return Trend(
        verdict="inconclusive",
        span_seconds=span if math.isfinite(span) else 0.0,
        samples=len(analysed),
        reason=reason,
        analysed_from=analysed[0][0] if analysed else None,
        first=analysed[0][1] if analysed else None,
        last=analysed[-1][1] if analysed else None,
    )


def _clear_of_noise(
    wt: Sequence[float], wv: Sequence[float], slope: float, growth: float, ratio: float
) -> bool:
    """Whether the growth stands ``ratio`` times above the minima's scatter around the fit (a
    slow wander can fit a confident slope; a leak's floor hugs its line)."""
    intercept = median([v - slope * ti for ti, v in zip(wt, wv, strict=True)])
    residuals = [abs(v - slope * ti - intercept) for ti, v in zip(wt, wv, strict=True)]
    scatter = 1.4826 * median(residuals)  # the median absolute residual as a deviation
    return growth >= ratio * scatter


def progress_slowing(
    t: Sequence[float], rates: Sequence[float | None], *, analysed_from: float | None = None
) -> tuple[float, float] | None:
    """``(first quarter's median, last quarter's median)`` of the analysed span when the last
    is below half the first (two points in each at least), else None."""
    pairs = [
        (ti, r)
        for ti, r in sorted(_finite(t, rates))
        if analysed_from is None or ti >= analysed_from
    ]
    if len(pairs) < 8:
        return None
    start, end = pairs[0][0], pairs[-1][0]
    quarter = (end - start) / 4
    head = [r for ti, r in pairs if ti <= start + quarter]
    tail = [r for ti, r in pairs if ti >= end - quarter]
    if len(head) < 2 or len(tail) < 2:
        return None
    before, after = median(head), median(tail)
    if before > 0 and after < before / 2:
        return before, after
    return None


def median(values: Sequence[float]) -> float:
    """The middle value of a non-empty sequence (``statistics`` costs the start-up)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def format_bytes(n: float, *, promote: float = 1.0) -> str:
    """``1.0 GiB``, ``512.0 MiB``, ``-3.0 KiB``; ``promote=0.5`` writes 0.9 GiB, not 921.6 MiB."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 * promote or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_amount(n: float, unit: str) -> str:
    """An amount in a series' unit: bytes in binary units, counts as numbers."""
    if unit == "bytes":
        return format_bytes(n)
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def format_rate(per_hour: float, unit: str) -> str:
    """A slope as people read it: ``+0.9 GiB/min``, ``+2.0/min``, ``+12.0 MiB/h``."""
    sign = "+" if per_hour >= 0 else "-"
    per_minute = abs(per_hour) / 60
    if unit == "bytes":
        if per_minute >= 2**20:
            return f"{sign}{format_bytes(per_minute, promote=0.5)}/min"
        return f"{sign}{format_bytes(abs(per_hour), promote=0.5)}/h"
    if per_minute >= 1:
        return f"{sign}{per_minute:.1f}/min"
    return f"{sign}{abs(per_hour):.1f}/h"


def describe_growth(label: str, unit: str, growth: float, span: float, per_hour: float) -> str:
    """``memory of pid 29987 (python) grew 1.0 GiB in 70 s (+0.9 GiB/min)``."""
    verb = "grew" if growth >= 0 else "fell"
    return (
        f"{label} {verb} {format_amount(abs(growth), unit)} in {format_duration(span)} "
        f"({format_rate(per_hour, unit)})"
    )
