"""The GPU sampler against a fake nvidia-smi replaying the H200 captures, with real processes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from asyncsoak._contract._sink import SinkCounters, SoakClock, open_event_queue
from asyncsoak._contract.events import (
    Event,
    SamplerDegraded,
    SamplerNote,
    SamplerRecovered,
    SeriesSource,
    event_to_json,
)
from asyncsoak._sampling._gpu_sample import EccWatch, GpuSample
from asyncsoak._sampling._gpu_sampler import run_gpu_sampler
from asyncsoak._sampling._nvidia_smi import GpuProcess, data_lines, parse_gpu_line

from .gpu_support import (
    CAPTURED_PID,
    FIXTURE_GPU_FIELDS,
    FakeNvidiaSmi,
    exited,
    fixture,
    install_fake_nvidia_smi,
)

INTERVAL = 0.05
#: Bound on stopping the sampler: SIGTERM grace + SIGKILL wait of the loops, plus margin.
STOP_BOUND = 3.5

Until = Callable[[list[Event]], bool]


@asynccontextmanager
async def child_process() -> AsyncIterator[Process]:
    """A real child that says "ready" and runs until its stdin closes."""
    script = "import sys; print('ready', flush=True); sys.stdin.read()"
    process = await anyio.open_process(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 100)
        assert line == b"ready"
        yield process
    finally:
        with anyio.fail_after(10):
            await process.aclose()


async def sample(
    fake: FakeNvidiaSmi | Path,
    until: Until,
    *,
    tree: Callable[[], Collection[int]] = frozenset,
    call_timeout: float = 5.0,
) -> tuple[list[Event], SinkCounters, float]:
    """Run the sampler until ``until(events)``, cancel it; the events, counters and stop time."""
    path = fake.path if isinstance(fake, FakeNvidiaSmi) else fake
    sink, receive = open_event_queue(SoakClock())
    events: list[Event] = []
    stop_seconds = 0.0
    with anyio.fail_after(15), receive:
        async with anyio.create_task_group() as tg:
            run = partial(
                run_gpu_sampler,
                sink,
                interval=INTERVAL,
                tree_pids=tree,
                nvidia_smi=str(path),
                call_timeout=call_timeout,
            )

            async def produce() -> None:
                async with sink:
                    await run()

            tg.start_soon(produce)
            async for event in receive:
                events.append(event)
                if until(events):
                    break
            started = time.monotonic()
            tg.cancel_scope.cancel()
        stop_seconds = time.monotonic() - started
    if isinstance(fake, FakeNvidiaSmi):
        assert_nothing_left(fake)
    return events, sink.counters, stop_seconds


def assert_nothing_left(fake: FakeNvidiaSmi) -> None:
    """Every nvidia-smi the sampler started has ended."""
    left = [i for i in fake.invocations() if not exited(i["pid"], 0)]
    assert left == []


def samples(events: list[Event], source: str | None = None) -> list[GpuSample]:
    return [
        e for e in events if isinstance(e, GpuSample) and (source is None or e.source == source)
    ]


def notes(events: list[Event]) -> list[SamplerNote]:
    return [e for e in events if isinstance(e, SamplerNote)]


def has_loop_samples(count: int) -> Until:
    return lambda events: len(samples(events, "loop")) >= count


@pytest.mark.slow
@pytest.mark.asyncio
async def test_loaded_gpu_sample_matches_the_child_process(tmp_path: Path) -> None:
    """Under load, loop samples show GPU series and the tree's process and its GPU memory."""
    async with child_process() as child:
        fake = install_fake_nvidia_smi(tmp_path, "load", pid=child.pid)
        # Until both loops (GPUs, processes) have started too: a loaded machine starts the
        # second one's interpreter after the first loop's samples.
        three_loop_samples = has_loop_samples(3)
        events, counters, _ = await sample(
            fake,
            lambda got: three_loop_samples(got) and len(fake.loops()) >= 2,
            tree=lambda: {child.pid},
        )
    first = samples(events)[0]
    assert first.source == "call"
    loop = samples(events, "loop")[-1]
    (gpu,) = loop.gpus
    assert gpu.memory_used_mib == 21363.0
    assert gpu.clock_event_reasons == ["sw_power_cap"]
    (proc,) = loop.processes or []
    assert (proc.pid, proc.in_tree, proc.gpu_index) == (child.pid, True, 0)
    assert proc.used_gpu_memory_mib == 21354.0
    points = loop.series_points()
    assert points["gpu0"]["utilization_gpu_percent"] == 99.0
    assert points["gpu0"]["memory_used_mib"] == 21363.0
    assert points["gpu0"]["power_draw_w"] == 690.94
    assert points["gpu0"]["temperature_gpu_c"] == 59.0
    assert points["gpu0"]["clocks_sm_mhz"] == 1485.0
    assert points["gpu_tree"] == {
        "tree_gpu_memory_mib": 21354.0,
        "tree_gpu_processes": 1.0,
        "other_gpu_memory_mib": 0.0,
    }
    assert loop.summary_labels() == {"gpu0": {"throttle_reasons": ["sw_power_cap"]}}
    assert isinstance(loop, SeriesSource)
    json.dumps(event_to_json(loop), allow_nan=False)
    assert counters.sampler_errors == 0
    assert len(fake.loops()) == 2
    assert not any(isinstance(e, SamplerDegraded) for e in events)


