"""The GPU sampler task: ``nvidia-smi`` through long-lived loop processes, every read bounded,
one call per sample while the loops keep ending (docs/architecture.md)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import anyio
from anyio.abc import Process

from .._contract import EventSink, events, next_tick, require_positive
from .._process import CommandResult, KernelLogFollower, open_command, run_command, stop_process
from ._gpu_find import find_nvidia_smi
from ._gpu_health import GpuHealthWatch, VisibleDevices
from ._gpu_sample import SampleRecorder
from ._nvidia_smi import (
    APPS_QUERY,
    FIELD_FALLBACKS,
    GPU_QUERY,
    GpuProcess,
    SmiParseError,
    data_lines,
    line_gpu_index,
    line_timestamp,
    no_devices,
    query_args,
    rejected_field,
    replace_rejected,
)

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


class _LineReader:
    """One ``nvidia-smi -lms`` process printing into a non-blocking pipe of our own, read at
    the soak's ticks (its lines never wake the event loop on their own)."""

    def __init__(self, process: Process, fd: int) -> None:
        self.process = process
        self._fd = fd
        self._buffer = b""
        self.group: list[str] = []  # the lines of the iteration being gathered
        self.ended = False  # the pipe reached its end: the loop process has exited

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
    visible_devices: str | None = None,
    kmsg: Path | None = KMSG,
) -> None:
    """Offer a :class:`GpuSample` every ``interval`` seconds, and each GPU fault, until cancelled
    (or, with a note, where there is no GPU data).  ``tree_pids`` must not block; ``kmsg`` is
    followed for Xid errors.  The sampler owns ``sink`` (give it a clone) and closes it."""
    async with sink:
        require_positive("interval", interval)
        require_positive("call_timeout", call_timeout)
        # Opened first: an Xid logged while nvidia-smi is first asked is not missed.  On the
        # event loop, as the loops' pipes are read: /dev/kmsg is a character device whose
        # open and non-blocking reads never wait on a disk.
        kernel_log = None if kmsg is None else KernelLogFollower.open(kmsg)
        try:
            await _GpuSampler(
                sink,
                interval=interval,
                tree_pids=tree_pids,
                call_timeout=call_timeout,
                limiter=limiter if limiter is not None else anyio.CapacityLimiter(1),
                health=GpuHealthWatch(VisibleDevices.parse(visible_devices)),
                kernel_log=kernel_log,
                kernel_log_path=kmsg,
            ).run(nvidia_smi)
        finally:
            if kernel_log is not None:
                kernel_log.close()


