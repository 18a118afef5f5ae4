"""``asyncsoak summary``: the verdict and what to look at first, on one screen.

:func:`summarize` reads an artifact into plain facts and sentences (also used by the HTML
report's header); :func:`format_summary` lays them out as text.
"""

from __future__ import annotations

import shlex
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .._analysis import TREE_MEMORY_SERIES, memory_not_judged
from .._contract import (
    Artifact,
    FailureReason,
    SoakStatus,
    format_duration,
    terminal_text,
)
from ._evidence import gather, gpu_faults
from ._fields import describe, format_clock, format_value, group_kind, group_rank
from ._hints import exit_text, look_first, process_name, throttled
from ._job_view import pod_line, scheduler_line
from ._sections import (
    abandoned_processes,
    counted_steps,
    host_probe,
    probes,
    seconds_at,
    snapshot_gpus,
    software_probe,
    summary_figure,
)
from ._status import is_pass, shown_status, status_words
from ._training import goodput_line, training_line

#: The primary reason in plain words.
REASON_TITLES: dict[FailureReason, str] = {
    FailureReason.SPAWN_FAILED: "The command could not be started",
    FailureReason.STARTUP_TIMEOUT: "The training never showed progress",
    FailureReason.STALE_PROGRESS: "The training stopped making progress",
    FailureReason.NONZERO_EXIT: "The command failed (non-zero exit status)",
    FailureReason.SIGNALED: "The command was killed by a signal",
    FailureReason.TOO_SHORT: "The command ended too early",
    FailureReason.LEFTOVER_PROCESSES: "Processes outlived the command",
    FailureReason.MONITOR_LOST: "The monitor died before the run finished",
    FailureReason.MONITOR_ERROR: "The monitor itself failed",
    FailureReason.MEMORY_LEAK: "The training leaks memory",
    FailureReason.MEMORY_BUDGET: "The training went over its memory budget",
    FailureReason.DISK_LOW: "The disk is almost full",
    FailureReason.GPU_FAULT: "A GPU the training uses reported a fault",
    FailureReason.NONFINITE_LOSS: "The loss became NaN or infinite",
    FailureReason.NO_PROGRESS: "The progress directory never existed",
    FailureReason.OVERDUE: "The training missed a deadline it keeps (--expect-every)",
}
STATUS_HEADLINES: dict[SoakStatus, str] = {
    SoakStatus.PASSED: "The soak passed",
    SoakStatus.FAILED: "The soak failed",
    SoakStatus.CANCELLED: "The soak was stopped on request",
    SoakStatus.ERROR: "The monitor failed",
}
#: The summary's height: one screen of a terminal; the log's tail is cut to keep it.
SCREEN_LINES = 60
#: The log lines shown however long the rest of the summary is.
MIN_LOG_LINES = 5


def summarize(artifact: Artifact) -> dict[str, Any]:
    """The facts someone needs first about a run, as JSON-ready data (``artifact`` checked
    against the schema: loaded through ``check_artifact`` or built by this package)."""
    a = artifact
    reasons = [
        {
            "reason": f["reason"],
            "title": REASON_TITLES[FailureReason(f["reason"])],
            "message": f["message"],
            "at": f["at"],
            "t": seconds_at(a, f["at"]),
            **({"gpu": f["gpu"]} if "gpu" in f else {}),
        }
        for f in a["failures"]
    ]
    steps = counted_steps(a)
    progress: dict[str, Any] = {
        **a["progress"],
        "last_change_t": seconds_at(a, a["progress"]["last_change_at"]),
        "first_change_t": seconds_at(a, a["progress"]["first_change_at"]),
        # The progress that counted: the step's last advance (None when files counted).
        "last_step_t": None if steps is None else seconds_at(a, steps["last_step_at"]),
    }
    evidence = gather(a)
    return {
        # What a person reads: a pass with warnings is ``passed_with_warnings`` (the
        # artifact's own status stays ``passed``; ``artifact_status`` keeps it).
        "status": shown_status(a["status"], len(a["warnings"])),
        "artifact_status": a["status"],
        "headline": headline(a, reasons),
        "evidence": evidence.as_json(),
        "reasons": reasons,
        "warnings": list(a["warnings"]),
        "started_at": a["started_at"],
        "ended_at": a["ended_at"],
        "duration_seconds": a["duration_seconds"],
        "command": list(a["command"]),
        "exit": {**a["exit"], "text": exit_text(a)},
        "progress": progress,
        "look_first": look_first(artifact),
        "peaks": peaks(artifact),
        "gpus": gpu_table(artifact),
        "gpu_faults": gpu_faults(artifact),
        "leftovers": list(a["leftover_processes"]),
        "abandoned": list(abandoned_processes(a)),
        "provenance": provenance(artifact),
        "log": {"path": a["log"]["path"], "last_lines": evidence.log_lines},
        "journal_path": a["monitor"]["journal_path"],
        "goodput": _goodput(a),
    }