@pytest.mark.asyncio
async def test_idle_gpu_has_no_processes_and_no_error(tmp_path: Path) -> None:
    """An idle GPU: the silent process loop means no processes, not a fault."""
    fake = install_fake_nvidia_smi(tmp_path, "idle")
    events, counters, _ = await sample(fake, has_loop_samples(5))
    assert all(s.processes == [] for s in samples(events))
    assert samples(events)[-1].series_points()["gpu_tree"]["tree_gpu_memory_mib"] == 0.0
    assert samples(events)[-1].gpus[0].clock_event_reasons == ["gpu_idle"]
    assert counters.sampler_errors == 0
    assert not any(isinstance(e, SamplerDegraded) for e in events)
    # fan.speed and retired_pages.pending (rows are remapped instead) are [N/A] on this board:
    # said once, not an error.  (Only this GPU's notes: every reader of /dev/kmsg sees the
    # kernel-log lines other tests write, such as an unreadable Xid record.)
    assert [n.message for n in notes(events) if n.message.startswith("gpu0 ")] == [
        "gpu0 fan.speed: [N/A] (recorded as null)",
        "gpu0 retired_pages.pending: [N/A] (recorded as null)",
    ]


@pytest.mark.asyncio
async def test_process_outside_the_tree_is_recorded_unmatched(tmp_path: Path) -> None:
    """A GPU process whose pid is not in the tree is recorded as not in it, never guessed."""
    fake = install_fake_nvidia_smi(tmp_path, "load")
    events, _, _ = await sample(fake, has_loop_samples(2), tree=lambda: {1})
    (proc,) = samples(events, "loop")[-1].processes or []
    assert (proc.pid, proc.in_tree) == (CAPTURED_PID, False)
    assert samples(events)[-1].series_points()["gpu_tree"] == {
        "tree_gpu_memory_mib": 0.0,
        "tree_gpu_processes": 0.0,
        "other_gpu_memory_mib": 21354.0,
    }
    (outside,) = [n for n in notes(events) if "outside the supervised tree" in n.message]
    assert outside.data == {"pids": [CAPTURED_PID]}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_processes_of_one_iteration_are_grouped(tmp_path: Path) -> None:
    """Lines sharing a timestamp make one iteration: the tree's process and a stranger together."""
    async with child_process() as child:
        fake = install_fake_nvidia_smi(tmp_path, "two", pid=child.pid)

        def two(events: list[Event]) -> bool:
            return any(len(s.processes or []) == 2 for s in samples(events, "loop"))

        events, _, _ = await sample(fake, two, tree=lambda: {child.pid})
    both = next(s for s in samples(events, "loop") if len(s.processes or []) == 2)
    by_pid = {p.pid: p for p in both.processes or []}
    assert by_pid[child.pid].in_tree
    assert by_pid[child.pid].used_gpu_memory_mib == 5638.0
    assert not by_pid[447].in_tree
    assert by_pid[447].name == "/opt/torch/.venv/bin/python3"
    assert both.series_points()["gpu_tree"]["tree_gpu_memory_mib"] == 5638.0
    assert both.series_points()["gpu_tree"]["other_gpu_memory_mib"] == 3590.0
    # The capture's first line of a new process shows a tiny, still-growing figure.
    assert (samples(events)[0].processes or [])[0].used_gpu_memory_mib == 14.0