class _GpuSampler(SampleRecorder):
    async def run(self, nvidia_smi: str) -> None:
        executable = await find_nvidia_smi(
            self.sink, nvidia_smi, call_timeout=self.call_timeout, limiter=self.limiter
        )
        if executable is None:
            return
        self._executable = executable
        if not await self._first_sample():
            return
        if self.kernel_log is None and self.kernel_log_path is not None:
            message = (
                f"the kernel log ({self.kernel_log_path}) cannot be read here: GPU Xid errors "
                "are not watched (run as root, or with CAP_SYSLOG)"
            )
            await self.sink.emit(events.WarningEvent(t=self.sink.elapsed(), message=message))
        await self._read_kernel_log()
        loop_at = anyio.current_time()
        next_call = loop_at + self.interval
        while True:
            if self._failures == 0 and anyio.current_time() >= loop_at:
                loop_at, next_call = await self._loop_until_it_ends()
            else:
                next_call = await self._sample_by_call_at(next_call)

    async def _first_sample(self) -> bool:
        """Call until a first sample comes, backing off; False where there is no GPU."""
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
            MAX_LOOP_RETRY, LOOP_RETRY_INTERVALS * self.interval * 2 ** (self._loop_ends - 1)
        )
        if end is not None:
            await self._note(
                f"{end}; one nvidia-smi call per sample until the loop is "
                f"tried again in {retry:.3g} s"
            )
        return now + retry, now + (self._backoff() if end is None else self.interval)

    async def _sample_by_call_at(self, due: float) -> float:
        """One sample by one call of each query at ``due``; when the next one is due."""
        await anyio.sleep(max(0.0, due - anyio.current_time()))
        sampled = await self._sample_by_call()
        await self._read_kernel_log()
        if sampled:
            # A fixed schedule, not "interval after the call", without catching up bursts.
            return max(due + self.interval, anyio.current_time())
        return anyio.current_time() + self._backoff()

    def _backoff(self) -> float:
        return min(max(MAX_BACKOFF, self.interval), self.interval * 2.0 ** min(self._failures, 16))

    async def _sample_by_call(self, first: bool = False) -> bool | None:
        """One sample from one call of each query: True, False (failed), None (no GPU here)."""
        gpu = await self._query(GPU_QUERY)
        if first and (gpu.missing or no_devices(gpu)):
            await self._note(f"no GPU data: {gpu.describe()}", {"nvidia_smi": self._executable})
            return None
        every_line = data_lines(gpu.output, self._fields[GPU_QUERY])
        lines = await self._without_lost(every_line)
        if no_devices(gpu) and self.health.known:
            await self._report(self.health.all_lost(self.sink.elapsed(), gpu.describe()))
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
            self.sink.counters.sampler_errors += 1
            await self._note(
                f"nvidia-smi could not list GPU processes: {apps.describe()}", once="apps-call"
            )
        await self._emit(readings, processes, "call", len(readings) == len(lines))
        return True

    async def _query(self, query: str) -> CommandResult:
        """One call of a query; a field this nvidia-smi rejects is dropped (or renamed)."""
        while True:
            fields = self._fields[query]
            result = await run_command(
                [self._executable, *query_args(query, fields)], time_limit=self.call_timeout
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

    async def _run_loops(self) -> str | None:
        """Sample from the two loop processes, at the soak's ticks, until one ends (why:
        returned) or the GPU loop hangs (None)."""
        loop_ms = max(1, round(self.interval * 1000))
        readers: list[_LineReader] = []
        try:
            for query in (GPU_QUERY, APPS_QUERY):
                argv = [self._executable, *query_args(query, self._fields[query], loop_ms)]
                try:
                    readers.append(await _open_loop(argv))
                except OSError as exc:
                    return f"could not start nvidia-smi: {exc.strerror or exc}"
            gpu, apps = readers
            heard = anyio.current_time()
            deadline = self.call_timeout  # the first line may take as long as a call
            tick = self.sink.clock.start
            while True:
                tick = next_tick(tick, self.interval, anyio.current_time())
                await anyio.sleep_until(tick)
                await self._read_kernel_log()
                # The process list first: each GPU sample carries the freshest one.
                end = await self._take_apps(apps)
                if end is not None:
                    return end
                try:
                    got = await self._take_gpus(gpu)
                except SmiParseError as exc:
                    return f"the nvidia-smi GPU loop printed {exc}"
                now = anyio.current_time()
                if got:
                    heard = now
                    deadline = self.interval + self.call_timeout
                elif gpu.ended:
                    status = await gpu.exit_status()
                    return f"the nvidia-smi GPU loop ended ({status})"
                elif now - heard > deadline:
                    await self._failed(
                        f"nvidia-smi printed nothing for {deadline:.3g} s; stopping it"
                    )
                    return None
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
        """Emit each whole iteration the GPU loop printed since the previous tick; whether any
        line came."""
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
        """Whether a GPU row begins the loop's next iteration: its index is not above the last
        readable one of ``group`` (nvidia-smi lists the GPUs in index order, and may stamp
        each row as it reads it, so the stamps of one iteration differ)."""
        fields = self._fields[GPU_QUERY]
        index = line_gpu_index(line, fields)
        if index is None:
            return False
        for previous in reversed(group):
            before = line_gpu_index(previous, fields)
            if before is not None:
                return index <= before
        return False

    async def _take_apps(self, reader: _LineReader) -> str | None:
        """The process loop's lines since the previous tick; its end, if it ended.  Silence is
        normal here (no process holds a GPU): no deadline.  A straggler of an iteration (same
        timestamp) at the next tick extends it, and it is read again."""
        try:
            lines = [line for line in reader.lines() if line.strip()]
        except SmiParseError as exc:
            return f"the nvidia-smi process loop printed {exc}"
        for line in lines:
            if reader.group and line_timestamp(line) != line_timestamp(reader.group[0]):
                reader.group = []
            reader.group.append(line)
        if lines:
            await self._apps_iteration(reader.group)
        elif reader.ended:
            status = await reader.exit_status()
            return f"the nvidia-smi process loop ended ({status})"
        return None

    async def _gpu_iteration(self, lines: list[str]) -> None:
        readings = await self._parse_gpus(lines)
        if not readings:
            await self._failed(f"no GPU reading in nvidia-smi's output: {lines[0].strip()!r}")
            return
        await self._emit(readings, self._current_processes(), "loop", len(readings) == len(lines))

    async def _apps_iteration(self, lines: list[str]) -> None:
        processes = await self._parse_processes(lines)
        if processes:
            # Stamps in whole seconds make a second's iterations one group: each process
            # counted once per GPU, at its newest reading.
            processes = list({(p.pid, p.gpu_uuid): p for p in processes}.values())
        self._apps = (anyio.current_time(), processes)

    def _current_processes(self) -> list[GpuProcess] | None:
        """The latest process list, or none when the process loop has been silent a while."""
        if self._apps is None:
            return []
        at, processes = self._apps
        if anyio.current_time() - at > self.interval + APPS_SLACK:
            return []
        return processes
