"""Judging the run: the rules, pure functions of a folded event, the run's state and the config
that return the events that fired (the serializer folds them), bound to the soak by
:class:`RunJudge`, which judges the trends once more at the end."""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple, TypeVar

import anyio

from .._analysis import (
    GPU_SETTLE_SECONDS,
    TrendWatch,
    agreeing,
    describe_activity,
    describe_growth,
    format_amount,
    format_bytes,
    memory_not_judged,
    straggler_text,
)
from .._contract import (
    BlockingCallTimeout,
    EventKind,
    EventSink,
    FailureReason,
    format_duration,
    iso,
    run_blocking,
)
from .._contract.events import (
    Event,
    EventJson,
    FailureEvent,
    Limits,
    RuleBrokenJson,
    SamplerNote,
    TrendFound,
    WarningEvent,
)
from .._record import RunState, overdue_message
from .._sampling import MemoryCgroup, read_limits
from ._config import SoakConfig
from ._stop import HANG_REASONS

#: Trends are judged every this many sample intervals, at least ``TREND_MIN_PERIOD_SECONDS``
#: apart, then every fiftieth of the run's age: the estimator is not free at 1 s over a day.
TREND_EVERY_INTERVALS = 5
TREND_MIN_PERIOD_SECONDS = 1.0
TREND_LAG_FRACTION = 0.02
#: A leak projected to reach a limit within this long (or ``stale_progress_seconds`` x 10,
#: whichever is longer) is a warning at once.
BREACH_HORIZON_SECONDS = 3600.0
#: A live leak call withdrawn within this many sample intervals (and trend evaluations) was a
#: transient: no warning.  Held longer, the live view said LEAK that long: a warning.
LEAK_TRANSIENT_INTERVALS = 30
LEAK_TRANSIENT_EVALUATIONS = 3


def trend_period_seconds(cfg: SoakConfig) -> float:
    """Seconds between two live evaluations of the trends (early in the run)."""
    return max(TREND_MIN_PERIOD_SECONDS, TREND_EVERY_INTERVALS * cfg.sample_interval_seconds)


def trend_due(cfg: SoakConfig, before: float, t: float) -> bool:
    """Whether a sample at ``t`` (the one before at ``before``) is judged for trends."""
    period = trend_period_seconds(cfg)
    linear = period / TREND_LAG_FRACTION

    def ticks(s: float) -> int:  # evaluations due by ``s``: one a period, then log-spaced
        late = math.log(s / linear) / TREND_LAG_FRACTION if s > linear else 0.0
        return math.floor(min(s, linear) / period + late)

    return ticks(t) > ticks(before)


#: The ``sampler`` of the notes telling a rule or an estimator that raised.
JUDGE = "judge"
#: Series of the whole machine (``/dev/shm``): maybe another process's, so never the failure.
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
    """One confident trend."""

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
    """The run slowing down: the step rate when the trainer writes steps, else file changes'."""
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


def trend_events(
    cfg: SoakConfig,
    state: RunState,
    trends: Mapping[str, Mapping[str, Any]],
    findings: list[Finding],
    t: float,
    *,
    final: bool,
    held_back: Callable[[float, float], str | None] | None = None,
) -> list[Event]:
    """The events the trend ``findings`` at ``t`` call for beside what was told: a ``trend`` for
    each new one, a warning for each new non-leak (a leak's is the end's verdict), the failure
    ``memory_leak`` under ``leak_check="fail"``, a withdrawal for a live call no longer found."""
    watch = state.trends
    reported = set(watch.reported)
    live = {s: c["first_seen"] or 0.0 for s, c in watch.live_calls.items() if not c["withdrawn"]}
    leaking_now = {f.series for f in findings if f.verdict == "leak"} | watch.not_judged.keys()
    events: list[Event] = []
    for series in [s for s in live if s not in leaking_now]:
        reported -= {(series, "leak"), (series, "breach_projected")}
        events += _withdrawn(cfg, series, trends.get(series), live[series], t)
    for key, verdict, entry, message in findings:
        first_time = (key, verdict) not in reported
        if first_time:
            reported.add((key, verdict))
            events.append(
                TrendFound(
                    t=t,
                    series=key,
                    verdict=verdict,
                    slope_per_hour=entry["slope_per_hour"],
                    growth=entry["growth"],
                    projected_limit_at=entry["projected_limit_at"],
                    message=message,
                )
            )
        if verdict != "leak":
            if first_time:
                if verdict == "slowing":
                    # Whether the GPUs were held back over the slowdown's last quarter, by what.
                    span = entry.get("span_seconds") or t
                    held = (held_back or state.gpu_health.held_back)(t - span / 4, t)
                    message = f"{message}; {held}" if held else message
                events.append(WarningEvent(t=t, message=message))
            continue
        seen = live.get(key, t)
        if final and seen < t:
            message += f" (first seen {format_duration(seen)} into the run)"
        if cfg.leak_check == "fail" and not key.startswith(MACHINE_WIDE):
            if first_time:
                message += " (leak_check=fail)"
                events.append(_failure(state, t, FailureReason.MEMORY_LEAK, message))
        elif final:
            # The warning is the whole run's verdict: a rise seen during the run (the
            # ``trend`` event marks when) that turned out to be a long cycle is no leak.
            events.append(WarningEvent(t=t, message=message))
    return events


