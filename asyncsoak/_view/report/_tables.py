"""The page's HTML sections besides the figure and the record (``_events``): verdict, evidence,
facts, processes, GPUs, the comparison."""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..._contract import Artifact, FailureReason, SoakStatus, format_duration
from .._evidence import rate_text
from .._fields import format_clock, format_value
from .._sections import (
    abandoned_processes,
    config_value,
    host_probe,
    process_role,
    stall_forensics,
    summary_figure,
    top_processes,
    trend_verdicts,
    wall_clock,
)
from .._status import is_pass, status_words
from .._summary import progress_text
from .._training import training_line
from ._assets import head_row, table_row
from ._events import COMMAND_SHOWN

if TYPE_CHECKING:
    from ._timeline import TimelineModel


#: Where a GPU fault's message names its action: the page says it once, as the next step.
ACTION = " Action: "

#: Warnings the banner names at most (the Events table holds every one).
BANNER_WARNINGS = 4


def without_action(text: str) -> str:
    """A fault's words less its action, which the evidence's next step says."""
    return text.split(ACTION, 1)[0]


def verdict_html(summary: Mapping[str, Any]) -> str:
    # The status people read: a pass with warnings is ``passed_with_warnings``, amber.
    status = str(summary["status"])
    parts = [
        f'<header id="verdict" class="verdict {html.escape(status)}">',
        f'<span class="badge">{html.escape(status_words(status))}</span>',
        f"<h1>{html.escape(summary['headline'])}</h1>",
    ]
    for i, reason in enumerate(summary["reasons"]):
        at = f" at {format_duration(reason['t'])}" if reason["t"] is not None else ""
        lead = "" if i == 0 else "Also: "
        parts.append(
            f'<p class="reason">{lead}<b>{html.escape(reason["reason"])}</b>{at}: '
            f"{html.escape(without_action(reason['message']))}</p>"
        )
    warnings = summary["warnings"]
    if not summary["reasons"] and warnings:
        # A pass with warnings names them.
        more = len(warnings) - BANNER_WARNINGS
        items = [html.escape(w) for w in warnings[:BANNER_WARNINGS]]
        items += [f"and {more} more (see Events)"] if more > 0 else []
        label = "Warning" if len(warnings) == 1 else "Warnings"
        parts.append(
            f'<p class="reason">{label}:</p><ul class="warnings">'
            + "".join(f"<li>{item}</li>" for item in items)
            + "</ul>"
        )
    training = training_line(summary["progress"].get("steps"))
    if training:
        parts.append(f'<p class="training">{html.escape(training)}</p>')
    if summary.get("goodput"):
        parts.append(goodput_html(summary["goodput"]))
    parts.append("</header>")
    return "\n".join(parts)


#: The goodput strip's parts, in the order they come along a run, and their colours.
GOODPUT_STRIP = (
    ("startup", "#9e9e9e"),
    ("productive", "#2e7d32"),
    ("wasted", "#6d4c41"),
    ("slow_steps", "#f9a825"),
    ("checkpoint", "#1565c0"),
    ("other", "#cfd8dc"),
    ("stall", "#c62828"),
    ("shutdown", "#616161"),
)


def goodput_html(goodput: Mapping[str, Any]) -> str:
    """The goodput line, and the run's wall time as a strip of its parts."""
    wall = goodput.get("wall_seconds") or 0.0
    seconds = {"productive": goodput.get("productive_seconds") or 0.0}
    seconds.update(goodput.get("badput_seconds") or {})
    cells = "".join(
        f'<span title="{name}: {format_duration(seconds[name])}" style="flex:{seconds[name]:.3f};'
        f'background:{colour}"></span>'
        for name, colour in GOODPUT_STRIP
        if wall > 0 and goodput.get("ratio") is not None and seconds.get(name, 0) > 0
    )
    strip = f'<div class="goodput-strip" style="display:flex;height:.8em">{cells}</div>'
    return f'<p class="goodput">{html.escape(goodput["text"])}</p>' + (strip if cells else "")


#: Sections the evidence block links to, when the page has them.
ANCHORS = (
    ("log", "Log"),
    ("forensics", "Forensics"),
    ("processes", "Processes"),
    ("timeline-section", "Timeline"),
    ("events", "Events"),
)


