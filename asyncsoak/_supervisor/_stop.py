"""The soak's command as a process tree: its cgroup, its start, its stop (ask, bounded grace,
SIGKILL, bounded reap, as trio's ``_subprocess.py``) and the clean-up that leaves nothing behind.
Graceful waits end when the caller asks to kill now, the monitor's own when the caller stops the
soak; a stall's forensics are taken before the first signal."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, Final, Literal

import anyio
from anyio.abc import TaskGroup

from .._contract import (
    BlockingCallTimeout,
    EventSink,
    FailureReason,
    Masker,
    StopCause,
    events,
    exits,
    run_blocking,
)
from .._process import (
    REAPER_CLOSE_TIMEOUT_SECONDS,
    Spawner,
    SpawnRequest,
    cgroups,
    collect_forensics,
    process_tree,
    stall_culprit,
)
from .._sampling import StepReader
from ..trainer import STEPS_FILE_VARIABLE
from . import _slurm
from ._config import SoakConfig
from ._control import SoakControl

#: Bound on one look at the tree during the stop (the marker scan reads every environ, which
#: waits on each target's mmap lock: a wedged CUDA process holds it).
TREE_LOOK_TIMEOUT_SECONDS = 1.0
#: Bound on one walk of the tree below the reaper (a read per process, no other's locks).
TREE_WALK_TIMEOUT_SECONDS = 5.0
#: Time given to the trainer to print what ``dump_signal`` asked for before forensics start.
DUMP_WAIT_SECONDS = 1.0
#: Bound on the hang forensics (py-spy of every Python process included).
FORENSICS_SECONDS = 10.0
#: Of a scheduler's stop's margin under its SIGKILL, what is kept for the end after the kill
#: (the reaper's close, the artifact): waits on an unkillable tree stop this long before it.
FINISH_RESERVE_SECONDS = 1.5
#: The kill's wait is never cut below this: every member gets its SIGKILL at least once.
MIN_KILL_WAIT_SECONDS = 0.5
#: Rules after which the tree is looked at before it is stopped.
HANG_REASONS = frozenset({FailureReason.STALE_PROGRESS, FailureReason.STARTUP_TIMEOUT})
#: Environment marker that lets the monitor recognise processes of this soak's tree.
SOAK_ID_VARIABLE = "ASYNCSOAK_SOAK_ID"
#: Give each soak's tree a cgroup where allowed; tests turn it off for the marker fallback.
USE_CGROUP = True

#: Records a failure (reason, message) in the soak's artifact.
Fail = Callable[[FailureReason, str], Awaitable[None]]
#: The soak's end cause when its reaper died: the tree is killed at once (never a ``stop.cause``).
REAPER_LOST: Final = "reaper_lost"
#: What ended the soak: a stop cause, or the reaper's loss.
EndCause = StopCause | Literal["reaper_lost"]


class TreeStop:
    """Stops one soak's tree and says in the journal what was left and what was killed."""

    def __init__(
        self,
        cfg: SoakConfig,
        control: SoakControl,
        masker: Masker,
        marker: str,
        limiter: anyio.CapacityLimiter,
        fail: Fail,
    ) -> None:
        self.cfg = cfg
        self.control = control
        #: Shared with the soak's other parts (its exit's judge, its producers).
        self.masker, self.limiter, self.fail = masker, limiter, fail
        self._marker = marker
        #: Set when the caller stops the soak: the waits not needed to stop the tree end.
        self.caller_stop = anyio.Event()
        #: Scopes given up when the caller stops the soak; the graceful ones on a kill now.
        self._stop_scopes: set[anyio.CancelScope] = set()
        self._grace_scopes: set[anyio.CancelScope] = set()
        self._marker_scan_hung = False
        #: The pids the command and the stop's walks saw, for the kernel's OOM records.
        self.seen_pids: set[int] = set()
        #: In a scheduler's stop: when (``anyio.current_time()``) the waits on the tree end.
        self.deadline: float | None = None
        self._forensics_taken = False

    def caller_stopped(self) -> None:
        if not self.caller_stop.is_set():
            self.caller_stop.set()
            for scope in list(self._stop_scopes):
                scope.cancel()

    def kill_now(self) -> None:
        for scope in list(self._grace_scopes | self._stop_scopes):
            scope.cancel()

    @contextlib.contextmanager
    def given_up_on_caller_stop(self, *, grace: bool = False) -> Iterator[anyio.CancelScope]:
        """A scope cancelled as soon as the caller stops the soak (at once if it has); with
        ``grace`` (the caller's own stop's graceful period), only when it asks to kill now."""
        scopes = self._grace_scopes if grace else self._stop_scopes
        with anyio.CancelScope() as scope:
            if self.control.kill_requested.is_set() or (not grace and self.caller_stop.is_set()):
                scope.cancel()
            scopes.add(scope)
            try:
                yield scope
            finally:
                scopes.discard(scope)

    async def wait_tree_gone(
        self, spawner: Spawner, seconds: float, cause: EndCause | None
    ) -> None:
        """Wait up to ``seconds`` for the tree to be gone: a stop from outside (the caller, a
        scheduler) keeps its grace; the monitor's own gives way to the caller's stop."""
        own_stop = cause not in (StopCause.EXITED, StopCause.FAILURE, StopCause.MAX_DURATION)
        with self.given_up_on_caller_stop(grace=own_stop), anyio.move_on_after(seconds):
            await spawner.tree_gone.wait()

    async def stop(
        self,
        sink: EventSink,
        spawner: Spawner,
        cause: StopCause,
        *,
        first_failure: FailureReason | None,
        scheduler: dict[str, Any] | None,
    ) -> None:
        """The monitor ends the run: graceful request, grace, SIGKILL, bounded reap."""
        cfg, control = self.cfg, self.control
        grace = cfg.post_shutdown_grace_seconds
        if control.stop_requested.is_set() and control.grace_seconds is not None:
            grace = control.grace_seconds
        if cause == StopCause.SCHEDULER and control.stop_requested.is_set():
            # SIGTERM from the scheduler: its SIGKILL follows KillWait later.  Facts not known
            # yet (a SIGTERM in the first instants): the caller's figure, else the default.
            known = scheduler or {"kill_wait_seconds": cfg.scheduler_grace_seconds}
            grace = _slurm.stop_grace(grace, known)
            kill_wait = _slurm.kill_wait_of(known)
            self.deadline = anyio.current_time() + kill_wait - FINISH_RESERVE_SECONDS
        await sink.emit(
            events.StopRequested(
                t=sink.elapsed(), cause=cause, mode=cfg.stop_mode, grace_seconds=grace
            )
        )
        if cause == StopCause.FAILURE and first_failure in HANG_REASONS:
            await self.hang_forensics(sink, spawner, first_failure)
        # A requeue's graceful request was the forwarded signal: the trainer is saving.
        if cause != StopCause.REQUEUED and not spawner.exited.is_set():
            if cfg.stop_mode == "stdin":
                if spawner.close_stdin():
                    await sink.emit(events.StdinClosed(t=sink.elapsed()))
            else:
                pids = await self._walk(spawner)
                group = cfg.stop_mode == "group"
                sig = signal.SIGTERM
                if spawner.signal_group(sig) if group else spawner.signal_leader(sig):
                    await sink.emit(
                        events.SignalSent(
                            t=sink.elapsed(), signal="SIGTERM", target=cfg.stop_mode, pids=pids
                        )
                    )
        await self.wait_tree_gone(spawner, grace, cause)
        if spawner.tree_gone.is_set():
            return
        if not spawner.exited.is_set():
            await self.kill(sink, spawner)
            return
        # The command is gone but some of its tree outlived it by the grace.
        counted = cause in (StopCause.FAILURE, StopCause.MAX_DURATION)
        await self.kill_leftovers(sink, spawner, f"{grace:g}s", lambda: counted)

    async def after_reaper_lost(self, sink: EventSink, spawner: Spawner) -> None:
        """The reaper died: nothing reports the tree any more, so it is killed at once, every
        member found by cgroup (or marker)."""
        how = await spawner.reaper_exit(1.0)
        await self.fail(
            FailureReason.MONITOR_ERROR,
            f"the reaper (pid {spawner.reaper_pid}) was lost: {how}; the tree was stopped",
        )
        pids = await self._announce_kill(sink, spawner)
        with anyio.move_on_after(self.cfg.kill_wait_seconds):
            while pids:
                await run_blocking(
                    _kill_all,
                    spawner,
                    pids,
                    timeout=TREE_WALK_TIMEOUT_SECONDS,
                    what="killing the tree",
                )
                await anyio.sleep(0.05)
                pids = await self.tree_pids(spawner)
        await self._abandon(sink, spawner, pids)
        # Nothing is left to say the tree is gone: it is, or it is reported abandoned.
        spawner.tree_gone.set()

    async def tree_pids(self, spawner: Spawner) -> list[int]:
        """The tree below the reaper, plus marked processes that left it (bounded)."""
        pids = await self._walk(spawner)
        if not self._marker_scan_hung and spawner.cgroup is None:
            # Without a cgroup, the environment marker finds what left the reaper's tree.
            try:
                marked = await run_blocking(
                    process_tree.find_marked,
                    SOAK_ID_VARIABLE,
                    self._marker,
                    timeout=TREE_LOOK_TIMEOUT_SECONDS,
                    what="the scan for the soak's environment marker",
                )
            except BlockingCallTimeout:
                # Stuck behind a wedged process's mmap lock: not tried again in this soak,
                # so a stop never piles up threads on it.
                self._marker_scan_hung = True
            else:
                pids += [pid for pid in marked if pid not in pids]
        self.seen_pids.update(pids)
        return pids

    @staticmethod
    async def _walk(spawner: Spawner) -> list[int]:
        with contextlib.suppress(BlockingCallTimeout):
            return await run_blocking(
                spawner.tree_pids, timeout=TREE_WALK_TIMEOUT_SECONDS, what="walking the tree"
            )
        return []

    async def _describe(self, pids: list[int], leader_pgid: int | None) -> list[dict[str, Any]]:
        """What the artifact says about each live pid; psutil's reads run off the loop."""
        try:
            return await run_blocking(
                _describe_all,
                pids,
                leader_pgid,
                timeout=TREE_LOOK_TIMEOUT_SECONDS,
                what="describing the processes of the tree",
            )
        except BlockingCallTimeout:
            return [{"pid": pid, "name": None, "state": "unknown", "cmdline": None} for pid in pids]

    async def kill_leftovers(
        self, sink: EventSink, spawner: Spawner, grace: str, counts: Callable[[], bool]
    ) -> None:
        """Record each process alive after the grace, kill the tree; the leftovers are a
        failure if ``counts()`` still says so once they are killed."""
        leftovers = await self._describe(await self.tree_pids(spawner), spawner.pid)
        for info in leftovers:
            if info.get("cmdline") is not None:
                info["cmdline"] = self.masker.argv(info["cmdline"])
            await sink.emit(events.Leftover(t=sink.elapsed(), process=info))
        await self.kill(sink, spawner)
        if leftovers and counts():
            await self.fail(
                FailureReason.LEFTOVER_PROCESSES,
                f"{len(leftovers)} process(es) outlived the command by {grace} and were killed",
            )

    async def kill(self, sink: EventSink, spawner: Spawner) -> None:
        """SIGKILL everything left, again and again (a forking tree races us), within a bound."""
        pids = await self._announce_kill(sink, spawner)
        wait = max(MIN_KILL_WAIT_SECONDS, self.within_deadline(self.cfg.kill_wait_seconds))
        with anyio.move_on_after(wait):
            while True:
                # Marked processes outside the reaper's tree are not covered by kill_tree().
                with contextlib.suppress(BlockingCallTimeout):
                    await run_blocking(
                        _kill_all, spawner, pids, timeout=TREE_WALK_TIMEOUT_SECONDS, what="the kill"
                    )
                with anyio.move_on_after(0.05):
                    await spawner.tree_gone.wait()
                pids = await self.tree_pids(spawner)
                if spawner.tree_gone.is_set() and not pids:
                    return
        await self._abandon(sink, spawner, pids)

    async def _announce_kill(self, sink: EventSink, spawner: Spawner) -> list[int]:
        pids = await self.tree_pids(spawner)
        await sink.emit(
            events.SignalSent(t=sink.elapsed(), signal="SIGKILL", target="tree", pids=pids)
        )
        return pids

    async def _abandon(self, sink: EventSink, spawner: Spawner, pids: list[int]) -> None:
        for info in await self._describe(pids, spawner.pid):
            await sink.emit(events.Abandoned(t=sink.elapsed(), process=self.masker.data(info)))

    def within_deadline(self, seconds: float) -> float:
        """``seconds``, cut to what is left before :attr:`deadline` in a scheduler's stop."""
        if self.deadline is None:
            return seconds
        return max(0.0, min(seconds, self.deadline - anyio.current_time()))

    async def hang_forensics(
        self, sink: EventSink, spawner: Spawner, reason: FailureReason
    ) -> None:
        """Before the first signal, once: ask for a stack dump, record what the tree is doing
        (and which rank(s) a distributed run's stall waits on)."""
        if self._forensics_taken:
            return
        self._forensics_taken = True
        cfg = self.cfg
        if cfg.dump_signal is not None and spawner.signal_leader(cfg.dump_signal):
            name = exits.signal_name(cfg.dump_signal)
            await sink.emit(
                events.SignalSent(
                    t=sink.elapsed(), signal=name, target="leader", pids=[spawner.pid or 0]
                )
            )
            with self.given_up_on_caller_stop():
                await anyio.sleep(DUMP_WAIT_SECONDS)
        if not cfg.forensics:
            return
        pids = await self.tree_pids(spawner)
        data: dict[str, Any] = {"error": f"forensics took longer than {FORENSICS_SECONDS:g}s"}
        with self.given_up_on_caller_stop() as scope, contextlib.suppress(BlockingCallTimeout):
            data = await run_blocking(
                partial(collect_forensics, pids, timeout=FORENSICS_SECONDS),
                timeout=FORENSICS_SECONDS + 2.0,
                what="the hang forensics",
                limiter=self.limiter,
            )
        if scope.cancelled_caught:
            data = {"error": "the caller stopped the soak during the forensics"}
        culprit = stall_culprit(data.get("processes") or [])
        if culprit is not None:
            data["ranks"] = culprit
        # Command lines and py-spy's headers carry argv: masked like argv everywhere else.
        await sink.emit(
            events.Forensics(t=sink.elapsed(), reason=reason, data=self.masker.data(data))
        )


