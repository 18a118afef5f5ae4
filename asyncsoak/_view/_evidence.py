"""What decides a run, gathered once for the summary, the report and ``compare``: the cause in
one line with where it is, the last progress, a next step per reason, and the log's end with
its traceback marked."""

from __future__ import annotations

import linecache
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from .._analysis import GpuActivity, median, recorded_gpus, tree_verdict
from .._contract import Artifact, EventKind, FailureReason, exits, format_duration, schema
from ._fields import format_bytes, format_value, gpu_index
from ._sections import (
    config_value,
    counted_steps,
    event_times,
    oom_kills,
    process_role,
    python_stack,
    seconds_at,
    series_group,
    stall_forensics,
    stall_ranks,
    trend_verdicts,
)
from ._status import named_warning

#: Log lines shown at most (a traceback longer than this keeps its end).
LOG_LINES = 14
#: Names that make a changed path a checkpoint to resume from.
CHECKPOINT_WORDS = ("checkpoint", "ckpt")
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".pkl")
#: The reasons of a stall, and those under which a leak is the cause.
STALLS = (FailureReason.STALE_PROGRESS, FailureReason.STARTUP_TIMEOUT)
LEAK_REASONS = (None, FailureReason.MEMORY_LEAK, FailureReason.MEMORY_BUDGET)
_COMMAND_ENDS = (EventKind.FAILURE, EventKind.EXITED)

_TRACEBACK = "Traceback (most recent call last):"
_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^()]+):(?P<line>\d+)\)$")
#: The next step of a reason that needs no figure of the run.
_FIXED_STEPS = {
    FailureReason.NONFINITE_LOSS: "Resume from a checkpoint before the loss went bad with a "
    "lower learning rate, gradient clipping or a loss scale, and check the batch at that "
    "step; --loss-check warn lets such a run go on.",
    FailureReason.TOO_SHORT: "Read the log's end below: the command ended before "
    "min_duration_seconds.",
    FailureReason.LEFTOVER_PROCESSES: "Make the trainer wait for (join) the processes it "
    "starts before it exits.",
}


class Leak(schema.Trend):
    """A ``trends`` entry judged a leak, with its key in ``trends`` (``process.4242.rss_bytes``)."""

    series: str


@dataclass(frozen=True, slots=True)
class LastProgress:
    """The last progress change: when, which files, how long before the end, and the newest
    checkpoint among the changed files (absolute when the progress dir is known)."""

    t: float
    paths: list[str]
    before_end: float
    checkpoint: str | None


@dataclass(frozen=True, slots=True)
class Evidence:
    """The facts that decide a run, in the order a person reads them."""

    #: The cause in one line (None for a clean pass), where (``trainer.py:17 in train_step``)
    #: and that source line, when known.
    cause: str | None
    where: str | None
    source_line: str | None
    last_progress: LastProgress | None
    next_steps: list[str]
    #: The end of the log; ``traceback`` is the (start, end) slice of it that is a traceback.
    log_lines: list[str]
    traceback: tuple[int, int] | None
    #: The ``trends`` entries judged leaks, the worst first.
    leaks: list[Leak]


def gather(artifact: Artifact) -> Evidence:
    failures = artifact["failures"]
    primary = failures[0]["reason"] if failures else None
    log_lines, traceback = log_end(artifact["log"]["tail"])
    leaks = leaking_series(artifact)
    last = last_progress(artifact)
    cause, where, source = _cause(artifact, primary, leaks, log_lines, traceback)
    steps = _next_steps(artifact, primary, where, last, leaks)
    return Evidence(cause, where, source, last, steps, log_lines, traceback, leaks)


def last_progress_at(artifact: Artifact) -> str | None:
    """When the progress that counted was last seen: the step's last advance, or file change."""
    steps = counted_steps(artifact)
    return artifact["progress"]["last_change_at"] if steps is None else steps["last_step_at"]


