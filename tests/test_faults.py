"""Faults produced for real: escapes, forks, hangs, OOM, full disks, hostile output and files."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from asyncsoak import run_soak

from .conftest import ReadyFifo, alive, fast_limits
from .test_soak import child, soak_failure

pytestmark = pytest.mark.asyncio

IS_ROOT = os.geteuid() == 0


@contextlib.contextmanager
def cgroup_v1(controller: str, **settings: str) -> Iterator[Path]:
    """A fresh cgroup (v1 hierarchy) with the given settings, removed afterwards."""
    root = Path("/sys/fs/cgroup") / controller
    if not IS_ROOT or not (root / "cgroup.procs").exists():
        pytest.skip(f"needs root and a writable cgroup v1 '{controller}' hierarchy")
    group = root / f"asyncsoak-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a {controller} cgroup: {exc}")
    try:
        for name, value in settings.items():
            (group / name).write_text(value)
        yield group
    finally:
        for _ in range(100):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    os.kill(int(pid), 9)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


JOIN_CGROUP = "open(sys.argv[3] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"


@pytest.mark.slow
async def test_stall_records_forensics_before_the_first_signal(tmp_path: Path) -> None:
    """A hung trainer's state, wchan, threads and Python stack are recorded before SIGTERM."""
    body = "touch()\ndef stuck_here():\n    time.sleep(60)\nstuck_here()"
    error = await soak_failure(
        command=child(tmp_path, body), **fast_limits(tmp_path, stale_progress_seconds=0.3)
    )
    forensics = error.artifact["forensics"]
    assert forensics["reason"] == "stale_progress"
    [proc] = forensics["processes"]
    assert proc["pid"] == error.artifact["exit"]["pid"]
    assert proc["state"] == "sleeping"
    assert proc["wchan"]
    assert proc["threads"][0]["tid"] == proc["pid"]
    stack = proc["python_stack"]
    # Either py-spy read the stack, or the artifact says why it could not.
    assert "stuck_here" in stack.get("stack", "") or stack["error"]
    events = error.artifact["events"]
    forensics_t = next(e["t"] for e in events if e["kind"] == "forensics")
    sigterm_t = next(e["t"] for e in events if e.get("signal") == "SIGTERM")
    assert forensics_t <= sigterm_t


@pytest.mark.slow
async def test_dump_signal_output_lands_in_the_log(tmp_path: Path) -> None:
    """--dump-signal reaches a faulthandler-registered trainer first; its dump is in the tail."""
    body = (
        "import faulthandler\nfaulthandler.register(signal.SIGUSR1)\ntouch()\n"
        "def waiting_for_allreduce():\n    time.sleep(60)\nwaiting_for_allreduce()"
    )
    error = await soak_failure(
        command=child(tmp_path, body),
        dump_signal="SIGUSR1",
        forensics=False,
        **fast_limits(tmp_path, stale_progress_seconds=0.3),
    )
    assert "in waiting_for_allreduce" in error.artifact["log"]["tail"]
    signals = [s["signal"] for s in error.artifact["stop"]["signals"]]
    assert signals[:2] == ["SIGUSR1", "SIGTERM"]
    assert error.artifact["forensics"] is None


