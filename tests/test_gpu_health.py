"""GPU health judged: real Xid lines in the kernel log, ECC counts, remaps and lost GPUs from the
fake nvidia-smi, during real soaks.

Every reader of ``/dev/kmsg`` on the machine sees every line, and other tests may write Xid lines
of their own: each soak here gets a PCI domain of its own (``FAKE_SMI_BUS_ID``), so a line is
only ever matched by the soak it was written for.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator

from asyncsoak import SoakFailureError, run_soak
from asyncsoak._analysis._gpu_health import ThrottleTimeline
from asyncsoak._contract import events
from asyncsoak._contract._sink import SoakClock, open_event_queue
from asyncsoak._export._soak_metrics import SoakMetrics
from asyncsoak._record._artifact import RunState
from asyncsoak._record._artifact_io import check_artifact
from asyncsoak._sampling._gpu_health import GpuHealthWatch, VisibleDevices, lost_gpu_line
from asyncsoak._sampling._gpu_sampler import run_gpu_sampler
from asyncsoak._sampling._nvidia_smi import GpuReading, parse_remapped_rows_line
from asyncsoak._sampling._xid import XID_CODES, MalformedXidError, parse_xid, pci_key
from asyncsoak._view._compare import compare
from asyncsoak._view._evidence import gather
from asyncsoak._view._live_state import LiveState
from asyncsoak._view._summary import format_summary, summarize
from asyncsoak._view.report._tables import evidence_html

from .conftest import assert_valid, fast_limits, journal, py
from .gpu_support import install_fake_nvidia_smi
from .metrics_support import exposition

#: Long enough for a tick on a loaded two-core machine, short enough for a quick test.
INTERVAL = 0.25
#: Scheduling slack on top of the two sample intervals the rule promises.
SLACK = 0.15


def kmsg_writable() -> bool:
    return os.access("/dev/kmsg", os.W_OK)


needs_kmsg = pytest.mark.skipif(not kmsg_writable(), reason="/dev/kmsg is not writable here")


def unique_bus_id() -> tuple[str, str]:
    """A PCI address no other soak on this machine uses: (nvidia-smi's form, the Xid line's)."""
    domain = random.randrange(0x1000, 0xFFF0)
    bus = random.randrange(0x10, 0xF0)
    return f"0000{domain:04X}:{bus:02X}:00.0", f"{domain:04x}:{bus:02x}:00"


#: The child: says its pid to the fake nvidia-smi (so the GPU is the tree's), makes progress,
#: and at step 12 does what ``ACT`` says, writing the monotonic time it did so to ``WHEN``; a
#: ``fault PATH TEXT`` action writes the fake's fault file once the fake has printed a healthy
#: GPU (its ``.seen`` file, 30 s at most: on a loaded machine the first reading can come after
#: step 12).
CHILD = """
import os, pathlib, sys, time
progress, pid_file, act, when = (pathlib.Path(a) for a in sys.argv[1:5])
progress.mkdir(parents=True, exist_ok=True)
pid_file.write_text(str(os.getpid()))
for step in range(int(sys.argv[5])):
    with open(progress / "steps.txt", "a") as f:
        f.write(f"{step}\\n")
    if step == 12:
        for line in act.read_text().split("\\n//\\n"):
            kind, _, text = line.partition(" ")
            if kind == "kmsg":
                with open("/dev/kmsg", "w") as k:
                    k.write(text + "\\n")
            elif kind == "fault":
                path, _, text = text.partition(" ")
                deadline = time.monotonic() + 30
                while not os.path.exists(path + ".seen") and time.monotonic() < deadline:
                    time.sleep(0.01)
                pathlib.Path(path).write_text(text)
            else:
                pathlib.Path(kind).write_text(text)
        when.write_text(repr(time.monotonic()))
    time.sleep(0.05)
"""


def soak_command(tmp_path: Path, actions: list[str], steps: int = 400) -> list[str]:
    act = tmp_path / "act.txt"
    act.write_text("\n//\n".join(actions))
    return [
        *py(CHILD),
        str(tmp_path / "progress"),
        str(tmp_path / "gpu.pid"),
        str(act),
        str(tmp_path / "when.txt"),
        str(steps),
    ]


async def failed_soak(
    tmp_path: Path, actions: list[str], visible: str | None = None, **fake: Any
) -> SoakFailureError:
    """The soak of ``actions`` under the fake nvidia-smi, with ``CUDA_VISIBLE_DEVICES=visible``
    when given; it must fail."""
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", **fake)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=soak_command(tmp_path, actions),
            env=env,
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)),
        )
    return info.value


def seconds_to_failure(tmp_path: Path, error: SoakFailureError) -> float:
    """From the child's act to the failure, both on the system-wide monotonic clock."""
    done = float((tmp_path / "when.txt").read_text())
    events = journal(Path(error.artifact["monitor"]["journal_path"]))
    start = events[0]["monotonic_start"]
    failure = next(e for e in events if e["kind"] == "failure")
    return float(start + failure["t"] - done)


