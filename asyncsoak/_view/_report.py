"""``asyncsoak report``: one self-contained HTML page that shows what happened, and when.

The page opens offline: plotly's JavaScript is inlined and no font or script is fetched.
At the top the verdict in plain words, the run's facts and provenance; then one plotly
figure whose panels share a time axis: a lane of what happened (progress, signals, the
failure, the exit, GPU throttling), the time since the last progress against its limit, and
every series group the artifact holds, known fields with their own panels and any other
field grouped by unit.  The moments that matter are drawn across every panel.  Then the
events, leftover processes, forensics and the log tail.

plotly is an optional extra (``pip install 'asyncsoak[report]'``), imported only here.
"""

from __future__ import annotations

import fnmatch
import html
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from .. import __version__
from .._errors import AsyncsoakError
from .._record._artifact import EVENTS_HEAD, FILE_MODE
from .._record._journal import read_journal
from .._sampling._fields import (
    Field,
    describe,
    format_clock,
    format_duration,
    format_value,
    gpu_index,
    group_label,
)
from ._evidence import (
    config_value,
    event_times,
    innermost_python_frame,
    leaking_series,
    rate_text,
    stall_window,
)
from ._summary import IDLE_THROTTLE, exit_text, summarize

#: Vertical lines drawn for progress changes at most (more are merged by time).
PROGRESS_LINES = 300
#: Progress ticks in the lane at most (more are merged by time, their count in the hover).
PROGRESS_TICKS = 1500
#: Characters of the command shown before it is folded.
COMMAND_SHOWN = 240
#: Points of the time-since-progress curve at most.
PROGRESS_CURVE_POINTS = 2000
#: Per-process memory lines drawn on the memory panel at most.
PROCESS_LINES = 4
#: A liveness limit more than this many times the longest gap is not drawn to scale.
LIMIT_HEADROOM = 4.0

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


class ReportUnavailableError(AsyncsoakError):
    """plotly, which draws the report, is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "the HTML report needs plotly: pip install 'asyncsoak[report]' (or pip install plotly)"
        )


# -- what the journal adds to the artifact -----------------------------------------------------


@dataclass(slots=True)
class JournalDetail:
    """What only the journal has: every progress time, and GPU throttling over time."""

    progress_times: list[float] = field(default_factory=list)
    #: The files each progress change touched (names, parallel to ``progress_times``).
    progress_files: list[str] = field(default_factory=list)
    #: group -> [(start, end, reasons)]
    throttle_spans: dict[str, list[tuple[float, float, list[str]]]] = field(default_factory=dict)


def read_journal_detail(path: Path) -> JournalDetail:
    """Progress times and throttle spans from a journal, skipping lines it cannot read."""
    detail = JournalDetail()
    open_spans: dict[str, tuple[float, set[str]]] = {}
    last_t = 0.0
    for event in read_journal(path):
        t = float(event.get("t", 0.0))
        last_t = max(last_t, t)
        if event.get("kind") == "progress":
            detail.progress_times.append(t)
            detail.progress_files.append(_file_names(event.get("paths")))
            continue
        for group, labels in (event.get("labels") or {}).items():
            reasons = set(labels.get("throttle_reasons") or []) - IDLE_THROTTLE
            current = open_spans.get(group)
            if current is not None and current[1] != reasons:
                detail.throttle_spans.setdefault(group, []).append(
                    (current[0], t, sorted(current[1]))
                )
                current = None
                del open_spans[group]
            if reasons and current is None:
                open_spans[group] = (t, reasons)
    for group, (start, reasons) in open_spans.items():
        detail.throttle_spans.setdefault(group, []).append((start, last_t, sorted(reasons)))
    return detail


def journal_detail_for(artifact: Mapping[str, Any], journal: Path | None) -> JournalDetail | None:
    path = journal
    if path is None:
        recorded = (artifact.get("monitor") or {}).get("journal_path")
        path = Path(recorded) if recorded else None
    if path is None or not path.is_file():
        return None
    try:
        return read_journal_detail(path)
    except OSError:
        return None


# -- the page ----------------------------------------------------------------------------------


def render_report(
    artifact: Mapping[str, Any],
    *,
    journal: Path | None = None,
    source: str | None = None,
    baseline: Mapping[str, Any] | None = None,
    baseline_source: str | None = None,
) -> str:
    """The report of one run as a self-contained HTML page.

    ``journal`` adds what only the journal holds (throttle spans, progress events the
    artifact did not keep); by default the journal the artifact names is used if it is there.
    ``source`` names the file the report was made from.  ``baseline``: an earlier run of the
    same training, drawn beneath this one's panels and compared figure by figure.
    """
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ReportUnavailableError() from None
    detail = journal_detail_for(artifact, journal)
    summary = summarize(artifact)
    timeline = _Timeline(artifact, detail, baseline)
    figure_html = timeline.to_html()
    body = [
        _verdict_html(summary),
        _evidence_html(artifact, summary),
        _compare_html(artifact, baseline, baseline_source),
        _facts_html(artifact, summary),
        _look_first_html(summary),
        _processes_html(artifact),
        '<section id="timeline-section"><h2>Timeline</h2>',
        f'<p class="help">{timeline.help_text()}</p>',
        _steady_html(timeline),
        # Before the figure: its post-render script runs before the parser gets further.
        '<span id="render-status" hidden data-state="pending"></span>',
        "<noscript><p>The plots need JavaScript.</p></noscript>",
        '<div id="readout" class="readout" hidden></div>',
        figure_html,
        "</section>",
        _gpu_html(summary, timeline),
        _events_html(artifact),
        _leftovers_html(artifact),
        _forensics_html(artifact),
        _log_html(artifact),
        _footer_html(artifact, source),
    ]
    title = f"{str(artifact.get('status', '?')).upper()}: {summary['headline']}"
    return PAGE.format(
        title=html.escape(title),
        style=STYLE,
        body="\n".join(part for part in body if part),
    )


def write_report(
    artifact: Mapping[str, Any],
    path: Path,
    *,
    journal: Path | None = None,
    source: str | None = None,
    baseline: Mapping[str, Any] | None = None,
    baseline_source: str | None = None,
) -> None:
    """Render and write the report, readable by its owner only (like the artifact)."""
    text = render_report(
        artifact,
        journal=journal,
        source=source,
        baseline=baseline,
        baseline_source=baseline_source,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=FILE_MODE)
    path.write_text(text, encoding="utf-8")


def _asset(name: str) -> str:
    """A file of the page (its stylesheet, its scripts), shipped in ``_report_assets``."""
    assets = resources.files("asyncsoak._view") / "_report_assets"
    return (assets / name).read_text(encoding="utf-8")


#: The page's stylesheet.
STYLE = _asset("report.css")
#: One readout for every panel at the pointer's time, a line across all panels there, and
#: y axes that follow a zoom on the shared time axis.  Plain DOM, offline, after the plot.
READOUT_SCRIPT = _asset("readout.js")
#: After the figure is drawn: what it holds, where the verdict and evidence end, and when,
#: in the render marker (for the tests and the benchmark).
RENDERED_SCRIPT = _asset("rendered.js")

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script>
window.addEventListener("error", function (e) {{
  var box = document.getElementById("page-errors");
  if (box) {{ box.hidden = false; box.textContent += (e.message || String(e)) + "\\n"; }}
}});
</script>
</head><body>
<pre id="page-errors" hidden></pre>
{body}
</body></html>
"""