def _goodput(artifact: Artifact) -> dict[str, Any] | None:
    """The run's ledger with its line (``text``); None for an artifact from before it."""
    section = artifact.get("goodput")
    return None if section is None else {"text": goodput_line(section), **section}


def headline(artifact: Artifact, reasons: list[dict[str, Any]]) -> str:
    """The verdict in plain words; a pass with warnings says how many."""
    status = SoakStatus(artifact["status"])
    if reasons:
        return str(reasons[0]["title"])
    text = STATUS_HEADLINES[status]
    warnings = len(artifact["warnings"])
    if status == SoakStatus.PASSED and warnings:
        text += f", with {warnings} warning{'s' if warnings > 1 else ''}"
    return text


#: Fields that count up from the start: their last value is a total, their mean means nothing.
CUMULATIVE_FIELDS = frozenset({"read_bytes", "write_bytes"})
#: Fields dropped from the peaks when the field named beside them is there (the same fact).
SAME_AS = {"memory_percent": "memory_used_bytes"}


def peaks(artifact: Artifact) -> list[dict[str, Any]]:
    """Process tree and machine figures: peak (or lowest, for what is free), mean, last.

    Counters (bytes read and written) are given as totals; two disk series with the same
    figures (the progress and output dirs on one filesystem) as one row.
    """
    rows: list[dict[str, Any]] = []
    trends = artifact["trends"]
    # The memory the leak check judges, when it could not judge it (too few samples).
    unjudged = memory_not_judged(trends) and next(
        (key for key, _ in TREE_MEMORY_SERIES if key in trends), None
    )
    for group, fields in sorted(artifact["summary"].items(), key=_group_order):
        if not isinstance(fields, dict) or group_kind(group) == "gpu" or group == "samples":
            continue
        seen_stats: dict[str, dict[str, Any]] = {}
        for name in sorted(fields, key=_field_order):
            stats = fields[name]
            if not isinstance(stats, dict) or "max" not in stats:
                continue
            if SAME_AS.get(name) in fields:
                continue
            if name in SHOWN_WHEN_MOVED and stats["max"] == stats["min"]:
                continue
            info = describe(group, name)
            label = f"{info.label} {info.qualifier}".strip()
            if info.qualifier:
                twin = seen_stats.get(f"{info.label}:{_stats_key(stats)}")
                if twin is not None:
                    twin["label"] += f", {info.qualifier}"
                    twin["name"] += f", {info.qualifier}"
                    continue
            lowest_matters = "free" in name or "available" in name
            key = "min" if lowest_matters else "max"
            if name in CUMULATIVE_FIELDS:
                text = f"total {format_value(stats['last'], info.unit)}"
            else:
                worst = stats[key]
                text = (
                    f"{'lowest' if lowest_matters else 'peak'} {format_value(worst, info.unit)}, "
                    f"mean {format_value(stats['mean'], info.unit, like=worst)}"
                )
            if unjudged == f"{group}.{name}":
                text += "; the leak check could not judge it (too few samples)"
            row = {
                "group": group,
                "field": name,
                "label": label,
                "name": label if group == "gpu_tree" else f"{group} {label}",
                "unit": info.unit,
                "worst": key,
                key: stats[key],
                "mean": stats["mean"],
                "last": stats["last"],
                "text": text,
            }
            rows.append(row)
            if info.qualifier:
                seen_stats[f"{info.label}:{_stats_key(stats)}"] = row
    return rows


def _stats_key(stats: Mapping[str, Any]) -> str:
    return repr(sorted(stats.items()))


def _group_order(item: tuple[str, Any]) -> tuple[int, str]:
    return (group_rank(item[0]), item[0])


#: Fields shown first among the peaks, in this order.
PEAKS_FIRST = (
    "cpu_percent",
    "rss_bytes",
    "anon_bytes",
    "processes",
    "threads",
    "memory_used_bytes",
)
#: Fields left out of the peaks while they hold still: the machine's /dev/shm says something
#: of the run only when it moved (the run wrote there, or something else did).
SHOWN_WHEN_MOVED = frozenset({"shm_used_bytes"})


def _field_order(name: str) -> tuple[int, str]:
    return (PEAKS_FIRST.index(name) if name in PEAKS_FIRST else len(PEAKS_FIRST), name)


