"""What the report's figure shows, as plain data: the marks of the lane, the panels, the
progress curve and its limits, on one time axis.

:class:`TimelineModel` decides what is drawn and where; ``_figure`` draws it with plotly.
Nothing here imports plotly, so what the figure shows is tested without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any, NamedTuple

from ..._analysis import TREE_MEMORY_SERIES
from ..._contract import (
    Artifact,
    EventKind,
    FailureReason,
    file_names,
    format_duration,
    parse_iso,
    schema,
)
from ..._record import EVENTS_HEAD
from .._evidence import leaking_series, rate_text
from .._fields import Field, group_label
from .._sections import (
    column,
    config_value,
    event_times,
    events_dropped,
    top_processes,
    trend_verdicts,
)
from ._detail import ProgressBin, RunDetail, artifact_detail, in_slices, one_change_bins
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

#: A lane label's width, estimated: pixels per character at its size (12 px), and pixels of
#: its marker and the gap beside it.
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


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment drawn across every panel and in the lane."""

    t: float
    lane: str
    #: Plain text, escaped for plotly when drawn (``plot_text``); the hover's lines split by
    #: newlines.
    label: str
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
        self,
        artifact: Artifact,
        detail: RunDetail | None,
        baseline: Artifact | None = None,
    ) -> None:
        self.artifact = artifact
        self.detail = detail if detail is not None else artifact_detail(artifact)
        self.baseline_series: Mapping[str, Mapping[str, Sequence[Any]]] = (
            baseline["series"] if baseline is not None else {}
        )
        self.duration = max(float(artifact["duration_seconds"]), 1e-3)
        if self.duration <= 900:
            self.x_divisor, self.x_unit = 1.0, "seconds"
        elif self.duration <= 36_000:
            self.x_divisor, self.x_unit = 60.0, "minutes"
        else:
            self.x_divisor, self.x_unit = 3600.0, "hours"
        self.series: Mapping[str, Mapping[str, Sequence[Any]]] = artifact["series"]
        self.steady: list[Field] = []
        self.panels = self._fold_steady(plan_panels(self.series))
        self.progress = self._progress_bins()
        self.marks = self._marks()
        self.throttle = self._throttle_spans()

    def values(self, f: Field) -> list[float | None]:
        """A field's values as drawn: counters as rates per second."""
        series = self.series[f.group]
        if (f.group, f.name) in COUNTERS:
            return rates(series["t"], series[f.name])
        return list(series[f.name])

    def _is_steady(self, f: Field) -> bool:
        """Whether a line stays flat: within STEADY_SHARE of its peak all along."""
        values = [v for v in self.values(f) if v is not None]
        return not values or max(values) - min(values) <= STEADY_SHARE * max(abs(max(values)), 1e-9)

    def _fold_steady(self, planned: list[Panel]) -> list[Panel]:
        """The panels with their flat lines taken out (into ``steady``); a panel left with
        none is not drawn.  ALWAYS_DRAWN panels are drawn whole (flat CPU or memory is itself
        a finding).  A reference line (a power limit, a memory total) stays beside a line
        that moves, and is folded with the rest when none does."""
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
        """The folded panels in one line: ``open files 3 · disk free 78.8 GiB``."""
        items = []
        for f in self.steady:
            values = [v for v in self.values(f) if v is not None]
            if not values:
                continue
            shown = format_in_unit(values[-1], field_unit(f))
            who = "" if f.group == "tree" else f"{group_label(f.group)} "
            items.append(f"{who}{field_label(f)} {shown}")
        return " · ".join(items)

    def x(self, t: float) -> float:
        return round(t / self.x_divisor, 6)

    def _events_lost(self) -> tuple[float, float] | None:
        """The stretch whose events the artifact did not keep (head and tail are kept)."""
        events = self.artifact["events"]
        if not events_dropped(self.artifact) or len(events) <= EVENTS_HEAD:
            return None
        return float(events[EVENTS_HEAD - 1]["t"]), float(events[EVENTS_HEAD]["t"])

    def _progress_bins(self) -> list[ProgressBin]:
        """Every progress change in bins (the detail's), else those of the events kept."""
        if self.detail is not None:
            return self.detail.progress
        kept = self.artifact["events"]
        return one_change_bins(
            (float(e["t"]), file_names(e["paths"])) for e in kept if e["kind"] == EventKind.PROGRESS
        )

    def _marks(self) -> list[Mark]:
        marks: list[Mark] = []
        artifact = self.artifact
        for event in artifact["events"]:
            # Each branch tests ``event["kind"]`` itself, which narrows the event to its kind's
            # JSON form.
            kind = event["kind"]
            t = float(event["t"])
            when = f"{format_duration(t)} ({self._wall(t)})"
            if event["kind"] == EventKind.FAILURE:
                marks.append(
                    Mark(
                        t,
                        "failure",
                        str(event["reason"]),
                        f"failure {event['reason']} at {when}\n{event['message']}",
                        COLORS["failure"],
                        "x",
                        "solid",
                    )
                )
            elif event["kind"] == EventKind.SIGNAL:
                marks.append(
                    Mark(
                        t,
                        "monitor",
                        str(event["signal"]),
                        f"{event['signal']} sent to the {event['target']} at {when}"
                        f"\npids {pids(event['pids'])}",
                        COLORS["signal"],
                        "triangle-down",
                        "dash",
                    )
                )
            elif event["kind"] in (EventKind.STOP, EventKind.STDIN_CLOSED):
                text = (
                    f"stop ({event['cause']}, grace {event['grace_seconds']}s)"
                    if event["kind"] == EventKind.STOP
                    else "stdin closed"
                )
                marks.append(
                    Mark(t, "monitor", "", f"{text} at {when}", COLORS["signal"], "square", None)
                )
            elif event["kind"] == EventKind.EXITED:
                text = exit_label(artifact)
                marks.append(
                    Mark(t, "command", text, f"{text} at {when}", COLORS["exit"], "diamond", "dot")
                )
            elif event["kind"] == EventKind.STARTED:
                marks.append(
                    Mark(
                        t,
                        "command",
                        "started",
                        f"started pid {event['pid']} at {when}",
                        COLORS["exit"],
                        "circle-open",
                        None,
                    )
                )
            elif event["kind"] == EventKind.FORENSICS:
                marks.append(
                    Mark(
                        t,
                        "monitor",
                        "",
                        f"forensics of {event['processes']} process(es) at {when}"
                        "\n(see Forensics, below the plots)",
                        COLORS["leftover"],
                        "star",
                        None,
                    )
                )
            elif event["kind"] == EventKind.OOM_KILL:
                marks.append(
                    Mark(
                        t,
                        "failure",
                        "OOM kill",
                        f"the kernel's OOM killer killed pid {event['pid']} "
                        f"({event['name']}) at {when}",
                        COLORS["failure"],
                        "x-open",
                        "dot",
                    )
                )
            elif event["kind"] in (EventKind.LEFTOVER, EventKind.ABANDONED):
                process = event["process"]
                marks.append(
                    Mark(
                        t,
                        "monitor",
                        "",
                        f"{kind}: pid {process['pid']} {process['name']} at {when}",
                        COLORS["leftover"],
                        "circle",
                        None,
                    )
                )
            elif event["kind"] == EventKind.TREND:
                marks.append(
                    Mark(
                        t,
                        "notes",
                        "leak" if event["verdict"] == "leak" else "breach ahead",
                        f"{event['verdict']} ({event['series']}) at {when}\n{event['message']}",
                        COLORS["failure"],
                        "triangle-up",
                        None,
                    )
                )
            elif event["kind"] in (
                EventKind.WARNING,
                EventKind.SAMPLER_DEGRADED,
                EventKind.SAMPLER_RECOVERED,
                EventKind.SAMPLER_NOTE,
            ):
                who = event.get("sampler", "monitor")  # a warning is the monitor's own
                marks.append(
                    Mark(
                        t,
                        "notes",
                        "warning" if event["kind"] == EventKind.WARNING else "sampler",
                        f"{kind} ({who}) at {when}\n{event['message']}",
                        COLORS["note"],
                        "circle",
                        None,
                    )
                )
        if not event_times(artifact, EventKind.FAILURE):
            # A monitor lost has no failure event: the journal just ends.
            for failure in artifact["failures"]:
                if failure["reason"] == FailureReason.MONITOR_LOST:
                    marks.append(
                        Mark(
                            self.duration,
                            "failure",
                            FailureReason.MONITOR_LOST,
                            f"the journal ends here: the monitor died\n{failure['message']}",
                            COLORS["failure"],
                            "x",
                            "solid",
                        )
                    )
        return marks

    def _throttle_spans(self) -> dict[str, list[tuple[float, float, list[str]]]]:
        if self.detail is not None:
            return self.detail.throttle_spans
        return {}

    def _wall(self, t: float) -> str:
        started = self.artifact["started_at"]
        if not started:
            return ""
        moment = parse_iso(started) + timedelta(seconds=t)
        return moment.astimezone(UTC).strftime("%H:%M:%S UTC")

    def lane_marks(self, lane: str) -> list[Mark]:
        """The lane's marks as drawn: marks whose labels or markers would overlap are merged
        into one, labelled by the most telling of them with ``+N``, every hover kept."""
        per_px = self.duration * 1.02 / LANE_PLOT_PX
        groups = [[m] for m in sorted((m for m in self.marks if m.lane == lane), key=_time)]
        merging = True
        while merging:
            # A label drawn to the left can reach past its neighbour: any two groups whose
            # drawn spans meet are merged, until none do.
            spans = [self._label_span(_merged(group), per_px) for group in groups]
            pairs = (
                (i, j)
                for i in range(len(groups))
                for j in range(i + 1, len(groups))
                if _overlaps(spans[i], spans[j])
            )
            pair = next(pairs, None)
            merging = pair is not None
            if pair is not None:
                i, j = pair
                groups[i] = sorted(groups[i] + groups.pop(j), key=_time)
        return [_merged(group) for group in groups]

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
        failure (``nonfinite_loss``) or a warning (``--loss-check warn``)."""
        found = []
        for event in self.artifact["events"]:
            if event["kind"] in (EventKind.FAILURE, EventKind.WARNING):
                match = NONFINITE_LOSS.match(str(event["message"]))
                if match is not None:
                    found.append((float(event["t"]), f"loss {match[1]} at step {match[2]}"))
        return found

    def lanes(self) -> list[str]:
        order = ["progress", "command", "monitor", "failure", "notes"]
        used = {m.lane for m in self.marks} | {"progress", "command"}
        lanes = [lane for lane in order if lane in used]
        lanes.extend(f"{g} throttled" for g in sorted(self.throttle, key=group_sort_key))
        return lanes

    def _progress_ticks(self) -> list[tuple[float, str]]:
        """(time, hover text) of the lane's progress ticks: one per change, or, past
        PROGRESS_TICKS, one per slice of the run naming how many changes it holds and the
        files of its last one."""
        ticks = []
        for b in in_slices(self.progress, PROGRESS_TICKS):
            text = (
                f"progress at {format_duration(b.last)} ({self._wall(b.last)})"
                if b.changes == 1
                else f"{b.changes} progress changes, {format_duration(b.first)} to "
                f"{format_duration(b.last)} ({self._wall(b.last)})"
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
        lines = []
        for p in top_processes(self.artifact)[:PROCESS_LINES]:
            series = p["series"]
            if column(series, "t") and column(series, "rss_bytes"):
                lines.append(
                    (
                        f"pid {p['pid']} {p['name'] or ''}".strip(),
                        schema.series_times(series),
                        series["rss_bytes"],
                    )
                )
        return lines

    def baseline_values(self, f: Field) -> tuple[list[float], list[float | None]] | None:
        """The baseline run's (times, values as drawn) of the same field; None when there is
        no baseline, or it did not sample the field."""
        base = self.baseline_series.get(f.group)
        if base is None or not column(base, f.name):
            return None
        times, values = list(base["t"]), list(base[f.name])
        if (f.group, f.name) in COUNTERS:
            values = rates(times, values)
        return times, values

    def slope_lines(self) -> list[str]:
        """The memory trends written on the memory panel: the tree's, and each leaking
        process's."""
        trends = trend_verdicts(self.artifact)
        lines = []
        for key, figure in TREE_MEMORY_SERIES:
            entry = trends.get(key)  # a series judged too short has no trend
            if entry is not None and isinstance(entry["slope_per_hour"], int | float):
                lines.append(
                    f"tree memory ({figure}) "
                    + rate_text(
                        float(entry["slope_per_hour"]),
                        "bytes",
                        float(entry["span_seconds"]),
                    )
                    + f" ({entry['verdict']})"
                )
        for leak in leaking_series(self.artifact):
            slope = leak["slope_per_hour"]
            if leak["series"].startswith("process.") and isinstance(slope, int | float):
                growth = leak["growth"]
                rate = rate_text(
                    float(slope),
                    "bytes",
                    float(leak["span_seconds"]),
                    like=float(growth) if isinstance(growth, int | float) else None,
                )
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


def _time(mark: Mark) -> float:
    return mark.t


def _label_rank(mark: Mark) -> int:
    """Which label names a merged group of marks: the lowest rank (the rest are in its
    hover).  A leak or an OOM kill leads; any other mark drawn as a line across the panels
    (a failure, a signal, the exit) comes before one that is not."""
    match mark.label:
        case "leak" | "OOM kill":
            return 0
        case "breach ahead":
            return 1
        case "warning":
            return 2
        case "sampler":
            return 3
        case _:
            return 2 if mark.dash is None else 1


def _merged(group: Sequence[Mark]) -> Mark:
    """One mark for a group: the most telling one's, at its time, ``+N`` the others."""
    if len(group) == 1:
        return group[0]
    labelled = [m for m in group if m.label] or list(group)
    lead = min(labelled, key=_label_rank)
    return Mark(
        lead.t,
        lead.lane,
        f"{lead.label} +{len(group) - 1}" if lead.label else "",
        "\n\n".join(m.hover for m in group),
        lead.color,
        lead.symbol,
        lead.dash,
    )


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]
