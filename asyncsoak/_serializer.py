"""The serializer: drains the event queue into the journal and the artifact builder.

Every event is appended to the journal (JSON Lines) before the serializer waits for the next
one, so the journal survives a crash of the monitor: the file is unbuffered, and each batch is
one ``write(2)`` in one trip to a worker thread.  Events already queued are written as one
batch: under load that is one write for many events.  A journal that cannot be written (full
or read-only disk) is recorded and the soak goes on: the artifact is still built from the
events in memory.
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

    async def run(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        """Drain until the last producer closes its end of the queue."""
        # Unbuffered: one write per batch reaches the kernel at once, with no separate flush
        # (each await here is a trip to a worker thread, and waking one is what costs most
        # in an idle monitor: benchmarks/monitor_overhead.py).
        journal = await aiofiles.open(self._journal_fd, "wb", buffering=0)
        try:
            await self._drain(receive, journal)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await journal.close()
                except OSError as exc:
                    self.journal_error = self.journal_error or f"journal close failed: {exc}"

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
                if self.journal_error is None:
                    try:
                        pending = "".join(lines).encode()
                        while pending:
                            written = await journal.write(pending)
                            pending = pending[written:]
                    except OSError as exc:
                        self.journal_error = f"journal write failed: {exc}"
