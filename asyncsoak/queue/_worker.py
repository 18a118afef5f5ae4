"""The worker: takes queued jobs one at a time and runs each under ``run_soak``.

The worker never trains itself.  Each attempt runs ``run_soak`` with the job's command in
``<runs>/<id>/attempts/<k>/`` (``train.log``, ``soak.json``, its journal), with
``<runs>/<id>/`` as the run directory kept across attempts.  Beside the soak, a supervisor
task heartbeats the job every ``poll_seconds`` (during the stop too), notices cancellation
requests and the worker's own stop, and turns them into a stop request to the soak: the
child's stdin is closed (or its stop signal sent), ``stop_timeout_seconds`` later its tree is
killed (the settings are :class:`~asyncsoak.queue._settings.WorkerConfig`'s).
In stop mode ``stdin`` the monitor holds the child's stdin, so the kernel closes it when the
worker dies and the trainer never runs on unsupervised.

A running job whose heartbeat is older than ``orphan_after_seconds`` (or whose worker
process is gone, on this host) is an orphan.  A worker takes it over (compare and swap on the
heartbeat, which fences the silent worker out), reads the attempt's artifact (the attempt may
have finished and only lost its final write), kills what is left of its tree on this host, and
writes the outcome: the artifact's verdict, or a failure that requeues the job while attempts
remain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import anyio

from .._contract import (
    BlockingCallTimeout,
    Masker,
    SoakFailureError,
    ValidationError,
    argv_secrets,
    read_json_file,
    require_asyncio,
    run_blocking,
    secret_values,
)
from .._export import Metrics, WorkerMetrics, new_registry, render, validate_metrics
from .._process import start_time_ticks
from .._supervisor import OutputLocationError, SoakControl, run_soak, slurm
from ._learned import carried_limit, remember_limit
from ._models import Job, QueueError, QueueUnavailableError, WorkerInfo, artifact_summary
from ._orphans import kill_leftovers, process_alive
from ._retry import (
    GPU_FAULT,
    INVALID_JOB,
    MONITOR_ERROR,
    ORPHANED,
    WORKER_CANCELLED,
)
from ._settings import TRAIN_CMD as TRAIN_CMD
from ._settings import WorkerConfig as WorkerConfig
from ._settings import reference_config
from ._spool import Spool
from ._status import (
    CANCELLED,
    FAILED,
    INTERRUPTED,
    Outcome,
    outcome_from_artifact,
    tail,
)
from ._store import JobStore
from ._sweeps import GpuOffer, pick_gpus

#: How soon an idle worker looks at the queue again while the database is unavailable.
_UNAVAILABLE_RETRY_SECONDS = 1.0
#: A store call that failed for now (database away, lock held too long, call abandoned).
_UNAVAILABLE = (QueueUnavailableError, BlockingCallTimeout)

#: ``run_worker``'s and ``run_job``'s status for an attempt this worker lost to fencing.
LOST = "lost"

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

_log = logging.getLogger("asyncsoak.queue")
_PLACEHOLDER = re.compile(r"\{(job_id|db|run_dir)\}")
#: A store call is abandoned past this many busy timeouts (plus 10 s): its disk is hung.
STORE_CALL_TIMEOUT_FACTOR = 4
_T = TypeVar("_T")


@dataclasses.dataclass(slots=True)
class _JobState:
    stopping: bool = False
    lost: bool = False
    killed: bool = False


def default_worker_name(gpus: str | None = None) -> str:
    """``host:gpuN`` for a worker bound to GPUs (stable across restarts), else ``host:pid``."""
    host = socket.gethostname()
    return f"{host}:gpu{gpus}" if gpus else f"{host}:{os.getpid()}"


def default_runs_dir(store: JobStore) -> Path:
    """Where the store keeps runs unless told: beside an SQLite file (``queue.runs/``)."""
    return store.default_runs_dir()


@overload
async def run_worker(
    store: JobStore,
    config: WorkerConfig,
    *,
    once: bool = ...,
    stop_event: anyio.Event | None = ...,
    kill_event: anyio.Event | None = ...,
    name: str | None = ...,
    metrics: Metrics | None = ...,
) -> int: ...


@overload
async def run_worker(
    store: JobStore,
    *,
    poll: float = ...,
    once: bool = ...,
    cmd: Sequence[str] | None = ...,
    stop_event: anyio.Event | None = ...,
    name: str | None = ...,
    kill_event: anyio.Event | None = ...,
    runs_dir: Path | None = ...,
    gpus: str | None = ...,
    stale_after: float = ...,
    cancel_grace: float = ...,
    stop_timeout: float = ...,
    kill_wait: float = ...,
    finish_retries: int = ...,
    finish_retry_wait: float = ...,
    nvidia_smi: str | None = ...,
    metrics: Metrics | None = ...,
    until: float | None = ...,
    retry_backoff: float = ...,
) -> int: ...


async def run_worker(
    store: JobStore,
    config: WorkerConfig | float | None = None,
    once: bool = False,
    cmd: Sequence[str] | None = None,
    stop_event: anyio.Event | None = None,
    name: str | None = None,
    *,
    kill_event: anyio.Event | None = None,
    metrics: Metrics | None = None,
    **settings: Any,
) -> int:
    """Take and run jobs until ``stop_event`` is set; returns how many ran.

    ``run_worker(store, config)`` runs with the settings of ``config`` (a
    :class:`WorkerConfig`; its ``runs_dir`` None is the store's default).  The reference
    form ``run_worker(store, poll=POLL_S, once=False, cmd=None, stop_event=None, name=None,
    *, runs_dir=None, gpus=None, stale_after=STALE_AFTER_S, ...)`` builds that config from
    the settings' reference names (:data:`~asyncsoak.queue._settings.REFERENCE_NAMES`).

    A worker without ``gpus`` runs one job at a time.  One owning several GPUs (``gpus``
    ``"0,1,2,3"``) runs jobs side by side: a job submitted with ``gpus=N`` gets N of the
    free ones, one without gets all of them, each job its own ``CUDA_VISIBLE_DEVICES``, no GPU
    shared; a GPU that faulted (``gpu_fault``) is not used again until an operator clears it
    (``asyncsoak worker --clear-fault``).

    ``once`` drains what is queued and returns.  Setting ``stop_event`` stops the running
    job the graceful way (it becomes ``interrupted`` and returns to the queue) and then the
    worker; setting ``kill_event`` too kills the job's process group at once instead of
    waiting out ``stop_timeout_seconds`` (a second Ctrl-C).  ``name`` defaults to
    ``host:gpuN`` with GPUs, else ``host:pid``.  ``metrics`` (an :class:`asyncsoak.Metrics`
    with a port) serves the worker's and the queue's metrics, with the running soak's, while
    the worker runs.  Raises :class:`QueueError` when the runs directory is unusable or a live
    worker already has this name, and :class:`ValidationError` for a bad period (NaN,
    negative), bad metrics settings or a metrics port that cannot be served, before any job
    is claimed.
    """
    require_asyncio("run_worker")
    if isinstance(config, WorkerConfig):
        if cmd is not None or settings:
            raise TypeError("run_worker takes a WorkerConfig or its settings, not both")
    else:
        if config is not None:
            settings["poll"] = config
        config = reference_config(settings, cmd=cmd or None)
    worker = _Worker(
        store,
        config,
        stop_event or anyio.Event(),
        kill_event or anyio.Event(),
        name or default_worker_name(config.gpus),
    )
    metrics_config = validate_metrics(metrics)
    if metrics_config is None:
        return await worker.run(once)
    from .._export import MetricsServer, open_listener

    worker.metrics = WorkerMetrics(worker.name, host=worker.host)
    worker.registry = new_registry(worker.metrics)
    server = None
    if metrics_config.port is not None:
        listener = await open_listener(metrics_config.address, metrics_config.port)
        server = MetricsServer(listener, partial(render, worker.registry))
    async with anyio.create_task_group() as tg:
        if server is not None:
            tg.start_soon(server.serve)
        try:
            ran = await worker.run(once)
        finally:
            tg.cancel_scope.cancel()
    return ran


@overload
async def run_job(
    store: JobStore,
    job: Job,
    config: WorkerConfig,
    *,
    stop_event: anyio.Event | None = ...,
    name: str | None = ...,
) -> str: ...


@overload
async def run_job(
    store: JobStore,
    job: Job,
    cmd: Sequence[str],
    /,
    poll: float,
    stop_event: anyio.Event,
    name: str | None = ...,
    *,
    runs_dir: Path | None = ...,
    gpus: str | None = ...,
    cancel_grace: float = ...,
    stop_timeout: float = ...,
    kill_wait: float = ...,
    finish_retries: int = ...,
    finish_retry_wait: float = ...,
    nvidia_smi: str | None = ...,
) -> str: ...


async def run_job(
    store: JobStore,
    job: Job,
    config: WorkerConfig | Sequence[str],
    poll: float | None = None,
    stop_event: anyio.Event | None = None,
    name: str | None = None,
    **settings: Any,
) -> str:
    """Run one claimed job under ``run_soak`` and write its final status.

    ``run_job(store, job, config)`` runs it with the settings of ``config`` (a
    :class:`WorkerConfig`); the reference form ``run_job(store, job, cmd, poll, stop_event,
    name=None, *, runs_dir=None, gpus=None, cancel_grace=..., ...)`` builds that config.
    ``name`` is the worker that claimed it (default: the job's ``worker``).  Returns the
    attempt's outcome (a :class:`JobStatus`: ``succeeded``, ``failed``, ``cancelled``,
    ``interrupted``), or ``lost`` when another worker took the job over meanwhile (nothing is
    written then).
    """
    require_asyncio("run_job")
    if isinstance(config, WorkerConfig):
        if poll is not None or settings:
            raise TypeError("run_job takes a WorkerConfig or its settings, not both")
    else:
        if poll is not None:
            settings["poll"] = poll
        config = reference_config(settings, cmd=config)
    name = name or job.worker or default_worker_name()
    worker = _Worker(store, config, stop_event or anyio.Event(), anyio.Event(), name)
    return await worker.run_job(job)


class _Worker:
    def __init__(
        self,
        store: JobStore,
        settings: WorkerConfig,
        stop_event: anyio.Event,
        kill_event: anyio.Event,
        name: str,
    ) -> None:
        self.store = store
        self.settings = settings
        self.runs_dir = (settings.runs_dir or default_runs_dir(store)).absolute()
        self.stop_event = stop_event
        self.kill_event = kill_event
        self.name = name
        self.host = socket.gethostname()
        # Store calls are short, but a heartbeat may wait out another writer's lock, and the
        # loop's orphan sweep (which kills a dead worker's leftovers) runs beside the jobs: one
        # thread for the loop, one for the worker's heartbeat, one for each job it may run at
        # once, so no job's heartbeat waits behind them and goes stale.
        self.devices = gpu_list(settings.gpus)
        self.limiter = anyio.CapacityLimiter(2 + max(1, len(self.devices)))
        #: The jobs running, each with the GPUs it was given.
        self.running: dict[int, list[str]] = {}
        #: Set when a job ends: its GPUs may take another.
        self.job_done = anyio.Event()
        self._faulted: set[str] = set()
        #: Set by ``run_worker`` when the worker serves metrics.
        self.metrics: WorkerMetrics | None = None
        self.registry: CollectorRegistry | None = None
        # Set by the store's notifications (PostgreSQL): a job may be waiting.
        self.wake = anyio.Event()
        self.spool = Spool(self.runs_dir)
        self._unreachable = False

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        # A store call waits at most the busy timeout for a lock (or a connection attempt);
        # past a generous multiple of it the database's disk or network is hung, and the call
        # is abandoned rather than awaited: the caller treats the database as unavailable.
        return await run_blocking(
            fn,
            *args,
            timeout=self._call_timeout(),
            what=f"the queue store call {getattr(fn, '__name__', 'call')}",
            limiter=self.limiter,
        )

    def _call_timeout(self) -> float:
        return STORE_CALL_TIMEOUT_FACTOR * self.store.busy_timeout + 10.0

    def _lost_database(self, doing: str, exc: BaseException) -> None:
        """Log a failed store call: a warning when the database goes away, then quiet."""
        if not self._unreachable:
            self._unreachable = True
            _log.warning(
                "worker %s: the queue database is unavailable (%s: %s); running jobs stay "
                "supervised, retrying with backoff",
                self.name,
                doing,
                exc,
            )
        else:
            _log.debug("worker %s: %s: %s", self.name, doing, exc)

    def _reached_database(self) -> None:
        if self._unreachable:
            self._unreachable = False
            _log.warning("worker %s: the queue database is back", self.name)

    def _on_notify(self, payload: str) -> None:
        self.wake.set()

    async def run(self, once: bool) -> int:
        await self._call(prepare_runs_dir, self.runs_dir)
        await self._call(self._register)
        if self.devices:
            # For `workers` only: a worker that cannot record them now still runs.
            try:
                await self._call(self.store.set_worker_gpus, self.name, self.devices)
            except _UNAVAILABLE as exc:
                _log.warning("worker %s: its GPUs not recorded for `workers`: %s", self.name, exc)
        _log.info(
            "worker %s started on %s (pid %d, runs in %s)",
            self.name,
            self.host,
            os.getpid(),
            self.runs_dir,
        )
        ran = 0
        try:
            async with anyio.create_task_group() as tg:
                if not once:  # a draining worker never waits for a job: nothing to hear
                    await tg.start(self.store.listen, self._on_notify)
                tg.start_soon(self._beat)
                async with anyio.create_task_group() as jobs:
                    while not (self.stop_event.is_set() or self.kill_event.is_set()):
                        # Fresh events before the claim: a job submitted (or ended) after the
                        # claim found nothing wakes the wait below.
                        self.wake = anyio.Event()
                        self.job_done = anyio.Event()
                        await self._deliver_spool()
                        await self._sweep_orphans()
                        fits = slurm.seconds_left_for_jobs(
                            self.settings.until, self.settings.stop_timeout_seconds
                        )
                        if fits is not None and fits <= 0:
                            _log.info(
                                "worker %s: its allocation ends soon; no more jobs", self.name
                            )
                            break
                        offer = await self._offer()
                        job = None if offer is None else await self._claim(fits, offer)
                        if job is not None:
                            devices = await self._place(job, offer)
                            self.running[job.id] = devices
                            if self.metrics is not None:
                                self.metrics.current_job = job.id
                                self.metrics.current_attempt = job.attempt
                            jobs.start_soon(self._run_claimed, job, devices)
                            ran += 1
                            continue
                        if once and not self.running:
                            break
                        # While the database is away, look again soon (the store's own
                        # backoff spaces the connection attempts): a job may be waiting.
                        wait: float | None = self.settings.poll_seconds
                        if self._unreachable:
                            wait = min(self.settings.poll_seconds, _UNAVAILABLE_RETRY_SECONDS)
                        elif self._full():
                            # Busy on every GPU (or on its one job): nothing to claim, and no
                            # need to spin, until a job ends.
                            wait = None
                        events = [self.stop_event, self.kill_event, self.job_done]
                        if wait is not None:
                            events.append(self.wake)
                        with anyio.move_on_after(math.inf if wait is None else wait):
                            async with anyio.create_task_group() as waits:
                                for event in events:
                                    waits.start_soon(_set_then_cancel, event, waits.cancel_scope)
                tg.cancel_scope.cancel()
        finally:
            with anyio.move_on_after(self.store.busy_timeout, shield=True):
                try:
                    await self._call(self.store.worker_stopped, self.name)
                except _UNAVAILABLE as exc:
                    _log.warning("worker %s: could not record its stop: %s", self.name, exc)
        _log.info("worker %s stopped after %d job(s)", self.name, ran)
        return ran

    def _register(self) -> None:
        pid = os.getpid()
        self.store.register_worker(
            self.name,
            host=self.host,
            pid=pid,
            pid_start=start_time_ticks(pid),
            alive=self._worker_alive,
        )

    async def _offer(self) -> GpuOffer | None:
        """What this worker can give a job now, or None when it can take none: a worker
        without GPUs runs one job at a time; one with GPUs offers its free, healthy ones."""
        try:
            faults = await self._call(self.store.gpu_faults, self.host)
        except _UNAVAILABLE as exc:
            self._lost_database("reading GPU faults", exc)
            return None
        faulted = {f.gpu for f in faults}
        if faulted != self._faulted:
            for gpu in sorted(faulted - self._faulted):
                _log.warning(
                    "worker %s: GPU %s of %s had a fault; no jobs on it until an operator "
                    "clears it (asyncsoak worker --clear-fault %s)",
                    self.name,
                    gpu,
                    self.host,
                    gpu,
                )
            for gpu in sorted(self._faulted - faulted):
                _log.warning("worker %s: GPU %s cleared; back in service", self.name, gpu)
            self._faulted = faulted
        if not self.devices:
            # Its jobs see every GPU of the host: a fault on any of them stops its claims.
            return None if self.running or faulted else GpuOffer()
        healthy = [gpu for gpu in self.devices if gpu not in faulted]
        busy = {gpu for devices in self.running.values() for gpu in devices}
        free = [gpu for gpu in healthy if gpu not in busy]
        if not free:
            return None
        return GpuOffer(
            free=len(free),
            all_free=not self.running,
            names=tuple(f"{self.host}:{gpu}" for gpu in free),
        )

    def _full(self) -> bool:
        """Whether every job this worker can run at once is running.  A faulted GPU is not
        busy: the worker keeps looking, so that a GPU an operator clears takes a job at once,
        not only once a running job ends."""
        if not self.running:
            return False
        busy = {gpu for devices in self.running.values() for gpu in devices}
        return not self.devices or all(gpu in busy for gpu in self.devices)

    async def _place(self, job: Job, offer: GpuOffer | None) -> list[str]:
        """The GPUs a claimed job runs on (none for a worker without GPUs)."""
        if not self.devices or offer is None:
            return []
        free = [name.split(":")[-1] for name in offer.names]
        try:
            plan = await self._call(self.store.plan, job.id)
        except _UNAVAILABLE:
            plan = None
        need = None if plan is None else plan.gpus
        devices = pick_gpus(need, free, () if plan is None else plan.avoid, self.host)
        with contextlib.suppress(*_UNAVAILABLE):
            await self._call(self.store.record_attempt_gpus, job.id, job.attempt, devices)
        return devices

    async def _run_claimed(self, job: Job, devices: list[str]) -> None:
        try:
            await self.run_job(job, devices)
        finally:
            self.running.pop(job.id, None)
            if self.metrics is not None and self.metrics.current_job == job.id:
                self.metrics.current_job = self.metrics.current_attempt = None
            self.job_done.set()

    def _worker_alive(self, info: WorkerInfo) -> bool:
        if info.host == self.host:
            return process_alive(info.pid, info.pid_start)
        return self.store.now() - info.heartbeat_at < self.settings.orphan_after_seconds

    async def _beat(self) -> None:
        while True:
            try:
                await self._call(self.store.worker_heartbeat, self.name)
                if self.metrics is not None:
                    self.metrics.heartbeat_at = time.time()
                    self.metrics.queue_jobs = await self._call(self.store.count_by_status)
            except _UNAVAILABLE as exc:
                self._lost_database("worker heartbeat", exc)
            else:
                self._reached_database()
            await anyio.sleep(self.settings.poll_seconds)

    async def _claim(self, fits: float | None = None, offer: GpuOffer | None = None) -> Job | None:
        try:
            job = await self._call(
                partial(self.store.claim, max_duration=fits, offer=offer),
                self.name,
                self.host,
                self.runs_dir,
            )
        except _UNAVAILABLE as exc:
            self._lost_database("claim", exc)
            return None
        self._reached_database()
        if job is not None:
            _log.info("job %d claimed (attempt %d)", job.id, job.attempt)
        return job

    async def _deliver_spool(self) -> None:
        """Deliver final writes kept while the database was away (fenced like any other)."""
        for entry in await self._call(self.spool.pending):
            try:
                written = await self._call(
                    partial(self.store.finish, backoff=self.settings.retry_backoff_seconds),
                    entry.job_id,
                    entry.attempt,
                    entry.worker,
                    entry.outcome,
                    entry.summary,
                    _joined(
                        entry.note,
                        f"final status delivered late, from the spool on {self.host}: the "
                        "database was unavailable when the attempt ended",
                    ),
                )
            except _UNAVAILABLE as exc:
                self._lost_database("delivering a spooled outcome", exc)
                return
            await self._call(self.spool.remove, entry)
            if written:
                _log.warning(
                    "job %d attempt %d: outcome %s delivered from the spool",
                    entry.job_id,
                    entry.attempt,
                    entry.outcome.status,
                )
            else:
                _log.warning(
                    "job %d attempt %d: spooled outcome dropped: the job was taken over meanwhile",
                    entry.job_id,
                    entry.attempt,
                )

    # --- one attempt ---------------------------------------------------------------------

    async def _learned_limit(
        self, job: Job, artifact: dict[str, Any] | None = None
    ) -> float | None:
        """``--stale-progress auto``: before the soak, the limit earlier runs of a job of the
        same name learned; after it (``artifact`` given), keep what this one learned."""
        if job.soak.get("stale_progress_seconds") != "auto":
            return None
        runs = self.runs_dir
        try:
            if artifact is not None:
                await self._call(remember_limit, runs, job.name, artifact)
                return None
            return await self._call(carried_limit, runs, job.name)
        except (OSError, BlockingCallTimeout) as exc:
            _log.warning("job %d: the learned stale limit: %s", job.id, exc)
            return None

    async def run_job(self, job: Job, devices: Sequence[str] | None = None) -> str:
        """Run one claimed attempt; ``devices``: its GPUs (None: the worker's ``gpus``)."""
        assert job.artifact is not None
        output_path = Path(job.artifact)
        attempt_dir = output_path.parent
        run_dir = self.runs_dir / str(job.id)
        env = self._environment(job, run_dir, devices)
        masker = Masker(secret_values(env) | argv_secrets(job.argv or ()))
        control = SoakControl()
        state = _JobState()
        artifact: dict[str, Any] | None = None
        problem: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._supervise, job, control, state)
                try:
                    await self._call(_make_dirs, attempt_dir)
                    carried = await self._learned_limit(job)
                    soaked = await run_soak(
                        command=self._command(job, run_dir),
                        progress_dir=Path(job.progress_dir) if job.progress_dir else run_dir,
                        # Every attempt's monitor writes there: none of it is this one's progress.
                        progress_exclude=[run_dir / "attempts"],
                        output_path=output_path,
                        cwd=Path(job.cwd) if job.cwd else None,
                        env=env,
                        metadata={
                            "job_id": job.id,
                            "job_name": job.name,
                            "attempt": job.attempt,
                            "worker": self.name,
                            "host": self.host,
                        },
                        stop_mode=job.stop_mode,
                        control=control,
                        log_path=attempt_dir / "train.log",
                        nvidia_smi=self.settings.nvidia_smi,
                        kill_wait_seconds=self.settings.kill_wait_seconds,
                        **job.soak,
                        stale_progress_carried_seconds=carried,
                        metrics=None if self.registry is None else Metrics(registry=self.registry),
                    )
                    # Read below as the plain dict it is, like a failed soak's or a saved one.
                    artifact = cast("dict[str, Any]", soaked)
                except SoakFailureError as exc:
                    artifact = exc.artifact
                except Exception as exc:  # the monitor failed, or refused the job's inputs
                    problem = exc
                finally:
                    tg.cancel_scope.cancel()
            await self._learned_limit(job, artifact)
        except anyio.get_cancelled_exc_class():
            # The worker itself is being cancelled: run_soak has stopped the tree and written
            # its artifact; record the attempt from it before the cancellation goes on.
            state.stopping = True
            with anyio.move_on_after(self._finish_bound(), shield=True):
                if not state.lost:
                    saved = await self._call(_read_artifact, output_path)
                    cancel = await self._cancel_requested(job)
                    outcome = self._outcome(saved, None, state, cancel, masker, attempt_dir)
                    await self._finish(job, outcome, _summary(saved))
            raise
        if state.lost:
            _log.warning(
                "job %d attempt %d: taken over by another worker; not recorded here",
                job.id,
                job.attempt,
            )
            return LOST
        cancel = await self._cancel_requested(job)
        outcome = self._outcome(artifact, problem, state, cancel, masker, attempt_dir)
        note = await self._take_out_faulted(job, artifact, devices)
        with anyio.move_on_after(self._finish_bound(), shield=True):
            await self._finish(job, outcome, _summary(artifact), note)
        _log.info(
            "job %d attempt %d: %s%s",
            job.id,
            job.attempt,
            outcome.status,
            f" ({outcome.reason})" if outcome.reason else "",
        )
        return outcome.status

    async def _take_out_faulted(
        self, job: Job, artifact: dict[str, Any] | None, devices: Sequence[str] | None
    ) -> str | None:
        """After an attempt that failed ``gpu_fault``: take the GPU it names (else every GPU
        the job had) out of service on this host; the note saying so, or None."""
        failures = (artifact or {}).get("failures") or []
        if not any(isinstance(f, dict) and f.get("reason") == GPU_FAULT for f in failures):
            return None
        owned = gpu_list(self.settings.gpus) if devices is None else list(devices)
        gpus = faulted_gpus(artifact, owned) or ["all"]
        detail = next(str(f.get("message")) for f in failures if f.get("reason") == GPU_FAULT)
        try:
            await self._call(
                partial(
                    self.store.record_gpu_fault,
                    worker=self.name,
                    job_id=job.id,
                    attempt=job.attempt,
                    detail=detail,
                ),
                self.host,
                gpus,
            )
        except _UNAVAILABLE as exc:
            _log.warning("job %d: GPU fault not recorded: %s", job.id, exc)
            return None
        listed = ",".join(gpus)
        _log.warning(
            "job %d: GPU %s of %s out of service after a fault; clear it with "
            "asyncsoak worker --clear-fault %s",
            job.id,
            listed,
            self.host,
            listed,
        )
        return (
            f"GPU {listed} of {self.host} taken out of service after this fault, until "
            f"asyncsoak worker --clear-fault {listed}"
        )

    async def _cancel_requested(self, job: Job) -> bool:
        try:
            return await self._call(self.store.cancel_requested, job.id)
        except _UNAVAILABLE:
            return job.cancel_requested

    @staticmethod
    def _outcome(
        artifact: dict[str, Any] | None,
        problem: BaseException | None,
        state: _JobState,
        cancel_requested: bool,
        masker: Masker,
        attempt_dir: Path,
    ) -> Outcome:
        if artifact is None:
            status = CANCELLED if cancel_requested else FAILED
            if problem is None:
                # The worker was cancelled before the soak could write its artifact.
                status = CANCELLED if cancel_requested else INTERRUPTED
                outcome = Outcome(status, None, WORKER_CANCELLED, None)
            elif isinstance(problem, ValidationError) and not isinstance(
                problem, OutputLocationError
            ):
                outcome = Outcome(status, None, INVALID_JOB, f"the job cannot run: {problem}")
            else:
                detail = f"the monitor could not run the attempt: {problem!r}"
                outcome = Outcome(status, None, MONITOR_ERROR, detail)
        else:
            outcome = outcome_from_artifact(
                artifact,
                cancel_requested=cancel_requested,
                stopping=state.stopping,
                killed_by_worker=state.killed,
                log_tail=tail(attempt_dir / "train.log"),
            )
        if outcome.error is None:
            return outcome
        return dataclasses.replace(outcome, error=masker(outcome.error))

    def _command(self, job: Job, run_dir: Path) -> list[str]:
        db = self.store.location
        if job.argv is None:
            return [*self.settings.cmd, "--job-id", str(job.id), "--db", db, "--watch-stdin"]
        values = {"job_id": str(job.id), "db": db, "run_dir": str(run_dir)}
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in job.argv]

    def _environment(
        self, job: Job, run_dir: Path, devices: Sequence[str] | None = None
    ) -> dict[str, str]:
        """The worker's environment, then the job's overrides, then what the worker owns."""
        env = dict(os.environ)
        env.update(job.env)
        gpus = self.settings.gpus if devices is None else ",".join(devices)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["ASYNCSOAK_JOB_ID"] = str(job.id)
        env.update(self.store.child_environment())
        env["ASYNCSOAK_RUN_DIR"] = str(run_dir)
        env["ASYNCSOAK_ATTEMPT"] = str(job.attempt)
        env["ASYNCSOAK_STOP_MODE"] = job.stop_mode
        return env

    async def _supervise(self, job: Job, control: SoakControl, state: _JobState) -> None:
        """Heartbeat the job, and turn cancellation, fencing and worker stop into a stop."""
        cancel_deadline: float | None = None
        while True:
            try:
                cancel = await self._call(self.store.heartbeat, job.id, job.attempt, self.name)
            except _UNAVAILABLE as exc:
                # The soak does not need the database: it goes on, and the first heartbeat
                # that gets through again checks the fence below.
                self._lost_database(f"job {job.id} heartbeat", exc)
                cancel = False
            else:
                self._reached_database()
            if cancel is None:
                # Another worker took the job over (perhaps while this one was cut off from
                # the database): stop at once so it never runs twice.
                state.lost = True
                control.request_stop(reason="job taken over by another worker", grace_seconds=0)
                return
            now = anyio.current_time()
            if cancel and cancel_deadline is None:
                cancel_deadline = now + self.settings.cancel_grace_seconds
                _log.info(
                    "job %d: cancel requested; stopping it in %.0fs unless it stops itself",
                    job.id,
                    self.settings.cancel_grace_seconds,
                )
            if cancel_deadline is not None and now >= cancel_deadline:
                control.request_stop(
                    reason="cancel requested", grace_seconds=self.settings.stop_timeout_seconds
                )
            stop_now = self.kill_event.is_set()
            if (self.stop_event.is_set() or stop_now) and not state.stopping:
                state.stopping = True
                control.request_stop(
                    reason="worker stopping", grace_seconds=self.settings.stop_timeout_seconds
                )
            if stop_now and not state.killed and control.pid is not None:
                state.killed = True
                _kill_group(control.pid)
                _log.warning("job %d: killed its process group at once", job.id)
            wake = now + self.settings.poll_seconds
            if cancel_deadline is not None and not control.stop_requested.is_set():
                wake = min(wake, cancel_deadline)
            with anyio.move_on_after(wake - now):
                if state.killed:
                    await anyio.sleep_forever()
                elif state.stopping:
                    await self.kill_event.wait()
                else:
                    await self.stop_event.wait()

    def _finish_bound(self) -> float:
        per_try = self._call_timeout() + self.settings.finish_retry_wait_seconds
        return self.settings.finish_retries * per_try + self.settings.kill_wait_seconds

    async def _finish(
        self,
        job: Job,
        outcome: Outcome,
        summary: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> bool:
        """Write the final status, retrying while the database is unavailable, then keeping
        it in the spool for later delivery; warns, never raises."""
        retries = self.settings.finish_retries
        for attempt in range(1, retries + 1):
            try:
                written = await self._call(
                    partial(self.store.finish, backoff=self.settings.retry_backoff_seconds),
                    job.id,
                    job.attempt,
                    self.name,
                    outcome,
                    summary,
                    note,
                )
                if written and self.metrics is not None:
                    self.metrics.outcome(outcome.status, outcome.reason)
            except _UNAVAILABLE as exc:
                _log.warning(
                    "job %d: final status not written (%s), try %d of %d",
                    job.id,
                    exc,
                    attempt,
                    retries,
                )
                if attempt < retries:
                    await anyio.sleep(self.settings.finish_retry_wait_seconds)
                continue
            except Exception as exc:  # never raise from here: the job becomes an orphan instead
                _log.warning("job %d: final status not written: %r", job.id, exc)
                return False
            if not written:
                _log.warning(
                    "job %d attempt %d: final status refused: another worker holds it now",
                    job.id,
                    job.attempt,
                )
            return written
        try:
            path = await self._call(
                self.spool.keep, job.id, job.attempt, self.name, outcome, summary, note
            )
        except OSError as exc:
            _log.warning(
                "job %d: final status neither written nor spooled (%s); it will be handled as "
                "an orphan",
                job.id,
                exc,
            )
        else:
            _log.warning(
                "job %d: final status kept in %s; a worker on this host delivers it when the "
                "database is back",
                job.id,
                path,
            )
        return False

    # --- orphans -------------------------------------------------------------------------

    async def _sweep_orphans(self) -> None:
        try:
            running = await self._call(self.store.running)
            now = await self._call(self.store.now)
        except _UNAVAILABLE as exc:
            self._lost_database("looking for orphans", exc)
            return
        for job, holder in running:
            if job.id in self.running and job.worker == self.name:
                continue  # its own, heartbeating beside this loop
            limit = self.settings.orphan_after_seconds
            silent = job.heartbeat_at is None or now - job.heartbeat_at > limit
            # A worker's own name on a job it is not running: left by a dead worker of the
            # same name (registration refuses the name while that one lives).
            inherited = job.worker == self.name and job.id not in self.running
            gone = (
                holder is not None
                and holder.host == self.host
                and holder.name != self.name
                and not process_alive(holder.pid, holder.pid_start)
            )
            if silent or inherited or gone:
                await self._resolve_orphan(job)

    async def _resolve_orphan(self, job: Job) -> None:
        try:
            if not await self._call(self.store.take_over, job, self.name):
                return
        except _UNAVAILABLE as exc:
            _log.warning("job %d: could not take the orphan over: %s", job.id, exc)
            return
        _log.warning(
            "job %d attempt %d: orphan of worker %s; taken over", job.id, job.attempt, job.worker
        )
        output_path = Path(job.artifact) if job.artifact else None
        artifact = await self._call(_read_artifact, output_path) if output_path else None
        note = None
        if job.host == self.host:
            killed = await self._call(
                kill_leftovers,
                self.store.location,
                job.id,
                job.attempt,
                Path(job.artifact).parent / "train.log" if job.artifact else None,
                self.settings.kill_wait_seconds,
            )
            if killed:
                _log.warning(
                    "job %d: killed %d unsupervised process(es): %s", job.id, len(killed), killed
                )
        else:
            # Process ids mean nothing on another host: what is left there is its own
            # worker's to kill (in stop mode stdin the trainer saw its stdin close already).
            note = (
                f"orphan taken over by worker {self.name} on {self.host}; the attempt ran on "
                f"{job.host}, whose processes were not touched from {self.host}"
            )
            _log.warning("job %d: %s", job.id, note)
        try:
            cancel = await self._call(self.store.cancel_requested, job.id)
        except _UNAVAILABLE:
            cancel = job.cancel_requested
        if artifact is not None and output_path is not None:
            stop_cause = (artifact.get("stop") or {}).get("cause")
            outcome = outcome_from_artifact(
                artifact,
                cancel_requested=cancel,
                stopping=stop_cause in ("requested", "cancelled"),
                log_tail=tail(output_path.parent / "train.log"),
            )
            if outcome.error is not None:
                env = self._environment(job, self.runs_dir / str(job.id))
                outcome = dataclasses.replace(
                    outcome, error=Masker(secret_values(env))(outcome.error)
                )
        else:
            heartbeat = (
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.heartbeat_at))
                if job.heartbeat_at
                else "never"
            )
            outcome = Outcome(
                CANCELLED if cancel else FAILED,
                None,
                ORPHANED,
                f"worker {job.worker} went silent (last heartbeat {heartbeat}) before the "
                "attempt finished; its outcome is lost",
            )
        with anyio.move_on_after(self._finish_bound(), shield=True):
            await self._finish(job, outcome, _summary(artifact), note)


