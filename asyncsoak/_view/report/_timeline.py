"""What the report's figure shows, as plain data: the lane's marks, the panels, the progress
curve and its limits, on one time axis, and the progress changes (in bins) and throttling
read from the artifact (or an older one's journal).  ``_figure`` draws it, without plotly here."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from ..._analysis import TREE_MEMORY_SERIES
from ..._contract import (
    Artifact,
    EventKind,
    FailureReason,
    bounded,
    events,
    file_names,
    format_duration,
    schema,
)
from ..._record import EVENTS_HEAD, JournalReader
from .._evidence import leaking_series, rate_text
from .._fields import Field, group_label
from .._hints import IDLE_THROTTLE, throttled
from .._sections import (
    column,
    config_value,
    event_times,
    events_dropped,
    top_processes,
    trend_verdicts,
    wall_clock,
)
from ._events import exit_label, pids
from ._panels import (
    ALWAYS_DRAWN,
    COUNTERS,
    STEADY_SHARE,
    Panel,
    field_label,
    field_unit,
    format_in_unit,
    group_sort_key,
    is_reference,
    other_title,
    plan_panels,
    rates,
)

#: Progress ticks in the lane at most: past it, the changes are binned by time, one tick per
#: bin naming their count (a day of changes every second would be a solid bar).
PROGRESS_TICKS = 300
#: A series with fewer values than this is drawn as points, not a line.
SPARSE_POINTS = 12
#: The lanes of "What happened", in words a newcomer reads (a GPU's throttling is its own).
LANE_WORDS = {
    "progress": "progress",
    "command": "your command",
    "monitor": "asyncsoak's actions",
    "failure": "failure",
    "notes": "warnings, notes",
}
#: A non-finite loss as the step rules word it: ``the loss is NaN at step 8 (...)``.
NONFINITE_LOSS = re.compile(r"the loss is (\S+) at step (\d+)")
#: Points of the time-since-progress curve at most.
PROGRESS_CURVE_POINTS = 2000
#: Per-process memory lines drawn on the memory panel at most.
PROCESS_LINES = 4
#: A liveness limit more than this many times the longest gap is not drawn to scale.
LIMIT_HEADROOM = 4.0
#: A lane label's estimated width: pixels per character (12 px font), and of its marker.
LABEL_CHAR_PX = 7.5
LABEL_MARKER_PX = 16
#: The narrowest plot the lane's labels are laid out for (a 1400 px window draws about
#: 1240 px): labels closer than their width there are merged into one.
LANE_PLOT_PX = 1100

COLORS = {
    "progress": "#2ca02c",
    "failure": "#d62728",
    "signal": "#ff7f0e",
    "exit": "#333333",
    "stall": "rgba(214, 39, 40, 0.15)",
    "throttle": "rgba(255, 165, 0, 0.28)",
    "note": "#7f7f7f",
    "leftover": "#9467bd",
}
#: How each kind of mark is drawn: colour, marker, and the line across the panels (or none).
MARK_STYLES: dict[str, tuple[str, str, str | None]] = {
    "failure": (COLORS["failure"], "x", "solid"),
    "signal": (COLORS["signal"], "triangle-down", "dash"),
    "stop": (COLORS["signal"], "square", None),
    "exited": (COLORS["exit"], "diamond", "dot"),
    "started": (COLORS["exit"], "circle-open", None),
    "forensics": (COLORS["leftover"], "star", None),
    "oom_kill": (COLORS["failure"], "x-open", "dot"),
    "leftover": (COLORS["leftover"], "circle", None),
    "trend": (COLORS["failure"], "triangle-up", None),
    "note": (COLORS["note"], "circle", None),
}
#: Which label names a merged group of marks: the lowest rank.  A leak or an OOM kill leads;
#: other marks drawn across the panels (a failure, a signal, the exit) rank 1, the rest 2.
LABEL_RANKS = {"leak": 0, "OOM kill": 0, "breach ahead": 1, "warning": 2, "sampler": 3}


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment drawn across every panel and in the lane (plain text: escaped when drawn)."""

    t: float
    lane: str
    label: str
    #: Its lines split by newlines.
    hover: str
    color: str
    symbol: str
    dash: str | None


