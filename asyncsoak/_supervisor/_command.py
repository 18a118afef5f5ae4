"""The soak's command as a process tree: its cgroup, its start, its end, and the bounded
clean-up that leaves nothing of it behind."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from .._contract import BlockingCallTimeout, EventSink, FailureReason, StopCause, run_blocking
from .._process import REAPER_CLOSE_TIMEOUT_SECONDS, Spawner, SpawnRequest, cgroups
from .._sampling import StepReader
from ..trainer import STEPS_FILE_VARIABLE
from ._config import SoakConfig
from ._producers import produce
from ._stop import (
    SOAK_ID_VARIABLE,
    TREE_LOOK_TIMEOUT_SECONDS,
    TREE_WALK_TIMEOUT_SECONDS,
    Fail,
    TreeStop,
)

#: Give each soak's tree a cgroup where allowed; tests turn it off for the marker fallback.
USE_CGROUP = True


async def create_cgroup(soak_id: str) -> cgroups.TreeCgroup | None:
    """The tree's own cgroup where the kernel allows one (bounded: None past the bound)."""
    if not USE_CGROUP:
        return None
    with contextlib.suppress(BlockingCallTimeout):
        return await run_blocking(
            cgroups.create,
            f"asyncsoak-{soak_id}",
            timeout=TREE_LOOK_TIMEOUT_SECONDS,
            what="creating the tree's cgroup",
        )
    return None


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
        message = f"could not start {request.argv[0]!r}: {spawner.spawn_error}"
        await fail(FailureReason.SPAWN_FAILED, message)
        return False
    if cgroup is not None and spawner.pid is not None:
        # Membership decides only if the command really joined the group.
        with contextlib.suppress(BlockingCallTimeout):
            if await run_blocking(
                cgroup.holds, spawner.pid, timeout=TREE_LOOK_TIMEOUT_SECONDS, what="a cgroup"
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
                    spawner.kill_tree,
                    timeout=TREE_WALK_TIMEOUT_SECONDS,
                    what="killing the tree",
                )
        # A reaper still waiting on a tree SIGKILL cannot end (uninterruptible sleep)
        # is not waited for past a scheduler's deadline: the artifact comes first.
        await spawner.close(tree_stop.within_deadline(REAPER_CLOSE_TIMEOUT_SECONDS))
    if cgroup is not None:
        with contextlib.suppress(BlockingCallTimeout):
            await run_blocking(
                cgroup.remove, timeout=TREE_LOOK_TIMEOUT_SECONDS, what="removing a cgroup"
            )
