"""The verdict on the command's own exit, and the soak's status from everything that happened.

An exit is judged by its status (a signal the monitor did not send, a nonzero code), the
kernel's OOM records, the crash cause lifted from the end of the log, the run's length, and
whatever outlived the command's grace; each finding is a failure in the artifact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial

import anyio

from .._blocking import BlockingCallTimeout, run_blocking
from .._process._crash import describe as describe_crash
from .._process._crash import find_exception
from .._process._exits import decode as decode_exit
from .._process._forensics import oom_kills, seconds_since_boot
from .._process._spawn import Spawner
from .._record._artifact import read_log_tail
from .._record._events import CrashCause, OomKill, WarningEvent
from .._record._sink import EventSink
from .._record._vocabulary import StopCause
from .._redact import Masker
from . import _slurm
from ._config import SoakConfig
from ._stop import Fail, TreeStop

#: The kernel log's clock and the monitor's may drift apart a little.
KMSG_SLACK_SECONDS = 5.0


class ExitJudge:
    """Judges how the command ended by itself, and reports the tree's OOM kills once each."""

    def __init__(
        self,
        cfg: SoakConfig,
        *,
        masker: Masker,
        limiter: anyio.CapacityLimiter,
        tree_stop: TreeStop,
        fail: Fail,
    ) -> None:
        self.cfg = cfg
        self._masker = masker
        self._limiter = limiter
        self._tree_stop = tree_stop
        self._fail = fail
        self._oom_reported: set[int] = set()
        self._boot_seconds_at_start = seconds_since_boot()

    async def after_exit(
        self, sink: EventSink, spawner: Spawner, cause: str | None, *, progress_seen: bool
    ) -> None:
        """The command ended by itself: judge its exit, then give its tree the grace."""
        cfg = self.cfg
        rc = spawner.returncode
        assert rc is not None
        ran_for = sink.elapsed()
        exit_failure: tuple[str, str] | None = None
        ended = decode_exit(rc)
        if ended.signal is not None and ended.signal not in spawner.signals_to_leader:
            message = f"the command was killed by {spawner.exit_signal}"
            if ended.signal in spawner.signals_forwarded:
                # Passed on, not the monitor's stop: the command dying of it is its failure.
                message += (
                    f", forwarded by the monitor (it received {spawner.exit_signal} and "
                    "passed it on; the command did not survive it)"
                )
            if ended.maybe_oom and spawner.pid in await self.report_oom_kills(sink):
                message += " from the kernel's OOM killer (out of memory)"
            exit_failure = ("signaled", message)
        elif rc > 0:
            exit_failure = ("nonzero_exit", f"the command exited with status {rc}")
        # The rest of the tree gets its grace first: by then the reaper has copied the last of
        # the output (the traceback) into the log, so the failure message can quote it.
        await self._tree_stop.wait_tree_gone(spawner, cfg.post_shutdown_grace_seconds, cause)
        if exit_failure is not None:
            reason, message = exit_failure
            crash = await self.crash_cause(sink)
            if crash is not None:
                message += f": {crash}"
            await self._fail(reason, message)
        if ran_for < cfg.min_duration_seconds:
            await self._fail(
                "too_short",
                f"the command ended after {ran_for:.1f}s, before "
                f"min_duration_seconds={cfg.min_duration_seconds:g}",
            )
        if not spawner.tree_gone.is_set():
            leftovers = await self._tree_stop.record_leftovers(sink, spawner)
            await self._tree_stop.kill(sink, spawner)
            # The caller stopped the soak during the grace: its stop, not a leftover failure.
            if leftovers and not self._tree_stop.caller_stop.is_set():
                await self._fail(
                    "leftover_processes",
                    f"{leftovers} process(es) outlived the command by "
                    f"post_shutdown_grace_seconds={cfg.post_shutdown_grace_seconds:g} "
                    "and were killed",
                )
        if rc == 0 and not progress_seen:
            await sink.emit(
                WarningEvent(
                    t=sink.elapsed(),
                    message="the command exited cleanly without any progress in progress_dir",
                )
            )

    async def crash_cause(self, sink: EventSink) -> str | None:
        """Lift the cause of a crash from the end of the log into ``exit.exception``."""
        try:
            text = await run_blocking(
                read_log_tail, self.cfg.log_path, timeout=5.0, what="reading the log's tail"
            )
        except BlockingCallTimeout:
            return None
        cause = find_exception(text)
        if cause is None:
            return None
        await sink.emit(
            CrashCause(
                t=sink.elapsed(),
                type=self._masker(cause.type),
                message=self._masker(cause.message),
                where=cause.where,
                exception_kind=cause.kind,
            )
        )
        return self._masker(describe_crash(cause))

    async def report_oom_kills(self, sink: EventSink) -> set[int]:
        """Look up the tree's pids in the kernel's OOM records; report each kill once."""
        found = None
        with contextlib.suppress(BlockingCallTimeout):
            found = await run_blocking(
                partial(
                    oom_kills,
                    set(self._tree_stop.seen_pids),
                    since_boot_seconds=self._boot_seconds_at_start - KMSG_SLACK_SECONDS,
                ),
                timeout=5.0,
                what="reading the kernel's OOM records",
                limiter=self._limiter,
            )
        for kill in found or []:
            if kill["pid"] not in self._oom_reported:
                self._oom_reported.add(kill["pid"])
                await sink.emit(OomKill(t=sink.elapsed(), **kill))
        return self._oom_reported


def soak_status(
    error: Exception | None, cause: str | None, failures: Sequence[str], *, caller_stopped: bool
) -> str:
    """The artifact's ``status`` from the end cause, the failures and the monitor's own error."""
    if error is not None:
        return "error"
    if cause in (
        StopCause.REQUESTED,
        StopCause.CANCELLED,
        _slurm.CAUSE_SCHEDULER,
        _slurm.CAUSE_REQUEUED,
    ):
        return "cancelled"
    if "monitor_error" in failures:
        return "error"  # the reaper was lost
    if caller_stopped and not failures:
        # The command had exited and its tree was in its grace when the caller stopped.
        return "cancelled"
    return "failed" if failures else "passed"
