"""The soak's last step: drain the journal, build the artifact and write it, each bounded (a
hung filesystem must not hold the soak forever; the artifact is built regardless)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from typing import TYPE_CHECKING, Any

import anyio

from .._contract import (
    BlockingCallTimeout,
    Masker,
    SinkCounters,
    SoakClock,
    SoakStatus,
    abandoned_calls,
    run_blocking,
)
from .._record import RunState, Serializer, read_log_tail, write_artifact
from ._config import SoakConfig

if TYPE_CHECKING:
    from .._contract import Artifact  # a type only: a run never imports the schema

#: Bound on writing the last queued events to the journal.
DRAIN_TIMEOUT_SECONDS = 10.0
#: Bound on writing the artifact (and on reading the log's tail for it).
ARTIFACT_WRITE_TIMEOUT_SECONDS = 10.0


def bound_drain(scope: anyio.CancelScope, serializer: Serializer) -> None:
    """The drain of the last events (under ``scope``) and the journal's shielded close get a
    deadline."""
    scope.deadline = serializer.close_deadline = anyio.current_time() + DRAIN_TIMEOUT_SECONDS


def note_drain(scope: anyio.CancelScope, serializer: Serializer) -> None:
    """A drain cut short at its deadline is the journal's error in the artifact."""
    if scope.cancelled_caught and not serializer.journal_error:
        serializer.journal_error = f"the journal did not drain within {DRAIN_TIMEOUT_SECONDS:g}s"


def monitor_section(
    serializer: Serializer,
    counters: SinkCounters,
    *,
    cpu_start: float,
    abandoned_at_start: int,
    reaper_pid: int | None,
) -> dict[str, Any]:
    """The artifact's ``monitor`` section: what the monitor itself cost and lost."""
    return {
        "cpu_seconds": round(time.process_time() - cpu_start, 3),
        "events": serializer.events,
        "dropped_samples": counters.dropped_samples,
        "sampler_errors": counters.sampler_errors,
        "journal_error": serializer.journal_error,
        "journal_segments": serializer.segments + 1,
        "journal_rotation_error": serializer.rotation_error,
        "events_not_folded": serializer.fold_errors,
        "fold_error": serializer.fold_error,
        "events_with_nonfinite_numbers": serializer.nonfinite_events,
        "reaper_pid": reaper_pid,
        "pid": os.getpid(),
        # Blocking calls given up at their deadline (a hung disk, a wedged process).
        "abandoned_calls": abandoned_calls() - abandoned_at_start,
    }


async def build_artifact(
    builder: RunState,
    cfg: SoakConfig,
    masker: Masker,
    *,
    status: SoakStatus,
    clock: SoakClock,
    monitor: dict[str, Any],
) -> Artifact:
    """The artifact ending now, with the log's tail (empty when the bounded read fails)."""
    log_tail = ""
    with contextlib.suppress(BlockingCallTimeout):
        log_tail = await run_blocking(
            read_log_tail,
            cfg.log_path,
            timeout=ARTIFACT_WRITE_TIMEOUT_SECONDS,
            what="reading the log's tail",
        )
    return builder.build_typed(
        status=status,
        ended_t=clock.elapsed(),
        log_tail=masker(log_tail),
        monitor=monitor,
    )


async def write_soak_artifact(artifact: Artifact, cfg: SoakConfig) -> None:
    """Write the artifact to ``cfg.output_path``; an ``OSError`` naming the journal if not."""
    path, journal = cfg.output_path, cfg.journal_path
    try:
        await run_blocking(
            write_artifact,
            artifact,
            path,
            timeout=ARTIFACT_WRITE_TIMEOUT_SECONDS,
            what=f"writing the artifact {path}",
        )
    except BlockingCallTimeout as exc:
        raise OSError(
            errno.ETIMEDOUT,
            f"could not write the soak artifact within {ARTIFACT_WRITE_TIMEOUT_SECONDS:g}s "
            f"(a hung filesystem? the tree was stopped; the journal is {journal})",
            str(path),
        ) from exc
    except OSError as exc:
        raise OSError(
            exc.errno,
            "could not write the soak artifact (the tree was stopped; the journal "
            f"is {journal}): {exc.strerror}",
            str(path),
        ) from exc
