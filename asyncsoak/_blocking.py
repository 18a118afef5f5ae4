"""The one way asyncsoak runs blocking work: always under a deadline, in its own daemon threads.

Blocking calls (filesystem walks, ``/proc`` reads, ``git``, SQLite, the journal's writes) never
run on the event loop and never wait without a bound.  They run on :data:`EXECUTOR`, a small
pool of asyncsoak's own threads:

* the threads are daemon threads and the pool registers nothing at exit, so a call stuck for
  good (a dead NFS mount, a ``/proc/PID/environ`` read behind a wedged process's mmap lock) never
  keeps the process from exiting, unlike anyio's worker threads and asyncio's default executor
  (whose shutdown has no timeout on Python 3.11);
* the pool holds at most :data:`MAX_THREADS` threads, stuck ones included, so abandoned calls
  cannot make threads grow without bound: once every thread is stuck, new calls wait in the
  queue until their own deadline and fail, the soak goes on degraded;
* a call whose caller stops waiting (its deadline passed, or the caller was cancelled) while it
  runs is *abandoned*: it is left to finish in its thread and counted (:func:`abandoned_calls`,
  reported in ``artifact.monitor``).  A call still in the queue is simply dropped.

aiofiles takes the same executor (``aiofiles.open(..., executor=EXECUTOR)``), so the journal's
writes share the bound on threads and the count of abandoned calls.

At every tick the proc sampler makes one trip to the pool for its read, and the blocking calls
posted as :class:`Rides` (the watchdog's scan, the journal's batch) run in that trip after
the read: one trip per sample for all of them.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

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

    def __init__(self, pool: BlockingExecutor) -> None:
        super().__init__()
        self._pool = pool

    def cancel(self) -> bool:
        if super().cancel():
            return True
        if self.running():
            self._pool._abandoned(self)
        return False


class BlockingExecutor(Executor):
    """A bounded pool of daemon threads (see the module docstring)."""

    def __init__(self, max_threads: int = MAX_THREADS, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max_threads = max_threads
        self._idle_seconds = idle_seconds
        self._queue: queue.SimpleQueue[tuple[_Call, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._abandoned_total = 0
        self._abandoned_now: set[_Call] = set()

    # -- Executor ------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        call = _Call(self)
        with self._lock:
            self._queued += 1
            self._queue.put((call, partial(fn, *args, **kwargs)))
            if self._idle < self._queued and self._threads < self._max_threads:
                self._threads += 1
                threading.Thread(target=self._work, name="asyncsoak-blocking", daemon=True).start()
        return call

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # The pool is process-wide and its threads are daemons: there is nothing to wait for,
        # and a stuck call must never hold up whoever shuts down.
        return None

    # -- accounting ----------------------------------------------------------------------

    @property
    def abandoned_total(self) -> int:
        """Calls abandoned since the process started."""
        with self._lock:
            return self._abandoned_total

    @property
    def stuck(self) -> int:
        """Abandoned calls still running in their thread now."""
        with self._lock:
            return len(self._abandoned_now)

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    def _abandoned(self, call: _Call) -> None:
        with self._lock:
            if call in self._abandoned_now or call.done():
                return
            self._abandoned_total += 1
            self._abandoned_now.add(call)

    # -- the threads ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._queue.get(timeout=self._idle_seconds)
            except queue.Empty:
                item = None
            with self._lock:
                self._idle -= 1
                if item is None:
                    self._threads -= 1
                    return
                self._queued -= 1
            call, fn = item
            if not call.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:
                call.set_exception(exc)
            else:
                call.set_result(result)
            with self._lock:
                self._abandoned_now.discard(call)
            del call, fn, item


#: The process-wide pool every blocking call of asyncsoak runs on.
EXECUTOR = BlockingExecutor()


def abandoned_calls() -> int:
    """Blocking calls abandoned (deadline passed or caller cancelled) since the process started."""
    return EXECUTOR.abandoned_total


async def run_blocking(
    func: Callable[..., T],
    *args: Any,
    timeout: float,  # noqa: ASYNC109 (the deadline is the point: it is never optional)
    what: str,
    limiter: anyio.CapacityLimiter | None = None,
) -> T:
    """Run ``func(*args)`` in asyncsoak's own daemon threads, waiting at most ``timeout`` seconds.

    Past the deadline the call is abandoned (left running in its thread, counted) and
    :class:`BlockingCallTimeout` naming ``what`` is raised.  Cancelling the caller abandons the
    call at once.  ``limiter``, when given, bounds how many calls of one caller run at a time;
    the pool bounds the threads of all callers together.
    """
    with anyio.move_on_after(timeout):
        if limiter is None:
            return await _wait(func, args)
        async with limiter:
            return await _wait(func, args)
    raise BlockingCallTimeout(what, timeout)


async def _wait(func: Callable[..., T], args: tuple[Any, ...]) -> T:
    call = EXECUTOR.submit(func, *args)
    try:
        # asyncsoak runs on asyncio (aiofiles is asyncio-only): the pool's thread wakes the
        # loop through the wrapper future.
        return await asyncio.wrap_future(call)
    finally:
        # Deadline or cancellation: drop the call if it is still queued, count it as
        # abandoned if it runs; now, not on a later turn of the loop.
        call.cancel()


class Ride(Generic[T]):
    """A blocking call that runs in the thread hop of another caller (see :class:`Rides`)."""

    def __init__(self, func: Callable[[], T], timeout: float) -> None:
        self.func = func
        self.timeout = timeout
        self.taken = False
        #: Runs after the rides that are not ``last`` (see :class:`Rides`).
        self.last = False
        #: Set on the event loop by the caller that took the ride, once it has run
        #: (:meth:`mark_done`), which then calls ``on_done``, a rider's way to be woken.
        self.done = anyio.Event()
        self.on_done: Callable[[], None] | None = None
        self.finished = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._then: Callable[[], None] | None = None

    def run(self) -> None:
        """Run the call (in the taker's thread), keeping its result or its exception."""
        try:
            self._result = self.func()
        except Exception as exc:
            self._error = exc
        with self._lock:
            self.finished = True
            then = self._then
        if then is not None:
            then()

    def mark_done(self) -> None:
        """On the event loop, once the ride has run: its rider may read the outcome."""
        self.done.set()
        if self.on_done is not None:
            self.on_done()

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the call has returned: now, or in the taker's thread."""
        with self._lock:
            if not self.finished:
                self._then = callback
                return
        callback()

    def outcome(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class Rides:
    """Blocking calls waiting to ride on the next hop of a caller that makes one anyway.

    Each trip to a pool thread and back wakes two threads; at every sample interval the proc
    sampler makes one, so the watchdog's scan and the journal's batched write ride on it
    instead of making their own (:func:`ride_or_run`).  The taker runs the rides after its own
    call, in the same thread (its deadline grows by theirs), and sets each ride's ``done`` on
    the event loop.  Riders post and withdraw on the event loop; the taker may take in its
    thread, hence the lock.  Rides posted ``last`` run after the others:
    a journal write that hangs then holds up nothing that rode with it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: list[Ride[Any]] = []

    def post(self, func: Callable[[], T], timeout: float, *, last: bool = False) -> Ride[T]:
        ride = Ride(func, timeout)
        ride.last = last
        with self._lock:
            self._posted.append(ride)
        return ride

    def withdraw(self, ride: Ride[Any]) -> bool:
        """Take back a ride nobody took yet (True), or leave it (False: it is under way)."""
        with self._lock:
            if ride.taken:
                return False
            self._posted.remove(ride)
            return True

    def take(self) -> list[Ride[Any]]:
        with self._lock:
            rides, self._posted = self._posted, []
            for ride in rides:
                ride.taken = True
        return sorted(rides, key=lambda ride: ride.last)

    def waiting_timeout(self) -> float:
        """The deadlines of the rides waiting now, added up (what taking them adds)."""
        with self._lock:
            return sum(ride.timeout for ride in self._posted)


#: Turns of the event loop a rider waits for its taker when both woke on the same tick.
RIDE_TURNS = 3


async def ride_or_run(
    rides: Rides,
    ride: Ride[T],
    *,
    what: str,
    limiter: anyio.CapacityLimiter | None = None,
) -> T:
    """The outcome of a posted ride, within its deadline; run by the caller itself (through
    :func:`run_blocking`) when no taker came within a few turns of the loop."""
    for _ in range(RIDE_TURNS):
        if ride.taken:
            break
        # No wake-up: the loop polls without sleeping while tasks are ready.
        await anyio.lowlevel.checkpoint()
    if rides.withdraw(ride):
        return await run_blocking(ride.func, timeout=ride.timeout, what=what, limiter=limiter)
    with anyio.move_on_after(ride.timeout):
        await ride.done.wait()
        return ride.outcome()
    raise BlockingCallTimeout(what, ride.timeout)


def next_tick(previous: float, interval: float, now: float) -> float:
    """The next tick on the grid ``previous + k * interval`` strictly after ``now``.

    Ticks missed while a job ran long are skipped, not run in a burst, and the grid never
    drifts with the time each job takes.
    """
    tick = previous + interval
    if tick <= now:
        tick += (math.floor((now - tick) / interval) + 1) * interval
    return tick


class TickSignal:
    """Tells the tasks that wait for the soak's ticks that one has been handled, on the event
    loop, so that they do their share on the same wake-up instead of a timer of their own."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        event, self._event = self._event, anyio.Event()
        event.set()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 (a fallback, never a hang)
        """Whether a tick came within ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            await self._event.wait()
            return True
        return False
