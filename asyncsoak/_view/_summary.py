"""``asyncsoak summary``: the verdict and what to look at first, on one screen; the facts of
:func:`summarize` also head the HTML report."""

from __future__ import annotations

import shlex
import textwrap
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .._analysis import TREE_MEMORY_SERIES, memory_not_judged
from .._contract import Artifact, FailureReason, SoakStatus, format_duration, terminal_text
from ._evidence import gather, gpu_faults
from ._fields import (
    describe,
    format_clock,
    format_table,
    format_value,
    group_kind,
    group_rank,
    merge_twins,
)
from ._hints import exit_text, look_first, process_name, throttled
from ._job_view import pod_line, scheduler_line
from ._sections import (
    abandoned_processes,
    counted_steps,
    found_probe,
    host_probe,
    seconds_at,
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
    warnings = len(a["warnings"])
    headline = str(reasons[0]["title"]) if reasons else STATUS_HEADLINES[SoakStatus(a["status"])]
    if not reasons and a["status"] == SoakStatus.PASSED and warnings:
        headline += f", with {warnings} warning{'s' if warnings > 1 else ''}"
    goodput = a.get("goodput")  # None in an artifact from before the ledger
    return {
        # ``passed_with_warnings`` for a pass with warnings; ``artifact_status`` keeps ``passed``.
        "status": shown_status(a["status"], warnings),
        "artifact_status": a["status"],
        "headline": headline,
        "evidence": asdict(evidence),
        "reasons": reasons,
        "warnings": list(a["warnings"]),
        "started_at": a["started_at"],
        "ended_at": a["ended_at"],
        "duration_seconds": a["duration_seconds"],
        "command": list(a["command"]),
        "exit": {**a["exit"], "text": exit_text(a)},
        "progress": progress,
        "look_first": look_first(a),
        "peaks": peaks(a),
        "gpus": gpu_table(a),
        "gpu_faults": gpu_faults(a),
        "leftovers": list(a["leftover_processes"]),
        "abandoned": list(abandoned_processes(a)),
        "provenance": provenance(a),
        "log": {"path": a["log"]["path"], "last_lines": evidence.log_lines},
        "journal_path": a["monitor"]["journal_path"],
        "goodput": None if goodput is None else {"text": goodput_line(goodput), **goodput},
    }


#: Fields that count up from the start: their last value is a total, their mean means nothing.
CUMULATIVE_FIELDS = frozenset({"read_bytes", "write_bytes"})
#: Fields dropped from the peaks when the field named beside them is there (the same fact).
SAME_AS = {"memory_percent": "memory_used_bytes"}
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


def peaks(artifact: Artifact) -> list[dict[str, Any]]:
    """Process tree and machine figures: peak (lowest, for what is free), mean, last; counters
    as totals; two disk series with the same figures (one filesystem) as one row."""
    rows: list[dict[str, Any]] = []
    trends = artifact["trends"]
    # The memory the leak check judges, when it could not judge it (too few samples).
    unjudged = memory_not_judged(trends) and next(
        (key for key, _ in TREE_MEMORY_SERIES if key in trends), None
    )
    summary = artifact["summary"]
    for group in sorted(summary, key=lambda group: (group_rank(group), group)):
        fields = summary[group]
        if not isinstance(fields, dict) or group_kind(group) == "gpu" or group == "samples":
            continue
        order = sorted(fields, key=lambda n: (PEAKS_FIRST.index(n) if n in PEAKS_FIRST else 9, n))
        shown = [
            (describe(group, name), repr(sorted(fields[name].items())))
            for name in order
            if isinstance(fields[name], dict)
            and "max" in fields[name]
            and SAME_AS.get(name) not in fields
            and not (name in SHOWN_WHEN_MOVED and fields[name]["max"] == fields[name]["min"])
        ]
        for info in merge_twins(shown):
            stats, name = fields[info.name], info.name
            lowest_matters = "free" in name or "available" in name
            key = "min" if lowest_matters else "max"
            if name in CUMULATIVE_FIELDS:
                text = f"total {format_value(stats['last'], info.unit)}"
            else:
                worst = format_value(stats[key], info.unit)
                mean = format_value(stats["mean"], info.unit, like=stats[key])
                text = f"{'lowest' if lowest_matters else 'peak'} {worst}, mean {mean}"
            if unjudged == f"{group}.{name}":
                text += "; the leak check could not judge it (too few samples)"
            label = f"{info.label} {info.qualifier}".strip()
            rows.append(
                {
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
            )
    return rows


def gpu_table(artifact: Artifact) -> list[dict[str, Any]]:
    """One row per GPU: name, utilisation, memory, power, temperature, throttle reasons."""
    summary = artifact["summary"]
    names = {g["index"]: g["name"] for g in _snapshot_gpus(artifact)}
    return [
        {
            "gpu": group,
            "name": names.get(int(group[3:])),
            **{key: summary_figure(artifact, group, name, stat) for key, name, stat in GPU_FIGURES},
            "throttle_reasons": throttled(artifact, group),
        }
        for group in sorted(summary, key=lambda g: (len(g), g))
        if group_kind(group) == "gpu" and isinstance(summary[group], dict)
    ]


#: A GPU's figures in the summary: (key, field, statistic).
GPU_FIGURES = (
    ("utilization_mean_percent", "utilization_gpu_percent", "mean"),
    ("utilization_max_percent", "utilization_gpu_percent", "max"),
    ("memory_used_max_mib", "memory_used_mib", "max"),
    ("power_max_w", "power_draw_w", "max"),
    ("temperature_max_c", "temperature_gpu_c", "max"),
)


def _snapshot_gpus(artifact: Artifact) -> list[dict[str, Any]]:
    probe = found_probe(artifact, "gpus")
    return [] if probe is None else list(probe["gpus"])


def provenance(artifact: Artifact) -> dict[str, str]:
    """Source revision, GPUs, driver, Python and host from the runtime snapshot."""
    out: dict[str, str] = {}
    snapshot = artifact["snapshot"]
    source, gpus = snapshot.get("source"), snapshot.get("gpus")
    if source is not None and "error" in source:
        if source["error"]:
            out["revision"] = f"unknown: {source['error']}"
    elif source is not None and source["revision"]:
        out["revision"] = source["revision"][:12]
        if source["branch"]:
            out["revision"] += f" ({source['branch']})"
        if source["dirty"]:
            out["revision"] += f", {source['changed_files'] or 'some'} uncommitted change(s)"
    names = Counter(g["name"] for g in _snapshot_gpus(artifact) if g["name"])
    if names:
        out["GPU"] = ", ".join(f"{n} x {name}" if n > 1 else name for name, n in names.items())
    elif gpus is not None and "error" in gpus and gpus["error"]:
        out["GPU"] = f"none recorded: {gpus['error']}"
    if gpus is not None and "error" not in gpus and gpus["driver_version"]:
        cuda = gpus.get("cuda_version")  # when nvidia-smi --version answered
        out["driver"] = gpus["driver_version"] + (f" (CUDA {cuda})" if cuda else "")
    host = host_probe(artifact)
    found = {
        "Python": _python_version(artifact),
        "host": host["hostname"] if host is not None else None,
        "slurm job": scheduler_line(artifact),
        "pod": pod_line(artifact),
        "snapshot": snapshot.get("error"),
    }
    return out | {key: value for key, value in found.items() if value}


def _python_version(artifact: Artifact) -> str | None:
    """The command's Python: its own interpreter's when it ran another one than the
    monitor's (and that one answered), else the monitor's."""
    software = found_probe(artifact, "software")
    if software is None:
        return None
    command_python = software.get("command_python")  # another interpreter than the monitor's
    if command_python is not None and "error" not in command_python and command_python["version"]:
        return str(command_python["version"])
    return str(software["python"]["version"])


def format_summary(
    summary: Mapping[str, Any], *, artifact_path: str | None = None, width: int = 100
) -> str:
    """The summary as about one screen of plain text, sentences wrapped at ``width``, safe
    to print (control characters from the run spelled out)."""
    lines = [f"{status_words(str(summary['status']))}: {summary['headline']}"]
    for i, reason in enumerate(summary["reasons"]):
        at = f" at {format_duration(reason['t'])}" if reason["t"] is not None else ""
        lines.append(f"{'  ' if i == 0 else '  also '}{reason['reason']}{at}: {reason['message']}")
    lines.extend(evidence_lines(summary, width))
    training = training_line(summary["progress"].get("steps"))
    if training:
        lines.append(f"  training: {training}")
    if summary.get("goodput"):
        lines.append(f"  {summary['goodput']['text']}")
    lines += [
        f"ran {format_duration(float(summary['duration_seconds']))}, "
        f"{format_clock(summary['started_at'])} to {format_clock(summary['ended_at'])}; "
        f"{summary['exit']['text']}",
        "command: " + _shorten(shlex.join(summary["command"]).replace("\n", " "), 200),
        f"progress: {progress_text(summary['progress'])}",
    ]
    if summary["provenance"]:
        lines.append("; ".join(f"{k}: {v}" for k, v in summary["provenance"].items()))
    if summary["look_first"]:
        lines += ["", "Look first:"]
        for hint in summary["look_first"]:
            lines.extend(_wrap(hint, width, "  - "))
    if summary["peaks"]:
        pad = max(len(p["name"]) for p in summary["peaks"])
        lines += [
            "",
            "Peaks:",
            *(f"  {p['name'].ljust(pad)}  {p['text']}" for p in summary["peaks"]),
        ]
    if summary["gpus"]:
        lines += ["", *_gpu_lines(summary["gpus"])]
    if summary["leftovers"]:
        lines += ["", "Leftover processes (killed):"]
        lines.extend(f"  {process_name(p)} state {p['state']}" for p in summary["leftovers"][:8])
    log = summary["log"]
    if log["last_lines"]:
        # The log's tail gives way first: the summary is one screen, and the newest lines
        # are the ones that explain the end (an entry may hold several lines).
        used = sum(entry.count("\n") + 1 for entry in lines)
        room = SCREEN_LINES - used - 2 - (2 if artifact_path else 0)
        lines += ["", f"Last log lines ({log['path']}):"]
        lines.extend("  " + _shorten(line, 160) for line in log["last_lines"][-max(room, 5) :])
    if artifact_path:
        lines += ["", f"Plots: asyncsoak report {artifact_path}"]
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


def evidence_lines(summary: Mapping[str, Any], width: int = 100) -> list[str]:
    """The cause, its source line, the last progress and the next steps: the first screen."""
    evidence, width = summary["evidence"], max(width, 40)
    lines: list[str] = []
    cause, where = evidence["cause"], evidence["where"]
    if cause:
        label = "warning" if is_pass(summary["status"]) else "cause"
        lines += _wrap(
            cause + (f" ({where})" if where and where not in cause else ""), width, label
        )
        if evidence["source_line"]:
            lines.append(f"    > {_shorten(evidence['source_line'], width - 6)}")
    last = evidence["last_progress"]
    if last is not None:
        files = ", ".join(last["paths"][:3]) + (", ..." if len(last["paths"]) > 3 else "")
        end = "the failure" if summary["reasons"] else "the end"
        text = f"{format_duration(last['t'])}, {format_duration(last['before_end'])} before {end}"
        lines += _wrap(text + (f": {files}" if files else ""), width, "last progress")
    for step in evidence["next_steps"]:
        lines += _wrap(step, width, "next")
    return lines


def _wrap(text: str, width: int, label: str) -> list[str]:
    """``text`` wrapped under its label (a list item's ``  - ``); a path wider than the line
    stays whole."""
    lead = label if label.startswith(" ") else f"  {label}: "
    return textwrap.wrap(
        text,
        width,
        initial_indent=lead,
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _gpu_lines(gpus: list[dict[str, Any]]) -> list[str]:
    rows = [("GPU", "name", "util mean/max", "memory max", "power max", "temp max", "throttled")]
    rows += [
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
        for g in gpus
    ]
    return format_table(rows, "  ")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
