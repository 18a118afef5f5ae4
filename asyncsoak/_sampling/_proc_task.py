"""The proc sampler's task: a reading of the tree at each tick, in a worker thread under a deadline.

A stuck read (``/proc/PID/cmdline`` and ``smaps_rollup`` wait for the process's memory map
lock) degrades this sampler only, and no second read starts until the stuck one returns.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
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
) -> None:
    """Offer a :class:`ProcSample` at each tick of the soak's grid until cancelled, or until the
    tree is gone (``tree_gone`` set, and a read finds it empty).  A read that outlives
    ``read_timeout`` degrades the sampler; no sample for a while posts a ``rule_broken``
    (``monitor_error``).  The sampler owns ``sink`` and closes it."""
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
        start = tick = sink.clock.start
        reading = threading.Event()
        blind_after = max(BLIND_SECONDS, BLIND_INTERVALS * interval)
        degraded = error_told = blind_told = False
        last_sample_at = sink.elapsed()
        #: The position of the last sample queued (see :meth:`EventSink.taken`).
        queued_at = 0

        def read() -> ProcSample | None:
            reading.set()
            try:
                return sampler.read(time.monotonic() - start)
            finally:
                reading.clear()

        # The files kept open are closed however the sampler ends.
        with contextlib.closing(sampler):
            while True:
                sample: ProcSample | None = None
                try:
                    # A read still stuck in its thread is never joined by another; one that
                    # times out is abandoned, not stopped: the next reads return None at once
                    # until it comes back, so stuck threads never pile up.
                    if not reading.is_set():
                        sample = await run_blocking(
                            read, timeout=read_timeout, what="reading /proc"
                        )
                    if sample is not None:
                        if not sample.processes and tree_gone is not None and tree_gone.is_set():
                            # Read after the reaper's last child went: an empty tree, not a
                            # sample of the run (its "0 processes" would end every series).
                            return
                        if degraded:
                            degraded = False
                            message = "/proc reads are back"
                            await sink.emit(
                                events.SamplerRecovered(sink.elapsed(), SAMPLER_NAME, message)
                            )
                        # While the serializer has not taken the sample before (a huge tree, a
                        # starved machine), a new one is dropped and counted, never queued up
                        # behind it; the other producers' events of a tick are no backlog.
                        if not sink.taken(queued_at):
                            sink.counters.dropped_samples += 1
                            sampler.forget_descriptions(sample)
                        elif sink.offer(sample):
                            queued_at = sink.counters.sent
                        else:
                            sampler.forget_descriptions(sample)
                except BlockingCallTimeout:
                    if not degraded:
                        degraded = True
                        sink.counters.sampler_errors += 1
                        message = (
                            f"reading /proc took more than {read_timeout:g} s; skipping samples "
                            "until it returns"
                        )
                        await sink.emit(
                            events.SamplerDegraded(sink.elapsed(), SAMPLER_NAME, message)
                        )
                except Exception as exc:
                    sink.counters.sampler_errors += 1
                    if not error_told:
                        error_told = True
                        message = f"proc sampler error (later ones are only counted): {exc!r}"
                        data = {"error": repr(exc), "type": type(exc).__name__}
                        await sink.emit(
                            events.SamplerNote(sink.elapsed(), SAMPLER_NAME, message, data)
                        )
                now = sink.elapsed()
                if sample is not None:
                    last_sample_at = now
                elif not blind_told and now - last_sample_at >= blind_after:
                    blind_told = True
                    message = (
                        f"the proc sampler had no sample of the process tree for "
                        f"{now - last_sample_at:.1f}s (reads that hang or fail, or no thread to "
                        "read in): the run was not being watched"
                    )
                    await sink.emit(events.RuleBroken(now, FailureReason.MONITOR_ERROR, message))
                tick = next_tick(tick, interval, anyio.current_time())
                await anyio.sleep_until(tick)
