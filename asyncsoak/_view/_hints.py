"""What to look at first: the sentences the summary and the report lead with, and the facts
they are made of (how the command ended, who killed it, whether a GPU was held back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._analysis import describe_gpus
from .._contract import (
    Artifact,
    EventKind,
    FailureReason,
    SoakStatus,
    exits,
    format_duration,
    schema,
)
from ._evidence import (
    gather,
    gpu_faults,
    innermost_python_frame,
    is_launcher,
    last_progress_at,
    leaking_series,
    stall_verdict,
    stall_window,
    trend_text,
)
from ._fields import format_clock, format_value
from ._sections import (
    abandoned_processes,
    config_value,
    counted_steps,
    oom_kills,
    process_role,
    sampler_notes,
    stall_forensics,
    summary_figure,
)

#: Throttle reasons that mean nothing is held back.
IDLE_THROTTLE = frozenset({"gpu_idle", "none", "not_active"})


def oom_killer(kill: schema.OomKillEntry) -> str:
    """Whose OOM killer an ``oom_kills`` entry says it was: the cgroup's when its counter saw
    the kill (and its limit, when it has one), the kernel's otherwise."""
    if "cgroup_counter" not in kill.get("detected_by", ()):
        return "The kernel's OOM killer"
    # The counter's sighting is written with its cgroup's path and limit.
    limit = kill["cgroup_memory_limit_bytes"]
    within = f" (memory limit {format_value(limit, 'bytes')})" if isinstance(limit, int) else ""
    return f"The OOM killer of cgroup {kill['cgroup_path']}{within}"


def exit_text(artifact: Artifact) -> str:
    """How the command ended, decoded: ``killed by SIGTERM (signal 15, sent by the monitor)``."""
    returncode = artifact["exit"]["returncode"]
    if returncode is None and any(
        f["reason"] == FailureReason.SPAWN_FAILED for f in artifact["failures"]
    ):
        return "never started"
    return exits.describe_exit_status(
        returncode,
        sent=exits.signals_sent(artifact) or [],
        forwarded=exits.forwarded_signals(artifact),
    )


#: What to look at first for a reason whose words need no figure of the run.
_FIXED_HINTS = {
    FailureReason.OVERDUE: "The training kept stepping but wrote nothing new matching a "
    "pattern of --expect-every in time: compare how often it saves (its save interval) with "
    "the deadline, and look in the log below for a save that failed (a full or slow disk).",
    FailureReason.MONITOR_LOST: "This artifact was rebuilt from the journal: the figures stop "
    "where the monitor died. Its reaper stops the command's tree when the monitor goes; look "
    "at the machine's logs (dmesg, the scheduler) for why the monitor was killed.",
}


