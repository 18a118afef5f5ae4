"""The serializer: drains the event queue into the journal and the run's state; a journal
that fails or hangs is abandoned, never let back up the queue (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import math
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, Future
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard, TypeVar, cast

import aiofiles
import anyio
from aiofiles.threadpool.binary import AsyncFileIO
from anyio.streams.memory import MemoryObjectReceiveStream

from .._contract import EXECUTOR, BlockingCallTimeout, EventSink, host_cancelled, run_blocking
from .._contract.events import (
    Event,
    EventJson,
    GpuSampleJson,
    SampleJson,
    SeriesSource,
    event_to_json,
)
from ._artifact import RunState
from ._artifact_io import create_private_file
from ._journal import SEGMENT_BYTES, JournalEncoder, compress_segment, segment_path

#: Events written to the journal in one batch at most.
BATCH = 256
#: Bound on one journal write; past it the journal is given up for this soak.
JOURNAL_WRITE_TIMEOUT_SECONDS = 5.0
#: Events that wait for the interval's write like samples do (a busy trainer's every second).
_BATCHED_KINDS = frozenset({"progress", "step"})
#: The proc sampler's samples write what waits with them: no timer of the journal's own.
_FLUSHING_KINDS = frozenset({"sample"})
#: Bound on opening and on closing the journal (a flush on close can hang on NFS).
JOURNAL_CLOSE_TIMEOUT_SECONDS = 5.0

T = TypeVar("T")


#: Whether each event class is a SeriesSource (a protocol check at every sample is slow).
_SERIES_SOURCE_TYPES: dict[type, bool] = {}


def _is_series_source(event: Event) -> TypeGuard[SeriesSource]:
    known = _SERIES_SOURCE_TYPES.get(type(event))
    if known is None:
        known = _SERIES_SOURCE_TYPES[type(event)] = isinstance(event, SeriesSource)
    return known


def journal_line(event: Event) -> tuple[str, EventJson]:
    """The journal line of an event and its JSON form (samples carry their series points)."""
    data = journal_line_data(event)
    return json.dumps(data, allow_nan=False, separators=(",", ":"), default=str) + "\n", data


def journal_line_data(event: Event) -> EventJson:
    """The JSON form of an event as the journal holds it (samples carry their series points)."""
    data = event_to_json(event)
    if _is_series_source(event):
        sample = cast("SampleJson | GpuSampleJson", data)
        sample["points"] = {g: dict(v) for g, v in event.series_points().items()}
        labels = event.summary_labels()
        if labels:
            sample["labels"] = {g: {k: list(v) for k, v in ls.items()} for g, ls in labels.items()}
    return data


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class _JournalExecutor(Executor):
    """The shared pool, remembering which of this journal's calls still run: the descriptor
    of an abandoned write is closed only once it returns (:meth:`when_idle`), or its number,
    reused by a later file, would take the write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future = EXECUTOR.submit(fn, *args, **kwargs)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in a pool thread, or now) once no call of this journal runs."""
        with self._lock:
            pending = next((f for f in self._running if not f.done()), None)
        if pending is None:
            callback()
        else:  # asked again once that one returns
            pending.add_done_callback(lambda _: self.when_idle(callback))


#: A rule: what the state, with one more event folded, calls for (failures, warnings,
#: verdicts); what it returns is folded in turn, then written.
Rule = Callable[[RunState, EventJson], Sequence[Event]]
#: Events one event's rules may bring at most (so a rule that answers itself stops).
RULE_EVENTS = 64


#: Told of every event in its JSON form once it is folded (the live metrics are one).
Observer = Callable[[EventJson], None]


class Serializer:
    def __init__(
        self,
        journal_fd: int,
        builder: RunState,
        observers: Sequence[Observer] = (),
        *,
        journal_path: Path | None = None,
        flush_interval: float | None = None,
        own_files: set[tuple[int, int]] | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        lock_fds: list[int] | None = None,
        rules: Sequence[Rule] = (),
    ) -> None:
        self._journal_fd = journal_fd
        self.rules = rules
        self._journal_path = journal_path
        #: How long samples and progress may wait for their write (None: no wait).
        self._flush_interval = flush_interval
        #: (device, inode) of the files the serializer creates: never progress.
        self.own_files = own_files if own_files is not None else set()
        self._segment_bytes = segment_bytes
        self._segment_size = 0
        self.segments = 0
        self._encoder = JournalEncoder()
        self._journal: AsyncFileIO | None = None
        #: Locks held on the journal's later segments (the soak's own lock is on the first).
        self.lock_fds: list[int] = lock_fds if lock_fds is not None else []
        self.rotation_error: str | None = None
        self._compressions: list[Future[Path]] = []
        self.builder = builder
        self.observers = list(observers)
        self.events = 0
        self.journal_error: str | None = None
        self.fold_errors = 0
        self.fold_error: str | None = None
        #: Events whose non-finite numbers were written as null.
        self.nonfinite_events = 0
        self._write_abandoned = False
        self._executor = _JournalExecutor()
        #: When closing the journal must be given up (``run_soak``'s drain deadline).
        self.close_deadline: float | None = None
        self.drained = anyio.Event()
        self._emptied: anyio.Event | None = None

    async def folded(self, sink: EventSink) -> None:
        """Until every event queued so far on ``sink`` is folded."""
        if sink.waiting() and not self.drained.is_set():
            self._emptied = anyio.Event()
            await self._emptied.wait()

    async def run(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        """Drain until the last producer closes its end of the queue, then close the journal."""
        try:
            self._journal = await _despite_the_host(lambda: self._open(self._journal_fd))
            if self._journal is None:
                self.journal_error = (
                    f"the journal could not be opened within {JOURNAL_CLOSE_TIMEOUT_SECONDS:g}s"
                )
            await self._drain(receive)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close(self._journal)
                self.drained.set()

    async def _open(self, fd: int) -> AsyncFileIO | None:
        with anyio.move_on_after(JOURNAL_CLOSE_TIMEOUT_SECONDS):
            # closefd=False: the descriptor is closed here, once no call of ours can still
            # be using it (see _JournalExecutor), never by the file object's collection.
            return await aiofiles.open(
                fd, "wb", buffering=0, closefd=False, executor=self._executor
            )
        return None

    async def _close(self, journal: AsyncFileIO | None) -> None:
        """Close the journal, within the close bound and the soak's drain deadline."""
        fd = self._journal_fd
        if journal is None or self._write_abandoned:
            # A call is still stuck in its thread: close once it returns.
            self._executor.when_idle(partial(_close_fd, fd))
            return
        deadline = anyio.current_time() + JOURNAL_CLOSE_TIMEOUT_SECONDS
        if self.close_deadline is not None:
            deadline = min(deadline, self.close_deadline)
        close_call: Future[None] | None = None
        with anyio.CancelScope(deadline=deadline) as scope:
            try:
                await journal.close()
                # close(2) is where a network filesystem flushes: it runs in the pool too.
                close_call = self._executor.submit(os.close, fd)
                await asyncio.wrap_future(close_call)
            except OSError as exc:
                self.journal_error = self.journal_error or f"journal close failed: {exc}"
        if scope.cancelled_caught:
            self.journal_error = self.journal_error or (
                "closing the journal did not finish in time (a hung filesystem?); abandoned"
            )
        if close_call is not None and not close_call.done():
            close_call.cancel()  # now: a queued close is dropped, a running one abandoned
        if close_call is None or close_call.cancelled():
            # close(2) never ran: run it once the call in the way (a stuck flush) returns.
            self._executor.when_idle(partial(_close_fd, fd))

    async def _write(self, journal: AsyncFileIO | None, data: bytes) -> None:
        if self.journal_error is not None or journal is None:
            return
        view = memoryview(data)
        with anyio.move_on_after(JOURNAL_WRITE_TIMEOUT_SECONDS) as scope:
            try:
                while view:
                    view = view[await journal.write(view) :]
            except OSError as exc:
                self.journal_error = f"journal write failed: {exc}"
        if scope.cancelled_caught:
            self._write_abandoned = True
            self.journal_error = (
                f"a journal write took longer than {JOURNAL_WRITE_TIMEOUT_SECONDS:g}s "
                "(a hung filesystem?); writing stopped"
            )

    async def _drain(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        """Drain until the last producer closes its end; the host's cancel is taken back, for
        the soak still has its end to write."""
        pending: list[str] = []
        async with receive:
            await _despite_the_host(lambda: self._drain_batches(receive, pending))
        await self._write_lines(pending)

    async def _drain_batches(
        self, receive: MemoryObjectReceiveStream[Event], pending: list[str]
    ) -> None:
        due: float | None = None  # when the waiting lines must be written
        while True:
            if self._emptied is not None and not receive.statistics().current_buffer_used:
                self._emptied.set()
            try:
                first = await _take(receive, due)
            except anyio.EndOfStream:
                break
            if first is None:  # the waiting samples' interval is up
                await self._write_lines(pending)
                due = None
                continue
            batch: list[Event] = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            urgent = self._flush_interval is None
            by_sample = False
            # Each received event, with what its rules bring: the bound is per received event,
            # so one that calls for much never leaves the rules of those behind it unrun.
            todo: deque[tuple[Event, bool]] = deque((event, True) for event in batch)
            brought = 0
            while todo:
                event, queued = todo.popleft()
                brought = 0 if queued else brought
                self.events += 1
                encoded = self._encode(event)
                if encoded is None:
                    continue
                line, data = encoded
                pending.append(line)
                by_sample = by_sample or event.KIND in _FLUSHING_KINDS
                urgent = urgent or not (event.DROPPABLE or event.KIND in _BATCHED_KINDS)
                try:
                    self.builder.add(data)
                    for observe in self.observers:
                        observe(data)
                    for rule in self.rules if brought < RULE_EVENTS else ():
                        # The only feedback: what a rule calls for is folded next, in order.
                        found = rule(self.builder, data)
                        brought += len(found)
                        todo.extendleft((e, False) for e in reversed(found))
                except Exception as exc:  # a bug must not cost the journal or the artifact
                    self._fold_failed(exc)
            if urgent or by_sample:
                await self._write_lines(pending)
                due = None
            elif due is None and pending and self._flush_interval is not None:
                # The next sample carries them: the timer is only for a sampler that stalls.
                due = anyio.current_time() + self._flush_interval

    async def _write_lines(self, pending: list[str]) -> None:
        """Write the waiting lines as one batch, then close the segment if it is full."""
        if not pending:
            return
        data = "".join(pending).encode()
        pending.clear()
        await self._write(self._journal, data)
        self._segment_size += len(data)
        if self._journal_path is not None and self._segment_size >= self._segment_bytes:
            await self._rotate(self._journal_path)

    async def _rotate(self, path: Path) -> None:
        """Close the open segment under its segment name, go on in a new one, compress the old;
        the journal's path is never missing or unlocked (docs/architecture.md).  On failure
        writing goes on in the same segment, and rotation is off for this soak."""
        if self.journal_error is not None or self._journal is None:
            return
        index = self.segments + 1
        closed = segment_path(path, index)
        try:
            fd, lock_fd = await run_blocking(
                _start_segment,
                path,
                closed,
                timeout=JOURNAL_CLOSE_TIMEOUT_SECONDS,
                what="rotating the journal",
            )
            journal = await self._open(fd)
            if journal is None:
                raise OSError("the new segment did not open in time")
        except (OSError, BlockingCallTimeout) as exc:
            self._segment_bytes = 1 << 62
            self.rotation_error = f"journal rotation failed: {exc}"
            return
        old, old_fd = self._journal, self._journal_fd
        self._journal, self._journal_fd = journal, fd
        self.lock_fds.append(lock_fd)
        self.own_files.add(_file_key(fd))
        self.segments = index
        self._segment_size = 0
        self._encoder.reset()
        await old.close()
        self._executor.when_idle(partial(_close_fd, old_fd))
        # In the pool, never holding the queue; a segment left plain is read as it is.
        self._compressions.append(EXECUTOR.submit(compress_segment, closed, self.own_files.add))

    def _encode(self, event: Event) -> tuple[str, EventJson] | None:
        """The event's journal line and JSON form; None (counted) if it cannot be encoded."""
        try:
            data = journal_line_data(event)
            try:
                return self._encoder.encode(data), data
            except ValueError:  # a NaN or an infinity: written as null
                data = _finite(data)
                line = self._encoder.encode(data)
                self.nonfinite_events += 1
                return line, data
        except Exception as exc:
            self._fold_failed(exc)
            return None

    def _fold_failed(self, exc: Exception) -> None:
        self.fold_errors += 1
        self.fold_error = self.fold_error or f"{type(exc).__name__}: {exc}"


async def _despite_the_host(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, called again each time the host's cancel (taken back) interrupts it."""
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            if not host_cancelled():
                raise


async def _take(receive: MemoryObjectReceiveStream[Event], due: float | None) -> Event | None:
    """The next event, None once ``due`` passed; no turn of the loop when one is there."""
    try:
        return receive.receive_nowait()
    except anyio.WouldBlock:
        pass
    if due is None:
        return await receive.receive()
    with anyio.move_on_after(max(0.0, due - anyio.current_time())):
        return await receive.receive()
    return None


def _file_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _start_segment(path: Path, closed: Path) -> tuple[int, int]:
    """Blocking: a new, locked open segment at ``path``; the full one renamed ``closed``."""
    fresh = path.with_name(path.name + ".new")
    fd = create_private_file(fresh)
    try:
        lock_fd = os.open(fresh, os.O_RDONLY | os.O_CLOEXEC)
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            os.link(path, closed)
        except OSError:
            # No hard links here (some network and FUSE filesystems): a rename, with a
            # moment where the path is missing.
            os.rename(path, closed)
        os.rename(fresh, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError, UnboundLocalError):
            os.close(lock_fd)
        with contextlib.suppress(OSError):
            os.unlink(fresh)
        raise
    return fd, lock_fd


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