def _verdict_html(summary: Mapping[str, Any]) -> str:
    status = str(summary["status"])
    parts = [
        f'<header id="verdict" class="verdict {html.escape(status)}">',
        f'<span class="badge">{html.escape(status.upper())}</span>',
        f"<h1>{html.escape(summary['headline'])}</h1>",
    ]
    for i, reason in enumerate(summary["reasons"]):
        at = f" at {format_duration(reason['t'])}" if reason.get("t") is not None else ""
        lead = "" if i == 0 else "Also: "
        parts.append(
            f'<p class="reason">{lead}<b>{html.escape(reason["reason"])}</b>{at}: '
            f"{html.escape(reason['message'])}</p>"
        )
    parts.append("</header>")
    return "\n".join(parts)


#: Sections the evidence block links to, when the page has them.
ANCHORS = (
    ("log", "Log"),
    ("forensics", "Forensics"),
    ("processes", "Processes"),
    ("timeline-section", "Timeline"),
    ("events", "Events"),
)


def _evidence_html(artifact: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The cause, the last progress, the next step and the log's end: what decides the run."""
    evidence = summary["evidence"]
    rows: list[str] = []
    if evidence["cause"]:
        label = "Warning" if summary["status"] == "passed" else "Cause"
        where = evidence["where"]
        text = f"<b>{html.escape(evidence['cause'])}</b>"
        if where and where not in evidence["cause"]:
            text += f" at <code>{html.escape(where)}</code>"
        if evidence["source_line"]:
            text += f'<pre class="source">{html.escape(evidence["source_line"])}</pre>'
        rows.append(f'<dt>{label}</dt><dd id="cause">{text}</dd>')
    last = evidence["last_progress"]
    if last is not None:
        end = "the failure" if summary["reasons"] else "the end"
        files = ", ".join(f"<code>{html.escape(p)}</code>" for p in last["paths"][:4])
        rows.append(
            f"<dt>Last progress</dt><dd>{format_duration(last['t'])} "
            f"({html.escape(_wall_clock(artifact, last['t']))}), "
            f"{format_duration(last['before_end'])} before {end}"
            + (f": {files}" if files else "")
            + "</dd>"
        )
    elif artifact.get("status") != "passed":
        rows.append("<dt>Last progress</dt><dd>none: no file in the progress dir changed</dd>")
    for i, step in enumerate(evidence["next_steps"]):
        rows.append(f"<dt>{'Next step' if i == 0 else ''}</dt><dd>{html.escape(step)}</dd>")
    log = _log_excerpt_html(evidence["log_lines"], evidence["traceback"])
    present = {
        "processes": bool(artifact.get("processes")),
        "events": bool(artifact.get("events")),
        "forensics": bool(artifact.get("forensics") or artifact.get("abandoned_processes")),
    }
    links = " · ".join(
        f'<a href="#{anchor}">{name}</a>' for anchor, name in ANCHORS if present.get(anchor, True)
    )
    return (
        '<section id="evidence" class="evidence">'
        f'<div class="evidence-facts"><dl>{"".join(rows)}</dl>'
        f'<nav class="jump">Jump to: {links}</nav></div>'
        f'<div class="evidence-log">{log}</div></section>'
    )


def _log_excerpt_html(lines: Sequence[str], traceback: Sequence[int] | None) -> str:
    if not lines:
        return '<p class="empty">The command printed nothing.</p>'
    start, end = traceback if traceback is not None else (len(lines), len(lines))
    shown = []
    for i, line in enumerate(lines):
        text = html.escape(line)
        if start <= i < end:
            cls = "tb-exc" if i == end - 1 else "tb"
            text = f'<span class="{cls}">{text}</span>'
        shown.append(text)
    return (
        '<p class="help">The end of the log'
        + (", the traceback marked" if traceback is not None else "")
        + ' (<a href="#log">all of it</a>):</p>'
        + f'<pre class="log excerpt">{chr(10).join(shown)}</pre>'
    )


def _wall_clock(artifact: Mapping[str, Any], t: float) -> str:
    started = artifact.get("started_at")
    if not started:
        return "?"
    moment = datetime.fromisoformat(str(started).replace("Z", "+00:00")) + timedelta(seconds=t)
    return moment.astimezone(UTC).strftime("%H:%M:%S UTC")


def _processes_html(artifact: Mapping[str, Any]) -> str:
    """The top processes by peak memory: who grew, and who used the CPU and GPU."""
    processes = [p for p in artifact.get("processes") or [] if isinstance(p, dict)]
    if not processes:
        return ""
    trends = artifact.get("trends") or {}
    rows = []
    for p in processes:
        trend = trends.get(f"process.{p.get('pid')}.rss_bytes") or {}
        first, peak, last = (
            p.get("first_rss_bytes"),
            p.get("peak_rss_bytes"),
            p.get("last_rss_bytes"),
        )
        rss = " → ".join(format_value(v, "bytes", like=peak) for v in (first, peak, last))
        slope = trend.get("slope_per_hour")
        verdict = str(trend.get("verdict") or "")
        growth = (
            rate_text(float(slope), "bytes", float(trend.get("span_seconds") or 0), like=peak)
            if isinstance(slope, int | float)
            else ""
        )
        cls = ' class="leak"' if verdict == "leak" else ""
        cells = [
            p.get("pid"),
            p.get("name") or "?",
            rss,
            f"{growth} ({verdict})" if growth else verdict or "-",
            format_value(p.get("mean_cpu_percent"), "%"),
            format_value(p.get("peak_gpu_memory_bytes"), "bytes")
            if p.get("peak_gpu_memory_bytes")
            else "-",
            p.get("peak_threads", "?"),
        ]
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells))
    head = (
        "<tr><th>pid</th><th>name</th><th>RSS first → peak → last</th><th>trend</th>"
        "<th>CPU mean</th><th>GPU memory peak</th><th>threads</th></tr>"
    )
    notes = [
        "The tree's RSS adds up each process's resident memory: pages that forked workers "
        "share are counted once per process, so it can exceed the machine's used memory."
    ]
    competing = _cpu_competition(artifact)
    if competing:
        notes.append(competing)
    return (
        '<section id="processes"><h2>Processes</h2>'
        f'<table class="processes">{head}{"".join(rows)}</table>'
        + "".join(f'<p class="help">{html.escape(n)}</p>' for n in notes)
        + "</section>"
    )