def look_first(artifact: Artifact) -> list[str]:
    """Plain sentences: what happened and where to look, most important first."""
    a, hints = artifact, []
    primary = a["failures"][0]["reason"] if a["failures"] else None
    progress = a["progress"]
    if primary == FailureReason.STALE_PROGRESS:
        hints += _stall_hints(a) + _forensics_hints(a)
    elif primary == FailureReason.STARTUP_TIMEOUT:
        limit = config_value(a, "startup_timeout_seconds") or 0.0
        hints.append(
            f"No file in the progress dir {progress['dir']} changed within "
            f"{format_duration(limit)} of the start. Check that the trainer writes its metrics "
            "or checkpoints there (or use --output-is-progress if it only prints)."
        )
        hints += _stall_cpu_hints(a) + _forensics_hints(a)
    elif primary in (
        FailureReason.NONZERO_EXIT,
        FailureReason.SPAWN_FAILED,
        FailureReason.MONITOR_ERROR,
    ):
        if gather(a).traceback is None:
            hints.append("The last lines of the log, below, usually say why.")
    elif primary == FailureReason.SIGNALED:
        hints.append(f"The command was {exit_text(a)}.")
        if not oom_kills(a):
            rss = summary_figure(a, "tree", "rss_bytes", "max")
            hint = "Check the kernel log (dmesg) for the OOM killer."
            if rss is not None:
                hint = f"Peak memory of the tree was {format_value(rss, 'bytes')}: c{hint[1:]}"
            hints.append(hint)
    elif primary == FailureReason.TOO_SHORT:
        hints.append(
            f"It ran {format_duration(float(a['duration_seconds']))}, less than "
            f"min_duration_seconds={config_value(a, 'min_duration_seconds') or 0:g}: "
            "a crash early on, or a run configured to finish too soon."
        )
    elif primary == FailureReason.GPU_FAULT:
        hints += [
            f"GPU fault {format_duration(float(fault['t']))} into the run: {fault['message']}"
            for fault in gpu_faults(a)[:3]
        ]
    elif primary in _FIXED_HINTS:
        hints.append(_FIXED_HINTS[FailureReason(primary)])
    hints += [
        f"{oom_killer(kill)} killed pid {kill['pid']} ({kill['name']}): {kill['message']}"
        for kill in oom_kills(a)
    ]
    leftovers = a["leftover_processes"]
    if leftovers:
        names = ", ".join(process_name(p) for p in leftovers[:4])
        more = f" and {len(leftovers) - 4} more" if len(leftovers) > 4 else ""
        hints.append(
            f"{len(leftovers)} process(es) outlived the command and were killed: {names}{more}."
        )
    abandoned = abandoned_processes(a)
    if abandoned:
        hints.append(
            f"{len(abandoned)} process(es) would not die even after "
            "SIGKILL (often stuck in uninterruptible sleep, D): they may still be running."
        )
    held = [f"{g}: {', '.join(throttled(a, g))}" for g in sorted(a["summary"]) if throttled(a, g)]
    if held:
        hints.append("GPU clocks were held back: " + "; ".join(held) + ".")
    dropped = a["monitor"].get("dropped_samples")
    if dropped:
        hints.append(
            f"{dropped} samples were dropped (the monitor fell behind): the plots have gaps."
        )
    hints += _step_hints(progress.get("steps"))
    hints += [
        f"The {note['sampler']} sampler degraded: {note['message']}."
        for note in sampler_notes(a)
        if note["kind"] == EventKind.SAMPLER_DEGRADED
    ]
    if a["status"] == SoakStatus.PASSED:
        steps = counted_steps(a)
        gap = progress["longest_gap_seconds"] if steps is None else steps["longest_gap_seconds"]
        stale = config_value(a, "stale_progress_seconds")
        against = f" (limit {format_duration(stale)})" if stale else ""
        what = (
            f"{progress['changes']} progress changes"
            if steps is None
            else f"Step {steps['step']:,} reached"
        )
        hints.insert(0, f"{what}; the longest quiet gap was {format_duration(gap)}{against}.")
    leaks = leaking_series(a)
    # The leak's own warnings (when it became confident, its projection) are said better by
    # its hint: the final figures.
    labels = tuple(leak["label"] for leak in leaks if leak["label"])
    hints += [f"Warning: {w}" for w in a["warnings"] if not w.startswith(labels or ("\0",))]
    # A leak is what a soak exists to catch: it leads, whatever else happened (a process's
    # leak says more than the tree's, which it explains).
    if any(leak["series"].startswith("process.") for leak in leaks):
        leaks = [leak for leak in leaks if not leak["series"].startswith("tree.")]
    return [f"Memory leak: {trend_text(leak)}." for leak in leaks] + hints


def _step_hints(steps: Mapping[str, Any] | None) -> list[str]:
    """What the step sources said beside the verdict: isolated non-finite gradient norms,
    files that gave steps but never a loss."""
    hints, steps = [], steps or {}
    norms = steps.get("nonfinite_grad_norms") or 0
    if norms:
        hints.append(
            f"grad_norm was non-finite at {norms} logged step{'s' if norms > 1 else ''}, "
            "never 5 in a row (steps fp16 loss scaling skips): counted, not failed."
        )
    lossless = steps.get("sources_without_loss") or []
    if lossless:
        more = f" and {len(lossless) - 3} more" if len(lossless) > 3 else ""
        hints.append(
            f"{', '.join(lossless[:3])}{more} gave steps but never a loss, so none was "
            "checked there (--loss-key names the key a file logs its loss under)."
        )
    return hints


