"""Every wait bounded: hung disks, hung closes, bad values and a caller's stop, produced for real.

A "hung disk" here is the journal's descriptor turned into a pipe whose buffer is full and
that nobody reads: the journal's write blocks in the kernel exactly as on a dead NFS mount.
A hung close is a close that waits in its thread on a lock the test holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from aiofiles.threadpool.binary import AsyncFileIO

import asyncsoak._sampling
from asyncsoak import SoakControl, SoakFailureError, ValidationError, read_journal, run_soak
from asyncsoak._contract import _blocking
from asyncsoak._contract._sink import EventSink
from asyncsoak._process import _cgroup, _forensics, _tree
from asyncsoak._process._spawn import REAPER_SCRIPT, REAPER_START
from asyncsoak._record import _artifact_io, _serializer
from asyncsoak._sampling import _proc_sampler, _proc_task, _progress_scan
from asyncsoak._sampling._gpu_sample import GpuSample
from asyncsoak._sampling._inotify import Inotify
from asyncsoak._sampling._nvidia_smi import GpuProcess
from asyncsoak._supervisor import _outputs, _producers
from asyncsoak._supervisor import _soak as _finish
from asyncsoak._supervisor import _stop as _command

from .conftest import REPO, ReadyFifo, alive, fast_limits
from .gpu_support import install_fake_nvidia_smi
from .test_soak import child


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full: the next blocking write to its write end hangs."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def drain(read_end: int) -> None:
    """Read what the pipe holds, so a write stuck on it can go on."""
    os.set_blocking(read_end, False)
    try:
        while os.read(read_end, 1 << 20):
            pass
    except BlockingIOError:
        pass


@pytest.fixture
def hung_journal(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The soak's journal descriptor becomes a full pipe; yields the pipe's read end."""
    read_end, write_end = full_pipe()
    real = _artifact_io.create_private_file

    def create(path: Path) -> int:
        fd = real(path)
        if path.suffix == ".jsonl":
            os.dup2(write_end, fd)
        return fd

    monkeypatch.setattr(_outputs, "create_private_file", create)
    monkeypatch.setattr(_serializer, "JOURNAL_WRITE_TIMEOUT_SECONDS", 0.5)
    yield read_end
    drain(read_end)
    os.close(read_end)
    os.close(write_end)


def fds_on(read_end: int) -> int:
    """Descriptors of this process open on the pipe whose read end is ``read_end``."""
    target = os.readlink(f"/proc/self/fd/{read_end}")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count - 1  # the read end itself


def quick_child(tmp_path: Path) -> list[str]:
    return child(tmp_path, "for i in range(3):\n    touch(); time.sleep(0.05)")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hung_journal_close_is_bounded_by_the_drain_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7: a journal close that hangs (an NFS flush) is abandoned at the drain limit."""
    gate = threading.Event()
    release = threading.Timer(45.0, gate.set)  # lets unbounded code finish at last, and fail
    release.start()
    real_close = AsyncFileIO.close

    async def hanging_close(self: AsyncFileIO) -> None:
        loop = asyncio.get_running_loop()
        # The executor the journal was opened with (None: asyncio's default one).
        executor = self._executor  # type: ignore[attr-defined]
        await loop.run_in_executor(executor, gate.wait)
        await real_close(self)

    monkeypatch.setattr(AsyncFileIO, "close", hanging_close)
    monkeypatch.setattr(_finish, "DRAIN_TIMEOUT_SECONDS", 2.0)
    try:
        with anyio.fail_after(60):
            artifact = await run_soak(command=quick_child(tmp_path), **fast_limits(tmp_path))
        # The order is the claim: run_soak came back while the close still hung, so it gave
        # the close up instead of waiting it out.
        assert not gate.is_set(), "run_soak waited for the hung close to end"
    finally:
        gate.set()
        release.cancel()
    assert artifact["status"] == "passed"
    assert "closing the journal" in (artifact["monitor"].get("journal_error") or "")
    assert artifact["monitor"]["abandoned_calls"] >= 1


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_nan_in_a_sample_still_gives_an_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 12: a sampler's NaN is written as null; the soak passes with its artifact."""

    async def nan_gpu(sink: EventSink, **_: Any) -> None:
        nan = GpuProcess(pid=1, used_gpu_memory_mib=float("nan"), in_tree=True)
        await sink.emit(GpuSample(t=sink.elapsed(), gpus=[], processes=[nan], source="call"))

    monkeypatch.setattr(asyncsoak._sampling, "run_gpu_sampler", nan_gpu)
    # An nvidia-smi to find: the GPU sampler starts only where there is one.
    smi = str(install_fake_nvidia_smi(tmp_path, "idle").path)
    output = tmp_path / "out" / "soak.json"
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=quick_child(tmp_path), **fast_limits(tmp_path, nvidia_smi=smi)
        )
    assert artifact["status"] == "passed"
    assert artifact["monitor"]["events_with_nonfinite_numbers"] == 1
    assert json.loads(output.read_text())["status"] == "passed"
    journal = list(read_journal(output.with_suffix(".jsonl")))
    gpu = next(e for e in journal if e["kind"] == "gpu_sample")
    assert gpu["processes"][0]["used_gpu_memory_mib"] is None


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hung_journal_write_leaks_no_descriptor(tmp_path: Path, hung_journal: int) -> None:
    """Item 11: the descriptor of a journal whose write hung is closed once the write returns."""
    with anyio.fail_after(60):
        artifact = await run_soak(command=quick_child(tmp_path), **fast_limits(tmp_path))
    assert "writing stopped" in (artifact["monitor"].get("journal_error") or "")
    assert fds_on(hung_journal) == 2, "the pipe's write end and the journal's stuck descriptor"
    drain(hung_journal)  # the disk comes back: the stuck write returns
    for _ in range(200):  # polling /proc for the descriptor to close, bounded (10 s)
        if fds_on(hung_journal) <= 1:
            break
        await anyio.sleep(0.05)
    assert fds_on(hung_journal) == 1, "the journal's descriptor was kept after its write ended"