class Limit(NamedTuple):
    """A liveness limit drawn across the time-since-progress panel from ``start`` to ``end``."""

    start: float
    end: float
    value: float
    label: str


class TimelineModel:
    """What the figure shows: the lane's marks, the panels, time since progress."""

    def __init__(
        self, artifact: Artifact, detail: RunDetail | None, baseline: Artifact | None = None
    ) -> None:
        self.artifact = artifact
        self.detail = detail if detail is not None else artifact_detail(artifact)
        self.baseline_series: Mapping[str, Mapping[str, Sequence[Any]]] = (
            baseline["series"] if baseline is not None else {}
        )
        self.duration = max(float(artifact["duration_seconds"]), 1e-3)
        self.x_divisor, self.x_unit = (
            (1.0, "seconds")
            if self.duration <= 900
            else (60.0, "minutes")
            if self.duration <= 36_000
            else (3600.0, "hours")
        )
        self.series: Mapping[str, Mapping[str, Sequence[Any]]] = artifact["series"]
        self.steady: list[Field] = []
        self.panels = self._fold_steady(plan_panels(self.series))
        self.progress = self.detail.progress if self.detail is not None else kept_bins(artifact)
        self.marks = self._marks()
        self.throttle = self.detail.throttle_spans if self.detail is not None else {}

    def values(self, f: Field) -> list[float | None]:
        """A field's values as drawn: counters as rates per second."""
        series = self.series[f.group]
        if (f.group, f.name) in COUNTERS:
            return rates(series["t"], series[f.name])
        return list(series[f.name])

    def _is_steady(self, f: Field) -> bool:
        """Whether a line stays within STEADY_SHARE of its peak all along."""
        values = [v for v in self.values(f) if v is not None]
        return not values or max(values) - min(values) <= STEADY_SHARE * max(abs(max(values)), 1e-9)

    def _fold_steady(self, planned: list[Panel]) -> list[Panel]:
        """The panels less their flat lines (into ``steady``; a panel left with none is not
        drawn), but for ALWAYS_DRAWN ones.  A reference line (a limit, a total) stays beside
        a line that moves, and is folded with the rest when none does."""
        panels = []
        for panel in planned:
            if panel.key in ALWAYS_DRAWN:
                panels.append(panel)
                continue
            moving = [f for f in panel.fields if not is_reference(f) and not self._is_steady(f)]
            if moving:
                moving = [f for f in panel.fields if f in moving or is_reference(f)]
            self.steady.extend(f for f in panel.fields if f not in moving)
            if moving:
                known = panel.title and moving == panel.fields
                panel.fields = moving
                if ":" in panel.key and not known:
                    panel.title = other_title(panel)
                panels.append(panel)
        return panels

    def steady_text(self) -> str:
        """The folded lines in one line: ``open files 3 · disk free 78.8 GiB``."""
        items = []
        for f in self.steady:
            values = [v for v in self.values(f) if v is not None]
            if values:
                who = "" if f.group == "tree" else f"{group_label(f.group)} "
                items.append(f"{who}{field_label(f)} {format_in_unit(values[-1], field_unit(f))}")
        return " · ".join(items)

    def x(self, t: float) -> float:
        return round(t / self.x_divisor, 6)

    def _events_lost(self) -> tuple[float, float] | None:
        """The stretch whose events the artifact did not keep (head and tail are kept)."""
        events = self.artifact["events"]
        if not events_dropped(self.artifact) or len(events) <= EVENTS_HEAD:
            return None
        return float(events[EVENTS_HEAD - 1]["t"]), float(events[EVENTS_HEAD]["t"])

    def _marks(self) -> list[Mark]:
        marks: list[Mark] = []
        artifact = self.artifact

        def add(t: float, lane: str, label: str, hover: str, style: str) -> None:
            marks.append(Mark(t, lane, label, hover, *MARK_STYLES[style]))

        for event in artifact["events"]:
            # Each branch tests ``event["kind"]`` itself: that narrows the event to its kind.
            kind, t = event["kind"], float(event["t"])
            at = f" at {format_duration(t)} ({wall_clock(self.artifact, t)})"
            if event["kind"] == EventKind.FAILURE:
                hover = f"failure {event['reason']}{at}\n{event['message']}"
                add(t, "failure", str(event["reason"]), hover, "failure")
            elif event["kind"] == EventKind.SIGNAL:
                hover = f"{event['signal']} sent to the {event['target']}{at}"
                hover += f"\npids {pids(event['pids'])}"
                add(t, "monitor", str(event["signal"]), hover, kind)
            elif event["kind"] == EventKind.STOP:
                hover = f"stop ({event['cause']}, grace {event['grace_seconds']}s){at}"
                add(t, "monitor", "", hover, "stop")
            elif event["kind"] == EventKind.STDIN_CLOSED:
                add(t, "monitor", "", f"stdin closed{at}", "stop")
            elif event["kind"] == EventKind.EXITED:
                text = exit_label(artifact)
                add(t, "command", text, f"{text}{at}", kind)
            elif event["kind"] == EventKind.STARTED:
                add(t, "command", "started", f"started pid {event['pid']}{at}", kind)
            elif event["kind"] == EventKind.FORENSICS:
                hover = f"forensics of {event['processes']} process(es){at}"
                add(t, "monitor", "", f"{hover}\n(see Forensics, below the plots)", kind)
            elif event["kind"] == EventKind.OOM_KILL:
                hover = f"the kernel's OOM killer killed pid {event['pid']} ({event['name']}){at}"
                add(t, "failure", "OOM kill", hover, kind)
            elif event["kind"] in (EventKind.LEFTOVER, EventKind.ABANDONED):
                process = event["process"]
                hover = f"{kind}: pid {process['pid']} {process['name']}{at}"
                add(t, "monitor", "", hover, "leftover")
            elif event["kind"] == EventKind.TREND:
                label = "leak" if event["verdict"] == "leak" else "breach ahead"
                hover = f"{event['verdict']} ({event['series']}){at}\n{event['message']}"
                add(t, "notes", label, hover, kind)
            elif event["kind"] in (
                EventKind.WARNING,
                EventKind.SAMPLER_DEGRADED,
                EventKind.SAMPLER_RECOVERED,
                EventKind.SAMPLER_NOTE,
            ):
                who = event.get("sampler", "monitor")  # a warning is the monitor's own
                label = "warning" if event["kind"] == EventKind.WARNING else "sampler"
                add(t, "notes", label, f"{kind} ({who}){at}\n{event['message']}", "note")
        if not event_times(artifact, EventKind.FAILURE):
            # A monitor lost has no failure event: the journal just ends.
            for failure in artifact["failures"]:
                if failure["reason"] == FailureReason.MONITOR_LOST:
                    hover = f"the journal ends here: the monitor died\n{failure['message']}"
                    add(self.duration, "failure", FailureReason.MONITOR_LOST, hover, "failure")
        return marks

    def lane_marks(self, lane: str) -> list[Mark]:
        """The lane's marks as drawn: marks whose labels or markers would overlap are merged
        into one, labelled by the most telling of them with ``+N``, every hover kept."""
        per_px = self.duration * 1.02 / LANE_PLOT_PX
        groups = [
            [m] for m in sorted((m for m in self.marks if m.lane == lane), key=attrgetter("t"))
        ]
        while True:
            # A label drawn to the left can reach past its neighbour: any two groups whose
            # drawn spans meet are merged, until none do.
            spans = [self._label_span(_merged(group), per_px) for group in groups]
            pair = next(
                (
                    (i, j)
                    for i in range(len(groups))
                    for j in range(i + 1, len(groups))
                    if spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]
                ),
                None,
            )
            if pair is None:
                return [_merged(group) for group in groups]
            groups[pair[0]] = sorted(groups[pair[0]] + groups.pop(pair[1]), key=attrgetter("t"))

    def _label_span(self, mark: Mark, per_px: float) -> tuple[float, float]:
        """The time span a mark's marker and label cover on the lane."""
        width = (len(mark.label) * LABEL_CHAR_PX + LABEL_MARKER_PX) * per_px
        half = LABEL_MARKER_PX / 2 * per_px
        if self._label_left(mark):
            return mark.t - width, mark.t + half
        return mark.t - half, mark.t + width

    def _label_left(self, mark: Mark) -> bool:
        """Labels past 60 % of the run are written to the left of their mark."""
        return mark.t > self.duration * 0.6

    def lane_words(self, lane: str) -> str:
        """A lane's row title: ``your command``, ``GPU 0 held back``."""
        if lane.endswith(" throttled"):
            return f"{group_label(lane.removesuffix(' throttled'))} held back"
        return LANE_WORDS[lane]

    def nonfinite_losses(self) -> list[tuple[float, str]]:
        """(time, ``loss NaN at step 8``) of each NaN or infinite loss the run reported, as a
        failure or a warning (``--loss-check warn``)."""
        found = []
        for event in self.artifact["events"]:
            if event["kind"] in (EventKind.FAILURE, EventKind.WARNING):
                match = NONFINITE_LOSS.match(str(event["message"]))
                if match is not None:
                    found.append((float(event["t"]), f"loss {match[1]} at step {match[2]}"))
        return found

    def lanes(self) -> list[str]:
        used = {m.lane for m in self.marks} | {"progress", "command"}
        lanes = [lane for lane in LANE_WORDS if lane in used]
        return lanes + [f"{g} throttled" for g in sorted(self.throttle, key=group_sort_key)]

    def _progress_ticks(self) -> list[tuple[float, str]]:
        """(time, hover) of the lane's progress ticks: one per change, or past PROGRESS_TICKS
        one per slice of the run, naming its count and the files of its last change."""
        ticks = []
        for b in in_slices(self.progress, PROGRESS_TICKS):
            text = (
                f"progress at {format_duration(b.last)} ({wall_clock(self.artifact, b.last)})"
                if b.changes == 1
                else f"{b.changes} progress changes, {format_duration(b.first)} to "
                f"{format_duration(b.last)} ({wall_clock(self.artifact, b.last)})"
            )
            files = f"\n{b.files}" if b.changes == 1 else f"\nlast: {b.files}"
            ticks.append((b.last, text + (files if b.files else "")))
        return ticks

    def _progress_curve(self) -> tuple[list[float | None], list[float | None]]:
        """A sawtooth: seconds since the last change (or the start), dropping at each change
        (at the longest gap of each bin, whose other changes drop it to zero)."""
        lost = None if self.detail is not None else self._events_lost()
        xs: list[float | None] = [0.0]
        ys: list[float | None] = [0.0]
        previous = 0.0
        for b in in_slices(self.progress, PROGRESS_CURVE_POINTS):
            t, gap, last = b.longest_gap_t, b.longest_gap, b.last
            if lost is not None and previous <= lost[0] < t:
                # The artifact kept no events here: break the curve instead of inventing a gap.
                xs.extend([self.x(lost[0]), None, self.x(lost[1])])
                ys.extend([lost[0] - previous, None, 0.0])
                gap = t - lost[1]
            xs.extend([self.x(t), self.x(t)] + ([self.x(last)] if last > t else []))
            ys.extend([round(gap, 3), 0.0] + ([0.0] if last > t else []))
            previous = last
        # After the command's exit the time since progress means nothing: the curve ends there.
        exits = event_times(self.artifact, EventKind.EXITED)
        end = max(previous, min([self.duration, *exits]))
        xs.append(self.x(end))
        ys.append(round(end - previous, 3))
        return xs, ys

    def _process_lines(self) -> list[tuple[str, list[float], list[float | None]]]:
        """(name, t, RSS) of the top processes the artifact kept, at most PROCESS_LINES."""
        return [
            (f"pid {p['pid']} {p['name'] or ''}".strip(), schema.series_times(s), s["rss_bytes"])
            for p in top_processes(self.artifact)[:PROCESS_LINES]
            if column(s := p["series"], "t") and column(s, "rss_bytes")
        ]

    def baseline_values(self, f: Field) -> tuple[list[float], list[float | None]] | None:
        """The baseline run's (times, values as drawn) of the same field; None without one."""
        base = self.baseline_series.get(f.group)
        if base is None or not column(base, f.name):
            return None
        times, values = list(base["t"]), list(base[f.name])
        return times, rates(times, values) if (f.group, f.name) in COUNTERS else values

    def slope_lines(self) -> list[str]:
        """The memory trends written on the memory panel: the tree's, each leaking process's."""
        trends = trend_verdicts(self.artifact)
        lines = []
        for key, figure in TREE_MEMORY_SERIES:
            entry = trends.get(key)  # a series judged too short has no trend
            if entry is not None and isinstance(slope := entry["slope_per_hour"], int | float):
                rate = rate_text(float(slope), "bytes", float(entry["span_seconds"]))
                lines.append(f"tree memory ({figure}) {rate} ({entry['verdict']})")
        for leak in leaking_series(self.artifact):
            slope, growth = leak["slope_per_hour"], leak["growth"]
            if leak["series"].startswith("process.") and isinstance(slope, int | float):
                like = float(growth) if isinstance(growth, int | float) else None
                rate = rate_text(float(slope), "bytes", float(leak["span_seconds"]), like=like)
                lines.append(f"{leak['label'] or leak['series']}: {rate} (leak)")
        return lines

    def progress_limits(self, peak: float) -> tuple[list[Limit], list[str]]:
        """The liveness limits to draw on the time-since-progress panel, and the labels of
        those too far above every gap (the longest, ``peak``) to draw to scale."""
        first = self.progress[0].first if self.progress else None
        startup = config_value(self.artifact, "startup_timeout_seconds")
        stale = config_value(self.artifact, "stale_progress_seconds")
        in_scale = max(peak, 1e-3) * LIMIT_HEADROOM
        limits = []
        if stale is not None and first is not None:
            limits.append(
                Limit(first, self.duration, stale, f"stale limit {format_duration(stale)}")
            )
        if startup is not None and (first is None or startup <= in_scale):
            # Once progress was seen the startup limit no longer matters: only drawn to scale.
            end = first if first is not None else self.duration
            limits.append(Limit(0.0, end, startup, f"startup limit {format_duration(startup)}"))
        shown = [limit for limit in limits if limit.value <= in_scale]
        return shown, [limit.label for limit in limits if limit not in shown]


