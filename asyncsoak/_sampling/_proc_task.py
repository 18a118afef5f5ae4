"""The proc sampler's task: a reading of the tree at each tick, in a worker thread under a deadline.

A stuck read (``/proc/PID/cmdline`` and ``smaps_rollup`` wait for the process's memory map
lock) degrades this sampler only, and no second read starts until the stuck one returns.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio

from .._contract import (
    BlockingCallTimeout,
    EventSink,
    FailureReason,
    Masker,
    events,
    next_tick,
    require_positive,
    run_blocking,
)
from ._proc_sample import ProcSample
from ._proc_sampler import ProcSampler
from ._procfs import PROC

SAMPLER_NAME = "proc"
#: How long one reading of the tree and the machine may take before the sampler is degraded.
READ_TIMEOUT_SECONDS = 5.0
#: A soak whose sampler has had no sample for this long (and :data:`BLIND_INTERVALS` sample
#: intervals) is not being watched: it fails closed (``monitor_error``), never passes blind.
BLIND_SECONDS = 20.0
BLIND_INTERVALS = 4


def blind_limit(interval: float) -> float:
    """How long the sampler may go without a sample before the soak fails closed."""
    return max(BLIND_SECONDS, BLIND_INTERVALS * interval)


async def run_proc_sampler(
    sink: EventSink,
    *,
    root_pid: int,
    interval: float,
    disk_paths: Mapping[str, Path],
    detailed_memory: bool = False,
    masker: Masker | None = None,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    proc: Path = PROC,
    members_file: str | None = None,
    tree_gone: anyio.Event | None = None,
    blind_after: float | None = None,
) -> None:
    """Offer a :class:`ProcSample` at each tick of the soak's grid (start + k * interval)
    until cancelled, or until the tree is gone (``tree_gone`` set, and a read finds it empty).

    Each read runs in a thread under ``read_timeout``; one that outlives it degrades the
    sampler until a read succeeds again, and no second read starts until it returns.  No
    sample for ``blind_after`` seconds (default :func:`blind_limit`) posts a ``rule_broken``
    (``monitor_error``) once: the soak fails closed.  The sampler owns ``sink`` (give it
    a clone) and closes it.
    """
    async with sink:
        require_positive("interval", interval)
        require_positive("read_timeout", read_timeout)
        sampler = ProcSampler(
            root_pid,
            disk_paths=disk_paths,
            detailed_memory=detailed_memory,
            proc=proc,
            masker=masker,
            members_file=members_file,
        )
        handling = _TickHandling(
            sink,
            sampler,
            read_timeout=read_timeout,
            tree_gone=tree_gone,
            blind_after=blind_limit(interval) if blind_after is None else blind_after,
        )
        start = tick = sink.clock.start
        reading = threading.Event()

        def read() -> ProcSample | None:
            reading.set()
            try:
                return sampler.read(time.monotonic() - start)
            finally:
                reading.clear()

        # The files kept open are closed however the sampler ends.
        with contextlib.closing(sampler):
            while True:
                # A read still stuck in its thread is never joined by another.
                outcome = None if reading.is_set() else await _read(read, read_timeout)
                if await handling.handle(outcome):
                    return
                tick = next_tick(tick, interval, anyio.current_time())
                await anyio.sleep_until(tick)


async def _read(
    read: Callable[[], ProcSample | None], read_timeout: float
) -> ProcSample | Exception | None:
    """One read in a thread: its sample (None: another read is still under way), or what
    went wrong (a :class:`BlockingCallTimeout` when it outlived ``read_timeout``)."""
    try:
        return await run_blocking(read, timeout=read_timeout, what="reading /proc")
    except Exception as exc:
        return exc


class _TickHandling:
    """What the sampler's task does with each tick: the sample handed to the sink, the
    sampler degraded (reads that hang) and recovered, an error told once (then counted),
    and a sampler without samples for too long told once as blind."""

    def __init__(
        self,
        sink: EventSink,
        sampler: ProcSampler,
        *,
        read_timeout: float,
        tree_gone: anyio.Event | None,
        blind_after: float,
    ) -> None:
        self.sink = sink
        self.sampler = sampler
        self.read_timeout = read_timeout
        self.tree_gone = tree_gone
        self.blind_after = blind_after
        self.error_told = False
        self.degraded = False
        self.blind_told = False
        self.last_sample_at = sink.elapsed()
        #: The position of the last sample queued (see :meth:`EventSink.taken`).
        self.queued_at = 0

    async def handle(self, outcome: ProcSample | Exception | None) -> bool:
        """Handle one read; True when the tree is gone (the sampler is done)."""
        sampled = False
        try:
            if isinstance(outcome, BlockingCallTimeout):
                if not self.degraded:
                    await self._degrade()
            elif isinstance(outcome, Exception):
                raise outcome
            elif outcome is not None:  # None: a read still under way (the sampler is degraded)
                gone = self.tree_gone is not None and self.tree_gone.is_set()
                if not outcome.processes and gone:
                    # Read after the reaper's last child went: an empty tree, not a sample of
                    # the run (its "0 processes" would end every series), and the last there is.
                    return True
                sampled = True
                await self._deliver(outcome)
        except Exception as exc:
            await self._count_error(exc)
        await self._tell_if_blind(sampled)
        return False

    async def _deliver(self, sample: ProcSample) -> None:
        sink = self.sink
        if self.degraded:
            self.degraded = False
            await sink.emit(
                events.SamplerRecovered(sink.elapsed(), SAMPLER_NAME, "/proc reads are back")
            )
        if not sink.taken(self.queued_at):
            # While the serializer has not taken the sample before (a huge tree, a starved
            # machine), a new one is dropped and counted, never queued up behind it; the
            # other producers' events of a tick waiting beside it are no backlog.
            sink.counters.dropped_samples += 1
            self.sampler.forget_descriptions(sample)
        elif sink.offer(sample):
            self.queued_at = sink.counters.sent
        else:
            self.sampler.forget_descriptions(sample)

    async def _degrade(self) -> None:
        # The thread is abandoned, not stopped: the next reads return None at once until it
        # comes back, so stuck threads never pile up.
        self.degraded = True
        self.sink.counters.sampler_errors += 1
        await self.sink.emit(
            events.SamplerDegraded(
                self.sink.elapsed(),
                SAMPLER_NAME,
                f"reading /proc took more than {self.read_timeout:g} s; "
                "skipping samples until it returns",
            )
        )

    async def _count_error(self, exc: Exception) -> None:
        self.sink.counters.sampler_errors += 1
        if self.error_told:
            return
        self.error_told = True
        await self.sink.emit(
            events.SamplerNote(
                self.sink.elapsed(),
                SAMPLER_NAME,
                f"proc sampler error (later ones are only counted): {exc!r}",
                {"error": repr(exc), "type": type(exc).__name__},
            )
        )

    async def _tell_if_blind(self, sampled: bool) -> None:
        now = self.sink.elapsed()
        if sampled:
            self.last_sample_at = now
            return
        if self.blind_told or now - self.last_sample_at < self.blind_after:
            return
        self.blind_told = True
        await self.sink.emit(
            events.RuleBroken(
                t=now,
                reason=FailureReason.MONITOR_ERROR,
                message=f"the proc sampler had no sample of the process tree for "
                f"{now - self.last_sample_at:.1f}s (reads that hang or fail, or no thread to read "
                "in): the run was not being watched",
            )
        )