def produce(
    tg: TaskGroup, sink: EventSink, producer: Callable[[EventSink], Awaitable[None]]
) -> None:
    """Run a producer with its own clone of the sink, closed when it returns."""

    async def run(clone: EventSink) -> None:
        async with clone:
            await producer(clone)

    tg.start_soon(run, sink.clone())


async def _bounded(call: Callable[..., Any], *args: Any, what: str) -> Any:
    """A short blocking call on the tree's cgroup or processes; None past its bound."""
    with contextlib.suppress(BlockingCallTimeout):
        return await run_blocking(call, *args, timeout=TREE_LOOK_TIMEOUT_SECONDS, what=what)
    return None


async def create_cgroup(soak_id: str) -> cgroups.TreeCgroup | None:
    """The tree's own cgroup where the kernel allows one (None past the bound)."""
    if not USE_CGROUP:
        return None
    created: cgroups.TreeCgroup | None
    created = await _bounded(
        cgroups.create, f"asyncsoak-{soak_id}", what="creating the tree's cgroup"
    )
    return created


def spawn_request(
    cfg: SoakConfig,
    env: dict[str, str],
    marker: str,
    log_fd: int,
    steps: StepReader | None,
    cgroup: cgroups.TreeCgroup | None,
) -> SpawnRequest:
    child_env = {**env, SOAK_ID_VARIABLE: marker}
    if steps is not None:
        child_env[STEPS_FILE_VARIABLE] = str(cfg.steps_path)
    return SpawnRequest(
        argv=cfg.command,
        cwd=None if cfg.cwd is None else str(cfg.cwd),
        env=child_env,
        log_fd=log_fd,
        log_max_bytes=cfg.log_max_bytes,
        stop_mode=cfg.stop_mode,
        grace_seconds=cfg.post_shutdown_grace_seconds,
        cgroup=None if cgroup is None else str(cgroup.path),
        kill_wait_seconds=cfg.kill_wait_seconds,
    )