def gpu_table(artifact: Artifact) -> list[dict[str, Any]]:
    """One row per GPU: name, utilisation, memory, power, temperature, throttle reasons."""
    summary = artifact["summary"]
    names = {g["index"]: g["name"] for g in snapshot_gpus(artifact)}
    rows = []
    for group in sorted(summary, key=lambda g: (len(g), g)):
        if group_kind(group) != "gpu" or not isinstance(summary[group], dict):
            continue

        def stat(name: str, key: str, group: str = group) -> float | None:
            return summary_figure(artifact, group, name, key)

        rows.append(
            {
                "gpu": group,
                "name": names.get(int(group[3:])),
                "utilization_mean_percent": stat("utilization_gpu_percent", "mean"),
                "utilization_max_percent": stat("utilization_gpu_percent", "max"),
                "memory_used_max_mib": stat("memory_used_mib", "max"),
                "power_max_w": stat("power_draw_w", "max"),
                "temperature_max_c": stat("temperature_gpu_c", "max"),
                "throttle_reasons": throttled(artifact, group),
            }
        )
    return rows


def provenance(artifact: Artifact) -> dict[str, str]:
    """Source revision, GPUs, driver, Python and host from the runtime snapshot."""
    out: dict[str, str] = {}
    snapshot = probes(artifact)
    source = snapshot.source
    if source is not None and "error" in source:
        if source["error"]:
            out["revision"] = f"unknown: {source['error']}"
    elif source is not None and source["revision"]:
        revision = source["revision"][:12]
        if source["branch"]:
            revision += f" ({source['branch']})"
        if source["dirty"]:
            revision += f", {source['changed_files'] or 'some'} uncommitted change(s)"
        out["revision"] = revision
    gpus = snapshot.gpus
    names = [g["name"] for g in snapshot_gpus(artifact) if g["name"]]
    if names:
        out["GPU"] = _counted(names)
    elif gpus is not None and "error" in gpus and gpus["error"]:
        out["GPU"] = f"none recorded: {gpus['error']}"
    if gpus is not None and "error" not in gpus and gpus["driver_version"]:
        driver = gpus["driver_version"]
        cuda = gpus.get("cuda_version")  # when nvidia-smi --version answered
        out["driver"] = driver + (f" (CUDA {cuda})" if cuda else "")
    python = _python_version(artifact)
    if python:
        out["Python"] = python
    host = host_probe(artifact)
    if host is not None and host["hostname"]:
        out["host"] = host["hostname"]
    job = scheduler_line(artifact)
    if job:
        out["slurm job"] = job
    pod = pod_line(artifact)
    if pod:
        out["pod"] = pod
    if snapshot.error:
        out["snapshot"] = snapshot.error
    return out


def _python_version(artifact: Artifact) -> str | None:
    """The command's Python: its own interpreter's when it ran another one than the
    monitor's (and that one answered), else the monitor's."""
    software = software_probe(artifact)
    if software is None:
        return None
    command_python = software.get("command_python")  # another interpreter than the monitor's
    if command_python is not None and "error" not in command_python and command_python["version"]:
        return command_python["version"]
    return software["python"]["version"]


def _counted(names: Iterable[str]) -> str:
    counts = Counter(names)
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in counts.items())


# -- text ------------------------------------------------------------------------------------