def evidence_html(artifact: Artifact, summary: Mapping[str, Any]) -> str:
    """The cause, the last progress, the next step and the log's end: what decides the run."""
    evidence = summary["evidence"]
    rows: list[str] = []
    if evidence["cause"]:
        label = "Warning" if is_pass(summary["status"]) else "Cause"
        if summary["reasons"] and summary["reasons"][0]["reason"] == FailureReason.GPU_FAULT:
            label = "GPU fault"
        where = evidence["where"]
        text = f"<b>{html.escape(without_action(evidence['cause']))}</b>"
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
            f"({html.escape(wall_clock(artifact, last['t']) or '?')}), "
            f"{format_duration(last['before_end'])} before {end}{': ' if files else ''}{files}</dd>"
        )
    elif artifact["status"] != SoakStatus.PASSED:
        rows.append("<dt>Last progress</dt><dd>none: no file in the progress dir changed</dd>")
    for i, step in enumerate(evidence["next_steps"]):
        rows.append(f"<dt>{'Next step' if i == 0 else ''}</dt><dd>{html.escape(step)}</dd>")
    log = _log_excerpt_html(evidence["log_lines"], evidence["traceback"])
    # Sections the page leaves out when there is nothing to show; the others are always there.
    shown = {
        "processes": top_processes(artifact),
        "events": artifact["events"],
        "forensics": stall_forensics(artifact) or abandoned_processes(artifact),
    }
    links = " · ".join(f'<a href="#{a}">{name}</a>' for a, name in ANCHORS if shown.get(a, True))
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


def role_text(role: object) -> str:
    """``rank 1 (local 1 of 2)``, ``torchrun (launcher)``, or ``-``."""
    if not isinstance(role, dict):
        return "-"
    if "launcher" in role:
        return f"{role['launcher']} (launcher)"
    # A rank's role (the schema's ``rank``) holds all of these, null where unknown.
    local, world = role["local_rank"], role["world_size"]
    parts = [f"local {local}"] if local is not None else []
    detail = ", ".join(parts + ([f"of {world}"] if world is not None else []))
    return f"rank {role['rank']}" + (f" ({detail})" if detail else "")


def processes_html(artifact: Artifact) -> str:
    """The top processes by peak memory: who grew, and who used the CPU and GPU."""
    processes = top_processes(artifact)
    if not processes:
        return ""
    trends = trend_verdicts(artifact)
    rows = []
    for p in processes:
        # A series judged too short has no trend.
        key = f"process.{p['pid']}"
        trend: Mapping[str, Any] = (
            trends.get(f"{key}.anon_bytes") or trends.get(f"{key}.rss_bytes") or {}
        )
        peak, gpu = p["peak_rss_bytes"], p["peak_gpu_memory_bytes"]
        rss = (p["first_rss_bytes"], peak, p["last_rss_bytes"])
        slope, verdict = trend.get("slope_per_hour"), trend.get("verdict", "")
        growth = (
            rate_text(float(slope), "bytes", float(trend["span_seconds"]), like=peak)
            if isinstance(slope, int | float)
            else ""
        )
        cells = [
            p["pid"],
            p["name"] or "?",
            role_text(process_role(p)),
            " → ".join(format_value(v, "bytes", like=peak) for v in rss),
            f"{growth} ({verdict})" if growth else verdict or "-",
            format_value(p["mean_cpu_percent"], "%"),
            format_value(gpu, "bytes") if gpu else "-",
            p["peak_threads"],
        ]
        rows.append(table_row(cells, "leak" if verdict == "leak" else ""))
    head = head_row(
        "pid",
        "name",
        "role",
        "RSS first → peak → last",
        "trend",
        "CPU mean",
        "GPU memory peak",
        "threads",
    )
    notes = [
        "The tree's RSS adds up each process's resident memory: pages that forked workers "
        "share are counted once per process, so it can exceed the machine's used memory.",
        _cpu_competition(artifact),
    ]
    return (
        '<section id="processes"><h2>Processes</h2>'
        f'<table class="processes">{head}{"".join(rows)}</table>{_helps(notes)}</section>'
    )


def _helps(notes: Iterable[str | None]) -> str:
    return "".join(f'<p class="help">{html.escape(n)}</p>' for n in notes if n is not None)


def _cpu_competition(artifact: Artifact) -> str | None:
    """A note when the machine's CPU was far above the tree's: something else competed."""
    machine = summary_figure(artifact, "machine", "cpu_percent", "mean")
    tree = summary_figure(artifact, "tree", "cpu_percent", "mean")
    host = host_probe(artifact)
    if not (isinstance(machine, int | float) and isinstance(tree, int | float)) or host is None:
        return None
    cores = host["usable_cpus"]
    # The machine's figure is a share of every core; the tree's, of one core.
    machine_cores = machine * cores / 100.0
    tree_cores = tree / 100.0
    if machine_cores - tree_cores < max(0.5, tree_cores):
        return None
    return (
        f"The machine used about {machine_cores:.1f} core(s) on average against the tree's "
        f"{tree_cores:.1f}: something outside the tree competed for the CPU."
    )


