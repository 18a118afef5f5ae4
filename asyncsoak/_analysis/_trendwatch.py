"""The judgement of a run's folded series: the artifact's ``trends``, what a stalled tree is
doing, and what the GPUs kept once the tree was gone."""

from __future__ import annotations

import bisect
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from .._contract import SeriesBuffer
from ._activity import GpuActivity, stall_activity
from ._trendfold import TREE_MEMORY_SERIES, MiB, Track, TrendFold
from ._trends import (
    FLOORS,
    MIN_WINDOWS,
    RECENT_FRACTIONS,
    SAMPLES_PER_WINDOW,
    WARM_UP_MAX_SECONDS,
    Trend,
    default_warm_up,
    estimate_trend,
    format_amount,
    format_bytes,
    median,
    progress_slowing,
)

#: A process is judged when it lived through this share of the analysed span, or through its
#: recent part to the end of it, give or take ALIVE_AT_END_INTERVALS samples.
PROCESS_COVERAGE = 0.8
ALIVE_AT_END_INTERVALS = 3
#: The live warm-up lasts at least this many sample intervals: a warm-up ramp rises like a leak.
LIVE_WARM_UP_INTERVALS = 60
#: A stall's activity needs this many samples of it (see ACTIVITY_SAMPLES).
ACTIVITY_MIN_SAMPLES = 2
MEMORY_NOT_JUDGED = "the leak check could not judge"


