"""The serializer: every event reaches the journal in order, and a bad disk never stalls it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from asyncsoak._contract import events
from asyncsoak._record import _serializer
from asyncsoak._record._artifact import RunState
from asyncsoak._record._serializer import Serializer

pytestmark = pytest.mark.asyncio


async def serialize(fd: int, sent: list[events.Event]) -> Serializer:
    """Run a serializer over ``sent`` to the end of its queue, under a deadline."""
    serializer = Serializer(fd, RunState())
    send, receive = anyio.create_memory_object_stream[events.Event](max_buffer_size=len(sent) + 1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                for event in sent:
                    await send.send(event)
    return serializer


def warnings(n: int, size: int = 10) -> list[events.Event]:
    return [events.WarningEvent(t=float(i), message=f"{i:05d}" + "x" * size) for i in range(n)]


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


def a_sample(t: float) -> events.Event:
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


async def test_progress_waits_for_the_next_sample_and_an_urgent_event_goes_at_once(
    tmp_path: Path,
) -> None:
    """A progress event waits for the next sample's write (one write for both, in order); a
    sample and an event that must go out at once are written as they come."""
    path = tmp_path / "soak.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    serializer = Serializer(fd, RunState(), flush_interval=60.0)
    send, receive = anyio.create_memory_object_stream[events.Event](max_buffer_size=10)
    progress = events.Progress(t=1.5, changed=1, paths=["m"], gap_seconds=None, grown_bytes=1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                await send.send(a_sample(1.0))
                await until(lambda: kinds(path) == ["sample"])
                await send.send(progress)
                await until(lambda: serializer.events == 2)
                assert kinds(path) == ["sample"]  # waiting for the next sample
                await send.send(a_sample(2.0))
                await until(lambda: len(kinds(path)) == 3)
                await send.send(events.WarningEvent(t=2.5, message="now"))
                await until(lambda: len(kinds(path)) == 4)
    assert kinds(path) == ["sample", "progress", "sample", "warning"]
    assert serializer.journal_error is None


async def test_a_rule_answering_much_leaves_the_rules_of_the_next_events_running(
    tmp_path: Path,
) -> None:
    """One event whose rules bring many events (a trend judgement naming 70 leaking workers)
    does not spend the rules of the events queued behind it in the same batch: each event
    has its own bound, so a later failure is still made."""

    def rule(state: RunState, event: Mapping[str, Any]) -> list[events.Event]:
        if event["kind"] != "warning" or event["message"] not in ("many", "fail"):
            return []
        if event["message"] == "many":
            return [events.WarningEvent(t=event["t"], message=f"w{i}") for i in range(70)]
        at = "2026-01-01T00:00:00Z"
        return [events.FailureEvent(t=event["t"], reason="stale_progress", message="m", at=at)]

    fd = os.open(tmp_path / "soak.jsonl", os.O_WRONLY | os.O_CREAT, 0o600)
    serializer = Serializer(fd, RunState(), rules=[rule])
    sent = [events.WarningEvent(t=1.0, message="many"), events.WarningEvent(t=2.0, message="fail")]
    send, receive = anyio.create_memory_object_stream[events.Event](max_buffer_size=10)
    for event in sent:  # one batch: both are queued before the serializer runs
        send.send_nowait(event)
    send.close()
    with anyio.fail_after(30):
        await serializer.run(receive)
    assert len(serializer.builder.warnings) == 2 + 70
    assert [f["reason"] for f in serializer.builder.failures] == ["stale_progress"]
