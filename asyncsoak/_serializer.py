"""The serializer: drains the event queue into the journal and the artifact builder.

Every event is handed to the journal (JSON Lines) as soon as the serializer takes it, so the
journal survives a crash of the monitor.  Events already queued go as one batch: under load
that is one write for many events.  The writes themselves happen in a thread of the journal's
own (:class:`JournalWriter`), in order, each batch one unbuffered ``write(2)``; the event loop
never waits for them.  A journal that cannot be written (full, read-only or hung filesystem)
is recorded and the soak goes on: the artifact is still built from the events in memory.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import Any, TypeGuard

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from ._artifact import ArtifactBuilder
from ._events import Event, SeriesSource, event_to_json

#: Events written to the journal in one batch at most.
BATCH = 256
#: Journal bytes handed over and not yet written before writing stops (a hung filesystem).
MAX_PENDING_BYTES = 64 * 1024 * 1024


#: Whether each event class is a SeriesSource: a runtime protocol check walks the protocol's
#: members at every call, and every sample passes here.
_SERIES_SOURCE_TYPES: dict[type, bool] = {}


def _is_series_source(event: Event) -> TypeGuard[SeriesSource]:
    known = _SERIES_SOURCE_TYPES.get(type(event))
    if known is None:
        known = _SERIES_SOURCE_TYPES[type(event)] = isinstance(event, SeriesSource)
    return known


def journal_line(event: Event) -> tuple[str, dict[str, Any]]:
    """The journal line of an event and its JSON form (samples carry their series points)."""
    data = event_to_json(event)
    if _is_series_source(event):
        data["points"] = {g: dict(v) for g, v in event.series_points().items()}
        labels = event.summary_labels()
        if labels:
            data["labels"] = {g: {k: list(v) for k, v in ls.items()} for g, ls in labels.items()}
    return json.dumps(data, allow_nan=False, separators=(",", ":"), default=str) + "\n", data


class JournalWriter:
    """Appends batches to the journal, in order, from a thread of its own; then closes it.

    The event loop hands a batch over and goes on.  Awaiting each write would wake the loop
    once more per batch, and in an idle monitor wake-ups are most of what it costs (about
    half a millisecond each on a virtual machine: benchmarks/monitor_overhead.py).  The thread
    is the journal's own, not a pool's: it owns the file descriptor and closes it after the
    last batch, so a write stuck on a hung filesystem can never land in a reused descriptor.
    Bounded: past ``max_pending`` bytes not yet written, writing stops and ``error`` says why.
    """

    def __init__(self, fd: int, max_pending: int = MAX_PENDING_BYTES) -> None:
        self._fd = fd
        self._max_pending = max_pending
        self._batches: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="asyncsoak-journal", daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> None:
        with self._lock:
            if self.error is not None:
                return
            if self._pending + len(data) > self._max_pending:
                self.error = (
                    f"journal writes fell {self._pending} bytes behind (a hung filesystem?); "
                    "writing stopped"
                )
                return
            self._pending += len(data)
        self._batches.put(data)

    def close(self) -> None:
        """No more batches: the thread writes what it has, closes the file, and ends."""
        self._batches.put(None)

    def join(self) -> None:
        """Block until the thread has ended (run it in a worker thread, under a deadline)."""
        self._thread.join()

    def _run(self) -> None:
        try:
            while (data := self._batches.get()) is not None:
                if self.error is None:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(self._fd, view) :]
                    except OSError as exc:
                        self.error = f"journal write failed: {exc}"
                with self._lock:
                    self._pending -= len(data)
        finally:
            try:
                os.close(self._fd)
            except OSError as exc:
                self.error = self.error or f"journal close failed: {exc}"


class Serializer:
    def __init__(self, journal_fd: int, builder: ArtifactBuilder) -> None:
        self._journal_fd = journal_fd
        self.builder = builder
        self.events = 0
        self.journal_error: str | None = None
        self.fold_errors = 0
        self.fold_error: str | None = None

    async def run(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        """Drain until the last producer closes its end of the queue.

        Returns once the journal is written and closed; a cancellation (the soak's bound on
        the final drain) leaves the writer thread to finish on its own.
        """
        writer = JournalWriter(self._journal_fd)
        try:
            await self._drain(receive, writer)
        finally:
            writer.close()
            try:
                # The caller's cancel scope bounds this wait; on cancellation the thread is
                # left to finish (or to hang on a dead filesystem) on its own.
                await anyio.to_thread.run_sync(
                    writer.join, limiter=anyio.CapacityLimiter(1), abandon_on_cancel=True
                )
            finally:
                self.journal_error = self.journal_error or writer.error

    async def _drain(
        self, receive: MemoryObjectReceiveStream[Event], writer: JournalWriter
    ) -> None:
        async with receive:
            async for first in receive:
                batch = [first]
                while len(batch) < BATCH:
                    try:
                        batch.append(receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                lines = []
                for event in batch:
                    line, data = journal_line(event)
                    lines.append(line)
                    try:
                        self.builder.add(data)
                    except Exception as exc:
                        # A bug folding one event must not cost the journal or the artifact.
                        self.fold_errors += 1
                        self.fold_error = self.fold_error or f"{type(exc).__name__}: {exc}"
                self.events += len(batch)
                writer.put("".join(lines).encode())