@pytest.mark.slow
@needs_kmsg
@pytest.mark.asyncio
async def test_an_xid_in_the_kernel_log_fails_the_soak_naming_it(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A real Xid 79 line for the tree's GPU: gpu_fault within two intervals, the first line
    naming the Xid, its meaning and the action; the artifact names the GPU."""
    bus_id, xid_pci = unique_bus_id()
    line = f"<4>NVRM: Xid (PCI:{xid_pci}): 79, pid=4242, name=python3, GPU has fallen off the bus."
    error = await failed_soak(tmp_path, [f"kmsg {line}"], bus_id=bus_id)
    assert error.reason == "gpu_fault"
    first = str(error).splitlines()[0]
    assert "Xid 79: GPU has fallen off the bus" in first
    assert "Action: drain the node" in first
    assert seconds_to_failure(tmp_path, error) <= 2 * INTERVAL + SLACK
    artifact = error.artifact
    assert_valid(artifact, schema)
    failure = artifact["failures"][0]
    assert failure["gpu"]["bus_id"] == bus_id
    assert failure["gpu"]["index"] == 0
    assert failure["gpu"]["uuid"].startswith("GPU-")
    health = artifact["gpu_health"]["gpu0"]
    (xid,) = health["xid"]
    assert xid["code"] == 79
    assert xid["meaning"] == "GPU has fallen off the bus"
    assert xid["action"].startswith("drain the node")
    assert xid["at"] is not None
    assert health["faults"][0]["used"] is True
    # Every view leads with it: summary (text and JSON), the report's advice, compare.
    typed = check_artifact(artifact)
    summary = summarize(typed)
    assert summary["reasons"][0]["gpu"]["bus_id"] == bus_id
    assert summary["gpu_faults"][0]["xid"] == 79
    assert summary["look_first"][0].startswith("GPU fault ")
    assert gather(typed).next_steps[0] == (
        f"GPU 0 ({bus_id}): drain the node; check the GPU's power and PCIe seating, then reboot."
    )
    evidence = evidence_html(typed, summary)
    assert '<dt>GPU fault</dt><dd id="cause"><b>gpu0 (' in evidence
    healthy = copy.deepcopy(artifact)
    healthy["gpu_health"]["gpu0"]["faults"] = []
    rows = {r.key: r for r in compare(check_artifact(healthy), typed).rows}
    assert rows["gpu.faults"].regressed


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("ecc", "uncorrectable ECC errors rose from 0 to 2"),
        ("lost", "GPU is lost (nvidia-smi: Unable to determine the device handle: GPU is lost."),
        ("remap", "row remapping pending (remapped_rows.pending) during the run"),
    ],
)
async def test_a_gpu_fault_from_nvidia_smi_fails_the_soak(
    tmp_path: Path, fault: str, expected: str
) -> None:
    """ECC count rising, a GPU lost, a row remap pending: gpu_fault within two intervals."""
    fault_file = tmp_path / "fault"
    error = await failed_soak(
        tmp_path, [f"fault {fault_file} {fault}"], fault_file=fault_file, bus_id=unique_bus_id()[0]
    )
    assert error.reason == "gpu_fault"
    assert expected in str(error).splitlines()[0]
    assert "Action: " in str(error).splitlines()[0]
    assert seconds_to_failure(tmp_path, error) <= 2 * INTERVAL + SLACK
    health = error.artifact["gpu_health"]["gpu0"]
    assert health["lost"] is (fault == "lost")
    if fault == "ecc":
        assert health["ecc_uncorrected"] == {"start": 0, "end": 2}
    if fault == "remap":
        assert health["remapped_rows"]["pending"] == {"start": False, "end": True}


@pytest.mark.asyncio
@pytest.mark.parametrize(("fault", "kind"), [("gone", "lost"), ("reset", "reset_required")])
async def test_the_used_gpu_of_two_failing_is_a_gpu_fault_naming_it_by_identity(
    tmp_path: Path, fault: str, kind: str
) -> None:
    """Two GPUs, ``CUDA_VISIBLE_DEVICES=0``: GPU 0 dropped from the list (the survivor
    renumbered 0), or reading ``[GPU requires reset]`` in every reading: gpu_fault naming
    GPU 0's UUID and bus id, never GPU 1's."""
    fault_file = tmp_path / "fault"
    bus_id = unique_bus_id()[0]
    error = await failed_soak(
        tmp_path,
        [f"fault {fault_file} {fault}"],
        visible="0",
        fault_file=fault_file,
        bus_id=bus_id,
        gpus=2,
    )
    assert error.reason == "gpu_fault"
    failure = error.artifact["failures"][0]
    assert failure["gpu"]["index"] == 0
    assert failure["gpu"]["bus_id"] == bus_id
    survivor = error.artifact["gpu_health"]["gpu1"]
    assert failure["gpu"]["uuid"] != survivor["uuid"]
    assert survivor["bus_id"] not in failure["message"]
    assert survivor["faults"] == []
    assert [f["fault"] for f in error.artifact["gpu_health"]["gpu0"]["faults"]] == [kind]
    assert seconds_to_failure(tmp_path, error) <= 3 * INTERVAL + SLACK


@pytest.mark.slow
@needs_kmsg
@pytest.mark.asyncio
async def test_bad_and_foreign_xid_lines_fail_nothing(tmp_path: Path) -> None:
    """A malformed Xid line, an Xid for an address that is no GPU here and one for a GPU the
    run does not use: the soak passes, with one warning (the unused GPU's)."""
    bus_id, _ = unique_bus_id()
    domain, bus = bus_id[4:8].lower(), int(bus_id[9:11], 16)
    other_gpu = f"{domain}:{bus + 1:02x}:00"
    nowhere = f"{domain}:{(bus + 7) % 256:02x}:00"
    actions = [
        f"kmsg <4>NVRM: Xid (PCI:{domain}:zz): 79, pid=1, name=x, GPU has fallen off the bus.",
        f"kmsg <4>NVRM: Xid (PCI:{nowhere}): 79, pid=1, name=x, GPU has fallen off the bus.",
        f"kmsg <4>NVRM: Xid (PCI:{other_gpu}): 48, pid=1, name=x, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer.",
    ]
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", gpus=2, bus_id=bus_id)
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=soak_command(tmp_path, actions, steps=40),
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)),
        )
    assert artifact["status"] == "passed", artifact["failures"]
    gpu_warnings = [w for w in artifact["warnings"] if "Xid" in w]
    assert len(gpu_warnings) == 1, artifact["warnings"]
    assert gpu_warnings[0].startswith("gpu1 (")
    assert "Xid 48: double-bit (uncorrectable) ECC error" in gpu_warnings[0]
    assert gpu_warnings[0].endswith("(on a GPU this run does not use)")
    assert artifact["gpu_health"]["gpu1"]["faults"][0]["used"] is False
    notes = [n["message"] for n in artifact["monitor"]["sampler_notes"]]
    assert any(n.startswith("unreadable Xid record") for n in notes), notes


