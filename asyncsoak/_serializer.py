"""The serializer: drains the event queue into the journal and the artifact builder.

Every event is appended to the journal (JSON Lines) through aiofiles before the serializer
waits for the next one, so the journal survives a crash of the monitor.  Events already queued
go as one batch: under load that is one write for many events.  The journal is opened
unbuffered, so each batch is one ``write(2)`` and nothing waits in a user-space buffer.

A journal that cannot be written (full or read-only disk) is recorded and the soak goes on:
the artifact is still built from the events in memory.  A write that hangs (a dead network
filesystem) is abandoned after ``JOURNAL_WRITE_TIMEOUT`` and writing stops, so a stuck disk
can never back up the event queue and stall the watchdog.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

import aiofiles
import anyio
from aiofiles.threadpool.binary import AsyncFileIO
from anyio.streams.memory import MemoryObjectReceiveStream

from ._artifact import ArtifactBuilder
from ._events import Event, SeriesSource, event_to_json

#: Events written to the journal in one batch at most.
BATCH = 256
#: Bound on one journal write; past it the journal is given up for this soak.
JOURNAL_WRITE_TIMEOUT = 5.0
#: Journals given up with a write stuck in a thread, kept open on purpose (see ``run``).
_ABANDONED_JOURNALS: list[AsyncFileIO] = []


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


class Serializer:
    def __init__(self, journal_fd: int, builder: ArtifactBuilder) -> None:
        self._journal_fd = journal_fd
        self.builder = builder
        self.events = 0
        self.journal_error: str | None = None
        self.fold_errors = 0
        self.fold_error: str | None = None
        self._write_abandoned = False

    async def run(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        """Drain until the last producer closes its end of the queue, then close the journal."""
        journal = await aiofiles.open(self._journal_fd, "wb", buffering=0)
        try:
            await self._drain(receive, journal)
        finally:
            if self._write_abandoned:
                # A write still stuck in its thread keeps the descriptor: closing it (or
                # letting the file object be collected) could let that write land in a file
                # opened later under the same number.  One descriptor per hung soak is kept.
                _ABANDONED_JOURNALS.append(journal)
            else:
                with anyio.CancelScope(shield=True):
                    try:
                        await journal.close()
                    except OSError as exc:
                        self.journal_error = self.journal_error or f"journal close failed: {exc}"

    async def _write(self, journal: AsyncFileIO, data: bytes) -> None:
        if self.journal_error is not None:
            return
        view = memoryview(data)
        with anyio.move_on_after(JOURNAL_WRITE_TIMEOUT) as scope:
            try:
                while view:
                    view = view[await journal.write(view) :]
            except OSError as exc:
                self.journal_error = f"journal write failed: {exc}"
        if scope.cancelled_caught:
            self._write_abandoned = True
            self.journal_error = (
                f"a journal write took longer than {JOURNAL_WRITE_TIMEOUT:g}s "
                "(a hung filesystem?); writing stopped"
            )

    async def _drain(self, receive: MemoryObjectReceiveStream[Event], journal: AsyncFileIO) -> None:
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
                await self._write(journal, "".join(lines).encode())
