"""Live metrics of a soak (and of a queue worker) in Prometheus' exposition formats.

A soak's metrics are folded from its own event stream: :class:`SoakMetrics` is one more
observer of the serializer, fed the same JSON form of each event that the journal and the
artifact get, so nothing is sampled twice.  At each scrape (or textfile write) it turns what
it folded into rows, which :mod:`._exposition` writes in the text and OpenMetrics formats (and
hands to a ``prometheus_client`` registry, the ``metrics`` extra, for a program that serves its
own).

Every soak metric carries a ``soak_id`` label: several soaks on one node write their textfiles
into one node_exporter directory, and their series must not collide.  Label sets are bounded:
one soak, a few GPUs, the known phases, statuses, samplers and clock event reasons; never a pid.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .._analysis import TREE_MEMORY_SERIES
from .._contract import (
    MAX_SECONDS,
    EventFold,
    EventKind,
    ExitedJson,
    FailureJson,
    FailureReason,
    FinishedJson,
    GpuFaultJson,
    GpuSampleJson,
    HeaderJson,
    ProgressJson,
    SampleJson,
    SamplerDegradedJson,
    SamplerRecoveredJson,
    SoakStatus,
    StartedJson,
    StepJson,
    StopJson,
    ValidationError,
    ValidationTypeError,
    epoch,
    redact_url_passwords,
    verdict_exit_code,
)
from .._process import RoleFold
from .._sampling import CLOCK_EVENT_REASONS
from ._exposition import Row, Sample, families

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

#: The soak's phases, exported one-hot as ``asyncsoak_soak_phase{phase}``.
PHASES = ("starting", "waiting_for_progress", "running", "stopping", "finished")
#: The artifact's statuses, exported one-hot as ``asyncsoak_soak_status{status}`` at the end.
SOAK_STATUSES = tuple(SoakStatus)
#: The samplers that may be degraded (``SamplerDegraded.sampler``).
SAMPLERS = ("proc", "gpu")
#: ``asyncsoak_soak_info``'s ``command`` label is cut to this many characters.
COMMAND_LABEL_MAX = 200
#: ``/healthz`` says 503 once no sample came for this many sample intervals ...
HEALTH_STALE_SAMPLES = 10
#: ... and never sooner than this (a liveness probe that fails restarts the container, and
#: with it the training: it must not fire on one slow tick of a loaded machine).
HEALTH_MIN_SECONDS = 60.0
MIB = 1024 * 1024
#: Seconds in an hour: the trends give slopes per hour, Prometheus wants base units.
HOUR = 3600.0
#: The trend series whose slope and projection become the memory metrics.
TREE_MEMORY_KEYS = tuple(key for key, _ in TREE_MEMORY_SERIES)

#: Ranks given a label of their own at most (a node runs a few; the label set stays bounded).
MAX_RANK_LABELS = 64

INSTALL_HINT = "live metrics need prometheus_client: pip install 'asyncsoak[metrics]'"


#: The events after which a textfile is written again (the others change what it says only
#: along with the next sample).
_CHANGES_TEXTFILE = frozenset(
    {
        EventKind.SAMPLE,
        EventKind.STARTED,
        EventKind.FINISHED,
        EventKind.FAILURE,
        EventKind.GPU_FAULT,
    }
)

#: The step event's figures exported as gauges: (metric, event key, help).
_STEP_METRICS = (
    ("asyncsoak_max_steps", "max_steps", "The training's total steps, when known."),
    (
        "asyncsoak_steps_per_second",
        "steps_per_second",
        "Training steps per second (over the last 30 s of advances).",
    ),
    ("asyncsoak_loss", "loss", "The newest finite training loss the trainer wrote."),
    (
        "asyncsoak_eta_seconds",
        "eta_seconds",
        "Seconds until max_steps at the current step rate, when both are known.",
    ),
)


class MetricsUnavailableError(ValidationError):
    """Metrics were asked for but ``prometheus_client`` is not installed."""

    def __init__(self) -> None:
        super().__init__(INSTALL_HINT)


def require_prometheus_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailableError() from None


@dataclass(frozen=True, slots=True)
class Metrics:
    """Where a soak's live metrics go (``run_soak(metrics=...)``).

    ``port``: serve ``/metrics`` over HTTP on ``address`` (loopback unless told otherwise) while
    the soak runs, and up to ``linger_seconds`` after it ends, until one scrape has read the
    final status.  ``textfile_dir``: write ``asyncsoak_<soak id>.prom`` there for
    node_exporter's textfile collector at every sample; at the end it holds the final status.
    ``registry``: also register the soak's metrics in this ``prometheus_client`` registry
    while the soak runs (a program that serves its own metrics, the queue worker).
    """

    port: int | None = None
    address: str = "127.0.0.1"
    textfile_dir: Path | None = None
    linger_seconds: float = 0.0
    registry: CollectorRegistry | None = field(default=None, compare=False)


def validate_metrics(metrics: object) -> Metrics | None:
    """Check ``run_soak``'s ``metrics`` argument; raises before anything starts."""
    if metrics is None:
        return None
    if not isinstance(metrics, Metrics):
        raise ValidationTypeError(
            f"metrics must be an asyncsoak Metrics, not {type(metrics).__name__}"
        )
    port = metrics.port
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ValidationTypeError("metrics port must be an int")
    if port is not None and not 1 <= port <= 65535:
        raise ValidationError(f"metrics port must be between 1 and 65535, got {port}")
    if not isinstance(metrics.address, str) or not metrics.address:
        raise ValidationError("metrics address must be a host name or IP address")
    linger = metrics.linger_seconds
    if isinstance(linger, bool) or not isinstance(linger, int | float) or not linger >= 0:
        raise ValidationError(f"metrics linger_seconds must be zero or more, got {linger!r}")
    if math.isinf(linger) or linger > MAX_SECONDS:
        raise ValidationError(
            f"metrics linger_seconds must be finite, at most {MAX_SECONDS:g} (a year)"
        )
    textfile_dir = metrics.textfile_dir
    if textfile_dir is not None:
        if not isinstance(textfile_dir, str | os.PathLike):
            raise ValidationTypeError("metrics textfile_dir must be a path")
        textfile_dir = Path(textfile_dir).absolute()
        if not textfile_dir.is_dir():
            raise ValidationError(f"metrics textfile directory is not a directory: {textfile_dir}")
        if not os.access(textfile_dir, os.W_OK | os.X_OK):
            raise ValidationError(f"metrics textfile directory is not writable: {textfile_dir}")
    if port is None and textfile_dir is None and metrics.registry is None:
        raise ValidationError("metrics needs a port, a textfile directory or a registry")
    require_prometheus_client()
    return Metrics(
        port=port,
        address=metrics.address,
        textfile_dir=textfile_dir,
        linger_seconds=float(linger),
        registry=metrics.registry,
    )


