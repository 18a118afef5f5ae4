"""The journal writer: batches in order from a thread of its own, bounded when the disk stalls."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from asyncsoak._serializer import JournalWriter


def join(writer: JournalWriter, timeout: float = 10.0) -> None:
    done = threading.Thread(target=writer.join, daemon=True)
    done.start()
    done.join(timeout)
    assert not done.is_alive(), "the journal writer did not finish"


def test_batches_reach_the_journal_in_order(tmp_path: Path) -> None:
    """Every batch handed over is written, in order, before the writer ends."""
    path = tmp_path / "soak.jsonl"
    writer = JournalWriter(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    lines = [f'{{"n": {n}}}\n'.encode() for n in range(500)]
    for line in lines:
        writer.put(line)
    writer.close()
    join(writer)
    assert path.read_bytes() == b"".join(lines)
    assert writer.error is None


def test_a_stalled_journal_stops_taking_batches_without_blocking() -> None:
    """A journal that stops draining (a pipe nobody reads, as a hung disk) never blocks the
    caller: past the bound, writing stops and the error says so."""
    read_end, write_end = os.pipe()
    try:
        writer = JournalWriter(write_end, max_pending=64 * 1024)
        batch = b"x" * 40 * 1024
        for _ in range(4):
            writer.put(batch)  # returns at once although the pipe is full
        assert writer.error is not None
        assert "writing stopped" in writer.error
        writer.close()
        received = 0
        while chunk := os.read(read_end, 65536):  # EOF once the writer closed its end
            received += len(chunk)
        join(writer)
        # What was taken before the bound was written whole; nothing after it.
        assert received % len(batch) == 0
        assert received < 4 * len(batch)
    finally:
        os.close(read_end)


def test_a_failing_journal_is_reported(tmp_path: Path) -> None:
    """A write that fails (here: a read-only descriptor) is recorded, and later batches are
    dropped quietly."""
    path = tmp_path / "soak.jsonl"
    path.write_bytes(b"")
    writer = JournalWriter(os.open(path, os.O_RDONLY))
    writer.put(b"line\n")
    writer.put(b"line\n")
    writer.close()
    join(writer)
    assert writer.error is not None
    assert writer.error.startswith("journal write failed")
    assert path.read_bytes() == b""


@pytest.mark.parametrize("batches", [0, 1])
def test_the_writer_closes_the_journal(tmp_path: Path, batches: int) -> None:
    """The writer owns the descriptor: it is closed once the writer ends, batches or not."""
    read_end, write_end = os.pipe()
    try:
        writer = JournalWriter(write_end)
        for _ in range(batches):
            writer.put(b"line\n")
        writer.close()
        join(writer)
        data = b""
        while chunk := os.read(read_end, 65536):  # EOF: no write end is left open
            data += chunk
        assert data == b"line\n" * batches
    finally:
        os.close(read_end)