def format_summary(
    summary: Mapping[str, Any], *, artifact_path: str | None = None, width: int = 100
) -> str:
    """The summary as about one screen of plain text, sentences wrapped at ``width``, safe
    to print (control characters from the run spelled out)."""
    lines: list[str] = []
    lines.append(f"{status_words(str(summary['status']))}: {summary['headline']}")
    for i, reason in enumerate(summary["reasons"]):
        at = f" at {format_duration(reason['t'])}" if reason["t"] is not None else ""
        lead = "  " if i == 0 else "  also "
        lines.append(f"{lead}{reason['reason']}{at}: {reason['message']}")
    lines.extend(evidence_lines(summary, width))
    training = summary_training(summary)
    if training:
        lines.append(f"  training: {training}")
    if summary.get("goodput"):
        lines.append(f"  {summary['goodput']['text']}")
    lines.append(
        f"ran {format_duration(float(summary['duration_seconds']))}, "
        f"{format_clock(summary['started_at'])} to {format_clock(summary['ended_at'])}; "
        f"{summary['exit']['text']}"
    )
    lines.append("command: " + _shorten(shlex.join(summary["command"]).replace("\n", " "), 200))
    lines.append(f"progress: {progress_text(summary['progress'])}")
    if summary["provenance"]:
        lines.append("; ".join(f"{k}: {v}" for k, v in summary["provenance"].items()))
    if summary["look_first"]:
        lines.append("")
        lines.append("Look first:")
        for hint in summary["look_first"]:
            lines.extend(
                textwrap.wrap(
                    hint,
                    width,
                    initial_indent="  - ",
                    subsequent_indent="    ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
    if summary["peaks"]:
        lines.append("")
        lines.append("Peaks:")
        width = max(len(p["name"]) for p in summary["peaks"])
        for p in summary["peaks"]:
            lines.append(f"  {p['name'].ljust(width)}  {p['text']}")
    if summary["gpus"]:
        lines.append("")
        lines.append(_gpu_lines(summary["gpus"]))
    if summary["leftovers"]:
        lines.append("")
        lines.append("Leftover processes (killed):")
        for p in summary["leftovers"][:8]:
            lines.append(f"  {process_name(p)} state {p['state']}")
    log = summary["log"]
    if log["last_lines"]:
        # The log's tail gives way first when the rest is long: the summary is one screen
        # (SCREEN_LINES), and the newest lines are the ones that explain the end.
        closing = 2 if artifact_path else 0
        # Some entries hold several lines (the GPU table): count what will be printed.
        used = sum(entry.count("\n") + 1 for entry in lines)
        room = SCREEN_LINES - used - 2 - closing
        tail = log["last_lines"][-max(room, MIN_LOG_LINES) :]
        lines.append("")
        lines.append(f"Last log lines ({log['path']}):")
        lines.extend("  " + _shorten(line, 160) for line in tail)
    if artifact_path:
        lines.append("")
        lines.append(f"Plots: asyncsoak report {artifact_path}")
    return terminal_text("\n".join(lines), one_line=False)


def progress_text(progress: Mapping[str, Any], limit: str = "") -> str:
    """A summary's progress: the step's last advance and longest gap when the steps counted,
    then the file growth; else the file changes (``limit`` goes after the longest gap)."""
    steps, last = progress.get("steps"), progress["last_change_t"]
    files = f"{progress['changes']} changes in {progress['dir']}" + (
        f", last at {format_duration(last)}" if last is not None else ", none seen"
    )
    if progress.get("last_step_t") is None or not steps:
        gap = format_duration(float(progress["longest_gap_seconds"]))
        return f"{files}, longest gap {gap}{limit}"
    gap = format_duration(float(steps["longest_gap_seconds"]))
    return (
        f"step {steps['step']:,} in {steps['source']}, last advanced at "
        f"{format_duration(progress['last_step_t'])}, longest gap {gap}{limit}; "
        f"file growth: {files}"
    )


def summary_training(summary: Mapping[str, Any]) -> str:
    """A summary's training line: empty when the run wrote no steps (or its artifact was
    written before steps were read)."""
    return training_line(summary["progress"].get("steps"))


def evidence_lines(summary: Mapping[str, Any], width: int = 100) -> list[str]:
    """The cause, its source line, the last progress and the next steps: the first screen."""
    evidence = summary["evidence"]
    lines: list[str] = []

    def add(label: str, text: str) -> None:
        lines.extend(
            textwrap.wrap(
                text,
                max(width, 40),
                initial_indent=f"  {label}: ",
                subsequent_indent="    ",
                break_long_words=False,  # a path wider than the line stays whole
                break_on_hyphens=False,
            )
        )

    if evidence["cause"]:
        where = evidence["where"]
        cause = evidence["cause"]
        add(
            "warning" if is_pass(summary["status"]) else "cause",
            cause + (f" ({where})" if where and where not in cause else ""),
        )
        if evidence["source_line"]:
            lines.append(f"    > {_shorten(evidence['source_line'], max(width, 40) - 6)}")
    last = evidence["last_progress"]
    if last is not None:
        files = ", ".join(last["paths"][:3]) + (", ..." if len(last["paths"]) > 3 else "")
        end = "the failure" if summary["reasons"] else "the end"
        add(
            "last progress",
            f"{format_duration(last['t'])}, {format_duration(last['before_end'])} before {end}"
            + (f": {files}" if files else ""),
        )
    for step in evidence["next_steps"]:
        add("next", step)
    return lines


def _gpu_lines(gpus: list[dict[str, Any]]) -> str:
    header = ("GPU", "name", "util mean/max", "memory max", "power max", "temp max", "throttled")
    rows = [header]
    for g in gpus:
        rows.append(
            (
                g["gpu"],
                str(g["name"] or "n/a"),
                f"{format_value(g['utilization_mean_percent'], '%')}/"
                f"{format_value(g['utilization_max_percent'], '%')}",
                format_value(g["memory_used_max_mib"], "MiB"),
                format_value(g["power_max_w"], "W"),
                format_value(g["temperature_max_c"], "°C"),
                ", ".join(g["throttle_reasons"]) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