def _stall_hints(artifact: Artifact) -> list[str]:
    window, progress = stall_window(artifact), artifact["progress"]
    if window is None:
        return []
    # "auto": the limit the run learned, as the artifact records it.
    stale = config_value(artifact, "stale_progress_seconds")
    limit = stale or progress.get("stale_limit_seconds") or 0.0
    start, end = window
    steps = counted_steps(artifact)
    what = (
        f"nothing in {progress['dir']} changed"
        if steps is None
        else f"the step ({steps['step']:,}, from {steps['source']}) did not advance"
    )
    hints = [
        f"Progress stopped {format_duration(start)} into the run "
        f"({format_clock(last_progress_at(artifact))}): {what} "
        f"for {format_duration(limit)}, so the monitor stopped the run at "
        f"{format_duration(end)}. Look at what the trainer was doing just after "
        f"{format_duration(start)} (log tail below)."
    ]
    return hints + _stall_cpu_hints(artifact)


#: What a stalled tree's CPU says it was doing.
_TREE_WHILE_STALLED = {
    "idle": "The process tree was idle while stalled (CPU about {cpu:.0f}%): it was waiting "
    "(a deadlock, a hung collective, blocked I/O), not computing.",
    "busy": "The process tree kept busy while stalled (CPU about {cpu:.0f}%): a busy loop, "
    "or work that no longer writes to the progress dir.",
}


def _stall_cpu_hints(artifact: Artifact) -> list[str]:
    """What the tree and its GPUs were doing while stalled: the verdict the stall's headline
    gives (recorded with the failure; see ``_activity``)."""
    verdict = stall_verdict(artifact)
    if verdict is None:
        return []
    tree = _TREE_WHILE_STALLED.get(verdict.tree)
    hints = [] if tree is None else [tree.format(cpu=verdict.cpu_percent or 0.0)]
    gpus = describe_gpus(verdict.gpus)
    return hints + ([f"GPUs while stalled: {gpus}."] if gpus else [])


def _forensics_hints(artifact: Artifact) -> list[str]:
    forensics = stall_forensics(artifact)
    processes = [] if forensics is None else schema.readable_processes(forensics)
    if forensics is None or not processes:
        return []
    # The ranks first, launchers last: a launcher only waits for its ranks.
    processes.sort(key=is_launcher)
    parts = []
    for process in processes[:3]:
        role = process_role(process) or {}
        label = (
            f" (rank {role['rank']})"
            if "rank" in role
            else f" ({role['launcher']}'s launcher)"
            if "launcher" in role
            else ""
        )
        text = f"pid {process['pid']} {process['name']}{label} {process['state']}"
        if process["wchan"] not in (None, "", "0"):
            text += f" in {process['wchan']}"
        frame = innermost_python_frame(process)
        if frame:
            text += f", Python at {frame}"
        parts.append(text)
    more = f"; and {len(processes) - 3} more" if len(processes) > 3 else ""
    when = format_duration(float(forensics["t"]))
    return [
        f"What the tree was doing at {when}, before the first signal: {'; '.join(parts)}{more}. "
        "The full stacks are under Forensics."
    ]


def process_name(process: schema.ProcessRecord) -> str:
    cmdline = process["cmdline"]
    name = " ".join(cmdline) if cmdline else process["name"] or "?"
    name = name if len(name) <= 40 else name[:37] + "..."
    return f"pid {process['pid']} ({name})"


def throttled(artifact: Artifact, group: str) -> list[str]:
    """The reasons a group's GPU clocks were held back over the run (those that mean
    nothing is held back left out); none for a group without them."""
    reasons = artifact["summary"].get(group, {}).get("throttle_reasons")
    return [r for r in reasons if r not in IDLE_THROTTLE] if isinstance(reasons, list) else []