def gpu_list(gpus: str | None) -> list[str]:
    """``--gpus 0,1,2,3`` as the list of GPUs a worker owns ([] for none)."""
    return [gpu.strip() for gpu in (gpus or "").split(",") if gpu.strip()]


def faulted_gpus(artifact: dict[str, Any] | None, devices: Sequence[str]) -> list[str]:
    """The GPUs of ``devices`` a ``gpu_fault`` names (by nvidia-smi index or UUID): in the
    failure's ``gpu``, else in ``gpu_health`` (a failing fault on a GPU the run used); all of
    ``devices`` when neither says which (every GPU of the job is suspect)."""
    named: list[str] = []

    def name(gpu: Any) -> None:
        if not isinstance(gpu, dict):
            return
        keys = {str(gpu.get("index")), str(gpu.get("uuid"))}
        named.extend(d for d in devices if d in keys and d not in named)
        if not devices and gpu.get("index") is not None and str(gpu["index"]) not in named:
            named.append(str(gpu["index"]))

    failures = (artifact or {}).get("failures") or []
    for failure in failures:
        if isinstance(failure, dict) and failure.get("reason") == GPU_FAULT:
            name(failure.get("gpu"))
    if not named:
        for health in ((artifact or {}).get("gpu_health") or {}).values():
            faults = health.get("faults") if isinstance(health, dict) else None
            if any(isinstance(f, dict) and f.get("fails") and f.get("used") for f in faults or []):
                name(health)
    return named or list(devices)


def _joined(*notes: str | None) -> str:
    return "; ".join(n for n in notes if n)


def _summary(artifact: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if artifact is None else artifact_summary(artifact)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def prepare_runs_dir(runs_dir: Path) -> None:
    try:
        runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise QueueError(f"runs directory {runs_dir}: cannot create it: {exc.strerror}") from exc
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        raise QueueError(f"runs directory {runs_dir} is not writable")


def _kill_group(pid: int) -> None:
    """SIGKILL the command's process group (the reaper starts it as a session leader); the
    soak then sees it exit and stops whatever else is left of its tree."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _make_dirs(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _read_artifact(path: Path) -> dict[str, Any] | None:
    """An attempt's ``soak.json`` if it was written (it is replaced atomically, so it is whole)."""
    try:
        data = read_json_file(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
