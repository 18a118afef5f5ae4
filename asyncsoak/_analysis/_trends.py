"""The trend estimator: is a series (memory, open files, free disk) rising for good?

Pure functions over arrays of times and values: no I/O, no clock, so the live view, the
metrics exporter and the artifact all judge a series the same way, and tests drive it with
synthetic series.

What real training does to memory is noisy: caches fill during a warm-up, a garbage collector
draws a sawtooth, one large allocation makes a step.  None of these is a leak.  The method:

1. Skip the warm-up (by default the first 10 % of the span, at most 10 minutes, at least three
   samples).
2. Cut what is left into equal windows and keep each window's *minimum*: a cache or a sawtooth
   raises the peaks, not the floor; a leak raises the floor.
3. Fit a Theil-Sen slope (the median of the pairwise slopes) to the minima, with Sen's
   rank-based confidence interval.  It shrugs off outliers and assumes no distribution.
4. Call it a leak only when the interval's lower bound is above zero, the growth over the
   analysed span (fitted, and from the first window's minimum to the last's) exceeds both an
   absolute floor and a fraction of the starting value, and every third of the span rises by
   at least half the whole span's slope (a ramp that then plateaus, or a one-time step, does
   not).
5. The question is whether memory is *still* rising, steadily, in the recent past, not
   whether it rose through the whole run: a leak may start at any point.  So when the whole
   span is no leak, the same test runs on its recent parts (the last 3/4, 1/2, 3/8 and 1/4
   of it, each with at least ``MIN_WINDOWS`` windows): the longest that is a leak makes the
   verdict, and its start is the leak's ``onset``.  Every part ends at the end of the span,
   so a ramp or a step that then plateaus is never one: its last third is flat.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .._contract import format_duration

Verdict = Literal["leak", "stable", "inconclusive"]
Direction = Literal["up", "down"]

#: Two-sided 99 % normal quantile: the interval's lower bound is a 0.5 % one-sided test.
Z_99 = 2.5758293035489
#: Growth floors per unit, (absolute, relative to the first window's value).  64 MiB and 10 %
#: for memory: below that a "leak" costs nothing over any soak worth running.  Counts (open
#: files, threads, processes) are small numbers: 8 more and a quarter more.
FLOORS: dict[str, tuple[float, float]] = {
    "bytes": (64 * 2**20, 0.10),
    "count": (8.0, 0.25),
}
#: Warm-up defaults: this fraction of the span, at most ``WARM_UP_MAX_SECONDS``, and never
#: fewer than ``WARM_UP_MIN_SAMPLES`` samples.
WARM_UP_FRACTION = 0.10
WARM_UP_MAX_SECONDS = 600.0
WARM_UP_MIN_SAMPLES = 3
#: Windows of the analysed span: at most this many (the fit is quadratic in windows) ...
MAX_WINDOWS = 24
#: ... and at least this many, of at least ``SAMPLES_PER_WINDOW`` samples each, or the
#: verdict is ``inconclusive``.
MIN_WINDOWS = 6
SAMPLES_PER_WINDOW = 2
#: Each third of the span must rise at least this fraction of the whole span's slope: a
#: plateau rises by nothing.  A leak whose pace follows an uneven step rate (halving, then
#: doubling) may miss it over the whole span, and is found over its recent part (step 5).
PART_SLOPE_RATIO = 0.5
#: The recent parts of the span tried when the whole of it is no leak (see step 5), longest
#: first: a leak that started late is judged over the part where it runs.
RECENT_FRACTIONS = (0.75, 0.5, 0.375, 0.25)
#: A recent part is judged only with at least this many samples ...
RECENT_MIN_SAMPLES = 12
#: ... and more strictly than the whole span, as several parts are tried: a 99.9 % interval
#: (two-sided normal quantile), and each third rising at half the part's slope (a leak that
#: runs through the part rises evenly; a slow wander or one tooth of a long sawtooth does not).
RECENT_Z = 3.2905267314919
RECENT_PART_SLOPE_RATIO = 0.5
#: A recent part's growth is at least this many times the scatter of its floor around the
#: fit (the median absolute residual, as a standard deviation).
RECENT_NOISE_RATIO = 20.0
MAD_TO_SD = 1.4826


@dataclass(frozen=True, slots=True)
class Trend:
    """The judgement of one series.  Slopes are per hour, in the series' unit."""

    verdict: Verdict
    slope_per_hour: float | None
    slope_interval_per_hour: tuple[float, float] | None
    #: Fitted growth over the judged span (the recent part, for a leak found there).
    growth: float | None
    span_seconds: float
    #: Time (same clock as the input) where the analysed span starts.
    analysed_from: float | None
    #: The first and the last window's minimum (maximum for ``direction="down"``).
    first: float | None
    last: float | None
    samples: int
    windows: int
    #: Why: a short sentence for people ("too few samples", "lower bound above zero ...").
    reason: str
    #: Where the judged rise starts: ``analysed_from``, or later for a leak that started in
    #: the recent part of the span (step 5 of the method).
    onset: float | None = None

    def seconds_to(self, limit: float) -> float | None:
        """Projected seconds from ``last`` until the series reaches ``limit`` at this slope."""
        if self.slope_per_hour is None or self.last is None or self.slope_per_hour == 0:
            return None
        per_second = self.slope_per_hour / 3600.0
        remaining = (limit - self.last) / per_second
        return remaining if remaining >= 0 else None


