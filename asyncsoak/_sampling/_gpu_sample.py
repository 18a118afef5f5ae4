"""The GPU sample and its records: readings placed on their GPUs, processes on the tree (by pid
only), notes said once, degraded and recovered episodes, health faults reported."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
import psutil

from .._contract import BlockingCallTimeout, EventSink, events, run_blocking
from .._process import KernelLogFollower
from ._gpu_find import SAMPLER
from ._gpu_health import GpuHealthWatch, lost_gpu_line
from ._nvidia_smi import (
    APP_FIELDS,
    APPS_QUERY,
    GPU_ATTRIBUTES,
    GPU_QUERY,
    GPU_SAMPLE_FIELDS,
    HEALTH_FIELDS,
    GpuProcess,
    GpuReading,
    SmiParseError,
    is_error_value,
    needs_attention,
    parse_gpu_line,
    parse_process_line,
)
from ._xid import MalformedXidError, parse_xid

#: Per-GPU series fields: the varying figures (static ones, such as the total memory, and the
#: health fields after the ECC counters stay in the samples).
_ATTRIBUTES = tuple(GPU_ATTRIBUTES.values())
SERIES_FIELDS: tuple[str, ...] = tuple(
    name
    for name in _ATTRIBUTES[_ATTRIBUTES.index("utilization_gpu_percent") : -len(HEALTH_FIELDS)]
    if name not in ("memory_total_mib", "clocks_max_sm_mhz", "clock_event_reasons")
)
_ECC_COUNTERS = (
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected_volatile"),
)
#: How far up its parents :func:`outside_tree` follows a process before giving up.
MAX_ANCESTRY = 64


class GpuSample(events.Event):
    """Every GPU and every GPU process of one iteration (``processes`` None when the list could
    not be read); ``source`` is ``"loop"`` or ``"call"``."""

    KIND: ClassVar[str] = "gpu_sample"
    DROPPABLE: ClassVar[bool] = True

    gpus: list[GpuReading]
    processes: list[GpuProcess] | None
    source: str

    def series_points(self) -> events.SeriesPoints:
        points: dict[str, dict[str, float | None]] = {
            f"gpu{g.index}": {name: getattr(g, name) for name in SERIES_FIELDS} for g in self.gpus
        }
        names = ("tree_gpu_memory_mib", "tree_gpu_processes", "other_gpu_memory_mib")
        if self.processes is None:
            points["gpu_tree"] = dict.fromkeys(names)
            return points
        tree = [p.used_gpu_memory_mib or 0.0 for p in self.processes if p.in_tree]
        other = [p.used_gpu_memory_mib or 0.0 for p in self.processes if not p.in_tree]
        points["gpu_tree"] = dict(
            zip(names, (sum(tree), float(len(tree)), sum(other)), strict=True)
        )
        return points

    def summary_labels(self) -> events.SummaryLabels:
        return {
            f"gpu{g.index}": {"throttle_reasons": list(g.clock_event_reasons)}
            for g in self.gpus
            if g.clock_event_reasons is not None
        }


class EccWatch:
    """Volatile ECC error counters per GPU: reports a counter that rose, or is not zero at first."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, str], int] = {}

    def update(self, readings: Sequence[GpuReading]) -> list[tuple[str, dict[str, Any]]]:
        """``(message, data)`` for each counter that rose since the last readings."""
        changes = []
        for r in readings:
            for counter, attr in _ECC_COUNTERS:
                value = getattr(r, attr)
                if value is None:
                    continue
                before = self._last.get((r.index, counter))
                self._last[(r.index, counter)] = value
                if value > (0 if before is None else before):
                    was = "" if before is None else f" (was {before})"
                    data = {"gpu": r.index, "uuid": r.uuid, "bus_id": r.bus_id, "counter": counter}
                    data |= {"before": before, "after": value}
                    changes.append((f"gpu{r.index} {counter} is {value}{was}", data))
        return changes