def _withdrawn(
    cfg: SoakConfig, series: str, entry: Mapping[str, Any] | None, seen: float, t: float
) -> list[Event]:
    """A leak called live at ``seen`` is no longer one (a ramp that plateaued): withdrawn, and
    a warning too when it was called for longer than a transient."""
    label = entry["label"] if entry is not None else series
    message = (
        f"{label}: the rise called a leak {format_duration(seen)} into the run "
        f"stopped; called for {format_duration(t - seen)}"
    )
    withdrawn: list[Event] = [
        TrendFound(
            t=t,
            series=series,
            verdict="withdrawn",
            slope_per_hour=None if entry is None else entry.get("slope_per_hour"),
            growth=None if entry is None else entry.get("growth"),
            projected_limit_at=None,
            message=message,
        )
    ]
    transient = max(
        LEAK_TRANSIENT_INTERVALS * cfg.sample_interval_seconds,
        LEAK_TRANSIENT_EVALUATIONS * trend_period_seconds(cfg),
    )
    if t - seen >= transient:
        longer = f"{message}, longer than a transient: a leak that stopped, or a long warm-up"
        withdrawn.append(WarningEvent(t=t, message=longer))
    return withdrawn


def straggler_warnings(state: RunState, t: float) -> list[Event]:
    """A warning for each rank the sample at ``t`` found falling behind the others."""
    found = state.trends.stragglers.values()
    return [WarningEvent(t=t, message=straggler_text(s)) for s in found if s["t"] == round(t, 3)]


def broken_notes(state: RunState, t: float) -> list[Event]:
    """A sampler note, once, for each rule or series whose judgement raised."""
    errors = dict(state.rule_errors)
    for series, error in state.trends.not_judged.items():
        errors.setdefault(f"the trend estimator on {series}", error)
    if not errors:
        return []
    told = {(n.get("data") or {}).get("rule") for n in state.sampler_notes if n["sampler"] == JUDGE}
    return [
        SamplerNote(
            t=t,
            sampler=JUDGE,
            message=f"{rule} raised {error}; the run is judged without it",
            data={"rule": rule, "error": error},
        )
        for rule, error in errors.items()
        if rule not in told
    ]


def overdue_failure(state: RunState, event: EventJson) -> list[Event]:
    """A deadline of ``--expect-every`` the steps advanced past fails the run ``overdue``."""
    if event["kind"] not in (EventKind.PROGRESS, EventKind.STEP) or state.failures:
        return []
    started = state.steps_started
    missed = state.deadlines.missed(started, state.last_progress)
    if missed is None or started is None:
        return []
    t = event["t"]
    return [_failure(state, t, FailureReason.OVERDUE, overdue_message(missed, started, t))]


def gpu_fault_rule(state: RunState, event: EventJson) -> list[Event]:
    """A GPU fault that ``fails`` on a GPU the tree ``used`` fails the run (``gpu_fault``), even
    one ending already (a trainer killed by it exits first); any other fault is a warning."""
    if event["kind"] != EventKind.GPU_FAULT:
        return []
    fault, t = event, event["t"]
    if fault["fails"] and fault["used"]:
        # Imported here: a run without GPUs pays nothing for the GPU modules.
        from .._sampling import fault_gpu

        return [_failure(state, t, FailureReason.GPU_FAULT, fault["message"], gpu=fault_gpu(fault))]
    unused = " (on a GPU this run does not use)" if fault["fails"] else ""
    return [WarningEvent(t=t, message=fault["message"] + unused)]


