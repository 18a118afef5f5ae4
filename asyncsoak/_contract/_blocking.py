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

The proc sampler reads on a :class:`Ticker`: a daemon thread of the soak's own, outside the
pool (so that a process may run many soaks, each on time, and the pool stays free for short
calls), that sleeps until each tick of the sample grid, runs the tick's job (the blocking
calls posted as :class:`Rides`, the watchdog's scan and the journal's batch, then the read)
and wakes the loop once with the outcome.  The loop paces it: the next job waits until the
loop has handled the last outcome, so a loop that falls behind skips ticks and is never
handed a backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Generic, NoReturn, TypeVar

import anyio
import anyio.lowlevel

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
            self._run_call(call, fn)
            del call, fn, item

    def _run_call(self, call: _Call, fn: Callable[[], Any]) -> None:
        if not call.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as exc:
            call.set_exception(exc)
        else:
            call.set_result(result)
        with self._lock:
            self._abandoned_now.discard(call)

    def run_in_own_thread(self, fn: Callable[[], Any], *, name: str) -> Future[Any]:
        """Run ``fn`` in a new daemon thread of its own, outside the pool's bound, with the
        pool's accounting (cancelling it while it runs abandons it, and counts it).

        For a caller that holds its thread for its whole life (a soak's :class:`Ticker`):
        on the pool, each would hold one of its :data:`MAX_THREADS` for good, and the
        seventeenth soak of a process would wait for a thread it never gets.  The caller
        bounds how many of its own threads may be stuck at once.
        """
        call = _Call(self)
        threading.Thread(target=self._run_call, args=(call, fn), name=name, daemon=True).start()
        return call