@pytest.mark.slow
@pytest.mark.asyncio
async def test_rows_of_one_loop_iteration_stamped_apart_lose_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi's loop stamping each GPU's row as it reads it (a millisecond apart): every
    iteration is still whole, no GPU is called lost and the soak passes."""
    monkeypatch.setenv("FAKE_SMI_ROW_STAMPS", "1")
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", gpus=3)
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=soak_command(tmp_path, [f"{tmp_path / 'noop.txt'} -"], steps=30),
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2"},
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)),
        )
    assert artifact["status"] == "passed", artifact["failures"]
    assert not [w for w in artifact["warnings"] if "lost" in w], artifact["warnings"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_gpu_row_that_cannot_be_parsed_is_no_lost_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every second loop iteration prints a GPU's row cut short: a sampler note, not a GPU
    lost; the soak passes."""
    monkeypatch.setenv("FAKE_SMI_TRUNCATE_ROW", "1")
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", gpus=2)
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=soak_command(tmp_path, [f"{tmp_path / 'noop.txt'} -"], steps=30),
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"},
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)),
        )
    assert artifact["status"] == "passed", artifact["failures"]
    assert not [w for w in artifact["warnings"] if "lost" in w], artifact["warnings"]
    notes = [n["message"] for n in artifact["monitor"]["sampler_notes"]]
    assert any(n.startswith("unreadable nvidia-smi output") for n in notes), notes


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_driver_library_mismatch_degrades_the_sampler_and_fails_nothing(
    tmp_path: Path,
) -> None:
    """nvidia-smi answering "Driver/library version mismatch" (a driver updated under a run):
    the GPU sampler degrades, no GPU is called lost and the soak passes."""
    fault = tmp_path / "fault.txt"
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", gpus=2, fault_file=fault)
    with anyio.fail_after(60):
        artifact: Mapping[str, Any] = await run_soak(
            command=soak_command(tmp_path, [f"fault {fault} nvml"], steps=40),
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"},
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)),
        )
    assert artifact["status"] == "passed", artifact["failures"]
    assert not artifact.get("gpu_health", {}).get("gpu0", {}).get("faults"), artifact["gpu_health"]
    notes = [n["message"] for n in artifact["monitor"]["sampler_notes"]]
    assert any("version mismatch" in n for n in notes), notes


