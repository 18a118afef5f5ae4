"""The GPU sampler task: ``nvidia-smi`` through long-lived loop processes, every read bounded.

How it samples:

1. One call of each query (GPU, compute apps) first.  It shows whether there is an
   ``nvidia-smi`` and a GPU at all (if not: one note, and the task returns; that is not a
   failure), how many lines one iteration has, and which fields this ``nvidia-smi`` knows.
2. Then one ``-lms`` loop process per query, read line by line through pipes: on an H200 that
   costs about 0.5 ms of CPU per sample against 44 ms for spawning both queries each time.
3. A loop that ends: one call per sample, and the loops are tried again later (the wait
   doubles each time they end again).

The two loops are not alike.  The compute-apps loop prints nothing at all while no process
holds a GPU, so its silence is normal and says nothing about ``nvidia-smi``'s health; its
lines of one iteration share a timestamp, which is how they are grouped.  The GPU loop prints
every period whatever happens: when it is silent for ``interval + call_timeout``, ``nvidia-smi``
is hung (a GPU fallen off the bus, a wedged driver).  Then the sampler is degraded (one
``SamplerDegraded`` per episode), the loops are killed (a process that will not die is
abandoned and noted, never awaited), calls are retried with a growing backoff, and a
``SamplerRecovered`` follows when data flows again.  None of this delays the soak's other
tasks or its shutdown: every wait is bounded, and the stop path is shielded and bounded.

Per-process GPU memory is matched to the supervised tree by pid only.  Inside a container
without the host PID namespace, ``nvidia-smi`` reports host pids that match nothing here: those
processes are recorded as not in the tree, never guessed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
import psutil
from anyio.abc import Process

from .._contract import (
    BlockingCallTimeout,
    Event,
    EventSink,
    GpuFault,
    SamplerDegraded,
    SamplerNote,
    SamplerRecovered,
    SeriesPoints,
    SummaryLabels,
    TickSignal,
    WarningEvent,
    next_tick,
    require_positive,
    run_blocking,
)
from .._process import CommandResult, KernelLogFollower, open_command, run_command, stop_process
from ._gpu_health import (
    GpuHealthWatch,
    MalformedXidError,
    VisibleDevices,
    lost_gpu_line,
    outside_tree,
    parse_xid,
)
from ._nvidia_smi import (
    APP_FIELDS,
    APPS_QUERY,
    FIELD_FALLBACKS,
    GPU_QUERY,
    GPU_SAMPLE_FIELDS,
    GpuProcess,
    GpuReading,
    SmiParseError,
    data_lines,
    is_error_value,
    line_gpu_index,
    line_timestamp,
    needs_attention,
    no_devices,
    parse_gpu_line,
    parse_process_line,
    query_args,
    rejected_field,
    replace_rejected,
)

SAMPLER = "gpu"
#: After the loops end, how long (in sample intervals) to use calls before trying them again;
#: doubled each time they end again, up to ``MAX_LOOP_RETRY`` seconds.
LOOP_RETRY_INTERVALS = 10
MAX_LOOP_RETRY = 600.0
#: Longest wait between two attempts while ``nvidia-smi`` fails (unless the interval is longer).
MAX_BACKOFF = 60.0
#: How late the process loop's next iteration may be (scheduling, a busy machine) before its
#: silence is taken to mean that no process holds a GPU any more.
APPS_SLACK = 0.5
#: Bound on recording a note while the sampler is being cancelled.
NOTE_TIMEOUT_SECONDS = 1.0
#: A line longer than this is not ``nvidia-smi`` CSV.
MAX_LINE = 65536
#: Where the kernel logs Xid errors.
KMSG = Path("/dev/kmsg")

#: Called with each GPU fault once it is recorded (the supervisor's verdict on it).
FaultHandler = Callable[[GpuFault], Awaitable[None]]

#: Per-GPU series fields (static ones, such as the total memory, stay in the samples).
SERIES_FIELDS: tuple[str, ...] = (
    "utilization_gpu_percent",
    "utilization_memory_percent",
    "memory_used_mib",
    "memory_free_mib",
    "temperature_gpu_c",
    "temperature_memory_c",
    "power_draw_w",
    "power_limit_w",
    "clocks_sm_mhz",
    "clocks_mem_mhz",
    "fan_speed_percent",
    "ecc_uncorrected_volatile",
    "ecc_corrected_volatile",
)
_ECC_COUNTERS = (
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected_volatile"),
)


@dataclass(frozen=True, slots=True)
class GpuSample(Event):
    """Every GPU and every GPU process of one iteration.

    ``processes`` is None when the process list could not be read this time; ``source`` is
    ``"loop"`` or ``"call"``.
    """

    KIND: ClassVar[str] = "gpu_sample"
    DROPPABLE: ClassVar[bool] = True

    gpus: list[GpuReading]
    processes: list[GpuProcess] | None
    source: str

    def series_points(self) -> SeriesPoints:
        points: dict[str, dict[str, float | None]] = {
            f"gpu{g.index}": {name: getattr(g, name) for name in SERIES_FIELDS} for g in self.gpus
        }
        if self.processes is None:
            points["gpu_tree"] = {
                "tree_gpu_memory_mib": None,
                "tree_gpu_processes": None,
                "other_gpu_memory_mib": None,
            }
        else:
            tree = [p for p in self.processes if p.in_tree]
            other = [p for p in self.processes if not p.in_tree]
            points["gpu_tree"] = {
                "tree_gpu_memory_mib": sum(p.used_gpu_memory_mib or 0.0 for p in tree),
                "tree_gpu_processes": float(len(tree)),
                "other_gpu_memory_mib": sum(p.used_gpu_memory_mib or 0.0 for p in other),
            }
        return points

    def summary_labels(self) -> SummaryLabels:
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
        for reading in readings:
            for counter, attr in _ECC_COUNTERS:
                value = getattr(reading, attr)
                if value is None:
                    continue
                before = self._last.get((reading.index, counter))
                self._last[(reading.index, counter)] = value
                if (before is None and value > 0) or (before is not None and value > before):
                    was = "" if before is None else f" (was {before})"
                    changes.append(
                        (
                            f"gpu{reading.index} {counter} is {value}{was}",
                            {
                                "gpu": reading.index,
                                "counter": counter,
                                "before": before,
                                "after": value,
                            },
                        )
                    )
        return changes


@dataclass(frozen=True, slots=True)
class _LoopEnd:
    hung: bool
    message: str


def _state(pid: int) -> str | None:
    """What /proc says a process is doing ("disk-sleep" for D), None when it is gone."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


