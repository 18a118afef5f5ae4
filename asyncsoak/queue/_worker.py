"""The worker: claims queued jobs and runs each under ``run_soak`` (one at a time, or side by
side on its own GPUs); it heartbeats, delivers spooled final writes, and takes over orphans
(silent past ``orphan_after_seconds``, or their worker gone on this host), killing leftovers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from functools import partial
from pathlib import Path

import anyio

from .._contract import Masker, require_asyncio, secret_values
from .._export import Metrics, WorkerMetrics, new_registry, render, validate_metrics
from .._process import start_time_ticks
from .._supervisor import slurm
from ..trainer import Job
from ._attempt import UNAVAILABLE, Runner, _JobState, default_worker_name
from ._goodput import read_artifact
from ._kept import pending
from ._models import QueueDatabaseLostError, QueueError, WorkerInfo
from ._orphans import kill_leftovers, process_alive
from ._settings import WorkerConfig
from ._status import CANCELLED, FAILED, ORPHANED, Outcome
from ._store import JobStore
from ._sweeps import GpuOffer, Plan, pick_gpus

#: How soon an idle worker looks at the queue again while the database is unavailable.
_UNAVAILABLE_RETRY_SECONDS = 1.0

_log = logging.getLogger("asyncsoak.queue")


def prepare_runs_dir(runs_dir: Path) -> None:
    try:
        runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise QueueError(f"runs directory {runs_dir}: cannot create it: {exc.strerror}") from exc
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        raise QueueError(f"runs directory {runs_dir} is unwritable")


async def run_worker(
    store: JobStore,
    config: WorkerConfig,
    *,
    once: bool = False,
    stop_event: anyio.Event | None = None,
    kill_event: anyio.Event | None = None,
    name: str | None = None,
    metrics: Metrics | None = None,
) -> int:
    """Take and run jobs until ``stop_event`` (running jobs stopped gracefully) or
    ``kill_event`` (killed at once) is set, or, ``once``, the queue is drained; returns how
    many ran.  Raises :class:`QueueError` or ``ValidationError`` before any claim."""
    require_asyncio("run_worker")
    name = name or default_worker_name(config.gpus)
    worker = _Worker(store, config, stop_event or anyio.Event(), kill_event or anyio.Event(), name)
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


class _Worker(Runner):
    async def run(self, once: bool) -> int:
        await self._call(prepare_runs_dir, self.runs_dir)
        pid = os.getpid()
        register = partial(
            self.store.register_worker,
            host=self.host,
            pid=pid,
            pid_start=start_time_ticks(pid),
            alive=self._worker_alive,
        )
        await self._call(register, self.name)
        if self.devices:
            # For `workers` only: a worker that cannot record them now still runs.
            warning = f"worker {self.name}: its GPUs not recorded for `workers`"
            await self._or(None, warning, self.store.set_worker_gpus, self.name, self.devices)
        ran = 0
        try:
            async with anyio.create_task_group() as tg:
                if not once:  # a draining worker never waits for a job: nothing to hear
                    await tg.start(self.store.listen, lambda _: self.wake.set())
                _log.info(
                    "worker %s started on %s (pid %d, runs in %s)",
                    self.name,
                    self.host,
                    pid,
                    self.runs_dir,
                )
                tg.start_soon(self._beat)
                async with anyio.create_task_group() as jobs:
                    ending = (self.stop_event, self.kill_event, self.db_lost)
                    while not any(event.is_set() for event in ending):
                        # Fresh before the claim: a job submitted after it wakes the wait.
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
                            jobs.start_soon(self._run_claimed, job, await self._place(job, offer))
                            ran += 1
                            continue
                        if once and not self.running:
                            break
                        await self._idle()
                tg.cancel_scope.cancel()
        finally:
            with anyio.move_on_after(self.store.busy_timeout, shield=True):
                warning = f"worker {self.name}: could not record its stop"
                await self._or(None, warning, self.store.worker_stopped, self.name)
        _log.info("worker %s stopped after %d job(s)", self.name, ran)
        if self.db_lost.is_set():
            raise QueueDatabaseLostError(
                self.store.location,
                f"{self._db_lost_how} while worker {self.name} ran; it claimed no more jobs "
                "(start it again to serve the queue now at that path)",
            )
        return ran

    async def _idle(self) -> None:
        """Wait for a stop, a job's end, a wake-up or the poll (sooner while the database is
        away); with no room for another job, for a stop or a job's end only."""
        wait = self.settings.poll_seconds
        if self._unreachable:
            wait = min(wait, _UNAVAILABLE_RETRY_SECONDS)
        events = [self.stop_event, self.kill_event, self.job_done, self.db_lost]
        if self._unreachable or not self._full():
            events.append(self.wake)
        else:
            wait = math.inf
        with anyio.move_on_after(wait):
            async with anyio.create_task_group() as waits:
                for event in events:
                    waits.start_soon(_set_then_cancel, event, waits.cancel_scope)

    async def _offer(self) -> GpuOffer | None:
        """What this worker can give a job now (its free healthy GPUs), or None."""
        faults = await self._try("reading GPU faults", self.store.gpu_faults, self.host)
        if faults is None:
            return None
        faulted = {f.gpu for f in faults}
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
            # Its job sees every GPU of the host: a fault on any stops its claims.
            return None if self.running or faulted else GpuOffer()
        taken = faulted.union(*self.running.values())
        free = [gpu for gpu in self.devices if gpu not in taken]
        names = tuple(f"{self.host}:{gpu}" for gpu in free)
        return GpuOffer(len(free), not self.running, names) if free else None

    def _full(self) -> bool:
        """Whether every job this worker can run at once is running (a faulted GPU is not
        busy: once cleared, it takes a job at once)."""
        busy = {gpu for devices in self.running.values() for gpu in devices}
        return bool(self.running) and all(gpu in busy for gpu in self.devices)

    async def _place(self, job: Job, offer: GpuOffer | None) -> list[str]:
        """The GPUs a claimed job runs on (none for a worker without GPUs)."""
        devices: list[str] = []
        if self.devices and offer is not None:
            free = [name.split(":")[-1] for name in offer.names]
            plan = await self._or(Plan(), None, self.store.plan, job.id)
            devices = pick_gpus(plan.gpus, free, plan.avoid, self.host)
            await self._or(None, None, self.store.record_attempt_gpus, job.id, job.attempt, devices)
        self.running[job.id] = devices
        if self.metrics is not None:
            self.metrics.current_job, self.metrics.current_attempt = job.id, job.attempt
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
                lost = await self._call(self.store.file_lost)
                if lost is not None and not self.db_lost.is_set():
                    self._file_lost(lost)
                await self._call(self.store.worker_heartbeat, self.name)
                if self.metrics is not None:
                    self.metrics.heartbeat_at = time.time()
                    self.metrics.queue_jobs = await self._call(self.store.count_by_status)
            except UNAVAILABLE as exc:
                self._lost_database("worker heartbeat", exc)
            else:
                self._reached_database()
            await anyio.sleep(self.settings.poll_seconds)

    def _file_lost(self, how: str) -> None:
        """The database's file left its path: say so, claim no more, let running jobs end."""
        self._db_lost_how = how
        jobs = "".join(
            f"; job {job_id} runs on under supervision until it ends (its artifact stays in "
            f"{self.runs_dir / str(job_id)})"
            for job_id in self.running
        )
        _log.error(
            "worker %s: the queue database %s %s: claiming no more jobs%s; the worker then exits",
            self.name,
            self.store.location,
            how,
            jobs,
        )
        self.db_lost.set()

    async def _claim(self, fits: float | None, offer: GpuOffer) -> Job | None:
        claim = partial(self.store.claim, max_duration=fits, offer=offer)
        job = await self._try("claim", claim, self.name, self.host, self.runs_dir)
        if job is not None:
            _log.info("job %d claimed (attempt %d)", job.id, job.attempt)
        return job

    async def _deliver_spool(self) -> None:
        """Deliver final writes kept while the database was away (fenced like any other)."""
        late = (
            f"final status delivered late, from the spool on {self.host}: the database was "
            "unavailable when the attempt ended"
        )
        for path, entry in await self._call(pending, self.runs_dir):
            note = "; ".join(n for n in (entry.note, late) if n)
            try:
                written = await self._deliver(dataclasses.replace(entry, note=note))
            except UNAVAILABLE as exc:
                self._lost_database("delivering a spooled outcome", exc)
                return
            await self._call(partial(path.unlink, missing_ok=True))
            if written:
                what = f"outcome {entry.outcome.status} delivered from the spool"
            else:
                what = "spooled outcome dropped: the job was taken over meanwhile"
            _log.warning("job %d attempt %d: %s", entry.job_id, entry.attempt, what)

    # --- orphans -------------------------------------------------------------------------

    async def _sweep_orphans(self) -> None:
        try:
            running = await self._call(self.store.running)
            now = await self._call(self.store.now)
        except UNAVAILABLE as exc:
            self._lost_database("looking for orphans", exc)
            return
        for job, holder in running:
            mine = job.worker == self.name
            if job.id in self.running and mine:
                continue  # its own, heartbeating beside this loop
            silent = (
                job.heartbeat_at is None
                or now - job.heartbeat_at > self.settings.orphan_after_seconds
            )
            # Its own name on a job it is not running: left by a dead worker of that name.
            gone = (
                holder is not None
                and holder.host == self.host
                and holder.name != self.name
                and not process_alive(holder.pid, holder.pid_start)
            )
            if silent or mine or gone:
                await self._resolve_orphan(job)

    async def _resolve_orphan(self, job: Job) -> None:
        warning = f"job {job.id}: could not take the orphan over"
        if not await self._or(False, warning, self.store.take_over, job, self.name):
            return
        _log.warning(
            "job %d attempt %d: orphan of worker %s; taken over", job.id, job.attempt, job.worker
        )
        output_path = Path(job.artifact) if job.artifact else None
        artifact = await self._call(read_artifact, output_path) if output_path else None
        note = None
        if job.host == self.host:
            log = output_path.parent / "train.log" if output_path else None
            wait = self.settings.kill_wait_seconds
            args = (self.store.location, job.id, job.attempt, log, wait)
            killed = await self._call(kill_leftovers, *args)
            if killed:
                _log.warning(
                    "job %d: killed %d unsupervised process(es): %s", job.id, len(killed), killed
                )
        else:
            # Process ids mean nothing on another host: what is left there is not ours to kill.
            note = (
                f"orphan taken over by worker {self.name} on {self.host}; the attempt ran on "
                f"{job.host}, whose processes were not touched from {self.host}"
            )
            _log.warning("job %d: %s", job.id, note)
        cancel = await self._cancel_requested(job)
        if artifact is not None and output_path is not None:
            stop_cause = (artifact.get("stop") or {}).get("cause")
            state = _JobState(stopping=stop_cause in ("requested", "cancelled"))
            masker = Masker(secret_values(self._environment(job, self.runs_dir / str(job.id))))
            outcome = self._outcome(artifact, None, state, cancel, masker, output_path.parent)
        else:
            heartbeat = "never"
            if job.heartbeat_at:
                heartbeat = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.heartbeat_at))
            outcome = Outcome(
                CANCELLED if cancel else FAILED,
                None,
                ORPHANED,
                f"worker {job.worker} went silent (last heartbeat {heartbeat}) before the "
                "attempt finished; its outcome is lost",
            )
        await self._finish(job, outcome, artifact, note)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
