"""The journal's format: compact lines, segments compressed when closed, one reader for all."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncsoak import read_journal
from asyncsoak._contract import bounded, events
from asyncsoak._contract._vocabulary import EventKind
from asyncsoak._record._artifact import RunState
from asyncsoak._record._artifact_io import create_private_file
from asyncsoak._record._journal import (
    JournalDecoder,
    JournalEncoder,
    JournalReader,
    is_journal,
    journal_segments,
)
from asyncsoak._record._recover import JournalError, artifact_from_journal
from asyncsoak._record._serializer import Serializer
from asyncsoak._sampling._proc_sampler import ProcSampler
from asyncsoak._view._live import JournalTail

from .conftest import py

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.dictionaries(
    st.sampled_from(["a", "b", "c", "~", "=", "{", "n"]), json_values, max_size=5
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["sample", "gpu_sample", "trend", "x"]), bodies), max_size=12
    )
)
def test_any_event_of_any_kind_round_trips(events: list[tuple[str, dict[str, Any]]]) -> None:
    """Whatever the fields (even ones named like the patch's own keys), decoding gives them back."""
    encoder = JournalEncoder(frozenset({"sample", "gpu_sample", "trend"}))
    decoder = JournalDecoder()
    for i, (kind, body) in enumerate(events):
        event = {"t": float(i), "kind": kind, **body}
        line = encoder.encode(event)
        assert line.endswith("\n")
        assert "\n" not in line[:-1]
        assert decoder.decode(line.encode()) == event


@pytest.fixture
def tree() -> Any:
    proc = subprocess.Popen(py("import sys; sys.stdin.read()"), stdin=subprocess.PIPE)
    yield proc.pid
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def header(journal: Path) -> events.Header:
    return events.Header(
        t=0.0,
        command=["train"],
        cwd=str(journal.parent),
        config={"progress_dir": str(journal.parent), "sample_interval_seconds": 1.0},
        metadata={},
        started_at="2026-01-01T00:00:00.000Z",
        journal_path=str(journal),
        log_path=str(journal.with_suffix(".log")),
        output_path=str(journal.with_suffix(".json")),
        monitor_pid=os.getpid(),
        monotonic_start=0.0,
    )


async def serialize(journal: Path, sent: list[events.Event], segment_bytes: int) -> Serializer:
    own: set[tuple[int, int]] = set()
    serializer = Serializer(
        create_private_file(journal),
        RunState(),
        journal_path=journal,
        flush_interval=1.0,
        own_files=own,
        segment_bytes=segment_bytes,
    )
    send, receive = anyio.create_memory_object_stream[events.Event](max_buffer_size=len(sent) + 1)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                for event in sent:
                    await send.send(event)
    for future in serializer._compressions:
        future.result(timeout=30)
    for fd in serializer.lock_fds:
        os.close(fd)
    return serializer


def real_events(root: int, journal: Path, seconds: int) -> list[events.Event]:
    sampler = ProcSampler(root, disk_paths={"output": journal.parent})
    sent: list[events.Event] = [header(journal)]
    for second in range(1, seconds + 1):
        sample = sampler.read(float(second))
        assert sample is not None
        sent.append(sample)
        sent.append(events.Progress(t=second + 0.5, changed=1, paths=["m.jsonl"], gap_seconds=1.0))
    return sent


@pytest.mark.slow
@pytest.mark.asyncio
async def test_segments_are_compressed_and_read_back_as_one_journal(
    tmp_path: Path, tree: int
) -> None:
    """Closed segments are gzip files, the open one plain; every reader sees every event."""
    journal = tmp_path / "soak.jsonl"
    events = real_events(tree, journal, 200)
    serializer = await serialize(journal, events, segment_bytes=4096)
    segments = journal_segments(journal)
    assert len(segments) >= 3
    assert all(s.name.endswith(".gz") for s in segments[:-1])
    assert segments[-1] == journal
    gzip.decompress(segments[0].read_bytes())  # a complete gzip file
    assert is_journal(journal)
    read_back = list(read_journal(journal))
    assert [e["kind"] for e in read_back] == [e.KIND for e in events]
    # The dicts read back are exactly the ones the serializer folded.
    folded = RunState()
    for event in read_back:
        folded.add(event)
    clean = serializer.builder.build(status="passed", ended_t=200.0, log_tail="", monitor={})
    recovered = folded.build(status="passed", ended_t=200.0, log_tail="", monitor={})
    assert recovered == clean
    # Sample lines are compact: most are far shorter than the first, full one.
    text = b"".join(gzip.decompress(s.read_bytes()) for s in segments[:-1])
    sample_lines = [line for line in text.splitlines() if b'"kind":"sample"' in line]
    assert sum(b'"~"' in line for line in sample_lines) > len(sample_lines) // 2


@pytest.mark.slow
@pytest.mark.asyncio
async def test_recover_reads_a_segmented_journal_and_an_old_plain_one(
    tmp_path: Path, tree: int
) -> None:
    """``recover`` rebuilds the same artifact from a rotated journal as from one plain file."""
    rotated = tmp_path / "a" / "soak.jsonl"
    plain = tmp_path / "b" / "soak.jsonl"
    rotated.parent.mkdir()
    plain.parent.mkdir()
    events = real_events(tree, rotated, 60)
    await serialize(rotated, events, segment_bytes=4096)
    # Today's journals have full lines only: the same events, written the old way.
    plain.write_text("".join(json.dumps(e) + "\n" for e in read_journal(rotated)))
    a, b = artifact_from_journal(rotated), artifact_from_journal(plain)
    for artifact in (a, b):
        artifact["monitor"].pop("recovered_from_journal")
    assert a == b
    assert a["monitor"]["unreadable_journal_lines"] == 0
    assert a["failures"][0]["reason"] == "monitor_lost"


def test_a_segment_left_plain_and_a_truncated_line_are_read(tmp_path: Path) -> None:
    """A closed segment whose compression never finished is read plain; a cut line is skipped."""
    journal = tmp_path / "soak.jsonl"
    encoder = JournalEncoder()
    first = [{"t": 0.0, "kind": "header", "monitor_pid": 1}] + [
        {"t": float(i), "kind": "sample", "tree": {"rss_bytes": 100 + i % 3}} for i in range(1, 5)
    ]
    (tmp_path / "soak.jsonl.000001").write_text("".join(encoder.encode(e) for e in first))
    # Its compressed copy was being written when the monitor died: never complete, ignored.
    (tmp_path / "soak.jsonl.000001.gz.tmp").write_bytes(b"\x1f\x8b")
    encoder.reset()
    second = [{"t": float(i), "kind": "sample", "tree": {"rss_bytes": 7}} for i in range(5, 8)]
    journal.write_text("".join(encoder.encode(e) for e in second) + '{"t": 8.0, "ki')
    reader = JournalReader(journal)
    assert list(reader) == first + second
    assert reader.unreadable == 1


def test_a_reader_given_kinds_decodes_no_other_line(tmp_path: Path) -> None:
    """Given the kinds a reader wants, it decodes only their lines: a compact sample's patch
    chain is never applied, and a sample line past the bounds is never met."""
    journal = tmp_path / "soak.jsonl"
    encoder = JournalEncoder()
    events = [{"t": 0.0, "kind": "header", "monitor_pid": 1}]
    for i in range(1, 6):
        events.append({"t": float(i), "kind": "sample", "tree": {"rss_bytes": i}})
        events.append({"t": i + 0.5, "kind": "progress", "changed": 1, "paths": ["m"]})
    bomb = '{"t":9.0,"kind":"sample","~":{"{":{"v":{"[":[],"n":3000000000}}}}\n'
    journal.write_text("".join(encoder.encode(e) for e in events) + bomb)
    with pytest.raises(bounded.UnreadableFileError):
        list(JournalReader(journal))
    progress = [e for e in events if e["kind"] == "progress"]
    assert list(JournalReader(journal, kinds={"progress"})) == progress


def test_live_tail_follows_the_journal_across_a_rotation(tmp_path: Path) -> None:
    """The live view reads a closed segment's last lines, then goes on in the new one."""
    journal = tmp_path / "soak.jsonl"
    encoder = JournalEncoder()
    lines = [encoder.encode({"t": 0.0, "kind": "header", "monitor_pid": 7})]
    lines += [encoder.encode({"t": 1.0, "kind": "sample", "v": [1, 2]})]
    journal.write_text("".join(lines))
    tail = JournalTail(journal, monitor_pid=7)
    try:
        assert [e["kind"] for e in tail.read()] == ["header", "sample"]
        with journal.open("a") as f:
            f.write(encoder.encode({"t": 2.0, "kind": "sample", "v": [1, 3]}))
        os.link(journal, tmp_path / "soak.jsonl.000001")
        fresh = tmp_path / "soak.jsonl.new"
        encoder.reset()
        fresh.write_text(encoder.encode({"t": 3.0, "kind": "sample", "v": [4]}))
        os.rename(fresh, journal)
        assert tail.read() == [
            {"t": 2.0, "kind": "sample", "v": [1, 3]},
            {"t": 3.0, "kind": "sample", "v": [4]},
        ]
    finally:
        tail.close()


SERIALIZER_CHILD = r"""
import anyio, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from asyncsoak._record._artifact import RunState
from asyncsoak._record._artifact_io import create_private_file
from asyncsoak._contract.events import Event, Header, Progress
from asyncsoak._sampling._proc_sampler import ProcSampler
from asyncsoak._record._serializer import Serializer
from tests.test_journal import header

journal, root = Path(sys.argv[1]), int(sys.argv[2])

async def main():
    serializer = Serializer(create_private_file(journal), RunState(),
                            journal_path=journal, flush_interval=0.05, segment_bytes=16384)
    send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=100)
    sampler = ProcSampler(root)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serializer.run, receive)
        await send.send(header(journal))
        for i in range(1, 100000):
            await send.send(sampler.read(i * 0.05))
            if i % 20 == 0:
                await send.send(Progress(t=i * 0.05, changed=1, paths=["x"], gap_seconds=1.0))
            if i == 60:
                # Longer than the flush interval: sample 60 is due on disk by now.
                await anyio.sleep(0.2)
                print("ready", flush=True)
            await anyio.sleep(0.01)

anyio.run(main)
"""


@pytest.mark.slow
def test_a_monitor_killed_at_any_moment_loses_at_most_the_last_interval(
    tmp_path: Path, tree: int
) -> None:
    """SIGKILL mid-run: the journal reads back whole up to the last interval, and recovers."""
    journal = tmp_path / "soak.jsonl"
    repo = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen(
        [sys.executable, "-c", SERIALIZER_CHILD, str(journal), str(tree), repo],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.kill()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    reader = JournalReader(journal)
    events = list(reader)
    assert reader.unreadable <= 1  # at most the line being written
    samples = [e for e in events if e["kind"] == EventKind.SAMPLE]
    assert len(samples) >= 60
    # No gap: every sample up to the last one written is there, in order.
    assert [round(e["t"] / 0.05) for e in samples] == list(range(1, len(samples) + 1))
    artifact = artifact_from_journal(journal)
    assert artifact["monitor"]["samples"]["sample"] == len(samples)
    assert artifact["failures"][0]["reason"] == "monitor_lost"


async def lines_written(journal: Path, n: int) -> None:
    """Until the journal holds ``n`` lines (a bounded poll: the writes are the serializer's)."""
    with anyio.fail_after(10):
        for _ in range(100_000):
            if journal.read_bytes().count(b"\n") >= n:
                return
            await anyio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_proc_sample_writes_what_waits_at_once(tmp_path: Path, tree: int) -> None:
    """Progress waits for the interval's write; the next proc sample takes it out at once, so
    a steady soak needs no journal timer (the flush interval here is a minute)."""
    journal = tmp_path / "soak.jsonl"
    serializer = Serializer(
        create_private_file(journal), RunState(), journal_path=journal, flush_interval=60.0
    )
    sample = ProcSampler(tree, disk_paths={"output": tmp_path}).read(1.0)
    assert sample is not None
    send, receive = anyio.create_memory_object_stream[events.Event](max_buffer_size=8)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with send:
                await send.send(header(journal))  # written at once
                await lines_written(journal, 1)
                await send.send(
                    events.Progress(t=0.5, changed=1, paths=["m.jsonl"], gap_seconds=None)
                )
                await send.send(sample)
                await lines_written(journal, 3)
    kinds = [event["kind"] for event in read_journal(journal)]
    assert kinds[-2:] == ["progress", "sample"]
    for fd in serializer.lock_fds:
        os.close(fd)


def test_a_journal_from_a_newer_asyncsoak_is_named_so_not_damaged(tmp_path: Path) -> None:
    """A failure reason this version does not know: recover says where the journal may come
    from, rather than calling it damaged or foreign."""
    journal = tmp_path / "soak.jsonl"
    encoder = JournalEncoder()
    lines = [
        events.event_to_json(header(journal)),
        {"t": 1.0, "kind": "failure", "reason": "quantum_flux", "message": "m", "at": "x"},
    ]
    journal.write_text("".join(encoder.encode(line) for line in lines))
    with pytest.raises(JournalError) as raised:
        artifact_from_journal(journal)
    message = str(raised.value)
    assert "'quantum_flux'" in message
    assert "newer asyncsoak" in message
    assert "damaged" not in message


@pytest.mark.parametrize("elsewhere", [False, True])
def test_recover_refuses_a_journal_a_live_soak_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], elsewhere: bool
) -> None:
    """`recover` on the journal of a soak still running (its lock held, as the soak holds it):
    exit status 2 naming the live soak, and no artifact written (a false monitor_lost at the
    live soak's output path, before)."""
    from asyncsoak._supervisor._outputs import lock_journal
    from asyncsoak.cli import main

    journal = tmp_path / "soak.jsonl"
    journal.write_text(JournalEncoder().encode(events.event_to_json(header(journal))))
    fd = lock_journal(journal)
    try:
        other = ["-o", str(tmp_path / "elsewhere.json")] if elsewhere else []
        status = main(["recover", str(journal), *other])
    finally:
        os.close(fd)
    assert status == 2
    err = capsys.readouterr().err
    assert "still running" in err
    assert str(journal) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["soak.jsonl"]