@dataclass(slots=True)
class _Gpu:
    uuid: str
    utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    throttle_reasons: list[str] | None = None
    tree_memory_bytes: float | None = None


class SoakMetrics:
    """One soak's metrics, folded from its events (an observer of the serializer).

    ``now`` is the monotonic clock the events' ``t`` is measured on (the header's
    ``monotonic_start`` lines them up); ``wall`` is the clock of the timestamps.
    """

    def __init__(
        self,
        soak_id: str,
        *,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        host: str | None = None,
    ) -> None:
        self.soak_id = soak_id
        self._now = now
        self._wall = wall
        self.host = host if host is not None else socket.gethostname()
        self.command = ""
        self.job_id = ""
        #: What a person calls the run (``asyncsoak_soak_info{job_name}``): the queue job's
        #: name, else SLURM's, else the program the command runs.
        self.job_name = ""
        #: The soak's start, ``2026-12-02T00:37:33Z`` (``asyncsoak_soak_info{started_at}``).
        self.started_at = ""
        #: Whether the header was folded: the info's labels are known (they never change
        #: after, so a dashboard's join on them never sees two titles for one soak).
        self.described = False
        self.monotonic_start: float | None = None
        self.started_epoch: float | None = None
        self.stale_limit: float | None = None
        self.startup_limit: float | None = None
        self.sample_interval: float | None = None
        self.started_t: float | None = None
        self.exited = False
        self.stopping = False
        self.status: SoakStatus | None = None
        #: The first failure's reason: the primary one.
        self.reason: FailureReason | None = None
        self.finished_t: float | None = None
        self.changes = 0
        self.last_progress_t: float | None = None
        #: The training steps, once the trainer wrote one (then they are the progress).
        self.step: int | None = None
        self.steps: Mapping[str, Any] = {}
        #: Whether the steps are the progress that counts (else the file changes still are).
        self.steps_count = False
        #: When the last sample was taken (Unix time): the monitor's heartbeat.
        self.last_sample_epoch: float | None = None
        #: ... and on the soak's own clock (seconds since its start), which /healthz ages.
        self.last_sample_t: float | None = None
        self.tree: dict[str, float | None] = {}
        #: The role of the tree's processes (a rank's workers share its rank), and each
        #: rank's CPU in the newest sample, in cores.
        self.roles = RoleFold()
        self.rank_cpu: dict[int, float] = {}
        self.gpus: dict[str, _Gpu] = {}
        self.degraded: dict[str, bool] = dict.fromkeys(SAMPLERS, False)
        #: (gpu index, uuid, Xid code) -> Xid errors seen; (gpu index, uuid) -> 1 once a fault
        #: that fails a run was seen on that GPU (0 for every other GPU sampled).
        self.xid_errors: dict[tuple[str, str, str], int] = {}
        self.gpu_faulted: dict[tuple[str, str], bool] = {}
        self.growth_bytes_per_second: float | None = None
        self.projected_exhaustion: float | None = None
        #: Called after each event that changes what a textfile should say.
        self.on_change: Callable[[], None] | None = None

    # -- folding -------------------------------------------------------------------------

    _fold: ClassVar[EventFold[SoakMetrics]] = EventFold()

    def observe(self, event: Mapping[str, Any]) -> None:
        """Fold one event in its JSON form (as the journal holds it)."""
        folded = self._fold.dispatch(self, event)
        if folded and self.on_change is not None and event["kind"] in _CHANGES_TEXTFILE:
            self.on_change()

    @_fold.on(EventKind.HEADER)
    def _on_header(self, t: float, event: HeaderJson) -> None:
        self.monotonic_start = _number(event.get("monotonic_start"))
        self.started_epoch = epoch(event.get("started_at"))
        config = event.get("config") or {}
        self.stale_limit = _number(config.get("stale_progress_seconds"))
        self.startup_limit = _number(config.get("startup_timeout_seconds"))
        self.sample_interval = _number(config.get("sample_interval_seconds"))
        command = event.get("command") or []
        # One line: an inline script's newlines make a label no dashboard can show.
        self.command = " ".join(" ".join(str(a).split()) for a in command)
        self.command = self.command[:COMMAND_LABEL_MAX]
        metadata = event.get("metadata") or {}
        job_id = metadata.get("job_id")
        self.job_id = "" if job_id is None else str(job_id)
        self.job_name = _label_text(
            metadata.get("job_name")
            or metadata.get("name")
            or os.environ.get("SLURM_JOB_NAME")
            or program_name([str(a) for a in command])
        )
        started = self.started_epoch
        self.started_at = (
            "" if started is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        )
        self.described = True

    @_fold.on(EventKind.STARTED)
    def _on_started(self, t: float, event: StartedJson) -> None:
        self.started_t = t

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: ProgressJson) -> None:
        self.changes += int(event.get("changed") or 0)
        if not self.steps_count:
            self.last_progress_t = t
        self._fold_stale_limit(event)

    @_fold.on(EventKind.STEP)
    def _on_step(self, t: float, event: StepJson) -> None:
        step = int(event.get("step") or 0)
        self.steps_count = self.steps_count or bool(event.get("counts", True))
        if step != self.step and self.steps_count:
            self.last_progress_t = t
        self.step = step
        self.steps = event
        self._fold_stale_limit(event)

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, event: SampleJson) -> None:
        self.tree = dict((event.get("points") or {}).get("tree") or {})
        # On the soak's own clock, as the progress timestamp: the sample's time, not the
        # moment the serializer passed it on.
        start = self.started_epoch
        self.last_sample_epoch = self._wall() if start is None else start + t
        self.last_sample_t = t
        ranks = self.roles.add(event.get("processes") or [])
        # The first ranks listed, when a node runs more than a label set should hold.
        self.rank_cpu = {
            rank: (cpu or 0.0) * 0.01 for rank, cpu in islice(ranks.items(), MAX_RANK_LABELS)
        }

    @_fold.on(EventKind.GPU_FAULT)
    def _on_gpu_fault(self, t: float, event: GpuFaultJson) -> None:
        index = event.get("gpu")
        key = ("" if index is None else str(index), str(event.get("uuid") or ""))
        xid = event.get("xid")
        if xid is not None:
            code = (*key, str(xid))
            self.xid_errors[code] = self.xid_errors.get(code, 0) + 1
        if event.get("fails"):
            self.gpu_faulted[key] = True

    @_fold.on(EventKind.SAMPLER_DEGRADED)
    def _on_sampler_degraded(self, t: float, event: SamplerDegradedJson) -> None:
        self.degraded[str(event.get("sampler"))] = True

    @_fold.on(EventKind.SAMPLER_RECOVERED)
    def _on_sampler_recovered(self, t: float, event: SamplerRecoveredJson) -> None:
        self.degraded[str(event.get("sampler"))] = False

    @_fold.on(EventKind.FAILURE)
    def _on_failure(self, t: float, event: FailureJson) -> None:
        self.stopping = True
        if self.reason is None:
            self.reason = FailureReason(event["reason"])

    @_fold.on(EventKind.STOP)
    def _on_stop(self, t: float, event: StopJson) -> None:
        self.stopping = True

    @_fold.on(EventKind.EXITED)
    def _on_exited(self, t: float, event: ExitedJson) -> None:
        self.exited = True

    @_fold.on(EventKind.FINISHED)
    def _on_finished(self, t: float, event: FinishedJson) -> None:
        self.status = SoakStatus(event["status"])
        self.finished_t = t

    def _fold_stale_limit(self, event: ProgressJson | StepJson) -> None:
        """``--stale-progress auto``: the limit in force, as the watchdog learned it."""
        limit = _number(event.get("stale_limit_seconds"))
        if limit is not None:
            self.stale_limit = limit

    @_fold.on(EventKind.GPU_SAMPLE)
    def _on_gpu_sample(self, t: float, event: GpuSampleJson) -> None:
        gpus: dict[str, _Gpu] = {}
        by_uuid: dict[str, _Gpu] = {}
        for reading in event.get("gpus") or []:
            index = str(reading.get("index"))
            gpu = _Gpu(uuid=str(reading.get("uuid") or ""))
            gpu.utilization_ratio = _scaled(reading.get("utilization_gpu_percent"), 0.01)
            gpu.memory_used_bytes = _scaled(reading.get("memory_used_mib"), MIB)
            gpu.power_watts = _number(reading.get("power_draw_w"))
            gpu.temperature_celsius = _number(reading.get("temperature_gpu_c"))
            reasons = reading.get("clock_event_reasons")
            gpu.throttle_reasons = None if reasons is None else [str(r) for r in reasons]
            gpus[index] = gpu
            by_uuid[gpu.uuid] = gpu
        processes = event.get("processes")
        if processes is not None:
            for gpu in gpus.values():
                gpu.tree_memory_bytes = 0.0
            for process in processes:
                if not process.get("in_tree"):
                    continue
                on_gpu = process.get("gpu_index")
                holder = gpus.get(str(on_gpu)) if on_gpu is not None else None
                holder = holder or by_uuid.get(str(process.get("gpu_uuid")))
                used = _scaled(process.get("used_gpu_memory_mib"), MIB)
                if holder is not None and used is not None:
                    holder.tree_memory_bytes = (holder.tree_memory_bytes or 0.0) + used
        self.gpus = gpus

    def observe_trends(self, trends: Mapping[str, Mapping[str, Any]]) -> None:
        """Take the tree's memory trend from an evaluation of the soak's trends.

        Read from every evaluation (every few samples), not from ``trend`` events: those
        come once, when a leak or a breach becomes confident, and name a process's series
        rather than the tree's when one process leaks.
        """
        entry = next((trends[key] for key in TREE_MEMORY_KEYS if key in trends), None)
        if entry is None:
            return
        slope = _number(entry.get("slope_per_hour"))
        self.growth_bytes_per_second = None if slope is None else slope / HOUR
        self.projected_exhaustion = epoch(entry.get("projected_limit_at"))

    # -- what it says --------------------------------------------------------------------

    def title(self) -> str:
        """The soak as a dashboard's selector shows it: ``resnet on gpu-node-3, 2026-12-02
        00:37 UTC`` (the job name, the host, the start)."""
        started = self.started_at.replace("T", " ")[:16]
        where = " " + _label_text(f"on {self.host}" + (f", {started} UTC" if started else ""))
        # A long job name is shortened, never the host and the start that tell soaks apart.
        room = max(TITLE_NAME_MIN, TITLE_LABEL_MAX - len(where))
        name = self.job_name or "?"
        if len(name) > room:
            name = name[: room - 1] + "…"
        return _label_text(name + where)

    def elapsed(self) -> float | None:
        """Seconds since the soak started on the events' clock; frozen once it finished."""
        if self.finished_t is not None:
            return self.finished_t
        if self.monotonic_start is None:
            return None
        return self._now() - self.monotonic_start

    def phase(self) -> str:
        if self.status is not None:
            return "finished"
        if self.stopping or self.exited:
            return "stopping"
        if self.started_t is None:
            return "starting"
        if self.last_progress_t is None:
            return "waiting_for_progress"
        return "running"

    def seconds_since_progress(self) -> float | None:
        """Since the last progress (since the command started, before the first one).

        None before the start and after the end: a finished soak is not stalled.
        """
        elapsed = self.elapsed()
        if self.status is not None or self.started_t is None or elapsed is None:
            return None
        since = self.last_progress_t if self.last_progress_t is not None else self.started_t
        return max(0.0, elapsed - since)

    def stale_limit_seconds(self) -> float | None:
        """The limit ``seconds_since_progress`` is held against (startup's before progress)."""
        return self.startup_limit if self.last_progress_t is None else self.stale_limit

    def health(self) -> tuple[bool, str]:
        """Whether the monitor's samplers are alive (its loop is, if this is asked at all):
        a sample came within :data:`HEALTH_STALE_SAMPLES` intervals (at least
        :data:`HEALTH_MIN_SECONDS`), counted from the start before the first one; and what
        to say about it.  Aged on the soak's monotonic clock: a wall clock that steps (NTP,
        a resumed VM) must not have a liveness probe kill a healthy training."""
        if self.status is not None:
            return True, f"ok: the soak finished ({self.status})"
        elapsed = self.elapsed()
        if elapsed is None:
            return True, "ok: starting"
        since = self.last_sample_t if self.last_sample_t is not None else 0.0
        limit = max(HEALTH_MIN_SECONDS, HEALTH_STALE_SAMPLES * (self.sample_interval or 0.0))
        age = max(0.0, elapsed - since)
        degraded = sorted(name for name, down in self.degraded.items() if down)
        note = f"; degraded: {', '.join(degraded)}" if degraded else ""
        what = "last sample" if self.last_sample_t is not None else "start, no sample yet,"
        if age > limit:
            return False, f"unhealthy: {what} {age:.0f}s ago (limit {limit:g}s){note}"
        return True, f"ok: {what} {age:.1f}s ago{note}"

    def rows(self) -> list[Row]:
        """Every family as plain rows: what both :meth:`collect` and :func:`encode_rows` show."""
        soak = (("soak_id", self.soak_id),)
        rows: list[Row] = []

        def gauge(name: str, help_text: str, value: float) -> None:
            rows.append((name, "gauge", help_text, [(name, soak, value)]))

        if self.described:
            info = (
                ("command", self.command),
                ("host", self.host),
                ("job_id", self.job_id),
                ("job_name", self.job_name),
                ("soak_id", self.soak_id),
                ("started_at", self.started_at),
                ("title", self.title()),
            )
            rows.append(
                ("asyncsoak_soak", "info", "The supervised soak.", [(_SOAK_INFO, info, 1.0)])
            )
        phase = self.phase()
        rows.append(
            (
                "asyncsoak_soak_phase",
                "gauge",
                "The soak's phase (one-hot).",
                [
                    ("asyncsoak_soak_phase", (("phase", name), *soak), float(name == phase))
                    for name in PHASES
                ],
            )
        )
        if self.status is not None:
            rows.append(
                (
                    "asyncsoak_soak_status",
                    "gauge",
                    "The soak's verdict once it ended (one-hot).",
                    [
                        (
                            "asyncsoak_soak_status",
                            (*soak, ("status", name)),
                            float(name == self.status),
                        )
                        for name in SOAK_STATUSES
                    ],
                )
            )
        if self.status is not None and self.status != SoakStatus.CANCELLED:
            reasons = [] if self.reason is None else [self.reason]
            gauge(
                "asyncsoak_soak_exit_code",
                "The soak's status under --detailed-exit-codes once it ended: 0 passed, else "
                "its primary reason's (see asyncsoak exit-codes); absent when cancelled.",
                float(verdict_exit_code(self.status, reasons, detailed=True)),
            )
        rows.append(
            (
                "asyncsoak_progress_changes",
                "counter",
                "File changes seen in the progress directory.",
                [("asyncsoak_progress_changes_total", soak, float(self.changes))],
            )
        )
        if self.last_progress_t is not None and self.started_epoch is not None:
            gauge(
                "asyncsoak_progress_last_change_timestamp_seconds",
                "When progress was last seen (Unix time).",
                self.started_epoch + self.last_progress_t,
            )
        if self.last_sample_epoch is not None:
            gauge(
                "asyncsoak_last_sample_timestamp_seconds",
                "When the monitor last sampled the tree (Unix time): its heartbeat, which stops "
                "moving when the monitor dies or hangs (a textfile keeps its last values).",
                self.last_sample_epoch,
            )
        since = self.seconds_since_progress()
        if since is not None:
            gauge(
                "asyncsoak_seconds_since_progress",
                "Seconds since the last progress (since the start before the first one); "
                "absent once the soak ended.",
                since,
            )
        limit = self.stale_limit_seconds()
        if limit is not None:
            gauge(
                "asyncsoak_stale_limit_seconds",
                "The limit asyncsoak_seconds_since_progress is held against (the startup "
                "timeout before the first progress, 0 for none).",
                limit,
            )
        rows.extend(self._step_rows(gauge))
        tree = self.tree
        for name, key, scale, help_text in _TREE_METRICS:
            value = _scaled(tree.get(key), scale)
            if value is not None:
                gauge(name, help_text, value)
        if self.growth_bytes_per_second is not None:
            gauge(
                "asyncsoak_tree_memory_growth_bytes_per_second",
                "The trend of the tree's memory that can run out (anonymous + shared: the soak's "
                "trend estimate, after its warm-up).",
                self.growth_bytes_per_second,
            )
        if self.projected_exhaustion is not None:
            gauge(
                "asyncsoak_memory_projected_exhaustion_timestamp_seconds",
                "When the tree's memory is projected to reach its limit (Unix time).",
                self.projected_exhaustion,
            )
        if self.rank_cpu:
            gauge(
                "asyncsoak_ranks",
                "Ranks of a distributed run in the supervised tree (RANK and its kin in "
                "their environment).",
                float(len(self.rank_cpu)),
            )
            rows.append(
                (
                    "asyncsoak_rank_cpu_cores",
                    "gauge",
                    "CPU each rank uses (its process and its workers), in cores.",
                    [
                        ("asyncsoak_rank_cpu_cores", (("rank", str(rank)), *soak), value)
                        for rank, value in sorted(self.rank_cpu.items())
                    ],
                )
            )
        rows.extend(self._gpu_rows())
        rows.extend(self._gpu_health_rows())
        rows.append(
            (
                "asyncsoak_sampler_degraded",
                "gauge",
                "1 while a sampler is degraded (its readings missing or late).",
                [
                    ("asyncsoak_sampler_degraded", (("sampler", name), *soak), float(degraded))
                    for name, degraded in sorted(self.degraded.items())
                ],
            )
        )
        return rows

    def _step_rows(self, gauge: Callable[[str, str, float], None]) -> list[Row]:
        """The training's own figures, once the trainer wrote a step."""
        if self.step is None:
            return []
        gauge("asyncsoak_step", "The training step, as the trainer's files say.", self.step)
        for name, key, help_text in _STEP_METRICS:
            value = _number(self.steps.get(key))
            if value is not None:
                gauge(name, help_text, value)
        return []

    def _gpu_rows(self) -> list[Row]:
        samples: dict[str, list[Sample]] = {name: [] for name in _GPU_HELP}
        throttle: list[Sample] = []
        for index, gpu in sorted(self.gpus.items()):
            key = (("gpu", index), ("soak_id", self.soak_id), ("uuid", gpu.uuid))
            for name, value in (
                ("asyncsoak_gpu_utilization_ratio", gpu.utilization_ratio),
                ("asyncsoak_gpu_memory_used_bytes", gpu.memory_used_bytes),
                ("asyncsoak_gpu_power_watts", gpu.power_watts),
                ("asyncsoak_gpu_temperature_celsius", gpu.temperature_celsius),
                ("asyncsoak_tree_gpu_memory_bytes", gpu.tree_memory_bytes),
            ):
                if value is not None:
                    samples[name].append((name, key, value))
            if gpu.throttle_reasons is not None:
                active = set(gpu.throttle_reasons)
                for reason in sorted(set(CLOCK_EVENT_REASONS.values()) | active):
                    labels = (key[0], ("reason", reason), key[1], key[2])
                    throttle.append(("asyncsoak_gpu_throttle", labels, float(reason in active)))
        rows: list[Row] = [
            (name, "gauge", _GPU_HELP[name], found) for name, found in samples.items() if found
        ]
        if throttle:
            rows.append(
                (
                    "asyncsoak_gpu_throttle",
                    "gauge",
                    "1 for each clock event reason active on the GPU (NVML's names).",
                    throttle,
                )
            )
        return rows

    def _gpu_health_rows(self) -> list[Row]:
        """The Xid counter by code and the fault gauge per GPU, labelled as dcgm-exporter
        labels GPUs (``gpu``, ``UUID``), so PromQL joins with its series."""
        soak = ("soak_id", self.soak_id)
        faulted = {(index, gpu.uuid): False for index, gpu in self.gpus.items()}
        faulted.update(self.gpu_faulted)
        rows: list[Row] = []
        if faulted:
            rows.append(
                (
                    "asyncsoak_gpu_fault",
                    "gauge",
                    "1 once the GPU reported a fault that fails a run (an Xid that fails, an "
                    "uncorrectable ECC error, a row remap pending or failed, the GPU lost).",
                    [
                        ("asyncsoak_gpu_fault", (("UUID", uuid), ("gpu", index), soak), float(bad))
                        for (index, uuid), bad in sorted(faulted.items())
                    ],
                )
            )
        if self.xid_errors:
            rows.append(
                (
                    "asyncsoak_gpu_xid_errors",
                    "counter",
                    "Xid errors the kernel logged for the GPU, by Xid code.",
                    [
                        (
                            "asyncsoak_gpu_xid_errors_total",
                            (("UUID", uuid), ("gpu", index), soak, ("xid", xid)),
                            float(count),
                        )
                        for (index, uuid, xid), count in sorted(self.xid_errors.items())
                    ],
                )
            )
        return rows

    def collect(self) -> Iterator[Metric]:
        """The families for a ``prometheus_client`` registry."""
        return families(self.rows())