def stall_window(artifact: Artifact) -> tuple[float, float] | None:
    """Where the run made no progress before a liveness rule fired: ``(start, end)`` seconds."""
    reasons = [f["reason"] for f in artifact["failures"]]
    failure_times = event_times(artifact, EventKind.FAILURE)
    end = failure_times[0] if failure_times else float(artifact["duration_seconds"])
    if FailureReason.STALE_PROGRESS in reasons:
        last = seconds_at(artifact, last_progress_at(artifact))
        return (last, end) if last is not None else None
    return (0.0, end) if FailureReason.STARTUP_TIMEOUT in reasons else None


def series_typical(
    artifact: Artifact, group: str, name: str, start: float, end: float
) -> float | None:
    """The median of a series field between two times (the first sample of a stall still
    carries the work before it: it would drag a short window's mean up)."""
    series = series_group(artifact, group)
    if series is None or name not in series:
        return None
    values = [
        v
        for t, v in zip(schema.series_times(series), series[name], strict=False)
        if start <= t <= end and v is not None
    ]
    return median(values) if values else None


def gpu_faults(artifact: Artifact) -> list[dict[str, Any]]:
    """Every GPU fault of the run, those that failed it first, with its GPU's identity."""
    found = [
        {**fault, "gpu": health["index"], "uuid": health["uuid"], "bus_id": health["bus_id"]}
        for health in artifact.get("gpu_health", {}).values()
        for fault in health["faults"]
    ]
    return sorted(found, key=lambda f: (not (f["fails"] and f["used"]), f["t"]))


@dataclass(frozen=True, slots=True)
class StallVerdict:
    """What the tree (``busy``, ``idle``, ``uninterruptible``, ``unknown``) and its GPUs did
    over a stall: as recorded with the failure, else the same rule over the window's series."""

    tree: str
    cpu_percent: float | None
    gpus: list[GpuActivity]


def stall_verdict(artifact: Artifact) -> StallVerdict | None:
    """The stall's verdict; None when the run did not stall."""
    window = stall_window(artifact)
    gpus = [] if window is None else stall_gpus(artifact, *window)
    for failure in artifact["failures"]:
        recorded = failure.get("activity")
        if isinstance(recorded, dict):
            # A monitor without GPU data records none; an artifact given GPU series since
            # (merged from another source) still says what they show.
            cpu = recorded.get("cpu_percent")
            return StallVerdict(str(recorded["tree"]), cpu, recorded_gpus(recorded) or gpus)
    if window is None:
        return None
    cpu = series_typical(artifact, "tree", "cpu_percent", *window)
    return StallVerdict(tree_verdict(cpu), cpu, gpus)


def stall_gpus(artifact: Artifact, start: float, end: float) -> list[GpuActivity]:
    """Each GPU's typical utilisation and power over a stall (the tree's GPUs when known)."""
    indexed = sorted((i, g) for g in artifact["series"] if (i := gpu_index(g)) is not None)
    fields = ("utilization_gpu_percent", "power_draw_w", "power_limit_w")
    return [
        GpuActivity(i, *(series_typical(artifact, g, name, start, end) for name in fields))
        for i, g in indexed
    ]


def is_launcher(process: schema.ForensicsProcess) -> bool:
    """Whether a process of the forensics is a distributed run's launcher (torchrun...)."""
    role = process_role(process)
    return isinstance(role, Mapping) and "launcher" in role