#: The process-wide pool every blocking call of asyncsoak runs on.
EXECUTOR = BlockingExecutor()


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
        self._then: list[Callable[[], None]] = []

    def run(self) -> None:
        """Run the call (in the taker's thread), keeping its result or its exception."""
        try:
            self._result = self.func()
        except Exception as exc:
            self._error = exc
        with self._lock:
            self.finished = True
            then, self._then = self._then, []
        for callback in then:
            callback()

    def mark_done(self) -> None:
        """On the event loop, once the ride has run: its rider may read the outcome."""
        if self.done.is_set():
            return
        self.done.set()
        if self.on_done is not None:
            self.on_done()

    def hurry(self) -> None:
        """The rider cannot wait for its taker to come back (a slow read of a huge tree on a
        starved machine): ``done`` is set on the event loop as soon as the call returns (at
        once if it has, with no wake-up of the loop)."""
        if self.done.is_set():
            return
        loop = asyncio.get_running_loop()

        def tell() -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is closed
                loop.call_soon_threadsafe(self.mark_done)

        with self._lock:
            if not self.finished:
                self._then.append(tell)
                return
        self.mark_done()

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the call has returned: now, or in the taker's thread."""
        with self._lock:
            if not self.finished:
                self._then.append(callback)
                return
        callback()

    def outcome(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class Rides:
    """Blocking calls waiting to ride on the next hop of a caller that makes one anyway.

    Each trip to a pool thread and back wakes two threads or more; at every sample interval the
    proc sampler's ticker runs a job in its thread anyway, so the watchdog's scan and the
    journal's batched write ride on it instead of making their own (:func:`ride_or_run`).  The
    taker runs the rides before its own call, in the same thread (its deadline grows by theirs),
    those posted ``last`` after the others, and sets each ride's ``done`` on the event loop once
    it is back.  So no ride waits behind a slow call of the taker's (and a rider that cannot
    wait for the taker's return asks to be told as soon as its own call is: :meth:`Ride.hurry`),
    and a journal write that hangs holds up no ride posted before it.  Riders post and withdraw
    on the event loop; the taker may take in its thread, hence the lock.
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


#: Threads of one :class:`Ticker` alive at once at most, stuck ones included.
MAX_TICKER_THREADS = 3
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
    ride.hurry()
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


class TickTimeout(BlockingCallTimeout):
    """A ticker's job outlived its deadline; ``partial`` is what it had so far."""

    def __init__(self, what: str, timeout: float, partial: dict[str, Any]) -> None:
        super().__init__(what, timeout)
        self.partial = partial


class Ticker(Generic[T]):
    """A job run at the ticks of a grid in a thread of the pool, each outcome handed to the
    event loop, the next job not before the loop has asked for it: the soak's sampling clock.

    A trip to a pool thread per tick (:func:`run_blocking`) wakes the loop for its timer, a
    thread for the call (and, with several idle threads on the pool's queue, often a second
    one), the loop again for the result, and passes the GIL back and forth whenever both want
    it.  The ticker's thread sleeps until each tick on its own, runs the job and wakes the
    loop once with the outcome: one wake-up of each per tick.

    The loop keeps the pace: the job runs only once the loop has asked for its outcome
    (:meth:`next`, called when the loop is done with the last one), at the first tick on the
    grid after the ask; the ticks before it are skipped.  So the thread never reads while the
    loop is still busy with the last sample nor hands it a backlog, exactly as one trip per
    tick paced by the loop.  The first job runs at once (a soak's first sample is its start).

    The thread is the ticker's own daemon thread (:meth:`BlockingExecutor.run_in_own_thread`),
    outside the pool's bound: a ticker holds its thread for the soak's whole life, and on the
    pool the seventeenth soak of a process would wait for a thread it never gets (it would
    run blind).  A job that outlives its deadline (:meth:`next`) abandons that thread (it is
    counted) and the ticks go on, on the same grid, in a new one; the stuck thread, when its
    job returns, sees it was replaced and ends.  At most :data:`MAX_TICKER_THREADS` threads of
    one ticker are alive at once, stuck ones included: past that no new one starts until a
    stuck one returns, and meanwhile every :meth:`next` times out (the sampler says it is
    degraded, then the soak fails closed).  ``job(tick, partial)`` gets the tick's time
    and a dict for what it has so far, which :meth:`next` hands back in :class:`TickTimeout`
    when the job does not come back in time.
    """

    def __init__(
        self,
        job: Callable[[float, dict[str, Any]], T],
        *,
        start: float,
        interval: float,
        more_time: Callable[[dict[str, Any]], float] | None = None,
    ) -> None:
        self._job = job
        #: How much longer than its ``timeout`` the job under way may take, from what it has
        #: so far (the rides it took, each with its own bound).
        self._more_time = more_time
        self._tick = start
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        #: Outcomes the loop has asked for, and jobs started, since the start (the first job
        #: is asked for from the start); a job starts only while ``_asked > _started``.
        self._asked = 1
        self._started = 0
        #: Set when the loop asks, for a thread that waits for the ask.
        self._ask = threading.Event()
        self._taken = 0
        self._generation = 0
        self._call: _Call | None = None
        self._partial: dict[str, Any] = {}
        self._outcome: tuple[T | None, BaseException | None] | None = None
        self._arrived = anyio.Event()
        #: (generation, when) the job under way started; None between jobs.
        self._job_started: tuple[int, float] | None = None
        self._submitted = 0.0
        #: The ticker's threads alive (the current one and stuck ones), and whether a new one
        #: waits for one of them to end; both shared with the threads, hence the lock.
        self._lock = threading.Lock()
        self._threads_alive = 0
        self._start_waiting = False

    async def __aenter__(self) -> Ticker[T]:
        self._start(at_once=True)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop ticking: the thread wakes from its wait and ends (nobody waits for it)."""
        self._stop.set()
        self._ask.set()
        job = self._job_started
        if self._call is not None and job is not None and job[0] == self._generation:
            self._call.cancel()  # a job under way is abandoned (and counted)

    async def next(self, timeout: float) -> T:  # noqa: ASYNC109 (the deadline is the point)
        """The next outcome: the loop is done with the last one, the next tick may run.

        The job gets ``timeout`` seconds from when it starts, and what ``more_time`` grants
        it (a call the pool has not started gets one interval more).  Past that it is
        abandoned, the ticks go on in a new thread, and :class:`TickTimeout` carries what the
        job had so far.
        """
        self._asked = self._taken + 1
        self._ask.set()
        while self._outcome is None:
            now = time.monotonic()
            job = self._job_started
            if job is not None and job[0] == self._generation:
                more = self._more_time(self._partial) if self._more_time is not None else 0.0
                deadline = job[1] + timeout + more
            elif self._call is not None and not self._call.running():
                deadline = self._submitted + self._interval + timeout
            else:  # the thread waits for the tick: a deadline after it, never a busy wait
                deadline = next_tick(self._tick, self._interval, now) + timeout
            if now >= deadline:
                self._taken += 1
                self._replace(timeout)
            with anyio.move_on_after(deadline - now):
                await self._arrived.wait()
                self._arrived = anyio.Event()
        value, error = self._outcome
        self._outcome = None
        self._taken += 1
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    def _replace(self, timeout: float) -> NoReturn:
        """Abandon the job under way (or the call not started) and tick on in a new thread."""
        partial_outcome = self._partial
        self._generation += 1
        self._started = self._taken  # the abandoned job counts as run
        if self._call is not None:
            self._call.cancel()
        if not self._stop.is_set():
            self._start(at_once=False)  # on the same grid
        raise TickTimeout("a tick's job", timeout, dict(partial_outcome))

    def _start(self, *, at_once: bool) -> None:
        with self._lock:
            if self._threads_alive >= MAX_TICKER_THREADS:
                # Stuck threads enough: the next starts when one of them ends (_thread_ended).
                self._start_waiting = True
                self._call = None
                return
            self._threads_alive += 1
        partial_outcome: dict[str, Any] = {}
        self._partial = partial_outcome
        self._submitted = time.monotonic()
        call = EXECUTOR.run_in_own_thread(
            partial(self._run, self._generation, partial_outcome, at_once), name="asyncsoak-ticker"
        )
        assert isinstance(call, _Call)
        self._call = call

    def _thread_ended(self) -> None:
        """In the thread, as it ends: a stuck one makes room for the thread that waits."""
        with self._lock:
            self._threads_alive -= 1
            waiting = self._start_waiting and not self._stop.is_set()
        if waiting:
            with contextlib.suppress(RuntimeError):  # the event loop is closed
                self._loop.call_soon_threadsafe(self._start_waiting_thread)

    def _start_waiting_thread(self) -> None:
        with self._lock:
            waiting, self._start_waiting = self._start_waiting, False
        if waiting and not self._stop.is_set():
            self._start(at_once=False)  # on the same grid

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stop.is_set()

    def _wait_for_ask(self, generation: int) -> bool:
        """Whether the loop has asked for the next outcome, waiting (bounded, again and
        again) until it has; False once this thread is no longer the ticker's."""
        while True:
            self._ask.clear()
            if not self._current(generation):
                return False
            if self._asked > self._started:
                return True
            self._ask.wait(self._interval)

    def _run(self, generation: int, partial_outcome: dict[str, Any], at_once: bool) -> None:
        """The thread: sleep until the tick, run the job if the loop has asked for it, hand
        the outcome to the loop."""
        try:
            self._tick_until_replaced(generation, partial_outcome, at_once)
        finally:
            self._thread_ended()

    def _tick_until_replaced(
        self, generation: int, partial_outcome: dict[str, Any], at_once: bool
    ) -> None:
        tick = self._tick
        while True:
            if not at_once:
                tick = next_tick(tick, self._interval, time.monotonic())
                if self._stop.wait(max(0.0, tick - time.monotonic())):
                    return
            at_once = False
            if self._asked <= self._started:
                # The loop is still busy with the last outcome: skip this tick, and once it
                # asks, take the next tick on the grid.
                if not self._wait_for_ask(generation):
                    return
                continue
            if not self._current(generation):
                return
            self._started += 1
            self._tick = tick
            partial_outcome.clear()
            value: T | None = None
            error: BaseException | None = None
            self._job_started = (generation, time.monotonic())
            try:
                value = self._job(tick, partial_outcome)
            except Exception as exc:
                error = exc
            if not self._current(generation):
                return  # replaced (or stopped) while the job ran: its outcome is nobody's
            self._job_started = None
            try:
                self._loop.call_soon_threadsafe(self._deliver, generation, value, error)
            except RuntimeError:
                return  # the event loop is closed

    def _deliver(self, generation: int, value: T | None, error: BaseException | None) -> None:
        if generation == self._generation:
            self._outcome = (value, error)
            self._arrived.set()


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