def _cpu_competition(artifact: Mapping[str, Any]) -> str | None:
    """A note when the machine's CPU was far above the tree's: something else competed."""
    summary = artifact.get("summary") or {}
    machine = ((summary.get("machine") or {}).get("cpu_percent") or {}).get("mean")
    tree = ((summary.get("tree") or {}).get("cpu_percent") or {}).get("mean")
    cores = ((artifact.get("snapshot") or {}).get("host") or {}).get("usable_cpus")
    if not (
        isinstance(machine, int | float)
        and isinstance(tree, int | float)
        and isinstance(cores, int | float)
    ):
        return None
    # The machine's figure is a share of every core; the tree's, of one core.
    machine_cores = machine * cores / 100.0
    tree_cores = tree / 100.0
    if machine_cores - tree_cores < max(0.5, tree_cores):
        return None
    return (
        f"The machine used about {machine_cores:.1f} core(s) on average against the tree's "
        f"{tree_cores:.1f}: something outside the tree competed for the CPU."
    )


def _compare_html(
    artifact: Mapping[str, Any], baseline: Mapping[str, Any] | None, name: str | None
) -> str:
    """The figures of this run beside the baseline's, regressions marked."""
    if baseline is None:
        return ""
    from ._compare import compare

    comparison = compare(baseline, artifact, baseline_name=name or "baseline")
    rows = []
    for row in comparison.rows:
        change = f"{row.change:+.0%}" if row.change is not None else ""
        cls = ' class="regressed"' if row.regressed else ""
        cells = [
            row.label,
            row.text(row.baseline),
            row.text(row.candidate),
            change,
            "regressed" if row.regressed else "",
        ]
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    regressions = comparison.regressions
    verdict = (
        f"{len(regressions)} regression(s): " + "; ".join(r.note for r in regressions)
        if regressions
        else "no regression against the baseline"
    )
    head = "<tr><th></th><th>baseline</th><th>this run</th><th>change</th><th></th></tr>"
    notes = "".join(f'<p class="help">{html.escape(n)}</p>' for n in comparison.notes)
    return (
        f'<section id="compare"><h2>Against the baseline {html.escape(name or "")}</h2>'
        f"<p><b>{html.escape(verdict)}</b>. Its lines are dashed beneath this run's.</p>"
        f'<table class="compare">{head}{"".join(rows)}</table>{notes}</section>'
    )


def _steady_html(timeline: _Timeline) -> str:
    text = timeline.steady_text()
    if not text:
        return ""
    return f'<p class="steady"><b>Steady throughout</b> (not plotted): {html.escape(text)}</p>'


