"""``asyncsoak compare``: two runs of the same training side by side, each figure's change,
and a regression where the candidate is worse by more than the threshold (memory also by
more than a floor, so noise in a small process is not one)."""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .._analysis import TREE_MEMORY_SERIES
from .._contract import Artifact, SoakStatus, format_duration, terminal_text
from ._evidence import gpu_faults, leaking_series, rate_text
from ._fields import format_table, format_value, gpu_index
from ._sections import column, config_value, series_group, summary_figure, trend_verdicts
from ._status import PASSED_WITH_WARNINGS, shown_status

#: Relative change (fraction) beyond which a worse figure is a regression.
DEFAULT_THRESHOLD = 0.10
#: Memory must also grow by at least this much to regress (bytes).
MEMORY_FLOOR_BYTES = 64 * 2**20
#: Statuses as the views show them, from the best to the worst: a pass that carries warnings
#: is worse than a clean one (a candidate that starts warning has regressed).
STATUS_RANK: dict[str, int] = {
    SoakStatus.PASSED: 0,
    PASSED_WITH_WARNINGS: 1,
    SoakStatus.CANCELLED: 2,
    SoakStatus.FAILED: 3,
    SoakStatus.ERROR: 4,
}

Better = Literal["lower", "higher", "none"]
#: How a figure of each of the comparison's own units is written (any other: ``format_value``).
UNIT_WORDS: dict[str, Callable[[float], str]] = {
    "s": format_duration,
    "per_minute": lambda value: f"{value:.1f}/min",
    "steps_per_second": lambda value: f"{value:.3g} steps/s",
    "loss": lambda value: f"{value:.4g}",
    "slope_bytes": lambda value: rate_text(value, "bytes", 0.0),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of both runs."""

    key: str
    label: str
    unit: str
    baseline: float | str | None
    candidate: float | str | None
    #: Relative change (candidate / baseline - 1), when both are numbers and baseline is not 0.
    change: float | None
    regressed: bool
    #: Why it regressed, in words (empty when it did not).
    note: str

    def text(self, value: float | str | None) -> str:
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        words = UNIT_WORDS.get(self.unit)
        return words(value) if words is not None else format_value(value, self.unit)


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline: str
    candidate: str
    rows: list[Row]
    #: Notes about the pair itself (different commands, for one).
    notes: list[str]

    @property
    def regressions(self) -> list[Row]:
        return [row for row in self.rows if row.regressed]

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"regressions": [row.key for row in self.regressions]}


def compare(
    baseline: Artifact,
    candidate: Artifact,
    *,
    baseline_name: str = "baseline",
    candidate_name: str = "candidate",
    threshold: float = DEFAULT_THRESHOLD,
) -> Comparison:
    """The figures of two artifacts side by side; ``threshold`` is a fraction (0.1 = 10 %)."""
    rows = [_status_row(baseline, candidate)]

    def figure(
        key: str,
        label: str,
        unit: str,
        read: Callable[[Artifact], float | None],
        better: Better,
        floor: float = 0.0,
    ) -> None:
        before, after = read(baseline), read(candidate)
        change = after / before - 1.0 if before and after is not None else None
        note = ""
        if before is not None and after is not None and better != "none":
            worse_by = (after - before) if better == "lower" else (before - after)
            relative = worse_by / abs(before) if before else (1.0 if worse_by > 0 else 0.0)
            if worse_by > floor and relative > threshold:
                note = (
                    f"{label}: none in the baseline"
                    if before == 0
                    else f"{label} {'rose' if after > before else 'fell'} by {abs(relative):.0%}"
                )
        rows.append(Row(key, label, unit, before, after, change, bool(note), note))

    def stat(group: str, name: str, key: str) -> Callable[[Artifact], float | None]:
        return lambda artifact: summary_figure(artifact, group, name, key)

    figure("duration", "duration", "s", lambda a: float(a["duration_seconds"]), "none")
    figure("warnings", "warnings", "", lambda a: float(len(a["warnings"])), "lower")
    peak_rss = stat("tree", "rss_bytes", "max")
    figure("tree.rss.peak", "peak tree RSS", "bytes", peak_rss, "lower", MEMORY_FLOOR_BYTES)
    figure("tree.rss.final", "final tree RSS", "bytes", _final_rss, "lower", MEMORY_FLOOR_BYTES)
    rows.append(_leak_row(baseline, candidate, threshold))
    # File changes are counted once a scan: comparable only at one sample interval, and
    # never when both runs have steps (their rate is the progress).
    intervals = {config_value(a, "sample_interval_seconds") for a in (baseline, candidate)}
    if len(intervals) == 1 and not (_steps(baseline) and _steps(candidate)):
        figure("progress.rate", "file changes", "per_minute", _progress_rate, "higher")
    figure("steps.rate", "step rate", "steps_per_second", _step_rate, "higher")
    figure("steps.loss.final", "final loss", "loss", lambda a: _step_figure(a, "loss"), "lower")

    def fault_count(a: Artifact) -> float | None:
        return float(len(gpu_faults(a))) if a.get("gpu_health") else None

    figure("gpu.faults", "GPU faults", "", fault_count, "lower")
    groups = {g for a in (baseline, candidate) for g in a["summary"] if gpu_index(g) is not None}
    for g in sorted(groups, key=lambda g: gpu_index(g) or 0):
        util = stat(g, "utilization_gpu_percent", "mean")
        figure(f"{g}.utilization.mean", f"{g} utilisation mean", "%", util, "higher")
        memory = stat(g, "memory_used_mib", "max")
        floor = MEMORY_FLOOR_BYTES / 2**20
        figure(f"{g}.memory.peak", f"{g} memory peak", "MiB", memory, "lower", floor)
    notes = [
        f"{name}: {len(faults)} GPU fault(s), the machine's rather than the code's; "
        f"first: {faults[0]['message']}"
        for name, faults in (
            (baseline_name, gpu_faults(baseline)),
            (candidate_name, gpu_faults(candidate)),
        )
        if faults
    ]
    if baseline["command"] != candidate["command"]:
        notes.append(
            "the commands differ: "
            f"{shlex.join(baseline['command'])} | {shlex.join(candidate['command'])}"
        )
    shown = [r for r in rows if r.baseline is not None or r.candidate is not None]
    return Comparison(baseline_name, candidate_name, shown, notes)


def _status_row(baseline: Artifact, candidate: Artifact) -> Row:
    def verdict(artifact: Artifact) -> str:
        count = len(artifact["warnings"])
        if shown_status(artifact["status"], count) == PASSED_WITH_WARNINGS:
            return f"passed with {count} warning{'s' if count > 1 else ''}"
        reasons = ", ".join(f["reason"] for f in artifact["failures"])
        return str(artifact["status"]) + (f" ({reasons})" if reasons else "")

    def rank(artifact: Artifact) -> int:
        return STATUS_RANK[shown_status(artifact["status"], len(artifact["warnings"]))]

    before, after = verdict(baseline), verdict(candidate)
    regressed = rank(candidate) > rank(baseline)
    note = f"the verdict went from {before} to {after}" if regressed else ""
    return Row("verdict", "verdict", "", before, after, None, regressed, note)


def _leak_row(baseline: Artifact, candidate: Artifact, threshold: float) -> Row:
    """The tree's memory slope; a regression when the candidate leaks and the baseline did not,
    or leaks faster by more than the threshold."""

    def slope(artifact: Artifact) -> float | None:
        trends = trend_verdicts(artifact)
        trend = next((trends[k] for k, _ in TREE_MEMORY_SERIES if k in trends), None)
        value = None if trend is None else trend["slope_per_hour"]
        return float(value) if isinstance(value, int | float) else None

    before, after = slope(baseline), slope(candidate)
    before_leaks, leaks = leaking_series(baseline), leaking_series(candidate)
    change = after / before - 1.0 if before and after is not None else None
    regressed = bool(leaks) and (
        not before_leaks
        or (before is not None and after is not None and after > before * (1 + threshold))
    )
    note = ""
    if regressed:
        than = "leaked less" if before_leaks else "did not leak"
        note = f"memory leak: {leaks[0]['label'] or leaks[0]['series']} (the baseline {than})"
    return Row(
        "tree.rss.slope", "tree RSS slope", "slope_bytes", before, after, change, regressed, note
    )


def _numbers(artifact: Artifact, group: str, name: str) -> list[float]:
    return [
        float(v) for v in column(series_group(artifact, group), name) if isinstance(v, int | float)
    ]


def _final_rss(artifact: Artifact) -> float | None:
    """The tree's memory as the run ended: the median of its last quarter of samples (the
    very last may be a process freeing everything as it exits)."""
    values = _numbers(artifact, "tree", "rss_bytes")
    if not values:
        return summary_figure(artifact, "tree", "rss_bytes", "last")
    return float(statistics.median(values[-max(3, len(values) // 4) :]))


def _progress_rate(artifact: Artifact) -> float | None:
    """Progress changes per minute over the run."""
    series = series_group(artifact, "progress_rate")
    rates = [] if series is None else [v for v in series["changes_per_minute"] if v is not None]
    if rates:
        return sum(rates) / len(rates)
    duration = float(artifact["duration_seconds"])
    return artifact["progress"]["changes"] / duration * 60.0 if duration else None


def _step_rate(artifact: Artifact) -> float | None:
    """Training steps per second: the median of the run's step-rate series."""
    rates = _numbers(artifact, "steps", "steps_per_second")
    if rates:
        return float(statistics.median(rates))
    return _step_figure(artifact, "steps_per_second")