@pytest.mark.asyncio
async def test_several_gpus_make_one_sample(tmp_path: Path) -> None:
    """The lines of all GPUs of one iteration make one sample with a series group per GPU."""
    fake = install_fake_nvidia_smi(tmp_path, "load", gpus=3)
    events, _, _ = await sample(fake, has_loop_samples(3))
    for s in samples(events):
        assert [g.index for g in s.gpus] == [0, 1, 2]
    assert {"gpu0", "gpu1", "gpu2", "gpu_tree"} == set(samples(events)[-1].series_points())


@pytest.mark.slow
@pytest.mark.asyncio
async def test_hung_nvidia_smi_degrades_and_cancels_promptly(tmp_path: Path) -> None:
    """nvidia-smi that never answers: degraded once, and cancelling stops at once, nothing left."""
    fake = install_fake_nvidia_smi(tmp_path, "hang")

    def degraded(events: list[Event]) -> bool:
        return any(isinstance(e, SamplerDegraded) for e in events)

    events, counters, stop_seconds = await sample(fake, degraded, call_timeout=1.0)
    (event,) = [e for e in events if isinstance(e, SamplerDegraded)]
    assert event.sampler == "gpu"
    assert "no answer within 1 s" in event.message
    assert samples(events) == []
    assert counters.sampler_errors >= 1
    assert stop_seconds < STOP_BOUND


@pytest.mark.slow
@pytest.mark.asyncio
async def test_loop_that_hangs_is_killed_and_sampling_recovers(tmp_path: Path) -> None:
    """A loop that stops printing: degraded, killed despite ignoring SIGTERM, then recovered."""
    fake = install_fake_nvidia_smi(tmp_path, "hang", hang_after=2)

    def recovered(events: list[Event]) -> bool:
        kinds = [type(e) for e in events]
        return SamplerRecovered in kinds and kinds[-1] is GpuSample

    events, _, stop_seconds = await sample(fake, recovered, call_timeout=1.0)
    kinds = [type(e).__name__ for e in events if not isinstance(e, SamplerNote | GpuSample)]
    assert kinds == ["SamplerDegraded", "SamplerRecovered"]
    degraded = next(e for e in events if isinstance(e, SamplerDegraded))
    assert degraded.message.startswith("nvidia-smi printed nothing for 1.05 s")
    assert samples(events, "loop")
    assert samples(events)[-1].source == "call"
    assert stop_seconds < STOP_BOUND


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cancelled_while_a_hung_loop_is_being_stopped(tmp_path: Path) -> None:
    """Cancelling while hung loops are being killed still ends within the bound, nothing left."""
    fake = install_fake_nvidia_smi(tmp_path, "hang", hang_after=2)

    def degraded(events: list[Event]) -> bool:
        return any(isinstance(e, SamplerDegraded) for e in events)

    _, _, stop_seconds = await sample(fake, degraded, call_timeout=1.0)
    assert stop_seconds < STOP_BOUND


@pytest.mark.asyncio
async def test_missing_nvidia_smi_is_one_note_then_the_task_returns(tmp_path: Path) -> None:
    """No nvidia-smi: a single "no GPU data" note and the task ends by itself, not failing."""
    sink, receive = open_event_queue(SoakClock())
    missing = tmp_path / "nvidia-smi"
    with anyio.fail_after(10), receive:
        async with sink:
            await run_gpu_sampler(
                sink, interval=INTERVAL, tree_pids=frozenset, nvidia_smi=str(missing)
            )
        events = [e async for e in receive]
    assert len(events) == 1
    assert isinstance(events[0], SamplerNote)
    assert events[0].message.startswith("no GPU data")
    assert sink.counters.sampler_errors == 0


@pytest.mark.asyncio
async def test_no_devices_is_one_note_then_the_task_returns(tmp_path: Path) -> None:
    """ "No devices were found" (exit 6): "no GPU data" once, and the task ends by itself."""
    fake = install_fake_nvidia_smi(tmp_path, "no-devices")
    sink, receive = open_event_queue(SoakClock())
    with anyio.fail_after(10), receive:
        async with sink:
            await run_gpu_sampler(
                sink, interval=INTERVAL, tree_pids=frozenset, nvidia_smi=str(fake.path)
            )
        events = [e async for e in receive]
    assert [type(e) for e in events] == [SamplerNote]
    assert isinstance(events[0], SamplerNote)
    assert events[0].message == "no GPU data: exit status 6: No devices were found"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_loop_that_dies_falls_back_to_calls_then_loops_again(tmp_path: Path) -> None:
    """A loop that ends: one call per sample, then the loop is tried again later."""
    fake = install_fake_nvidia_smi(tmp_path, "load", loop_iterations=2)

    def looped_again(events: list[Event]) -> bool:
        sources = [s.source for s in samples(events)]
        return "call" in sources[1:] and sources[-1] == "loop" and "call" in sources[-3:]

    events, counters, _ = await sample(fake, looped_again)
    sources = [s.source for s in samples(events)]
    first_loop = sources.index("loop")
    assert "call" in sources[first_loop:]
    ended = [n.message for n in notes(events) if "loop ended" in n.message]
    assert ended
    assert "one nvidia-smi call per sample" in ended[0]
    assert len(fake.loops()) >= 3
    assert counters.sampler_errors == 0
    assert not any(isinstance(e, SamplerDegraded) for e in events)