def _facts_html(artifact: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    progress = summary["progress"]
    last = progress.get("last_change_t")
    stale = config_value(artifact, "stale_progress_seconds")
    facts: list[tuple[str, str]] = [
        ("Duration", format_duration(float(summary.get("duration_seconds") or 0))),
        (
            "When",
            f"{format_clock(summary.get('started_at'))} to {format_clock(summary.get('ended_at'))}",
        ),
        ("Command", _command_html(summary["command"])),
        ("Exit", html.escape(summary["exit"]["text"])),
        (
            "Progress",
            html.escape(
                f"{progress.get('changes', 0)} changes in {progress.get('dir')}"
                + (f", last at {format_duration(last)}" if last is not None else ", none seen")
                + f"; longest gap {format_duration(float(progress['longest_gap_seconds'] or 0))}"
                + (f" (stale limit {format_duration(stale)})" if stale else "")
            ),
        ),
    ]
    for name, value in summary["provenance"].items():
        facts.append((name[:1].upper() + name[1:], html.escape(value)))
    if artifact.get("metadata"):
        facts.append(
            (
                "Metadata",
                html.escape(", ".join(f"{k}={v}" for k, v in artifact["metadata"].items())),
            )
        )
    rows = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return f'<dl class="facts">{rows}</dl>'


def _command_html(command: Sequence[str]) -> str:
    text = shlex.join(command)
    if len(text) <= COMMAND_SHOWN:
        return f'<span class="mono">{html.escape(text)}</span>'
    return (
        f'<details><summary class="mono">{html.escape(text[:COMMAND_SHOWN])}...</summary>'
        f"<pre>{html.escape(text)}</pre></details>"
    )


def _look_first_html(summary: Mapping[str, Any]) -> str:
    if not summary["look_first"]:
        return ""
    items = "".join(f"<li>{html.escape(hint)}</li>" for hint in summary["look_first"])
    return f'<section class="look"><h2>What to look at first</h2><ul>{items}</ul></section>'


# -- the figure --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PanelSpec:
    key: str
    title: str
    unit: str
    #: (group kind, field name pattern)
    fields: tuple[tuple[str, str], ...]


PANELS = (
    _PanelSpec("tree_cpu", "Process tree CPU (100% = one core)", "%", (("tree", "cpu_percent"),)),
    _PanelSpec(
        "tree_memory",
        "Process tree memory",
        "bytes",
        (("tree", "rss_bytes"), ("tree", "pss_bytes"), ("tree", "uss_bytes")),
    ),
    _PanelSpec(
        "tree_counts",
        "Processes and threads in the tree",
        "",
        (("tree", "processes"), ("tree", "threads")),
    ),
    _PanelSpec(
        "machine_memory",
        "Machine memory",
        "bytes",
        (
            ("machine", "memory_used_bytes"),
            ("machine", "memory_available_bytes"),
            ("machine", "swap_used_bytes"),
        ),
    ),
    _PanelSpec(
        "tree_io",
        "Process tree I/O (MiB/s)",
        "MiB/s",
        (("tree", "read_bytes"), ("tree", "write_bytes")),
    ),
    _PanelSpec(
        "progress_rate",
        "Progress rate (changes per minute)",
        "",
        (("progress_rate", "changes_per_minute"),),
    ),
    _PanelSpec("disk_free", "Disk free", "bytes", (("machine", "disk_free_bytes*"),)),
    _PanelSpec("gpu_util", "GPU utilisation", "%", (("gpu", "utilization_gpu_percent"),)),
    _PanelSpec(
        "gpu_memory",
        "GPU memory used",
        "MiB",
        (("gpu", "memory_used_mib"), ("gpu", "memory_total_mib")),
    ),
    _PanelSpec("gpu_power", "GPU power", "W", (("gpu", "power_draw_w"), ("gpu", "power_limit_w"))),
    _PanelSpec("gpu_temp", "GPU temperature", "°C", (("gpu", "temperature_gpu_c"),)),
)
#: Group kinds as panel titles name them.
KIND_TITLES = {"tree": "Process tree", "machine": "Machine", "gpu": "GPU", "gpu_tree": "GPU use"}


#: Counters that count up from the start: drawn as rates (their panel's unit per second).
COUNTERS = frozenset({("tree", "read_bytes"), ("tree", "write_bytes")})
#: Fields left out when the field beside them is there: the same fact in another unit.
SAME_AS = {("machine", "memory_percent"): ("machine", "memory_used_bytes")}
#: A line that stays within this share of its peak is "steady": folded out of its panel.
STEADY_SHARE = 0.01
#: Panels drawn even when flat: flat CPU or memory is itself a finding.
ALWAYS_DRAWN = frozenset({"tree_cpu", "tree_memory", "machine_memory", "progress_rate"})


@dataclass(slots=True)
class _Panel:
    key: str
    title: str
    unit: str
    fields: list[Field] = field(default_factory=list)
    is_gpu: bool = False


def _plan_panels(series: Mapping[str, Mapping[str, Sequence[Any]]]) -> list[_Panel]:
    """Every field of every group, placed in a known panel or one per (group kind, unit).

    A field with the same values as one before it in its group (the progress and output
    dirs on one filesystem) is one line named for both.
    """
    fields: list[Field] = []
    seen: dict[tuple[str, str, str], int] = {}
    for group in sorted(series, key=_group_sort_key):
        for name in sorted(series[group]):
            values = series[group][name]
            if name == "t" or not any(v is not None for v in values):
                continue
            same = SAME_AS.get((group, name))
            if same is not None and same[1] in series.get(same[0], {}):
                continue
            f = describe(group, name)
            twin = (group, f.label, repr(list(values)))
            if f.qualifier and twin in seen:
                i = seen[twin]
                fields[i] = replace(fields[i], qualifier=f"{fields[i].qualifier}, {f.qualifier}")
                continue
            seen[twin] = len(fields)
            fields.append(f)
    panels: dict[str, _Panel] = {}
    placed: set[tuple[str, str]] = set()
    for spec in PANELS:
        for kind, pattern in spec.fields:
            for f in fields:
                if f.kind == kind and fnmatch.fnmatchcase(f.name, pattern):
                    panel = panels.setdefault(
                        spec.key, _Panel(spec.key, spec.title, spec.unit, is_gpu=kind == "gpu")
                    )
                    panel.fields.append(f)
                    placed.add((f.group, f.name))
    ordered = [panels[spec.key] for spec in PANELS if spec.key in panels]
    others: dict[tuple[str, str], _Panel] = {}
    for f in fields:
        if (f.group, f.name) in placed:
            continue
        key = (f.kind, f.unit)
        if key not in others:
            others[key] = _Panel(f"{f.kind}:{f.unit}", "", f.unit, is_gpu=f.kind == "gpu")
        others[key].fields.append(f)
    for panel in others.values():
        panel.title = _other_title(panel)
        ordered.append(panel)
    return ordered


def _other_title(panel: _Panel) -> str:
    """``Machine: CPU (all cores), swap (%)``: the group kind, the fields and the unit."""
    kind = panel.fields[0].kind
    labels = list(dict.fromkeys(f"{f.label} {f.qualifier}".strip() for f in panel.fields))
    what = ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")
    return f"{KIND_TITLES.get(kind, kind)}: {what}" + (f" ({panel.unit})" if panel.unit else "")


def _group_sort_key(group: str) -> tuple[int, int, str]:
    index = gpu_index(group)
    order = {"tree": 0, "machine": 1}.get(group, 3 if index is None else 2)
    return (order, index or 0, group)


@dataclass(frozen=True, slots=True)
class _Scale:
    """How a panel's values are shown: divided by ``divisor`` and labelled ``unit``."""

    divisor: float
    unit: str


def _scale_for(unit: str, peak: float) -> _Scale:
    if unit == "bytes":
        return _Scale(2**30, "GiB") if peak >= 2**30 else _Scale(2**20, "MiB")
    if unit == "MiB":
        return _Scale(1024, "GiB") if peak >= 1024 else _Scale(1, "MiB")
    return _Scale(1, unit)


@dataclass(frozen=True, slots=True)
class _Mark:
    """A moment drawn across every panel and in the lane."""

    t: float
    lane: str
    label: str
    hover: str
    color: str
    symbol: str
    dash: str | None


class _Timeline:
    """One plotly figure: the lane, time since progress, and every series panel."""

    def __init__(
        self,
        artifact: Mapping[str, Any],
        detail: JournalDetail | None,
        baseline: Mapping[str, Any] | None = None,
    ) -> None:
        self.artifact = artifact
        self.detail = detail
        self.baseline_series: Mapping[str, Mapping[str, Sequence[Any]]] = (
            (baseline.get("series") or {}) if baseline is not None else {}
        )
        self.duration = max(float(artifact.get("duration_seconds") or 0.0), 1e-3)
        if self.duration <= 900:
            self.x_divisor, self.x_unit = 1.0, "seconds"
        elif self.duration <= 36_000:
            self.x_divisor, self.x_unit = 60.0, "minutes"
        else:
            self.x_divisor, self.x_unit = 3600.0, "hours"
        self.series: Mapping[str, Mapping[str, Sequence[Any]]] = artifact.get("series") or {}
        self.steady: list[Field] = []
        self.panels = self._fold_steady(_plan_panels(self.series))
        self.progress_times = self._progress_times()
        self.marks = self._marks()
        self.throttle = self._throttle_spans()
        self.panel_titles: list[str] = []

    # -- data ---------------------------------------------------------------------------

    def values(self, f: Field) -> list[float | None]:
        """A field's values as drawn: counters as rates per second, in their panel's unit."""
        series = self.series[f.group]
        if (f.group, f.name) in COUNTERS:
            return _rates(series["t"], series[f.name], 2**20)
        return list(series[f.name])

    def _is_steady(self, f: Field) -> bool:
        """Whether a line stays flat: within STEADY_SHARE of its peak all along."""
        values = [v for v in self.values(f) if v is not None]
        return not values or max(values) - min(values) <= STEADY_SHARE * max(abs(max(values)), 1e-9)

    def _fold_steady(self, planned: list[_Panel]) -> list[_Panel]:
        """The panels with their flat lines taken out (into ``steady``); a panel left with
        none is not drawn.  ALWAYS_DRAWN and the GPU panels are drawn whole."""
        panels = []
        for panel in planned:
            if panel.key in ALWAYS_DRAWN or panel.is_gpu:
                panels.append(panel)
                continue
            moving = [f for f in panel.fields if not self._is_steady(f)]
            self.steady.extend(f for f in panel.fields if f not in moving)
            if moving:
                known = panel.title and moving == panel.fields
                panel.fields = moving
                if ":" in panel.key and not known:
                    panel.title = _other_title(panel)
                panels.append(panel)
        return panels

    def steady_text(self) -> str:
        """The folded panels in one line: ``open files 3 · disk free 78.8 GiB``."""
        items = []
        for f in self.steady:
            values = [v for v in self.values(f) if v is not None]
            if not values:
                continue
            unit = "MiB/s" if (f.group, f.name) in COUNTERS else f.unit
            value = values[-1]
            shown = f"{value:.2g} MiB/s" if unit == "MiB/s" else format_value(value, unit)
            who = "" if f.group == "tree" else f"{group_label(f.group).lower()} "
            items.append(f"{who}{f.label} {f.qualifier}".strip() + f" {shown}")
        return " · ".join(items)

    def x(self, t: float) -> float:
        return round(t / self.x_divisor, 6)

    def _events_lost(self) -> tuple[float, float] | None:
        """The stretch whose events the artifact did not keep (head and tail are kept)."""
        events = self.artifact.get("events") or []
        if not self.artifact.get("events_dropped") or len(events) <= EVENTS_HEAD:
            return None
        return float(events[EVENTS_HEAD - 1]["t"]), float(events[EVENTS_HEAD]["t"])

    def _progress_times(self) -> list[float]:
        """Every progress time (the journal's when there is one); sets ``progress_files``."""
        if self.detail is not None:
            pairs = sorted(zip(self.detail.progress_times, self.detail.progress_files, strict=True))
        else:
            pairs = [
                (float(e["t"]), _file_names(e.get("paths")))
                for e in self.artifact.get("events") or []
                if e.get("kind") == "progress"
            ]
        self.progress_files = [files for _, files in pairs]
        return [t for t, _ in pairs]

    def _marks(self) -> list[_Mark]:
        marks: list[_Mark] = []
        artifact = self.artifact
        for event in artifact.get("events") or []:
            kind = event.get("kind")
            t = float(event.get("t", 0.0))
            when = f"{format_duration(t)} ({self._wall(t)})"
            if kind == "failure":
                marks.append(
                    _Mark(
                        t,
                        "failure",
                        str(event.get("reason")),
                        f"failure {event.get('reason')} at {when}<br>"
                        + html.escape(str(event.get("message"))),
                        COLORS["failure"],
                        "x",
                        "solid",
                    )
                )
            elif kind == "signal":
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        str(event.get("signal")),
                        f"{event.get('signal')} sent to the {event.get('target')} at {when}"
                        f"<br>pids {_pids(event.get('pids'))}",
                        COLORS["signal"],
                        "triangle-down",
                        "dash",
                    )
                )
            elif kind in ("stop", "stdin_closed"):
                text = (
                    f"stop ({event.get('cause')}, grace {event.get('grace_seconds')}s)"
                    if kind == "stop"
                    else "stdin closed"
                )
                marks.append(
                    _Mark(t, "monitor", "", f"{text} at {when}", COLORS["signal"], "square", None)
                )
            elif kind == "exited":
                text = _exit_label(artifact)
                marks.append(
                    _Mark(t, "command", text, f"{text} at {when}", COLORS["exit"], "diamond", "dot")
                )
            elif kind == "started":
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
            elif kind == "forensics":
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        "",
                        f"forensics of {event.get('processes')} process(es) at {when}"
                        "<br>(see Forensics, below the plots)",
                        COLORS["leftover"],
                        "star",
                        None,
                    )
                )
            elif kind == "oom_kill":
                marks.append(
                    _Mark(
                        t,
                        "failure",
                        "OOM kill",
                        f"the kernel's OOM killer killed pid {event.get('pid')} "
                        f"({html.escape(str(event.get('name')))}) at {when}",
                        COLORS["failure"],
                        "x-open",
                        "dot",
                    )
                )
            elif kind in ("leftover", "abandoned"):
                process = event.get("process") or {}
                marks.append(
                    _Mark(
                        t,
                        "monitor",
                        "",
                        f"{kind}: pid {process.get('pid')} {html.escape(str(process.get('name')))}"
                        f" at {when}",
                        COLORS["leftover"],
                        "circle",
                        None,
                    )
                )
            elif kind == "trend":
                marks.append(
                    _Mark(
                        t,
                        "notes",
                        "leak" if event.get("verdict") == "leak" else "breach ahead",
                        f"{event.get('verdict')} ({event.get('series')}) at {when}<br>"
                        + html.escape(str(event.get("message"))),
                        COLORS["failure"],
                        "triangle-up",
                        None,
                    )
                )
            elif kind in ("warning", "sampler_degraded", "sampler_recovered", "sampler_note"):
                who = event.get("sampler") or "monitor"
                marks.append(
                    _Mark(
                        t,
                        "notes",
                        "warning" if kind == "warning" else "sampler",
                        f"{kind} ({who}) at {when}<br>{html.escape(str(event.get('message')))}",
                        COLORS["note"],
                        "circle",
                        None,
                    )
                )
        if not event_times(artifact, "failure"):
            # A monitor lost has no failure event: the journal just ends.
            for failure in artifact.get("failures") or []:
                if failure.get("reason") == "monitor_lost":
                    marks.append(
                        _Mark(
                            self.duration,
                            "failure",
                            "monitor_lost",
                            "the journal ends here: the monitor died<br>"
                            + html.escape(str(failure.get("message"))),
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
        started = self.artifact.get("started_at")
        if not started:
            return ""
        moment = datetime.fromisoformat(str(started).replace("Z", "+00:00")) + timedelta(seconds=t)
        return moment.astimezone(UTC).strftime("%H:%M:%S UTC")

    # -- figure -------------------------------------------------------------------------

    def lanes(self) -> list[str]:
        order = ["progress", "command", "monitor", "failure", "notes"]
        used = {m.lane for m in self.marks} | {"progress", "command"}
        lanes = [lane for lane in order if lane in used]
        lanes.extend(f"{g} throttled" for g in sorted(self.throttle, key=_group_sort_key))
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
        fig = make_subplots(
            rows=len(heights),
            cols=1,
            shared_xaxes=True,
            row_heights=heights,
            vertical_spacing=gap / plot_height,
            subplot_titles=titles,
        )
        self.panel_titles = titles
        self._draw_lanes(fig, go, lanes)
        self._draw_progress(fig, go)
        for row, panel in enumerate(self.panels, start=3):
            self._draw_panel(fig, go, row, panel)
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

    def _draw_lanes(self, fig: Any, go: Any, lanes: list[str]) -> None:
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
            tick_texts = [text for _, text in ticks]
            fig.add_trace(
                go.Scatter(
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
            marks = [m for m in self.marks if m.lane == lane]
            if not marks:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[self.x(m.t) for m in marks],
                    y=[y_of[lane]] * len(marks),
                    mode="markers+text",
                    text=[m.label for m in marks],
                    textposition=[
                        "middle left" if m.t > self.duration * 0.6 else "middle right"
                        for m in marks
                    ],
                    textfont={"size": 12, "color": [m.color for m in marks]},
                    marker={
                        "symbol": [m.symbol for m in marks],
                        "size": 13,
                        "color": [m.color for m in marks],
                        "line": {"width": 2, "color": [m.color for m in marks]},
                    },
                    hovertext=[m.hover for m in marks],
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
                texts.extend([", ".join(reasons), ", ".join(reasons), None])
            fig.add_trace(
                go.Scatter(
                    x=span_xs,
                    y=span_ys,
                    mode="lines",
                    line={"width": 10, "color": "orange"},
                    text=texts,
                    hovertemplate=f"{group} throttled: %{{text}}<extra></extra>",
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
        fig.update_yaxes(
            row=1,
            col=1,
            tickvals=[y_of[lane] for lane in lanes],
            ticktext=lanes,
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
                    f"progress at {format_duration(t)} ({self._wall(t)})"
                    + (f"<br>{html.escape(f)}" if f else ""),
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
                text += f"<br>last: {html.escape(files[members[-1]])}"
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
        exits = event_times(self.artifact, "exited")
        end = max(previous, min([self.duration, *exits]))
        xs.append(self.x(end))
        ys.append(round(end - previous, 3))
        return xs, ys

    def _draw_progress(self, fig: Any, go: Any) -> None:
        xs, ys = self._progress_curve()
        fig.add_trace(
            go.Scatter(
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
                go.Scatter(
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

    def _draw_panel(self, fig: Any, go: Any, row: int, panel: _Panel) -> None:
        processes = self._process_lines() if panel.key == "tree_memory" else []
        peak = 0.0
        for f in panel.fields:
            values = [v for v in self.values(f) if v is not None]
            peak = max([peak, *values])
        for _, _, ys in processes:
            peak = max([peak, *(v for v in ys if v is not None)])
        scale = _scale_for(panel.unit, peak)
        legend = f"legend{row}"
        gpu_colors = {
            g: PALETTE[i % len(PALETTE)]
            for i, g in enumerate(sorted({f.group for f in panel.fields}, key=_group_sort_key))
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
            dash = "dot" if any(w in f.name for w in ("limit", "total")) else "solid"
            ys = [None if v is None else v / scale.divisor for v in self.values(f)]
            fig.add_trace(
                go.Scatter(
                    x=[self.x(t) for t in series["t"]],
                    y=ys,
                    mode="lines",
                    line={"color": color, "width": 1.8, "dash": dash},
                    name=name,
                    legend=legend,
                    showlegend=len(panel.fields) > 1 or bool(processes) or self._has_baseline(f),
                    meta=[panel.title, name, scale.unit],
                    hoverinfo="none",
                ),
                row=row,
                col=1,
            )
            self._draw_baseline(fig, go, row, f, name, color, scale, legend, panel.title)
        for j, (pid_name, ts, ys) in enumerate(processes):
            fig.add_trace(
                go.Scatter(
                    x=[self.x(t) for t in ts],
                    y=[None if v is None else v / scale.divisor for v in ys],
                    mode="lines",
                    line={"color": PALETTE[(j + 2) % len(PALETTE)], "width": 1.1},
                    name=pid_name,
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
        for p in (self.artifact.get("processes") or [])[:PROCESS_LINES]:
            series = p.get("series") or {} if isinstance(p, dict) else {}
            if series.get("t") and series.get("rss_bytes"):
                lines.append(
                    (
                        f"pid {p.get('pid')} {p.get('name') or ''}".strip(),
                        series["t"],
                        series["rss_bytes"],
                    )
                )
        return lines

    def _has_baseline(self, f: Field) -> bool:
        return bool((self.baseline_series.get(f.group) or {}).get(f.name))

    def _draw_baseline(
        self,
        fig: Any,
        go: Any,
        row: int,
        f: Field,
        name: str,
        color: str,
        scale: _Scale,
        legend: str,
        title: str,
    ) -> None:
        """The baseline run's line for the same field, faint and dashed beneath."""
        if not self._has_baseline(f):
            return
        base = self.baseline_series[f.group]
        values: Sequence[float | None] = base[f.name]
        if (f.group, f.name) in COUNTERS:
            values = _rates(base["t"], values, 2**20)
        fig.add_trace(
            go.Scatter(
                x=[self.x(t) for t in base["t"]],
                y=[None if v is None else v / scale.divisor for v in values],
                mode="lines",
                line={"color": color, "width": 1.2, "dash": "dash"},
                opacity=0.55,
                name=f"{name} (baseline)",
                legend=legend,
                meta=[title, f"{name} (baseline)", scale.unit],
                hoverinfo="none",
            ),
            row=row,
            col=1,
        )

    def _annotate_slopes(self, fig: Any, row: int) -> None:
        """The memory trends on the memory panel: the tree's, and each leaking process's."""
        trends = self.artifact.get("trends") or {}
        lines = []
        for key in ("tree.rss_bytes", "tree.pss_bytes"):
            entry = trends.get(key)
            if isinstance(entry, dict) and isinstance(entry.get("slope_per_hour"), int | float):
                lines.append(
                    f"tree {key.split('.')[1].split('_')[0].upper()} "
                    + rate_text(
                        float(entry["slope_per_hour"]),
                        "bytes",
                        float(entry.get("span_seconds") or 0.0),
                    )
                    + f" ({entry.get('verdict')})"
                )
        for leak in leaking_series(self.artifact):
            slope = leak.get("slope_per_hour")
            if str(leak["series"]).startswith("process.") and isinstance(slope, int | float):
                growth = leak.get("growth")
                rate = rate_text(
                    float(slope),
                    "bytes",
                    float(leak.get("span_seconds") or 0.0),
                    like=float(growth) if isinstance(growth, int | float) else None,
                )
                lines.append(f"{leak.get('label') or leak['series']}: {rate} (leak)")
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
            text="<br>".join(html.escape(line) for line in lines),
            showarrow=False,
            bgcolor="rgba(255,255,255,0.8)",
            font={
                "color": COLORS["failure"] if leaking_series(self.artifact) else "#333",
                "size": 12,
            },
        )

    def _draw_marks_across(self, fig: Any) -> None:
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
        started = self.artifact.get("started_at")
        start_ms = (
            datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp() * 1000
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


def _file_names(paths: object, shown: int = 3) -> str:
    """``checkpoint-30/trainer_state.json, metrics.jsonl`` (and how many more)."""
    if not isinstance(paths, list) or not paths:
        return ""
    names = ", ".join(str(p) for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def _rates(
    times: Sequence[float], counter: Sequence[float | None], divisor: float
) -> list[float | None]:
    """A counter's rate per second between samples (divided by ``divisor``); a counter that
    went down (a process left the tree, taking its count) gives no rate there."""
    out: list[float | None] = [None]
    for i in range(1, len(counter)):
        before, after = counter[i - 1], counter[i]
        dt = times[i] - times[i - 1]
        if before is None or after is None or dt <= 0 or after < before:
            out.append(None)
        else:
            out.append((after - before) / dt / divisor)
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


def _pids(pids: object) -> str:
    if not isinstance(pids, list):
        return "?"
    shown = ", ".join(str(p) for p in pids[:10])
    return shown + (f" and {len(pids) - 10} more" if len(pids) > 10 else "")


def _exit_label(artifact: Mapping[str, Any]) -> str:
    exit_ = artifact.get("exit") or {}
    returncode = exit_.get("returncode")
    if returncode is not None and returncode < 0:
        return f"exit: {exit_.get('signal') or returncode}"
    return f"exit {returncode}"


# -- tables ------------------------------------------------------------------------------------


def _gpu_html(summary: Mapping[str, Any], timeline: _Timeline) -> str:
    gpus = summary["gpus"]
    if not gpus:
        return ""
    rows = []
    for g in gpus:
        throttled = ", ".join(g["throttle_reasons"]) or "-"
        if g["throttle_reasons"] and g["gpu"] not in timeline.throttle:
            throttled += " (when: in the journal)"
        cells = [
            g["gpu"],
            g.get("name") or "n/a",
            format_value(g["utilization_mean_percent"], "%"),
            format_value(g["utilization_max_percent"], "%"),
            format_value(g["memory_used_max_mib"], "MiB"),
            format_value(g["power_max_w"], "W"),
            format_value(g["temperature_max_c"], "°C"),
            throttled,
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = (
        "<tr><th>GPU</th><th>name</th><th>utilisation mean</th><th>max</th>"
        "<th>memory used max</th><th>power max</th><th>temperature max</th>"
        "<th>clocks held back by</th></tr>"
    )
    return f'<section id="gpus"><h2>GPUs</h2><table>{head}{"".join(rows)}</table></section>'


def _events_html(artifact: Mapping[str, Any]) -> str:
    events = list(artifact.get("events") or [])
    started = artifact.get("started_at")
    start = datetime.fromisoformat(str(started).replace("Z", "+00:00")) if started else None
    dropped = int(artifact.get("events_dropped") or 0)
    rows: list[str] = []

    def wall(t: float) -> str:
        if start is None:
            return ""
        return (start + timedelta(seconds=t)).astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]

    def row(kind: str, t: float, what: str, detail: str) -> None:
        rows.append(
            f'<tr class="{html.escape(kind)}"><td>{format_duration(t)}</td><td>{wall(t)}</td>'
            f"<td>{html.escape(what)}</td><td>{html.escape(detail)}</td></tr>"
        )

    i = 0
    while i < len(events):
        if dropped and i == EVENTS_HEAD:
            rows.append(
                f'<tr class="gap"><td colspan="4">... {dropped} events not kept in the '
                "artifact (the journal has them all) ...</td></tr>"
            )
        event = events[i]
        if event.get("kind") == "progress":
            j = i
            paths: dict[str, None] = {}
            while (
                j < len(events)
                and events[j].get("kind") == "progress"
                and not (dropped and j == EVENTS_HEAD and j != i)
            ):
                paths.update(dict.fromkeys(events[j].get("paths") or []))
                j += 1
            run = events[i:j]
            names = ", ".join(str(p) for p in list(paths)[:5])
            more = ", ..." if len(paths) > 5 else ""
            changed = sum(int(e.get("changed", 1)) for e in run)
            if len(run) == 1:
                row("progress", float(event["t"]), "progress", f"{names}{more}")
            else:
                # The header counts changed files; say both so the figures agree.
                row(
                    "progress",
                    float(run[0]["t"]),
                    f"progress x{len(run)}",
                    f"{changed} changes until {format_duration(float(run[-1]['t']))}: "
                    f"{names}{more}",
                )
            i = j
            continue
        row(str(event.get("kind")), float(event.get("t", 0.0)), *_event_text(artifact, event))
        i += 1
    if not rows:
        return ""
    head = "<tr><th>since start</th><th>time (UTC)</th><th>event</th><th>details</th></tr>"
    return (
        f'<section id="events"><h2>Events</h2><div class="scroll"><table>{head}{"".join(rows)}'
        "</table></div></section>"
    )


def _event_text(artifact: Mapping[str, Any], event: Mapping[str, Any]) -> tuple[str, str]:
    kind = str(event.get("kind"))
    if kind == "started":
        return "started", f"pid {event.get('pid')} (reaper {event.get('reaper_pid')})"
    if kind == "failure":
        return f"failure: {event.get('reason')}", str(event.get("message"))
    if kind == "stop":
        return "stop", _stop_text(event)
    if kind == "signal":
        return (
            f"{event.get('signal')} sent",
            f"to the {event.get('target')}: pids {_pids(event.get('pids'))}",
        )
    if kind == "exited":
        return "command exited", exit_text(artifact)
    if kind == "tree_gone":
        return "tree gone", "every process of the tree has exited"
    if kind in ("leftover", "abandoned"):
        return kind, _process_text(event.get("process") or {})
    if kind in ("sampler_degraded", "sampler_recovered", "sampler_note"):
        return kind.replace("_", " "), f"{event.get('sampler')}: {event.get('message')}"
    if kind == "warning":
        return "warning", str(event.get("message"))
    if kind == "finished":
        return "finished", f"status {event.get('status')}"
    if kind == "forensics":
        return "forensics", f"{event.get('processes')} process(es) recorded (see Forensics)"
    if kind == "oom_kill":
        return "OOM kill", f"pid {event.get('pid')} ({event.get('name')}): {event.get('message')}"
    rest = {k: v for k, v in event.items() if k not in ("t", "kind")}
    return kind, json.dumps(rest, default=str)[:300]


def _stop_text(stop: Mapping[str, Any]) -> str:
    """``cause failure, mode group, grace 5.0s``, leaving out what was not recorded."""
    parts = [f"cause {stop.get('cause')}"]
    if stop.get("mode") is not None:
        parts.append(f"mode {stop['mode']}")
    grace = stop.get("grace_seconds")
    if isinstance(grace, int | float):
        parts.append(f"grace {format_duration(float(grace))}")
    return ", ".join(parts)


def _process_text(process: Mapping[str, Any]) -> str:
    cmdline = process.get("cmdline")
    command = shlex.join(cmdline) if cmdline else str(process.get("name"))
    return f"pid {process.get('pid')} ({process.get('state', '?')}): {command}" + (
        f"; {process['left_group']}" if process.get("left_group") else ""
    )


def _process_table(processes: Sequence[Mapping[str, Any]]) -> str:
    head = "<tr><th>pid</th><th>ppid</th><th>state</th><th>command</th><th>how it left</th></tr>"
    rows = []
    for p in processes:
        cmdline = p.get("cmdline")
        command = shlex.join(cmdline) if cmdline else str(p.get("name") or "?")
        cells = [
            p.get("pid"),
            p.get("ppid", ""),
            p.get("state", "?"),
            command,
            p.get("left_group", ""),
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _leftovers_html(artifact: Mapping[str, Any]) -> str:
    leftovers = artifact.get("leftover_processes") or []
    body = (
        _process_table(leftovers)
        if leftovers
        else '<p class="empty">None: every process of the tree ended with the command.</p>'
    )
    return f'<section id="leftovers"><h2>Leftover processes</h2>{body}</section>'


def _forensics_html(artifact: Mapping[str, Any]) -> str:
    parts = ['<section id="forensics"><h2>Forensics</h2>']
    abandoned = artifact.get("abandoned_processes") or []
    if abandoned:
        parts.append("<h3>Processes that would not die (abandoned)</h3>")
        parts.append(_process_table(abandoned))
    oom_kills = artifact.get("oom_kills") or []
    if oom_kills:
        items = "".join(
            f"<li>pid {html.escape(str(k.get('pid')))} ({html.escape(str(k.get('name')))}): "
            f'<span class="mono">{html.escape(str(k.get("message")))}</span></li>'
            for k in oom_kills
        )
        parts.append(f"<h3>Killed by the kernel's OOM killer</h3><ul>{items}</ul>")
    forensics = artifact.get("forensics")
    if isinstance(forensics, dict):
        parts.append(_stall_forensics_html(forensics, (artifact.get("exit") or {}).get("pid")))
    monitor = dict(artifact.get("monitor") or {})
    notes = monitor.pop("sampler_notes", []) or []
    if notes:
        items = "".join(
            f"<li>{format_duration(float(n.get('t', 0)))}: {html.escape(str(n.get('kind')))} "
            f"({html.escape(str(n.get('sampler')))}): {html.escape(str(n.get('message')))}</li>"
            for n in notes
        )
        parts.append(f"<h3>Sampler notes</h3><ul>{items}</ul>")
    stop = artifact.get("stop") or {}
    if stop.get("cause"):
        parts.append(
            "<p>Stop: "
            + html.escape(
                f"{_stop_text(stop)}, SIGKILL needed: {'yes' if stop.get('killed') else 'no'}"
            )
            + "</p>"
        )
    # The monotonic start only serves to date kernel records; it means nothing to a reader.
    shown = {
        k: v for k, v in monitor.items() if v not in (None, {}, [], "") and k != "monotonic_start"
    }
    parts.append(
        "<p>Monitor: "
        + html.escape(", ".join(f"{k.replace('_', ' ')} {_plain(v)}" for k, v in shown.items()))
        + "</p>"
    )
    parts.append(_json_details("Effective configuration", artifact.get("config")))
    parts.append(_json_details("Runtime snapshot (provenance)", artifact.get("snapshot")))
    parts.append("</section>")
    return "\n".join(parts)


def _stall_forensics_html(forensics: Mapping[str, Any], main_pid: object = None) -> str:
    """The processes as forensics saw them: the command's own first and open, its main thread
    first; idle workers folded together."""
    t = forensics.get("t")
    when = format_duration(float(t)) if isinstance(t, int | float) else "?"
    processes = list(forensics.get("processes") or [])
    py_spy = forensics.get("py_spy") or "not installed (pip install py-spy for Python stacks)"
    parts = [
        f"<h3>What the tree was doing at {when} ({html.escape(str(forensics.get('reason')))}), "
        "before the first signal</h3>",
        f'<p class="help">{len(processes)} process(es); py-spy: {html.escape(str(py_spy))}'
        + (
            f"; {forensics['skipped_for_time']} skipped for lack of time"
            if forensics.get("skipped_for_time")
            else ""
        )
        + "</p>",
    ]
    processes.sort(key=lambda p: p.get("pid") != main_pid)
    idle = [p for p in processes[1:] if _all_idle(p)]
    if len(idle) < 2:
        idle = []
    parts.append(_process_details([p for p in processes if p not in idle], open_first=True))
    if idle:
        # Idle workers (dataloaders waiting on their queue) say little: folded, one line.
        names = ", ".join(f"{p.get('pid')} {p.get('name')}" for p in idle[:8])
        parts.append(
            f"<details><summary>{len(idle)} idle process(es): {html.escape(names)}"
            + (" ..." if len(idle) > 8 else "")
            + "</summary>"
            + _process_details(idle, open_first=False)
            + "</details>"
        )
    return "\n".join(parts)


def _all_idle(process: Mapping[str, Any]) -> bool:
    """Whether py-spy saw every thread of a process idle."""
    stack = str((process.get("python_stack") or {}).get("stack") or "")
    threads = [line for line in stack.splitlines() if line.startswith("Thread ")]
    return bool(threads) and all("(idle)" in line for line in threads)


def _split_threads(dump: str) -> tuple[str, str]:
    """A py-spy dump as (its header and main thread, every other thread)."""
    lines = dump.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Thread ")]
    if len(starts) < 2:
        return dump, ""
    main = next((i for i in starts if "MainThread" in lines[i]), starts[0])
    end = next((i for i in starts if i > main), len(lines))
    head = lines[: starts[0]]
    rest = [line for i, line in enumerate(lines) if i >= starts[0] and not main <= i < end]
    return "\n".join(head + lines[main:end]), "\n".join(rest)


def _process_details(processes: Sequence[Mapping[str, Any]], *, open_first: bool) -> str:
    parts: list[str] = []
    for i, process in enumerate(processes):
        if "error" in process and "name" not in process:
            parts.append(
                f"<p>pid {html.escape(str(process.get('pid')))}: "
                f"{html.escape(str(process['error']))}</p>"
            )
            continue
        wchan = process.get("wchan")
        where = f" in <b>{html.escape(str(wchan))}</b>" if wchan not in (None, "", "0") else ""
        frame = innermost_python_frame(process)
        at = f", Python at <b>{html.escape(frame)}</b>" if frame else ""
        summary = (
            f"pid {html.escape(str(process.get('pid')))} {html.escape(str(process.get('name')))}"
            f": {html.escape(str(process.get('state')))}{where}, "
            f"{html.escape(str(process.get('num_threads')))} thread(s){at}"
        )
        body = [f'<p class="mono">{html.escape(_short_command(process.get("cmdline")))}</p>']
        stack = process.get("python_stack") or {}
        if stack.get("stack"):
            main, rest = _split_threads(str(stack["stack"]))
            body.append(f"<h4>Python stack (py-spy)</h4><pre>{html.escape(main)}</pre>")
            if rest:
                body.append(
                    f"<details><summary>{rest.count('Thread ')} other thread(s)</summary>"
                    f"<pre>{html.escape(rest)}</pre></details>"
                )
        elif stack.get("error"):
            body.append(f"<p>Python stack: {html.escape(str(stack['error']))}</p>")
        if process.get("kernel_stack"):
            body.append(
                f"<h4>Kernel stack</h4><pre>{html.escape(str(process['kernel_stack']))}</pre>"
            )
        threads = process.get("threads") or []
        if len(threads) > 1:
            rows = "".join(
                "<tr>"
                + "".join(
                    f"<td>{html.escape(str(th.get(k, '')))}</td>"
                    for k in ("tid", "name", "state", "wchan")
                )
                + "</tr>"
                for th in threads
            )
            body.append(
                "<h4>Threads</h4><table><tr><th>tid</th><th>name</th><th>state</th>"
                f"<th>waiting in</th></tr>{rows}</table>"
            )
        opened = " open" if i == 0 and open_first else ""
        parts.append(f"<details{opened}><summary>{summary}</summary>{''.join(body)}</details>")
    return "\n".join(parts)


def _short_command(cmdline: object) -> str:
    if not isinstance(cmdline, list) or not cmdline:
        return ""
    text = shlex.join(str(a) for a in cmdline).replace("\n", " ")
    return text if len(text) <= COMMAND_SHOWN else text[: COMMAND_SHOWN - 3] + "..."


def _plain(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items())
    return str(value)


def _json_details(title: str, value: object) -> str:
    text = json.dumps(value, indent=1, default=str)
    return (
        f"<details><summary>{html.escape(title)}</summary><pre>{html.escape(text)}</pre></details>"
    )


def _log_html(artifact: Mapping[str, Any]) -> str:
    log = artifact.get("log") or {}
    tail = str(log.get("tail") or "")
    path = html.escape(str(log.get("path")))
    if not tail.strip():
        return (
            '<section id="log"><h2>Log tail</h2><p class="empty">'
            f"The command printed nothing ({path}).</p></section>"
        )
    return (
        f'<section id="log"><h2>Log tail</h2><p class="help">The end of the command\'s output, '
        f'from {path}.</p><pre class="log" id="log-tail">{html.escape(tail)}</pre></section>'
        "<script>var log = document.getElementById('log-tail');"
        " log.scrollTop = log.scrollHeight;</script>"
    )


def _footer_html(artifact: Mapping[str, Any], source: str | None) -> str:
    made_from = f" from {html.escape(source)}" if source else ""
    journal = (artifact.get("monitor") or {}).get("journal_path")
    return (
        f"<footer>asyncsoak {__version__} report{made_from}; journal "
        f"{html.escape(str(journal))}.</footer>"
    )