@pytest.mark.slow
def test_a_hung_journal_write_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """Item 11: with a journal write stuck for good, the process exits as soon as run_soak
    returns (no non-daemon thread, nothing on asyncio's default executor to join)."""
    read_end, write_end = full_pipe()
    script = textwrap.dedent(
        f"""
        import os, sys, time, anyio
        from pathlib import Path
        from asyncsoak import run_soak
        from asyncsoak._record import _serializer
        from asyncsoak._supervisor import _outputs
        _serializer.JOURNAL_WRITE_TIMEOUT_SECONDS = 0.5
        real = _outputs.create_private_file
        def create(path):
            fd = real(path)
            if path.suffix == ".jsonl":
                os.dup2({write_end}, fd)
            return fd
        _outputs.create_private_file = create
        tmp = Path({str(tmp_path)!r})
        command = {json.dumps(quick_child(tmp_path))}
        async def main():
            await run_soak(command=command, progress_dir=tmp / "progress",
                           output_path=tmp / "out" / "soak.json", sample_interval_seconds=0.1,
                           nvidia_smi=None)
            print("returned", flush=True)
        anyio.run(main)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        pass_fds=[write_end],
    ) as proc:
        os.close(write_end)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            # The write stays stuck until the read end closes below: an exit seen before then
            # did not wait for it.  The wait is only a bound on a broken build.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            still_running = proc.returncode is None
        finally:
            # The disk comes back (the stuck write fails with EPIPE): an old process can end.
            os.close(read_end)
            try:
                proc.wait(timeout=30)
            finally:
                proc.kill()
    assert line, "run_soak did not return"
    assert not still_running, "the process did not exit while the journal write was stuck"


class StuckFifo:
    """A FIFO nobody writes to: ``block()`` waits in open(2) until ``release()``.

    ``release`` also runs by itself after ``release_after`` seconds, so that code which
    waits without a bound (the faults under test) ends at last and fails its test, which
    checks that control came back while the FIFO was still stuck (``released`` is false).
    """

    def __init__(self, path: Path, release_after: float = 45.0) -> None:
        self.path = path
        os.mkfifo(path)
        self._timer = threading.Timer(release_after, self.release)
        self._timer.start()
        self._fd: int | None = None

    @property
    def released(self) -> bool:
        """Whether the blocked calls were let go (by ``release`` or by its timer)."""
        return self._fd is not None

    def block(self) -> None:
        with open(self.path, "rb"):
            pass

    def release(self) -> None:
        self._timer.cancel()
        if self._fd is None:
            # A writer opening the FIFO lets every reader blocked in open(2) go; it stays
            # open so that later readers never block again.
            self._fd = os.open(self.path, os.O_RDWR)

    def close(self) -> None:
        self.release()
        assert self._fd is not None
        os.close(self._fd)


@pytest.fixture
def stuck(tmp_path: Path) -> Iterator[StuckFifo]:
    fifo = StuckFifo(tmp_path / "stuck.fifo")
    yield fifo
    fifo.close()


def blocked(fifo: StuckFifo, real: Any) -> Any:
    """``real``, made to wait on the stuck FIFO first (a hung disk, a wedged process)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        fifo.block()
        return real(*args, **kwargs)

    return call


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_callers_cancel_during_the_post_exit_grace_acts_at_once(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """Item 4: the command exited, a child lingers in the grace, the caller cancels: the tree
    is stopped at once and the artifact says cancelled, not leftover_processes."""
    body = """
touch()
if os.fork() == 0:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.01)  # until the command has exited and this child was reparented
    say("lingering")
    time.sleep(60)
    os._exit(0)
"""
    grace = 20.0
    kwargs = fast_limits(tmp_path, post_shutdown_grace_seconds=grace, kill_wait_seconds=2.0)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def cancel_when_lingering() -> None:
                await ready.line()
                # The child is reparented when the command exits; the monitor learns of the
                # exit a moment later, through the reaper.  Cancel once it has (the exit is in
                # the journal), so the cancel lands in the post-exit grace, not before it.
                journal_path = kwargs["output_path"].with_suffix(".jsonl")
                for _ in range(500):  # 10 s at most
                    if any(e["kind"] == "exited" for e in read_journal(journal_path)):
                        break
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

            tg.start_soon(cancel_when_lingering)
            await run_soak(command=child(tmp_path, body, ready), **kwargs)
    artifact = json.loads(kwargs["output_path"].read_text())
    assert artifact["status"] == "cancelled"
    # Waiting out the grace would have ended in leftover_processes; the soak's own record
    # puts its end inside the grace that began when the command exited.
    assert artifact["failures"] == []
    events = artifact["events"]
    exited = next(e["t"] for e in events if e["kind"] == "exited")
    finished = next(e["t"] for e in events if e["kind"] == "finished")
    assert exited <= finished < exited + grace


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hung_baseline_scan_gives_way_to_the_callers_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Item 8: the first scan of the progress dir hangs; the caller's move_on_after(1) gets
    control back at once, with a cancelled artifact."""
    monkeypatch.setattr(
        _producers, "scan_progress_dir", blocked(stuck, _progress_scan.scan_progress_dir)
    )
    kwargs = fast_limits(tmp_path)
    with anyio.fail_after(60), anyio.move_on_after(1):
        await run_soak(command=quick_child(tmp_path), **kwargs)
    assert not stuck.released, "control came back only once the hung scan ended"
    assert json.loads(kwargs["output_path"].read_text())["status"] == "cancelled"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hung_artifact_write_gives_way_to_the_callers_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Item 8: the artifact write hangs (a dead disk): the caller still gets control back
    within the write bound, and without a caller's cancel it is an OSError naming the path."""
    monkeypatch.setattr(_finish, "write_artifact", blocked(stuck, _artifact_io.write_artifact))
    monkeypatch.setattr(_finish, "ARTIFACT_WRITE_TIMEOUT_SECONDS", 1.0)
    sleeper = child(tmp_path, "touch()\ntime.sleep(60)")
    with anyio.fail_after(60), anyio.move_on_after(1):
        await run_soak(command=sleeper, **fast_limits(tmp_path))
    assert not stuck.released, "control came back only once the hung write ended"
    output = tmp_path / "again" / "soak.json"
    with anyio.fail_after(60), pytest.raises(OSError, match="within 1s") as info:
        await run_soak(command=quick_child(tmp_path), **fast_limits(tmp_path, output_path=output))
    assert info.value.filename == str(output)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_wedged_process_does_not_hold_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Item 9: reading a wedged process's environ and cmdline hangs (its mmap lock is held);
    the stop still ends within a few seconds of kill_wait_seconds=1."""
    monkeypatch.setattr(_tree, "find_marked", blocked(stuck, _tree.find_marked))
    monkeypatch.setattr(psutil.Process, "cmdline", blocked(stuck, psutil.Process.cmdline))
    body = """
touch()
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""
    kwargs = fast_limits(
        tmp_path, max_duration_seconds=1.0, post_shutdown_grace_seconds=0.5, kill_wait_seconds=1
    )
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(command=child(tmp_path, body), **kwargs)
    # The reads of the wedged process never came back: the stop ended without them.
    assert not stuck.released, "the stop waited for the wedged process's reads"
    assert info.value.reason == "leftover_processes", "the lingering child is reported"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hung_inotify_walk_does_not_freeze_the_soak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Item 10: the inotify walk of the progress tree hangs (a dead mount below it): the
    scans still see the progress and the soak ends on time."""
    monkeypatch.setattr(Inotify, "watch_tree", blocked(stuck, Inotify.watch_tree))
    (tmp_path / "progress").mkdir()
    with anyio.fail_after(60):
        artifact = await run_soak(command=quick_child(tmp_path), **fast_limits(tmp_path))
    assert not stuck.released, "the soak waited for the hung inotify walk"
    assert artifact["status"] == "passed"
    assert artifact["progress"]["changes"] >= 1


#: A trainer that starts a helper which scrubs the ASYNCSOAK_* variables and calls setsid,
#: then kills its parent, the reaper.
KILLS_ITS_REAPER = """
touch()
helper = (
    "import os, sys, time\\n"
    "os.setsid()\\n"
    "open(sys.argv[1], 'w').write(f'{os.getpid()}\\\\n')\\n"
    "os.write(int(sys.argv[2]), b'x')\\n"
    "time.sleep(60)\\n"
)
env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCSOAK_")}
started_r, started_w = os.pipe()
os.set_inheritable(started_w, True)
if os.fork() == 0:
    os.execve(sys.executable, [sys.executable, "-c", helper, fifo, str(started_w)], env)
os.read(started_r, 1)  # the helper runs, in its own session, without the marker
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("membership", ["cgroup", "marker"])
async def test_the_reapers_death_is_noticed_at_once(
    tmp_path: Path, ready: ReadyFifo, monkeypatch: pytest.MonkeyPatch, membership: str
) -> None:
    """Item 6: a trainer kills the reaper: the monitor sees it at once (monitor_error, "the
    reaper was lost") and stops the tree; with a cgroup, even a helper that scrubbed the
    ASYNCSOAK_* variables and called setsid."""
    probe = _cgroup.create(f"asyncsoak-probe-{os.getpid()}")
    if probe is not None:
        probe.remove()
    elif membership == "cgroup":
        pytest.skip("no cgroup can be made here (needs cgroup v2 delegation, or root on v1)")
    monkeypatch.setattr(_command, "USE_CGROUP", membership == "cgroup")
    kwargs = fast_limits(tmp_path, startup_timeout_seconds=30, stale_progress_seconds=30)
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(command=child(tmp_path, KILLS_ITS_REAPER, ready), **kwargs)
    helper = int(await ready.line())
    artifact = info.value.artifact
    # Noticed at once: the loss of the reaper is the failure, and no rule that waits (the
    # trainer sleeps past the 30 s limits, its progress stops) fired before it.
    reasons = [f["reason"] for f in artifact["failures"]]
    assert reasons[0] == "monitor_error"
    assert not {"startup_timeout", "stale_progress"} & set(reasons)
    assert artifact["status"] == "error"
    assert info.value.reason == "monitor_error"
    assert "the reaper" in artifact["failures"][0]["message"]
    assert "was lost" in artifact["failures"][0]["message"]
    if membership == "cgroup":
        assert not alive(helper), "the setsid helper with a scrubbed environment survived"
    elif alive(helper):
        os.kill(helper, 9)  # the marker fallback cannot see a scrubbed helper: say so, clean up


@pytest.mark.parametrize(
    ("stderr", "permission"),
    [
        ("Error: Failed to suspend process: PtraceEvent", False),
        ("Error: Operation not permitted (os error 1)", True),
        ("Error: Permission Denied: Try running again with elevated permissions", True),
    ],
)
def test_py_spy_errors_are_labelled_for_what_they_are(
    tmp_path: Path, stderr: str, permission: bool
) -> None:
    """Only a refused ptrace is called a permission problem ("PtraceEvent" is not one)."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\necho {stderr!r} >&2\nexit 1\n")
    fake.chmod(0o755)
    error = _forensics.py_spy_dump(str(fake), os.getpid())["error"]
    assert error.startswith(stderr)
    assert ("ptrace is not allowed" in error) is permission


@pytest.mark.slow
def test_a_dead_monitors_empty_cgroup_is_swept() -> None:
    """The empty cgroup of a soak whose monitor and reaper were both killed is removed by
    the next soak's: killed workers do not leave groups behind."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    stale = _cgroup.create(f"asyncsoak-{int(gone.stdout)}-1")
    if stale is None:
        pytest.skip("no cgroup can be made here (needs cgroup v2 delegation, or root on v1)")
    fresh = _cgroup.create(f"asyncsoak-{os.getpid()}-2")
    assert fresh is not None
    try:
        assert not stale.path.exists()
    finally:
        fresh.remove()
        stale.remove()


#: ptrace(2) requests and waitpid's flag for a tracee that is not the tracer's child.
PTRACE_SEIZE = 0x4206
WALL = 0x40000000

#: A monitor the test can SIGKILL: run_soak with a short kill wait, in a process of its own.
SHORT_KILL_WAIT_MONITOR = """
import sys, anyio
from asyncsoak import run_soak
base, fifo, kill_wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
command = [sys.executable, "-c",
           "import os, sys, time; open(sys.argv[1], 'w').write(f'{os.getpid()}\\\\n'); "
           "time.sleep(60)", fifo]
anyio.run(lambda: run_soak(
    command=command, progress_dir=f"{base}/progress", output_path=f"{base}/soak.json",
    sample_interval_seconds=0.1, post_shutdown_grace_seconds=0.5, nvidia_smi=None,
    kill_wait_seconds=kill_wait))
"""


@pytest.mark.asyncio
async def test_a_reaper_launched_ahead_is_the_soaks_and_is_handed_the_log(tmp_path: Path) -> None:
    """The command line launches the reaper before the supervisor's imports; the soak takes it,
    and the log's descriptor follows the command over its lifeline (a socket).  A soak refused
    before it began leaves the one launched for it to be closed."""
    (tmp_path / "progress").mkdir()
    control = SoakControl()
    await control._launch_reaper("group")
    ahead = control._reaper
    assert ahead is not None
    assert ahead.reaper_pid is not None
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[sys.executable, "-c", "print('to the log')"],
            control=control,
            **fast_limits(tmp_path),
        )
    assert artifact["monitor"]["reaper_pid"] == ahead.reaper_pid
    assert "to the log" in (tmp_path / "out" / "soak.log").read_text()
    refused = SoakControl()
    await refused._launch_reaper("group")
    pid = refused._reaper.reaper_pid if refused._reaper else None
    with pytest.raises(ValidationError):
        await run_soak(
            command=["true"], control=refused, **fast_limits(tmp_path, warm_up_seconds=-1)
        )
    await refused._drop_reaper()
    assert pid is not None
    assert not alive(pid)


def test_a_reaper_whose_monitor_died_before_it_read_never_starts_the_command(
    tmp_path: Path,
) -> None:
    """The monitor sends the command (and the log over the socket) and dies before the reaper,
    launched ahead, has read it: the command never starts (a queue may already have handed the
    job to another worker, whose orphan check could not see a log still in flight)."""
    marker, log = tmp_path / "ran", tmp_path / "soak.log"
    mine, theirs = socket.socketpair()
    reaper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", REAPER_START, REAPER_SCRIPT],
        stdin=theirs.fileno(),
        stdout=subprocess.DEVNULL,
    )
    theirs.close()
    config = {
        "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
        "cwd": str(tmp_path), "env": dict(os.environ), "stdin_fd": None,
        "log_max_bytes": 2**20, "stop_mode": "group", "grace_seconds": 1.0,
    }  # fmt: skip
    fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
    socket.send_fds(mine, [json.dumps(config).encode() + b"\n"], [fd])
    os.close(fd)
    mine.close()  # before the reaper's interpreter has started reading
    assert reaper.wait(timeout=30) == 2
    assert not marker.exists()