def _state(pid: int) -> str | None:
    """What /proc says a process is doing ("disk-sleep" for D), None when it is gone."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


def outside_tree(pid: int, tree: Collection[int], proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is proven other work's: found in this PID namespace, with no process of
    ``tree`` among it and its ancestors (a pid not found here, a host's, proves nothing).
    ``stat`` takes none of the locks that can make ``cmdline`` hang."""
    for _ in range(MAX_ANCESTRY):
        if pid in tree:
            return False
        if pid <= 1:
            return True
        try:
            stat = (proc / str(pid) / "stat").read_bytes()
            pid = int(stat.rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _first_fields() -> dict[str, list[str]]:
    return {GPU_QUERY: list(GPU_SAMPLE_FIELDS), APPS_QUERY: list(APP_FIELDS)}


@dataclass(eq=False)
class SampleRecorder:
    """What the GPU sampler keeps between samples, and how it records them."""

    sink: EventSink
    interval: float
    tree_pids: Callable[[], Collection[int]]
    call_timeout: float
    limiter: anyio.CapacityLimiter
    health: GpuHealthWatch
    kernel_log: KernelLogFollower | None
    kernel_log_path: Path | None
    _executable: str = field(default="", init=False)
    _fields: dict[str, list[str]] = field(init=False, default_factory=_first_fields)
    _gpu_lines: int = field(default=1, init=False)
    #: The latest complete process list and when it arrived (monotonic).
    _apps: tuple[float, list[GpuProcess] | None] | None = field(default=None, init=False)
    _degraded_since: float | None = field(default=None, init=False)
    _failures: int = field(default=0, init=False)
    _loop_ends: int = field(default=0, init=False)
    _noted: set[str] = field(init=False, default_factory=set)
    _ecc: EccWatch = field(init=False, default_factory=EccWatch)
    #: Pids proven another's stay so (the tree's own are in the tree's pids first).
    _other_work_pids: set[int] = field(init=False, default_factory=set)

    async def _parse_gpus(self, lines: list[str]) -> list[GpuReading]:
        readings = []
        for line in lines:
            try:
                readings.append(parse_gpu_line(line, self._fields[GPU_QUERY])[1])
            except SmiParseError as exc:
                await self._unparsable(exc)
        return readings

    async def _parse_processes(self, lines: list[str]) -> list[GpuProcess] | None:
        """The processes of one iteration; None when a line could not be read."""
        try:
            return [parse_process_line(line, self._fields[APPS_QUERY])[1] for line in lines]
        except SmiParseError as exc:
            await self._unparsable(exc)
            return None

    async def _unparsable(self, exc: SmiParseError) -> None:
        self.sink.counters.sampler_errors += 1
        await self._note(f"unreadable nvidia-smi output: {exc}", once="unparsable")

    async def _emit(
        self,
        readings: list[GpuReading],
        processes: list[GpuProcess] | None,
        source: str,
        whole: bool,
    ) -> None:
        """One sample; ``whole``: every row of the iteration could be read (a GPU missing
        from it is then missing from nvidia-smi's list, not from what could be parsed).  Each
        process is placed on its GPU by the GPU's UUID or bus id."""
        health = self.health
        readings = health.identify(readings)
        if processes:
            # No trip to a worker thread: waking one costs more than this call (see
            # benchmarks/monitor_overhead.py), and this runs at every sample.
            tree = set(self.tree_pids())
            processes = [
                replace(
                    p, in_tree=p.pid in tree, gpu_index=health.gpu_index(p.gpu_uuid, p.gpu_bus_id)
                )
                for p in processes
            ]
            if tree and health.counts_other_work:
                health.others_on(self._other_work_gpus(processes, tree))
        await self._recovered()
        await self._note_readings(readings, processes)
        health.tree_on(
            p.gpu_index for p in processes or () if p.in_tree and p.gpu_index is not None
        )
        t = self.sink.elapsed()
        self.sink.offer(GpuSample(t=t, gpus=readings, processes=processes, source=source))
        try:
            faults = health.readings(t, readings, whole=whole)
        except Exception as exc:  # a rule's bug: said once, and the GPUs are still sampled
            error = f"{type(exc).__name__}: {exc}"
            await self._note(f"the GPU health rules raised {error}", {"error": error}, once=error)
            return
        await self._report(faults)

    def _other_work_gpus(self, processes: list[GpuProcess], tree: set[int]) -> set[int]:
        """The GPUs on which every listed process is proven other work's."""
        others: set[int] = set()
        ours_or_unknown: set[int] = set()
        for p in processes:
            if p.gpu_index is None:
                continue
            if not p.in_tree and (p.pid in self._other_work_pids or outside_tree(p.pid, tree)):
                self._other_work_pids.add(p.pid)
                others.add(p.gpu_index)
            else:
                ours_or_unknown.add(p.gpu_index)
        return others - ours_or_unknown

    async def _note_readings(
        self, readings: list[GpuReading], processes: list[GpuProcess] | None
    ) -> None:
        for r in readings:
            for name, message in r.errors.items():
                if is_error_value(message):
                    self.sink.counters.sampler_errors += 1
                await self._note(
                    f"gpu{r.index} {name}: {message} (recorded as null)",
                    once=f"value {r.index} {name} {message}",
                )
            for reason in filter(needs_attention, r.clock_event_reasons or ()):
                data = {"gpu": r.index, "uuid": r.uuid, "bus_id": r.bus_id, "reason": reason}
                message = f"gpu{r.index} clocks held back: {reason}"
                await self._note(message, data, once=f"reason {r.index} {reason}")
        for message, data in self._ecc.update(readings):
            await self._note(message, data)
        outside = sorted({p.pid for p in processes or () if not p.in_tree})
        if outside:
            await self._note(
                "GPU processes outside the supervised tree (other work on the GPU, or pids "
                "from another PID namespace, which cannot be matched): recorded as not in "
                "the tree",
                {"pids": outside},
                once="outside",
            )

    async def _without_lost(self, lines: list[str]) -> list[str]:
        """``lines`` less those saying a GPU cannot be reached, each reported as lost."""
        kept = []
        for line in lines:
            lost = lost_gpu_line(line)
            if lost is None:
                kept.append(line)
            else:
                await self._report(self.health.lost_line(self.sink.elapsed(), *lost))
        return kept

    async def _read_kernel_log(self) -> None:
        """The Xid errors logged since the previous tick, on this soak's GPUs."""
        if self.kernel_log is None or not self.health.known:
            return
        for kernel_seconds, message in self.kernel_log.new_records():
            try:
                record = parse_xid(message, kernel_seconds)
            except MalformedXidError as exc:
                await self._note(str(exc), once="malformed xid")
                continue
            if record is None:
                continue
            fault = self.health.xid(self.sink.elapsed(), record)
            if fault is not None:
                await self._report([fault])
            else:
                # Said once for all such addresses: a machine's other GPUs (or another
                # container's) may log many.
                await self._note(
                    f"an Xid for PCI {':'.join(f'{n:x}' for n in record.pci)}, which is no GPU "
                    "nvidia-smi lists here: ignored (and any others like it)",
                    once="xid elsewhere",
                )

    async def _report(self, faults: list[events.GpuFault]) -> None:
        """Record each fault: the run's GPU fault rule fails the run or warns."""
        for fault in faults:
            await self.sink.emit(fault)

    async def _note(
        self, message: str, data: dict[str, Any] | None = None, *, once: str = ""
    ) -> None:
        if once in self._noted:
            return
        if once:
            self._noted.add(once)
        note = events.SamplerNote(self.sink.elapsed(), SAMPLER, message, data or {})
        await self.sink.emit(note)

    async def _abandoned(self, pid: int) -> None:
        try:
            state = await run_blocking(
                _state, pid, timeout=self.call_timeout, what="reading a process state"
            )
        except BlockingCallTimeout:
            state = "unknown"
        await self._note(
            f"nvidia-smi (pid {pid}) did not exit after SIGKILL (state {state}); abandoned",
            {"pid": pid, "state": state},
        )

    async def _failed(self, message: str) -> None:
        self._failures += 1
        self.sink.counters.sampler_errors += 1
        if self._degraded_since is None:
            self._degraded_since = anyio.current_time()
            await self.sink.emit(events.SamplerDegraded(self.sink.elapsed(), SAMPLER, message))

    async def _recovered(self) -> None:
        self._failures = 0
        if self._degraded_since is not None:
            gap = anyio.current_time() - self._degraded_since
            self._degraded_since = None
            message = f"nvidia-smi answers again after {gap:.1f} s"
            await self.sink.emit(events.SamplerRecovered(self.sink.elapsed(), SAMPLER, message))