@pytest.mark.slow
async def test_process_that_changes_its_group_is_still_found(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A grandchild that calls setpgid() is still part of the tree, reported and killed."""
    body = """
touch()
if os.fork() == 0:
    os.setpgid(0, 0)
    say(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
time.sleep(0.2)
"""
    error = await soak_failure(
        command=child(tmp_path, body, ready),
        **fast_limits(tmp_path, post_shutdown_grace_seconds=0.3),
    )
    pid = int(await ready.line())
    [leftover] = error.artifact["leftover_processes"]
    assert (leftover["pid"], leftover["left_group"]) == (
        pid,
        "moved to another process group (setpgid)",
    )
    assert not alive(pid)


@pytest.mark.slow
async def test_tree_that_forks_faster_than_it_is_killed_is_stopped(tmp_path: Path) -> None:
    """A child spawning sleepers as fast as it can is stopped with nothing left behind."""
    body = """
touch()
for _ in range(3000):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""
    error = await soak_failure(
        command=child(tmp_path, body), **fast_limits(tmp_path, stale_progress_seconds=0.3)
    )
    signalled = {
        pid for e in error.artifact["events"] if e["kind"] == "signal" for pid in e["pids"]
    }
    assert len(signalled) > 100
    assert error.artifact["abandoned_processes"] == []
    assert not any(alive(pid) for pid in signalled)


@pytest.mark.slow
async def test_fork_bomb_bounded_by_pids_max_is_stopped(tmp_path: Path) -> None:
    """A fork bomb capped by a cgroup's pids.max is stopped and its cgroup left empty."""
    with cgroup_v1("pids", **{"pids.max": "300"}) as group:
        bomb = """
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""
        body = JOIN_CGROUP + "touch()\n" + bomb
        command = [*child(tmp_path, body), str(group)]
        command.insert(-1, "-")  # no FIFO: argv[2] is a placeholder, argv[3] the cgroup
        error = await soak_failure(
            command=command,
            forensics=False,
            **fast_limits(tmp_path, stale_progress_seconds=0.5, post_shutdown_grace_seconds=0.5),
        )
        assert error.reason == "stale_progress"
        assert (group / "cgroup.procs").read_text().split() == []


@pytest.mark.slow
async def test_oom_killed_trainer_is_named_as_such(tmp_path: Path) -> None:
    """A trainer ended by the kernel's OOM killer fails as signaled, and the artifact says OOM."""
    with cgroup_v1(
        "memory", **{"memory.limit_in_bytes": str(64 * 2**20), "memory.swappiness": "0"}
    ) as group:
        body = JOIN_CGROUP + "touch()\nhog = []\nwhile True:\n    hog.append(bytearray(8 * 2**20))"
        command = [*child(tmp_path, body), str(group)]
        command.insert(-1, "-")
        error = await soak_failure(command=command, **fast_limits(tmp_path))
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel log is not readable here")
    assert error.reason == "signaled"
    assert "OOM killer" in error.failures[0]["message"]
    assert [k["pid"] for k in error.artifact["oom_kills"]] == [error.artifact["exit"]["pid"]]


@pytest.mark.slow
async def test_full_output_filesystem_stops_the_tree_and_says_where(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A full disk under the artifact: the tree is stopped and an OSError names the path."""
    with tmpfs(tmp_path / "small", "192k") as small:
        body = (
            "touch()\nsay(str(os.getpid()))\n"
            "for i in range(2000):\n    print('x' * 1000, flush=True)\ntime.sleep(60)"
        )
        output = small / "soak.json"
        with anyio.fail_after(60), pytest.raises(OSError, match="could not write") as info:
            await run_soak(
                command=child(tmp_path, body, ready),
                **fast_limits(
                    tmp_path,
                    output_path=output,
                    stale_progress_seconds=0.5,
                    post_shutdown_grace_seconds=0.3,
                ),
            )
        pid = int(await ready.line())
        assert info.value.filename == str(output)
        assert not alive(pid)
        # The journal kept what it could: at least its header made it to disk.
        first = (small / "soak.jsonl").read_text().splitlines()[0]
        assert json.loads(first)["kind"] == "header"


@pytest.mark.slow
async def test_child_that_closes_its_output_is_fine(tmp_path: Path) -> None:
    """A child closing stdout and stderr early neither breaks nor hangs the soak."""
    body = "os.close(1)\nos.close(2)\nfor _ in range(4):\n    touch(); time.sleep(0.1)"
    with anyio.fail_after(60):
        artifact = await run_soak(command=child(tmp_path, body), **fast_limits(tmp_path))
    assert artifact["status"] == "passed"


@pytest.mark.slow
async def test_huge_line_without_newline_stays_capped(tmp_path: Path) -> None:
    """Hundreds of MiB with no newline are capped in the log; the child never blocks."""
    body = """
touch()
block = b"x" * 2**20
for _ in range(256):
    sys.stdout.buffer.write(block)
sys.stdout.flush()
touch()
"""
    cap = 1 << 20
    with anyio.fail_after(120):
        artifact = await run_soak(
            command=child(tmp_path, body),
            log_max_bytes=cap,
            **fast_limits(tmp_path, stale_progress_seconds=60),
        )
    assert artifact["status"] == "passed"
    assert (tmp_path / "out" / "soak.log").stat().st_size <= cap + 100
    assert len(artifact["log"]["tail"]) <= 16 * 1024


async def test_a_kernel_oom_record_logged_after_a_read_is_seen_by_the_next_call() -> None:
    """Soaks ending together share one read of the kernel log; a call made after a read never
    gets that read's stale records: a kill logged in between is found."""
    if not os.access("/dev/kmsg", os.W_OK | os.R_OK):
        pytest.skip("the kernel log cannot be read and written here (not root, or a container)")
    from asyncsoak._process._forensics import oom_kills, seconds_since_boot

    since = seconds_since_boot() - 1.0
    pid = 4_000_000 + os.getpid() % 100_000  # above the usual pid_max: nobody's
    assert oom_kills({pid}, since_boot_seconds=since) == []
    Path("/dev/kmsg").write_text(
        f"<3>Out of memory: Killed process {pid} (fake-trainer) total-vm:1kB\n"
    )
    found = oom_kills({pid}, since_boot_seconds=since)
    assert found is not None
    assert [(k["pid"], k["name"]) for k in found] == [(pid, "fake-trainer")]


async def test_a_soak_reads_the_kernel_log_from_its_commands_start_only() -> None:
    """The OOM check opens the kernel log at its end before the command starts: a record logged
    before is never read (a boot's log costs nothing), one logged after is found."""
    if not os.access("/dev/kmsg", os.W_OK | os.R_OK):
        pytest.skip("the kernel log cannot be read and written here (not root, or a container)")
    from asyncsoak._process._forensics import oom_kills, prefetch_oom_records

    kmsg = Path("/dev/../dev/kmsg")  # the same log, read apart from this process's soaks
    before, after = (4_000_000 + (os.getpid() + n) % 100_000 for n in (1, 2))
    for pid in (before, after):
        if pid == after:
            prefetch_oom_records(kmsg)
        Path("/dev/kmsg").write_text(f"<3>Out of memory: Killed process {pid} (trainer) x\n")
    found = oom_kills({before, after}, since_boot_seconds=0.0, kmsg=kmsg)
    assert found is not None
    assert [k["pid"] for k in found] == [after]
