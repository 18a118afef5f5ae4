"""One attempt of a job, in ``<runs>/<id>/attempts/<k>/``: run it under ``run_soak`` beside a
heartbeat that turns a cancellation, a lost fence or the worker's stop into a stop request,
then write its final status (retried while the database is away, then spooled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import socket
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio

from .._contract import (
    VERSION,
    BlockingCallTimeout,
    Masker,
    SoakFailureError,
    ValidationError,
    argv_secrets,
    require_asyncio,
    run_blocking,
    secret_values,
)
from .._export import Metrics, WorkerMetrics
from .._supervisor import SOAK_LIMITS, OutputLocationError, SoakControl, StopMode, run_soak
from ..trainer import Job
from ._goodput import earlier_highest_step, read_artifact
from ._kept import SpoolEntry, carried_limit, remember_limit
from ._models import QueueUnavailableError, artifact_summary
from ._settings import WorkerConfig
from ._status import (
    CANCELLED,
    FAILED,
    GPU_FAULT,
    INTERRUPTED,
    INVALID_JOB,
    MONITOR_ERROR,
    WORKER_CANCELLED,
    Outcome,
    outcome_from_artifact,
    tail,
)
from ._store import JobStore

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

#: A store call that failed for now (database away, lock held too long, call abandoned).
UNAVAILABLE = (QueueUnavailableError, BlockingCallTimeout)
#: ``run_worker``'s and ``run_job``'s status for an attempt this worker lost to fencing.
LOST = "lost"
#: A store call is abandoned past this many busy timeouts (plus 10 s): its disk is hung.
STORE_CALL_TIMEOUT_FACTOR = 4

_log = logging.getLogger("asyncsoak.queue")
_PLACEHOLDER = re.compile(r"\{(job_id|db|run_dir)\}")
_T = TypeVar("_T")
_F = TypeVar("_F")


@dataclasses.dataclass(slots=True)
class _JobState:
    stopping: bool = False
    lost: bool = False
    killed: bool = False


def default_worker_name(gpus: str | None = None) -> str:
    """``host:gpuN`` for a worker bound to GPUs (stable across restarts), else ``host:pid``."""
    host = socket.gethostname()
    return f"{host}:gpu{gpus}" if gpus else f"{host}:{os.getpid()}"


async def run_job(
    store: JobStore,
    job: Job,
    config: WorkerConfig,
    *,
    stop_event: anyio.Event | None = None,
    name: str | None = None,
) -> str:
    """Run one claimed job under ``run_soak`` and write its final status; returns the
    attempt's outcome, or ``lost`` when another worker took the job over (nothing written)."""
    require_asyncio("run_job")
    name = name or job.worker or default_worker_name()
    runner = Runner(store, config, stop_event or anyio.Event(), anyio.Event(), name)
    return await runner.run_job(job)


