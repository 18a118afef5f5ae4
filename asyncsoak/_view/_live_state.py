"""The live view's fold: the soak's events so far and the :class:`~._live_line.Status` they make
at a moment, the run's figures from a ``RunState``, plus the history the memory trends need."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, cast

from .._analysis import MAX_WINDOWS, SAMPLES_PER_WINDOW, theil_sen, windowed_minima
from .._contract import EventKind, epoch, events, format_duration
from .._record import RunState
from ._fields import format_value, gpu_index
from ._live_line import Process, Status
from ._status import named_warning, shown_status
from ._training import goodput_line, training_line

# The live view reads journal lines as their kinds' JSON forms (``_contract._events``), every
# key with ``.get``: a journal is not checked against a schema as an artifact is, and it may
# come from another asyncsoak.


class _ProcessEntry(TypedDict, total=False):
    """A process of a sample (``SampleJson.processes``), as far as the view reads it."""

    pid: int
    name: str
    rss_bytes: float | None
    anon_bytes: float | None


#: Samples of the tree's memory kept for its live trend (the last ones; about 10 minutes at 1 s).
TREND_POINTS = 600
#: GPU faults the live line names at most.
MAX_GPU_FAULT_ALERTS = 2
#: Samples needed before a trend is shown.
TREND_MIN_POINTS = 10
#: Processes whose memory is followed for the full screen's trends (the largest ones).
PROCESSES_FOLLOWED = 8
#: The monitor's monotonic clock lines ``t`` up with this process's when both agree with the
#: wall clock within this (same host, same boot); else the wall clock is used.
SAME_CLOCK_TOLERANCE_SECONDS = 30.0


@dataclass(slots=True)
class LiveState:
    """What the soak's events said so far: the run's ``RunState`` and the recent history."""

    #: The run's state, fed by :meth:`add` unless ``feed_run`` is false (the soak's own,
    #: fed by its serializer).
    run: RunState = field(default_factory=RunState)
    feed_run: bool = True
    #: (t, tree memory) of the last samples, for the memory trend.
    rss: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=TREND_POINTS))
    #: (series key, verdict) -> the ``trend`` event that said it.
    trends: dict[tuple[str, str], events.TrendJson] = field(default_factory=dict)
    #: The last sample's processes: (pid, name, memory).
    processes: list[tuple[int, str, float | None]] = field(default_factory=list)
    #: pid -> (t, memory) of its last samples, for the largest processes only.
    process_memory: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)
    #: Series (``tree``, or a pid) -> (its last sample's t, its trend text): a frame is drawn
    #: twice a second on the event loop, a trend changes only with a new sample.
    _trends_shown: dict[object, tuple[float, str | None]] = field(
        default_factory=dict, init=False, repr=False
    )

    _goodput_shown: str | None = field(default=None, init=False, repr=False)

    _fold: ClassVar[events.EventFold[LiveState]] = events.EventFold()

    def add(self, event: Mapping[str, Any]) -> None:
        """Fold one event in its JSON form (as the serializer and ``JournalDecoder`` give it)."""
        if self.feed_run:
            # A word this asyncsoak does not know (a newer one's journal, a forged one) or a key
            # missing (a hand-made one): the RunState refuses the line, the view goes on.
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.run.add(event)
        self._fold.dispatch(self, event)

    # -- the run's figures, as the RunState holds them -----------------------------------------

    @property
    def _header(self) -> Mapping[str, Any]:
        return self.run.header or {}

    @property
    def _config(self) -> Mapping[str, Any]:
        return self._header.get("config") or {}

    @property
    def started_at(self) -> float | None:
        return epoch(self._header.get("started_at"))

    @property
    def finished(self) -> str | None:
        return self.run.status

    @property
    def failures(self) -> list[str]:
        """The reasons, the primary first (as the artifact orders them: a GPU fault explains
        what came with it)."""
        reasons = [str(f["reason"]) for f in self.run.failures]
        return sorted(reasons, key=lambda reason: reason != "gpu_fault")

    @property
    def warnings(self) -> int:
        return len(self.run.warnings)

    @property
    def stale_limit(self) -> float | None:
        """``--stale-progress auto``'s learned limit, else the header's."""
        if self.run.stale_limit is not None:
            return self.run.stale_limit
        stale = self._config.get("stale_progress_seconds")
        return stale if isinstance(stale, int | float) else None

    def _missing_dir(self) -> str | None:
        """The progress directory while the watchdog's newest word is that it does not exist."""
        for note in reversed(self.run.sampler_notes):
            data: Mapping[str, Any] = note.get("data") or {}
            if note.get("sampler") == "watchdog" and "exists" in data:
                return None if data["exists"] else str(data.get("progress_dir"))
        return None

    def _points(self) -> dict[str, Mapping[str, float | None]]:
        """The newest sample's and GPU sample's figures, by group."""
        latest = self.run.latest
        return {
            **((latest.get("gpu_sample") or {}).get("points") or {}),
            **((latest.get("sample") or {}).get("points") or {}),
        }

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, sample: events.SampleJson) -> None:
        # The memory that is judged (anonymous + shared), RSS in older journals.
        tree = (sample.get("points") or {}).get("tree") or {}
        memory = tree.get("anon_bytes", tree.get("rss_bytes"))
        if isinstance(memory, int | float):
            self.rss.append((t, float(memory)))
        self._fold_processes(t, sample.get("processes"))

    @_fold.on(EventKind.TREND)
    def _on_trend(self, t: float, trend: events.TrendJson) -> None:
        series, verdict = trend["series"], trend["verdict"]
        if verdict == "withdrawn":
            # The soak's judgement no longer calls it a leak: neither does the view.
            self.trends.pop((series, "leak"), None)
            self.trends.pop((series, "breach_projected"), None)
        else:
            self.trends[(series, verdict)] = trend

    def _fold_processes(self, t: float, entries: object) -> None:
        if not isinstance(entries, list):
            return
        processes: list[tuple[int, str, float | None]] = []
        for entry in cast(list[_ProcessEntry], entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
                continue
            memory = entry.get("anon_bytes", entry.get("rss_bytes"))
            processes.append(
                (
                    int(entry["pid"]),
                    str(entry.get("name") or "?"),
                    float(memory) if isinstance(memory, int | float) else None,
                )
            )
        processes.sort(key=lambda p: -(p[2] or 0.0))
        self.processes = processes
        followed = {pid: memory for pid, _, memory in processes[:PROCESSES_FOLLOWED]}
        for pid in list(self.process_memory):
            if pid not in followed:
                del self.process_memory[pid]
                self._trends_shown.pop(pid, None)
        for pid, memory in followed.items():
            if memory is not None:
                history = self.process_memory.setdefault(pid, deque(maxlen=TREND_POINTS))
                history.append((t, memory))

    def memory_trend(self) -> str | None:
        """The tree's memory per minute over the recent samples: the trends' estimator (the
        Theil-Sen slope of windowed minima), so a cache filling and emptying reads flat."""
        return self._trend("tree", self.rss)

    def _trend(self, series: object, points: deque[tuple[float, float]] | tuple[()]) -> str | None:
        last = points[-1][0] if points else -1.0
        shown = self._trends_shown.get(series)
        if shown is None or shown[0] != last:
            shown = (last, _trend_text(points))
            self._trends_shown[series] = shown
        return shown[1]

    def alerts(self, now_epoch: float | None) -> tuple[str, ...]:
        """Short texts for the leaks and projected breaches the trends reported, one per
        series: ``LEAK pid 29987 +921.6 MiB/min, limit in 41m00s``."""
        faults = sorted(
            (fault["t"], index, fault)
            for index, gpu in self.run.gpu_health.gpus.items()
            for fault in gpu.faults
            if fault["fails"]
        )
        out = [
            f"GPU FAULT gpu{index} "
            + (f"Xid {fault['xid']}" if fault["xid"] is not None else str(fault["fault"]))
            for _, index, fault in faults[:MAX_GPU_FAULT_ALERTS]
        ]
        for series in dict.fromkeys(key for key, _ in self.trends):
            leak = self.trends.get((series, "leak"))
            breach = self.trends.get((series, "breach_projected"))
            if leak is None and breach is None:
                continue
            who = f"pid {series.split('.')[1]}" if series.startswith("process.") else series
            text = f"LEAK {who}" if leak is not None else f"{who}:"
            slope = None if leak is None else leak.get("slope_per_hour")
            if isinstance(slope, int | float) and series.endswith("_bytes"):
                text += f" +{format_value(slope / 60.0, 'bytes')}/min"
            if breach is not None:
                at = epoch(breach.get("projected_limit_at"))
                when = (
                    f"limit in {format_duration(max(0.0, at - now_epoch))}"
                    if at is not None and now_epoch is not None
                    else "limit breach projected"
                )
                text += f", {when}" if leak is not None else f" {when}"
            out.append(text)
        return tuple(out)

    def verdict(self) -> str | None:
        """The status as the views show it once finished (``passed_with_warnings``...)."""
        if self.finished is None:
            return None
        return shown_status(self.finished, self.warnings)

    def phase(self) -> str:
        verdict = self.verdict()
        if verdict is not None:
            reasons = f" ({', '.join(self.failures)})" if self.failures else ""
            return f"finished: {verdict.replace('_', ' ')}{reasons}"
        if self.failures:
            return f"stopping: {self.failures[0]}"
        if self.run.stop["mode"] is not None:  # a stop event (an exit alone sets the cause)
            return f"stopping: {self.run.stop['cause']}"
        if self.run.exit_t is not None:
            return "command exited, waiting for its tree"
        if self.run.started_t is None:
            return "starting"
        missing = self._missing_dir() if self.run.last_progress is None else None
        if missing is not None:
            return f"waiting for the first progress: {missing} does not exist (yet)"
        if self.run.last_progress is None:
            return "waiting for the first progress"
        return "running"

    def elapsed(self, now: float, monotonic_now: float | None = None) -> float:
        """Seconds since the start at ``now`` (Unix time): on the monitor's own monotonic
        clock when ``monotonic_now`` is given and agrees (same host), else the wall clock."""
        if self.finished is not None or self.started_at is None:
            return self.run.last_t
        by_wall = now - self.started_at
        start = self._header.get("monotonic_start")
        if monotonic_now is not None and isinstance(start, int | float):
            by_monotonic = monotonic_now - start
            if abs(by_monotonic - by_wall) <= SAME_CLOCK_TOLERANCE_SECONDS:
                return max(self.run.last_t, by_monotonic)
        return max(self.run.last_t, by_wall)

    def status(
        self, now: float, monotonic_now: float | None = None, *, current: bool = True
    ) -> Status:
        """The frame at ``now`` (Unix time); ``current``: the events are the monitor's knowledge
        up to now (``run``), else they stop at the journal's last line (``watch``): the quiet
        time is as of that line, with how old it is."""
        finished = self.finished is not None
        elapsed = self.elapsed(now, monotonic_now)
        known_until = elapsed if current or finished else self.run.last_t
        if self.run.last_progress is None:
            quiet_for, name = known_until, "startup"
            limit = self._config.get("startup_timeout_seconds")
        else:
            quiet_for = max(0.0, known_until - self.run.last_progress)
            limit, name = self.stale_limit, "stale"
        deadline = self._nearest_deadline(known_until, quiet_for, limit)
        points, peak = self._points(), self.run.peak
        rate = self.run.trends.rate.column("changes_per_minute")
        tree = points.get("tree") or {}
        gpu_groups = sorted(
            (group for group in points if gpu_index(group) is not None),
            key=lambda group: gpu_index(group) or 0,
        )
        gpus = tuple(
            (
                group,
                points[group].get("utilization_gpu_percent"),
                points[group].get("memory_used_mib"),
            )
            for group in gpu_groups
        )
        return Status(
            elapsed=elapsed,
            phase=self.phase(),
            quiet_for=quiet_for if self.run.started_t is not None else None,
            limit=limit,
            limit_name=name,
            changes=self.run.progress_changes,
            tree_cpu_percent=tree.get("cpu_percent"),
            tree_rss_bytes=tree.get("rss_bytes"),
            gpus=gpus,
            finished=finished,
            memory_trend=self.memory_trend(),
            alerts=self.alerts(now),
            peak_cpu_percent=peak("tree", "cpu_percent"),
            peak_rss_bytes=peak("tree", "rss_bytes"),
            peak_gpus=tuple(
                (
                    group,
                    peak(group, "utilization_gpu_percent"),
                    peak(group, "memory_used_mib"),
                )
                for group in gpu_groups
            ),
            warnings=self.warnings,
            warning=named_warning(self.run.warnings),
            # A tree's first sample has no CPU rate, and its memory is the command's before it
            # loaded anything: no figure is shown until one with a rate.
            sampled=tree.get("cpu_percent") is not None or peak("tree", "cpu_percent") is not None,
            behind=None if current or finished else max(0.0, elapsed - self.run.last_t),
            # The progress rate's newest point (the artifact's ``series.progress_rate``).
            changes_per_minute=rate[-1] if rate else None,
            processes=tuple(
                Process(pid, name, memory, self._trend(pid, self.process_memory.get(pid, ())))
                for pid, name, memory in self.processes[:PROCESSES_FOLLOWED]
            ),
            log_path=self._header.get("log_path"),
            status=self.finished,
            training=training_line(self.run.step),
            steps_count=self.run.steps_count,
            deadline=deadline,
            goodput=self._goodput() if finished else "",
        )

    def _nearest_deadline(
        self, now: float, quiet_for: float, limit: float | None
    ) -> tuple[str, float] | None:
        """``--expect-every``'s next deadline as (GLOB, seconds left, below 0 when late), when
        it falls before the stall limit's."""
        pending = self.run.deadlines.pending(self.run.steps_started)
        if not pending or self.run.started_t is None:
            return None
        left = pending[0].due - now
        return (pending[0].glob, left) if limit is None or left < limit - quiet_for else None

    def _goodput(self) -> str:
        """The finished run's goodput line (worked out once: a long run has many steps)."""
        if self._goodput_shown is None:
            self._goodput_shown = (
                goodput_line(self.run.goodput().to_json()) if self.run.step else ""
            )
        return self._goodput_shown


def _trend_text(points: Sequence[tuple[float, float]] | deque[tuple[float, float]]) -> str | None:
    """Memory per minute over ``points`` (t, bytes): the Theil-Sen slope of their windowed
    minima, the trends' estimator; ``steady`` under 1 MiB a minute."""
    if len(points) < TREND_MIN_POINTS:
        return None
    t = [t for t, _ in points]
    windows = min(MAX_WINDOWS, len(t) // SAMPLES_PER_WINDOW)
    wt, wv = windowed_minima(t, [v for _, v in points], windows=windows)
    if len(wt) < 2 or wt[-1] <= wt[0]:
        return None
    per_minute = theil_sen(wt, wv)[0] * 60.0
    if abs(per_minute) < 2**20:
        return "steady"
    sign = "+" if per_minute > 0 else "-"
    return f"{sign}{format_value(abs(per_minute), 'bytes')}/min"
