"""The soak's trend and budget rules: what a sample's figures and the trends say, as verdicts.

Pure: they read the artifact builder's :class:`TrendWatch` and the config, and return what
fired; the supervisor emits the events and fails the soak.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, NamedTuple

from .._analysis import TrendWatch, describe_growth, format_amount, format_bytes
from .._contract import FailureReason, format_duration
from ._config import SoakConfig

#: Trends are judged every this many sample intervals (at least every ``TREND_MIN_PERIOD``
#: seconds apart): the estimator is cheap, but not free at 1 s over a day.
TREND_EVERY_INTERVALS = 5
TREND_MIN_PERIOD = 1.0
TREND_LAG_FRACTION = 0.02
#: A leak projected to reach a limit within this long (or ``stale_progress_seconds`` x 10,
#: whichever is longer) is a warning at once.
BREACH_HORIZON_SECONDS = 3600.0
#: A live leak call withdrawn within this many sample intervals (and at least three trend
#: evaluations) was a transient: recorded as withdrawn, with no warning.  Held longer, the
#: live view said LEAK for that long, and the verdict keeps it as a warning.
LEAK_TRANSIENT_INTERVALS = 30
LEAK_TRANSIENT_EVALUATIONS = 3


def trend_period_seconds(cfg: SoakConfig) -> float:
    """Seconds between two live evaluations of the trends (early in the run)."""
    return max(TREND_MIN_PERIOD, TREND_EVERY_INTERVALS * cfg.sample_interval_seconds)


def leak_transient_seconds(cfg: SoakConfig) -> float:
    """How long a live leak call may last and still be withdrawn without a warning."""
    return max(
        LEAK_TRANSIENT_INTERVALS * cfg.sample_interval_seconds,
        LEAK_TRANSIENT_EVALUATIONS * trend_period_seconds(cfg),
    )


#: Series of the whole machine (``/dev/shm``): a rise there may be another process's, so it
#: is a warning under ``leak_check="fail"`` too, never the failure.
MACHINE_WIDE = "machine."


#: Series whose confident rise is a leak, in the order their warnings are preferred: a
#: process's own series names the culprit, so the tree's is only reported without one.
LEAK_GROUPS: tuple[tuple[str, ...], ...] = (
    (
        "process.*.anon_bytes",
        "tree.anon_pss_bytes",
        "tree.anon_bytes",
        "process.*.rss_bytes",
        "tree.pss_bytes",
        "tree.rss_bytes",
    ),
    # (rss and pss: journals written before anonymous memory was read apart.)
    ("machine.shm_used_bytes",),
    ("process.*.gpu_memory_bytes", "tree.gpu_memory_bytes", "gpu*.memory_used_bytes"),
    ("tree.fds",),
    ("tree.threads",),
    ("tree.processes",),
)


class Finding(NamedTuple):
    """One confident trend: the series, its verdict, its trend entry and the message."""

    series: str
    verdict: str
    entry: Mapping[str, Any]
    message: str


def budget_breach(cfg: SoakConfig, watch: TrendWatch) -> tuple[FailureReason, str] | None:
    """The first budget the tree is over, as (reason, message); None when within all."""
    if cfg.max_rss_bytes is not None and watch.tree_memory is not None:
        figure, used = watch.tree_memory
        if used > cfg.max_rss_bytes:
            return (
                FailureReason.MEMORY_BUDGET,
                f"tree memory ({figure}) {format_bytes(used)} is above max_rss_bytes "
                f"({format_bytes(cfg.max_rss_bytes)})",
            )
    gpu = watch.tree_gpu_bytes
    if cfg.max_gpu_memory_bytes is not None and gpu is not None and gpu > cfg.max_gpu_memory_bytes:
        return (
            FailureReason.MEMORY_BUDGET,
            f"the tree's GPU memory {format_bytes(gpu)} is above max_gpu_memory_bytes "
            f"({format_bytes(cfg.max_gpu_memory_bytes)})",
        )
    if cfg.min_disk_free_bytes is not None:
        for label, (path, free) in sorted(watch.disk_free.items()):
            if free < cfg.min_disk_free_bytes:
                return (
                    FailureReason.DISK_LOW,
                    f"free space of the {label} filesystem ({path}) is {format_bytes(free)}, "
                    f"below min_disk_free_bytes ({format_bytes(cfg.min_disk_free_bytes)})",
                )
    return None


def trend_findings(cfg: SoakConfig, trends: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """What the trends say with confidence: leaks, projected breaches, progress slowing."""
    findings: list[Finding] = []
    if cfg.leak_check != "off":
        for key in leaking(trends):
            entry = trends[key]
            message = describe_growth(
                entry["label"],
                entry["unit"],
                entry["growth"],
                entry["span_seconds"],
                entry["slope_per_hour"],
            )
            findings.append(Finding(key, "leak", entry, message))
    stale = cfg.stale_progress_seconds
    horizon = max(BREACH_HORIZON_SECONDS, 0.0 if stale == "auto" else stale * 10)
    disks = [key for key in trends if key.startswith("disk.")]
    for key in leaking(trends) + sorted(disks):
        entry = trends[key]
        seconds = entry.get("projected_seconds_to_limit")
        if entry["verdict"] == "leak" and seconds is not None and seconds <= horizon:
            limit = format_amount(entry["limit"], entry["unit"])
            message = (
                f"{entry['label']} will reach {entry['limit_source']} ({limit}) "
                f"in about {format_duration(seconds)}"
            )
            findings.append(Finding(key, "breach_projected", entry, message))
    slowing = slowdown(trends)
    if slowing is not None:
        findings.append(slowing)
    return findings


def slowdown(trends: Mapping[str, Mapping[str, Any]]) -> Finding | None:
    """The run slowing down: judged on the step rate when the trainer writes steps, on the
    rate of file changes otherwise."""
    key = "progress.steps_per_second"
    rate = trends.get(key)
    unit, spec = "steps/s", ".3g"
    if rate is None:
        key, unit, spec = "progress.changes_per_minute", "changes/min", ".1f"
        rate = trends.get(key)
    if rate is None or rate["verdict"] != "slowing":
        return None
    message = (
        f"progress slowing: {rate['last']:{spec}} {unit} in the last quarter "
        f"against {rate['first']:{spec}} in the first"
    )
    # What the GPUs did over the slow span is the judge's to add (it holds their health).
    return Finding(key, "slowing", rate, message)


def leaking(trends: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The leaking series worth a warning: per group, the most specific ones (a process)."""
    out: list[str] = []
    for group in LEAK_GROUPS:
        for pattern in group:
            keys = sorted(
                key
                for key, entry in trends.items()
                if entry["verdict"] == "leak" and fnmatch.fnmatchcase(key, pattern)
            )
            if keys:
                out.extend(keys)
                break
    return out
