"""The page's HTML sections besides the figure: verdict, evidence, facts, tables, the log."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..._contract import (
    Artifact,
    EventKind,
    FailureReason,
    ForensicsProcess,
    ForensicsSection,
    ProcessRecord,
    ProgressJson,
    SoakStatus,
    format_duration,
    readable_processes,
)
from ..._contract import decode as decode_exit
from ..._record import EVENTS_HEAD
from .._evidence import config_value, innermost_python_frame, rate_text, summary_figure
from .._fields import format_clock, format_value
from .._sections import (
    abandoned_processes,
    events_dropped,
    host_probe,
    oom_kills,
    process_role,
    python_stack,
    python_stack_error,
    sampler_notes,
    stall_forensics,
    stop_section,
    top_processes,
    trend_verdicts,
)
from .._status import is_pass, status_words
from .._summary import exit_text, oom_killer, summary_training

if TYPE_CHECKING:
    from ._figure import Timeline


#: Characters of the command shown before it is folded.
COMMAND_SHOWN = 240


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
            f"{html.escape(reason['message'])}</p>"
        )
    training = summary_training(summary)
    if training:
        parts.append(f'<p class="training">{html.escape(training)}</p>')
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


def evidence_html(artifact: Artifact, summary: Mapping[str, Any]) -> str:
    """The cause, the last progress, the next step and the log's end: what decides the run."""
    evidence = summary["evidence"]
    rows: list[str] = []
    if evidence["cause"]:
        label = "Warning" if is_pass(summary["status"]) else "Cause"
        if summary["reasons"] and summary["reasons"][0]["reason"] == FailureReason.GPU_FAULT:
            label = "GPU fault"
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
    elif artifact["status"] != SoakStatus.PASSED:
        rows.append("<dt>Last progress</dt><dd>none: no file in the progress dir changed</dd>")
    for i, step in enumerate(evidence["next_steps"]):
        rows.append(f"<dt>{'Next step' if i == 0 else ''}</dt><dd>{html.escape(step)}</dd>")
    log = _log_excerpt_html(evidence["log_lines"], evidence["traceback"])
    # Sections the page leaves out when there is nothing to show; the others are always there.
    empty = {
        anchor
        for anchor, shown in (
            ("processes", top_processes(artifact)),
            ("events", artifact["events"]),
            ("forensics", stall_forensics(artifact) or abandoned_processes(artifact)),
        )
        if not shown
    }
    links = " · ".join(
        f'<a href="#{anchor}">{name}</a>' for anchor, name in ANCHORS if anchor not in empty
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


def _wall_clock(artifact: Artifact, t: float) -> str:
    started = artifact["started_at"]
    if not started:
        return "?"
    moment = datetime.fromisoformat(started.replace("Z", "+00:00")) + timedelta(seconds=t)
    return moment.astimezone(UTC).strftime("%H:%M:%S UTC")


def role_text(role: object) -> str:
    """``rank 1 (local 1 of 2)``, ``torchrun (launcher)``, or ``-``."""
    if not isinstance(role, dict):
        return "-"
    if "launcher" in role:
        return f"{role['launcher']} (launcher)"
    # A rank's role (the schema's ``rank``) holds all of these, null where unknown.
    local, world = role["local_rank"], role["world_size"]
    detail = ", ".join(
        part
        for part in (
            f"local {local}" if local is not None else "",
            f"of {world}" if world is not None else "",
        )
        if part
    )
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
        trend = trends.get(f"process.{p['pid']}.anon_bytes") or trends.get(
            f"process.{p['pid']}.rss_bytes"
        )
        first, peak, last = p["first_rss_bytes"], p["peak_rss_bytes"], p["last_rss_bytes"]
        rss = " → ".join(format_value(v, "bytes", like=peak) for v in (first, peak, last))
        slope = None if trend is None else trend["slope_per_hour"]
        verdict = "" if trend is None else trend["verdict"]
        growth = (
            rate_text(float(slope), "bytes", float(trend["span_seconds"]), like=peak)
            if trend is not None and isinstance(slope, int | float)
            else ""
        )
        cls = ' class="leak"' if verdict == "leak" else ""
        cells = [
            p["pid"],
            p["name"] or "?",
            role_text(process_role(p)),
            rss,
            f"{growth} ({verdict})" if growth else verdict or "-",
            format_value(p["mean_cpu_percent"], "%"),
            format_value(p["peak_gpu_memory_bytes"], "bytes")
            if p["peak_gpu_memory_bytes"]
            else "-",
            p["peak_threads"],
        ]
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells))
    head = (
        "<tr><th>pid</th><th>name</th><th>role</th><th>RSS first → peak → last</th><th>trend</th>"
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


def steady_html(timeline: Timeline) -> str:
    text = timeline.steady_text()
    if not text:
        return ""
    return f'<p class="steady"><b>Steady throughout</b> (not plotted): {html.escape(text)}</p>'


def facts_html(artifact: Artifact, summary: Mapping[str, Any]) -> str:
    progress = summary["progress"]
    last = progress["last_change_t"]
    stale = config_value(artifact, "stale_progress_seconds")
    facts: list[tuple[str, str]] = [
        ("Duration", format_duration(float(summary["duration_seconds"]))),
        ("When", f"{format_clock(summary['started_at'])} to {format_clock(summary['ended_at'])}"),
        ("Command", _command_html(summary["command"])),
        ("Exit", html.escape(summary["exit"]["text"])),
        (
            "Progress",
            html.escape(
                f"{progress['changes']} changes in {progress['dir']}"
                + (f", last at {format_duration(last)}" if last is not None else ", none seen")
                + f"; longest gap {format_duration(float(progress['longest_gap_seconds']))}"
                + (f" (stale limit {format_duration(stale)})" if stale else "")
            ),
        ),
    ]
    for name, value in summary["provenance"].items():
        facts.append((name[:1].upper() + name[1:], html.escape(value)))
    if artifact["metadata"]:
        facts.append(
            (
                "Metadata",
                html.escape(", ".join(f"{k}={v}" for k, v in artifact["metadata"].items())),
            )
        )
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
    items = "".join(f"<li>{html.escape(hint)}</li>" for hint in summary["look_first"])
    return f'<section class="look"><h2>What to look at first</h2><ul>{items}</ul></section>'


def pids(pids: object) -> str:
    if not isinstance(pids, list):
        return "?"
    shown = ", ".join(str(p) for p in pids[:10])
    return shown + (f" and {len(pids) - 10} more" if len(pids) > 10 else "")


def exit_label(artifact: Artifact) -> str:
    """The exit's short mark on the timeline: ``exit: SIGTERM``, ``exit 1``."""
    status = decode_exit(artifact["exit"]["returncode"])
    if status.signal_name is not None:
        return f"exit: {status.signal_name}"
    return f"exit {status.returncode}"


def gpu_html(summary: Mapping[str, Any], timeline: Timeline) -> str:
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
            g["name"] or "n/a",
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


def events_html(artifact: Artifact) -> str:
    events = artifact["events"]
    started = artifact["started_at"]
    start = datetime.fromisoformat(started.replace("Z", "+00:00")) if started else None
    dropped = events_dropped(artifact)
    rows: list[str] = []

    def wall(t: float) -> str:
        if start is None:
            return ""
        return (start + timedelta(seconds=t)).astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]

    def row(kind: str, t: float, what: str, detail: str | Fields) -> None:
        cell = detail.html() if isinstance(detail, Fields) else html.escape(detail)
        rows.append(
            f'<tr class="{html.escape(kind)}"><td>{format_duration(t)}</td><td>{wall(t)}</td>'
            f"<td>{html.escape(what)}</td><td>{cell}</td></tr>"
        )

    i = 0
    while i < len(events):
        if dropped and i == EVENTS_HEAD:
            rows.append(
                f'<tr class="gap"><td colspan="4">... {dropped} events not kept in the '
                "artifact (the journal has them all) ...</td></tr>"
            )
        event = events[i]
        if event["kind"] == EventKind.PROGRESS:
            j = i
            paths: dict[str, None] = {}
            run: list[ProgressJson] = []
            while j < len(events) and not (dropped and j == EVENTS_HEAD and j != i):
                progress = events[j]
                if progress["kind"] != EventKind.PROGRESS:
                    break
                run.append(progress)
                paths.update(dict.fromkeys(progress.get("paths") or []))
                j += 1
            names = ", ".join(str(p) for p in list(paths)[:5])
            more = ", ..." if len(paths) > 5 else ""
            changed = sum(int(e["changed"]) for e in run)
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
        row(event["kind"], float(event["t"]), *_event_text(artifact, event))
        i += 1
    if not rows:
        return ""
    head = "<tr><th>since start</th><th>time (UTC)</th><th>event</th><th>details</th></tr>"
    return (
        f'<section id="events"><h2>Events</h2><div class="scroll"><table>{head}{"".join(rows)}'
        "</table></div></section>"
    )


