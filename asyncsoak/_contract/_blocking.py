"""The one way asyncsoak runs blocking work: always under a deadline, in its own daemon threads.

Blocking calls (``/proc`` reads, scans, ``git``, SQLite, the journal's writes) never run on the
event loop and never wait without a bound.  They run on :data:`EXECUTOR`, at most
:data:`MAX_THREADS` daemon threads registered nowhere at exit, so a call stuck for good (a dead
NFS mount, a wedged process's ``/proc/PID/environ``) neither keeps the process from exiting
nor makes threads grow.  A call whose caller stops waiting while it runs is *abandoned*: left
to finish, counted (:func:`abandoned_calls`, in ``artifact.monitor``).
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, TypeVar

import anyio

from ._errors import AsyncsoakError

T = TypeVar("T")

#: Threads of the pool at most, stuck ones included.
MAX_THREADS = 16
#: An idle thread exits after this long without work.
IDLE_SECONDS = 30.0


class BlockingCallTimeout(TimeoutError):
    """A blocking call did not return within its deadline and was abandoned."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what = what
        self.timeout = timeout
        super().__init__(f"{what} did not finish within {timeout:g}s (abandoned)")


class _Call(Future[Any]):
    """A queued call; cancelling it once it runs abandons it (and counts it)."""

    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self._pool = pool

    def cancel(self) -> bool:
        if super().cancel():
            return True
        if self.running():
            self._pool.abandon(self)
        return False


class _Pool(Executor):
    """Daemon threads started on demand up to a bound, each leaving after an idle spell."""

    def __init__(self, max_threads: int = MAX_THREADS, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max_threads = max_threads
        self._idle_seconds = idle_seconds
        self._queue: queue.SimpleQueue[tuple[_Call, Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.threads = self._idle = self._queued = self.abandoned_total = 0
        self._stuck: set[_Call] = set()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        call = _Call(self)
        with self._lock:
            self._queued += 1
            self._queue.put((call, partial(fn, *args, **kwargs)))
            if self._idle < self._queued and self.threads < self._max_threads:
                self.threads += 1
                threading.Thread(target=self._work, name="asyncsoak-blocking", daemon=True).start()
        return call

    def abandon(self, call: _Call) -> None:
        with self._lock:
            if call not in self._stuck and not call.done():
                self.abandoned_total += 1
                self._stuck.add(call)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                call, fn = self._queue.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    self.threads -= 1
                return
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if call.set_running_or_notify_cancel():
                try:
                    call.set_result(fn())
                except BaseException as exc:
                    call.set_exception(exc)
                with self._lock:
                    self._stuck.discard(call)
            del call, fn


#: The process-wide pool every blocking call of asyncsoak runs on.
EXECUTOR = _Pool()


def abandoned_calls() -> int:
    """Blocking calls abandoned (deadline passed or caller cancelled) since the process started."""
    return EXECUTOR.abandoned_total


def require_asyncio(what: str) -> None:
    """Raise :class:`AsyncsoakError` naming the asyncio requirement unless an asyncio event
    loop (uvloop is one) runs this call: under trio, asyncsoak's first wait on its threads
    would die in trio's own ``TypeError: unrecognized yield message``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise AsyncsoakError(
            f"{what} needs the asyncio event loop (asyncio.run, uvloop, or "
            "anyio.run(..., backend='asyncio')): it was called under another one (trio?); "
            "asyncsoak waits on its threads and writes its journal through asyncio"
        ) from None


def host_cancelled() -> bool:
    """In an ``except CancelledError`` under asyncsoak's shielded scopes: whether the
    cancellation is the host's, not one of anyio's scopes, and if so take it back.

    ``asyncio.run``, ``asyncio.Runner`` and ``anyio.run`` cancel every task of their loop at
    once when ``main`` ends (returns, raises, Ctrl-C), a soak's own tasks included, and then
    wait for them: a task of the soak takes that cancel back (``Task.uncancel``, so anyio's
    scopes count right) and finishes what the artifact needs, every step still bounded.
    """
    if anyio.current_effective_deadline() == -math.inf:
        return False  # an anyio scope of ours (or the caller's) is cancelled: not the host's
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return True


async def run_blocking(
    func: Callable[..., T],
    *args: Any,
    timeout: float,  # noqa: ASYNC109 (the deadline is the point: it is never optional)
    what: str,
    limiter: anyio.CapacityLimiter | None = None,
) -> T:
    """Run ``func(*args)`` on :data:`EXECUTOR`, waiting at most ``timeout`` seconds.

    Past the deadline the call is abandoned (left running, counted) and
    :class:`BlockingCallTimeout` naming ``what`` is raised; cancelling the caller abandons it
    at once.  ``limiter`` bounds how many calls of one caller run at a time.
    """
    with anyio.move_on_after(timeout):
        if limiter is None:
            return await _wait(func, args)
        try:
            limiter.acquire_nowait()  # free: no checkpoint (a turn of the loop) to take it
        except anyio.WouldBlock:
            await limiter.acquire()
        try:
            return await _wait(func, args)
        finally:
            limiter.release()
    raise BlockingCallTimeout(what, timeout)


async def _wait(func: Callable[..., T], args: tuple[Any, ...]) -> T:
    call = EXECUTOR.submit(func, *args)
    try:
        return await asyncio.wrap_future(call)
    finally:
        call.cancel()  # deadline or cancel: a queued call is dropped, a running one counted


def next_tick(previous: float, interval: float, now: float) -> float:
    """The next tick on the grid ``previous + k * interval`` strictly after ``now``: ticks
    missed while a job ran long are skipped, and the grid never drifts."""
    tick = previous + interval
    if tick <= now:
        tick += (math.floor((now - tick) / interval) + 1) * interval
    return tick