def _steps(artifact: Artifact) -> Mapping[str, Any]:
    return artifact["progress"].get("steps") or {}


def _step_figure(artifact: Artifact, key: str) -> float | None:
    value = _steps(artifact).get(key)
    return None if value is None else float(value)


def format_comparison(comparison: Comparison) -> str:
    """A table safe to print: each figure, both values, the change, REGRESSED where worse."""
    table = [("", "baseline", "candidate", "change", "")]
    table += [
        (
            row.label,
            row.text(row.baseline),
            row.text(row.candidate),
            f"{row.change:+.0%}" if row.change is not None else "",
            "REGRESSED" if row.regressed else "",
        )
        for row in comparison.rows
    ]
    lines = [f"baseline:  {comparison.baseline}", f"candidate: {comparison.candidate}", ""]
    lines += format_table(table)
    lines += [f"note: {note}" for note in comparison.notes]
    regressions = comparison.regressions
    lines.append("")
    if regressions:
        lines.append(
            f"{len(regressions)} regression{'s' if len(regressions) > 1 else ''}: "
            + "; ".join(
                f"{row.note} ({row.text(row.baseline)} -> {row.text(row.candidate)})"
                for row in regressions
            )
        )
    else:
        lines.append("no regression")
    return terminal_text("\n".join(lines), one_line=False)