def test_the_reaper_starts_as_a_lean_interpreter() -> None:
    """The reaper runs by path without site-packages (-I -S) and imports none of asyncsoak,
    anyio, psutil, typing or pathlib: its start is the short wait before every command runs.
    Without its configuration (the lifeline closed at once) it exits 2."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-I", "-S", "-c", REAPER_START, REAPER_SCRIPT],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert done.returncode == 2, done.stderr
    assert {"json", "_reaper"} <= imported  # the script imported: its byte code cached
    forbidden = {"asyncsoak", "anyio", "psutil", "site", "typing", "pathlib"}
    assert not {name.split(".")[0] for name in imported} & forbidden


@pytest.mark.slow
def test_the_reaper_waits_the_soaks_kill_wait_after_its_sigkill(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """The monitor is SIGKILLed: the reaper stops the tree itself and, after its SIGKILL,
    waits the soak's kill_wait_seconds (not a wait of its own) for a process that cannot be
    reaped yet before it gives up.  The test traces the command, so its corpse stays
    unreapable until the test lets it go: the reaper's wait is seen whole."""
    (tmp_path / "progress").mkdir()
    kill_wait = 1.0
    monitor = subprocess.Popen(
        [sys.executable, "-c", SHORT_KILL_WAIT_MONITOR, tmp_path, ready.path, str(kill_wait)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )
    libc = ctypes.CDLL(None, use_errno=True)
    command = int(ready.line_sync())
    traced = False
    fds: list[int] = []
    try:
        reaper = psutil.Process(command).ppid()
        assert REAPER_SCRIPT in psutil.Process(reaper).cmdline()
        if libc.ptrace(PTRACE_SEIZE, command, None, None) != 0:
            pytest.skip(f"ptrace is not permitted here: {os.strerror(ctypes.get_errno())}")
        traced = True
        fds = [os.pidfd_open(command), os.pidfd_open(reaper)]
        monitor.kill()
        monitor.wait(timeout=10)
        # The reaper's SIGTERM only stops a tracee; its SIGKILL, after the grace, kills it.
        assert select.select([fds[0]], [], [], 15)[0], "the reaper never killed the command"
        killed = time.monotonic()
        assert select.select([fds[1]], [], [], 15)[0], "the reaper never exited"
        waited = time.monotonic() - killed
    finally:
        monitor.kill()
        monitor.wait()
        for fd in fds:
            os.close(fd)
        if traced:
            with contextlib.suppress(ProcessLookupError):
                os.kill(command, signal.SIGKILL)
            # The tracer's wait releases the corpse to its parent.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(command, WALL)
    print(f"the reaper gave up {waited:.2f}s after its SIGKILL (kill_wait_seconds={kill_wait:g})")
    assert kill_wait * 0.8 <= waited < 4.0, f"the reaper waited {waited:.2f}s"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_scan_that_never_comes_back_fails_the_stall_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Every scan of the progress dir hangs (a dead mount): the stall rules are judged on
    their own clock, so the soak stops the trainer and fails, saying why, instead of passing
    when the trainer exits 0 after a stall longer than the limit."""
    monkeypatch.setattr(
        _progress_scan, "scan_progress_dir", blocked(stuck, _progress_scan.scan_progress_dir)
    )
    progress = tmp_path / "progress"
    progress.mkdir()
    kwargs = fast_limits(
        tmp_path,
        sample_interval_seconds=0.5,
        startup_timeout_seconds=3.0,
        stale_progress_seconds=2.0,
    )
    command = ["sh", "-c", 'echo step > "$1/metrics"; sleep 12', "sh", str(progress)]
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(command=command, **kwargs)
    assert info.value.reason in ("startup_timeout", "stale_progress")
    assert "had not come back" in info.value.failures[0]["message"]
    # The monitor stopped the trainer: it did not get to exit 0 by itself.
    assert info.value.artifact["stop"]["cause"] == "failure"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_sampler_that_cannot_read_fails_the_soak_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: StuckFifo
) -> None:
    """Every read of /proc hangs: the sampler says it is degraded, then the soak fails
    ``monitor_error`` (status ``error``) instead of passing a run it never saw; the hung
    reads hold a bounded number of threads."""
    monkeypatch.setattr(
        _proc_sampler.ProcSampler, "read", blocked(stuck, _proc_sampler.ProcSampler.read)
    )
    monkeypatch.setattr(_proc_task, "BLIND_SECONDS", 1.0)
    progress = tmp_path / "progress"
    progress.mkdir()
    command = [
        "sh",
        "-c",
        'for i in $(seq 40); do echo $i >> "$1/metrics"; sleep 0.3; done',
        "sh",
        str(progress),
    ]
    threads_before = set(threading.enumerate())
    kwargs = fast_limits(tmp_path, sample_interval_seconds=0.5, stale_progress_seconds=5.0)
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(command=command, **kwargs)
    tickers = [
        t for t in set(threading.enumerate()) - threads_before if t.name == "asyncsoak-blocking"
    ]
    artifact = info.value.artifact
    assert info.value.reason == "monitor_error"
    assert artifact["status"] == "error"
    assert "no sample of the process tree" in artifact["failures"][0]["message"]
    kinds = [e["kind"] for e in artifact["events"]]
    assert kinds.index("sampler_degraded") < kinds.index("failure")
    assert artifact["stop"]["cause"] == "failure"
    assert len(tickers) <= _blocking.MAX_THREADS