class Fields:
    """An event's other keys, shown as named fields (sizes, durations and nested keys read
    for people), never as JSON."""

    #: Fields shown at most, and items of a list.
    SHOWN = 16
    ITEMS = 5

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.items = list(_flat_fields(values))

    def html(self) -> str:
        shown = self.items[: self.SHOWN]
        more = len(self.items) - len(shown)
        cells = "".join(
            f'<span class="field"><span class="name">{html.escape(name)}</span> '
            f"{html.escape(value)}</span>"
            for name, value in shown
        )
        return f'<span class="fields">{cells}</span>' + (f" (+{more} more)" if more else "")


def _flat_fields(
    values: Mapping[str, Any], prefix: str = "", outer: str = ""
) -> Iterator[tuple[str, str]]:
    """(name, text) of every set value; a nested object's keys as ``outer inner``, read in
    the outer key's unit (``disk_total_bytes: {progress: N}``)."""
    for key, value in values.items():
        name = f"{prefix}{key}".replace("_", " ")
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, Mapping):
            yield from _flat_fields(value, f"{prefix}{key} ", str(key))
        else:
            yield name, _field_text(outer or str(key), value)


def _field_text(key: str, value: Any) -> str:
    if isinstance(value, list):
        items = [_field_text(key, v) for v in value[: Fields.ITEMS]]
        return ", ".join(items) + (", ..." if len(value) > Fields.ITEMS else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key.endswith("_bytes"):
        return format_value(float(value), "bytes")
    if key.endswith("_seconds"):
        return format_duration(float(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _event_text(artifact: Artifact, event: Mapping[str, Any]) -> tuple[str, str | Fields]:
    """An event's name and details.  An event's fields (``_events``) are all in its line but
    those added since with a default, read with ``.get``."""
    kind = str(event["kind"])
    if kind == EventKind.STARTED:
        return "started", f"pid {event['pid']} (reaper {event['reaper_pid']})"
    if kind == EventKind.FAILURE:
        return f"failure: {event['reason']}", str(event["message"])
    if kind == EventKind.STOP:
        return "stop", _stop_text(event)
    if kind == EventKind.SIGNAL:
        return f"{event['signal']} sent", f"to the {event['target']}: pids {pids(event['pids'])}"
    if kind == EventKind.EXITED:
        return "command exited", exit_text(artifact)
    if kind == EventKind.TREE_GONE:
        return "tree gone", "every process of the tree has exited"
    if kind in (EventKind.LEFTOVER, EventKind.ABANDONED):
        return kind, _process_text(event["process"])
    if kind in (EventKind.SAMPLER_DEGRADED, EventKind.SAMPLER_RECOVERED, EventKind.SAMPLER_NOTE):
        return kind.replace("_", " "), f"{event['sampler']}: {event['message']}"
    if kind == EventKind.WARNING:
        return "warning", str(event["message"])
    if kind == EventKind.FINISHED:
        return "finished", f"status {event['status']}"
    if kind == EventKind.FORENSICS:
        return "forensics", f"{event['processes']} process(es) recorded (see Forensics)"
    if kind == EventKind.OOM_KILL:
        return "OOM kill", f"pid {event['pid']} ({event['name']}): {event['message']}"
    if kind == EventKind.TREND:
        return f"trend: {event['verdict']}", f"{event['series']}: {event['message']}"
    if kind == EventKind.EXCEPTION:
        return "exception", f"{event['type']}: {event['message']} ({event['where']})"
    return kind.replace("_", " "), Fields({k: v for k, v in event.items() if k not in _OWN})


#: Keys every event has, shown in their own columns.
_OWN = frozenset({"t", "kind"})


def _stop_text(stop: Mapping[str, Any]) -> str:
    """``cause failure, mode group, grace 5.0s``, leaving out what was not recorded (a stop
    event, or the artifact's ``stop``, whose grace older artifacts lack)."""
    parts = [f"cause {stop['cause']}"]
    if stop["mode"] is not None:
        parts.append(f"mode {stop['mode']}")
    grace = stop.get("grace_seconds")
    if isinstance(grace, int | float):
        parts.append(f"grace {format_duration(float(grace))}")
    return ", ".join(parts)


def _process_text(process: ProcessRecord) -> str:
    cmdline = process["cmdline"]
    command = shlex.join(cmdline) if cmdline else str(process["name"])
    # How it left the group: known for a process that could be read.
    left = process.get("left_group")
    return f"pid {process['pid']} ({process['state']}): {command}" + (f"; {left}" if left else "")


def _process_table(processes: Sequence[ProcessRecord]) -> str:
    head = "<tr><th>pid</th><th>ppid</th><th>state</th><th>command</th><th>how it left</th></tr>"
    rows = []
    for p in processes:
        cmdline = p["cmdline"]
        command = shlex.join(cmdline) if cmdline else str(p["name"] or "?")
        # The parent and how it left: known for a process that could be read.
        cells = [p["pid"], p.get("ppid", ""), p["state"], command, p.get("left_group", "")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def leftovers_html(artifact: Artifact) -> str:
    leftovers = artifact["leftover_processes"]
    body = (
        _process_table(leftovers)
        if leftovers
        else '<p class="empty">None: every process of the tree ended with the command.</p>'
    )
    return f'<section id="leftovers"><h2>Leftover processes</h2>{body}</section>'


def forensics_html(artifact: Artifact) -> str:
    parts = ['<section id="forensics"><h2>Forensics</h2>']
    abandoned = abandoned_processes(artifact)
    if abandoned:
        parts.append("<h3>Processes that would not die (abandoned)</h3>")
        parts.append(_process_table(abandoned))
    kills = oom_kills(artifact)
    if kills:
        items = "".join(
            f"<li>{html.escape(oom_killer(k))}: pid {html.escape(str(k['pid']))} "
            f"({html.escape(k['name'])}): "
            f'<span class="mono">{html.escape(k["message"])}</span></li>'
            for k in kills
        )
        parts.append(f"<h3>Killed by the OOM killer</h3><ul>{items}</ul>")
    stall = stall_forensics(artifact)
    if stall is not None:
        parts.append(_stall_forensics_html(stall, artifact["exit"]["pid"]))
    monitor = artifact["monitor"]
    notes = sampler_notes(artifact)
    if notes:
        items = "".join(
            f"<li>{format_duration(float(n['t']))}: {html.escape(n['kind'])} "
            f"({html.escape(n['sampler'])}): {html.escape(n['message'])}</li>"
            for n in notes
        )
        parts.append(f"<h3>Sampler notes</h3><ul>{items}</ul>")
    stop = stop_section(artifact)
    if stop is not None and stop["cause"]:
        parts.append(
            "<p>Stop: "
            + html.escape(
                f"{_stop_text(stop)}, SIGKILL needed: {'yes' if stop['killed'] else 'no'}"
            )
            + "</p>"
        )
    # The monotonic start only serves to date kernel records; it means nothing to a reader.
    shown = {
        k: v
        for k, v in monitor.items()
        if v not in (None, {}, [], "") and k not in ("monotonic_start", "sampler_notes")
    }
    parts.append(
        "<p>Monitor: "
        + html.escape(", ".join(f"{k.replace('_', ' ')} {_plain(v)}" for k, v in shown.items()))
        + "</p>"
    )
    parts.append(_json_details("Effective configuration", artifact["config"]))
    parts.append(_json_details("Runtime snapshot (provenance)", artifact["snapshot"]))
    parts.append("</section>")
    return "\n".join(parts)


def _stall_forensics_html(forensics: ForensicsSection, main_pid: int | None = None) -> str:
    """The processes as forensics saw them: the command's own first and open, its main thread
    first; idle workers folded together; those it could not read last."""
    when = format_duration(float(forensics["t"]))
    # Forensics that failed as a whole (its ``error``) recorded no process.
    recorded = forensics.get("processes", [])
    py_spy = forensics.get("py_spy") or "not installed (pip install py-spy for Python stacks)"
    skipped = forensics.get("skipped_for_time")
    parts = [
        f"<h3>What the tree was doing at {when} ({html.escape(forensics['reason'])}), "
        "before the first signal</h3>",
        f'<p class="help">{len(recorded)} process(es); py-spy: {html.escape(str(py_spy))}'
        + (f"; {skipped} skipped for lack of time" if skipped else "")
        + "</p>",
    ]
    processes = sorted(readable_processes(forensics), key=lambda p: p["pid"] != main_pid)
    idle = [p for p in processes[1:] if _all_idle(p)]
    if len(idle) < 2:
        idle = []
    parts.append(_process_details([p for p in processes if p not in idle], open_first=True))
    parts.extend(
        f"<p>pid {html.escape(str(p['pid']))}: {html.escape(str(p['error']))}</p>"
        for p in recorded
        if "error" in p
    )
    if idle:
        # Idle workers (dataloaders waiting on their queue) say little: folded, one line.
        names = ", ".join(f"{p['pid']} {p['name']}" for p in idle[:8])
        parts.append(
            f"<details><summary>{len(idle)} idle process(es): {html.escape(names)}"
            + (" ..." if len(idle) > 8 else "")
            + "</summary>"
            + _process_details(idle, open_first=False)
            + "</details>"
        )
    return "\n".join(parts)


def _all_idle(process: ForensicsProcess) -> bool:
    """Whether py-spy saw every thread of a process idle."""
    stack = python_stack(process) or ""
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


def _process_details(processes: Sequence[ForensicsProcess], *, open_first: bool) -> str:
    parts: list[str] = []
    for i, process in enumerate(processes):
        wchan = process["wchan"]
        where = f" in <b>{html.escape(str(wchan))}</b>" if wchan not in (None, "", "0") else ""
        frame = innermost_python_frame(process)
        at = f", Python at <b>{html.escape(frame)}</b>" if frame else ""
        summary = (
            f"pid {process['pid']} {html.escape(process['name'])}"
            f": {html.escape(process['state'])}{where}, {process['num_threads']} thread(s){at}"
        )
        body = [f'<p class="mono">{html.escape(_short_command(process["cmdline"]))}</p>']
        # py-spy's dump, or why there is none (a Python process only).
        stack = python_stack(process)
        stack_error = python_stack_error(process)
        if stack:
            main, rest = _split_threads(stack)
            body.append(f"<h4>Python stack (py-spy)</h4><pre>{html.escape(main)}</pre>")
            if rest:
                body.append(
                    f"<details><summary>{rest.count('Thread ')} other thread(s)</summary>"
                    f"<pre>{html.escape(rest)}</pre></details>"
                )
        elif stack_error:
            body.append(f"<p>Python stack: {html.escape(stack_error)}</p>")
        if process["kernel_stack"]:
            body.append(
                f"<h4>Kernel stack</h4><pre>{html.escape(str(process['kernel_stack']))}</pre>"
            )
        threads = process["threads"]
        if len(threads) > 1:
            rows = "".join(
                "<tr>"
                + "".join(
                    f"<td>{html.escape(str(th[k]))}</td>" for k in ("tid", "name", "state", "wchan")
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


def log_html(artifact: Artifact) -> str:
    log = artifact["log"]
    tail = log["tail"]
    path = html.escape(str(log["path"]))
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
