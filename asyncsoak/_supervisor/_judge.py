"""Judging the run while it runs: the budgets at every folded sample, the trends every few.

The rules themselves are pure (:mod:`._rules`); this is their caller during the soak: it reads
the artifact builder's trends, emits what became confident (``trend`` events, warnings) and
ends the soak when a budget or ``leak_check="fail"`` says so.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, ClassVar

import anyio

from .._analysis import GPU_SETTLE_SECONDS, describe_activity, straggler_text
from .._contract import (
    BlockingCallTimeout,
    EventFold,
    EventKind,
    EventSink,
    FailureReason,
    GpuFault,
    GpuSampleJson,
    Limits,
    SampleJson,
    TrendFound,
    WarningEvent,
    format_duration,
    run_blocking,
)
from .._record import ArtifactBuilder
from .._sampling import MemoryCgroup, fault_gpu, read_limits
from ._config import SoakConfig
from ._rules import (
    MACHINE_WIDE,
    TREND_LAG_FRACTION,
    budget_breach,
    leak_transient_seconds,
    trend_findings,
    trend_period_seconds,
)
from ._stop import HANG_REASONS, Fail

#: How long at most the end of a run whose tree held GPU memory waits for a GPU reading that
#: tells what the tree left (``GPU_SETTLE_SECONDS`` after the tree was gone, and an interval).
GPU_RELEASE_WAIT_MAX_SECONDS = 10.0


class RunJudge:
    """The budgets and trends of one soak, judged as its samples are folded.

    ``rule_fired`` ends the soak with a failure; ``fail`` records one without ending it (the
    final judgement, once the soak is ending anyway); ``ended`` says whether the soak has an
    end cause already.
    """

    def __init__(
        self,
        cfg: SoakConfig,
        builder: ArtifactBuilder,
        *,
        rule_fired: Fail,
        fail: Fail,
        ended: Callable[[], bool],
        gpu_failed: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None,
        stall_fired: Callable[[FailureReason, str, dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.cfg = cfg
        self._gpu_failed = gpu_failed
        self._stall_fired = stall_fired
        self._builder = builder
        self._rule_fired = rule_fired
        self._fail = fail
        self._ended = ended
        #: Called with every evaluation of the trends (the artifact's ``trends`` shape).
        self.trend_observers: list[Callable[[Mapping[str, Mapping[str, Any]]], None]] = []
        #: Set each time a proc sample has been folded into the artifact (see :meth:`run`).
        self._sample_folded = anyio.Event()
        #: Set once a GPU sample taken after the tree was gone has been folded.
        self._gpus_after_tree = anyio.Event()
        #: (series key, verdict) already reported by a ``trend`` event.
        self._trends_reported: set[tuple[str, str]] = set()
        #: Ranks already told to be stragglers.
        self._stragglers_told: set[str] = set()
        #: Series called a leak and not withdrawn since -> when first called (seconds).
        self._live_leaks: dict[str, float] = {}

    async def watchdog_rule(self, word: str, message: str) -> None:
        """A stall's failure message says what the tree and its GPUs were doing when it
        stalled; the verdict is recorded with the failure, for the views to say the same.

        The watchdog names its rule in a plain word, one of the failure reasons."""
        reason = FailureReason(word)
        if reason in HANG_REASONS and self._stall_fired is not None:
            activity = self._builder.trends.activity()
            message += f"; the tree was {describe_activity(activity)}"
            await self._stall_fired(reason, message, activity)
            return
        await self._rule_fired(reason, message)

    async def gpu_fault(self, fault: GpuFault) -> None:
        """A GPU fault that fails the run (on a GPU the tree uses): ``gpu_fault``, even when the
        run is ending already (a trainer killed by the fault exits before the kernel log is
        read).  The GPU sampler records the other faults as warnings itself."""
        if self._gpu_failed is not None:
            await self._gpu_failed(fault.message, fault_gpu(fault))

    async def emit_limits(self, sink: EventSink, pid: int) -> MemoryCgroup | None:
        """The limits the run is judged against (memory, the cgroup of the command ``pid``,
        disks), as one event; returns that memory cgroup (its OOM-kill counter now)."""
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

    async def run(self, sink: EventSink) -> None:
        """Budgets at every sample interval; trends every few (see ``TREND_EVERY_INTERVALS``)."""
        period = trend_period_seconds(self.cfg)
        next_trends = period
        while not self._ended():
            # Woken by each sample once it is folded, not by a clock of its own: the budgets
            # see the newest figures, and the monitor wakes once per interval, not twice.
            await self._sample_folded.wait()
            self._sample_folded = anyio.Event()
            await self._check_budgets()
            await self._tell_stragglers(sink)
            now = sink.elapsed()
            if not self._ended() and now >= next_trends:
                # Judged more rarely as the run grows (at most 2 % of its age late): a day
                # of samples makes an evaluation cost a few milliseconds.
                next_trends = now + max(period, now * TREND_LAG_FRACTION)
                await self.judge_trends(sink, final=False)

    _fold: ClassVar[EventFold[RunJudge]] = EventFold()

    def note_fold(self, data: Mapping[str, Any]) -> None:
        """The serializer's observer: a folded sample wakes :meth:`run`."""
        self._fold.dispatch(self, data)

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, event: SampleJson) -> None:
        self._sample_folded.set()

    @_fold.on(EventKind.GPU_SAMPLE)
    def _on_gpu_sample(self, t: float, event: GpuSampleJson) -> None:
        if self._builder.trends.gpu_after_tree:
            self._gpus_after_tree.set()

    async def check_gpus_released(self, sink: EventSink) -> None:
        """Once the tree is gone: did the GPUs it used get their memory back?  Waits for one
        settled GPU reading after the tree was gone, ``GPU_SETTLE_SECONDS``, four sample
        intervals and 0.5 s at most (``GPU_RELEASE_WAIT_MAX_SECONDS``); only if the tree held GPU
        memory, so a soak without a GPU never waits."""
        if self.cfg.nvidia_smi is None or not self._builder.trends.gpus_of_tree:
            return
        interval = self.cfg.sample_interval_seconds
        wait = min(GPU_RELEASE_WAIT_MAX_SECONDS, GPU_SETTLE_SECONDS + 4 * interval + 0.5)
        with anyio.move_on_after(wait):
            await self._gpus_after_tree.wait()
        for message in self._builder.trends.gpu_not_released():
            await sink.emit(WarningEvent(t=sink.elapsed(), message=message))

    async def _tell_stragglers(self, sink: EventSink) -> None:
        """Each rank found falling behind the others, once, as a warning."""
        for rank, found in self._builder.trends.stragglers.items():
            if rank in self._stragglers_told:
                continue
            self._stragglers_told.add(rank)
            await sink.emit(WarningEvent(t=sink.elapsed(), message=straggler_text(found)))

    async def _check_budgets(self) -> None:
        breach = budget_breach(self.cfg, self._builder.trends)
        if breach is not None:
            await self._rule_fired(*breach)

    async def judge_trends(self, sink: EventSink, *, final: bool) -> None:
        """Report what became confident (leaks, projected breaches, progress slowing) and
        what no longer is (a live leak call withdrawn)."""
        cfg = self.cfg
        trends = self._builder.trends.evaluate(self._builder.wall, live=not final)
        for observe in self.trend_observers:
            observe(trends)
        findings = trend_findings(cfg, trends)
        leaking_now = {f.series for f in findings if f.verdict == "leak"}
        for series in [s for s in self._live_leaks if s not in leaking_now]:
            await self._withdraw(sink, series, trends.get(series), final=final)
        for key, verdict, entry, message in findings:
            first_time = (key, verdict) not in self._trends_reported
            if first_time:
                self._trends_reported.add((key, verdict))
                await sink.emit(
                    TrendFound(
                        t=sink.elapsed(),
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
                        message = self._slowdown_with_gpus(message, entry, sink.elapsed())
                    await sink.emit(WarningEvent(t=sink.elapsed(), message=message))
                continue
            seen = self._live_leaks.setdefault(key, sink.elapsed())
            if final and seen < sink.elapsed():
                message += f" (first seen {format_duration(seen)} into the run)"
            if cfg.leak_check == "fail" and not key.startswith(MACHINE_WIDE):
                if first_time:
                    message += " (leak_check=fail)"
                    if final:
                        await self._fail(FailureReason.MEMORY_LEAK, message)
                    else:
                        await self._rule_fired(FailureReason.MEMORY_LEAK, message)
            elif final:
                # The warning is the whole run's verdict: a rise seen during the run (the
                # ``trend`` event marks when) that turned out to be a long cycle is no leak.
                await sink.emit(WarningEvent(t=sink.elapsed(), message=message))

        if final:
            for message in self._builder.gpu_health.throttle_warnings():
                await sink.emit(WarningEvent(t=sink.elapsed(), message=message))

    def _slowdown_with_gpus(self, message: str, entry: Mapping[str, Any], now: float) -> str:
        """A slowdown says whether the GPUs were held back over its span (its last quarter,
        against which the first is compared), by what and for what share of the time."""
        span = entry.get("span_seconds") or now
        held = self._builder.gpu_health.held_back(now - span / 4, now)
        return f"{message}; {held}" if held else message

    async def _withdraw(
        self, sink: EventSink, series: str, entry: Mapping[str, Any] | None, *, final: bool
    ) -> None:
        """A leak the live judgement called is no longer one (a ramp that plateaued, a leak
        that stopped): the live view and the metrics drop it, the artifact records when.

        Called for longer than the transient, it stays a warning: the live view said LEAK for
        that long, so the verdict says it too.
        """
        seen = self._live_leaks.pop(series)
        self._trends_reported.discard((series, "leak"))
        self._trends_reported.discard((series, "breach_projected"))
        now = sink.elapsed()
        held = now - seen
        label = entry["label"] if entry is not None else series
        sustained = held >= leak_transient_seconds(self.cfg)
        message = (
            f"{label}: the rise called a leak {format_duration(seen)} into the run "
            f"stopped; called for {format_duration(held)}"
        )
        await sink.emit(
            TrendFound(
                t=now,
                series=series,
                verdict="withdrawn",
                slope_per_hour=None if entry is None else entry.get("slope_per_hour"),
                growth=None if entry is None else entry.get("growth"),
                projected_limit_at=None,
                message=message,
            )
        )
        if sustained:
            await sink.emit(
                WarningEvent(
                    t=now,
                    message=f"{message}, longer than a transient: a leak "
                    "that stopped, or a long warm-up",
                )
            )