def _merged(group: Sequence[Mark]) -> Mark:
    """One mark for a group: the most telling one's, at its time, ``+N`` the others."""
    if len(group) == 1:
        return group[0]
    labelled = [m for m in group if m.label] or list(group)
    lead = min(labelled, key=lambda m: LABEL_RANKS.get(m.label, 2 if m.dash is None else 1))
    label = f"{lead.label} +{len(group) - 1}" if lead.label else ""
    hover = "\n\n".join(m.hover for m in group)
    return Mark(lead.t, lead.lane, label, hover, lead.color, lead.symbol, lead.dash)


class ProgressBin(NamedTuple):
    """Neighbouring progress changes (one change, for a run of few), as ``progress.bins``."""

    first: float
    last: float
    changes: int
    #: The longest gap before a change of the bin (from the change before, or the start).
    longest_gap: float
    longest_gap_t: float
    files: str


@dataclass(slots=True)
class RunDetail:
    """Every progress change, in bins in time order, and GPU throttling over time."""

    progress: list[ProgressBin] = field(default_factory=list)
    #: group -> [(start, end, reasons)]
    throttle_spans: dict[str, list[tuple[float, float, list[str]]]] = field(default_factory=dict)


def one_change_bins(changes: Iterable[tuple[float, str]]) -> list[ProgressBin]:
    """A bin per change, (time, files), in time order."""
    bins, before = [], 0.0
    for t, files in sorted(changes):
        bins.append(ProgressBin(t, t, 1, t - before, t, files))
        before = t
    return bins


