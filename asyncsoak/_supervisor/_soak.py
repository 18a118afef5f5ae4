"""``run_soak``: supervise one command and always leave an artifact that explains it
(docs/architecture.md, "The flow of a soak")."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
from anyio.abc import TaskGroup

from .._contract import (
    EXECUTOR,
    BlockingCallTimeout,
    EventSink,
    FailureReason,
    Masker,
    SoakClock,
    SoakFailureError,
    SoakStatus,
    StopCause,
    ValidationTypeError,
    abandoned_calls,
    argv_secrets,
    events,
    exits,
    host_cancelled,
    iso,
    open_event_queue,
    redact_mapping,
    run_blocking,
    secret_values,
)
from .._process import REAPER_CLOSE_TIMEOUT_SECONDS, Spawner, cgroups, prefetch_oom_records
from .._record import Observer, RunState, Serializer, read_log_tail, write_artifact
from .._sampling import ScanResult, latest_change_age, skipped_message
from . import _slurm
from ._config import SoakConfig
from ._control import SoakControl
from ._judge import RunJudge, gpu_fault_rule
from ._outputs import CHECK_TIMEOUT_SECONDS, SoakFiles, check_outputs
from ._producers import Producers, ProgressWatch, import_samplers
from ._stop import (
    HANG_REASONS,
    REAPER_LOST,
    EndCause,
    TreeStop,
    create_cgroup,
    leave_nothing_behind,
    spawn_request,
    start_command,
    stop_for_the_host,
)
from ._verdict import ExitJudge, soak_status

if TYPE_CHECKING:
    from .._contract import Artifact  # a type only: a run never imports the schema
    from .._export import Metrics

#: Threads for blocking work (scans, /proc walks, git): asyncsoak's own, never the host's.
THREADS = 4
#: Bound on waiting for the serializer to fold what is queued before the status is decided.
FOLD_WAIT_SECONDS = 2.0
#: Bound on each external call of the snapshot (git, nvidia-smi, another interpreter).
SNAPSHOT_CALL_TIMEOUT_SECONDS = 5.0
#: Bound on the runtime snapshot as a whole.
SNAPSHOT_TIMEOUT_SECONDS = 30.0
#: Bound on writing the last queued events to the journal.
DRAIN_TIMEOUT_SECONDS = 10.0
#: Bound on writing the artifact (and on reading the log's tail for it).
ARTIFACT_WRITE_TIMEOUT_SECONDS = 10.0

_T = TypeVar("_T")


async def run_configured(
    cfg: SoakConfig, control: SoakControl | None, metrics: Metrics | None
) -> Artifact:
    """``run_soak`` with its settings checked: the soak, beside its live metrics if asked."""
    if metrics is not None:  # the metrics' modules only for a soak that serves them
        from .._export import open_soak_metrics, validate_metrics

        metrics = validate_metrics(metrics)
    if control is not None and not isinstance(control, SoakControl):
        raise ValidationTypeError(f"control must be a SoakControl, not {type(control).__name__}")
    await run_blocking(
        check_outputs,
        cfg,
        timeout=CHECK_TIMEOUT_SECONDS,
        what="reading the files at the output paths",
    )
    soak = _Soak(cfg, control if control is not None else SoakControl())
    live = None
    if metrics is not None:
        # Bound before anything starts: a port in use is refused with nothing launched.
        live = await open_soak_metrics(metrics, soak.soak_id, soak.limiter, soak.control.state)
        soak.observers.append(live.soak.observe)
        soak.run_judge.trend_observers.append(live.soak.observe_trends)
    cancelled = True
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(soak.run)
            if live is not None:
                tg.start_soon(live.run)
            try:
                await soak.done.wait()
            except anyio.get_cancelled_exc_class():
                soak.end(StopCause.CANCELLED)
                raise
            cancelled = False
            if live is not None:
                await live.finish(linger=True)
                tg.cancel_scope.cancel()
    finally:
        if live is not None and cancelled:
            await live.finish(linger=False)
    return soak.outcome()


class _Soak:
    """The state of one soak; :meth:`run` is its whole life."""

    def __init__(self, cfg: SoakConfig, control: SoakControl) -> None:
        self.cfg = cfg
        self.control = control
        self.done = anyio.Event()
        self.cause: EndCause | None = None
        self._ended = anyio.Event()
        self.limiter = anyio.CapacityLimiter(THREADS)
        #: Shared with the soak's tree (``ASYNCSOAK_SOAK_ID``) and its metrics' ``soak_id``.
        self.soak_id = f"{os.getpid()}-{time.time_ns()}"
        #: Called with the JSON form of every event, after the journal and the artifact.
        self.observers: list[Observer] = list(control.observers)
        self._child_env = dict(os.environ if cfg.env is None else cfg.env)
        self._masker = Masker(
            secret_values(self._child_env, cfg.metadata) | argv_secrets(cfg.command)
        )
        self._failures: list[FailureReason] = []
        self._artifact: Artifact | None = None
        self._error: BaseException | None = None
        self._sink: EventSink | None = None
        self._spawner = Spawner()
        self._state = control.state = RunState()
        self._tree_stop = TreeStop(
            cfg, control, self._masker, self.soak_id, self.limiter, self._fail
        )
        self._exit_judge = ExitJudge(self._tree_stop, self._state)
        self._producers = Producers(self._tree_stop, self._state, host_ended=self._host_ended)
        self._job = _slurm.SoakJob(cfg, self.limiter)
        self.run_judge = RunJudge(cfg, self._state, ended=lambda: self.cause is not None)

    def end(self, cause: EndCause) -> None:
        """The first end cause wins; a caller's stop also cuts short the phase under way."""
        if self.cause is None:
            self.cause = cause
            self._ended.set()
        if cause in (StopCause.CANCELLED, StopCause.REQUESTED):
            self._tree_stop.caller_stopped()

    def kill_now(self) -> None:
        self.end(StopCause.REQUESTED)
        self._tree_stop.kill_now()

    async def _fail(self, reason: FailureReason, message: str) -> None:
        assert self._sink is not None
        self._failures.append(reason)
        at, t = iso(datetime.now(UTC)), self._sink.elapsed()
        await self._sink.emit(events.FailureEvent(t=t, reason=reason, message=message, at=at))

    def _host_ended(self) -> bool:
        """In an ``except CancelledError``: whether the host's loop ended (the soak's cause)."""
        if not host_cancelled():
            return False
        self.end(StopCause.CANCELLED)
        return True

    async def _despite_host(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()``, made once more if the host's loop ending cancelled it (that happens once)."""
        try:
            return await call()
        except asyncio.CancelledError:
            if not self._host_ended():
                raise
            return await call()

    async def run(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._run()
            except Exception as exc:
                self._error = exc
            finally:
                self.done.set()

    def outcome(self) -> Artifact:
        if self._error is not None:
            raise self._error
        artifact = self._artifact
        assert artifact is not None
        if artifact["status"] in (SoakStatus.FAILED, SoakStatus.ERROR):
            # The error carries the artifact as the plain dict it is at run time.
            raise SoakFailureError(cast("dict[str, Any]", artifact), self.cfg.output_path)
        return artifact

    async def _run(self) -> None:
        files = SoakFiles.open(self.cfg)
        spawner = self.control._take_reaper()
        if spawner is not None and spawner.stop_mode != self.cfg.stop_mode:
            await spawner.close(REAPER_CLOSE_TIMEOUT_SECONDS)  # launched for another stop mode
            spawner = None
        self._spawner = spawner = spawner or self._spawner
        try:
            if spawner.stop_mode is None:
                with contextlib.suppress(OSError):  # tried again, and told, at the start
                    await spawner.launch(self.cfg.stop_mode)
            await self._record(files)
        finally:
            # Closed after the command's start at the latest; here if it never started.
            await spawner.close(REAPER_CLOSE_TIMEOUT_SECONDS)
            files.close()

    async def _record(self, files: SoakFiles) -> None:
        """The soak, its events drained into the journal and the state; then the artifact."""
        cfg, judge = self.cfg, self.run_judge
        cpu_start, abandoned_at_start = time.process_time(), abandoned_calls()
        ignore = self._producers.own_files(files)
        baseline, baseline_error = await self._producers.scan_baseline(ignore)
        clock = SoakClock()
        started_at = datetime.now(UTC)
        sink, receive = open_event_queue(clock)
        self._sink = sink
        serializer = Serializer(
            files.take_journal(),
            self._state,
            self.observers,
            journal_path=cfg.journal_path,
            flush_interval=cfg.sample_interval_seconds,
            own_files=ignore,
            lock_fds=files.segment_locks,
            rules=[
                judge.budget_rule,
                gpu_fault_rule,
                judge.broken_rule,
                judge.overdue_rule,
                judge.trend_rule,
            ],
        )
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with sink:
                try:
                    await sink.emit(self._header(clock, started_at))
                    if baseline_error is not None:
                        await sink.emit(
                            events.WarningEvent(t=sink.elapsed(), message=baseline_error)
                        )
                    # The snapshot runs beside: a hung nvidia-smi must not delay the start.
                    snapshot_scope, snapshot_done = anyio.CancelScope(), anyio.Event()
                    tg.start_soon(self._snapshot, sink.clone(), snapshot_scope, snapshot_done)
                    try:
                        await self._supervise(sink, files.log_fd, baseline, ignore)
                    except Exception as exc:
                        error = _unwrap(exc)
                        message = f"{type(error).__name__}: {error}"
                        await self._fail(FailureReason.MONITOR_ERROR, message)
                    with anyio.move_on_after(SNAPSHOT_TIMEOUT_SECONDS):
                        await snapshot_done.wait()
                    snapshot_scope.cancel()
                except asyncio.CancelledError:
                    if not self._host_ended():
                        raise
                with anyio.move_on_after(FOLD_WAIT_SECONDS):
                    # The status counts the failures the rules found in what is queued.
                    await self._despite_host(partial(serializer.folded, sink))
                status = soak_status(
                    error,
                    self.cause,
                    [*self._failures, *(f["reason"] for f in self._state.failures)],
                    caller_stopped=self._tree_stop.caller_stop.is_set(),
                )
                await self._despite_host(
                    partial(sink.emit, events.Finished(t=sink.elapsed(), status=status))
                )
            # A journal on a hung filesystem must not hold the soak forever: the drain (and
            # the journal's shielded close) get a deadline; the artifact is built regardless.
            deadline = anyio.current_time() + DRAIN_TIMEOUT_SECONDS
            tg.cancel_scope.deadline = serializer.close_deadline = deadline
            await self._despite_host(serializer.drained.wait)
        if tg.cancel_scope.cancelled_caught and not serializer.journal_error:
            serializer.journal_error = (
                f"the journal did not drain within {DRAIN_TIMEOUT_SECONDS:g}s"
            )
        counters = sink.counters
        monitor = {
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
            "reaper_pid": self._spawner.reaper_pid,
            "pid": os.getpid(),
            # Blocking calls given up at their deadline (a hung disk, a wedged process).
            "abandoned_calls": abandoned_calls() - abandoned_at_start,
        }
        build = partial(self._build_artifact, status, clock.elapsed(), monitor)
        self._artifact = artifact = await self._despite_host(build)
        await self._despite_host(partial(_write_artifact, artifact, cfg))
        if error is not None:
            raise error

    async def _build_artifact(
        self, status: SoakStatus, ended_t: float, monitor: dict[str, Any]
    ) -> Artifact:
        """The artifact ending now, with the log's tail (empty when the bounded read fails)."""
        log_tail = ""
        with contextlib.suppress(BlockingCallTimeout):
            log_tail = await run_blocking(
                read_log_tail,
                self.cfg.log_path,
                timeout=ARTIFACT_WRITE_TIMEOUT_SECONDS,
                what="reading the log's tail",
            )
        return self._state.build_typed(
            status=status, ended_t=ended_t, log_tail=self._masker(log_tail), monitor=monitor
        )

    async def _snapshot(self, sink: EventSink, scope: anyio.CancelScope, done: anyio.Event) -> None:
        """The runtime snapshot in a thread, after the scheduler's job's facts (the stop needs
        them), sent as an event (bounded)."""
        data: dict[str, Any] = {"error": f"snapshot took longer than {SNAPSHOT_TIMEOUT_SECONDS:g}s"}
        # The host's cancel (its loop ending) is taken back: this task's end would cancel the
        # serializer beside it, which still has the soak's end to write.
        ended = False
        cfg, job = self.cfg, self._job
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
                                env=self._child_env,
                                nvidia_smi=cfg.nvidia_smi or "nvidia-smi",
                                timeout=SNAPSHOT_CALL_TIMEOUT_SECONDS,
                            ),
                            timeout=SNAPSHOT_TIMEOUT_SECONDS,
                            what="the runtime snapshot",
                            limiter=self.limiter,
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

    def _header(self, clock: SoakClock, started_at: datetime) -> events.Header:
        cfg = self.cfg
        return events.Header(
            t=clock.elapsed(),
            command=self._masker.argv(cfg.command),
            cwd=str(cfg.cwd or Path.cwd()),
            config=cfg.effective(),
            metadata=redact_mapping(cfg.metadata),
            started_at=iso(started_at),
            journal_path=str(cfg.journal_path),
            log_path=str(cfg.log_path),
            output_path=str(cfg.output_path),
            monitor_pid=os.getpid(),
            monotonic_start=clock.start,
        )

    async def _supervise(
        self, sink: EventSink, log_fd: int, baseline: ScanResult, ignore: set[tuple[int, int]]
    ) -> None:
        """Start the command, produce events until the first end cause, stop, clean up."""
        if self.cause is not None:
            await sink.emit(
                events.WarningEvent(t=sink.elapsed(), message=f"{self.cause} before start")
            )
            return
        if baseline.errors:
            message = skipped_message(self.cfg.progress_dir, baseline)
            await sink.emit(events.WarningEvent(t=sink.elapsed(), message=message))
        steps = self._producers.step_reader(baseline)
        spawner = self._spawner
        cgroup: cgroups.TreeCgroup | None = None
        started = False
        try:
            cgroup = await create_cgroup(self.soak_id)
            request = spawn_request(self.cfg, self._child_env, self.soak_id, log_fd, steps, cgroup)
            started = True
            prefetch_oom_records()
            EXECUTOR.submit(_while_the_command_starts)
            if not await start_command(sink, spawner, request, cgroup, self._fail):
                return
            assert spawner.pid is not None
            self.control._set_started(spawner.pid)
            self._tree_stop.seen_pids.add(spawner.pid)
            watch = self._producers.watch(baseline, steps, ignore)
            self.control.progress_age = partial(
                latest_change_age, watch.tracker, self.cfg.progress_dir, ignore
            )
            async with anyio.create_task_group() as producers:
                await self._start_tasks(producers, sink, spawner, watch)
                await self._ended.wait()
                await self._stop_after_end(sink, spawner, watch)
                producers.cancel_scope.cancel()
            self._failures += await self.run_judge.judge_final(sink)
        except asyncio.CancelledError:
            if not self._host_ended():
                raise
            if started:
                if spawner.pid is None and spawner.starting:
                    # The command was starting: its start is taken in first.
                    await spawner.take_first_report(sink, REAPER_CLOSE_TIMEOUT_SECONDS)
                await stop_for_the_host(sink, spawner, self._tree_stop, self._job.facts)
        finally:
            with anyio.CancelScope(shield=True):
                await leave_nothing_behind(spawner if started else None, cgroup, self._tree_stop)

    async def _start_tasks(
        self, producers: TaskGroup, sink: EventSink, spawner: Spawner, watch: ProgressWatch
    ) -> None:
        """The producers and the limits they are judged against; the tasks that end the soak."""
        assert spawner.pid is not None
        self._producers.start(producers, sink, spawner, watch)
        self._exit_judge.memory_cgroup = await self.run_judge.emit_limits(sink, spawner.pid)
        control = self.control
        for event, then in (
            (spawner.exited, partial(self.end, StopCause.EXITED)),
            (spawner.reaper_lost, partial(self.end, REAPER_LOST)),
            (control.stop_requested, lambda: self.end(control.cause)),
            (control.kill_requested, self.kill_now),
        ):
            producers.start_soon(_after, event, then)
        producers.start_soon(self._end_on_failure)
        producers.start_soon(self._forensics_on_stall, sink, spawner)
        self._job.start_tasks(producers, sink, spawner, self.end)
        if self.cfg.max_duration_seconds is not None:
            producers.start_soon(self._end_after_max_duration, sink)

    async def _stop_after_end(
        self, sink: EventSink, spawner: Spawner, watch: ProgressWatch
    ) -> None:
        """Judge the exit or run the stop sequence; then a requeue, OOM kills, GPUs' release."""
        if self.cause == StopCause.EXITED and self.control.stop_requested.is_set():
            # The stop request and the exit crossed (a scheduler that signals every
            # process of the job: the trainer saved and exited on the same SIGTERM).
            self.cause = self.control.cause
        cause, tracker = self.cause, watch.tracker
        if cause == StopCause.EXITED:
            await self._producers.last_scan(sink, watch)
            steps = tracker.steps
            seen = tracker.first_change is not None or (
                steps is not None and steps.step is not None
            )
            await self._exit_judge.after_exit(
                sink, spawner, cause, progress_seen=seen, missing_dir=tracker.missing_dir
            )
        elif cause == REAPER_LOST:
            await self._tree_stop.after_reaper_lost(sink, spawner)
        else:
            assert isinstance(cause, StopCause)
            first = self._failures[0] if self._failures else None
            await self._tree_stop.stop(
                sink, spawner, cause, first_failure=first, scheduler=self._job.facts
            )
        if self.cause == StopCause.REQUEUED:
            await self._job.requeue(sink)
        await self._exit_judge.report_oom_kills(sink)
        if self.cause == StopCause.EXITED and spawner.tree_gone.is_set():
            # A run that ended by itself; a stop (a scheduler's) has no time to spare.
            await self.run_judge.check_gpus_released(sink)

    async def _end_on_failure(self) -> None:
        """The run's state has folded a failure (a rule's): the run ends."""
        failure = await self._state.wait_failed()
        if not self._failures:
            self._failures.append(failure["reason"])
        self.end(StopCause.FAILURE)

    async def _forensics_on_stall(self, sink: EventSink, spawner: Spawner) -> None:
        """A stall's forensics, taken before the tree is told (the cause claimed first, so an
        exit meanwhile does not take it); the rules make the failure once folded."""
        broken = await self._state.wait_for(lambda: self._state.broken_rule)
        reason = FailureReason(broken["reason"])
        if self.cause is not None or reason not in HANG_REASONS or not self.cfg.forensics:
            return
        self.cause = StopCause.FAILURE
        try:
            await self._tree_stop.hang_forensics(sink, spawner, reason)
            with anyio.move_on_after(FOLD_WAIT_SECONDS):
                await self._state.wait_failed(reason)
        finally:
            self._failures.append(reason)
            self._ended.set()

    async def _end_after_max_duration(self, sink: EventSink) -> None:
        assert self.cfg.max_duration_seconds is not None
        await anyio.sleep(max(0.0, self.cfg.max_duration_seconds - sink.elapsed()))
        self.end(StopCause.MAX_DURATION)


async def _write_artifact(artifact: Artifact, cfg: SoakConfig) -> None:
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


def _collect_snapshot(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The snapshot, its module imported here in the thread: never on the host's loop."""
    from .._sampling import collect_snapshot

    return collect_snapshot(*args, **kwargs)


def _while_the_command_starts() -> None:
    """Made ready in a thread while the command starts (the monitor only waits): the samplers'
    modules and the exits' modules. Not waited for: a failure only leaves the work to its use."""
    import_samplers()
    exits.decode, exits.verdict_exit_code  # noqa: B018 (their modules' import is the point)


async def _after(event: anyio.Event, then: Callable[[], None]) -> None:
    await event.wait()
    then()


def _unwrap(exc: Exception) -> Exception:
    """The one exception inside nested single-member groups (a task group's wrapping)."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