@pytest.mark.asyncio
async def test_garbage_output_is_recorded_not_raised(tmp_path: Path) -> None:
    """Lines that are not rows: counted as errors, noted, degraded, and the task lives on."""
    fake = install_fake_nvidia_smi(tmp_path, "garbage")

    def errors_seen(events: list[Event]) -> bool:
        return any(isinstance(e, SamplerDegraded) for e in events) and len(notes(events)) >= 1

    events, counters, _ = await sample(fake, errors_seen)
    assert samples(events) == []
    assert counters.sampler_errors >= 1
    (note,) = notes(events)
    assert note.message.startswith("unreadable nvidia-smi output: expected 31 values, got 1")
    assert len(fake.calls()) >= 1


@pytest.mark.asyncio
async def test_field_an_older_driver_rejects_is_asked_by_its_old_name(tmp_path: Path) -> None:
    """An nvidia-smi that rejects clocks_event_reasons.active is asked the old throttle name."""
    fake = install_fake_nvidia_smi(tmp_path, "load", reject=("clocks_event_reasons.active",))
    events, counters, _ = await sample(fake, has_loop_samples(2))
    assert notes(events)[0].message == (
        "nvidia-smi does not know the field 'clocks_event_reasons.active'; "
        "asking for 'clocks_throttle_reasons.active' instead"
    )
    assert samples(events, "loop")[-1].gpus[0].clock_event_reasons == ["sw_power_cap"]
    assert all("clocks_event_reasons" not in " ".join(i["argv"]) for i in fake.loops())
    assert counters.sampler_errors == 0


def test_ecc_counter_rise_is_reported() -> None:
    """A volatile ECC counter that rises (or starts above zero) is reported with before/after,
    the GPU named by its label, UUID and bus id."""
    line = data_lines(fixture("gpu_load_csv_nn.txt"), FIXTURE_GPU_FIELDS)[0]
    _, clean = parse_gpu_line(line, FIXTURE_GPU_FIELDS)
    watch = EccWatch()
    assert watch.update([clean]) == []
    assert watch.update([clean]) == []
    worse = dataclasses.replace(clean, ecc_corrected_volatile=3)
    (message, data) = watch.update([worse])[0]
    assert message == "gpu0 ecc.errors.corrected.volatile.total is 3 (was 0)"
    assert data == {
        "gpu": 0,
        "uuid": clean.uuid,
        "bus_id": clean.bus_id,
        "counter": "ecc.errors.corrected.volatile.total",
        "before": 0,
        "after": 3,
    }
    assert watch.update([worse]) == []
    started_bad = EccWatch().update([dataclasses.replace(clean, ecc_uncorrected_volatile=1)])
    assert [m for m, _ in started_bad] == ["gpu0 ecc.errors.uncorrected.volatile.total is 1"]


def test_sample_with_unknown_processes_has_null_tree_memory() -> None:
    """When the process list could not be read, the tree's GPU memory is unknown, not zero."""
    line = data_lines(fixture("gpu_idle_csv_nn.txt"), FIXTURE_GPU_FIELDS)[0]
    _, reading = parse_gpu_line(line, FIXTURE_GPU_FIELDS)
    unknown = GpuSample(t=1.0, gpus=[reading], processes=None, source="call")
    assert unknown.series_points()["gpu_tree"]["tree_gpu_memory_mib"] is None
    known = GpuSample(
        t=1.0,
        gpus=[reading],
        processes=[GpuProcess(pid=5, used_gpu_memory_mib=None, in_tree=True)],
        source="call",
    )
    assert known.series_points()["gpu_tree"]["tree_gpu_processes"] == 1.0