#: Interpreters whose script names the program (``python train.py``), a Python's version
#: aside (``python3.11``); ``shred`` or ``sha256sum`` are no shell.
_INTERPRETER = re.compile(r"(?:python|pypy)[\d.]*|bash|sh|uv|torchrun|accelerate|deepspeed")
#: Characters of the job name a title keeps at least (the host and the start are kept).
TITLE_NAME_MIN = 24
#: Characters a label shown in a dashboard's selector keeps at most.
TITLE_LABEL_MAX = 120


def program_name(command: list[str]) -> str:
    """The program a command runs, as a person names it: ``train.py`` for ``python train.py
    --lr 3e-4``, ``mypkg.train`` for ``python -m mypkg.train``, else its executable's name."""
    if not command:
        return ""
    name = os.path.basename(command[0])
    if not _INTERPRETER.fullmatch(name):
        return name
    rest = command[1:]
    for i, arg in enumerate(rest):
        if arg == "-c":
            return name  # an inline script has no name
        if arg == "-m" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.endswith((".py", ".sh")):
            return os.path.basename(arg)
    return name


def _label_text(value: object) -> str:
    """A label a dashboard shows in a selector: one line, no double quote (Grafana's
    variable regex reads the label out of ``query_result``'s text), bounded."""
    # A job name is the user's free text (SLURM's comes from the environment): a URL's
    # password in it is masked as in the artifact.
    text = redact_url_passwords(" ".join(str(value).split())).replace('"', "'")
    return text[:TITLE_LABEL_MAX]


