"""The plotly figure: a lane of what happened, time since progress, one panel per series group.

Its panels share one time axis; the moments that matter are drawn across every panel.
plotly is an optional extra, imported only when a figure is drawn.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from ..._analysis import TREE_MEMORY_SERIES
from ..._contract import (
    Artifact,
    EventKind,
    FailureReason,
    format_duration,
    parse_iso,
    series_times,
)
from ..._record import EVENTS_HEAD
from .._evidence import (
    config_value,
    event_times,
    leaking_series,
    rate_text,
    stall_window,
)
from .._fields import Field, gpu_index, group_label
from ._assets import READOUT_SCRIPT, RENDERED_SCRIPT
from ._detail import JournalDetail, file_names
from ._panels import (
    ALWAYS_DRAWN,
    COUNTERS,
    STEADY_SHARE,
    Panel,
    Scale,
    field_label,
    field_unit,
    format_in_unit,
    group_sort_key,
    other_title,
    plan_panels,
    scale_for,
)
from ._tables import exit_label, pids
from ._text import plot_text

#: Vertical lines drawn for progress changes at most (more are merged by time).
PROGRESS_LINES = 300

#: Progress ticks in the lane at most (more are merged by time, their count in the hover).
PROGRESS_TICKS = 1500

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

#: Which label names a merged group of marks: the lowest rank (the rest are in its hover).
LABEL_RANK = {"leak": 0, "OOM kill": 0, "breach ahead": 1, "warning": 2, "sampler": 3}

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


PALETTE = (
    "#1f77b4",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#7f7f7f",
    "#ff7f0e",
)


class Figure(Protocol):
    """What the drawing uses of a plotly ``go.Figure`` (plotly ships no type information)."""

    @property
    def layout(self) -> Any: ...
    def add_trace(self, trace: object, *, row: int, col: int) -> object: ...
    def add_annotation(self, **options: Any) -> object: ...
    def add_vrect(self, **options: Any) -> object: ...
    def update_layout(self, changes: Mapping[str, Any] | None = None, **options: Any) -> object: ...
    def update_xaxes(self, **options: Any) -> object: ...
    def update_yaxes(self, **options: Any) -> object: ...
    def get_subplot(self, row: int, col: int) -> Any: ...
    def to_html(self, **options: Any) -> str: ...


#: ``go.Scatter``: the one trace type the figure draws.
Scatter = Callable[..., object]


@dataclass(frozen=True, slots=True)
class _Mark:
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


class Timeline:
    """One plotly figure: the lane, time since progress, and every series panel."""

    def __init__(
        self,
        artifact: Artifact,
        detail: JournalDetail | None,
        baseline: Artifact | None = None,
    ) -> None:
        self.artifact = artifact
        self.detail = detail
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
        self.progress_times = self._progress_times()
        self.marks = self._marks()
        self.throttle = self._throttle_spans()
        self.panel_titles: list[str] = []
        #: The unit each drawn panel's axis got, by panel key.
        self.panel_units: dict[str, str] = {}

    # -- data ---------------------------------------------------------------------------

    def values(self, f: Field) -> list[float | None]:
        """A field's values as drawn: counters as rates per second."""
        series = self.series[f.group]
        if (f.group, f.name) in COUNTERS:
            return _rates(series["t"], series[f.name])
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
            moving = [f for f in panel.fields if not _is_reference(f) and not self._is_steady(f)]
            if moving:
                moving = [f for f in panel.fields if f in moving or _is_reference(f)]
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
        if not self.artifact.get("events_dropped") or len(events) <= EVENTS_HEAD:
            return None
        return float(events[EVENTS_HEAD - 1]["t"]), float(events[EVENTS_HEAD]["t"])

    def _progress_times(self) -> list[float]:
        """Every progress time (the journal's when there is one); sets ``progress_files``."""
        if self.detail is not None:
            pairs = sorted(zip(self.detail.progress_times, self.detail.progress_files, strict=True))
        else:
            pairs = [
                (float(e["t"]), file_names(e.get("paths")))
                for e in self.artifact["events"]
                if e["kind"] == EventKind.PROGRESS
            ]
        self.progress_files = [files for _, files in pairs]
        return [t for t, _ in pairs]

    def _marks(self) -> list[_Mark]:
        marks: list[_Mark] = []
        artifact = self.artifact
        for event in artifact["events"]:
            kind = event["kind"]
            t = float(event["t"])
            when = f"{format_duration(t)} ({self._wall(t)})"
            if kind == EventKind.FAILURE:
                marks.append(
                    _Mark(
                        t,
                        "failure",
                        str(event.get("reason")),
                        f"failure {event.get('reason')} at {when}\n{event.get('message')}",
                        COLORS["failure"],
                        "x",
                        "solid",
                    )
                )
            elif kind == EventKind.SIGNAL:
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        str(event.get("signal")),
                        f"{event.get('signal')} sent to the {event.get('target')} at {when}"
                        f"\npids {pids(event.get('pids'))}",
                        COLORS["signal"],
                        "triangle-down",
                        "dash",
                    )
                )
            elif kind in (EventKind.STOP, EventKind.STDIN_CLOSED):
                text = (
                    f"stop ({event.get('cause')}, grace {event.get('grace_seconds')}s)"
                    if kind == EventKind.STOP
                    else "stdin closed"
                )
                marks.append(
                    _Mark(t, "monitor", "", f"{text} at {when}", COLORS["signal"], "square", None)
                )
            elif kind == EventKind.EXITED:
                text = exit_label(artifact)
                marks.append(
                    _Mark(t, "command", text, f"{text} at {when}", COLORS["exit"], "diamond", "dot")
                )
            elif kind == EventKind.STARTED:
                marks.append(
                    _Mark(
                        t,
                        "command",
                        "started",
                        f"started pid {event.get('pid')} at {when}",
                        COLORS["exit"],
                        "circle-open",
                        None,
                    )
                )
            elif kind == EventKind.FORENSICS:
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        "",
                        f"forensics of {event.get('processes')} process(es) at {when}"
                        "\n(see Forensics, below the plots)",
                        COLORS["leftover"],
                        "star",
                        None,
                    )
                )
            elif kind == EventKind.OOM_KILL:
                marks.append(
                    _Mark(
                        t,
                        "failure",
                        "OOM kill",
                        f"the kernel's OOM killer killed pid {event.get('pid')} "
                        f"({event.get('name')}) at {when}",
                        COLORS["failure"],
                        "x-open",
                        "dot",
                    )
                )
            elif kind in (EventKind.LEFTOVER, EventKind.ABANDONED):
                process = event.get("process") or {}
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        "",
                        f"{kind}: pid {process.get('pid')} {process.get('name')} at {when}",
                        COLORS["leftover"],
                        "circle",
                        None,
                    )
                )
            elif kind == EventKind.TREND:
                marks.append(
                    _Mark(
                        t,
                        "notes",
                        "leak" if event.get("verdict") == "leak" else "breach ahead",
                        f"{event.get('verdict')} ({event.get('series')}) at {when}\n"
                        f"{event.get('message')}",
                        COLORS["failure"],
                        "triangle-up",
                        None,
                    )
                )
            elif kind in (
                EventKind.WARNING,
                EventKind.SAMPLER_DEGRADED,
                EventKind.SAMPLER_RECOVERED,
                EventKind.SAMPLER_NOTE,
            ):
                who = event.get("sampler") or "monitor"
                marks.append(
                    _Mark(
                        t,
                        "notes",
                        "warning" if kind == EventKind.WARNING else "sampler",
                        f"{kind} ({who}) at {when}\n{event.get('message')}",
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
                        _Mark(
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

    # -- figure -------------------------------------------------------------------------

    def lane_marks(self, lane: str) -> list[_Mark]:
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

    def _label_span(self, mark: _Mark, per_px: float) -> tuple[float, float]:
        """The time span a mark's marker and label cover on the lane."""
        width = (len(mark.label) * LABEL_CHAR_PX + LABEL_MARKER_PX) * per_px
        half = LABEL_MARKER_PX / 2 * per_px
        if self._label_left(mark):
            return mark.t - width, mark.t + half
        return mark.t - half, mark.t + width

    def _label_left(self, mark: _Mark) -> bool:
        """Labels past 60 % of the run are written to the left of their mark."""
        return mark.t > self.duration * 0.6

    def lanes(self) -> list[str]:
        order = ["progress", "command", "monitor", "failure", "notes"]
        used = {m.lane for m in self.marks} | {"progress", "command"}
        lanes = [lane for lane in order if lane in used]
        lanes.extend(f"{g} throttled" for g in sorted(self.throttle, key=group_sort_key))
        return lanes

    def to_html(self) -> str:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        lanes = self.lanes()
        lane_height = 36 + 24 * len(lanes)
        titles = ["What happened", "Time since the last progress (seconds)"]
        heights = [lane_height, 170]
        titles.extend(panel.title for panel in self.panels)
        heights.extend(190 for _ in self.panels)
        gap = 62
        top, bottom = 40, 50
        plot_height = sum(heights) + gap * (len(heights) - 1)
        fig: Figure = make_subplots(
            rows=len(heights),
            cols=1,
            shared_xaxes=True,
            row_heights=heights,
            vertical_spacing=gap / plot_height,
            subplot_titles=[plot_text(title) for title in titles],
        )
        self.panel_titles = titles
        self._draw_lanes(fig, go.Scatter, lanes)
        self._draw_progress(fig, go.Scatter)
        for row, panel in enumerate(self.panels, start=3):
            self._draw_panel(fig, go.Scatter, row, panel)
        self._draw_marks_across(fig)
        self._style(fig, len(heights), plot_height + top + bottom, top, bottom)
        return str(
            fig.to_html(
                full_html=False,
                include_plotlyjs=True,
                div_id="timeline",
                default_height=f"{plot_height + top + bottom}px",
                config={"displaylogo": False, "responsive": True, "scrollZoom": False},
                post_script=[self._readout_script(), RENDERED_SCRIPT],
            )
        )

    def _draw_lanes(self, fig: Figure, scatter: Scatter, lanes: list[str]) -> None:
        y_of = {lane: -i for i, lane in enumerate(lanes)}
        window = stall_window(self.artifact)
        if window is not None and window[0] > 0:
            fig.add_annotation(
                x=self.x(window[0]),
                y=y_of["progress"],
                xref="x",
                yref="y",
                xanchor="right" if window[0] > self.duration * 0.6 else "left",
                text=f"last progress {format_duration(window[0])}",
                showarrow=False,
                xshift=-8 if window[0] > self.duration * 0.6 else 8,
                font={"color": COLORS["progress"], "size": 12},
            )
        if self.progress_times:
            ticks = self._progress_ticks()
            xs = [self.x(t) for t, _ in ticks]
            tick_texts = [plot_text(text) for _, text in ticks]
            fig.add_trace(
                scatter(
                    x=xs,
                    y=[y_of["progress"]] * len(xs),
                    mode="markers",
                    marker={"symbol": "line-ns-open", "size": 14, "color": COLORS["progress"]},
                    name="progress",
                    hovertext=tick_texts,
                    hovertemplate="%{hovertext}<extra></extra>",
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
        for lane in lanes:
            marks = self.lane_marks(lane)
            if not marks:
                continue
            fig.add_trace(
                scatter(
                    x=[self.x(m.t) for m in marks],
                    y=[y_of[lane]] * len(marks),
                    mode="markers+text",
                    text=[plot_text(m.label) for m in marks],
                    textposition=[
                        "middle left" if self._label_left(m) else "middle right" for m in marks
                    ],
                    textfont={"size": 12, "color": [m.color for m in marks]},
                    marker={
                        "symbol": [m.symbol for m in marks],
                        "size": 13,
                        "color": [m.color for m in marks],
                        "line": {"width": 2, "color": [m.color for m in marks]},
                    },
                    hovertext=[plot_text(m.hover) for m in marks],
                    hovertemplate="%{hovertext}<extra></extra>",
                    cliponaxis=False,
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
        for group, spans in self.throttle.items():
            span_xs: list[float | None] = []
            span_ys: list[float | None] = []
            texts: list[str | None] = []
            for start, end, reasons in spans:
                span_xs.extend([self.x(start), self.x(end), None])
                span_ys.extend([y_of[f"{group} throttled"], y_of[f"{group} throttled"], None])
                text = plot_text(f"{group} throttled: {', '.join(reasons)}")
                texts.extend([text, text, None])
            fig.add_trace(
                scatter(
                    x=span_xs,
                    y=span_ys,
                    mode="lines",
                    line={"width": 10, "color": "orange"},
                    text=texts,
                    hovertemplate="%{text}<extra></extra>",
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
        fig.update_yaxes(
            row=1,
            col=1,
            tickvals=[y_of[lane] for lane in lanes],
            ticktext=[plot_text(lane) for lane in lanes],
            range=[-len(lanes) + 0.4, 0.6],
            showgrid=True,
            zeroline=False,
            fixedrange=True,
        )

    def _progress_ticks(self) -> list[tuple[float, str]]:
        """(time, hover text) of the lane's progress ticks: one per change, or, past
        PROGRESS_TICKS, one per slice of the run naming how many changes it holds and the
        files of its last one (a day of changes every second would not draw in time)."""
        times, files = self.progress_times, self.progress_files
        if len(times) <= PROGRESS_TICKS:
            return [
                (
                    t,
                    f"progress at {format_duration(t)} ({self._wall(t)})" + (f"\n{f}" if f else ""),
                )
                for t, f in zip(times, files, strict=True)
            ]
        width = (times[-1] - times[0]) / PROGRESS_TICKS or 1.0
        slices: dict[int, list[int]] = {}
        for i, t in enumerate(times):
            slices.setdefault(int((t - times[0]) / width), []).append(i)
        ticks = []
        for members in slices.values():
            first, last = times[members[0]], times[members[-1]]
            text = (
                f"{len(members)} progress changes, {format_duration(first)} to "
                f"{format_duration(last)} ({self._wall(last)})"
            )
            if files[members[-1]]:
                text += f"\nlast: {files[members[-1]]}"
            ticks.append((last, text))
        return ticks

    def _progress_curve(self) -> tuple[list[float | None], list[float | None]]:
        """A sawtooth: seconds since the last change (or the start), dropping at each change."""
        lost = None if self.detail is not None else self._events_lost()
        times = self.progress_times
        # Each change's own gap, from the change before it; thinning keeps the true peaks.
        gaps = [t - before for before, t in zip([0.0, *times], times, strict=False)]
        kept = (
            _thin_keeping_gaps(gaps, PROGRESS_CURVE_POINTS)
            if len(times) > PROGRESS_CURVE_POINTS
            else range(len(times))
        )
        xs: list[float | None] = [0.0]
        ys: list[float | None] = [0.0]
        previous = 0.0
        for i in kept:
            t, gap = times[i], gaps[i]
            if lost is not None and previous <= lost[0] < t:
                # The artifact kept no events here: break the curve instead of inventing a gap.
                xs.extend([self.x(lost[0]), None, self.x(lost[1])])
                ys.extend([lost[0] - previous, None, 0.0])
                gap = t - lost[1]
            xs.extend([self.x(t), self.x(t)])
            ys.extend([round(gap, 3), 0.0])
            previous = t
        # After the command's exit the time since progress means nothing: the curve ends there.
        exits = event_times(self.artifact, EventKind.EXITED)
        end = max(previous, min([self.duration, *exits]))
        xs.append(self.x(end))
        ys.append(round(end - previous, 3))
        return xs, ys

    def _draw_progress(self, fig: Figure, scatter: Scatter) -> None:
        xs, ys = self._progress_curve()
        fig.add_trace(
            scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"color": COLORS["progress"], "width": 2},
                fill="tozeroy",
                fillcolor="rgba(44, 160, 44, 0.12)",
                name="since last progress",
                meta=["Time since the last progress", "since the last progress", "s"],
                hoverinfo="none",
                showlegend=False,
                connectgaps=False,
            ),
            row=2,
            col=1,
        )
        first = self.progress_times[0] if self.progress_times else None
        startup = config_value(self.artifact, "startup_timeout_seconds")
        stale = config_value(self.artifact, "stale_progress_seconds")
        peak = max([y for y in ys if y is not None] + [0.0])
        limits = []
        if stale is not None and first is not None:
            limits.append((first, self.duration, stale, f"stale limit {format_duration(stale)}"))
        if startup is not None and (first is None or startup <= max(peak, 1e-3) * LIMIT_HEADROOM):
            # Once progress was seen the startup limit no longer matters: only drawn to scale.
            end = first if first is not None else self.duration
            limits.append((0.0, end, startup, f"startup limit {format_duration(startup)}"))
        for start, end, value, label in limits:
            if value > max(peak, 1e-3) * LIMIT_HEADROOM:
                continue
            fig.add_trace(
                scatter(
                    x=[self.x(start), self.x(end)],
                    y=[value, value],
                    mode="lines+text",
                    line={"color": COLORS["failure"], "dash": "dash", "width": 1.5},
                    text=[label, ""],
                    textposition="top right",
                    textfont={"color": COLORS["failure"], "size": 12},
                    hoverinfo="skip",
                    showlegend=False,
                ),
                row=2,
                col=1,
            )
        shown = [limit for limit in limits if limit[2] <= max(peak, 1e-3) * LIMIT_HEADROOM]
        off_scale = [limit[3] for limit in limits if limit not in shown]
        if off_scale:
            # A limit far above every gap would flatten the curve: name it instead.
            fig.add_annotation(
                x=1,
                y=1,
                xref="x2 domain",
                yref="y2 domain",
                xanchor="right",
                yanchor="top",
                text=f"{' and '.join(off_scale)}: far above every gap",
                showarrow=False,
                font={"color": COLORS["failure"], "size": 12},
            )
        top = max([peak] + [limit[2] for limit in limits if limit in shown]) * 1.25 or 1.0
        fig.update_yaxes(row=2, col=1, range=[0, top])

    def _draw_panel(self, fig: Figure, scatter: Scatter, row: int, panel: Panel) -> None:
        processes = self._process_lines() if panel.key == "tree_memory" else []
        peak = 0.0
        for f in panel.fields:
            values = [v for v in self.values(f) if v is not None]
            peak = max([peak, *values])
        for _, _, ys in processes:
            peak = max([peak, *(v for v in ys if v is not None)])
        scale = scale_for(panel.unit, peak)
        self.panel_units[panel.key] = scale.unit
        legend = f"legend{row}"
        gpu_colors = {
            g: PALETTE[i % len(PALETTE)]
            for i, g in enumerate(sorted({f.group for f in panel.fields}, key=group_sort_key))
        }
        names_per_group = {f.group: 0 for f in panel.fields}
        for f in panel.fields:
            names_per_group[f.group] += 1
        for i, f in enumerate(panel.fields):
            series = self.series[f.group]
            label = f"{f.label} {f.qualifier}".strip()
            if panel.is_gpu:
                color = gpu_colors[f.group]
                name = f"GPU {gpu_index(f.group)}"
                if names_per_group[f.group] > 1:
                    name += f" {label}"
            else:
                color = PALETTE[i % len(PALETTE)]
                name = label
            dash = "dot" if _is_reference(f) else "solid"
            ys = [None if v is None else v / scale.divisor for v in self.values(f)]
            fig.add_trace(
                scatter(
                    x=[self.x(t) for t in series["t"]],
                    y=ys,
                    mode="lines",
                    line={"color": color, "width": 1.8, "dash": dash},
                    name=plot_text(name),
                    legend=legend,
                    showlegend=len(panel.fields) > 1 or bool(processes) or self._has_baseline(f),
                    meta=[panel.title, name, scale.unit],
                    hoverinfo="none",
                ),
                row=row,
                col=1,
            )
            self._draw_baseline(fig, scatter, row, f, name, color, scale, legend, panel.title)
        for j, (pid_name, ts, ys) in enumerate(processes):
            fig.add_trace(
                scatter(
                    x=[self.x(t) for t in ts],
                    y=[None if v is None else v / scale.divisor for v in ys],
                    mode="lines",
                    line={"color": PALETTE[(j + 2) % len(PALETTE)], "width": 1.1},
                    name=plot_text(pid_name),
                    legend=legend,
                    meta=[panel.title, pid_name, scale.unit],
                    hoverinfo="none",
                ),
                row=row,
                col=1,
            )
        if panel.key == "tree_memory":
            self._annotate_slopes(fig, row)
        axis: dict[str, Any] = {"title_text": scale.unit or "count", "rangemode": "tozero"}
        if panel.unit == "%":
            axis["range"] = [0, max(100.0, peak * 1.05)]
        fig.update_yaxes(row=row, col=1, **axis)
        if panel.is_gpu:
            for group, spans in self.throttle.items():
                if group in gpu_colors:
                    for start, end, _ in spans:
                        fig.add_vrect(
                            x0=self.x(start),
                            x1=self.x(end),
                            fillcolor=COLORS["throttle"],
                            line_width=0,
                            layer="below",
                            row=row,
                            col=1,
                        )

    def _process_lines(self) -> list[tuple[str, list[float], list[float | None]]]:
        """(name, t, RSS) of the top processes the artifact kept, at most PROCESS_LINES."""
        lines = []
        for p in (self.artifact.get("processes") or [])[:PROCESS_LINES]:  # a version 2 section
            series = p["series"]
            if series.get("t") and series.get("rss_bytes"):
                lines.append(
                    (
                        f"pid {p['pid']} {p['name'] or ''}".strip(),
                        series_times(series),
                        series["rss_bytes"],
                    )
                )
        return lines

    def _has_baseline(self, f: Field) -> bool:
        return bool((self.baseline_series.get(f.group) or {}).get(f.name))

    def _draw_baseline(
        self,
        fig: Figure,
        scatter: Scatter,
        row: int,
        f: Field,
        name: str,
        color: str,
        scale: Scale,
        legend: str,
        title: str,
    ) -> None:
        """The baseline run's line for the same field, faint and dashed beneath."""
        if not self._has_baseline(f):
            return
        base = self.baseline_series[f.group]
        values: Sequence[float | None] = base[f.name]
        if (f.group, f.name) in COUNTERS:
            values = _rates(base["t"], values)
        fig.add_trace(
            scatter(
                x=[self.x(t) for t in base["t"]],
                y=[None if v is None else v / scale.divisor for v in values],
                mode="lines",
                line={"color": color, "width": 1.2, "dash": "dash"},
                opacity=0.55,
                name=plot_text(f"{name} (baseline)"),
                legend=legend,
                meta=[title, f"{name} (baseline)", scale.unit],
                hoverinfo="none",
            ),
            row=row,
            col=1,
        )

    def _annotate_slopes(self, fig: Figure, row: int) -> None:
        """The memory trends on the memory panel: the tree's, and each leaking process's."""
        trends = self.artifact.get("trends") or {}
        lines = []
        for key, figure in TREE_MEMORY_SERIES:
            entry = trends.get(key)
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
        if not lines:
            return
        fig.add_annotation(
            x=0.01,
            y=0.98,
            xref=f"x{row} domain",
            yref=f"y{row} domain",
            xanchor="left",
            yanchor="top",
            align="left",
            text=plot_text("\n".join(lines)),
            showarrow=False,
            bgcolor="rgba(255,255,255,0.8)",
            font={
                "color": COLORS["failure"] if leaking_series(self.artifact) else "#333",
                "size": 12,
            },
        )

    def _draw_marks_across(self, fig: Figure) -> None:
        shapes: list[dict[str, Any]] = []
        window = stall_window(self.artifact)
        if window is not None:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": self.x(window[0]),
                    "x1": self.x(window[1]),
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": COLORS["stall"],
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
            fig.add_annotation(
                x=self.x((window[0] + window[1]) / 2),
                y=1,
                xref="x",
                yref="y2 domain",
                yanchor="bottom",
                text=f"<b>no progress for {format_duration(window[1] - window[0])}</b>",
                showarrow=False,
                font={"color": COLORS["failure"], "size": 13},
            )
        for t in _thin(self.progress_times, PROGRESS_LINES):
            shapes.append(_vline(self.x(t), COLORS["progress"], "solid", 1, 0.35))
        for mark in self.marks:
            if mark.dash is not None:
                shapes.append(_vline(self.x(mark.t), mark.color, mark.dash, 2, 0.9))
        fig.update_layout(shapes=[*fig.layout.shapes, *shapes])

    def _style(self, fig: Figure, rows: int, height: int, top: int, bottom: int) -> None:
        fig.update_layout(
            template="simple_white",
            height=height,
            margin={"l": 80, "r": 30, "t": top, "b": bottom},
            # Hovering a panel reports its time to the page's script, which shows every
            # panel's values there (series traces draw no label of their own).
            hovermode="x",
            hoverdistance=-1,
            spikedistance=-1,
            font={"family": "system-ui, sans-serif", "size": 12},
        )
        end = self.x(self.duration)
        fig.update_xaxes(
            showticklabels=True,
            showgrid=True,
            gridcolor="#eef0f3",
            range=[-end * 0.01, end * 1.01],
            ticks="outside",
            ticksuffix={"seconds": " s", "minutes": " min", "hours": " h"}[self.x_unit],
        )
        fig.update_xaxes(title_text=f"{self.x_unit} since the start", row=rows, col=1)
        fig.update_yaxes(showgrid=True, gridcolor="#eef0f3")
        for i, annotation in enumerate(fig.layout.annotations):
            if i >= rows:
                break
            # Subplot titles: left-aligned above their panel, bold, like section headings.
            annotation.update(
                x=0, xanchor="left", font={"size": 14}, text=f"<b>{annotation.text}</b>"
            )
        for row in range(3, rows + 1):
            domain = fig.get_subplot(row, 1).yaxis.domain
            fig.update_layout(
                {
                    f"legend{row}": {
                        "x": 1,
                        "xanchor": "right",
                        "y": domain[1],
                        "yanchor": "bottom",
                        "orientation": "h",
                        "font": {"size": 12},
                        "bgcolor": "rgba(255,255,255,0)",
                    }
                }
            )

    def _readout_script(self) -> str:
        started = self.artifact["started_at"]
        start_ms = (
            datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() * 1000
            if started
            else "null"
        )
        return (
            READOUT_SCRIPT.replace("__START_MS__", str(start_ms))
            .replace("__X_SECONDS__", str(self.x_divisor))
            .replace("__X_UNIT__", json.dumps(self.x_unit))
        )

    def help_text(self) -> str:
        lanes = {m.lane for m in self.marks}
        keys = []
        if stall_window(self.artifact) is not None:
            keys.append(("rgba(214, 39, 40, 0.3)", "no progress before the failure"))
        if self.progress_times:
            keys.append((COLORS["progress"], "a progress change"))
        if "failure" in lanes:
            keys.append((COLORS["failure"], "the failure"))
        if any(m.lane == "monitor" and m.dash for m in self.marks):
            keys.append((COLORS["signal"], "a signal sent by the monitor"))
        if any(m.lane == "command" and m.dash for m in self.marks):
            keys.append((COLORS["exit"], "the command's exit"))
        if self.throttle:
            keys.append((COLORS["throttle"], "GPU clocks held back (throttling)"))
        legend = "".join(
            f'<span class="key" style="background:{color}"></span>{html.escape(text)}'
            for color, text in keys
        )
        lost = (
            ""
            if self.detail is not None or self._events_lost() is None
            else (
                " Some events in the middle of the run were not kept in the artifact: keep the "
                "journal beside it to see them."
            )
        )
        return (
            "Every panel shares one time axis: drag to zoom (all panels follow), "
            "double-click to reset, hover for values." + lost + "<br>" + legend
        )


def _vline(x: float, color: str, dash: str, width: float, opacity: float) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "dash": dash, "width": width},
        "opacity": opacity,
        "layer": "above",
    }


def _time(mark: _Mark) -> float:
    return mark.t


def _merged(group: Sequence[_Mark]) -> _Mark:
    """One mark for a group: the most telling one's, at its time, ``+N`` the others."""
    if len(group) == 1:
        return group[0]
    labelled = [m for m in group if m.label] or list(group)
    lead = min(labelled, key=lambda m: LABEL_RANK.get(m.label, 2 if m.dash is None else 1))
    return _Mark(
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


def _is_reference(f: Field) -> bool:
    """A limit or a total: drawn dotted beside the line it bounds."""
    return any(word in f.name for word in ("limit", "total"))


def _rates(times: Sequence[float], counter: Sequence[float | None]) -> list[float | None]:
    """A counter's rate per second between samples; a counter that went down (a process
    left the tree, taking its count) gives no rate there."""
    out: list[float | None] = [None]
    for i in range(1, len(counter)):
        before, after = counter[i - 1], counter[i]
        dt = times[i] - times[i - 1]
        if before is None or after is None or dt <= 0 or after < before:
            out.append(None)
        else:
            out.append((after - before) / dt)
    return out


def _thin(times: Sequence[float], limit: int) -> list[float]:
    """At most ``limit`` times, one per equal slice of the run."""
    if len(times) <= limit:
        return list(times)
    start, end = times[0], times[-1]
    width = (end - start) / limit or 1.0
    kept: dict[int, float] = {}
    for t in times:
        kept.setdefault(int((t - start) / width), t)
    return list(kept.values())


def _thin_keeping_gaps(gaps: Sequence[float], limit: int) -> list[int]:
    """About ``limit`` indices: the longest gaps, the first and last, and evenly spaced others."""
    longest = sorted(range(len(gaps)), key=gaps.__getitem__, reverse=True)[: limit // 2]
    step = max(1, len(gaps) // max(limit // 2, 1))
    return sorted({0, len(gaps) - 1, *longest, *range(0, len(gaps), step)})