def pid_not_here() -> int:
    """A pid no process of this PID namespace has (as a container sees the host's pids)."""
    return next(p for p in range(4_000_000, 4_100_000) if not Path(f"/proc/{p}").exists())


@pytest.mark.slow
@needs_kmsg
@pytest.mark.asyncio
@pytest.mark.parametrize("other_job_here", [True, False], ids=["bare-metal", "container"])
async def test_with_no_visible_devices_an_xid_on_another_jobs_gpu_fails_only_a_container(
    tmp_path: Path, other_job_here: bool
) -> None:
    """CUDA_VISIBLE_DEVICES unset, the tree on no GPU: an Xid on a GPU that a process found
    here and outside the tree holds (another job on a shared node) is a warning; one whose pid
    cannot be found here (a container's nvidia-smi shows the host's pids) fails the run."""
    bus_id, xid_address = unique_bus_id()
    xid = f"kmsg <4>NVRM: Xid (PCI:{xid_address}): 79, pid=1, name=x, GPU has fallen off the bus."
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    artifact: Mapping[str, Any]
    async with await anyio.open_process(["sleep", "60"]) as other_job:
        try:
            pid = other_job.pid if other_job_here else pid_not_here()
            smi = install_fake_nvidia_smi(tmp_path, pid=pid, gpus=2, bus_id=bus_id)
            with anyio.fail_after(60):
                try:
                    artifact = await run_soak(
                        command=soak_command(tmp_path, [xid], steps=40),
                        env=env,
                        **fast_limits(
                            tmp_path, sample_interval_seconds=INTERVAL, nvidia_smi=str(smi.path)
                        ),
                    )
                except SoakFailureError as error:
                    artifact = error.artifact
        finally:
            other_job.kill()
    faults = artifact["gpu_health"]["gpu0"]["faults"]
    assert [(f["xid"], f["used"]) for f in faults] == [(79, not other_job_here)]
    if other_job_here:
        assert artifact["status"] == "passed", artifact["failures"]
        assert any(w.endswith("(on a GPU this run does not use)") for w in artifact["warnings"])
    else:
        assert artifact["failures"][0]["reason"] == "gpu_fault"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_unreadable_kernel_log_is_one_warning(tmp_path: Path) -> None:
    """No kernel log to read (a container): one warning, and sampling goes on."""
    fake = install_fake_nvidia_smi(tmp_path, "idle")
    sink, receive = open_event_queue(SoakClock())
    posted: list[events.Event] = []
    with anyio.fail_after(15), receive:
        async with anyio.create_task_group() as tg:

            async def produce() -> None:
                async with sink:
                    await run_gpu_sampler(
                        sink,
                        interval=0.05,
                        tree_pids=frozenset,
                        nvidia_smi=str(fake.path),
                        kmsg=tmp_path / "no-kmsg",
                    )

            tg.start_soon(produce)
            async for event in receive:
                posted.append(event)
                if sum(e.KIND == "gpu_sample" for e in posted) >= 5:
                    break
            tg.cancel_scope.cancel()
    warnings = [e.message for e in posted if isinstance(e, events.WarningEvent)]
    assert warnings == [
        f"the kernel log ({tmp_path / 'no-kmsg'}) cannot be read here: GPU Xid errors are not "
        "watched (run as root, or with CAP_SYSLOG)"
    ]
    assert not any(isinstance(e, events.GpuFault) for e in posted)


def test_xid_lines_as_the_driver_prints_them_are_read() -> None:
    """The fixtures' Xid lines parse to their address and code; a malformed one is an error."""
    lines = fixture_lines("xid_lines.txt")
    records = [parse_xid(line) for line in lines]
    assert [r.code for r in records if r is not None] == [79, 48, 13, 119, 94, 63]
    first = records[0]
    assert first is not None
    assert first.pci == pci_key("00000000:3B:00.0")
    assert parse_xid("usb 1-1: new high-speed USB device") is None
    with pytest.raises(MalformedXidError):
        parse_xid("NVRM: Xid (PCI:nonsense): 79, pid=1")


def test_the_xid_table_covers_the_catalogue_codes_asked_for() -> None:
    """Every code the issue names has a meaning, an action and a documented default."""
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120):
        assert XID_CODES[code].meaning
        assert XID_CODES[code].action
    assert {c for c, x in XID_CODES.items() if x.fails} >= {48, 64, 74, 79, 94, 95, 119, 120}
    assert not XID_CODES[13].fails
    assert not XID_CODES[43].fails