_SOAK_INFO = "asyncsoak_soak_info"

_TREE_METRICS = (
    ("asyncsoak_tree_processes", "processes", 1.0, "Processes in the supervised tree."),
    ("asyncsoak_tree_threads", "threads", 1.0, "Threads of the supervised tree."),
    ("asyncsoak_tree_open_fds", "fds", 1.0, "Open file descriptors of the supervised tree."),
    ("asyncsoak_tree_cpu_cores", "cpu_percent", 0.01, "CPU the tree uses, in cores."),
    (
        "asyncsoak_tree_resident_memory_bytes",
        "rss_bytes",
        1.0,
        "Resident memory of the supervised tree.",
    ),
    (
        "asyncsoak_tree_anonymous_memory_bytes",
        "anon_bytes",
        1.0,
        "Anonymous and shared memory of the supervised tree: what can run out (resident "
        "memory less clean file-backed pages).",
    ),
)
_GPU_HELP = {
    "asyncsoak_gpu_utilization_ratio": "GPU utilisation (0 to 1).",
    "asyncsoak_gpu_memory_used_bytes": "GPU memory used (by every process).",
    "asyncsoak_gpu_power_watts": "GPU power draw.",
    "asyncsoak_gpu_temperature_celsius": "GPU temperature.",
    "asyncsoak_tree_gpu_memory_bytes": "GPU memory held by the supervised tree's processes.",
}

