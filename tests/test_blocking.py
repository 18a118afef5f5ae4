"""The blocking-call helper: a deadline always, daemon threads, abandoned calls counted.

Blocking for real: a thread opening a FIFO that nobody opens for writing stays in the kernel
until the test opens the other end (or forever).
"""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import anyio
import pytest

from asyncsoak._contract import _blocking
from asyncsoak._contract._blocking import (
    BlockingCallTimeout,
    abandoned_calls,
    run_blocking,
)

from .conftest import REPO


def _read_fifo(path: Path) -> bytes:
    with open(path, "rb") as f:  # blocks in open(2) until a writer comes
        return f.read()


def _release(path: Path) -> None:
    """Open the FIFO's writing end, which lets a reader blocked in open(2) go."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


@pytest.mark.asyncio
async def test_result_and_exception_come_back() -> None:
    """A call that returns gives its value; one that raises gives its exception."""
    assert await run_blocking(sum, [1, 2, 3], timeout=5, what="sum") == 6
    with pytest.raises(ZeroDivisionError):
        await run_blocking(divmod, 1, 0, timeout=5, what="divmod")


@pytest.mark.asyncio
async def test_a_hung_call_is_abandoned_at_its_deadline(tmp_path: Path) -> None:
    """A call stuck in the kernel raises BlockingCallTimeout at the deadline and is counted."""
    fifo = tmp_path / "never-written.fifo"
    os.mkfifo(fifo)
    before = abandoned_calls()
    started = time.monotonic()
    with pytest.raises(BlockingCallTimeout, match=r"reading the fifo did not finish within 0\.3s"):
        await run_blocking(_read_fifo, fifo, timeout=0.3, what="reading the fifo")
    assert time.monotonic() - started < 2.0
    assert abandoned_calls() == before + 1
    assert isinstance(BlockingCallTimeout("x", 1), TimeoutError)
    _release(fifo)


@pytest.mark.asyncio
async def test_cancelling_the_caller_abandons_the_call_at_once(tmp_path: Path) -> None:
    """A caller's cancel scope gets control back at once, whatever the thread is doing."""
    fifo = tmp_path / "never-written.fifo"
    os.mkfifo(fifo)
    before = abandoned_calls()
    started = time.monotonic()
    with anyio.move_on_after(0.2):
        await run_blocking(_read_fifo, fifo, timeout=60, what="reading the fifo")
    assert time.monotonic() - started < 2.0
    assert abandoned_calls() == before + 1
    _release(fifo)


def _wait_running(calls: list[Future[bool]], count: int) -> None:
    for _ in range(200):
        if sum(c.running() for c in calls) == count:
            return
        time.sleep(0.01)  # polling the pool's own state, bounded


def test_threads_are_daemons_and_bounded() -> None:
    """Stuck calls never make more than max_threads threads; queued calls still time out."""
    pool = _blocking._Pool(max_threads=2, idle_seconds=1)
    gate = threading.Event()
    calls = [pool.submit(gate.wait) for _ in range(5)]
    _wait_running(calls, 2)
    assert pool.threads == 2
    assert all(t.daemon for t in threading.enumerate() if t.name == "asyncsoak-blocking"), (
        "pool threads must be daemon threads"
    )
    assert calls[4].cancel(), "a queued call is dropped, not run"
    gate.set()
    assert all(c.result(timeout=5) for c in calls[:4])


def test_calls_go_to_the_warmest_thread_and_spare_threads_leave() -> None:
    """Calls one after another run on the thread idle for the shortest time (its caches warm,
    one wake-up), not in turn on every thread the pool ever started; so the threads a burst
    started and the steady work does not need leave after their idle spell."""
    pool = _blocking._Pool(max_threads=4, idle_seconds=0.5)
    gate = threading.Event()
    burst = [pool.submit(gate.wait) for _ in range(4)]
    _wait_running(burst, 4)
    assert pool.threads == 4
    gate.set()
    assert all(c.result(timeout=5) for c in burst)
    ran_on = set()
    deadline = time.monotonic() + 10
    while pool.threads > 1 and time.monotonic() < deadline:
        ran_on.add(pool.submit(threading.get_ident).result(timeout=5))
        time.sleep(0.02)  # steady work: a call every 20 ms, far below the idle spell
    assert pool.threads == 1, "threads the steady work does not need stay"
    assert len(ran_on) <= 2, ran_on  # the warmest thread (a first call may meet another)