def kept_bins(artifact: Artifact) -> list[ProgressBin]:
    """A bin per progress change the artifact's events kept."""
    kept = (e for e in artifact["events"] if e["kind"] == EventKind.PROGRESS)
    return one_change_bins((float(e["t"]), file_names(e["paths"])) for e in kept)


def in_slices(bins: Sequence[ProgressBin], count: int) -> list[ProgressBin]:
    """``bins`` merged into at most ``count`` slices of the run's time, each keeping its
    longest gap (a day of changes every second would not draw in time)."""
    if len(bins) <= count:
        return list(bins)
    start = bins[0].first
    width = (bins[-1].last - start) / count or 1.0
    slices: dict[int, list[ProgressBin]] = {}
    for b in bins:
        slices.setdefault(min(int((b.last - start) / width), count - 1), []).append(b)
    merged = []
    for members in slices.values():
        longest = max(members, key=lambda b: b.longest_gap)
        changes = sum(b.changes for b in members)
        merged.append(
            ProgressBin(
                members[0].first, members[-1].last, changes, *longest[3:5], members[-1].files
            )
        )
    return merged


def artifact_detail(artifact: Artifact) -> RunDetail | None:
    """The detail the artifact holds; None for one written before ``progress.bins``."""
    bins = artifact["progress"].get("bins")
    if bins is None:
        return None
    keys = ("first_t", "last_t", "changes", "longest_gap_seconds", "longest_gap_t", "files")
    columns: Mapping[str, Any] = bins
    rows = zip(*(columns[k] for k in keys), strict=True)
    detail = RunDetail([ProgressBin(*row) for row in rows])
    for group, health in artifact.get("gpu_health", {}).items():
        for span in health.get("throttle_spans", []):
            reasons = [r for r in span["reasons"] if r not in IDLE_THROTTLE]
            if reasons:
                spans = detail.throttle_spans.setdefault(group, [])
                spans.append((span["start"], span["end"], reasons))
    return detail


