"""The verdict on the command's own exit (its status, OOM kills, the crash in the log, its
length, its leftovers), and the soak's status from everything that happened."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._analysis import format_bytes
from .._contract import (
    BlockingCallTimeout,
    EventSink,
    FailureReason,
    SoakStatus,
    StopCause,
    events,
    exits,
    run_blocking,
)
from .._process import Spawner, oom_kills, seconds_since_boot
from .._record import RunState, read_log_tail
from .._sampling import MemoryCgroup
from ._stop import EndCause, TreeStop

#: The kernel log's clock and the monitor's may drift apart a little.
KMSG_SLACK_SECONDS = 5.0


class ExitJudge:
    """Judges how the command ended by itself, and reports the tree's OOM kills once each."""

    def __init__(self, tree_stop: TreeStop, state: RunState) -> None:
        self.cfg, self._state, self._tree_stop = tree_stop.cfg, state, tree_stop
        self._masker, self._fail = tree_stop.masker, tree_stop.fail
        self._oom_reported: dict[int, events.OomKill] = {}
        #: The tree's memory cgroup as read at the start (its OOM-kill counter then), if known.
        self.memory_cgroup: MemoryCgroup | None = None
        #: How much of that counter's rise the reports so far account for.
        self._cgroup_kills_seen = 0
        self._boot_seconds_at_start = seconds_since_boot()

    async def after_exit(
        self,
        sink: EventSink,
        spawner: Spawner,
        cause: EndCause,
        *,
        progress_seen: bool,
        missing_dir: Path | None = None,
    ) -> None:
        """The command ended by itself: judge its exit, give its tree the grace.  A clean exit
        without progress is a warning, or ``no_progress`` when the directory never existed."""
        cfg = self.cfg
        rc = spawner.returncode
        assert rc is not None
        ran_for = sink.elapsed()
        exit_failure = await self._exit_failure(sink, spawner, rc)
        # The rest of the tree gets its grace first: by then the reaper has copied the last of
        # the output (the traceback) into the log, so the failure message can quote it.
        await self._tree_stop.wait_tree_gone(spawner, cfg.post_shutdown_grace_seconds, cause)
        if exit_failure is not None:
            reason, message = exit_failure
            crash = await self.crash_cause(sink)
            if crash is not None:
                message += f": {crash}"
            await self._fail(reason, message)
        if rc == 0 and not progress_seen and missing_dir is not None:
            await self._fail(
                FailureReason.NO_PROGRESS,
                f"the progress directory {missing_dir} never existed: the command exited 0 "
                "without any progress (is --progress-dir where the trainer writes?)",
            )
        if ran_for < cfg.min_duration_seconds:
            await self._fail(
                FailureReason.TOO_SHORT,
                f"the command ended after {ran_for:.1f}s, before "
                f"min_duration_seconds={cfg.min_duration_seconds:g}",
            )
        if not spawner.tree_gone.is_set():
            # The caller stopped the soak during the grace: its stop, not a leftover failure.
            stop = self._tree_stop
            await stop.kill_leftovers(
                sink,
                spawner,
                f"post_shutdown_grace_seconds={cfg.post_shutdown_grace_seconds:g}",
                lambda: not stop.caller_stop.is_set(),
            )
        if rc == 0 and not progress_seen and missing_dir is None:
            message = (
                f"the command exited cleanly without any progress in {cfg.progress_dir} "
                "(it exists, and nothing in it changed)"
            )
            await sink.emit(events.WarningEvent(t=sink.elapsed(), message=message))

    async def _exit_failure(
        self, sink: EventSink, spawner: Spawner, rc: int
    ) -> tuple[FailureReason, str] | None:
        """The failure the exit status ``rc`` is: a signal the monitor did not send, or a code."""
        ended = exits.decode(rc)
        if ended.signal is not None and ended.signal not in spawner.signals_to_leader:
            message = f"the command was killed by {spawner.exit_signal}"
            if ended.signal in spawner.signals_forwarded:
                # Passed on, not the monitor's stop: the command dying of it is its failure.
                message += (
                    f", forwarded by the monitor (it received {spawner.exit_signal} and "
                    "passed it on; the command did not survive it)"
                )
            if ended.maybe_oom:
                kills = await self.report_oom_kills(sink, command_pid=spawner.pid)
                if spawner.pid in kills:
                    message = self._oom_message(kills[spawner.pid], spawner.exit_signal)
            return (FailureReason.SIGNALED, message)
        if rc > 0:
            return (FailureReason.NONZERO_EXIT, f"the command exited with status {rc}")
        return None

    async def crash_cause(self, sink: EventSink) -> str | None:
        """Lift the cause of a crash from the end of the log into ``exit.exception``."""
        rank_crash, cause = None, None
        with contextlib.suppress(BlockingCallTimeout):
            rank_crash, cause = await run_blocking(
                _read_crash, self.cfg.log_path, timeout=5.0, what="reading the log's tail"
            )
        if cause is None:
            return None
        await sink.emit(
            events.CrashCause(
                t=sink.elapsed(),
                type=self._masker(cause.type),
                message=self._masker(cause.message),
                where=cause.where,
                exception_kind=cause.kind,
                rank=None if rank_crash is None else rank_crash.rank,
                rank_pid=None if rank_crash is None else rank_crash.pid,
            )
        )
        if rank_crash is not None:
            return self._masker(exits.describe_rank_crash(rank_crash))
        return self._masker(exits.describe_crash(cause))

    async def report_oom_kills(
        self, sink: EventSink, *, command_pid: int | None = None
    ) -> dict[int, events.OomKill]:
        """Report each OOM kill of the tree once; returns every kill reported so far, by pid.

        Two witnesses: the kernel log's records, and the rise of the tree's memory cgroup's
        ``oom_kill`` counter (nameless).  A rise no record accounts for is the kill of
        ``command_pid`` (a command SIGKILLed by no one), else, at the end, a warning.
        """
        cgroup = self.memory_cgroup
        seen = self._tree_stop.seen_pids | self._state.seen_pids
        since = self._boot_seconds_at_start - KMSG_SLACK_SECONDS

        def read_both() -> tuple[list[dict[str, Any]] | None, int | None]:
            counted = None if cgroup is None else cgroup.read_oom_kills()
            return oom_kills(seen, since_boot_seconds=since), counted

        found, now = None, None
        with contextlib.suppress(BlockingCallTimeout):
            found, now = await run_blocking(
                read_both,
                timeout=5.0,
                what="reading the kernel's OOM records and the cgroup's OOM-kill counter",
                limiter=self._tree_stop.limiter,
            )
        counter = None
        if cgroup is not None and cgroup.oom_kills is not None and now is not None:
            counter = (cgroup.oom_kills, now)  # at the start, now
        unaccounted = 0 if counter is None else counter[1] - counter[0] - self._cgroup_kills_seen
        for kill in found or []:
            if kill["pid"] not in self._oom_reported:
                counted = unaccounted > 0  # the cgroup counted it: its limit, its OOM killer
                if counted:
                    unaccounted -= 1
                await self._report_oom(sink, kill, kernel_log=True, counted=counted)
        if unaccounted > 0 and command_pid is not None and command_pid not in self._oom_reported:
            assert cgroup is not None
            assert counter is not None
            name = Path(self.cfg.command[0]).name
            counter_file = "memory.events" if cgroup.version == 2 else "memory.oom_control"
            message = (
                f"the oom_kill counter of cgroup {cgroup.path} ({counter_file}) rose from "
                f"{counter[0]} to {counter[1]} as the command died of SIGKILL"
            )
            kill = {"pid": command_pid, "name": self._masker(name), "message": message}
            await self._report_oom(sink, kill, kernel_log=False, counted=True)
            unaccounted -= 1
        if unaccounted > 0 and command_pid is None:
            assert cgroup is not None
            assert counter is not None
            self._cgroup_kills_seen += unaccounted
            message = (
                f"the OOM killer ended {unaccounted} process(es) of the tree's cgroup "
                f"{cgroup.path} (its oom_kill counter rose from {counter[0]} to "
                f"{counter[1]}) that the kernel log does not name"
            )
            await sink.emit(events.WarningEvent(t=sink.elapsed(), message=message))
        return self._oom_reported

    async def _report_oom(
        self, sink: EventSink, kill: dict[str, Any], *, kernel_log: bool, counted: bool
    ) -> None:
        cgroup = self.memory_cgroup if counted else None
        if counted:
            self._cgroup_kills_seen += 1
        event = events.OomKill(
            t=sink.elapsed(),
            pid=kill["pid"],
            name=kill["name"],
            message=kill["message"],
            detected_by=("kernel_log",) * kernel_log + ("cgroup_counter",) * counted,
            cgroup_path=None if cgroup is None else cgroup.path,
            cgroup_memory_limit_bytes=None if cgroup is None else cgroup.hard_bytes,
        )
        self._oom_reported[event.pid] = event
        await sink.emit(event)

    def _oom_message(self, kill: events.OomKill, signal: str | None) -> str:
        """The ``signaled`` failure's words for a command the OOM killer ended."""
        if "cgroup_counter" not in kill.detected_by:
            return (
                f"the command was killed by {signal} from the kernel's OOM killer (out of memory)"
            )
        cgroup = self.memory_cgroup
        assert cgroup is not None
        if cgroup.hard is None:
            return (
                f"the command was killed by the OOM killer (counted by its cgroup {cgroup.path}, "
                f"under no memory limit: the machine ran out of memory), with {signal}"
            )
        limit = format_bytes(cgroup.hard.bytes)
        return (
            f"the command was killed by the cgroup's OOM killer (memory limit {limit} of cgroup "
            f"{cgroup.hard.path}), with {signal}"
        )


def _read_crash(log_path: Path) -> tuple[exits.RankCrash | None, exits.CrashInLog | None]:
    """The crash cause at the end of the log (blocking): a distributed run's is its first
    failed rank's, in its own words."""
    text = read_log_tail(log_path)
    rank_crash = exits.find_rank_exception(text)
    return rank_crash, exits.find_exception(text) if rank_crash is None else rank_crash.cause


def soak_status(
    error: Exception | None,
    cause: EndCause | None,
    failures: Sequence[FailureReason],
    *,
    caller_stopped: bool,
) -> SoakStatus:
    """The artifact's ``status`` from the end cause, the failures and the monitor's own error."""
    if error is not None:
        return SoakStatus.ERROR
    if cause in (StopCause.REQUESTED, StopCause.CANCELLED, StopCause.SCHEDULER, StopCause.REQUEUED):
        return SoakStatus.CANCELLED
    if FailureReason.MONITOR_ERROR in failures:
        return SoakStatus.ERROR  # the reaper was lost
    if caller_stopped and not failures:
        # The command had exited and its tree was in its grace when the caller stopped.
        return SoakStatus.CANCELLED
    return SoakStatus.FAILED if failures else SoakStatus.PASSED