@pytest.mark.slow
def test_a_stuck_call_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """A process whose blocking call hangs for good exits as soon as its main code returns."""
    fifo = tmp_path / "never-written.fifo"
    os.mkfifo(fifo)
    code = textwrap.dedent(
        f"""
        import anyio
        from asyncsoak._contract._blocking import BlockingCallTimeout, run_blocking

        def hang():
            open({str(fifo)!r}, "rb")

        async def main():
            try:
                await run_blocking(hang, timeout=0.2, what="hang")
            except BlockingCallTimeout:
                print("abandoned", flush=True)

        anyio.run(main)
        """
    )
    # Nobody ever opens the FIFO for writing: the call stays stuck for good, so a process
    # that exits at all did not wait for its thread (the timeout only bounds a broken build).
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "abandoned", done.stderr
    assert done.returncode == 0, done.stderr


def test_executor_is_process_wide() -> None:
    """One pool for the process: the accounting in artifact.monitor covers every call."""
    assert isinstance(_blocking.EXECUTOR, _blocking._Pool)
    assert _blocking.EXECUTOR.threads <= _blocking.MAX_THREADS


#: Ways to run blocking work that bypass run_blocking's deadline, daemon threads and count.
BYPASSES = {
    "to_thread": "anyio.to_thread / asyncio.to_thread (non-daemon threads, no deadline)",
    "run_in_executor": "loop.run_in_executor (asyncio's default executor unless told)",
    "ThreadPoolExecutor": "concurrent.futures.ThreadPoolExecutor (joined at exit)",
}
#: Modules allowed their own threads: the helper itself; the trainer-side helper, which runs
#: inside the user's training process, not in the monitor; and run_soak's front door, whose one
#: thread imports the supervisor (and with it anyio, which run_blocking needs) off the host's loop.
OWN_THREADS = {"_contract/_blocking.py", "trainer/__init__.py", "_supervisor/_front.py"}


def bypasses(path: Path) -> list[str]:
    """Every blocking call in ``path`` that does not go through run_blocking."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        if name in BYPASSES:
            found.append(f"{where}: {BYPASSES[name]}")
        if name == "Thread" and not path.as_posix().endswith(tuple(OWN_THREADS)):
            found.append(f"{where}: a thread of its own")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "open"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "aiofiles"
            and not any(k.arg == "executor" for k in node.keywords)
        ):
            found.append(f"{where}: aiofiles.open on asyncio's default executor")
    return found


def test_no_blocking_call_bypasses_the_helper() -> None:
    """Every thread hop of the package goes through run_blocking (or its EXECUTOR)."""
    package = REPO / "asyncsoak"
    found = [
        hit
        for path in sorted(package.rglob("*.py"))
        if path.name != "_blocking.py"
        for hit in bypasses(path)
    ]
    assert not found, "blocking calls that bypass run_blocking:\n" + "\n".join(found)


def test_the_bypass_check_sees_a_bypass(tmp_path: Path) -> None:
    """The check above can fail: each kind of bypass is found."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import anyio, aiofiles, asyncio\n"
        "async def f(loop):\n"
        "    await anyio.to_thread.run_sync(print)\n"
        "    await loop.run_in_executor(None, print)\n"
        "    await aiofiles.open('x')\n"
    )
    assert len(bypasses(sample)) == 3


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_soak_never_uses_asyncios_default_executor(tmp_path: Path) -> None:
    """A whole soak (journal through aiofiles, scans, /proc, snapshot) leaves asyncio's
    default executor uncreated: nothing of asyncsoak can hold up the loop's shutdown."""
    from asyncsoak import run_soak

    from .conftest import fast_limits, py

    loop = asyncio.get_running_loop()
    assert loop._default_executor is None  # type: ignore[attr-defined]
    command = py(
        f"import pathlib; p = pathlib.Path({str(tmp_path / 'progress')!r}); "
        "p.mkdir(); (p / 'm').write_text('x')"
    )
    with anyio.fail_after(60):
        artifact = await run_soak(command=command, **fast_limits(tmp_path))
    assert artifact["status"] == "passed"
    assert loop._default_executor is None, "something ran on asyncio's default executor"  # type: ignore[attr-defined]


def test_a_forked_child_runs_its_blocking_calls_on_threads_of_its_own() -> None:
    """A process forked from one whose pool had idle threads (a worker's child, a launcher)
    runs its calls on threads it starts: the parent's idle threads are not in the child."""
    code = textwrap.dedent(
        """
        import os, sys
        from asyncsoak._contract._blocking import EXECUTOR

        assert EXECUTOR.submit(os.getpid).result(timeout=5) == os.getpid()  # a thread, idle now
        pid = os.fork()
        if pid == 0:
            try:
                ok = EXECUTOR.submit(lambda: 42).result(timeout=5) == 42
            except BaseException:
                ok = False
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