async def start_command(
    sink: EventSink,
    spawner: Spawner,
    request: SpawnRequest,
    cgroup: cgroups.TreeCgroup | None,
    fail: Fail,
) -> bool:
    """Start the command; False (its failure recorded) when it could not be started."""
    if not await spawner.start(sink, request):
        await fail(
            FailureReason.SPAWN_FAILED,
            f"could not start {request.argv[0]!r}: {spawner.spawn_error}",
        )
        return False
    # Membership decides only if the command really joined the group.
    pid = spawner.pid
    if (
        cgroup is not None
        and pid is not None
        and await _bounded(cgroup.holds, pid, what="a cgroup")
    ):
        spawner.cgroup = cgroup
    return True


async def stop_for_the_host(
    sink: EventSink, spawner: Spawner, tree_stop: TreeStop, scheduler: dict[str, Any] | None
) -> None:
    """The host's loop ended, cancelling every task: the tree is stopped as on any cancel,
    beside a watch of its own on the reaper's reports."""
    if spawner.pid is None or spawner.tree_gone.is_set():
        return
    async with anyio.create_task_group() as watch:
        produce(watch, sink, spawner.watch)
        await tree_stop.stop(
            sink, spawner, StopCause.CANCELLED, first_failure=None, scheduler=scheduler
        )
        watch.cancel_scope.cancel()