class Runner:
    """What runs a worker's attempts: its store calls (bounded, on its own threads), the
    attempt itself, and its final write."""

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
        self.runs_dir = (settings.runs_dir or store.default_runs_dir()).absolute()
        self.stop_event = stop_event
        self.kill_event = kill_event
        self.name = name
        self.host = socket.gethostname()
        self.devices = gpu_list(settings.gpus)
        # One thread for the loop, one for the worker's heartbeat, one for each job it may run
        # at once: no job's heartbeat waits behind a slow call and goes stale.
        self.limiter = anyio.CapacityLimiter(2 + max(1, len(self.devices)))
        #: Set by ``run_worker`` when the worker serves metrics.
        self.metrics: WorkerMetrics | None = None
        self.registry: CollectorRegistry | None = None
        self._unreachable = False
        # The worker's (``_worker.py``): the jobs running, each with its GPUs.
        self.running: dict[int, list[str]] = {}
        self.job_done = anyio.Event()
        self.wake = anyio.Event()
        #: Set when the database's file left its path (``file_lost``): claim no more.
        self.db_lost = anyio.Event()
        self._db_lost_how = ""
        self._faulted: set[str] = set()
        # A store call waits at most the busy timeout for a lock (or a connection attempt);
        # past a generous multiple of it the database's disk or network is hung, and the call
        # is abandoned: the caller treats the database as unavailable.
        self._call_timeout = STORE_CALL_TIMEOUT_FACTOR * store.busy_timeout + 10.0
        per_try = self._call_timeout + settings.finish_retry_wait_seconds
        #: The longest a final write may take, all its retries and a kill's wait included.
        self._finish_bound = settings.finish_retries * per_try + settings.kill_wait_seconds

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        what = f"the queue store call {getattr(fn, '__name__', 'call')}"
        return await run_blocking(
            fn, *args, timeout=self._call_timeout, what=what, limiter=self.limiter
        )

    async def _or(
        self, fallback: _F, warning: str | None, fn: Callable[..., _T], *args: Any
    ) -> _T | _F:
        """A store call, or ``fallback`` while it fails for now (``warning`` says so)."""
        try:
            return await self._call(fn, *args)
        except UNAVAILABLE as exc:
            if warning is not None:
                _log.warning("%s: %s", warning, exc)
            return fallback

    async def _try(self, doing: str, fn: Callable[..., _T], *args: Any) -> _T | None:
        """A store call, or None (said once, see :meth:`_lost_database`) while it fails."""
        try:
            result = await self._call(fn, *args)
        except UNAVAILABLE as exc:
            self._lost_database(doing, exc)
            return None
        self._reached_database()
        return result

    def _lost_database(self, doing: str, exc: BaseException) -> None:
        """Log a failed store call: a warning when the database goes away, then quiet."""
        if self._unreachable:
            _log.debug("worker %s: %s: %s", self.name, doing, exc)
            return
        self._unreachable = True
        _log.warning(
            "worker %s: the queue database is unavailable (%s: %s); running jobs stay "
            "supervised, retrying with backoff",
            self.name,
            doing,
            exc,
        )

    def _reached_database(self) -> None:
        if self._unreachable:
            self._unreachable = False
            _log.warning("worker %s: the queue database is back", self.name)

    async def _learned_limit(
        self, job: Job, artifact: dict[str, Any] | None = None
    ) -> float | None:
        """``--stale-progress auto``: before the soak, the limit earlier runs of a job of the
        same name learned; after it (``artifact`` given), keep what this one learned."""
        if job.soak.get("stale_progress_seconds") != "auto":
            return None
        try:
            if artifact is not None:
                await self._call(remember_limit, self.runs_dir, job.name, artifact)
                return None
            return await self._call(carried_limit, self.runs_dir, job.name)
        except (OSError, BlockingCallTimeout) as exc:
            _log.warning("job %d: the learned stale limit: %s", job.id, exc)
            return None

    async def _earlier_highest_step(self, job: Job) -> int | None:
        """The highest step the job's earlier attempts reached: this one's steps at or below
        it are redone (its ledger's ``wasted``); None when unknown."""
        warning = f"job {job.id}: the earlier attempts' steps"
        attempts = await self._or(None, warning, self.store.attempts, job.id)
        if attempts is None:
            return None
        earlier = [a for a in attempts if a.attempt < job.attempt]
        return await self._or(None, warning, earlier_highest_step, earlier)

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
        gpus = gpu_list(env.get("CUDA_VISIBLE_DEVICES"))  # for its artifact's GPU-hours
        metadata = {
            "job_id": job.id,
            "job_name": job.name,
            "attempt": job.attempt,
            "worker": self.name,
            "host": self.host,
            **({"gpus": gpus} if gpus else {}),
        }
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._supervise, job, control, state)
                try:
                    await self._call(partial(attempt_dir.mkdir, 0o700, True, True))
                    carried = await self._learned_limit(job)
                    _check_settings_known(job)
                    earlier = await self._earlier_highest_step(job)
                    soaked = await run_soak(
                        command=self._command(job, run_dir),
                        progress_dir=Path(job.progress_dir) if job.progress_dir else run_dir,
                        # Every attempt's monitor writes there: none of it is this one's progress.
                        progress_exclude=[run_dir / "attempts"],
                        output_path=output_path,
                        cwd=Path(job.cwd) if job.cwd else None,
                        env=env,
                        metadata=metadata,
                        stop_mode=cast("StopMode", job.stop_mode),
                        control=control,
                        log_path=attempt_dir / "train.log",
                        nvidia_smi=self.settings.nvidia_smi,
                        kill_wait_seconds=self.settings.kill_wait_seconds,
                        **job.soak,
                        stale_progress_carried_seconds=carried,
                        earlier_highest_step=earlier,
                        metrics=None if self.registry is None else Metrics(registry=self.registry),
                    )
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
            with anyio.move_on_after(self._finish_bound, shield=True):
                if not state.lost:
                    saved = await self._call(read_artifact, output_path)
                    cancel = await self._cancel_requested(job)
                    outcome = self._outcome(saved, None, state, cancel, masker, attempt_dir)
                    await self._finish(job, outcome, saved)
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
        await self._finish(job, outcome, artifact, note)
        reason = f" ({outcome.reason})" if outcome.reason else ""
        _log.info("job %d attempt %d: %s%s", job.id, job.attempt, outcome.status, reason)
        return outcome.status

    async def _take_out_faulted(
        self, job: Job, artifact: dict[str, Any] | None, devices: Sequence[str] | None
    ) -> str | None:
        """After an attempt that failed ``gpu_fault``: take the GPU it names (else every GPU
        the job had) out of service on this host; the note saying so, or None."""
        failures = (artifact or {}).get("failures") or []
        faults = [f for f in failures if isinstance(f, dict) and f.get("reason") == GPU_FAULT]
        if not faults:
            return None
        owned = self.devices if devices is None else list(devices)
        gpus = faulted_gpus(artifact, owned) or ["all"]
        record = partial(
            self.store.record_gpu_fault,
            worker=self.name,
            job_id=job.id,
            attempt=job.attempt,
            detail=str(faults[0].get("message")),
        )
        try:
            await self._call(record, self.host, gpus)
        except UNAVAILABLE as exc:
            _log.warning("job %d: GPU fault not recorded: %s", job.id, exc)
            return None
        listed = ",".join(gpus)
        clear = f"asyncsoak worker --clear-fault {listed}"
        _log.warning(
            "job %d: GPU %s of %s out of service after a fault; clear it with %s",
            job.id,
            listed,
            self.host,
            clear,
        )
        return f"GPU {listed} of {self.host} taken out of service after this fault, until {clear}"

    async def _cancel_requested(self, job: Job) -> bool:
        return await self._or(job.cancel_requested, None, self.store.cancel_requested, job.id)

    @staticmethod
    def _outcome(
        artifact: dict[str, Any] | None,
        problem: BaseException | None,
        state: _JobState,
        cancel_requested: bool,
        masker: Masker,
        attempt_dir: Path,
    ) -> Outcome:
        status = CANCELLED if cancel_requested else FAILED
        if artifact is not None:
            outcome = outcome_from_artifact(
                artifact,
                cancel_requested=cancel_requested,
                stopping=state.stopping,
                killed_by_worker=state.killed,
                log_tail=tail(attempt_dir / "train.log"),
            )
        elif problem is None:  # the worker was cancelled before the soak wrote its artifact
            status = CANCELLED if cancel_requested else INTERRUPTED
            outcome = Outcome(status, None, WORKER_CANCELLED, None)
        elif isinstance(problem, ValidationError) and not isinstance(problem, OutputLocationError):
            outcome = Outcome(status, None, INVALID_JOB, f"the job cannot run: {problem}")
        else:
            detail = f"the monitor could not run the attempt: {problem!r}"
            outcome = Outcome(status, None, MONITOR_ERROR, detail)
        # The secrets in its error masked.
        return dataclasses.replace(outcome, error=outcome.error and masker(outcome.error))

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
        env = {**os.environ, **job.env}
        gpus = self.settings.gpus if devices is None else ",".join(devices)
        if gpus:
            env.update(CUDA_VISIBLE_DEVICES=gpus, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        env["ASYNCSOAK_JOB_ID"] = str(job.id)
        env.update(self.store.child_environment())
        env.update(
            ASYNCSOAK_RUN_DIR=str(run_dir),
            ASYNCSOAK_ATTEMPT=str(job.attempt),
            ASYNCSOAK_STOP_MODE=job.stop_mode,
        )
        return env

    async def _supervise(self, job: Job, control: SoakControl, state: _JobState) -> None:
        """Heartbeat the job, and turn cancellation, fencing and worker stop into a stop."""
        settings = self.settings
        cancel_deadline: float | None = None
        while True:
            try:
                cancel = await self._call(self.store.heartbeat, job.id, job.attempt, self.name)
            except UNAVAILABLE as exc:
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
                cancel_deadline = now + settings.cancel_grace_seconds
                _log.info(
                    "job %d: cancel requested; stopping it in %.0fs unless it stops itself",
                    job.id,
                    settings.cancel_grace_seconds,
                )
            if cancel_deadline is not None and now >= cancel_deadline:
                control.request_stop(
                    reason="cancel requested", grace_seconds=settings.stop_timeout_seconds
                )
            stop_now = self.kill_event.is_set()
            if (self.stop_event.is_set() or stop_now) and not state.stopping:
                state.stopping = True
                control.request_stop(
                    reason="worker stopping", grace_seconds=settings.stop_timeout_seconds
                )
            if stop_now and not state.killed and control.pid is not None:
                state.killed = True
                # The reaper starts the command as a session leader: its group is the tree.
                with contextlib.suppress(OSError):
                    os.killpg(control.pid, signal.SIGKILL)
                _log.warning("job %d: killed its process group at once", job.id)
            wake = now + settings.poll_seconds
            if cancel_deadline is not None and not control.stop_requested.is_set():
                wake = min(wake, cancel_deadline)
            with anyio.move_on_after(wake - now):
                if state.killed:
                    await anyio.sleep_forever()
                await (self.kill_event if state.stopping else self.stop_event).wait()

    async def _finish(
        self,
        job: Job,
        outcome: Outcome,
        artifact: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> None:
        """Write the final status (shielded, bounded), retrying while the database is
        unavailable, then keeping it in the spool for later delivery; warns, never raises."""
        entry = SpoolEntry(
            job.id, job.attempt, self.name, outcome, artifact_summary(artifact), note
        )
        retries = self.settings.finish_retries
        with anyio.move_on_after(self._finish_bound, shield=True):
            for attempt in range(1, retries + 1):
                try:
                    written = await self._deliver(entry)
                except UNAVAILABLE as exc:
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
                except Exception as exc:  # never raise from here: the job becomes an orphan
                    _log.warning("job %d: final status not written: %r", job.id, exc)
                    return
                if not written:
                    _log.warning(
                        "job %d attempt %d: final status refused: another worker holds it now",
                        job.id,
                        job.attempt,
                    )
                elif self.metrics is not None:
                    self.metrics.outcome(outcome.status, outcome.reason)
                return
            try:
                path = await self._call(entry.keep, self.runs_dir)
            except OSError as exc:
                _log.warning(
                    "job %d: final status neither written nor spooled (%s); it will be handled "
                    "as an orphan",
                    job.id,
                    exc,
                )
            else:
                _log.warning(
                    "job %d: final status kept in %s; a worker on this host delivers it when "
                    "the database is back",
                    job.id,
                    path,
                )

    async def _deliver(self, entry: SpoolEntry) -> bool:
        """One fenced final write (False: another worker holds the attempt now)."""
        finish = partial(self.store.finish, backoff=self.settings.retry_backoff_seconds)
        e = entry
        return await self._call(finish, e.job_id, e.attempt, e.worker, e.outcome, e.summary, e.note)


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

    for failure in (artifact or {}).get("failures") or []:
        if isinstance(failure, dict) and failure.get("reason") == GPU_FAULT:
            name(failure.get("gpu"))
    if not named:
        for health in ((artifact or {}).get("gpu_health") or {}).values():
            faults = health.get("faults") if isinstance(health, dict) else None
            if any(isinstance(f, dict) and f.get("fails") and f.get("used") for f in faults or []):
                name(health)
    return named or list(devices)


def _check_settings_known(job: Job) -> None:
    """A job that sets what this worker does not know (submitted by a newer asyncsoak on a
    mixed fleet) cannot run here: a :class:`ValidationError` naming the setting."""
    unknown = sorted(set(job.soak) - set(SOAK_LIMITS))
    if unknown:
        raise ValidationError(
            f"the job sets {', '.join(map(repr, unknown))}, which this worker (asyncsoak "
            f"{VERSION}) does not know: a newer asyncsoak submitted it; upgrade the worker"
        )
