"""``run_soak``: supervise one command and always leave an artifact that explains it.

Shape (DESIGN.md, "The shape"): one task group per soak.  The spawner, samplers and watchdog
are producers, each holding a clone of one bounded event queue; the serializer drains it into
the journal and the artifact builder.  The supervisor waits for the first end cause (the command
exits, a rule fires, ``max_duration_seconds`` passes, the caller asks to stop, the caller
cancels), runs the stop sequence, then closes the producers so the serializer's drain ends.

The whole soak runs inside a shielded cancel scope: a caller's cancellation is turned into a
stop with cause ``cancelled``, so the tree is stopped and the artifact written (every step of
that is bounded) before the cancellation propagates.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal, ParamSpec, cast

import anyio
from anyio.abc import TaskGroup

from .._contract import (
    Artifact,
    BlockingCallTimeout,
    EventSink,
    FailureEvent,
    FailureReason,
    Finished,
    Header,
    Masker,
    Rides,
    SoakClock,
    SoakFailureError,
    SoakStatus,
    StopCause,
    TickSignal,
    ValidationTypeError,
    WarningEvent,
    abandoned_calls,
    argv_secrets,
    iso,
    open_event_queue,
    redact_mapping,
    require_asyncio,
    run_blocking,
    secret_values,
)
from .._export import Metrics, validate_metrics
from .._process import Spawner, SpawnRequest, cgroups
from .._record import (
    ArtifactBuilder,
    Observer,
    Serializer,
    create_private_file,
    remove_closed_segments,
)
from .._sampling import (
    KeyChoice,
    LossCheck,
    ProgressSource,
    ProgressTracker,
    ScanResult,
    StaleLimit,
    StepReader,
    StepTracker,
    final_scan,
    latest_change_age,
    run_gpu_sampler,
    run_proc_sampler,
    run_watchdog,
    scan_progress_dir,
    skipped_message,
)
from ..trainer import STEPS_FILE_VARIABLE
from . import _slurm
from ._config import LOG_MAX_BYTES, LeakCheck, SoakConfig, StopMode
from ._control import SoakControl
from ._finish import (
    bound_drain,
    build_artifact,
    monitor_section,
    note_drain,
    write_soak_artifact,
)
from ._judge import RunJudge
from ._outputs import CHECK_TIMEOUT_SECONDS, check_outputs, lock_journal
from ._snapshot_task import SNAPSHOT_TIMEOUT_SECONDS, take_snapshot
from ._stop import (
    HANG_REASONS,
    REAPER_LOST,
    SOAK_ID_VARIABLE,
    TREE_LOOK_TIMEOUT_SECONDS,
    TREE_WALK_TIMEOUT_SECONDS,
    EndCause,
    TreeStop,
)
from ._verdict import ExitJudge, soak_status

#: Threads for blocking work (scans, /proc walks, git): asyncsoak's own, never the host's.
THREADS = 4
#: Bound on the scan of the progress dir once the command has exited.
FINAL_SCAN_TIMEOUT_SECONDS = 10.0
#: Bound on the scan of the progress dir taken before the start (its baseline).
BASELINE_TIMEOUT_SECONDS = 60.0
#: Bound on waiting for the reaper to finish once the tree is gone.
REAPER_CLOSE_TIMEOUT_SECONDS = 5.0
#: Give each soak's tree a cgroup where the kernel allows it (membership, not markers).
USE_CGROUP = True


_P = ParamSpec("_P")

#: The settings ``run_soak`` needs when no ``config`` is given.
_REQUIRED_SETTINGS = ("command", "progress_dir", "output_path")
#: ``run_soak``'s arguments that are not settings: they go with either form of the settings.
_NOT_SETTINGS = frozenset({"config", "control", "metrics"})


def _settings_as_config(
    soak: Callable[_P, Coroutine[Any, Any, Artifact]],
) -> Callable[_P, Coroutine[Any, Any, Artifact]]:
    """``run_soak`` takes its settings as keywords or as one :class:`SoakConfig`, never both.

    Only the keywords the caller wrote tell which (one given at its default value is given
    all the same), so this looks at them before the defaults fill in; the keywords become the
    ``config`` (checked by :class:`SoakConfig`, with its messages), so the wrapped function
    receives ``config``, ``control`` and ``metrics`` alone.
    """
    signature = inspect.signature(soak)
    # Called with exactly the three arguments it declares besides the settings.
    configured = cast("Callable[..., Coroutine[Any, Any, Artifact]]", soak)

    @functools.wraps(soak)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> Artifact:
        # An unknown keyword or a positional argument: Python's own TypeError.
        given = signature.bind(*args, **kwargs).arguments
        require_asyncio("run_soak")
        settings = {name: value for name, value in given.items() if name not in _NOT_SETTINGS}
        config = given.get("config")
        if config is None:
            missing = [name for name in _REQUIRED_SETTINGS if name not in settings]
            if missing:
                raise ValidationTypeError(
                    f"run_soak() needs {', '.join(missing)} (or config=SoakConfig(...))"
                )
            config = SoakConfig(**settings)
        elif settings:
            raise ValidationTypeError(
                "run_soak() takes its settings as keywords or as config, not both: "
                f"config was given with {', '.join(settings)}"
            )
        elif not isinstance(config, SoakConfig):
            raise ValidationTypeError(f"config must be a SoakConfig, not {type(config).__name__}")
        return await configured(
            config=config, control=given.get("control"), metrics=given.get("metrics")
        )

    return call


@_settings_as_config
async def run_soak(
    *,
    config: SoakConfig | None = None,
    command: Sequence[str] | None = None,
    progress_dir: Path | str | None = None,
    output_path: Path | str | None = None,
    sample_interval_seconds: float = 5.0,
    startup_timeout_seconds: float = 600.0,
    stale_progress_seconds: float | Literal["auto"] = 120.0,
    post_shutdown_grace_seconds: float = 5.0,
    min_duration_seconds: float = 0.0,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_duration_seconds: float | None = None,
    stop_mode: StopMode = "group",
    output_is_progress: bool = False,
    control: SoakControl | None = None,
    log_path: Path | str | None = None,
    snapshot_root: Path | str | None = None,
    nvidia_smi: str | None = "nvidia-smi",
    kill_wait_seconds: float = 5.0,
    log_max_bytes: int = LOG_MAX_BYTES,
    dump_signal: int | str | None = None,
    forensics: bool = True,
    detailed_memory: bool = False,
    metrics: Metrics | None = None,
    forward_signals: Sequence[int | str] = (),
    requeue_on: int | str | None = None,
    warm_up_seconds: float | None = None,
    leak_check: LeakCheck = "warn",
    max_rss_bytes: int | str | None = None,
    max_gpu_memory_bytes: int | str | None = None,
    min_disk_free_bytes: int | str | None = None,
    progress_exclude: Sequence[Path | str] = (),
    progress_source: ProgressSource = "auto",
    step_key: str | None = None,
    loss_key: str | None = None,
    loss_check: LossCheck = "fail",
    stale_progress_carried_seconds: float | None = None,
    scheduler_grace_seconds: float | None = None,
) -> Artifact:
    """Run a command in its own process group and produce a soak artifact.

    ``progress_dir`` is an owner-controlled training log directory.  File growth is used as a
    backend-independent liveness signal; once progress is first observed, no file change for
    ``stale_progress_seconds`` fails the soak rather than allowing a deadlocked worker to run
    forever.

    When a run stalls (``stale_progress``, ``startup_timeout``), what every process was doing is
    recorded in the artifact's ``forensics`` section before the first signal (``forensics=False``
    skips it); ``dump_signal`` (say ``"SIGUSR1"`` for a trainer that registered ``faulthandler``)
    is sent to the command first, so what it prints lands in the log.

    Nothing in the directories of ``progress_exclude`` (below ``progress_dir``, existing at the
    start) counts as progress: the job queue excludes the run directory's ``attempts/``, where
    other attempts' monitors write.

    Training steps are progress when the trainer writes them (``progress_source="auto"``,
    the default: JSON Lines metrics, ``trainer_state.json``, Lightning's ``metrics.csv``, or
    :func:`asyncsoak.trainer.report`; ``step_key``/``loss_key`` name the keys when the
    detection cannot): then a step that does not advance for ``stale_progress_seconds`` is a
    stall however the files grow, and a NaN or infinite loss fails the soak
    (``loss_check="fail"``; ``"warn"``, ``"off"``).  ``stale_progress_seconds="auto"`` learns
    the limit from the run's own gaps (see docs/progress.md);
    ``stale_progress_carried_seconds`` is the limit earlier runs of the same job learned.

    ``metrics`` (an :class:`asyncsoak.Metrics`) exposes the soak's live metrics to Prometheus:
    an HTTP endpoint, a node_exporter textfile, or a ``prometheus_client`` registry.

    ``forward_signals`` (say ``["SIGUSR1"]``, SLURM's early warning) are passed on to the
    command when the monitor receives them; ``requeue_on`` is forwarded too, and then the soak
    waits for the command's exit and requeues its SLURM job (``stop.cause: "requeued"``).
    Both install signal handlers: the soak must run in the main thread.

    ``scheduler_grace_seconds`` is the time between the scheduler's SIGTERM and its SIGKILL
    (a pod's ``terminationGracePeriodSeconds``, SLURM's ``KillWait``) when the caller knows
    it; by default it is asked of SLURM, read from the downward API in a pod, or assumed
    (30 s).  A stop by the scheduler keeps the trainer's grace under it, so the artifact is
    written before the SIGKILL.

    The settings come as these keywords or as one checked :class:`SoakConfig` (``config=``,
    whose fields are these keywords), not both: ``control`` and ``metrics`` go with either.

    Returns the artifact (an :class:`asyncsoak.artifact.Artifact`, also written to
    ``output_path``) when the soak passed or was stopped through ``control``
    (``status: "cancelled"``).  Raises :class:`SoakFailureError` when a rule fired, after
    writing the artifact.  On cancellation by the caller, the tree is stopped and a
    ``cancelled`` artifact written before the cancellation propagates.
    """
    # The settings arrive as ``config`` alone: the keywords were made into it
    # (see _settings_as_config), which refused a call that gave both.
    assert config is not None
    return await _run_configured(config, control, metrics)


async def _run_configured(
    cfg: SoakConfig, control: SoakControl | None, metrics: Metrics | None
) -> Artifact:
    """``run_soak`` with its settings checked: the soak, beside its live metrics if asked."""
    metrics_config = validate_metrics(metrics)
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
    if metrics_config is not None:
        from .._export import open_soak_metrics

        # Bound before anything starts: a port in use is refused with nothing launched.
        live = await open_soak_metrics(metrics_config, soak.soak_id, soak.limiter)
        soak.observers.append(live.soak.observe)
        soak.trend_observers.append(live.soak.observe_trends)
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


@dataclass
class _SoakFiles:
    """The soak's own open files, held until it ends: the journal's lock (a second soak over
    the same output is refused), the journal (until the serializer takes it), the log, and
    the locks on the journal's later segments."""

    lock_fd: int
    journal_fd: int
    log_fd: int
    segment_locks: list[int] = field(default_factory=list)

    @classmethod
    def open(cls, cfg: SoakConfig) -> _SoakFiles:
        cfg.output_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_journal(cfg.journal_path)
        try:
            journal_fd = create_private_file(cfg.journal_path)
            # An earlier soak's closed segments would read as the start of this journal.
            remove_closed_segments(cfg.journal_path)
            try:
                log_fd = create_private_file(cfg.log_path)
            except BaseException:
                os.close(journal_fd)
                raise
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(lock_fd=lock_fd, journal_fd=journal_fd, log_fd=log_fd)

    def take_journal(self) -> int:
        """The journal's descriptor, now the serializer's to write and close."""
        fd, self.journal_fd = self.journal_fd, -1
        return fd

    def close(self) -> None:
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
        os.close(self.log_fd)
        for fd in self.segment_locks:
            os.close(fd)
        os.close(self.lock_fd)


@dataclass
class _ProgressWatch:
    """How the progress dir is watched: during the run (the watchdog) and once more when the
    command has exited (the final scan)."""

    tracker: ProgressTracker
    #: The training steps' reader; None when only file changes count.
    steps: StepReader | None
    #: The soak's own files and the excluded directories, as (device, inode).
    ignore: set[tuple[int, int]]
    #: Watched by path besides the dir: the log, when its output counts as progress.
    also: list[Path]


class _Soak:
    """The state of one soak; :meth:`run` is its whole life."""

    def __init__(self, cfg: SoakConfig, control: SoakControl) -> None:
        self.cfg = cfg
        self.control = control
        self.done = anyio.Event()
        self.cause: EndCause | None = None
        self._ended = anyio.Event()
        self.limiter = self._limiter = anyio.CapacityLimiter(THREADS)
        #: Whether the tree gets a cgroup where the kernel allows one (tests turn it off to
        #: exercise the environment-marker fallback).
        self.use_cgroup = USE_CGROUP
        #: Shared with the soak's tree (``ASYNCSOAK_SOAK_ID``) and its metrics' ``soak_id``.
        self.soak_id = f"{os.getpid()}-{time.time_ns()}"
        #: Called with the JSON form of every event, after the journal and the artifact.
        self.observers: list[Observer] = list(control.observers)
        #: Blocking calls riding on the proc sampler's ticks (made with the serializer).
        self._rides = Rides()
        self._child_env = dict(os.environ if cfg.env is None else cfg.env)
        self._masker = Masker(
            secret_values(self._child_env, cfg.metadata) | argv_secrets(cfg.command)
        )
        self._failures: list[FailureReason] = []
        self._artifact: Artifact | None = None
        self._error: BaseException | None = None
        self._sink: EventSink | None = None
        self._spawner: Spawner | None = None
        self._progress_seen = False
        self._marker = self.soak_id
        self._tree_stop = TreeStop(
            cfg,
            control,
            masker=self._masker,
            marker=self._marker,
            limiter=self._limiter,
            fail=self._fail,
        )
        #: Every pid ever seen in the tree, to look up in the kernel's OOM records.
        self._seen_pids = self._tree_stop.seen_pids
        self._exit_judge = ExitJudge(
            cfg,
            masker=self._masker,
            limiter=self._limiter,
            tree_stop=self._tree_stop,
            fail=self._fail,
        )
        #: The tree as the proc sampler last saw it (for matching GPU processes).
        self._tree_now: frozenset[int] = frozenset()
        #: The scheduler's job the soak runs in, if any.
        self._job = _slurm.SoakJob(cfg, self._limiter)
        self._builder = ArtifactBuilder()
        self._run_judge = RunJudge(
            cfg,
            self._builder,
            rule_fired=self._rule_fired,
            fail=self._fail,
            ended=lambda: self.cause is not None,
            gpu_failed=self._gpu_failed,
            stall_fired=self._rule_fired,
        )
        #: Called with every evaluation of the trends (the artifact's ``trends`` shape).
        self.trend_observers = self._run_judge.trend_observers

    # -- end causes ----------------------------------------------------------------------

    def end(self, cause: EndCause) -> None:
        """The first end cause wins; a caller's stop also cuts short the phase under way."""
        if self.cause is None:
            self.cause = cause
            self._ended.set()
        if cause in (StopCause.CANCELLED, StopCause.REQUESTED):
            self._tree_stop.caller_stopped()

    def kill_now(self) -> None:
        """The caller wants the tree killed at once: every graceful wait ends now."""
        self.end(StopCause.REQUESTED)
        self._tree_stop.kill_now()

    async def _rule_fired(
        self, reason: FailureReason, message: str, activity: dict[str, Any] | None = None
    ) -> None:
        if self.cause is not None:
            return
        self.cause = StopCause.FAILURE
        if reason in HANG_REASONS and self._sink is not None and self._spawner is not None:
            # The stall is looked at before it is told: the rank the others wait for leads
            # the failure's message (the cause above claims the end, so an exit meanwhile
            # does not take it).
            culprit = await self._tree_stop.hang_forensics(self._sink, self._spawner, reason)
            if culprit is not None and culprit.get("text"):
                message = f"{culprit['text']}; {message}"
        await self._fail(reason, message, activity=activity)
        self._ended.set()

    async def _sampler_rule_fired(self, reason: str, message: str) -> None:
        """A rule of the samplers' (which speak plain words) fired: a failure of the soak."""
        await self._rule_fired(FailureReason(reason), message)

    async def _fail(
        self,
        reason: FailureReason,
        message: str,
        gpu: dict[str, Any] | None = None,
        *,
        activity: dict[str, Any] | None = None,
    ) -> None:
        assert self._sink is not None
        self._failures.append(reason)
        await self._sink.emit(
            FailureEvent(
                t=self._sink.elapsed(),
                reason=reason,
                message=message,
                at=iso(_now()),
                gpu=gpu,
                activity=activity,
            )
        )

    async def _gpu_failed(self, message: str, gpu: dict[str, Any]) -> None:
        """A GPU fault fails the run: it ends the run, or, when it is ending already (the
        trainer died of the fault before the kernel log was read), joins its failures."""
        if self.cause is None:
            self.cause = StopCause.FAILURE
            await self._fail(FailureReason.GPU_FAULT, message, gpu)
            self._ended.set()
        else:
            await self._fail(FailureReason.GPU_FAULT, message, gpu)

    # -- life ----------------------------------------------------------------------------

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
        files = _SoakFiles.open(self.cfg)
        try:
            await self._record(files)
        finally:
            files.close()

    async def _record(self, files: _SoakFiles) -> None:
        """The soak between its files: the serializer drains the event stream into the
        journal and the artifact's builder while the soak runs; then the artifact is written."""
        cfg = self.cfg
        cpu_start = time.process_time()
        abandoned_at_start = abandoned_calls()
        ignore = self._own_files(files)
        baseline, baseline_error = await self._scan_baseline(ignore)
        clock = SoakClock()
        started_at = _now()
        sink, receive = open_event_queue(clock)
        self._sink = sink
        # The watchdog's scans and the journal's batched writes ride on the proc sampler's
        # thread, at its ticks (one thread wake-up per sample for all of them).
        serializer = Serializer(
            files.take_journal(),
            self._builder,
            [*self.observers, self._run_judge.note_fold],
            journal_path=cfg.journal_path,
            flush_interval=cfg.sample_interval_seconds,
            own_files=ignore,
            lock_fds=files.segment_locks,
            rides=self._rides,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(serializer.run, receive)
            async with sink:
                await sink.emit(self._header(clock, started_at))
                if baseline_error is not None:
                    await sink.emit(WarningEvent(t=sink.elapsed(), message=baseline_error))
                error = await self._supervise_beside_snapshot(
                    tg, sink, files.log_fd, baseline, ignore
                )
                status = soak_status(
                    error,
                    self.cause,
                    self._failures,
                    caller_stopped=self._tree_stop.caller_stop.is_set(),
                )
                await sink.emit(Finished(t=sink.elapsed(), status=status))
            # The last events are queued; a journal on a hung filesystem must not hold the
            # soak forever: the drain gets a deadline, and the artifact is built regardless.
            bound_drain(tg.cancel_scope, serializer)
        note_drain(tg.cancel_scope, serializer)
        monitor = monitor_section(
            serializer,
            sink.counters,
            cpu_start=cpu_start,
            abandoned_at_start=abandoned_at_start,
            reaper_pid=self._spawner.reaper_pid if self._spawner else None,
        )
        artifact = await build_artifact(
            self._builder, cfg, self._masker, status=status, clock=clock, monitor=monitor
        )
        self._artifact = artifact
        await write_soak_artifact(artifact, cfg)
        if error is not None:
            raise error

    def _own_files(self, files: _SoakFiles) -> set[tuple[int, int]]:
        """What the progress scans skip, as (device, inode): the journal, the log unless its
        output is progress, and the excluded directories (skipped whole)."""
        ignore = {_file_key(files.journal_fd)}
        if not self.cfg.output_is_progress:
            ignore.add(_file_key(files.log_fd))
        return ignore | _dir_keys(self.cfg.progress_exclude)

    def _also_watched(self) -> list[Path]:
        """Watched by path besides the progress dir: the log may live outside it."""
        return [self.cfg.log_path] if self.cfg.output_is_progress else []

    async def _scan_baseline(self, ignore: set[tuple[int, int]]) -> tuple[ScanResult, str | None]:
        """The progress dir before the start, and why it is empty when the scan timed out."""
        cfg = self.cfg
        with self._tree_stop.given_up_on_caller_stop():
            try:
                baseline = await run_blocking(
                    partial(scan_progress_dir, cfg.progress_dir, ignore, self._also_watched()),
                    timeout=BASELINE_TIMEOUT_SECONDS,
                    what=f"the first scan of {cfg.progress_dir}",
                    limiter=self._limiter,
                )
            except BlockingCallTimeout as exc:
                # Every file will then count as new: the watchdog's own scans, bounded
                # too, decide whether the run makes progress.
                return ScanResult(files={}), str(exc)
            else:
                return baseline, None
        return ScanResult(files={}), None  # the caller stopped the soak during the scan

    async def _supervise_beside_snapshot(
        self,
        tg: TaskGroup,
        sink: EventSink,
        log_fd: int,
        baseline: ScanResult,
        ignore: set[tuple[int, int]],
    ) -> Exception | None:
        """Supervise the command while the runtime snapshot is taken beside it (a hung
        nvidia-smi or a slow git must not delay the trainer's start); the monitor's own
        error, if it broke, recorded as its failure."""
        snapshot_scope = anyio.CancelScope()
        snapshot_done = anyio.Event()
        tg.start_soon(
            partial(
                take_snapshot,
                sink.clone(),
                snapshot_scope,
                snapshot_done,
                cfg=self.cfg,
                env=self._child_env,
                job=self._job,
                limiter=self._limiter,
            )
        )
        error: Exception | None = None
        try:
            await self._supervise(sink, log_fd, baseline, ignore)
        except Exception as exc:
            error = _unwrap(exc)
            await self._fail(FailureReason.MONITOR_ERROR, f"{type(error).__name__}: {error}")
        with anyio.move_on_after(SNAPSHOT_TIMEOUT_SECONDS):
            await snapshot_done.wait()
        snapshot_scope.cancel()
        return error

    def _header(self, clock: SoakClock, started_at: datetime) -> Header:
        cfg = self.cfg
        return Header(
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

    # -- the supervision: start, watch until the first end cause, stop --------------------

    async def _supervise(
        self,
        sink: EventSink,
        log_fd: int,
        baseline: ScanResult,
        ignore: set[tuple[int, int]],
    ) -> None:
        """Start the command; the producers feed the event stream until the first end cause;
        then the stop sequence, and whatever the supervisor broke is still cleaned up."""
        if self.cause is not None:
            # Cancelled or asked to stop before the command started: nothing to start.
            await sink.emit(WarningEvent(t=sink.elapsed(), message=f"{self.cause} before start"))
            return
        if baseline.errors:
            message = skipped_message(self.cfg.progress_dir, baseline)
            await sink.emit(WarningEvent(t=sink.elapsed(), message=message))
        steps = self._step_reader(baseline)
        cgroup = await self._create_cgroup()
        spawner = self._spawner = Spawner(self._spawn_request(log_fd, steps, cgroup))
        try:
            if not await self._start_command(sink, spawner, cgroup):
                return
            watch = _ProgressWatch(
                tracker=self._progress_tracker(baseline, steps),
                steps=steps,
                ignore=ignore,
                also=self._also_watched(),
            )
            self.control.progress_age = partial(
                latest_change_age, watch.tracker, self.cfg.progress_dir, ignore
            )
            async with anyio.create_task_group() as producers:
                await self._start_producers(producers, sink, spawner, watch)
                await self._ended.wait()
                await self._stop_after_end(sink, spawner, watch)
                producers.cancel_scope.cancel()
            await self._run_judge.judge_trends(sink, final=True)
        finally:
            with anyio.CancelScope(shield=True):
                await self._leave_nothing_behind(spawner, cgroup)

    def _step_reader(self, baseline: ScanResult) -> StepReader | None:
        """The training steps' reader, unless only file changes count as progress."""
        cfg = self.cfg
        if cfg.progress_source == "files":
            return None
        # A file an earlier soak over the same output left (check_outputs made sure).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cfg.steps_path)
        return StepReader(
            cfg.progress_dir,
            keys=KeyChoice(cfg.step_key, cfg.loss_key),
            report_file=cfg.steps_path,
            baseline={name: state.size for name, state in baseline.files.items()},
        )

    async def _create_cgroup(self) -> cgroups.TreeCgroup | None:
        """The tree's own cgroup where the kernel allows one (bounded: None past the bound)."""
        if not self.use_cgroup:
            return None
        with contextlib.suppress(BlockingCallTimeout):
            return await run_blocking(
                cgroups.create,
                f"asyncsoak-{self.soak_id}",
                timeout=TREE_LOOK_TIMEOUT_SECONDS,
                what="creating the tree's cgroup",
            )
        return None

    def _spawn_request(
        self, log_fd: int, steps: StepReader | None, cgroup: cgroups.TreeCgroup | None
    ) -> SpawnRequest:
        cfg = self.cfg
        child_env = dict(self._child_env)
        child_env[SOAK_ID_VARIABLE] = self._marker
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

    async def _start_command(
        self, sink: EventSink, spawner: Spawner, cgroup: cgroups.TreeCgroup | None
    ) -> bool:
        """Start the command; False (its failure recorded) when it could not be started."""
        started = await spawner.start(sink)
        if started and cgroup is not None and spawner.pid is not None:
            # Membership decides only if the command really joined the group.
            with contextlib.suppress(BlockingCallTimeout):
                if await run_blocking(
                    cgroup.holds,
                    spawner.pid,
                    timeout=TREE_LOOK_TIMEOUT_SECONDS,
                    what="a cgroup",
                ):
                    spawner.cgroup = cgroup
        if not started:
            await self._fail(
                FailureReason.SPAWN_FAILED,
                f"could not start {self.cfg.command[0]!r}: {spawner.spawn_error}",
            )
            return False
        assert spawner.pid is not None
        self.control._set_started(spawner.pid)
        self._seen_pids.add(spawner.pid)
        return True

    def _progress_tracker(self, baseline: ScanResult, steps: StepReader | None) -> ProgressTracker:
        cfg = self.cfg
        stale = cfg.stale_progress_seconds
        auto = stale == "auto"
        tracker = ProgressTracker(
            baseline.files,
            startup_timeout=cfg.startup_timeout_seconds,
            stale_after=cfg.startup_timeout_seconds if stale == "auto" else stale,
            auto=StaleLimit(
                startup_limit=cfg.startup_timeout_seconds,
                carried=cfg.stale_progress_carried_seconds,
            )
            if auto
            else None,
            steps=None
            if steps is None
            else StepTracker(loss_check=cfg.loss_check, step_key=cfg.step_key),
            source=cfg.progress_source,
        )
        tracker.skipped_dirs = baseline.errors
        return tracker

    async def _start_producers(
        self, producers: TaskGroup, sink: EventSink, spawner: Spawner, watch: _ProgressWatch
    ) -> None:
        """The producers, each with its own clone of the sink: the spawner's watch, the
        watchdog, the samplers and the run's judge; then the tasks that wait for an end cause."""
        cfg = self.cfg
        assert spawner.pid is not None
        assert spawner.reaper_pid is not None
        # The proc sampler's tick, on which the GPU sampler takes its loops' output.
        ticks = TickSignal()
        self._produce(producers, sink, spawner.watch)
        self._produce(
            producers,
            sink,
            partial(
                run_watchdog,
                progress_dir=cfg.progress_dir,
                tracker=watch.tracker,
                ignore=lambda: watch.ignore,
                also=watch.also,
                scan_interval=cfg.sample_interval_seconds,
                limiter=self._limiter,
                on_failure=self._run_judge.watchdog_rule,
                rides=self._rides,
                steps=watch.steps,
            ),
        )
        self._produce(
            producers,
            sink,
            partial(
                run_proc_sampler,
                root_pid=spawner.reaper_pid,
                interval=cfg.sample_interval_seconds,
                disk_paths={"progress": cfg.progress_dir, "output": cfg.output_path.parent},
                detailed_memory=cfg.detailed_memory,
                on_tree=self._on_tree,
                masker=self._masker,
                rides=self._rides,
                ticks=ticks,
                members_file=None if spawner.cgroup is None else spawner.cgroup.procs_file,
                tree_gone=spawner.tree_gone,
                # A soak that cannot sample fails closed: it never passes blind.
                on_blind=self._sampler_rule_fired,
            ),
        )
        if cfg.nvidia_smi is not None:
            self._produce(
                producers,
                sink,
                partial(
                    run_gpu_sampler,
                    interval=cfg.sample_interval_seconds,
                    tree_pids=lambda: self._tree_now,
                    nvidia_smi=cfg.nvidia_smi,
                    call_timeout=gpu_call_timeout(cfg.sample_interval_seconds),
                    limiter=self._limiter,
                    ticks=ticks,
                    visible_devices=(os.environ if cfg.env is None else cfg.env).get(
                        "CUDA_VISIBLE_DEVICES"
                    ),
                    on_fault=self._run_judge.gpu_fault,
                ),
            )
        self._exit_judge.memory_cgroup = await self._run_judge.emit_limits(sink, spawner.pid)
        self._produce(producers, sink, self._run_judge.run)
        producers.start_soon(self._end_when_set, spawner.exited, StopCause.EXITED)
        producers.start_soon(self._end_when_set, spawner.reaper_lost, REAPER_LOST)
        producers.start_soon(self._end_when_requested)
        producers.start_soon(self._kill_when_asked)
        self._job.start_tasks(producers, sink, spawner, self.end)
        if cfg.max_duration_seconds is not None:
            producers.start_soon(self._end_after_max_duration, sink)

    async def _stop_after_end(
        self, sink: EventSink, spawner: Spawner, watch: _ProgressWatch
    ) -> None:
        """The first end cause is in: judge the exit or run the stop sequence, then what
        follows either (a requeue, the OOM kills, the GPUs' release)."""
        if self.cause == StopCause.EXITED and self.control.stop_requested.is_set():
            # The stop request and the exit crossed (a scheduler that signals every
            # process of the job: the trainer saved and exited on the same SIGTERM).
            self.cause = self.control.cause
        if self.cause == StopCause.EXITED:
            await self._last_scan(sink, watch)
        self._progress_seen = watch.tracker.first_change is not None
        await self._end_tree(sink, spawner)
        if self.cause == StopCause.REQUEUED:
            await self._job.requeue(sink)
        await self._exit_judge.report_oom_kills(sink)
        if self.cause == StopCause.EXITED and spawner.tree_gone.is_set():
            # A run that ended by itself; a stop (a scheduler's) has no time to spare.
            await self._run_judge.check_gpus_released(sink)

    async def _last_scan(self, sink: EventSink, watch: _ProgressWatch) -> None:
        """A command shorter than one scan interval: what it wrote still counts."""
        broken = await final_scan(
            sink,
            progress_dir=self.cfg.progress_dir,
            tracker=watch.tracker,
            ignore=watch.ignore,
            also=watch.also,
            limiter=self._limiter,
            scan_timeout=FINAL_SCAN_TIMEOUT_SECONDS,
            steps=watch.steps,
        )
        if broken is not None:
            # The loss went NaN in the last steps before the command exited.
            reason, message = broken
            await self._fail(FailureReason(reason), message)

    async def _end_tree(self, sink: EventSink, spawner: Spawner) -> None:
        """The exit judged (the command ended by itself), the tree killed (the reaper was
        lost), or the stop sequence (every other cause)."""
        cause = self.cause
        if cause == StopCause.EXITED:
            await self._exit_judge.after_exit(
                sink, spawner, cause, progress_seen=self._progress_seen
            )
        elif cause == REAPER_LOST:
            await self._tree_stop.after_reaper_lost(sink, spawner)
        else:
            assert isinstance(cause, StopCause)
            await self._tree_stop.stop(
                sink,
                spawner,
                cause,
                first_failure=self._failures[0] if self._failures else None,
                scheduler=self._job.facts,
            )

    async def _leave_nothing_behind(
        self, spawner: Spawner, cgroup: cgroups.TreeCgroup | None
    ) -> None:
        """Shielded, bounded clean-up: the tree killed if the supervisor broke, the reaper
        closed, the cgroup removed."""
        if not spawner.tree_gone.is_set() and spawner.pid is not None:
            # Only reached when the supervisor itself broke: leave nothing running.
            with contextlib.suppress(BlockingCallTimeout):
                await run_blocking(
                    spawner.kill_tree,
                    timeout=TREE_WALK_TIMEOUT_SECONDS,
                    what="killing the tree",
                )
        # A reaper still waiting on a tree SIGKILL cannot end (uninterruptible sleep)
        # is not waited for past a scheduler's deadline: the artifact comes first.
        await spawner.close(self._tree_stop.within_deadline(REAPER_CLOSE_TIMEOUT_SECONDS))
        if cgroup is not None:
            with contextlib.suppress(BlockingCallTimeout):
                await run_blocking(
                    cgroup.remove,
                    timeout=TREE_LOOK_TIMEOUT_SECONDS,
                    what="removing a cgroup",
                )

    # -- the producers and end-cause tasks ----------------------------------------------

    def _on_tree(self, pids: frozenset[int]) -> None:
        self._tree_now = pids
        self._seen_pids.update(pids)

    def _produce(
        self,
        tg: TaskGroup,
        sink: EventSink,
        producer: Callable[[EventSink], Awaitable[None]],
    ) -> None:
        """Run a producer with its own clone of the sink, closed when it returns."""

        async def run(clone: EventSink) -> None:
            async with clone:
                await producer(clone)

        tg.start_soon(run, sink.clone())

    async def _end_when_set(self, event: anyio.Event, cause: EndCause) -> None:
        await event.wait()
        self.end(cause)

    async def _kill_when_asked(self) -> None:
        await self.control.kill_requested.wait()
        self.kill_now()

    async def _end_when_requested(self) -> None:
        await self.control.stop_requested.wait()
        self.end(self.control.cause)

    async def _end_after_max_duration(self, sink: EventSink) -> None:
        assert self.cfg.max_duration_seconds is not None
        await anyio.sleep(max(0.0, self.cfg.max_duration_seconds - sink.elapsed()))
        self.end(StopCause.MAX_DURATION)


def gpu_call_timeout(interval: float) -> float:
    """How long nvidia-smi may stay silent before the GPU sampler is degraded.

    It answers in tens of milliseconds when healthy; a hang (a GPU off the bus) should show
    within a few sampling periods, but never sooner than 2 s nor later than 10 s.
    """
    return min(10.0, max(2.0, 4 * interval))


def _unwrap(exc: Exception) -> Exception:
    """The one exception inside nested single-member groups (a task group's wrapping)."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _now() -> datetime:
    return datetime.now(UTC)


def _dir_keys(paths: Sequence[Path]) -> set[tuple[int, int]]:
    keys = set()
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                keys.add((st.st_dev, st.st_ino))
    return keys


def _file_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)
