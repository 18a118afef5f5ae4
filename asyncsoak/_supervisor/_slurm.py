"""Soaks inside a SLURM job (and a pod: :class:`SoakJob`, :func:`expand_path`): who the job is,
a grace kept under ``KillWait`` and the job's end, requeues.  More: docs/slurm.md."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .._contract import (
    BlockingCallTimeout,
    EventSink,
    StopCause,
    ValidationError,
    events,
    exits,
    parse_iso,
    run_blocking,
)
from .._process import Spawner, run_command_sync
from . import _kubernetes
from ._config import SoakConfig

#: Set in every process of a SLURM job: the sign that the soak runs inside one.
JOB_VARIABLE = "SLURM_JOB_ID"
#: SLURM's default ``KillWait``, assumed when ``scontrol`` cannot say.
SLURM_DEFAULT_KILL_WAIT_SECONDS = 30.0
#: Bound on each ``scontrol`` query (it answers in milliseconds from a healthy controller).
SCONTROL_TIMEOUT_SECONDS = 5.0
#: Bound on the two queries of :func:`scheduler_snapshot` together.
SNAPSHOT_TIMEOUT_SECONDS = 2 * SCONTROL_TIMEOUT_SECONDS + 1.0
#: Bound on ``scontrol requeue``.
REQUEUE_TIMEOUT_SECONDS = 10.0
#: Kept free below ``KillWait`` for the SIGKILL, the reap and the artifact: this much plus a
#: tenth of ``KillWait``.
KILL_WAIT_MARGIN_SECONDS = 3.0
#: How long before the job's end time, on top of the grace, the soak stops by itself.
END_TIME_MARGIN_SECONDS = 10.0
#: ``stop.cause`` of a stop by the scheduler (SIGTERM, the end time).
CAUSE_SCHEDULER = StopCause.SCHEDULER

#: ``snapshot.scheduler`` key → the variable SLURM sets; integers where SLURM's are.
_IDENTITY: tuple[tuple[str, str, bool], ...] = (
    ("job_id", "SLURM_JOB_ID", True),
    ("array_job_id", "SLURM_ARRAY_JOB_ID", True),
    ("array_task_id", "SLURM_ARRAY_TASK_ID", True),
    ("step_id", "SLURM_STEP_ID", True),
    ("job_name", "SLURM_JOB_NAME", False),
    ("node", "SLURMD_NODENAME", False),
    ("node_list", "SLURM_JOB_NODELIST", False),
    ("num_nodes", "SLURM_JOB_NUM_NODES", True),
    ("num_tasks", "SLURM_NTASKS", True),
    ("rank", "SLURM_PROCID", True),
    ("local_rank", "SLURM_LOCALID", True),
    ("node_rank", "SLURM_NODEID", True),
    ("restart_count", "SLURM_RESTART_COUNT", True),
    ("partition", "SLURM_JOB_PARTITION", False),
    ("account", "SLURM_JOB_ACCOUNT", False),
    ("qos", "SLURM_JOB_QOS", False),
    ("cluster", "SLURM_CLUSTER_NAME", False),
    ("gpus", "SLURM_JOB_GPUS", False),
)


def in_job(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process (or one with ``env``) runs inside a SLURM job."""
    return bool((os.environ if env is None else env).get(JOB_VARIABLE))


