"""The runtime snapshot, taken beside the trainer (a hung nvidia-smi must not delay its start),
bounded, after the scheduler's job (the stop needs its facts)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from functools import partial
from typing import Any

import anyio

from .._contract import EventSink, events, host_cancelled, run_blocking
from ._config import SoakConfig
from ._slurm import SoakJob

#: Bound on each external call of the snapshot (git, nvidia-smi, another interpreter).
SNAPSHOT_CALL_TIMEOUT_SECONDS = 5.0
#: Bound on the runtime snapshot as a whole.
SNAPSHOT_TIMEOUT_SECONDS = 30.0


async def take_snapshot(
    sink: EventSink,
    scope: anyio.CancelScope,
    done: anyio.Event,
    *,
    cfg: SoakConfig,
    env: Mapping[str, str],
    job: SoakJob,
    limiter: anyio.CapacityLimiter,
) -> None:
    """Take the runtime snapshot in a thread and send it as an event (bounded)."""
    data: dict[str, Any] = {"error": f"snapshot took longer than {SNAPSHOT_TIMEOUT_SECONDS:g}s"}
    # The host's cancel (its loop ending) is taken back: this task's end would cancel the
    # serializer beside it, which still has the soak's end to write.
    ended = False
    try:
        async with sink:
            with scope, anyio.move_on_after(SNAPSHOT_TIMEOUT_SECONDS):
                try:
                    await job.query()
                    data = await run_blocking(
                        partial(
                            _collect_snapshot,
                            cfg.snapshot_root,
                            command=cfg.command,
                            env=env,
                            nvidia_smi=cfg.nvidia_smi or "nvidia-smi",
                            timeout=SNAPSHOT_CALL_TIMEOUT_SECONDS,
                        ),
                        timeout=SNAPSHOT_TIMEOUT_SECONDS,
                        what="the runtime snapshot",
                        limiter=limiter,
                    )
                except Exception as exc:
                    data = {"error": f"snapshot failed: {type(exc).__name__}: {exc}"}
                except asyncio.CancelledError:
                    if not host_cancelled():
                        raise
                    ended = True
            if ended or scope.cancelled_caught:
                data = {"error": "the soak ended before the snapshot was taken"}
            data["scheduler"] = job.facts
            job.known.set()
            await sink.emit(events.Snapshot(t=sink.elapsed(), data=data))
    except asyncio.CancelledError:
        if not host_cancelled():
            raise
    finally:
        done.set()


def _collect_snapshot(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The snapshot, its module imported here in the thread: never on the host's loop."""
    from .._sampling import collect_snapshot

    return collect_snapshot(*args, **kwargs)