def broken_rule(state: RunState, event: EventJson, *, ended: bool, forensics: bool) -> list[Event]:
    """A producer's broken rule fails the run unless it has ``ended``; a stall whose forensics
    the supervisor takes fails once they are folded, told with what they found."""
    broken = state.broken_rule
    if event["kind"] == EventKind.RULE_BROKEN:
        if ended or (event["reason"] in HANG_REASONS and forensics):
            return []
        return [_broken_failure(state, event, event["t"], None)]
    if event["kind"] != EventKind.FORENSICS or broken is None:
        return []
    reason = broken["reason"]
    if reason not in HANG_REASONS or any(f["reason"] == reason for f in state.failures):
        return []
    # Dated when the rule broke: the dumps' seconds are not the stall's.
    return [_broken_failure(state, broken, broken["t"], event["data"])]


def _broken_failure(
    state: RunState, broken: RuleBrokenJson, t: float, dump: Mapping[str, Any] | None
) -> FailureEvent:
    """The failure a broken rule calls for, told with the tree's activity when it broke."""
    reason, message, dump = FailureReason(broken["reason"]), broken["message"], dump or {}
    culprit = dump.get("ranks") or {}
    if culprit.get("text"):
        message = f"{culprit['text']}; {message}"
    activity = state.broken_activity if broken == state.broken_rule else None
    if activity is not None:
        activity = agreeing(activity, dump.get("processes") or [])
        said = describe_activity(activity)
        message += "" if said is None else f"; the tree was {said}"
    return _failure(state, t, reason, message, activity=activity)


def _failure(
    state: RunState, t: float, reason: FailureReason, message: str, **more: Any
) -> FailureEvent:
    """The failure at ``t``, dated by the state's wall clock (now when it has none)."""
    at = state.wall(t) or iso(datetime.now(UTC))
    return FailureEvent(t=t, reason=reason, message=message, at=at, **more)


#: The longest wait at the end for a GPU reading that tells what memory the tree left.
GPU_RELEASE_WAIT_MAX_SECONDS = 10.0

_T = TypeVar("_T")