def innermost_python_frame(process: schema.ForensicsProcess) -> str | None:
    """The innermost frame of the first thread in a py-spy dump (``func (file:line)``)."""
    lines = (python_stack(process) or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Thread ")), len(lines))
    frames = (line.strip() for line in lines[start + 1 :] if not line.startswith("Thread "))
    return next((frame for frame in frames if frame), None)


def log_end(tail: str, lines: int = LOG_LINES) -> tuple[list[str], tuple[int, int] | None]:
    """The last ``lines`` lines of the log, and where in them the last Python traceback is
    (shown whole even when it ends earlier, its end kept when longer than ``lines``)."""
    every = tail.rstrip("\n").splitlines()
    found = exits.last_traceback(every)
    start = max(0, len(every) - lines)
    if found is None:
        return every[start:], None
    if found[0] < start:
        start = max(found[0], found[1] - lines)
    return every[start:], (max(0, found[0] - start), found[1] - start)


def last_progress(artifact: Artifact) -> LastProgress | None:
    """The progress that counted, last: the step's last advance, or file change."""
    progress_events = [e for e in artifact["events"] if e["kind"] == EventKind.PROGRESS]
    steps = counted_steps(artifact)
    at = seconds_at(artifact, last_progress_at(artifact))
    if at is None or (steps is None and not progress_events):
        return None
    # The files that changed at that progress (the step's source, a checkpoint beside it).
    paths = next(
        (e["paths"] for e in reversed(progress_events) if float(e["t"]) <= at + 0.001),
        [steps["source"]] if steps is not None else [],
    )
    found = (p for e in reversed(progress_events) for p in e["paths"] if _is_checkpoint(str(p)))
    checkpoint = next(found, None)
    end = next(
        (float(e["t"]) for e in artifact["events"] if e["kind"] in _COMMAND_ENDS),
        float(artifact["duration_seconds"]),
    )
    root = None if checkpoint is None else _checkpoint_root(artifact, str(checkpoint))
    return LastProgress(float(at), [str(p) for p in paths], max(0.0, end - at), root)


def _names_checkpoint(text: str) -> bool:
    return any(w in text.lower() for w in CHECKPOINT_WORDS)


def _is_checkpoint(path: str) -> bool:
    return _names_checkpoint(path) or path.lower().endswith(CHECKPOINT_SUFFIXES)


def _checkpoint_root(artifact: Artifact, path: str) -> str:
    """``checkpoint-280`` for ``checkpoint-280/trainer_state.json``, under the progress dir."""
    parts = PurePath(path).parts
    at = next((i for i, p in enumerate(parts) if _names_checkpoint(p)), None)
    root = PurePath(path) if at is None else PurePath(*parts[: at + 1])
    progress_dir = artifact["progress"]["dir"]
    if progress_dir and not root.is_absolute():
        return str(PurePath(progress_dir) / root)
    return str(root)


def leaking_series(artifact: Artifact) -> list[Leak]:
    """The ``trends`` entries judged leaks, with their key; processes first, by growth."""
    leaks = [
        Leak(series=key, **entry)
        for key, entry in trend_verdicts(artifact).items()
        if entry["verdict"] == "leak"
    ]
    return sorted(
        leaks,
        key=lambda e: (not e["series"].startswith("process."), -abs(float(e["growth"] or 0.0))),
    )


def trend_text(entry: Leak) -> str:
    """``memory of pid 29987 (python) grew 1.0 GiB in 1m10s (+0.9 GiB/min)``, and the limit."""
    unit, key = entry["unit"], entry["series"]
    pid, name = entry.get("pid"), entry.get("name")  # a process's trend only
    what = entry["label"] or key
    if pid is not None:
        what = f"{'GPU memory' if 'gpu' in key else 'memory'} of pid {pid}"
        what += f" ({name})" if name else ""
    span = float(entry["span_seconds"])
    text = f"{what} grew {_amount(entry['growth'], unit)} in {format_duration(span)}"
    slope = entry["slope_per_hour"]
    if isinstance(slope, int | float):
        text += f" ({rate_text(float(slope), unit, span, like=entry['growth'])})"
    to_limit = entry["projected_seconds_to_limit"]
    if isinstance(to_limit, int | float):
        source = entry["limit_source"] or "its limit"
        text += f"; at this rate it reaches {source} in {format_duration(float(to_limit))}"
    return text


def rate_text(slope_per_hour: float, unit: str, span_seconds: float, *, like: object = None) -> str:
    """A slope per minute for a short run, per hour for a long one: ``+0.9 GiB/min`` (scaled
    as ``like``, the growth, when it is larger, so the two read in one unit)."""
    per, divisor = ("min", 60.0) if span_seconds < 3 * 3600 else ("h", 1.0)
    value = slope_per_hour / divisor
    scale = max(abs(value), abs(float(like))) if isinstance(like, int | float) else None
    return f"{'+' if value >= 0 else '-'}{_amount(abs(value), unit, like=scale)}/{per}"


def _amount(value: object, unit: str, *, like: float | None = None) -> str:
    if not isinstance(value, int | float):
        return "?"
    return format_value(float(value), unit, like=like)


def _cause(
    artifact: Artifact,
    primary: str | None,
    leaks: Sequence[Leak],
    log_lines: Sequence[str],
    traceback: tuple[int, int] | None,
) -> tuple[str | None, str | None, str | None]:
    """(the cause in one line, where, the source line there)."""
    failures = artifact["failures"]
    if primary in (FailureReason.NONZERO_EXIT, FailureReason.SIGNALED, FailureReason.TOO_SHORT):
        exception = artifact["exit"].get("exception")  # a version 2 key
        if exception is not None and exception["type"]:
            text = f"{exception['type']}: {exception['message']}".rstrip(": ")
            rank = exception.get("rank")  # a distributed run's
            if rank is not None:
                pid = exception["rank_pid"]  # written with the rank
                text = f"rank {rank}{f' (pid {pid})' if pid else ''} failed first: {text}"
            return text, exception["where"], _source_line(artifact, exception["where"])
        frames = [] if traceback is None else log_lines[traceback[0] : traceback[1]]
        exception_line = frames[-1].strip() if frames else ""
        if exception_line and not exception_line.startswith(("File ", _TRACEBACK)):
            m = next((m for m in map(_FILE_LINE.match, reversed(frames)) if m), None)
            where = None if m is None else f"{PurePath(m['file']).name}:{m['line']} in {m['func']}"
            return exception_line, where, _source_line(artifact, where)
        return failures[0]["message"], None, None
    if primary in STALLS:
        return _stall_cause(artifact)
    if leaks and primary in LEAK_REASONS:
        return trend_text(leaks[0]), None, None
    if primary is not None:
        return failures[0]["message"], None, None
    return named_warning(artifact["warnings"]), None, None


def _stall_cause(artifact: Artifact) -> tuple[str, str | None, str | None]:
    forensics = stall_forensics(artifact)
    processes = [] if forensics is None else schema.readable_processes(forensics)
    ranks = stall_ranks(artifact)
    if ranks is not None and ranks["text"]:
        # The rank the others wait for (never its launcher), with where it stopped.
        where = ranks["where"]
        culprit = next((p for p in processes if p["pid"] == ranks["pid"]), None)
        return ranks["text"], where, _source_line(artifact, where, culprit)
    for process in processes:
        frame = innermost_python_frame(process)
        if not frame or is_launcher(process):  # a launcher only waits for its ranks
            continue
        match = _FRAME.match(frame)
        where = f"{match['file']}:{match['line']} in {match['func']}" if match else frame
        state = "idle" if "(idle)" in (python_stack(process) or "") else process["state"]
        text = f"pid {process['pid']} ({process['name']}) {state} at {where}"
        return text, where, _source_line(artifact, where, process)
    return artifact["failures"][0]["message"], None, None


def _source_line(
    artifact: Artifact, where: str | None, process: schema.ForensicsProcess | None = None
) -> str | None:
    """The line ``file:line`` names, read from the file when it is on this machine."""
    match = re.match(r"^(?P<file>[^:]+):(?P<line>\d+)", where or "")
    if match is None:
        return None
    name, number = match["file"], int(match["line"])
    # py-spy and tracebacks may name a script by its base name: find it on the command line.
    argv = [*(process["cmdline"] if process is not None else []), *artifact["command"]]
    candidates = [
        Path(name),
        *(Path(a) for a in argv if isinstance(a, str) and Path(a).name == name),
    ]
    if artifact["cwd"]:
        candidates.append(Path(str(artifact["cwd"])) / name)
    lines = (linecache.getline(str(p), number).strip() for p in candidates if p.is_file())
    return next((line for line in lines if line), None)


def _next_steps(
    artifact: Artifact,
    primary: str | None,
    where: str | None,
    last: LastProgress | None,
    leaks: Sequence[Leak],
) -> list[str]:
    resume = f"resume from {last.checkpoint}" if last and last.checkpoint else None
    steps: list[str] = []
    if primary in STALLS:
        ranks = stall_ranks(artifact)
        if ranks is not None and ranks["culprits"] and where:
            waits = f" in {ranks['waiting']}" if ranks["waiting"] else ""
            steps.append(
                f"Look at rank {ranks['culprits'][0]} at {where}: the other ranks wait for "
                f"it{waits}."
            )
        if resume:
            steps.append(resume[:1].upper() + resume[1:] + ".")
        if not artifact["config"].get("dump_signal"):
            steps.append(
                "Rerun with --dump-signal SIGUSR1 for every thread's stack, native frames too "
                "(the trainer calls faulthandler.register(signal.SIGUSR1))."
            )
        verdict = stall_verdict(artifact)
        stale = primary == FailureReason.STALE_PROGRESS
        option = "--stale-progress" if stale else "--startup-timeout"
        limit = config_value(
            artifact, "stale_progress_seconds" if stale else "startup_timeout_seconds"
        )
        if verdict is not None and verdict.tree == "busy":
            cpu = verdict.cpu_percent or 0.0
            steps.append(
                f"The tree was busy (CPU about {cpu:.0f}%): if it was only slow, raise {option}"
                + (f" (now {format_duration(limit)})." if limit else ".")
            )
    elif primary == FailureReason.GPU_FAULT:
        faults = gpu_faults(artifact)
        if faults and faults[0].get("action"):
            steps.append(f"GPU {faults[0]['gpu']} ({faults[0]['bus_id']}): {faults[0]['action']}.")
        steps.append(
            "The fault is the machine's, not the training's: rerun on a healthy GPU"
            + (f", and {resume}." if resume else ".")
        )
    elif primary in (FailureReason.NONZERO_EXIT, FailureReason.SIGNALED):
        fix = f"Fix the error at {where}" if where else "Read the log's end below for the error"
        steps.append(fix + (f", then {resume}." if resume else "."))
        if artifact["exit"]["signal"] == "SIGKILL" and not oom_kills(artifact):
            steps.append("Check the kernel log (dmesg) for the OOM killer.")
    elif primary == FailureReason.MEMORY_BUDGET:
        rss = config_value(artifact, "max_rss_bytes")
        budget = _space_bytes(rss or config_value(artifact, "max_gpu_memory_bytes"))
        steps.append(
            f"The memory budget{budget} was crossed: raise --max-rss / --max-gpu-memory if "
            "the run needs more, or find what grew in the per-process table."
        )
    elif primary == FailureReason.DISK_LOW:
        floor = _space_bytes(config_value(artifact, "min_disk_free_bytes"))
        steps.append(
            f"Free disk space fell below --min-disk-free{floor}: clear old checkpoints, or "
            "write them elsewhere."
        )
    elif primary in _FIXED_STEPS:
        steps.append(_FIXED_STEPS[FailureReason(primary)])
    if leaks and primary in LEAK_REASONS:
        leak = leaks[0]
        who = f"pid {leak['pid']}" if leak.get("pid") is not None else "the tree"
        steps.append(
            f"Find what {who} keeps alive (tracemalloc snapshots a few steps apart show it)"
            + ("; rerun with --leak-check fail to stop on it." if primary is None else ".")
        )
    return steps


def _space_bytes(value: float | None) -> str:
    return "" if value is None else f" {format_bytes(value)}"
