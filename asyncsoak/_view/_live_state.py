"""The live view's fold: the soak's events so far and the :class:`~._live_line.Status` they make
at a moment, the run's figures from a ``RunState``, plus the history the memory trends need.
Journal lines are read with ``.get``: a journal is not checked against a schema as an artifact
is, and it may come from another asyncsoak."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._analysis import MAX_WINDOWS, SAMPLES_PER_WINDOW, theil_sen, windowed_minima
from .._contract import EventKind, epoch, events, format_duration
from .._record import RunState
from ._fields import format_value, gpu_index
from ._live_line import Gpus, Process, Status
from ._status import named_warning, shown_status
from ._training import goodput_line, training_line

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

Points = deque[tuple[float, float]]


@dataclass(slots=True)
class LiveState:
    """What the soak's events said so far: the run's ``RunState`` and the recent history."""

    #: The run's state, fed by :meth:`add` unless ``feed_run`` is false (the soak's own,
    #: fed by its serializer).
    run: RunState = field(default_factory=RunState)
    feed_run: bool = True
    #: (t, tree memory) of the last samples, for the memory trend.
    rss: Points = field(default_factory=lambda: deque(maxlen=TREND_POINTS))
    #: (series key, verdict) -> the ``trend`` event that said it.
    trends: dict[tuple[str, str], events.TrendJson] = field(default_factory=dict)
    #: The last sample's processes: (pid, name, memory), the largest first.
    processes: list[tuple[int, str, float | None]] = field(default_factory=list)
    #: pid -> (t, memory) of its last samples, for the largest processes only.
    process_memory: dict[int, Points] = field(default_factory=dict)
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

    @property
    def _header(self) -> Mapping[str, Any]:
        return self.run.header or {}

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

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, sample: events.SampleJson) -> None:
        # The memory that is judged (anonymous + shared), RSS in older journals.
        tree = (sample.get("points") or {}).get("tree") or {}
        memory = tree.get("anon_bytes", tree.get("rss_bytes"))
        if isinstance(memory, int | float):
            self.rss.append((t, float(memory)))
        entries: Any = sample.get("processes")
        if not isinstance(entries, list):
            return
        processes = []
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
                memory = entry.get("anon_bytes", entry.get("rss_bytes"))
                number = float(memory) if isinstance(memory, int | float) else None
                processes.append((int(entry["pid"]), str(entry.get("name") or "?"), number))
        processes.sort(key=lambda p: -(p[2] or 0.0))
        self.processes = processes
        followed = {pid: memory for pid, _, memory in processes[:PROCESSES_FOLLOWED]}
        for pid in [pid for pid in self.process_memory if pid not in followed]:
            del self.process_memory[pid]
            self._trends_shown.pop(pid, None)
        for pid, memory in followed.items():
            if memory is not None:
                history = self.process_memory.setdefault(pid, deque(maxlen=TREND_POINTS))
                history.append((t, memory))

    @_fold.on(EventKind.TREND)
    def _on_trend(self, t: float, trend: events.TrendJson) -> None:
        series, verdict = trend["series"], trend["verdict"]
        if verdict == "withdrawn":
            # The soak's judgement no longer calls it a leak: neither does the view.
            self.trends.pop((series, "leak"), None)
            self.trends.pop((series, "breach_projected"), None)
        else:
            self.trends[(series, verdict)] = trend

    def memory_trend(self) -> str | None:
        """The tree's memory per minute over the recent samples: the trends' estimator (the
        Theil-Sen slope of windowed minima), so a cache filling and emptying reads flat."""
        return self._trend("tree", self.rss)

    def _trend(self, series: object, points: Points | tuple[()]) -> str | None:
        last = points[-1][0] if points else -1.0
        shown = self._trends_shown.get(series)
        if shown is None or shown[0] != last:
            shown = self._trends_shown[series] = (last, _trend_text(points))
        return shown[1]

    def alerts(self, now_epoch: float | None) -> tuple[str, ...]:
        """Short texts for the GPU faults, leaks and projected breaches the run reported, one
        per series: ``LEAK pid 29987 +921.6 MiB/min, limit in 41m00s``."""
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
        return None if self.finished is None else shown_status(self.finished, self.warnings)

    def phase(self) -> str:
        verdict, run = self.verdict(), self.run
        if verdict is not None:
            reasons = f" ({', '.join(self.failures)})" if self.failures else ""
            return f"finished: {verdict.replace('_', ' ')}{reasons}"
        if self.failures:
            return f"stopping: {self.failures[0]}"
        if run.stop["mode"] is not None:  # a stop event (an exit alone sets the cause)
            return f"stopping: {run.stop['cause']}"
        if run.exit_t is not None:
            return "command exited, waiting for its tree"
        if run.started_t is None:
            return "starting"
        if run.last_progress is not None:
            return "running"
        # The progress directory, while the watchdog's newest word is that it does not exist.
        for note in reversed(run.sampler_notes):
            data: Mapping[str, Any] = note.get("data") or {}
            if note.get("sampler") == "watchdog" and "exists" in data:
                if not data["exists"]:
                    missing = data.get("progress_dir")
                    return f"waiting for the first progress: {missing} does not exist (yet)"
                break
        return "waiting for the first progress"

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
        run, finished = self.run, self.finished is not None
        elapsed = self.elapsed(now, monotonic_now)
        known_until = elapsed if current or finished else run.last_t
        config: Mapping[str, Any] = self._header.get("config") or {}
        if run.last_progress is None:
            quiet_for, name = known_until, "startup"
            limit = config.get("startup_timeout_seconds")
        else:
            # ``--stale-progress auto``'s learned limit, else the header's.
            quiet_for, name = max(0.0, known_until - run.last_progress), "stale"
            stale = config.get("stale_progress_seconds")
            limit = run.stale_limit
            if limit is None and isinstance(stale, int | float):
                limit = stale
        # ``--expect-every``'s next deadline as (GLOB, seconds left), before the stall limit's.
        pending = run.deadlines.pending(run.steps_started)
        deadline = None
        if pending and run.started_t is not None:
            left = pending[0].due - known_until
            if limit is None or left < limit - quiet_for:
                deadline = (pending[0].glob, left)
        latest = run.latest
        points: dict[str, Mapping[str, float | None]] = {
            **((latest.get("gpu_sample") or {}).get("points") or {}),
            **((latest.get("sample") or {}).get("points") or {}),
        }
        tree, rate = points.get("tree") or {}, run.trends.rate.column("changes_per_minute")
        groups = sorted(
            (g for g in points if gpu_index(g) is not None), key=lambda g: gpu_index(g) or 0
        )

        def gpus(read: Callable[[str, str], float | None]) -> Gpus:
            return tuple(
                (g, read(g, "utilization_gpu_percent"), read(g, "memory_used_mib")) for g in groups
            )

        return Status(
            elapsed=elapsed,
            phase=self.phase(),
            quiet_for=quiet_for if run.started_t is not None else None,
            limit=limit,
            limit_name=name,
            changes=run.progress_changes,
            tree_cpu_percent=tree.get("cpu_percent"),
            tree_rss_bytes=tree.get("rss_bytes"),
            gpus=gpus(lambda group, figure: points[group].get(figure)),
            finished=finished,
            memory_trend=self.memory_trend(),
            alerts=self.alerts(now),
            peak_cpu_percent=run.peak("tree", "cpu_percent"),
            peak_rss_bytes=run.peak("tree", "rss_bytes"),
            peak_gpus=gpus(run.peak),
            warnings=self.warnings,
            warning=named_warning(run.warnings),
            # A tree's first sample has no CPU rate, and its memory is the command's before it
            # loaded anything: no figure is shown until one with a rate.
            sampled=tree.get("cpu_percent") is not None
            or run.peak("tree", "cpu_percent") is not None,
            behind=None if current or finished else max(0.0, elapsed - run.last_t),
            # The progress rate's newest point (the artifact's ``series.progress_rate``).
            changes_per_minute=rate[-1] if rate else None,
            processes=tuple(
                Process(pid, name, memory, self._trend(pid, self.process_memory.get(pid, ())))
                for pid, name, memory in self.processes[:PROCESSES_FOLLOWED]
            ),
            log_path=self._header.get("log_path"),
            training=training_line(run.step),
            steps_count=run.steps_count,
            deadline=deadline,
            goodput=self._goodput() if finished else "",
        )

    def _goodput(self) -> str:
        """The finished run's goodput line (worked out once: a long run has many steps)."""
        if self._goodput_shown is None:
            self._goodput_shown = (
                goodput_line(self.run.goodput().to_json()) if self.run.step else ""
            )
        return self._goodput_shown


def _trend_text(points: Sequence[tuple[float, float]] | Points) -> str | None:
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
    return f"{'+' if per_minute > 0 else '-'}{format_value(abs(per_minute), 'bytes')}/min"