class RunJudge:
    """The serializer's rules for one soak; ``ended`` says whether it has an end cause."""

    def __init__(self, cfg: SoakConfig, state: RunState, *, ended: Callable[[], bool]) -> None:
        self.cfg = cfg
        self._state = state
        self._ended = ended
        #: Called with every evaluation of the trends (the artifact's ``trends`` shape).
        self.trend_observers: list[Callable[[Mapping[str, Mapping[str, Any]]], None]] = []

    def _apply(self, rule: str, judge: Callable[[], _T], default: _T) -> _T:
        """``judge()``, or ``default`` when it raises (a bug, never the run's fault): the error
        is kept in the state's ``rule_errors`` and the run is judged by everything else."""
        try:
            return judge()
        except Exception as exc:
            self._state.rule_errors.setdefault(rule, f"{type(exc).__name__}: {exc}")
            return default

    def broken_rule(self, state: RunState, event: EventJson) -> list[Event]:
        """A producer's broken rule fails the run (:func:`broken_rule`)."""
        rule = partial(broken_rule, state, event, ended=self._ended(), forensics=self.cfg.forensics)
        return self._apply("the stall rule", rule, [])

    async def emit_limits(self, sink: EventSink, pid: int) -> MemoryCgroup | None:
        """The limits the run is judged against, as one event; returns the memory cgroup of the
        command ``pid`` (its OOM-kill counter now)."""
        paths = {"progress": self.cfg.progress_dir, "output": self.cfg.output_path.parent}
        environ = os.environ if self.cfg.env is None else self.cfg.env
        try:
            limits, cgroup = await run_blocking(
                partial(read_limits, paths, pid, environ=environ),
                timeout=5.0,
                what="reading the limits",
            )
        except BlockingCallTimeout:
            limits = {
                "memory_total_bytes": None,
                "cgroup_memory_max_bytes": None,
                "disk_total_bytes": {},
            }
            cgroup = None
        await sink.emit(Limits(t=sink.elapsed(), **limits))
        return cgroup

    def budget_rule(self, state: RunState, event: Mapping[str, Any]) -> list[Event]:
        """A sample that puts the tree over a budget fails the run."""
        if event["kind"] != EventKind.SAMPLE or state.failures or self._ended():
            return []
        breach = self._apply(
            "the budget rule", partial(budget_breach, self.cfg, state.trends), None
        )
        if breach is None:
            return []
        reason, message = breach
        return [
            FailureEvent(t=event["t"], reason=reason, message=message, at=iso(datetime.now(UTC)))
        ]

    def overdue_rule(self, state: RunState, event: EventJson) -> list[Event]:
        """Until the end: a deadline the steps advanced past fails the run."""
        if self._ended():
            return []
        return self._apply("the overdue rule", partial(overdue_failure, state, event), [])

    def trend_rule(self, state: RunState, event: EventJson) -> list[Event]:
        """At each sample until the end: stragglers, trends when due, rules found broken."""
        if event["kind"] != EventKind.SAMPLE or self._ended():
            return []
        t = event["t"]
        stragglers = partial(straggler_warnings, state, t)
        found: list[Event] = self._apply("the straggler rule", stragglers, [])
        if trend_due(self.cfg, *state.sample_times):
            found += self._judge_trends(t, final=False)
        return found + broken_notes(state, t)

    def _judge_trends(self, t: float, *, final: bool) -> list[Event]:
        """What the trends say at ``t``; at the end, also a ``leak_check="fail"`` that could not
        judge, and the GPUs' throttling."""
        cfg, state = self.cfg, self._state
        evaluate = partial(state.trends.evaluate, state.wall, live=not final)
        trends = self._apply("the trend estimator", evaluate, None)
        if trends is None:
            return []
        for observe in self.trend_observers:
            self._apply("the trend observer", partial(observe, trends), None)
        findings = self._apply("the trend rules", partial(trend_findings, cfg, trends), None)
        events: list[Event] = []
        if findings is not None:

            def held_back(start: float, end: float) -> str | None:
                # A GPU figure that raises costs the slowdown its GPU clause, not the trends.
                held = partial(state.gpu_health.held_back, start, end)
                return self._apply("the GPU throttle rule", held, None)

            judged = partial(
                trend_events, cfg, state, trends, findings, t, final=final, held_back=held_back
            )
            events = self._apply("the trend rules", judged, [])
        if not final:
            return events
        if cfg.leak_check == "fail":
            # A check asked to fail the run that could not judge it must not look passed.
            unjudged = self._apply("the leak check", partial(memory_not_judged, trends), None)
            events += [] if unjudged is None else [WarningEvent(t=t, message=unjudged)]
        throttled: list[str] = self._apply(
            "the GPU throttle rule", state.gpu_health.throttle_warnings, []
        )
        return events + [WarningEvent(t=t, message=message) for message in throttled]

    async def judge_final(self, sink: EventSink) -> list[FailureReason]:
        """The end's judgement of the trends and the rules found broken; returns the failures
        made (the status counts them even if their fold is late)."""
        t = sink.elapsed()
        judged = self._judge_trends(t, final=True) + broken_notes(self._state, t)
        for event in judged:
            await sink.emit(event)
        return [FailureReason(e.reason) for e in judged if isinstance(e, FailureEvent)]

    async def check_gpus_released(self, sink: EventSink) -> None:
        """Once the tree is gone: did the GPUs it used get their memory back?  Waits (bounded)
        for one settled reading, only if the tree held GPU memory."""
        trends = self._state.trends
        if self.cfg.nvidia_smi is None or not trends.gpus_of_tree:
            return
        interval = self.cfg.sample_interval_seconds
        wait = min(GPU_RELEASE_WAIT_MAX_SECONDS, GPU_SETTLE_SECONDS + 4 * interval + 0.5)
        with anyio.move_on_after(wait):
            await self._state.wait_for(lambda: trends.gpu_after_tree)
        for message in trends.gpu_not_released():
            await sink.emit(WarningEvent(t=sink.elapsed(), message=message))