def default_warm_up(t: Sequence[float]) -> float:
    """Seconds of warm-up skipped by default for samples at times ``t`` (sorted)."""
    if not t:
        return 0.0
    span = t[-1] - t[0]
    warm = min(WARM_UP_MAX_SECONDS, WARM_UP_FRACTION * span)
    if len(t) > WARM_UP_MIN_SAMPLES:
        warm = max(warm, t[WARM_UP_MIN_SAMPLES] - t[0])
    return warm


def windowed_minima(
    t: Sequence[float], values: Sequence[float | None], *, windows: int
) -> tuple[list[float], list[float]]:
    """The minimum of each of ``windows`` equal windows over ``t``'s span, at window centres.

    Missing values (None, NaN) are skipped; a window without any value is left out.
    """
    if windows < 1:
        raise ValueError("windows must be at least 1")
    pairs = [(ti, v) for ti, v in zip(t, values, strict=True) if v is not None and v == v]
    if not pairs:
        return [], []
    start, end = pairs[0][0], pairs[-1][0]
    width = (end - start) / windows
    mins: list[float | None] = [None] * windows
    for ti, v in pairs:
        i = windows - 1 if width <= 0 else min(windows - 1, int((ti - start) / width))
        m = mins[i]
        if m is None or v < m:
            mins[i] = v
    out_t: list[float] = []
    out_v: list[float] = []
    for i, m in enumerate(mins):
        if m is not None:
            out_t.append(start + (i + 0.5) * width)
            out_v.append(m)
    return out_t, out_v


def theil_sen(
    t: Sequence[float], values: Sequence[float], *, z: float = Z_99
) -> tuple[float, float, float]:
    """Theil-Sen slope per unit of ``t`` and Sen's confidence interval: ``(slope, lo, hi)``.

    The interval takes the ranks ``(N -+ z*s)/2`` of the ``N`` sorted pairwise slopes, where
    ``s**2 = n(n-1)(2n+5)/18`` is the variance of Kendall's S without ties.
    """
    n = len(t)
    if n != len(values):
        raise ValueError("t and values must have the same length")
    slopes = sorted(
        (values[j] - values[i]) / (t[j] - t[i])
        for i in range(n)
        for j in range(i + 1, n)
        if t[j] != t[i]
    )
    if not slopes:
        raise ValueError("theil_sen needs at least two distinct times")
    count = len(slopes)
    half = count // 2
    slope = slopes[half] if count % 2 else (slopes[half - 1] + slopes[half]) / 2
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
    """Judge one series (``t`` sorted, same clock as ``warm_up_seconds``).

    ``direction="down"`` judges a series whose fall matters (free disk): a "leak" is then a
    confident fall, and ``first``/``last`` are window maxima.
    """
    sign = 1.0 if direction == "up" else -1.0
    pairs = [(ti, sign * v) for ti, v in zip(t, values, strict=True) if v is not None and v == v]
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
            if len(recent) < RECENT_MIN_SAMPLES:
                break
            part = _judge_span(
                recent,
                min_growth=min_growth,
                min_ratio=min_ratio,
                z=RECENT_Z,
                part_slope_ratio=RECENT_PART_SLOPE_RATIO,
                noise_ratio=RECENT_NOISE_RATIO,
            )
            if part.verdict == "leak":
                # Growth, slope and span are the recent part's: what the leak did.
                trend = dataclasses.replace(
                    part,
                    analysed_from=trend.analysed_from,
                    reason="the floor rose steadily through the last "
                    f"{format_duration(part.span_seconds)} of the analysed span",
                )
                break
    if sign < 0 and trend.slope_per_hour is not None:
        assert trend.slope_interval_per_hour is not None
        assert trend.growth is not None
        assert trend.first is not None
        assert trend.last is not None
        lo, hi = trend.slope_interval_per_hour
        trend = dataclasses.replace(
            trend,
            slope_per_hour=-trend.slope_per_hour,
            slope_interval_per_hour=(-hi, -lo),
            growth=-trend.growth,
            first=-trend.first,
            last=-trend.last,
        )
    return trend