def test_device_handle_errors_as_nvidia_smi_prints_them_are_a_lost_gpu() -> None:
    """Both spellings of nvidia-smi's "device handle" error name the GPU's address."""
    lost = [lost_gpu_line(line) for line in fixture_lines("device_handle_errors.txt")]
    assert [pci_key(p) for p, _ in filter(None, lost)] == [
        pci_key("0000:02:00.0"),
        pci_key("0000:07:00.0"),
    ]
    assert lost[0] is not None
    assert lost[0][1].startswith("GPU is lost")


def test_visible_devices_decide_which_gpus_the_run_uses() -> None:
    """CUDA_VISIBLE_DEVICES by index or UUID prefix, the tree's GPUs, and fail-closed when
    nothing says."""
    watch = GpuHealthWatch(VisibleDevices.parse("1,GPU-ea90"))
    assert watch.used(1, "GPU-x")
    assert watch.used(3, "GPU-ea9029a8")
    assert not watch.used(0, "GPU-other")
    watch.tree_on([0])
    assert watch.used(0, "GPU-other")
    unset = GpuHealthWatch(VisibleDevices.parse(None))
    assert unset.used(2, None)
    unset.tree_on([0])
    assert unset.used(0, None)
    assert not unset.used(2, None)
    assert not GpuHealthWatch(VisibleDevices.parse("")).used(0, None)
    assert GpuHealthWatch(VisibleDevices.parse("MIG-123")).used(5, None)


def fixture_lines(name: str) -> list[str]:
    path = Path(__file__).parent / "fixtures" / "nvidia-smi" / "faults" / name
    return [line for line in path.read_text().splitlines() if line.strip()]


#: A child that holds the GPU (its pid to the fake nvidia-smi), makes progress once, then
#: stalls doing ``STALL`` forever.
STALLER = """
import os, pathlib, sys, time
progress, pid_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
progress.mkdir(parents=True, exist_ok=True)
pid_file.write_text(str(os.getpid()))
(progress / "steps.txt").write_text("0\\n")
while True:
    STALL
"""


async def stalled(tmp_path: Path, stall: str, **fake: Any) -> SoakFailureError:
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", **fake)
    command = [
        *py(STALLER.replace("STALL", stall)),
        str(tmp_path / "progress"),
        str(tmp_path / "gpu.pid"),
    ]
    limits = fast_limits(
        tmp_path,
        nvidia_smi=str(smi.path),
        stale_progress_seconds=1.5,
        forensics=False,
    )
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(command=command, **limits)
    assert info.value.reason == "stale_progress"
    return info.value


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_stall_on_a_busy_gpu_at_low_power_is_a_busy_gpu_without_progress(
    tmp_path: Path,
) -> None:
    """100 % utilisation at 17 % of the power limit (119 W of 700 W): the hung-collective
    signature, with the figures, in the headline and in the summary."""
    error = await stalled(tmp_path, "time.sleep(1)", utilization=100, power_w=119)
    message = error.failures[0]["message"]
    assert "; the tree was idle (CPU " in message
    assert (
        "its GPUs: gpu0 busy with no progress (100% utilisation at 17% of its power limit "
        "(119 W of 700 W)): near-full utilisation at low power, the signature of a hung "
        "collective" in message
    )
    summary = summarize_text(error)
    flat = " ".join(summary.split())
    assert "GPUs while stalled: gpu0 busy with no progress (100% utilisation at 17%" in flat


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_stall_on_an_idle_gpu_is_an_idle_gpu(tmp_path: Path) -> None:
    """An idle GPU under a stalled tree is said to be idle, with its figures."""
    error = await stalled(tmp_path, "time.sleep(1)", mode="idle")
    message = error.failures[0]["message"]
    assert "; its GPUs: idle (gpu0 0% utilisation)" in message
    assert "hung collective (a rank" not in message


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hang_with_a_little_cpu_is_idle_in_the_headline_the_hints_and_the_advice(
    tmp_path: Path,
) -> None:
    """A waiting trainer whose helper threads use about a twentieth of a core: idle in the
    headline, idle in the summary, and no "it was only slow" advice."""
    # A cycle of about 93 ms, not the samples' 100 ms: a cycle in step with the sampling
    # would catch the spin (or the wait for a core) in every sample and read "runnable".
    # A 5 ms burst: on a loaded machine the burst waits for a core as long again, and a
    # longer one would be runnable in half the samples, as a starved spinner is.
    spin = (
        "end = time.monotonic() + 0.005\n"
        "    while time.monotonic() < end: pass\n"
        "    time.sleep(0.088)"
    )
    error = await stalled(tmp_path, spin, mode="idle")
    message = error.failures[0]["message"]
    assert "; the tree was idle (CPU " in message, message
    summary = summarize_text(error)
    assert "The process tree was idle while stalled" in summary
    assert "if it was only slow" not in summary
    assert "kept busy" not in summary


