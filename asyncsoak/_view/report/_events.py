"""The page's record of what happened: the events, leftover and abandoned processes, forensics
and the log."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

from ..._contract import Artifact, EventKind, exits, format_duration, schema
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
    wall_clock,
)
from ._assets import head_row, table_row

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
    dropped = events_dropped(artifact)
    rows: list[str] = []

    def row(kind: str, t: float, what: str, cell: str) -> None:
        wall = wall_clock(artifact, t, "%H:%M:%S.%f")[:-3]
        rows.append(
            f'<tr class="{html.escape(kind)}"><td>{format_duration(t)}</td>'
            f"<td>{wall}</td><td>{html.escape(what)}</td><td>{cell}</td></tr>"
        )

    # Progress events in a row are one line; the events the artifact dropped split them.
    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[bool, bool]:
        return item[1]["kind"] == EventKind.PROGRESS, bool(dropped) and item[0] >= EVENTS_HEAD

    for (is_progress, _), group in groupby(enumerate(artifact["events"]), key):
        indexed = list(group)
        run: list[Mapping[str, Any]] = [event for _, event in indexed]
        if dropped and indexed[0][0] == EVENTS_HEAD:
            rows.append(
                f'<tr class="gap"><td colspan="4">... {dropped} events not kept in the '
                "artifact (the journal has them all) ...</td></tr>"
            )
        if not is_progress:
            for event in run:
                row(event["kind"], float(event["t"]), *_event_text(artifact, event))
            continue
        paths = dict.fromkeys(p for e in run for p in e.get("paths") or [])
        names = ", ".join(str(p) for p in list(paths)[:5]) + (", ..." if len(paths) > 5 else "")
        if len(run) == 1:
            row("progress", float(run[0]["t"]), "progress", html.escape(names))
        else:
            # The header counts changed files; say both so the figures agree.
            changed = sum(int(e["changed"]) for e in run)
            until = format_duration(float(run[-1]["t"]))
            text = f"{changed} changes until {until}: {names}"
            row("progress", float(run[0]["t"]), f"progress x{len(run)}", html.escape(text))
    if not rows:
        return ""
    head = head_row("since start", "time (UTC)", "event", "details")
    return (
        f'<section id="events"><h2>Events</h2><div class="scroll"><table>{head}{"".join(rows)}'
        "</table></div></section>"
    )


#: An event's fields shown at most, and items of a list.
FIELDS_SHOWN = 16
LIST_ITEMS = 5


def _fields_html(values: Mapping[str, Any]) -> str:
    """An event's other keys as named fields (sizes, durations and nested keys read for
    people), never as JSON."""
    items = list(_flat_fields(values))
    cells = "".join(
        f'<span class="field"><span class="name">{html.escape(name)}</span> '
        f"{html.escape(value)}</span>"
        for name, value in items[:FIELDS_SHOWN]
    )
    more = len(items) - FIELDS_SHOWN
    return f'<span class="fields">{cells}</span>' + (f" (+{more} more)" if more > 0 else "")


def _flat_fields(
    values: Mapping[str, Any], prefix: str = "", outer: str = ""
) -> Iterator[tuple[str, str]]:
    """(name, text) of every set value; a nested object's keys as ``outer inner``, read in
    the outer key's unit (``disk_total_bytes: {progress: N}``)."""
    for key, value in values.items():
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, Mapping):
            yield from _flat_fields(value, f"{prefix}{key} ", str(key))
        else:
            yield f"{prefix}{key}".replace("_", " "), _field_text(outer or str(key), value)