class _LineReader:
    """One ``nvidia-smi -lms`` process, its output taken at the soak's ticks.

    The loop prints into a pipe of asyncsoak's own whose read end is non-blocking; at each tick
    the sampler takes the lines that came since the previous one (an iteration per period), so
    the loop's lines never wake the event loop on their own: the tick that wakes it for the
    proc sampler serves both.
    """

    def __init__(self, process: Process, fd: int) -> None:
        self.process = process
        self._fd = fd
        self._buffer = b""
        #: The lines of the iteration being gathered (kept across ticks).
        self.group: list[str] = []
        #: The pipe reached its end: the loop process has exited.
        self.ended = False

    def lines(self) -> list[str]:
        """The whole lines printed since the previous call (a pipe read never blocks)."""
        for _ in range(_MAX_READS_PER_TICK):
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                self.ended = True
                break
            self._buffer += chunk
        *whole, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_LINE:
            raise SmiParseError(f"a line longer than {MAX_LINE} bytes")
        return [line.decode(errors="replace") for line in whole]

    def close(self) -> None:
        os.close(self._fd)

    async def exit_status(self) -> str:
        with anyio.move_on_after(1.0):
            await self.process.wait()
        code = self.process.returncode
        return "still running" if code is None else f"exit status {code}"


#: Reads of one loop's pipe at most per tick (64 KiB each): a loop printing without end is
#: read a bounded amount at a time.
_MAX_READS_PER_TICK = 16


