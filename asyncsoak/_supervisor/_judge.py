"""Judging the run while it runs: the pure rules (:mod:`._rules`) bound to the soak, and the
trends judged once more at the end."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import anyio

from .._analysis import GPU_SETTLE_SECONDS, memory_not_judged
from .._contract import BlockingCallTimeout, EventKind, EventSink, FailureReason, iso, run_blocking
from .._contract.events import Event, EventJson, FailureEvent, Limits, WarningEvent
from .._record import RunState
from .._sampling import MemoryCgroup, read_limits
from ._config import SoakConfig
from ._rules import (
    broken_notes,
    broken_rule,
    budget_breach,
    overdue_failure,
    straggler_warnings,
    trend_due,
    trend_events,
    trend_findings,
)

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