def _field_text(key: str, value: Any) -> str:
    if isinstance(value, list):
        items = [_field_text(key, v) for v in value[:LIST_ITEMS]]
        return ", ".join(items) + (", ..." if len(value) > LIST_ITEMS else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key.endswith("_bytes"):
        return format_value(float(value), "bytes")
    if key.endswith("_seconds"):
        return format_duration(float(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


#: An event's name and details, by kind, from its fields (``pids`` as :func:`pids` says them).
EVENT_TEXT = {
    EventKind.STARTED: ("started", "pid {pid} (reaper {reaper_pid})"),
    EventKind.FAILURE: ("failure: {reason}", "{message}"),
    EventKind.SIGNAL: ("{signal} sent", "to the {target}: pids {pids}"),
    EventKind.TREE_GONE: ("tree gone", "every process of the tree has exited"),
    EventKind.SAMPLER_DEGRADED: ("sampler degraded", "{sampler}: {message}"),
    EventKind.SAMPLER_RECOVERED: ("sampler recovered", "{sampler}: {message}"),
    EventKind.SAMPLER_NOTE: ("sampler note", "{sampler}: {message}"),
    EventKind.WARNING: ("warning", "{message}"),
    EventKind.FINISHED: ("finished", "status {status}"),
    EventKind.FORENSICS: ("forensics", "{processes} process(es) recorded (see Forensics)"),
    EventKind.OOM_KILL: ("OOM kill", "pid {pid} ({name}): {message}"),
    EventKind.TREND: ("trend: {verdict}", "{series}: {message}"),
    EventKind.EXCEPTION: ("exception", "{type}: {message} ({where})"),
}


def _event_text(artifact: Artifact, event: Mapping[str, Any]) -> tuple[str, str]:
    """An event's name and details (HTML); an unknown kind's fields are shown as they are."""
    kind = str(event["kind"])
    if kind in EVENT_TEXT:
        what, detail = EVENT_TEXT[EventKind(kind)]
        fields = {**event, "pids": pids(event.get("pids"))}
        return what.format_map(event), html.escape(detail.format_map(fields))
    if kind == EventKind.STOP:
        return "stop", html.escape(_stop_text(event))
    if kind == EventKind.EXITED:
        return "command exited", html.escape(exit_text(artifact))
    if kind in (EventKind.LEFTOVER, EventKind.ABANDONED):
        return kind, html.escape(_process_text(event["process"]))
    return kind.replace("_", " "), _fields_html({k: v for k, v in event.items() if k not in _OWN})


#: Keys every event has, shown in their own columns.
_OWN = frozenset({"t", "kind"})


def _stop_text(stop: Mapping[str, Any]) -> str:
    """``cause failure, mode group, grace 5.0s``, leaving out what was not recorded (a stop
    event, or the artifact's ``stop``, whose grace older artifacts lack)."""
    grace = stop.get("grace_seconds")
    return ", ".join(
        [f"cause {stop['cause']}"]
        + ([f"mode {stop['mode']}"] if stop["mode"] is not None else [])
        + ([f"grace {format_duration(float(grace))}"] if isinstance(grace, int | float) else [])
    )


def _process_text(process: schema.ProcessRecord) -> str:
    # How it left the group: known for a process that could be read.
    left = process.get("left_group")
    command = shlex.join(process["cmdline"]) if process["cmdline"] else str(process["name"])
    return f"pid {process['pid']} ({process['state']}): {command}" + (f"; {left}" if left else "")


def _process_table(processes: Sequence[schema.ProcessRecord]) -> str:
    head = head_row("pid", "ppid", "state", "command", "how it left")
    # The parent and how it left: known for a process that could be read.
    rows = "".join(
        table_row((p["pid"], p.get("ppid", ""), p["state"], _command(p), p.get("left_group", "")))
        for p in processes
    )
    return f"<table>{head}{rows}</table>"


def _command(process: schema.ProcessRecord) -> str:
    cmdline = process["cmdline"]
    return shlex.join(cmdline) if cmdline else str(process["name"] or "?")


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
        parts += ["<h3>Processes that would not die (abandoned)</h3>", _process_table(abandoned)]
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
        killed = "yes" if stop["killed"] else "no"
        parts.append(f"<p>Stop: {html.escape(f'{_stop_text(stop)}, SIGKILL needed: {killed}')}</p>")
    # The monotonic start only serves to date kernel records; it means nothing to a reader.
    shown = {
        k: v
        for k, v in artifact["monitor"].items()
        if v not in (None, {}, [], "") and k not in ("monotonic_start", "sampler_notes")
    }
    said = ", ".join(f"{k.replace('_', ' ')} {_plain(v)}" for k, v in shown.items())
    parts += [
        f"<p>Monitor: {html.escape(said)}</p>",
        _json_details("Effective configuration", artifact["config"]),
        _json_details("Runtime snapshot (provenance)", artifact["snapshot"]),
        "</section>",
    ]
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
        more = " ..." if len(idle) > 8 else ""
        summary = f"{len(idle)} idle process(es): {html.escape(names)}{more}"
        parts.append(_details(summary, _process_details(idle, open_first=False)))
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
        stack, stack_error = python_stack(process), python_stack_error(process)
        if stack:
            main, rest = _split_threads(stack)
            body.append(f"<h4>Python stack (py-spy)</h4><pre>{html.escape(main)}</pre>")
            if rest:
                others = f"{rest.count('Thread ')} other thread(s)"
                body.append(_details(others, f"<pre>{html.escape(rest)}</pre>"))
        elif stack_error:
            body.append(f"<p>Python stack: {html.escape(stack_error)}</p>")
        kernel = process["kernel_stack"]
        if kernel:
            body.append(f"<h4>Kernel stack</h4><pre>{html.escape(str(kernel))}</pre>")
        threads = process["threads"]
        if len(threads) > 1:
            head = head_row("tid", "name", "state", "waiting in")
            rows = "".join(
                table_row(th[k] for k in ("tid", "name", "state", "wchan")) for th in threads
            )
            body.append(f"<h4>Threads</h4><table>{head}{rows}</table>")
        parts.append(_details(summary, "".join(body), opened=i == 0 and open_first))
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
    return _details(html.escape(title), f"<pre>{html.escape(text)}</pre>")


def _details(summary: str, body: str, *, opened: bool = False) -> str:
    return f"<details{' open' if opened else ''}><summary>{summary}</summary>{body}</details>"


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