def read_journal_detail(
    path: Path,
    kinds: frozenset[str] = frozenset({EventKind.PROGRESS, EventKind.GPU_SAMPLE}),
    end: float = 0.0,
) -> RunDetail:
    """Progress changes and throttle spans from a journal's lines of ``kinds`` (throttling is
    only in GPU samples), skipping lines it cannot read; throttling still going on is closed
    at the last event read, or at ``end`` if later."""
    fold = _DetailFold()
    fold.last_t = end
    for event in JournalReader(path, kinds):
        fold.add(event)
    return fold.end()


class _DetailFold:
    """A journal's events folded into its :class:`RunDetail`."""

    _fold: ClassVar[events.EventFold[_DetailFold]] = events.EventFold()

    def __init__(self) -> None:
        self.detail = RunDetail()
        self.changes: list[tuple[float, str]] = []
        #: group -> (start, reasons) of the throttling going on.
        self.open_spans: dict[str, tuple[float, set[str]]] = {}
        self.last_t = 0.0

    def add(self, event: events.EventJson) -> None:
        self.last_t = max(self.last_t, float(event.get("t", 0.0)))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: events.ProgressJson) -> None:
        self.changes.append((t, file_names(event.get("paths"))))

    @_fold.on(EventKind.SAMPLE, EventKind.GPU_SAMPLE)
    def _on_sample(self, t: float, event: events.SampleJson | events.GpuSampleJson) -> None:
        for group, labels in (event.get("labels") or {}).items():
            reasons = set(labels.get("throttle_reasons") or []) - IDLE_THROTTLE
            current = self.open_spans.get(group)
            if current is not None and current[1] != reasons:
                spans = self.detail.throttle_spans.setdefault(group, [])
                spans.append((current[0], t, sorted(current[1])))
                current = None
                del self.open_spans[group]
            if reasons and current is None:
                self.open_spans[group] = (t, reasons)

    def end(self) -> RunDetail:
        """The detail, the throttling still going on at the last event closed there."""
        for group, (start, reasons) in self.open_spans.items():
            spans = self.detail.throttle_spans.setdefault(group, [])
            spans.append((start, self.last_t, sorted(reasons)))
        self.detail.progress = one_change_bins(self.changes)
        return self.detail


def detail_for(artifact: Artifact, journal: Path | None) -> RunDetail | None:
    """The run's detail: the artifact's, else what an older artifact lacks read from its
    journal (``journal``, else the one it names); None when that journal cannot be read."""
    detail = artifact_detail(artifact)
    if detail is not None:
        return detail
    recorded = artifact["monitor"]["journal_path"]
    path = journal or (Path(recorded) if recorded else None)
    if path is None or not path.is_file():
        return None
    dropped = events_dropped(artifact) > 0
    kinds = {EventKind.PROGRESS} if dropped else set()
    if any(throttled(artifact, group) for group in artifact["summary"]):
        kinds.add(EventKind.GPU_SAMPLE)
    try:
        end = max((float(e["t"]) for e in artifact["events"]), default=0.0)
        detail = read_journal_detail(path, frozenset(kinds), end) if kinds else RunDetail()
    except (OSError, bounded.UnreadableFileError):
        return None
    if not dropped:
        detail.progress = kept_bins(artifact)
    return detail