async def _open_loop(argv: Sequence[str]) -> _LineReader:
    """Start a loop process printing into a non-blocking pipe of our own."""
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        process = await open_command(argv, stdout=write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child holds its copy: the pipe ends when the loop does
    return _LineReader(process, read_fd)


async def run_gpu_sampler(
    sink: EventSink,
    *,
    interval: float,
    tree_pids: Callable[[], Collection[int]],
    nvidia_smi: str = "nvidia-smi",
    call_timeout: float = 10.0,
    limiter: anyio.CapacityLimiter | None = None,
    ticks: TickSignal | None = None,
    visible_devices: str | None = None,
    on_fault: FaultHandler | None = None,
    kmsg: Path | None = KMSG,
) -> None:
    """Offer a :class:`GpuSample` every ``interval`` seconds until cancelled.

    ``tree_pids`` gives the supervised tree's current pids; it is called on the event loop,
    only when a process holds GPU memory, so it must not block (``run_soak`` passes the proc
    sampler's latest tree).  Blocking reads go through ``limiter`` (a private one-thread
    limiter when None).  ``call_timeout`` bounds every ``nvidia-smi`` call, and how late a
    loop's line may be.  With ``ticks`` (the proc sampler's), the loops' output is taken each
    time a proc sample has been handled, on the same wake-up.  Returns by itself only when
    there is no GPU data to be had (no ``nvidia-smi``, or no GPU): that is recorded in a note,
    not raised.  The sampler owns ``sink`` (give it a clone) and closes it.

    GPU health (see ``_gpu_health``): each fault is recorded as a :class:`GpuFault`, then passed
    to ``on_fault``.  ``visible_devices`` is the command's ``CUDA_VISIBLE_DEVICES`` (None:
    unset); ``kmsg`` the kernel log followed for Xid errors from now on (None: not read).
    """
    async with sink:
        require_positive("interval", interval)
        require_positive("call_timeout", call_timeout)
        sampler = _GpuSampler(
            sink,
            interval=interval,
            tree_pids=tree_pids,
            call_timeout=call_timeout,
            limiter=limiter if limiter is not None else anyio.CapacityLimiter(1),
            ticks=ticks,
            health=GpuHealthWatch(VisibleDevices.parse(visible_devices)),
            on_fault=on_fault,
        )
        # Opened first: an Xid logged while nvidia-smi is first asked is not missed.  On the
        # event loop, as the loops' pipes are read: /dev/kmsg is a character device whose
        # open and non-blocking reads never wait on a disk.
        kernel_log = None if kmsg is None else KernelLogFollower.open(kmsg)
        sampler.kernel_log = kernel_log
        sampler.kernel_log_path = kmsg
        try:
            await sampler.run(nvidia_smi)
        finally:
            if kernel_log is not None:
                kernel_log.close()


class _GpuSampler:
    def __init__(
        self,
        sink: EventSink,
        *,
        interval: float,
        tree_pids: Callable[[], Collection[int]],
        call_timeout: float,
        limiter: anyio.CapacityLimiter,
        ticks: TickSignal | None = None,
        health: GpuHealthWatch | None = None,
        on_fault: FaultHandler | None = None,
    ) -> None:
        self._sink = sink
        self._ticks = ticks
        self._interval = interval
        self._tree_pids = tree_pids
        self._call_timeout = call_timeout
        self._limiter = limiter
        self._executable = ""
        self._fields = {GPU_QUERY: list(GPU_SAMPLE_FIELDS), APPS_QUERY: list(APP_FIELDS)}
        self._gpu_lines = 1
        # The latest complete process list and when it arrived (monotonic).
        self._apps: tuple[float, list[GpuProcess] | None] | None = None
        self._degraded_since: float | None = None
        self._failures = 0
        self._loop_ends = 0
        self._noted: set[str] = set()
        self._ecc = EccWatch()
        self._other_work_pids: set[int] = set()
        self._health = health if health is not None else GpuHealthWatch(VisibleDevices.parse(None))
        self._on_fault = on_fault
        self.kernel_log: KernelLogFollower | None = None
        self.kernel_log_path: Path | None = None

    # -- the schedule ----------------------------------------------------------------------

    async def run(self, nvidia_smi: str) -> None:
        executable = await self._find(nvidia_smi)
        if executable is None:
            return
        self._executable = executable
        if not await self._first_sample():
            return
        if self.kernel_log is None and self.kernel_log_path is not None:
            await self._sink.emit(
                WarningEvent(
                    t=self._sink.elapsed(),
                    message=f"the kernel log ({self.kernel_log_path}) cannot be read here: "
                    "GPU Xid errors are not watched (run as root, or with CAP_SYSLOG)",
                )
            )
        await self._read_kernel_log()
        loop_at = anyio.current_time()
        next_call = loop_at + self._interval
        while True:
            if self._failures == 0 and anyio.current_time() >= loop_at:
                loop_at, next_call = await self._loop_until_it_ends()
            else:
                next_call = await self._sample_by_call_at(next_call)

    async def _find(self, nvidia_smi: str) -> str | None:
        """The path of ``nvidia_smi``; None (told) where there is none."""
        try:
            executable = await run_blocking(
                shutil.which,
                nvidia_smi,
                timeout=self._call_timeout,
                what=f"looking up {nvidia_smi!r}",
                limiter=self._limiter,
            )
        except BlockingCallTimeout as exc:
            await self._note(f"no GPU data: {exc}", {"nvidia_smi": nvidia_smi})
            return None
        if executable is None:
            await self._note(f"no GPU data: {nvidia_smi!r} not found", {"nvidia_smi": nvidia_smi})
        return executable

    async def _first_sample(self) -> bool:
        """Call until a first sample comes, backing off after each failure; False where
        there is no GPU."""
        while True:
            first = await self._sample_by_call(first=True)
            if first is None:
                return False
            if first:
                return True
            await anyio.sleep(self._backoff())

    async def _loop_until_it_ends(self) -> tuple[float, float]:
        """Sample by the nvidia-smi loops until they end; (when to try them again, when the
        next call is due meanwhile).  Loops that keep ending soon are tried ever later."""
        started = anyio.current_time()
        end = await self._run_loops()
        now = anyio.current_time()
        self._loop_ends = 1 if now - started >= MAX_LOOP_RETRY else self._loop_ends + 1
        retry = min(
            MAX_LOOP_RETRY,
            LOOP_RETRY_INTERVALS * self._interval * 2.0 ** (self._loop_ends - 1),
        )
        if not end.hung:
            await self._note(
                f"{end.message}; one nvidia-smi call per sample until the loop is "
                f"tried again in {retry:.3g} s"
            )
        return now + retry, now + (self._backoff() if end.hung else self._interval)

    async def _sample_by_call_at(self, due: float) -> float:
        """One sample by one call of each query at ``due``; when the next one is due."""
        await anyio.sleep(max(0.0, due - anyio.current_time()))
        sampled = await self._sample_by_call()
        await self._read_kernel_log()
        if sampled:
            # A fixed schedule, not "interval after the call", without catching up bursts.
            return max(due + self._interval, anyio.current_time())
        return anyio.current_time() + self._backoff()

    def _backoff(self) -> float:
        ceiling = max(MAX_BACKOFF, self._interval)
        return min(ceiling, self._interval * 2.0 ** min(self._failures, 16))

    # -- one call per sample -----------------------------------------------------------------

    async def _sample_by_call(self, first: bool = False) -> bool | None:
        """One sample from one call of each query: True, False (failed), None (no GPU here)."""
        gpu = await self._query(GPU_QUERY)
        if first and (gpu.missing or no_devices(gpu)):
            await self._note(f"no GPU data: {gpu.describe()}", {"nvidia_smi": self._executable})
            return None
        every_line = data_lines(gpu.output, self._fields[GPU_QUERY])
        lines = await self._without_lost(every_line)
        if no_devices(gpu) and self._health.known:
            await self._report(self._health.all_lost(self._sink.elapsed(), gpu.describe()))
        # A GPU lost among others: nvidia-smi fails, yet the others' rows are good.
        if not gpu.ok and not (lines and len(lines) < len(every_line)):
            await self._failed(f"nvidia-smi failed: {gpu.describe()}")
            return False
        readings = await self._parse_gpus(lines)
        if not readings:
            await self._failed(f"no GPU reading in nvidia-smi's output: {gpu.describe()}")
            return False
        self._gpu_lines = len(lines)
        apps = await self._query(APPS_QUERY)
        processes = None
        if apps.ok:
            processes = await self._parse_processes(
                data_lines(apps.output, self._fields[APPS_QUERY])
            )
            self._apps = (anyio.current_time(), processes)
        else:
            self._sink.counters.sampler_errors += 1
            await self._note(
                f"nvidia-smi could not list GPU processes: {apps.describe()}", once="apps-call"
            )
        await self._emit(readings, processes, "call", whole=len(readings) == len(lines))
        return True

    async def _query(self, query: str) -> CommandResult:
        """One call of a query; a field this nvidia-smi rejects is dropped (or renamed)."""
        while True:
            fields = self._fields[query]
            result = await run_command(
                [self._executable, *query_args(query, fields)], time_limit=self._call_timeout
            )
            if result.abandoned_pid is not None:
                await self._abandoned(result.abandoned_pid)
            rejected = rejected_field(result)
            narrower = None if rejected is None else replace_rejected(fields, rejected)
            if narrower is None:
                return result
            self._fields[query] = narrower
            fallback = FIELD_FALLBACKS.get(rejected or "")
            instead = f"asking for {fallback!r} instead" if fallback else "it stays null"
            await self._note(f"nvidia-smi does not know the field {rejected!r}; {instead}")

    # -- loops ---------------------------------------------------------------------------------

    async def _run_loops(self) -> _LoopEnd:
        """Sample from the two loop processes until one ends or the GPU loop hangs.

        Their output is taken at the soak's ticks (the proc sampler's grid), the process
        list first, so that each GPU sample carries the freshest one.
        """
        loop_ms = str(max(1, round(self._interval * 1000)))
        readers: list[_LineReader] = []
        try:
            for query in (GPU_QUERY, APPS_QUERY):
                argv = [self._executable, *query_args(query, self._fields[query]), "-lms", loop_ms]
                try:
                    readers.append(await _open_loop(argv))
                except OSError as exc:
                    return _LoopEnd(False, f"could not start nvidia-smi: {exc.strerror or exc}")
            gpu, apps = readers
            heard = anyio.current_time()
            deadline = self._call_timeout  # the first line may take as long as a call
            tick = self._sink.clock.start
            while True:
                # On the proc sampler's wake-up when it runs (a tick missed twice, a degraded
                # proc sampler, falls back to the grid), else on the grid.
                if self._ticks is None or not await self._ticks.wait(2 * self._interval):
                    tick = next_tick(tick, self._interval, anyio.current_time())
                    await anyio.sleep_until(tick)
                await self._read_kernel_log()
                end = await self._take_apps(apps)
                if end is not None:
                    return end
                try:
                    got = await self._take_gpus(gpu)
                except SmiParseError as exc:
                    return _LoopEnd(False, f"the nvidia-smi GPU loop printed {exc}")
                now = anyio.current_time()
                if got:
                    heard = now
                    deadline = self._interval + self._call_timeout
                elif gpu.ended:
                    status = await gpu.exit_status()
                    return _LoopEnd(False, f"the nvidia-smi GPU loop ended ({status})")
                elif now - heard > deadline:
                    await self._failed(
                        f"nvidia-smi printed nothing for {deadline:.3g} s; stopping it"
                    )
                    return _LoopEnd(True, "hung")
        finally:
            await self._stop_loops(readers)

    async def _stop_loops(self, readers: list[_LineReader]) -> None:
        with anyio.CancelScope(shield=True):
            stuck: list[int] = []

            async def stop(reader: _LineReader) -> None:
                if not await stop_process(reader.process):
                    stuck.append(reader.process.pid)
                reader.close()

            async with anyio.create_task_group() as tg:
                for reader in readers:
                    tg.start_soon(stop, reader)
            for pid in stuck:
                with anyio.move_on_after(NOTE_TIMEOUT_SECONDS):
                    await self._abandoned(pid)

    async def _take_gpus(self, reader: _LineReader) -> bool:
        """The GPU loop's lines since the previous tick, each whole iteration emitted; whether
        any line came."""
        lines = reader.lines()
        for line in await self._without_lost(lines):
            if not line.strip():
                continue
            group = reader.group
            if group and self._starts_iteration(line, group):
                await self._gpu_iteration(group)
                group = reader.group = []
            group.append(line)
            if len(group) >= self._gpu_lines:
                await self._gpu_iteration(group)
                reader.group = []
        return bool(lines)

    def _starts_iteration(self, line: str, group: list[str]) -> bool:
        """Whether a GPU row begins the loop's next iteration.  nvidia-smi lists the GPUs in
        index order, and may stamp each row as it reads it (the stamps of one iteration then
        differ by a millisecond or so): a row whose index is not above the last readable one
        of ``group`` begins one.  A row whose index cannot be read stays in ``group`` (which
        is then not whole: see :meth:`_emit`)."""
        fields = self._fields[GPU_QUERY]
        index = line_gpu_index(line, fields)
        if index is None:
            return False
        for previous in reversed(group):
            before = line_gpu_index(previous, fields)
            if before is not None:
                return index <= before
        return False

    async def _take_apps(self, reader: _LineReader) -> _LoopEnd | None:
        """The process loop's lines since the previous tick; its end, if it ended.

        Silence is normal here (no process holds a GPU): no deadline.  nvidia-smi prints an
        iteration at once, so what has come is taken as whole; a straggler of the same
        iteration (same timestamp) at the next tick extends it and it is read again.
        """
        try:
            lines = [line for line in reader.lines() if line.strip()]
        except SmiParseError as exc:
            return _LoopEnd(False, f"the nvidia-smi process loop printed {exc}")
        for line in lines:
            if reader.group and line_timestamp(line) != line_timestamp(reader.group[0]):
                reader.group = []
            reader.group.append(line)
        if lines:
            await self._apps_iteration(reader.group)
        elif reader.ended:
            status = await reader.exit_status()
            return _LoopEnd(False, f"the nvidia-smi process loop ended ({status})")
        return None

    async def _gpu_iteration(self, lines: list[str]) -> None:
        readings = await self._parse_gpus(lines)
        if not readings:
            await self._failed(f"no GPU reading in nvidia-smi's output: {lines[0].strip()!r}")
            return
        await self._emit(
            readings, self._current_processes(), "loop", whole=len(readings) == len(lines)
        )

    async def _apps_iteration(self, lines: list[str]) -> None:
        self._apps = (anyio.current_time(), await self._parse_processes(lines))

    def _current_processes(self) -> list[GpuProcess] | None:
        """The latest process list, or none when the process loop has been silent a while."""
        if self._apps is None:
            return []
        at, processes = self._apps
        if anyio.current_time() - at > self._interval + APPS_SLACK:
            return []
        return processes

    # -- readings ------------------------------------------------------------------------------

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
        processes = []
        for line in lines:
            try:
                processes.append(parse_process_line(line, self._fields[APPS_QUERY])[1])
            except SmiParseError as exc:
                await self._unparsable(exc)
                return None
        return processes

    async def _unparsable(self, exc: SmiParseError) -> None:
        self._sink.counters.sampler_errors += 1
        await self._note(f"unreadable nvidia-smi output: {exc}", once="unparsable")

    async def _emit(
        self,
        readings: list[GpuReading],
        processes: list[GpuProcess] | None,
        source: str,
        *,
        whole: bool,
    ) -> None:
        """One sample; ``whole``: every row of the iteration could be read (a GPU missing
        from it is then missing from nvidia-smi's list, not from what could be parsed)."""
        if processes:
            # No trip to a worker thread: waking one costs more than this call (see
            # benchmarks/monitor_overhead.py), and this runs at every sample.
            tree = set(self._tree_pids())
            index_of: dict[str | None, int] = {r.uuid: r.index for r in readings if r.uuid}
            processes = [
                replace(p, in_tree=p.pid in tree, gpu_index=index_of.get(p.gpu_uuid))
                for p in processes
            ]
            if tree and self._health.counts_other_work:
                self._health.others_on(self._other_work_gpus(processes, tree))
        await self._recovered()
        await self._note_readings(readings, processes)
        self._health.tree_on(
            p.gpu_index for p in processes or () if p.in_tree and p.gpu_index is not None
        )
        t = self._sink.elapsed()
        self._sink.offer(GpuSample(t=t, gpus=readings, processes=processes, source=source))
        await self._report(self._health.readings(t, readings, whole=whole))

    def _other_work_gpus(self, processes: list[GpuProcess], tree: set[int]) -> set[int]:
        """The GPUs on which every listed process is proven other work's (see
        ``_gpu_health``)."""
        others: set[int] = set()
        ours_or_unknown: set[int] = set()
        for process in processes:
            if process.gpu_index is None:
                continue
            if not process.in_tree and self._other_work(process.pid, tree):
                others.add(process.gpu_index)
            else:
                ours_or_unknown.add(process.gpu_index)
        return others - ours_or_unknown

    def _other_work(self, pid: int, tree: set[int]) -> bool:
        if pid in self._other_work_pids:
            return True
        if outside_tree(pid, tree):
            # Kept: a pid proven another's stays so (the tree's own are in ``tree`` first).
            self._other_work_pids.add(pid)
            return True
        return False

    async def _note_readings(
        self, readings: list[GpuReading], processes: list[GpuProcess] | None
    ) -> None:
        for reading in readings:
            for name, message in reading.errors.items():
                if is_error_value(message):
                    self._sink.counters.sampler_errors += 1
                await self._note(
                    f"gpu{reading.index} {name}: {message} (recorded as null)",
                    once=f"value {reading.index} {name} {message}",
                )
            for reason in reading.clock_event_reasons or ():
                if needs_attention(reason):
                    await self._note(
                        f"gpu{reading.index} clocks held back: {reason}",
                        {"gpu": reading.index, "reason": reason},
                        once=f"reason {reading.index} {reason}",
                    )
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

    # -- health --------------------------------------------------------------------------------

    async def _without_lost(self, lines: list[str]) -> list[str]:
        """``lines`` less those saying a GPU cannot be reached, each reported as lost."""
        kept = []
        for line in lines:
            lost = lost_gpu_line(line)
            if lost is None:
                kept.append(line)
            else:
                await self._report(self._health.lost_line(self._sink.elapsed(), *lost))
        return kept

    async def _read_kernel_log(self) -> None:
        """The Xid errors logged since the previous tick, on this soak's GPUs."""
        if self.kernel_log is None or not self._health.known:
            return
        for kernel_seconds, message in self.kernel_log.new_records():
            try:
                record = parse_xid(message, kernel_seconds)
            except MalformedXidError as exc:
                await self._note(str(exc), once="malformed xid")
                continue
            if record is None:
                continue
            fault = self._health.xid(self._sink.elapsed(), record)
            if fault is None:
                # Said once for all such addresses: a machine's other GPUs (or another
                # container's) may log many.
                await self._note(
                    f"an Xid for PCI {':'.join(f'{n:x}' for n in record.pci)}, which is no GPU "
                    "nvidia-smi lists here: ignored (and any others like it)",
                    once="xid elsewhere",
                )
                continue
            await self._report([fault])

    async def _report(self, faults: list[GpuFault]) -> None:
        """Record each fault; one that fails the run goes to ``on_fault``, the others are
        warnings."""
        for fault in faults:
            await self._sink.emit(fault)
            if fault.fails and fault.used and self._on_fault is not None:
                await self._on_fault(fault)
                continue
            message = fault.message
            if fault.fails and not fault.used:
                message += " (on a GPU this run does not use)"
            await self._sink.emit(WarningEvent(t=self._sink.elapsed(), message=message))

    # -- records -------------------------------------------------------------------------------

    async def _note(
        self, message: str, data: dict[str, Any] | None = None, *, once: str = ""
    ) -> None:
        if once:
            if once in self._noted:
                return
            self._noted.add(once)
        await self._sink.emit(
            SamplerNote(t=self._sink.elapsed(), sampler=SAMPLER, message=message, data=data or {})
        )

    async def _abandoned(self, pid: int) -> None:
        try:
            state = await run_blocking(
                _state, pid, timeout=self._call_timeout, what="reading a process state"
            )
        except BlockingCallTimeout:
            state = "unknown"
        await self._note(
            f"nvidia-smi (pid {pid}) did not exit after SIGKILL (state {state}); abandoned",
            {"pid": pid, "state": state},
        )

    async def _failed(self, message: str) -> None:
        self._failures += 1
        self._sink.counters.sampler_errors += 1
        if self._degraded_since is None:
            self._degraded_since = anyio.current_time()
            await self._sink.emit(
                SamplerDegraded(t=self._sink.elapsed(), sampler=SAMPLER, message=message)
            )

    async def _recovered(self) -> None:
        self._failures = 0
        if self._degraded_since is not None:
            gap = anyio.current_time() - self._degraded_since
            self._degraded_since = None
            await self._sink.emit(
                SamplerRecovered(
                    t=self._sink.elapsed(),
                    sampler=SAMPLER,
                    message=f"nvidia-smi answers again after {gap:.1f} s",
                )
            )
