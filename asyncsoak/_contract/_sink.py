"""The soak's event queue: one bounded anyio memory object stream, an :class:`EventSink` per
producer; ``emit`` what must arrive, ``offer`` samples, dropped and counted rather than stall a
producer when the serializer is behind."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._event import Event

#: Events buffered between producers and the serializer before samples are dropped.
EVENT_BUFFER = 1024


@dataclass(slots=True)
class SinkCounters:
    """Shared by every clone of one sink."""

    dropped_samples: int = 0
    sampler_errors: int = 0
    #: Events put in the queue so far (less :meth:`EventSink.waiting`: those taken).
    sent: int = 0


class SoakClock:
    """Seconds since the soak's start on anyio's monotonic clock."""

    def __init__(self, start: float | None = None) -> None:
        self.start = anyio.current_time() if start is None else start

    def elapsed(self) -> float:
        return anyio.current_time() - self.start


class EventSink:
    """One producer's end of the event queue."""

    def __init__(
        self,
        send: MemoryObjectSendStream[Event],
        clock: SoakClock,
        counters: SinkCounters | None = None,
    ) -> None:
        self._send = send
        self.clock = clock
        self.counters = counters if counters is not None else SinkCounters()

    def elapsed(self) -> float:
        return self.clock.elapsed()

    async def emit(self, event: Event) -> None:
        """Deliver an event that must never be lost; waits when the buffer is full."""
        # A closed queue means the soak is being torn down: there is nobody left to tell.
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            try:
                # With room, no checkpoint: a turn of the loop per event is the monitor's CPU.
                self._send.send_nowait(event)
            except anyio.WouldBlock:
                await self._send.send(event)
            self.counters.sent += 1

    def offer(self, event: Event) -> bool:
        """Queue a sample if there is room; count it as dropped otherwise."""
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.counters.dropped_samples += 1
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        self.counters.sent += 1
        return True

    def waiting(self) -> int:
        """Events in the queue that the serializer has not taken yet."""
        return self._send.statistics().current_buffer_used

    def taken(self, position: int) -> bool:
        """Whether the event that was the ``position``-th sent has been taken."""
        return self.counters.sent - self.waiting() >= position

    def clone(self) -> EventSink:
        return EventSink(self._send.clone(), self.clock, self.counters)

    def close(self) -> None:
        self._send.close()

    async def __aenter__(self) -> EventSink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


def open_event_queue(
    clock: SoakClock, buffer: int = EVENT_BUFFER
) -> tuple[EventSink, MemoryObjectReceiveStream[Event]]:
    """A sink for producers (clone it per producer, then close it) and the serializer's end."""
    send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=buffer)
    return EventSink(send, clock), receive