def job_identity(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The job as its environment describes it, or None outside a SLURM job."""
    environ = os.environ if env is None else env
    if not in_job(environ):
        return None
    out: dict[str, Any] = {"kind": "slurm"}
    for key, variable, integer in _IDENTITY:
        value = environ.get(variable) or (0 if key == "restart_count" else None)
        out[key] = int(value) if integer and isinstance(value, str) and value.isdigit() else value
    return out


def scheduler_snapshot() -> dict[str, Any] | None:
    """``snapshot.scheduler``: the identity plus ``KillWait`` and the job's end time (blocking:
    two ``scontrol`` calls); what they cannot tell is None, why in ``errors``."""
    identity = job_identity()
    if identity is None:
        return None
    errors: list[str] = []
    identity.update(kill_wait_seconds=None, end_time=None, end_time_epoch=None, time_limit=None)
    timeout = SCONTROL_TIMEOUT_SECONDS
    config = run_command_sync(["scontrol", "show", "config"], timeout=timeout)
    if config.ok:
        identity["kill_wait_seconds"] = parse_kill_wait(config.output)
    else:
        errors.append(f"scontrol show config: {config.describe()}")
    job = run_command_sync(
        ["scontrol", "-o", "show", "job", str(identity["job_id"])], timeout=timeout
    )
    if job.ok:
        fields = parse_fields(job.output)
        identity["time_limit"] = fields.get("TimeLimit")
        end = parse_time(fields.get("EndTime"))
        if end is not None:
            identity["end_time"] = end.isoformat()
            identity["end_time_epoch"] = end.timestamp()
        for key, name in (("partition", "Partition"), ("account", "Account"), ("qos", "QOS")):
            value = fields.get(name)
            if identity[key] is None and value and value != "(null)":
                identity[key] = value
    else:
        errors.append(f"scontrol show job: {job.describe()}")
    identity["errors"] = errors
    return identity


def parse_kill_wait(config_text: str) -> float | None:
    """``KillWait = 30 sec`` from ``scontrol show config``."""
    match = re.search(r"^KillWait\s*=\s*(\d+)", config_text, re.MULTILINE)
    return float(match.group(1)) if match else None


def parse_fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of ``scontrol -o show job`` (values never hold spaces there); the
    first of a key wins."""
    pairs = reversed([item.partition("=") for item in text.split()])
    return {key: value for key, sep, value in pairs if sep}


def parse_time(text: str | None) -> datetime | None:
    """SLURM's local ``2026-12-01T07:43:56`` (``Unknown``/``None`` for none), made aware."""
    if not text or not text[:1].isdigit():
        return None
    try:
        return parse_iso(text).astimezone()
    except ValueError:
        return None


def kill_wait_of(scheduler: Mapping[str, Any] | None) -> float:
    """``KillWait`` of the job's cluster, or SLURM's default when it is not known."""
    value = None if scheduler is None else scheduler.get("kill_wait_seconds")
    return float(value) if isinstance(value, int | float) else SLURM_DEFAULT_KILL_WAIT_SECONDS


def stop_grace(grace: float, scheduler: Mapping[str, Any] | None) -> float:
    """The grace after the scheduler's SIGTERM: short enough that asyncsoak ends the tree and
    writes the artifact before the scheduler's SIGKILL."""
    kill_wait = kill_wait_of(scheduler)
    margin = KILL_WAIT_MARGIN_SECONDS + kill_wait / 10
    return max(0.0, min(grace, kill_wait - margin))


def seconds_until_end_stop(
    scheduler: Mapping[str, Any] | None, grace: float, now: float | None = None
) -> float | None:
    """Seconds from ``now`` until the soak stops before the job's end time, leaving the grace
    and a margin; None when the end time is not known."""
    end = None if scheduler is None else scheduler.get("end_time_epoch")
    if not isinstance(end, int | float) or not math.isfinite(end):
        return None
    current = time.time() if now is None else now
    return max(0.0, end - (grace + END_TIME_MARGIN_SECONDS) - current)


_PATTERN = re.compile(r"%(.)")


class PatternError(ValidationError):
    """A ``%`` pattern in a path that the scheduler's environment cannot fill."""