def summarize_text(error: SoakFailureError) -> str:
    """The summary's text and the report's advice, as a reader gets them."""
    artifact = check_artifact(error.artifact)
    steps = gather(artifact).next_steps
    return format_summary(summarize(artifact)) + "\n" + "\n".join(steps)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_slowdown_says_what_held_the_gpus_back(tmp_path: Path) -> None:
    """Progress slows while the GPU is held back by HW thermal slowdown: the slowdown warning
    names it with its share of the time, and so does the run's throttle warning."""
    body = """
import pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
for pause in [0.05] * 30 + [0.4] * 8:
    with open(progress / "steps.txt", "a") as f:
        f.write("step\\n")
    time.sleep(pause)
"""
    smi = install_fake_nvidia_smi(tmp_path, throttle_mask=0x44)
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(body), str(tmp_path / "progress")],
            **fast_limits(tmp_path, sample_interval_seconds=0.05, nvidia_smi=str(smi.path)),
        )
    slowing = [w for w in artifact["warnings"] if w.startswith("progress slowing: ")]
    assert len(slowing) == 1, artifact["warnings"]
    assert "; GPUs held back over the same span: gpu0 by hw_thermal_slowdown 100%" in slowing[0]
    assert "sw_power_cap 100% of the time" in slowing[0]
    assert (
        "gpu0 clocks held back by hw_thermal_slowdown 100% of the run (more than 10%)"
        in artifact["warnings"][-1]
    )
    shares = artifact["gpu_health"]["gpu0"]["throttle_shares"]
    assert shares == {"hw_thermal_slowdown": 1.0, "sw_power_cap": 1.0}
    assert artifact["gpu_health"]["gpu0"]["pcie_link"]["gen_max"] == 5


@pytest.mark.slow
def test_live_metrics_count_xids_by_code_and_flag_the_faulted_gpu() -> None:
    """An Xid counter by code and a fault gauge per GPU, labelled gpu and UUID as
    dcgm-exporter labels its series; promtool reads the scrape."""
    metrics = SoakMetrics("s1", host="h")
    reading = {"index": 0, "uuid": "GPU-a"}
    metrics.observe(
        {"t": 1.0, "kind": "gpu_sample", "gpus": [reading, {"index": 1, "uuid": "GPU-b"}]}
    )
    for code, fails in ((13, False), (79, True), (79, True)):
        metrics.observe(
            {
                "t": 2.0,
                "kind": "gpu_fault",
                "fault": "xid",
                "gpu": 0,
                "uuid": "GPU-a",
                "xid": code,
                "fails": fails,
            }
        )
    text = exposition(metrics)
    assert 'asyncsoak_gpu_xid_errors_total{UUID="GPU-a",gpu="0",soak_id="s1",xid="79"} 2.0' in text
    assert 'asyncsoak_gpu_xid_errors_total{UUID="GPU-a",gpu="0",soak_id="s1",xid="13"} 1.0' in text
    assert 'asyncsoak_gpu_fault{UUID="GPU-a",gpu="0",soak_id="s1"} 1.0' in text
    assert 'asyncsoak_gpu_fault{UUID="GPU-b",gpu="1",soak_id="s1"} 0.0' in text
    if shutil.which("promtool"):
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_remapped_rows_query_format_is_read() -> None:
    """``--query-remapped-rows`` rows (the fixture) read to the same figures as the GPU query's."""
    (line,) = fixture_lines("remapped_rows.txt")
    row = parse_remapped_rows_line(line)
    assert row == {
        "bus_id": "00000000:00:06.0",
        "uuid": "GPU-ea9029a8-d08e-1132-08a6-ed0bbd671b49",
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "errors": {},
    }


