"""The blocking-call helper: a deadline always, daemon threads, abandoned calls counted.

Blocking for real: a thread opening a FIFO that nobody opens for writing stays in the kernel
until the test opens the other end (or forever).
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

from asyncsoak._contract import _blocking
from asyncsoak._contract._blocking import (
    BlockingCallTimeout,
    BlockingExecutor,
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


def test_threads_are_daemons_and_bounded() -> None:
    """Stuck calls never make more than max_threads threads; queued calls still time out."""
    pool = BlockingExecutor(max_threads=2, idle_seconds=1)
    gate = threading.Event()
    calls = [pool.submit(gate.wait) for _ in range(5)]
    for _ in range(200):
        if sum(c.running() for c in calls) == 2:
            break
        time.sleep(0.01)  # polling the pool's own state, bounded
    assert pool.threads == 2
    assert all(t.daemon for t in threading.enumerate() if t.name == "asyncsoak-blocking"), (
        "pool threads must be daemon threads"
    )
    assert calls[4].cancel(), "a queued call is dropped, not run"
    gate.set()
    assert all(c.result(timeout=5) for c in calls[:4])


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
    assert isinstance(_blocking.EXECUTOR, BlockingExecutor)
    assert _blocking.EXECUTOR.threads <= _blocking.MAX_THREADS


#: Ways to run blocking work that bypass run_blocking's deadline, daemon threads and count.
BYPASSES = {
    "to_thread": "anyio.to_thread / asyncio.to_thread (non-daemon threads, no deadline)",
    "run_in_executor": "loop.run_in_executor (asyncio's default executor unless told)",
    "ThreadPoolExecutor": "concurrent.futures.ThreadPoolExecutor (joined at exit)",
}
#: Modules allowed their own threads: the helper itself, and the trainer-side helper,
#: which runs inside the user's training process, not in the monitor.
OWN_THREADS = {"_blocking.py", "trainer.py"}


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
        if name == "Thread" and path.name not in OWN_THREADS:
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


@pytest.mark.asyncio
async def test_a_ride_runs_in_the_takers_hop_and_one_without_taker_runs_itself() -> None:
    """A posted call rides on another caller's thread hop (one trip for both); with no taker
    within a few turns of the loop, the rider runs it itself, still under run_blocking."""
    rides = _blocking.Rides()
    ride = rides.post(threading.get_ident, timeout=5.0)

    async def taker() -> int:
        taken = rides.take()

        def both() -> int:
            for r in taken:
                r.run()
            return threading.get_ident()

        thread = await run_blocking(both, timeout=5.0, what="the taker")
        for r in taken:
            r.done.set()
        return thread

    async with anyio.create_task_group() as tg:
        got: dict[str, int] = {}

        async def rider() -> None:
            got["rider"] = await _blocking.ride_or_run(rides, ride, what="the rider")

        async def take() -> None:
            got["taker"] = await taker()

        tg.start_soon(rider)
        tg.start_soon(take)
    assert got["rider"] == got["taker"] != threading.get_ident()

    alone = rides.post(threading.get_ident, timeout=5.0)
    thread = await _blocking.ride_or_run(rides, alone, what="nobody takes it")
    assert thread != threading.get_ident()
    assert rides.take() == []


@pytest.mark.asyncio
async def test_a_ride_that_hangs_is_bounded_by_its_deadline(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rides = _blocking.Rides()
    ride = rides.post(lambda: _read_fifo(fifo), timeout=0.3)
    (taken,) = rides.take()
    thread = threading.Thread(target=taken.run, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(BlockingCallTimeout, match="the hung ride"):
            await _blocking.ride_or_run(rides, ride, what="the hung ride")
        assert time.monotonic() - start < 3.0
    finally:
        _release(fifo)
        thread.join(5)


@pytest.mark.asyncio
async def test_a_rides_exception_reaches_its_rider() -> None:
    rides = _blocking.Rides()
    ride = rides.post(lambda: int("x"), timeout=5.0)
    (taken,) = rides.take()
    taken.run()
    taken.done.set()
    with pytest.raises(ValueError, match="invalid literal"):
        await _blocking.ride_or_run(rides, ride, what="a failing ride")


# The ticker: the soak's clock in a thread -----------------------------------------------


@pytest.mark.asyncio
async def test_a_ticker_runs_its_job_on_the_grid_in_one_thread() -> None:
    """Each tick's job runs at (or just after) its grid time, always in the same thread, and
    its outcomes come back in order; closing it ends the thread without an abandoned call."""
    start = anyio.current_time()
    seen: list[tuple[float, int]] = []

    def job(tick: float, partial: dict[str, object]) -> float:
        seen.append((tick, threading.get_ident()))
        return time.monotonic()

    before = abandoned_calls()
    async with _blocking.Ticker(job, start=start, interval=0.05) as ticker:
        ran_at = [await ticker.next(timeout=5.0) for _ in range(5)]
    ticks = [tick for tick, _ in seen[:5]]
    assert {thread for _, thread in seen} - {threading.get_ident()} == {seen[0][1]}
    # On the grid: a tick missed under load is skipped, never run late off the grid.
    steps = [(b - a) / 0.05 for a, b in itertools.pairwise(ticks)]
    assert all(round(step) >= 1 and step == pytest.approx(round(step), abs=1e-6) for step in steps)
    assert all(tick <= at for tick, at in zip(ticks, ran_at, strict=True))
    assert ran_at == sorted(ran_at)
    assert abandoned_calls() == before


@pytest.mark.asyncio
async def test_a_ticker_runs_no_job_until_the_loop_asks_for_it() -> None:
    """The loop keeps the pace: while it is busy with an outcome, the ticks are skipped (no
    job runs, nothing piles up), and the next job runs at the first tick after it asks."""
    seen: list[float] = []

    def job(tick: float, partial: dict[str, object]) -> float:
        seen.append(tick)
        return tick

    async with _blocking.Ticker(job, start=anyio.current_time(), interval=0.02) as ticker:
        await ticker.next(timeout=5.0)
        # Busy for ten intervals, without asking: the thread must not read meanwhile.
        await anyio.sleep(0.2)
        assert len(seen) == 1, f"jobs ran while the loop was busy: {seen}"
        asked = time.monotonic()
        tick = await ticker.next(timeout=5.0)
    assert len(seen) == 2
    assert asked < tick <= asked + 0.02 + 1e-6  # the first tick after the ask, on the grid


@pytest.mark.asyncio
async def test_a_tick_whose_job_hangs_is_abandoned_and_the_next_runs_in_a_new_thread(
    tmp_path: Path,
) -> None:
    """A job stuck in the kernel: ``next`` gives up at its deadline with what the job had so
    far (counted as abandoned), and the ticks after it run in another thread."""
    fifo = tmp_path / "stuck.fifo"
    os.mkfifo(fifo)
    calls: list[int] = []

    def job(tick: float, partial: dict[str, object]) -> int:
        calls.append(threading.get_ident())
        partial["started"] = True
        if len(calls) == 1:
            _read_fifo(fifo)  # the first tick hangs until released
        return threading.get_ident()

    before = abandoned_calls()
    try:
        async with _blocking.Ticker(job, start=anyio.current_time(), interval=0.05) as ticker:
            started = time.monotonic()
            with pytest.raises(_blocking.TickTimeout) as caught:
                await ticker.next(timeout=0.3)
            assert time.monotonic() - started < 3.0
            assert caught.value.partial == {"started": True}
            assert abandoned_calls() == before + 1
            second = await ticker.next(timeout=5.0)
            assert second != calls[0]  # a new thread: the stuck one still holds the first
    finally:
        _release(fifo)


@pytest.mark.asyncio
async def test_a_hurried_ride_is_told_when_its_call_returns_not_when_its_taker_does() -> None:
    """A rider whose ride was taken by a caller that then blocks for long (a read of a huge
    tree) gets its outcome as soon as its own call has run, not once the taker is back."""
    rides = _blocking.Rides()
    ride = rides.post(lambda: "scanned", timeout=5.0)
    rode = threading.Event()
    taker_back = threading.Event()

    def taker() -> None:
        for taken in rides.take():
            taken.run()
        rode.set()
        taker_back.wait(10)  # the taker's own slow call; it never marks the ride done

    thread = threading.Thread(target=taker, daemon=True)
    thread.start()
    try:
        with anyio.fail_after(3):
            assert await run_blocking(rode.wait, 5.0, timeout=5.0, what="the taker's ride")
            assert await _blocking.ride_or_run(rides, ride, what="the scan") == "scanned"
        assert not taker_back.is_set()
    finally:
        taker_back.set()
        thread.join(5)


def test_every_callback_waiting_for_a_ride_runs_once_it_returns() -> None:
    """A ride's rider may ask twice to hear when it is back (to be hurried, then to close a
    descriptor it gave up on): both are called, in order, once the call returns, and a late
    ask is answered at once."""
    rides = _blocking.Rides()
    ride = rides.post(lambda: "written", timeout=5.0)
    heard: list[str] = []
    ride.when_finished(lambda: heard.append("first"))
    ride.when_finished(lambda: heard.append("second"))
    (taken,) = rides.take()
    taken.run()
    assert heard == ["first", "second"]
    ride.when_finished(lambda: heard.append("late"))
    assert heard == ["first", "second", "late"]
