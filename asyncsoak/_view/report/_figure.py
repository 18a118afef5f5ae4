"""The plotly figure of a :class:`~._timeline.TimelineModel`: a lane of what happened, time
since progress, one panel per series group, on one time axis (plotly imported only here)."""

from __future__ import annotations

import html
import json
from collections import Counter
from typing import Any

from ..._contract import format_duration, parse_iso
from .._evidence import leaking_series, stall_window
from .._fields import gpu_index
from ._assets import READOUT_SCRIPT, RENDERED_SCRIPT, figure_html, plot_text
from ._panels import Panel, axis_title, group_sort_key, is_reference, scale_for
from ._timeline import COLORS, SPARSE_POINTS, TimelineModel

#: Behind a note on a panel: the lines show through, faintly.
_VEIL = "rgba(255,255,255,0.8)"
PALETTE = ("#1f77b4", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#ff7f0e")


class Timeline(TimelineModel):
    """One plotly figure of a :class:`TimelineModel` (plotly ships no types: figures are
    ``Any``)."""

    #: The unit each drawn panel's axis got, by panel key, once drawn.
    panel_units: dict[str, str]
    _scatter: Any  # plotly's Scatter

    def to_html(self) -> str:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        lanes = self.lanes()
        titles = ["What happened", "Time since the last progress (seconds)"]
        titles += [panel.title for panel in self.panels]
        heights = [36 + 24 * len(lanes), 170] + [190] * len(self.panels)
        gap, top, bottom = 62, 40, 50
        plot_height = sum(heights) + gap * (len(heights) - 1)
        fig = make_subplots(
            rows=len(heights),
            cols=1,
            shared_xaxes=True,
            row_heights=heights,
            vertical_spacing=gap / plot_height,
            subplot_titles=[plot_text(title) for title in titles],
        )
        self._scatter, self.panel_units = go.Scatter, {}
        self._draw_lanes(fig, lanes)
        self._draw_progress(fig)
        for row, panel in enumerate(self.panels, start=3):
            self._draw_panel(fig, row, panel)
        self._draw_marks_across(fig)
        self._style(fig, len(heights), plot_height + top + bottom, top, bottom)
        return figure_html(
            fig,
            "timeline",
            f"{plot_height + top + bottom}px",
            {"displaylogo": False, "responsive": True, "scrollZoom": False},
            [self._readout_script(), RENDERED_SCRIPT],
        )

    def _add(self, fig: Any, row: int, **trace: Any) -> None:
        fig.add_trace(self._scatter(**trace), row=row, col=1)

    def _draw_lanes(self, fig: Any, lanes: list[str]) -> None:
        y_of = {lane: -i for i, lane in enumerate(lanes)}
        window = stall_window(self.artifact)
        if window is not None and window[0] > 0:
            left = window[0] > self.duration * 0.6
            at = (self.x(window[0]), y_of["progress"], "x", "y")
            text = f"last progress {format_duration(window[0])}"
            side, shift = ("right", -8) if left else ("left", 8)
            _note(fig, text, at, COLORS["progress"], xanchor=side, xshift=shift)
        if self.progress:
            ticks = self._progress_ticks()
            xs = [self.x(t) for t, _ in ticks]
            tick_texts = [plot_text(text) for _, text in ticks]
            self._add(
                fig,
                1,
                x=xs,
                y=[y_of["progress"]] * len(xs),
                mode="markers",
                marker={"symbol": "line-ns-open", "size": 14, "color": COLORS["progress"]},
                name="progress",
                hovertext=tick_texts,
                hovertemplate="%{hovertext}<extra></extra>",
                showlegend=False,
            )
        for lane in lanes:
            marks = self.lane_marks(lane)
            if not marks:
                continue
            self._add(
                fig,
                1,
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
            self._add(
                fig,
                1,
                x=span_xs,
                y=span_ys,
                mode="lines",
                line={"width": 10, "color": "orange"},
                text=texts,
                hovertemplate="%{text}<extra></extra>",
                showlegend=False,
            )
        fig.update_yaxes(
            row=1,
            col=1,
            tickvals=[y_of[lane] for lane in lanes],
            ticktext=[plot_text(self.lane_words(lane)) for lane in lanes],
            range=[-len(lanes) + 0.4, 0.6],
            showgrid=True,
            zeroline=False,
            fixedrange=True,
        )

    def _draw_progress(self, fig: Any) -> None:
        xs, ys = self._progress_curve()
        self._add(
            fig,
            2,
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
        )
        peak = max([y for y in ys if y is not None] + [0.0])
        limits, off_scale = self.progress_limits(peak)
        for start, end, value, label in limits:
            self._add(
                fig,
                2,
                x=[self.x(start), self.x(end)],
                y=[value, value],
                mode="lines+text",
                line={"color": COLORS["failure"], "dash": "dash", "width": 1.5},
                text=[label, ""],
                textposition="top right",
                textfont={"color": COLORS["failure"], "size": 12},
                hoverinfo="skip",
                showlegend=False,
            )
        if off_scale:
            # A limit far above every gap would flatten the curve: name it instead.
            text = f"{' and '.join(off_scale)}: far above every gap"
            _note(fig, text, (1, 1, "x2 domain", "y2 domain"), xanchor="right", yanchor="top")
        top = max([peak] + [limit.value for limit in limits]) * 1.25 or 1.0
        fig.update_yaxes(row=2, col=1, range=[0, top], title_text="since progress (s)")

    def _draw_panel(self, fig: Any, row: int, panel: Panel) -> None:
        processes = self._process_lines() if panel.key == "tree_memory" else []
        values = [v for f in panel.fields for v in self.values(f) if v is not None]
        peak = max([0.0, *values, *(v for _, _, ys in processes for v in ys if v is not None)])
        scale = scale_for(panel.unit, peak)
        self.panel_units[panel.key] = scale.unit
        legend = f"legend{row}"
        groups = sorted({f.group for f in panel.fields}, key=group_sort_key)
        gpu_colors = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
        per_group = Counter(f.group for f in panel.fields)

        def line(xs: list[float], ys: list[float | None], name: str, **style: Any) -> None:
            self._add(
                fig,
                row,
                x=[self.x(t) for t in xs],
                y=[None if v is None else v / scale.divisor for v in ys],
                name=plot_text(name),
                legend=legend,
                meta=[panel.title, name, scale.unit],
                hoverinfo="none",
                **style,
            )

        for i, f in enumerate(panel.fields):
            label = f"{f.label} {f.qualifier}".strip()
            color, name = PALETTE[i % len(PALETTE)], label
            if panel.is_gpu:
                color, name = gpu_colors[f.group], f"GPU {gpu_index(f.group)}"
                name += f" {label}" if per_group[f.group] > 1 else ""
            ys = self.values(f)
            baseline = self.baseline_values(f)
            # A few points (a rate over a short run) are points: a line would draw nothing
            # between gaps, or invent a ramp.
            sparse = sum(v is not None for v in ys) < SPARSE_POINTS
            dash = "dot" if is_reference(f) else "solid"
            line(
                list(self.series[f.group]["t"]),
                ys,
                name,
                mode="markers" if sparse else "lines",
                marker={"color": color, "size": 7},
                line={"color": color, "width": 1.8, "dash": dash},
                showlegend=len(panel.fields) > 1 or bool(processes) or baseline is not None,
            )
            if baseline is not None:  # faint and dashed beneath
                line(
                    *baseline,
                    f"{name} (baseline)",
                    mode="lines",
                    line={"color": color, "width": 1.2, "dash": "dash"},
                    opacity=0.55,
                )
        for j, (pid_name, ts, ys) in enumerate(processes):
            color = PALETTE[(j + 2) % len(PALETTE)]
            line(ts, ys, pid_name, mode="lines", line={"color": color, "width": 1.1})
        if panel.key == "tree_memory":
            self._annotate_slopes(fig, row)
        if panel.key == "loss":
            self._mark_nonfinite(fig, row)
        axis: dict[str, Any] = {"title_text": axis_title(panel, scale.unit), "rangemode": "tozero"}
        if panel.unit == "%":
            axis["range"] = [0, max(100.0, peak * 1.05)]
        fig.update_yaxes(row=row, col=1, **axis)
        for group, spans in self.throttle.items():
            if panel.is_gpu and group in gpu_colors:
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

    def _annotate_slopes(self, fig: Any, row: int) -> None:
        """The memory trends on the memory panel: the tree's, and each leaking process's."""
        lines = self.slope_lines()
        if not lines:
            return
        color = COLORS["failure"] if leaking_series(self.artifact) else "#333"
        at = (0.01, 0.98, f"x{row} domain", f"y{row} domain")
        text = plot_text("\n".join(lines))
        _note(fig, text, at, color, xanchor="left", yanchor="top", align="left", bgcolor=_VEIL)

    def _mark_nonfinite(self, fig: Any, row: int) -> None:
        """Each NaN or infinite loss on the loss panel, where it came: a line and its words."""
        for t, text in self.nonfinite_losses():
            left = t > self.duration * 0.6
            fig.add_vline(
                x=self.x(t), line={"color": COLORS["failure"], "dash": "dot"}, row=row, col=1
            )
            at = (self.x(t), 0.95, f"x{row}", f"y{row} domain")
            side, shift = ("right", -4) if left else ("left", 4)
            _note(
                fig, plot_text(text), at, xanchor=side, xshift=shift, yanchor="top", bgcolor=_VEIL
            )

    def _draw_marks_across(self, fig: Any) -> None:
        shapes: list[dict[str, Any]] = []
        window = stall_window(self.artifact)
        if window is not None:
            start, end = self.x(window[0]), self.x(window[1])
            shapes.append(_across("rect", start, end, fillcolor=COLORS["stall"], line={"width": 0}))
            text = f"<b>no progress for {format_duration(window[1] - window[0])}</b>"
            at = (self.x((window[0] + window[1]) / 2), 0.98, "x", "y2 domain")
            _note(fig, text, at, size=13, yanchor="top")
        shapes.extend(
            _across(
                "line",
                self.x(mark.t),
                self.x(mark.t),
                line={"color": mark.color, "dash": mark.dash, "width": 2},
                opacity=0.9,
                layer="above",
            )
            for mark in self.marks
            if mark.dash is not None
        )
        fig.update_layout(shapes=[*fig.layout.shapes, *shapes])

    def _style(self, fig: Any, rows: int, height: int, top: int, bottom: int) -> None:
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
        for annotation in fig.layout.annotations[:rows]:
            # Subplot titles: left-aligned above their panel, bold, like section headings.
            bold = f"<b>{annotation.text}</b>"
            annotation.update(x=0, xanchor="left", font={"size": 14}, text=bold)
        for row in range(3, rows + 1):
            top = fig.get_subplot(row, 1).yaxis.domain[1]
            legend = {"x": 1, "xanchor": "right", "y": top, "yanchor": "top", "orientation": "h"}
            legend |= {"font": {"size": 12}, "bgcolor": _VEIL}
            fig.update_layout({f"legend{row}": legend})

    def _readout_script(self) -> str:
        started = self.artifact["started_at"]
        start_ms = parse_iso(started).timestamp() * 1000 if started else "null"
        return (
            READOUT_SCRIPT.replace("__START_MS__", str(start_ms))
            .replace("__X_SECONDS__", str(self.x_divisor))
            .replace("__X_UNIT__", json.dumps(self.x_unit))
        )

    def help_text(self) -> str:
        lanes = {m.lane for m in self.marks}
        dashed = {m.lane for m in self.marks if m.dash}
        stalled = stall_window(self.artifact) is not None
        keys = [
            (color, text)
            for shown, color, text in (
                (stalled, "rgba(214, 39, 40, 0.3)", "no progress before the failure"),
                (bool(self.progress), COLORS["progress"], "a progress change"),
                ("failure" in lanes, COLORS["failure"], "the failure"),
                ("monitor" in dashed, COLORS["signal"], "a signal sent by the monitor"),
                ("command" in dashed, COLORS["exit"], "the command's exit"),
                (bool(self.throttle), COLORS["throttle"], "GPU clocks held back (throttling)"),
            )
            if shown
        ]
        legend = "".join(
            f'<span class="key" style="background:{color}"></span>{html.escape(text)}'
            for color, text in keys
        )
        lost = self.detail is None and self._events_lost() is not None
        said = " Some events in the middle of the run were not kept in the artifact: keep the "
        said = f"{said}journal beside it to see them." if lost else ""
        return (
            "Every panel shares one time axis: drag to zoom (all panels follow), "
            f"double-click to reset, hover for values.{said}<br>{legend}"
        )


def _note(
    fig: Any,
    text: str,
    at: tuple[float, float, str, str],
    color: str = COLORS["failure"],
    size: int = 12,
    **style: Any,
) -> None:
    """Words on the figure at ``at`` (x, y, xref, yref), no arrow, in ``color``."""
    place = dict(zip(("x", "y", "xref", "yref"), at, strict=True))
    font = {"color": color, "size": size}
    fig.add_annotation(text=text, showarrow=False, font=font, **place, **style)


def _across(kind: str, x0: float, x1: float, **style: Any) -> dict[str, Any]:
    """A shape across every panel, from ``x0`` to ``x1`` (beneath them unless ``layer``)."""
    shape = {"type": kind, "xref": "x", "yref": "paper", "x0": x0, "x1": x1, "y0": 0, "y1": 1}
    return {**shape, "layer": "below", **style}