@pytest.mark.slow
@needs_kmsg
@pytest.mark.asyncio
async def test_a_trainer_killed_by_an_xid_fails_gpu_fault_first(tmp_path: Path) -> None:
    """The trainer logs its GPU's Xid 79 and dies at once: the exit is the fault's consequence,
    so gpu_fault is the primary reason and nonzero_exit follows it."""
    bus_id, xid_pci = unique_bus_id()
    line = f"<4>NVRM: Xid (PCI:{xid_pci}): 79, pid=1, name=python3, GPU has fallen off the bus."
    body = f"""
import os, pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
for step in range(20):
    (progress / "steps.txt").write_text(str(step))
    time.sleep(0.05)
with open("/dev/kmsg", "w") as k:
    k.write({line!r} + "\\n")
sys.exit(1)
"""
    smi = install_fake_nvidia_smi(tmp_path, pid_file=tmp_path / "gpu.pid", bus_id=bus_id)
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=[*py(body), str(tmp_path / "progress"), str(tmp_path / "gpu.pid")],
            **fast_limits(tmp_path, sample_interval_seconds=0.1, nvidia_smi=str(smi.path)),
        )
    # The exit is usually seen first (the Xid is read at the next tick): either way the fault
    # leads, and the exit, when it was judged, follows.
    reasons = [f["reason"] for f in info.value.artifact["failures"]]
    assert reasons in (["gpu_fault"], ["gpu_fault", "nonzero_exit"])
    assert info.value.reason == "gpu_fault"


def test_a_gpu_fault_is_the_primary_reason_whatever_came_first() -> None:
    """Folded after a non-zero exit, a gpu_fault is still the artifact's first failure."""
    builder = RunState()
    for t, reason in ((1.0, "nonzero_exit"), (1.1, "gpu_fault")):
        builder.add({"t": t, "kind": "failure", "reason": reason, "message": "m", "at": None})
    artifact = builder.build(status="failed", ended_t=2.0, log_tail="", monitor={})
    assert [f["reason"] for f in artifact["failures"]] == ["gpu_fault", "nonzero_exit"]


def test_the_health_watch_judges_flags_links_and_missing_gpus() -> None:
    """A flag set at the start warns, one set during the run fails; a link below its maximum
    under load warns once; a GPU no longer listed is lost."""
    base = GpuReading(
        index=0,
        uuid="GPU-a",
        bus_id="00000000:3B:00.0",
        utilization_gpu_percent=99.0,
        remapped_rows_pending=True,
        remapped_rows_failure=False,
        pcie_link_gen_current=5,
        pcie_link_gen_max=5,
        pcie_link_width_current=8,
        pcie_link_width_max=16,
    )
    other = dataclasses.replace(base, index=1, uuid="GPU-b", bus_id="00000000:3C:00.0")
    watch = GpuHealthWatch(VisibleDevices.parse(None))
    first = watch.readings(0.0, [base, other])
    kinds = sorted((f.gpu, f.fault, f.fails) for f in first)
    assert kinds == [
        (0, "pcie_link", False),
        (0, "remapped_rows_pending", False),
        (1, "pcie_link", False),
        (1, "remapped_rows_pending", False),
    ]
    assert "width x8 of x16" in first[0].message or "width x8 of x16" in first[1].message
    worse = dataclasses.replace(base, remapped_rows_failure=True)
    (failed,) = watch.readings(1.0, [worse, other])
    assert (failed.fault, failed.fails, failed.used) == ("remapped_rows_failure", True, True)
    (lost,) = watch.readings(2.0, [worse])
    assert (lost.gpu, lost.fault, lost.fails) == (1, "lost", True)
    assert "nvidia-smi no longer lists it" in lost.message
    assert watch.readings(3.0, [worse]) == []


def test_the_live_line_names_a_gpu_fault() -> None:
    """A failing GPU fault in the journal is on the live line; a warning-only one is not."""
    state = LiveState()
    state.add({"t": 1.0, "kind": "gpu_fault", "fault": "xid", "gpu": 1, "xid": 13, "fails": False})
    state.add({"t": 2.0, "kind": "gpu_fault", "fault": "xid", "gpu": 0, "xid": 79, "fails": True})
    state.add({"t": 3.0, "kind": "gpu_fault", "fault": "lost", "gpu": 0, "fails": True})
    assert state.alerts(None) == ("GPU FAULT gpu0 Xid 79", "GPU FAULT gpu0 lost")


def two_gpus() -> tuple[GpuReading, GpuReading]:
    first = GpuReading(index=0, uuid="GPU-a", bus_id="00000000:3B:00.0", ecc_uncorrected_volatile=0)
    return first, dataclasses.replace(first, index=1, uuid="GPU-b", bus_id="00000000:3C:00.0")