def _judge_span(
    analysed: Sequence[tuple[float, float]],
    *,
    min_growth: float,
    min_ratio: float,
    z: float = Z_99,
    part_slope_ratio: float = PART_SLOPE_RATIO,
    noise_ratio: float = 0.0,
) -> Trend:
    """Steps 2 to 4 of the method over ``analysed`` (time, value) pairs, rising = up."""
    samples = len(analysed)
    span = analysed[-1][0] - analysed[0][0] if analysed else 0.0
    windows = min(MAX_WINDOWS, samples // SAMPLES_PER_WINDOW)
    if windows < MIN_WINDOWS or span <= 0:
        return Trend(
            verdict="inconclusive",
            slope_per_hour=None,
            slope_interval_per_hour=None,
            growth=None,
            span_seconds=span,
            analysed_from=analysed[0][0] if analysed else None,
            first=None,
            last=None,
            samples=samples,
            windows=0,
            reason=f"too few samples after the warm-up ({samples})",
        )
    wt, wv = windowed_minima([p[0] for p in analysed], [p[1] for p in analysed], windows=windows)
    slope, lo, hi = theil_sen(wt, wv, z=z)
    growth = slope * span
    first, last = wv[0], wv[-1]
    # Each third of the span must rise too: a warm-up ramp, or a one-time allocation that
    # takes a few samples, rises in one or two thirds, never in all three.
    third = len(wt) / 3
    cuts = [0, round(third), round(2 * third), len(wt)]
    part_slopes = [theil_sen(wt[a : b + 1], wv[a : b + 1])[0] for a, b in itertools.pairwise(cuts)]
    floor = max(min_growth, min_ratio * abs(first))
    verdict: Verdict
    # The fitted growth and the observed rise of the floor must both clear the floors: a slow
    # wander (autocorrelated noise) can fit a confident slope over a short span.
    if lo > 0 and min(growth, last - first) >= floor:
        if min(part_slopes) >= part_slope_ratio * slope and _clear_of_noise(
            wt, wv, slope, growth, noise_ratio
        ):
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


def _clear_of_noise(
    wt: Sequence[float], wv: Sequence[float], slope: float, growth: float, ratio: float
) -> bool:
    """Whether the growth stands ``ratio`` times above the minima's scatter around the fit.

    Sen's interval assumes independent points; window minima of a slowly wandering series are
    not, and a wander can fit a confident slope.  A leak's floor hugs its line.
    """
    intercept = median([v - slope * ti for ti, v in zip(wt, wv, strict=True)])
    residuals = [abs(v - slope * ti - intercept) for ti, v in zip(wt, wv, strict=True)]
    scatter = MAD_TO_SD * median(residuals)
    return growth >= ratio * scatter


def progress_slowing(
    t: Sequence[float], rates: Sequence[float | None], *, analysed_from: float | None = None
) -> tuple[float, float] | None:
    """``(first quarter's median, last quarter's median)`` when progress slowed, else None.

    Slowing: the median rate of the last quarter of the analysed span is below half the
    median of its first quarter (at least two points in each quarter).
    """
    pairs = [
        (ti, r)
        for ti, r in zip(t, rates, strict=True)
        if r is not None and (analysed_from is None or ti >= analysed_from)
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
    """The middle value (the mean of the two middle ones for an even count); ``values`` not
    empty.  Here rather than ``statistics.median``: that module costs the command line's start
    ``fractions`` and ``decimal``."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def format_bytes(n: float, *, promote: float = 1.0) -> str:
    """``1.0 GiB``, ``512.0 MiB``, ``-3.0 KiB``: binary units, one decimal.

    ``promote`` below 1 moves to the next unit early: ``promote=0.5`` writes 0.9 GiB, not
    921.6 MiB (rates read better that way).
    """
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
