"""The serializer: drains the event queue into the journal and the artifact builder.

Every event is appended to the journal (JSON Lines) and flushed before the serializer waits
for the next one, so the journal survives a crash of the monitor.  Events already queued are
written as one batch: under load that is one write and one flush for many events.  A journal
that cannot be written (full or read-only disk) is recorded and the soak goes on: the artifact
is still built from the events in memory.
"""

from __future__ import annotations

import json
from typing import Any

import aiofiles
import anyio
from aiofiles.threadpool.binary import AsyncBufferedIOBase
from anyio.streams.memory import MemoryObjectReceiveStream

from ._artifact import ArtifactBuilder
from ._events import Event, SeriesSource, event_to_json

#: Events written to the journal in one batch at most.
BATCH = 256


def journal_line(event: Event) -> tuple[str, dict[str, Any]]:
    """The journal line of an event and its JSON form (samples carry their series points)."""
    data = event_to_json(event)
    if isinstance(event, SeriesSource):
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
        journal = await aiofiles.open(self._journal_fd, "wb")
        try:
            await self._drain(receive, journal)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await journal.close()
                except OSError as exc:
                    self.journal_error = self.journal_error or f"journal close failed: {exc}"

    async def _drain(
        self, receive: MemoryObjectReceiveStream[Event], journal: AsyncBufferedIOBase
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
                if self.journal_error is None:
                    try:
                        await journal.write("".join(lines).encode())
                        await journal.flush()
                    except OSError as exc:
                        self.journal_error = f"journal write failed: {exc}"