def expand_path(
    path: Path, env: Mapping[str, str] | None = None, *, restart_suffix: bool = False
) -> Path:
    """The scheduler's filename patterns in ``path`` (docs/slurm.md): SLURM's ``%j %A %a %N %t
    %r %%``, a pod's (:func:`_kubernetes.pattern_values`); as written outside both.  With
    ``restart_suffix``, a requeued run's path without ``%r`` gets ``.restartN`` before its
    suffix, so the artifact of the run before it is kept."""
    environ = os.environ if env is None else env
    if in_job(environ):
        job = environ[JOB_VARIABLE]
        values: dict[str, str | None] = {
            "j": job,
            "A": environ.get("SLURM_ARRAY_JOB_ID") or job,
            "a": environ.get("SLURM_ARRAY_TASK_ID") or "0",
            "N": environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0],
            "t": environ.get("SLURM_PROCID") or "0",
            "r": environ.get("SLURM_RESTART_COUNT") or "0",
            "%": "%",
        }
        where = ""
    elif _kubernetes.in_pod(environ):
        # A retried pod is a new pod with a new name: %p keeps each attempt's artifact.
        values, where = _kubernetes.pattern_values(environ), " in a pod"
    else:
        return path
    text = str(path)

    def fill(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter not in values:
            known = " ".join(f"%{k}" for k in values if k != "%")
            raise PatternError(
                f"{path}: unknown pattern %{letter}{where} (known: {known}, %% for a %)"
            )
        value = values[letter]
        if value is None:
            raise PatternError(
                f"{path}: %{letter} needs {_kubernetes.PATTERN_NEEDS[letter]}{where}"
            )
        return value

    expanded = Path(_PATTERN.sub(fill, text))
    restart = values.get("r") or "0"
    restarts = int(restart) if restart.isdigit() else 0
    if restart_suffix and restarts > 0 and "%r" not in text:
        expanded = expanded.with_name(f"{expanded.stem}.restart{restarts}{expanded.suffix}")
    return expanded


async def relay_signals(
    sink: EventSink, spawner: Spawner, cfg: SoakConfig, on_requeue: Callable[[], None]
) -> None:
    """Pass each signal of ``forward_signals`` the monitor receives on to the command (its
    group, or its leader in stop modes ``leader`` and ``stdin``); ``requeue_on`` then ends the
    soak as ``requeued``.  Signal handlers belong to the main thread: run the soak there."""
    requeue_on = cfg.requeue_on
    numbers = [*cfg.forward_signals, *([] if requeue_on is None else [requeue_on])]
    wanted = [signal.Signals(n) for n in dict.fromkeys(numbers)]

    async def relay(signum: int) -> None:
        pids = spawner.tree_pids()
        # The requeue signal is the monitor's graceful request; a forwarded warning is not a
        # stop, and a trainer that dies of it has failed.
        stopping = signum == requeue_on
        if cfg.stop_mode == "group":
            sent, target = spawner.signal_group(signum, stopping=stopping), "group"
        else:
            sent, target = spawner.signal_leader(signum, stopping=stopping), "leader"
        name = exits.signal_name(signum)
        await sink.emit(
            events.SignalForwarded(
                t=sink.elapsed(), signal=name, target=target, pids=pids, sent=sent
            )
        )
        if stopping:
            on_requeue()

    with anyio.open_signal_receiver(*wanted) as received:
        while _early_signals:
            signum = _early_signals.pop(0)
            if signum in wanted:
                await relay(signum)
        async for signum in received:
            await relay(signum)


#: Signals that arrived before the soak could pass them on (see :func:`catch_early`).
_early_signals: list[int] = []


def catch_early(signals: Sequence[int]) -> None:
    """Hold the signals to forward from now on (main thread), so that one arriving while the
    monitor starts does not end it; the soak forwards them once the command runs (exec resets
    a handled signal in the command)."""
    for sig in signals:
        signal.signal(sig, lambda signum, frame: _early_signals.append(signum))


def _requeue(job_id: str) -> subprocess.CompletedProcess[str]:
    """``scontrol requeue`` is a process of the job it requeues: it ignores SLURM's SIGTERM to
    the job (an ignored signal stays ignored across exec) to live to say it was done."""
    try:
        return subprocess.run(
            ["scontrol", "requeue", job_id],
            capture_output=True,
            text=True,
            timeout=REQUEUE_TIMEOUT_SECONDS,
            preexec_fn=_ignore_sigterm,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            ["scontrol"], -1, "", f"no answer within {REQUEUE_TIMEOUT_SECONDS:g}s"
        )
    except OSError as exc:
        return subprocess.CompletedProcess(["scontrol"], -1, "", f"cannot run scontrol: {exc}")


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class SoakJob:
    """One soak's view of the scheduler's job it runs in: its facts once queried, and the
    tasks that act on them (signal forwarding, the stop before the job's end, the requeue)."""

    def __init__(self, cfg: SoakConfig, limiter: anyio.CapacityLimiter) -> None:
        self.cfg = cfg
        self._limiter = limiter
        #: ``snapshot.scheduler`` once known (None outside a scheduler's job).
        self.facts: dict[str, Any] | None = None
        #: Set once ``facts`` is known, or known to stay missing.
        self.known = anyio.Event()

    async def query(self) -> None:
        """The SLURM job's facts or the pod's, under a deadline, before the rest of the
        snapshot: the stop needs them."""
        grace = self.cfg.scheduler_grace_seconds
        if in_job():
            read: Callable[[], dict[str, Any] | None] = scheduler_snapshot
            what, lost = "scontrol (the SLURM job's facts)", job_identity() or {}
        elif _kubernetes.in_pod():
            read = partial(_kubernetes.pod_identity, grace=grace)
            lost = {"kind": "kubernetes", "kill_wait_seconds": grace}
            what = "the pod's identity and cgroup limits"
        else:
            self.known.set()
            return
        try:
            self.facts = await run_blocking(
                read, timeout=SNAPSHOT_TIMEOUT_SECONDS, what=what, limiter=self._limiter
            )
        except BlockingCallTimeout as exc:
            self.facts = {**lost, "errors": [str(exc)]}
        if self.facts is not None and grace is not None:
            # A pod's grace is its kill wait already (pod_identity).
            self.facts["kill_wait_seconds"] = grace
        self.known.set()

    def start_tasks(
        self, tg: TaskGroup, sink: EventSink, spawner: Spawner, end: Callable[[StopCause], None]
    ) -> None:
        """Signal forwarding, and the stop before a scheduler's job runs out of time."""
        cfg = self.cfg
        if cfg.forward_signals or cfg.requeue_on is not None:
            tg.start_soon(relay_signals, sink, spawner, cfg, partial(end, StopCause.REQUEUED))
        if in_job():
            tg.start_soon(self._end_before_job_end, end)

    async def _end_before_job_end(self, end: Callable[[StopCause], None]) -> None:
        """Once the job's end time is known, stop the soak early enough for the trainer's
        grace and the artifact to fit before it."""
        await self.known.wait()
        delay = seconds_until_end_stop(self.facts, self.cfg.post_shutdown_grace_seconds)
        if delay is not None:
            await anyio.sleep(delay)
            end(CAUSE_SCHEDULER)

    async def requeue(self, sink: EventSink) -> None:
        """``scontrol requeue JOB`` under a deadline; SLURM's answer is a ``requeue`` event."""
        job_id = str((self.facts or {}).get("job_id") or os.environ.get(JOB_VARIABLE, ""))
        ok, returncode, message = False, None, "not inside a SLURM job: nothing to requeue"
        if job_id:
            try:
                result = await run_blocking(
                    _requeue, job_id, timeout=REQUEUE_TIMEOUT_SECONDS + 2, what="scontrol requeue"
                )
            except BlockingCallTimeout as exc:
                message = str(exc)
            else:
                ok, returncode = result.returncode == 0, result.returncode
                message = (result.stdout + result.stderr).strip()[-500:]
                if not ok and not message:
                    message = f"scontrol requeue exited with status {returncode}"
        await sink.emit(
            events.Requeued(
                t=sink.elapsed(), job_id=job_id, ok=ok, returncode=returncode, message=message
            )
        )


def allocation_gpus(env: Mapping[str, str] | None = None) -> str | None:
    """The GPUs SLURM gave the job (``CUDA_VISIBLE_DEVICES``, the step's, the job's), or None."""
    environ = os.environ if env is None else env
    for variable in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = environ.get(variable, "").strip()
        if value and value != "NoDevFiles":
            return value
    return None


def worker_name(identity: Mapping[str, Any], host: str) -> str:
    """``host:slurm<job>`` (``.<rank>`` when the job runs several tasks)."""
    name = f"{host}:slurm{identity['job_id']}"
    if isinstance(identity.get("num_tasks"), int) and identity["num_tasks"] > 1:
        name += f".{identity.get('rank') or 0}"
    return name


def seconds_left_for_jobs(
    until: float | None, stop_timeout: float, now: float | None = None
) -> float | None:
    """How long a job taken now may run before the allocation ends, leaving ``stop_timeout``
    and a margin; None when the end is not known."""
    if until is None:
        return None
    current = time.time() if now is None else now
    return until - current - stop_timeout - END_TIME_MARGIN_SECONDS