def compare_html(artifact: Artifact, baseline: Artifact | None, name: str | None) -> str:
    """The figures of this run beside the baseline's, regressions marked."""
    if baseline is None:
        return ""
    from .._compare import compare

    comparison = compare(baseline, artifact, baseline_name=name or "baseline")
    rows = []
    for row in comparison.rows:
        change = f"{row.change:+.0%}" if row.change is not None else ""
        mark = "regressed" if row.regressed else ""
        cells = [row.label, row.text(row.baseline), row.text(row.candidate), change, mark]
        rows.append(table_row(cells, mark))
    regressions = comparison.regressions
    verdict = (
        f"{len(regressions)} regression(s): " + "; ".join(r.note for r in regressions)
        if regressions
        else "no regression against the baseline"
    )
    head = head_row("", "baseline", "this run", "change", "")
    notes = _helps(comparison.notes)
    return (
        f'<section id="compare"><h2>Against the baseline {html.escape(name or "")}</h2>'
        f"<p><b>{html.escape(verdict)}</b>. Its lines are dashed beneath this run's.</p>"
        f'<table class="compare">{head}{"".join(rows)}</table>{notes}</section>'
    )


def steady_html(timeline: TimelineModel) -> str:
    text = timeline.steady_text()
    if not text:
        return ""
    return f'<p class="steady"><b>Steady throughout</b> (not plotted): {html.escape(text)}</p>'


def facts_html(artifact: Artifact, summary: Mapping[str, Any]) -> str:
    stale = config_value(artifact, "stale_progress_seconds")
    limit = f" (stale limit {format_duration(stale)})" if stale else ""
    metadata = ", ".join(f"{k}={v}" for k, v in artifact["metadata"].items())
    facts: list[tuple[str, str]] = [
        ("Duration", format_duration(float(summary["duration_seconds"]))),
        ("When", f"{format_clock(summary['started_at'])} to {format_clock(summary['ended_at'])}"),
        ("Command", _command_html(summary["command"])),
        ("Exit", html.escape(summary["exit"]["text"])),
        ("Progress", html.escape(progress_text(summary["progress"], limit))),
        *(
            (name[:1].upper() + name[1:], html.escape(v))
            for name, v in summary["provenance"].items()
        ),
        *([("Metadata", html.escape(metadata))] if metadata else []),
    ]
    rows = "".join(f"<dt>{html.escape(name)}</dt><dd>{value}</dd>" for name, value in facts)
    return f'<dl class="facts">{rows}</dl>'


def _command_html(command: Sequence[str]) -> str:
    text = shlex.join(command)
    if len(text) <= COMMAND_SHOWN:
        return f'<span class="mono">{html.escape(text)}</span>'
    return (
        f'<details><summary class="mono">{html.escape(text[:COMMAND_SHOWN])}...</summary>'
        f"<pre>{html.escape(text)}</pre></details>"
    )


def look_first_html(summary: Mapping[str, Any]) -> str:
    if not summary["look_first"]:
        return ""
    items = "".join(
        f"<li>{html.escape(without_action(hint))}</li>" for hint in summary["look_first"]
    )
    return f'<section class="look"><h2>What to look at first</h2><ul>{items}</ul></section>'


#: The GPU table's figures: (summary key, unit, column).
GPU_COLUMNS = (
    ("utilization_mean_percent", "%", "utilisation mean"),
    ("utilization_max_percent", "%", "max"),
    ("memory_used_max_mib", "MiB", "memory used max"),
    ("power_max_w", "W", "power max"),
    ("temperature_max_c", "°C", "temperature max"),
)


def gpu_html(summary: Mapping[str, Any], timeline: TimelineModel) -> str:
    gpus = summary["gpus"]
    if not gpus:
        return ""
    rows = []
    for g in gpus:
        throttled = ", ".join(g["throttle_reasons"]) or "-"
        if g["throttle_reasons"] and g["gpu"] not in timeline.throttle:
            throttled += " (when: in the journal)"
        figures = [format_value(g[key], unit) for key, unit, _ in GPU_COLUMNS]
        rows.append(table_row([g["gpu"], g["name"] or "n/a", *figures, throttled]))
    head = head_row("GPU", "name", *(column for *_, column in GPU_COLUMNS), "clocks held back by")
    return f'<section id="gpus"><h2>GPUs</h2><table>{head}{"".join(rows)}</table></section>'