def memory_not_judged(trends: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the tree's memory could not be judged (too few samples after the warm-up), how much
    it grew and what to change; None when it was judged."""
    entry = next((trends[k] for k, _ in TREE_MEMORY_SERIES if k in trends), None)
    if entry is not None and entry["slope_per_hour"] is not None:
        return None
    change = "; shorten --sample-interval or run longer"
    if entry is None or entry["first"] is None or entry["last"] is None:
        return f"{MEMORY_NOT_JUDGED}: the run was too short to sample its memory{change}"
    delta = entry["last"] - entry["first"]
    grew = f"memory {'grew' if delta >= 0 else 'fell'} {format_bytes(abs(delta))} after the warm-up"
    reason = str(entry.get("reason") or "")
    if reason and not reason.startswith("too few samples"):
        # Samples enough, but not to fit a slope to (times that repeat, values too large).
        return f"{MEMORY_NOT_JUDGED}: {grew}, not judged: {reason}"
    return (
        f"{MEMORY_NOT_JUDGED}: {grew} in {entry['samples']} samples "
        f"({MIN_WINDOWS * SAMPLES_PER_WINDOW} needed){change}"
    )


#: Keys of the series that machine or cgroup memory limits.
MEMORY_SUFFIXES = (".anon_bytes", ".anon_pss_bytes", ".rss_bytes", ".pss_bytes", "shm_used_bytes")
#: Once the tree is gone, a GPU it used holding this much more than at the start (or this
#: share of its memory, whichever is larger) did not get its memory back.
GPU_RELEASE_FLOOR_BYTES = 256 * MiB
GPU_RELEASE_FLOOR_RATIO = 0.02
#: A trend entry's keys about a limit (none for a rate).
NO_LIMIT = ("limit", "limit_source", "projected_seconds_to_limit", "projected_limit_at")

#: The note of a tree's summed memory above the machine's used memory.
SHARED_PAGES = (
    "the tree's summed memory counts pages shared between processes (forked workers) once per "
    "process, so it can exceed the machine's used memory; --detailed-memory uses PSS instead"
)

_Reading = TypeVar("_Reading")


class TrendWatch(TrendFold):
    """Judges the folded series (see :class:`TrendFold`)."""

    def analysed_from(self, *, live: bool = False) -> float:
        """Start of the analysed span: after the warm-up (10 % of the run; live, also at least
        LIVE_WARM_UP_INTERVALS samples, at most WARM_UP_MAX_SECONDS)."""
        first = self.first_t or 0.0
        if self.warm_up_seconds is not None:
            return first + self.warm_up_seconds
        track = next((self.tracks[k] for k, _ in TREE_MEMORY_SERIES if k in self.tracks), None)
        return self._warm_up_end(first, track.floors.times if track is not None else [], live)

    def _warm_up_end(self, first: float, times: list[float], live: bool) -> float:
        """The end of the default warm-up of a series born at ``first`` sampled at ``times``."""
        warm_up = default_warm_up(times)
        if live:
            floor = LIVE_WARM_UP_INTERVALS * (self.interval or 1.0)
            warm_up = max(warm_up, min(WARM_UP_MAX_SECONDS, floor))
        return first + warm_up

    def judged(self) -> Iterable[tuple[str, Track]]:
        """Every judged series with its key: the tree's and machine's, then the top processes."""
        yield from self.tracks.items()
        for record in sorted(self.processes.values(), key=lambda r: -r.peak_anon)[:8]:
            if record.rss is not None:
                yield f"process.{record.pid}.{record.memory_key}", record.rss
        for record in list(self.processes.values()):
            if record.gpu is not None:
                yield f"process.{record.pid}.gpu_memory_bytes", record.gpu

    def evaluate(
        self, wall: Callable[[float], str | None], *, live: bool = False
    ) -> dict[str, dict[str, Any]]:
        """The ``trends`` object: every series judged over the same analysed span; ``wall``
        turns seconds since the start into an ISO time."""
        start = self.analysed_from(live=live)
        stop = self.last_t
        if self.end_t is not None:
            # A process frees its memory while it exits: the shutdown is no floor of the run.
            stop = self.end_t - max(2 * (self.interval or 0.0), 0.5)
        span = max(0.0, stop - start)
        judged: list[tuple[str, Track, list[float], float]] = []
        # A process born late has a warm-up of its own, from its birth; the tree's series sum
        # its processes and are judged once every judged process's warm-up is over.
        tree_start = start
        for key, track in self.judged():
            times = track.floors.times[: bisect.bisect_right(track.floors.times, stop)]
            if not times:
                continue
            series_start = start
            if track.pid is not None:
                if not self._covers(times, start, stop, span):
                    continue  # lived through too little of the span to be judged
                if self.warm_up_seconds is None:
                    series_start = max(start, self._warm_up_end(times[0], times, live))
                    tree_start = max(tree_start, series_start)
            judged.append((key, track, times, series_start))
        out: dict[str, dict[str, Any]] = {}
        for key, track, times, series_start in judged:
            if key.startswith("tree."):
                series_start = tree_start
            min_growth, min_ratio = FLOORS[track.unit]
            with self._judging(key):
                trend = estimate_trend(
                    times,
                    track.floors.column("v")[: len(times)],
                    min_growth=min_growth,
                    min_ratio=min_ratio,
                    warm_up_seconds=max(0.0, series_start - times[0]),
                    direction=track.direction,
                )
                out[key] = self._entry(key, track, trend, wall)
        for series, name in (
            (self.rate, "changes_per_minute"),
            (self.step_rate, "steps_per_second"),
        ):
            with self._judging(f"progress.{name}"):
                if (rate := self._rate_entry(start, series, name)) is not None:
                    out[f"progress.{name}"] = rate
        return out

    @contextlib.contextmanager
    def _judging(self, key: str) -> Iterator[None]:
        """Record a series' exception in ``not_judged``; the others are judged all the same."""
        try:
            yield
        except Exception as exc:
            self.not_judged.setdefault(key, f"{type(exc).__name__}: {exc}")

    def _covers(self, times: list[float], start: float, stop: float, span: float) -> bool:
        """Whether a process lived through enough of the analysed span to be judged: most of
        it, or its recent part (a worker born late, still there at the end)."""
        covered = times[-1] - max(times[0], start)
        if covered >= PROCESS_COVERAGE * span:
            return True
        alive_at_end = times[-1] >= stop - ALIVE_AT_END_INTERVALS * (self.interval or 1.0)
        return alive_at_end and covered >= RECENT_FRACTIONS[-1] * span

    def _entry(
        self,
        key: str,
        track: Track,
        trend: Trend,
        wall: Callable[[float], str | None],
    ) -> dict[str, Any]:
        limit, source = self._limit(key, track)
        seconds = trend.seconds_to(limit) if trend.verdict == "leak" and limit is not None else None
        interval = trend.slope_interval_per_hour
        above = (self.peak_tree_rss or 0) > (self.peak_machine_used or 0)
        shared = above and key in ("tree.anon_bytes", "tree.rss_bytes")
        return {
            "verdict": trend.verdict,
            "unit": track.unit,
            "label": track.label,
            "pid": track.pid,
            "name": track.name,
            "slope_per_hour": _round(trend.slope_per_hour),
            "slope_interval_per_hour": (
                None if interval is None else [_round(interval[0]), _round(interval[1])]
            ),
            "growth": _round(trend.growth),
            "span_seconds": round(trend.span_seconds, 3),
            "analysed_from": _round(trend.analysed_from),
            "samples": trend.samples,
            "first": _round(trend.first),
            "last": _round(trend.last),
            "limit": limit,
            "limit_source": source,
            "projected_seconds_to_limit": _round(seconds),
            "projected_limit_at": None if seconds is None else wall(self.last_t + seconds),
            "reason": trend.reason,
            "note": SHARED_PAGES if shared else None,
            "onset": _round(trend.onset),
            "live": self.live_calls.get(key),
        }

    def _limit(self, key: str, track: Track) -> tuple[int | None, str | None]:
        """The nearest known limit of a series, and what it is."""
        budgets = self.budgets
        candidates: list[tuple[int | None, str]] = []
        if key.endswith(MEMORY_SUFFIXES):
            if self.limits["memory_limit_source"] is not None:
                # The lowest of the machine's and the command's cgroup's, named at the start.
                memory = [(self.limits["memory_limit_bytes"], self.limits["memory_limit_source"])]
            else:  # a journal from before the cgroup's limits were named
                memory = [
                    (self.limits["memory_total_bytes"], "machine memory"),
                    (self.limits["cgroup_memory_max_bytes"], "cgroup memory.max"),
                ]
            # The budget is the tree's, not /dev/shm's.
            tree = not key.startswith("machine.")
            candidates = (
                [*memory, (budgets.get("max_rss_bytes"), "max_rss_bytes")] if tree else memory
            )
        elif key.startswith("gpu") and key.endswith(".memory_used_bytes"):
            index = int(key[3 : key.index(".")])
            candidates = [(self.gpu_total.get(index), "GPU memory")]
        elif key.endswith("gpu_memory_bytes"):
            whole = sum if key.startswith("tree.") else max
            total = whole(self.gpu_total.values()) if self.gpu_total else None
            candidates = [
                (total, "GPU memory"),
                (budgets.get("max_gpu_memory_bytes"), "max_gpu_memory_bytes"),
            ]
        elif track.direction == "down":
            disk_floor = budgets.get("min_disk_free_bytes")
            return (0, "filesystem") if disk_floor is None else (disk_floor, "min_disk_free_bytes")
        known = [(value, source) for value, source in candidates if value is not None]
        return min(known) if known else (None, None)

    def _rate_entry(self, start: float, series: SeriesBuffer, name: str) -> dict[str, Any] | None:
        times = series.times
        rates = series.column(name)
        if len(times) < 2:
            return None
        slowing = progress_slowing(times, rates, analysed_from=start)
        analysed = [r for ti, r in zip(times, rates, strict=True) if ti >= start and r is not None]
        rated = name == "changes_per_minute"
        verdict = "slowing" if slowing else "stable" if len(analysed) >= 8 else "inconclusive"
        return {
            "verdict": verdict,
            "unit": "per_minute" if rated else "per_second",
            "label": "progress rate" if rated else "step rate",
            **dict.fromkeys(("pid", "name", "slope_per_hour", "slope_interval_per_hour", "growth")),
            "span_seconds": round(max(0.0, times[-1] - start), 3),
            "analysed_from": round(start, 3),
            "samples": len(analysed),
            "first": None if slowing is None else round(slowing[0], 3),
            "last": None if slowing is None else round(slowing[1], 3),
            **dict.fromkeys(NO_LIMIT),
            "reason": "progress fell below half its early rate" if slowing else "",
            "note": None,
        }

    def gpu_not_released(self) -> list[str]:
        """What the GPUs still held of the tree once it was gone: a process of the tree still
        listed, or a GPU holding more than at the start (see GPU_RELEASE_FLOOR_BYTES)."""
        after = self.gpu_after_tree
        if after is None or not self.gpus_of_tree:
            return []
        out = []
        for proc in after.get("processes") or []:
            pid = proc.get("pid")
            used = proc.get("used_gpu_memory_mib")
            if pid in self.gpu_pids_of_tree and used:
                out.append(
                    f"GPU {proc.get('gpu_index')} still lists pid {pid} "
                    f"({self.gpu_pids_of_tree[pid]}) of the tree holding "
                    f"{format_amount(used * MiB, 'bytes')} after the tree was gone: "
                    "GPU memory not given back"
                )
        for gpu in after.get("gpus") or []:
            index, used = gpu.get("index"), gpu.get("memory_used_mib")
            if index not in self.gpus_of_tree or used is None:
                continue
            start = self.gpu_used_at_start.get(index)
            total = self.gpu_total.get(index, 0)
            floor = max(GPU_RELEASE_FLOOR_BYTES, GPU_RELEASE_FLOOR_RATIO * total)
            if start is not None and used * MiB - start >= floor:
                out.append(
                    f"GPU {index} holds {format_amount(used * MiB - start, 'bytes')} more "
                    "than at the start after the tree was gone: GPU memory not given back"
                )
        return out

    def top_processes(self) -> list[dict[str, Any]]:
        top = sorted(self.processes.values(), key=lambda r: -r.peak_rss)[:8]
        return [r.to_json() for r in top]

    def activity(self) -> dict[str, Any]:
        """What a stalled tree and its GPUs are doing, by the median of the samples taken in
        the stall (the first may still carry the work before it)."""
        # The first interval measures the command's start (an interpreter loading), not a stall.
        started = self.interval or 0.0
        cpus: list[float] = self.stalled(deque(r for r in self.recent_cpu if r[0] >= started))
        cpu = _median(cpus)
        running = self.stalled(deque(r for r in self.recent_running if r[0] >= started))
        share = sum(running) / len(running) if running else None
        if len(running) < ACTIVITY_MIN_SAMPLES:
            cpu = share = None  # too few to mean anything
        return stall_activity(
            cpu, self.uninterruptible, share, self.recent_gpu_activity(), cpu_of=self.cpu_of
        )

    def recent_gpu_activity(self) -> list[GpuActivity]:
        """The tree's GPUs (all while none is known), their medians over the stall."""
        activity = []
        for index in sorted(self.gpus_of_tree or self.recent_gpus):
            readings = self.stalled(self.recent_gpus.get(index, deque()))
            medians = [_median([reading[i] for reading in readings]) for i in range(3)]
            activity.append(GpuActivity(index, *medians))
        return activity

    def stalled(self, recent: deque[tuple[float, _Reading]]) -> list[_Reading]:
        """The recent readings whose interval follows the last progress, else those taken
        after it, else all (no progress yet: the whole run is the stall)."""
        since = self.last_progress_t
        if since is not None:
            interval = self.interval or 0.0
            after = [v for t, v in recent if t - interval >= since] or [
                v for t, v in recent if t > since
            ]
            if after:
                return after
        return [v for _, v in recent]


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def straggler_text(found: dict[str, Any]) -> str:
    """``rank 1 is a straggler: its progress files grew 300 B/min against ...``."""
    rate, median = float(found["rate_per_minute"]), float(found["median_rate_per_minute"])
    return (
        f"rank {found['rank']} is a straggler: its progress files grew "
        f"{format_amount(rate, 'bytes')}/min against the ranks' median "
        f"{format_amount(median, 'bytes')}/min ({100 * rate / median:.0f}%), "
        f"behind for {found['behind_seconds']:.1f}s"
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
