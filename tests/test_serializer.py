"""The serializer: every event reaches the journal in order, and a bad disk never stalls it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from asyncsoak._contract._blocking import Rides
from asyncsoak._contract._events import Event, WarningEvent
from asyncsoak._record import _serializer
from asyncsoak._record._artifact import ArtifactBuilder
from asyncsoak._record._serializer import Serializer

pytestmark = pytest.mark.asyncio


async def serialize(fd: int, events: list[Event]) -> Serializer:
    """Run a serializer over ``events`` to the end of its queue, under a deadline."""
    serializer = Serializer(fd, ArtifactBuilder())
    send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=len(events) + 1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                for event in events:
                    await send.send(event)
    return serializer


def warnings(n: int, size: int = 10) -> list[Event]:
    return [WarningEvent(t=float(i), message=f"{i:05d}" + "x" * size) for i in range(n)]


async def test_every_event_reaches_the_journal_in_order(tmp_path: Path) -> None:
    """Each event is one JSON line, in the order it was sent, and the builder saw them all."""
    path = tmp_path / "soak.jsonl"
    serializer = await serialize(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), warnings(700))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["message"][:5] for line in lines] == [f"{i:05d}" for i in range(700)]
    assert serializer.events == 700
    assert serializer.journal_error is None
    assert len(serializer.builder.warnings) == 700


async def test_a_hung_journal_is_given_up_without_stalling_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A journal that stops draining (a pipe nobody reads, as a dead disk) is abandoned after
    the write bound; the queue keeps draining and the artifact still gets every event."""
    monkeypatch.setattr(_serializer, "JOURNAL_WRITE_TIMEOUT_SECONDS", 0.3)
    read_end, write_end = os.pipe()
    try:
        serializer = await serialize(write_end, warnings(300, size=2000))
        assert serializer.journal_error is not None
        assert "writing stopped" in serializer.journal_error
        assert len(serializer.builder.warnings) == 300
    finally:
        os.close(read_end)


async def test_a_failing_journal_is_reported(tmp_path: Path) -> None:
    """A write that fails (a read-only descriptor here) is recorded, and the fold goes on."""
    path = tmp_path / "soak.jsonl"
    path.write_bytes(b"")
    serializer = await serialize(os.open(path, os.O_RDONLY), warnings(5))
    assert serializer.journal_error is not None
    assert serializer.journal_error.startswith("journal write failed")
    assert len(serializer.builder.warnings) == 5
    assert path.read_bytes() == b""


async def test_the_journal_is_closed_at_the_end(tmp_path: Path) -> None:
    """The serializer owns the descriptor: once it returns, the reader sees end of file."""
    read_end, write_end = os.pipe()
    try:
        await serialize(write_end, warnings(3))
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
        assert data.count(b"\n") == 3
    finally:
        os.close(read_end)


# Riding on the proc sampler's ticks ------------------------------------------------------


def a_sample(t: float) -> Event:
    """A real proc sample (of this process's children: none), stamped ``t``."""
    from asyncsoak._sampling._proc_sampler import ProcSampler

    sample = ProcSampler(os.getpid()).read(t)
    assert sample is not None
    return sample


async def until(condition: Callable[[], bool]) -> None:
    """Give the serializer turns of the loop until ``condition`` holds (no timer involved)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


def kinds(path: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


async def test_a_samples_batch_rides_on_the_next_tick_and_an_urgent_event_takes_it_back(
    tmp_path: Path,
) -> None:
    """A sample's batch waits for the next tick's thread (nothing is written until a taker
    runs it); an event that must go out at once takes a ride nobody took yet back and writes
    both, in order, in one write."""
    path = tmp_path / "soak.jsonl"
    rides = Rides()
    serializer = Serializer(
        os.open(path, os.O_WRONLY | os.O_CREAT, 0o600),
        ArtifactBuilder(),
        flush_interval=60.0,
        rides=rides,
    )
    send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=10)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                await send.send(a_sample(1.0))
                await until(lambda: rides.waiting_timeout() > 0)
                assert path.read_bytes() == b""  # riding: not written yet
                for ride in rides.take():  # the tick's thread, here on the loop
                    ride.run()
                    ride.done.set()
                assert kinds(path) == ["sample"]

                await send.send(a_sample(2.0))
                await until(lambda: rides.waiting_timeout() > 0)
                await send.send(WarningEvent(t=2.5, message="now"))
                await until(lambda: len(kinds(path)) == 3)
                assert rides.take() == []  # taken back: the warning's write carried it
    assert kinds(path) == ["sample", "sample", "warning"]
    assert serializer.journal_error is None


async def test_a_riding_write_that_never_comes_back_stops_the_journal_not_the_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick's thread took the write and hangs: the next write waits the write bound, then
    the journal is given up as for a hung aiofiles write; every event still reaches the
    artifact."""
    monkeypatch.setattr(_serializer, "JOURNAL_WRITE_TIMEOUT_SECONDS", 0.3)
    path = tmp_path / "soak.jsonl"
    rides = Rides()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    serializer = Serializer(fd, ArtifactBuilder(), flush_interval=60.0, rides=rides)
    send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=10)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                await send.send(a_sample(1.0))
                await until(lambda: rides.waiting_timeout() > 0)
                [stuck] = rides.take()  # taken, and not run until the end
                # The stuck write is only run at the end: a journal given up before then
                # was given up at the write bound, not when the write came back.
                await send.send(WarningEvent(t=1.5, message="after the stuck write"))
                await until(lambda: serializer.journal_error is not None)
    assert serializer.journal_error is not None
    assert "writing stopped" in serializer.journal_error
    assert len(serializer.builder.warnings) == 1
    os.fstat(fd)  # still open: the stuck write may land on it
    stuck.run()  # the write comes back at last (and lands): now the descriptor is closed
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
