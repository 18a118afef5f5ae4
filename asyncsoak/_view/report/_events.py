"""The page's record of what happened: the events, leftover and abandoned processes, forensics
and the log."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..._contract import Artifact, EventKind, events, exits, format_duration, schema
from ..._record import EVENTS_HEAD
from .._evidence import innermost_python_frame
from .._fields import format_value
from .._hints import exit_text, oom_killer
from .._sections import (
    abandoned_processes,
    events_dropped,
    oom_kills,
    python_stack,
    python_stack_error,
    sampler_notes,
    stall_forensics,
    stop_section,
)

#: Characters of the command shown before it is folded.
COMMAND_SHOWN = 240


def pids(pids: object) -> str:
    if not isinstance(pids, list):
        return "?"
    shown = ", ".join(str(p) for p in pids[:10])
    return shown + (f" and {len(pids) - 10} more" if len(pids) > 10 else "")


def exit_label(artifact: Artifact) -> str:
    """The exit's short mark on the timeline: ``exit: SIGTERM``, ``exit 1``."""
    status = exits.decode(artifact["exit"]["returncode"])
    if status.signal_name is not None:
        return f"exit: {status.signal_name}"
    return f"exit {status.returncode}"


def events_html(artifact: Artifact) -> str:
    kept = artifact["events"]
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
    while i < len(kept):
        if dropped and i == EVENTS_HEAD:
            rows.append(
                f'<tr class="gap"><td colspan="4">... {dropped} events not kept in the '
                "artifact (the journal has them all) ...</td></tr>"
            )
        event = kept[i]
        if event["kind"] == EventKind.PROGRESS:
            j = i
            paths: dict[str, None] = {}
            run: list[events.ProgressJson] = []
            while j < len(kept) and not (dropped and j == EVENTS_HEAD and j != i):
                progress = kept[j]
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


def _process_text(process: schema.ProcessRecord) -> str:
    cmdline = process["cmdline"]
    command = shlex.join(cmdline) if cmdline else str(process["name"])
    # How it left the group: known for a process that could be read.
    left = process.get("left_group")
    return f"pid {process['pid']} ({process['state']}): {command}" + (f"; {left}" if left else "")


def _process_table(processes: Sequence[schema.ProcessRecord]) -> str:
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


def _stall_forensics_html(forensics: schema.ForensicsSection, main_pid: int | None = None) -> str:
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
    processes = sorted(schema.readable_processes(forensics), key=lambda p: p["pid"] != main_pid)
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


def _all_idle(process: schema.ForensicsProcess) -> bool:
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


def _process_details(processes: Sequence[schema.ForensicsProcess], *, open_first: bool) -> str:
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
