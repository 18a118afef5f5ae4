"""External commands under a deadline: killed when late, abandoned (not awaited) when unkillable."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from asyncsoak._process._commands import run_command, run_command_sync, stop_process

from .gpu_support import exited

#: A child that says it is ready, then waits forever.
SLEEPER = "import sys, time; print('ready', flush=True); time.sleep(3600)"
#: The same, but SIGTERM does not stop it.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(3600)"
)


async def read_ready(process: Process) -> None:
    assert process.stdout is not None
    assert await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 100) == b"ready"


def test_sync_command_output_and_status() -> None:
    """stdout, stderr and the exit status come back; the command is reaped."""
    result = run_command_sync(
        [
            sys.executable,
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        ],
        timeout=10.0,
    )
    assert (result.returncode, result.output, result.stderr) == (3, "out\n", "err\n")
    assert result.error is None
    assert not result.ok
    assert result.describe() == "exit status 3: out"


def test_sync_missing_executable_is_a_result(tmp_path: Path) -> None:
    """A missing executable is reported as missing, not raised."""
    result = run_command_sync([str(tmp_path / "nope")], timeout=1.0)
    assert result.missing
    assert result.returncode is None
    assert result.error is not None
    assert "could not run" in result.error


def test_sync_deadline_kills_the_whole_group(tmp_path: Path) -> None:
    """A late command is killed with everything it started, even a child holding the pipe."""
    pidfile = tmp_path / "grandchild"
    script = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]);"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid));"
        "time.sleep(3600)"
    )
    # The command sleeps an hour: a result at all is the deadline at work.
    result = run_command_sync([sys.executable, "-c", script], timeout=1.0)
    assert result.timed_out
    assert result.error == "no answer within 1 s; killed"
    grandchild = int(pidfile.read_text())
    assert exited(grandchild, 5.0)


def test_sync_consume_streams_stdout() -> None:
    """With consume, stdout goes chunk by chunk to the consumer (hashing a large diff)."""
    digest = hashlib.sha256()
    script = "import sys; sys.stdout.write('x' * 1_000_000)"
    result = run_command_sync([sys.executable, "-c", script], timeout=10.0, consume=digest.update)
    assert result.ok
    assert result.output == ""
    assert digest.hexdigest() == hashlib.sha256(b"x" * 1_000_000).hexdigest()


@pytest.mark.asyncio
async def test_async_command_output_and_deadline() -> None:
    """The async runner returns output, and kills a command that overruns its limit."""
    with anyio.fail_after(10):
        ok = await run_command([sys.executable, "-c", "print('hi')"], time_limit=10.0)
        late = await run_command([sys.executable, "-c", SLEEPER], time_limit=0.5)
    assert (ok.returncode, ok.output) == (0, "hi\n")
    assert late.timed_out
    assert late.output == "ready\n"
    assert late.error == "no answer within 0.5 s; killed"


@pytest.mark.asyncio
async def test_async_missing_executable(tmp_path: Path) -> None:
    """A missing executable is a result with missing=True."""
    with anyio.fail_after(10):
        result = await run_command([str(tmp_path / "nvidia-smi")], time_limit=1.0)
    assert result.missing
    assert not result.ok


@pytest.mark.asyncio
async def test_cancelling_a_command_kills_it(tmp_path: Path) -> None:
    """Cancelled while its command runs, run_command kills it before the cancellation goes on."""
    pidfile = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(3600)"
    )
    with anyio.fail_after(30), anyio.move_on_after(1.0) as scope:
        await run_command([sys.executable, "-c", script], time_limit=60.0)
    # Control came back through the caller's cancel (not the command's 60 s limit), and the
    # command was gone by then.
    assert scope.cancelled_caught
    assert exited(int(pidfile.read_text()), 0)


#: A host that cancels run_command at each of its first checkpoints, the start of its process
#: among them, closes its event loop at once, and reports what the loop never saw end.
CANCELLING_HOST = """
import sys, threading
import anyio
from anyio.lowlevel import checkpoint
from asyncsoak._process._commands import run_command

async def cancel_after(checkpoints):
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_command([sys.executable, "-c", "import time; time.sleep(60)"],
                                          time_limit=60.0))
        for _ in range(checkpoints):
            await checkpoint()
        tg.cancel_scope.cancel()

for checkpoints in range(8):
    anyio.run(cancel_after, checkpoints)
for thread in threading.enumerate():  # asyncio's child watchers, which drop what they held
    if thread is not threading.current_thread():
        thread.join(10)
import gc; gc.collect()
print("done")
"""


def test_a_command_cancelled_as_it_starts_is_reaped_before_the_cancel_goes_on() -> None:
    """Cancelled while its process is being started, run_command still kills and reaps it
    before the cancellation goes on: an embedding host that then closes its event loop sees
    no process its loop never saw end (asyncio's "loop that handles pid is closed", Python's
    "subprocess is still running" ResourceWarning)."""
    host = subprocess.run(
        [sys.executable, "-X", "dev", "-c", CANCELLING_HOST],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert host.stdout == "done\n", host.stderr
    assert "is closed" not in host.stderr
    assert "ResourceWarning" not in host.stderr


@pytest.mark.slow
@pytest.mark.asyncio
async def test_stop_process_escalates_to_sigkill() -> None:
    """A process that ignores SIGTERM gets SIGKILL after the grace, and is reaped."""
    with anyio.fail_after(10):
        process = await anyio.open_process(
            [sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, stderr=None
        )
        await read_ready(process)
        assert await stop_process(process, terminate_grace_seconds=0.2, kill_wait_seconds=2.0)
    assert process.returncode == -9


@pytest.mark.slow
@pytest.mark.asyncio
async def test_stop_process_abandons_what_does_not_die_in_time() -> None:
    """A process not reaped within the bound after SIGKILL is abandoned: False, no waiting."""
    with anyio.fail_after(10):
        process = await anyio.open_process(
            [sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, stderr=None
        )
        await read_ready(process)
        assert not await stop_process(process, terminate_grace_seconds=0, kill_wait_seconds=0)
        # It was sent SIGKILL and dies on its own; collect it so the test leaves nothing behind.
        assert await process.wait() == -9
    assert exited(process.pid, 0)


def test_sync_command_is_killed_when_its_consumer_fails(tmp_path: Path) -> None:
    """If handling the output fails, the command is killed before the error goes on."""
    pidfile = tmp_path / "pid"
    script = (
        "import os, sys;"
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()));"
        "[sys.stdout.write('x' * 4096) for _ in iter(int, 1)]"
    )

    def broken(chunk: bytes) -> None:
        raise RuntimeError("no space left")

    with pytest.raises(RuntimeError, match="no space left"):
        run_command_sync([sys.executable, "-c", script], timeout=30.0, consume=broken)
    assert exited(int(pidfile.read_text()), 0)
