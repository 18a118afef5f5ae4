"""The one way asyncsoak runs blocking work: under a deadline, on :data:`EXECUTOR`'s bounded
daemon threads, so a call stuck for good (a dead NFS mount) neither keeps the process from
exiting nor makes threads grow; a call its caller stops waiting for is *abandoned* and counted.
"""

from __future__ import annotations

import asyncio
import math
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, TypeVar

import anyio

from ._errors import AsyncsoakError

T = TypeVar("T")

MAX_THREADS = 16  # stuck ones included
IDLE_SECONDS = 30.0  # an idle thread exits after this long without work


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


_Work = tuple[_Call, Callable[[], Any]]


class _Pool(Executor):
    """Daemon threads started on demand up to a bound, each leaving after an idle spell.  A call
    goes to the thread idle for the shortest time (its caches warm): the threads a burst
    started and the steady work does not need go idle for good, and leave."""

    def __init__(self, max_threads: int = MAX_THREADS, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max_threads = max_threads
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        #: The idle threads' mailboxes, the most recently idle last.
        self._idle: list[queue.SimpleQueue[_Work]] = []
        #: Calls waiting for a thread (every one busy, at the bound).
        self._pending: deque[_Work] = deque()
        self.threads = self.abandoned_total = 0
        self._stuck: set[_Call] = set()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        call = _Call(self)
        work = (call, partial(fn, *args, **kwargs))
        with self._lock:
            if self._idle:
                self._idle.pop().put(work)
            elif self.threads < self._max_threads:
                threading.Thread(
                    target=self._work, args=(work,), name="asyncsoak-blocking", daemon=True
                ).start()  # counted once started: a thread that could not start holds no place
                self.threads += 1
            else:
                self._pending.append(work)
        return call

    def forget_threads(self) -> None:
        """In a forked child: the parent's threads are not there; start afresh."""
        self._lock = threading.Lock()
        self._idle, self._pending, self._stuck = [], deque(), set()
        self.threads = 0

    def abandon(self, call: _Call) -> None:
        with self._lock:
            if call not in self._stuck and not call.done():
                self.abandoned_total += 1
                self._stuck.add(call)

    def _work(self, work: _Work | None) -> None:
        mailbox: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        while work is not None:
            call, fn = work
            if call.set_running_or_notify_cancel():
                try:
                    call.set_result(fn())
                except BaseException as exc:
                    call.set_exception(exc)
                with self._lock:
                    self._stuck.discard(call)
            del call, fn, work
            work = self._next(mailbox)

    def _next(self, mailbox: queue.SimpleQueue[_Work]) -> _Work | None:
        """The next call for this thread, or None when it stayed idle for its spell."""
        with self._lock:
            if self._pending:
                return self._pending.popleft()
            self._idle.append(mailbox)
        try:
            return mailbox.get(timeout=self._idle_seconds)
        except queue.Empty:
            with self._lock:
                if mailbox in self._idle:
                    self._idle.remove(mailbox)
                    self.threads -= 1
                    return None
            return mailbox.get_nowait()  # handed a call as the spell ended (put with the pop)


#: The process-wide pool every blocking call of asyncsoak runs on.
EXECUTOR = _Pool()
os.register_at_fork(after_in_child=EXECUTOR.forget_threads)


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
    """In an ``except CancelledError``: whether the cancellation is the host's (its loop
    ending cancels every task, then waits for them), not an anyio scope's; if so it is taken
    back (``Task.uncancel``), so the soak finishes what the artifact needs, still bounded."""
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
    """Run ``func(*args)`` on :data:`EXECUTOR` within ``timeout`` seconds, else abandon it and
    raise :class:`BlockingCallTimeout` naming ``what``; ``limiter`` bounds a caller's calls."""
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