async def leave_nothing_behind(
    spawner: Spawner | None, cgroup: cgroups.TreeCgroup | None, tree_stop: TreeStop
) -> None:
    """Bounded clean-up: the tree killed if the supervisor broke, the reaper closed, the cgroup
    removed."""
    if spawner is not None:
        if not spawner.tree_gone.is_set() and spawner.pid is not None:
            with contextlib.suppress(BlockingCallTimeout):
                await run_blocking(
                    spawner.kill_tree, timeout=TREE_WALK_TIMEOUT_SECONDS, what="killing the tree"
                )
        # A reaper still waiting on a tree SIGKILL cannot end (uninterruptible sleep)
        # is not waited for past a scheduler's deadline: the artifact comes first.
        await spawner.close(tree_stop.within_deadline(REAPER_CLOSE_TIMEOUT_SECONDS))
    if cgroup is not None:
        await _bounded(cgroup.remove, what="removing a cgroup")


def _kill_all(spawner: Spawner, pids: list[int]) -> None:
    """SIGKILL the tree (group, cgroup, reaper's descendants) and the given pids (in a thread)."""
    spawner.kill_tree()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _describe_all(pids: list[int], leader_pgid: int | None) -> list[dict[str, Any]]:
    described = (process_tree.describe(pid, leader_pgid=leader_pgid) for pid in pids)
    return [info for info in described if info is not None]