def test_a_gpu_that_drops_out_is_named_by_its_identity_not_the_renumbered_survivor() -> None:
    """GPU 0 of two leaves the list and NVML numbers the survivor 0: the lost GPU is GPU 0 by
    its UUID and bus id, the survivor keeps its label and is never blamed."""
    gpu0, gpu1 = two_gpus()
    watch = GpuHealthWatch(VisibleDevices.parse("0"))
    assert watch.readings(0.0, watch.identify([gpu0, gpu1])) == []
    renumbered = watch.identify([dataclasses.replace(gpu1, index=0)])
    assert [(r.index, r.uuid) for r in renumbered] == [(1, "GPU-b")]
    (lost,) = watch.readings(1.0, renumbered)
    assert (lost.fault, lost.gpu, lost.uuid, lost.bus_id) == ("lost", 0, "GPU-a", gpu0.bus_id)
    assert (lost.fails, lost.used) == (True, True)
    assert "GPU-b" not in lost.message
    assert watch.readings(2.0, watch.identify([dataclasses.replace(gpu1, index=0)])) == []


def test_a_compute_app_is_placed_on_its_gpu_by_uuid_else_bus_id() -> None:
    """A process's GPU is the one its ``gpu_uuid`` (else ``gpu_bus_id``) names, under the label
    that GPU had from the first sample on."""
    gpu0, gpu1 = two_gpus()
    watch = GpuHealthWatch(VisibleDevices.parse(None))
    watch.identify([gpu0, gpu1])
    watch.identify([dataclasses.replace(gpu1, index=0)])
    assert watch.gpu_index("GPU-b", None) == 1
    assert watch.gpu_index(None, gpu1.bus_id) == 1
    assert watch.gpu_index(None, gpu0.bus_id) == 0
    assert watch.gpu_index("GPU-elsewhere", None) is None


def test_a_row_with_a_garbled_index_is_matched_by_uuid_or_bus_id() -> None:
    """A row whose index could not be read (-1) is its GPU by UUID, or by bus id: no GPU lost."""
    gpu0, gpu1 = two_gpus()
    watch = GpuHealthWatch(VisibleDevices.parse("0,1"))
    watch.readings(0.0, watch.identify([gpu0, gpu1]))
    by_uuid = dataclasses.replace(gpu1, index=-1)
    by_bus = dataclasses.replace(gpu0, index=-1, uuid=None)
    readings = watch.identify([by_bus, by_uuid])
    assert [r.index for r in readings] == [0, 1]
    assert watch.readings(1.0, readings) == []


def needing_reset(reading: GpuReading, value: str) -> GpuReading:
    fields = ("utilization.gpu", "memory.used", "temperature.gpu", "power.draw")
    return dataclasses.replace(
        reading,
        utilization_gpu_percent=None,
        memory_used_mib=None,
        temperature_gpu_c=None,
        power_draw_w=None,
        errors=dict.fromkeys(fields, value),
    )


@pytest.mark.parametrize("value", ["[GPU requires reset]", "[Unknown Error]", "ERR!"])
def test_a_gpu_that_reads_nothing_but_errors_twice_in_a_row_requires_a_reset(value: str) -> None:
    """Utilisation, memory, temperature and power all unreadable for two samples in a row:
    reset_required, failing on the GPU the run uses, a warning on the other; one unreadable
    sample, or one field still read, is no fault."""
    gpu0, gpu1 = two_gpus()
    watch = GpuHealthWatch(VisibleDevices.parse("0"))
    watch.readings(0.0, watch.identify([gpu0, gpu1]))
    bad = [needing_reset(gpu0, value), needing_reset(gpu1, value)]
    assert watch.readings(1.0, watch.identify(bad)) == []
    faults = watch.readings(2.0, watch.identify(bad))
    assert [(f.fault, f.gpu, f.fails, f.used) for f in faults] == [
        ("reset_required", 0, True, True),
        ("reset_required", 1, True, False),
    ]
    assert value in faults[0].message
    assert faults[0].uuid == "GPU-a"
    assert watch.readings(3.0, watch.identify(bad)) == []  # said once per episode
    partly = dataclasses.replace(bad[0], errors={"power.draw": value})
    watch = GpuHealthWatch(VisibleDevices.parse("0"))
    for t in range(4):
        assert watch.readings(float(t), watch.identify([partly])) == []


def test_throttle_spans_are_kept_bounded_for_the_report() -> None:
    """Ten minutes at 0.5 s, held back (hw_slowdown) from 100 to 200 s, idle all along: one
    span within a bucket's width of the truth, inside the samples, idle left out."""
    timeline = ThrottleTimeline()
    for i in range(1200):
        t = 0.25 + i * 0.5
        timeline.add(t, ["gpu_idle", "hw_slowdown"] if 100 <= t < 200 else ["gpu_idle"])
    [span] = timeline.spans()
    assert span["reasons"] == ["hw_slowdown"]
    assert 100 - timeline.width <= span["start"] <= 100
    assert 200 <= span["end"] <= 200 + timeline.width
    assert timeline.width <= 600 / 256 * 2