#: Every metric name asyncsoak exports (as a scrape shows them), for the shipped rules.
SOAK_METRIC_NAMES = frozenset(
    {
        "asyncsoak_soak_info",
        "asyncsoak_soak_phase",
        "asyncsoak_soak_status",
        "asyncsoak_soak_exit_code",
        "asyncsoak_progress_changes_total",
        "asyncsoak_progress_last_change_timestamp_seconds",
        "asyncsoak_last_sample_timestamp_seconds",
        "asyncsoak_seconds_since_progress",
        "asyncsoak_stale_limit_seconds",
        *(name for name, *_ in _TREE_METRICS),
        "asyncsoak_ranks",
        "asyncsoak_rank_cpu_cores",
        "asyncsoak_tree_memory_growth_bytes_per_second",
        "asyncsoak_memory_projected_exhaustion_timestamp_seconds",
        *_GPU_HELP,
        "asyncsoak_gpu_throttle",
        "asyncsoak_gpu_fault",
        "asyncsoak_gpu_xid_errors_total",
        "asyncsoak_sampler_degraded",
    }
)


@dataclass(slots=True, eq=False)  # eq=False: hashable by identity, as a registry needs
class WorkerMetrics:
    """A queue worker's metrics; the worker sets the fields as it goes."""

    worker: str
    host: str = field(default_factory=socket.gethostname)
    heartbeat_at: float | None = None
    current_job: int | None = None
    current_attempt: int | None = None
    #: Jobs by status, as the worker last counted them.
    queue_jobs: dict[str, int] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)

    def outcome(self, status: str, reason: str | None) -> None:
        key = (status, reason or "")
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        yield InfoMetricFamily(
            "asyncsoak_worker",
            "The queue worker.",
            value={"worker": self.worker, "host": self.host},
        )
        if self.heartbeat_at is not None:
            yield GaugeMetricFamily(
                "asyncsoak_worker_heartbeat_timestamp_seconds",
                "When the worker last wrote its heartbeat (Unix time).",
                value=self.heartbeat_at,
            )
        if self.current_job is not None:
            yield GaugeMetricFamily(
                "asyncsoak_worker_current_job_id",
                "The id of the job the worker runs (absent while idle).",
                value=float(self.current_job),
            )
            yield GaugeMetricFamily(
                "asyncsoak_worker_current_job_attempt",
                "The attempt of the job the worker runs (absent while idle).",
                value=float(self.current_attempt or 0),
            )
        if self.queue_jobs:
            family = GaugeMetricFamily(
                "asyncsoak_queue_jobs", "Jobs in the queue by status.", labels=["status"]
            )
            for status, count in sorted(self.queue_jobs.items()):
                family.add_metric([status], float(count))
            yield family
        counter = CounterMetricFamily(
            "asyncsoak_worker_job_outcomes",
            "Attempts this worker ended, by final status and reason.",
            labels=["status", "reason"],
        )
        for (status, reason), count in sorted(self.outcomes.items()):
            counter.add_metric([status, reason], float(count))
        yield counter


WORKER_METRIC_NAMES = frozenset(
    {
        "asyncsoak_worker_info",
        "asyncsoak_worker_heartbeat_timestamp_seconds",
        "asyncsoak_worker_current_job_id",
        "asyncsoak_worker_current_job_attempt",
        "asyncsoak_queue_jobs",
        "asyncsoak_worker_job_outcomes_total",
    }
)
METRIC_NAMES = SOAK_METRIC_NAMES | WORKER_METRIC_NAMES


def textfile_path(directory: Path, soak_id: str) -> Path:
    return directory / f"asyncsoak_{soak_id}.prom"


def write_textfile(path: Path, data: bytes) -> None:
    """Replace ``path`` at once: node_exporter reads only ``*.prom``, never the temp name."""
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _scaled(value: object, scale: float) -> float | None:
    number = _number(value)
    return None if number is None else number * scale
