"""One soak's metrics, read from its ``RunState`` (the serializer's, or one fed from the
events observed) at each scrape or textfile write, as Prometheus families.  Every soak metric
carries a ``soak_id`` label, so soaks sharing a node_exporter directory never collide; label
sets are bounded (never a pid)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from .._analysis import TREE_MEMORY_SERIES
from .._contract import EventKind, SoakStatus, epoch, exits, redact_url_passwords
from .._process import RoleFold
from .._record import RunState
from .._sampling import CLOCK_EVENT_REASONS
from ._metrics import WORKER_METRIC_NAMES

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

#: ``/healthz`` says 503 once no sample came for this many sample intervals, and never sooner
#: than HEALTH_MIN_SECONDS (a failed liveness probe restarts the training with the container).
HEALTH_STALE_SAMPLES = 10
HEALTH_MIN_SECONDS = 60.0

#: The events after which a textfile is written again (others change it only with a sample).
_CHANGES_TEXTFILE = frozenset({"sample", "started", "finished", "failure", "gpu_fault"})


Labels = tuple[tuple[str, str], ...]
#: A sample: its name, its labels, its value.
Sample = tuple[str, Labels, float]
#: A family: its name, type and help, and its samples.
Row = tuple[str, str, str, list[Sample]]

#: The soak's phases, exported one-hot as ``asyncsoak_soak_phase{phase}``.
PHASES = ("starting", "waiting_for_progress", "running", "stopping", "finished")
#: The step event's figures exported as gauges once the trainer wrote a step: (metric, key, help).
_STEP_METRICS = (
    ("asyncsoak_step", "step", "The training step, as the trainer's files say."),
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
#: The tree's figures from the newest sample, and a GPU's from its reading: (metric, key, scale).
_TREE_METRICS = (
    ("asyncsoak_tree_processes", "processes", 1.0),
    ("asyncsoak_tree_threads", "threads", 1.0),
    ("asyncsoak_tree_open_fds", "fds", 1.0),
    ("asyncsoak_tree_cpu_cores", "cpu_percent", 0.01),
    ("asyncsoak_tree_resident_memory_bytes", "rss_bytes", 1.0),
    ("asyncsoak_tree_anonymous_memory_bytes", "anon_bytes", 1.0),
)
_GPU_METRICS = (
    ("asyncsoak_gpu_utilization_ratio", "utilization_gpu_percent", 0.01),
    ("asyncsoak_gpu_memory_used_bytes", "memory_used_mib", 2**20),
    ("asyncsoak_gpu_power_watts", "power_draw_w", 1.0),
    ("asyncsoak_gpu_temperature_celsius", "temperature_gpu_c", 1.0),
)

#: Each soak metric's help, by the name a scrape shows (a counter's ``_total``, the info's
#: ``_info``), in the order they are exported.
_HELP = {
    "asyncsoak_soak_info": "The supervised soak.",
    "asyncsoak_soak_phase": "The soak's phase (one-hot).",
    "asyncsoak_soak_status": "The soak's verdict once it ended (one-hot).",
    "asyncsoak_soak_exit_code": "The soak's status under --detailed-exit-codes once it ended: "
    "0 passed, else its primary reason's (see asyncsoak exit-codes); absent when cancelled.",
    "asyncsoak_progress_changes_total": "File changes seen in the progress directory.",
    "asyncsoak_progress_last_change_timestamp_seconds": "When progress was last seen (Unix time).",
    "asyncsoak_last_sample_timestamp_seconds": "When the monitor last sampled the tree (Unix "
    "time): its heartbeat, which stops moving when the monitor dies or hangs (a textfile keeps "
    "its last values).",
    "asyncsoak_seconds_since_progress": "Seconds since the last progress (since the start "
    "before the first one); absent once the soak ended.",
    "asyncsoak_stale_limit_seconds": "The limit asyncsoak_seconds_since_progress is held "
    "against (the startup timeout before the first progress, 0 for none).",
    "asyncsoak_productive_seconds_total": "Seconds of the run spent in productive training "
    "steps (the ideal step x the new steps), counted when each step is final.",
    "asyncsoak_badput_seconds_total": "Seconds of the run lost, by kind (startup, slow_steps, "
    "checkpoint, stall, wasted, shutdown, other), counted when final.",
    "asyncsoak_tree_processes": "Processes in the supervised tree.",
    "asyncsoak_tree_threads": "Threads of the supervised tree.",
    "asyncsoak_tree_open_fds": "Open file descriptors of the supervised tree.",
    "asyncsoak_tree_cpu_cores": "CPU the tree uses, in cores.",
    "asyncsoak_tree_resident_memory_bytes": "Resident memory of the supervised tree.",
    "asyncsoak_tree_anonymous_memory_bytes": "Anonymous and shared memory of the supervised "
    "tree: what can run out (resident memory less clean file-backed pages).",
    "asyncsoak_tree_memory_growth_bytes_per_second": "The trend of the tree's memory that can "
    "run out (anonymous + shared: the soak's trend estimate, after its warm-up).",
    "asyncsoak_memory_projected_exhaustion_timestamp_seconds": "When the tree's memory is "
    "projected to reach its limit (Unix time).",
    "asyncsoak_ranks": "Ranks of a distributed run in the supervised tree (RANK and its kin in "
    "their environment).",
    "asyncsoak_rank_cpu_cores": "CPU each rank uses (its process and its workers), in cores.",
    "asyncsoak_gpu_utilization_ratio": "GPU utilisation (0 to 1).",
    "asyncsoak_gpu_memory_used_bytes": "GPU memory used (by every process).",
    "asyncsoak_gpu_power_watts": "GPU power draw.",
    "asyncsoak_gpu_temperature_celsius": "GPU temperature.",
    "asyncsoak_tree_gpu_memory_bytes": "GPU memory held by the supervised tree's processes.",
    "asyncsoak_gpu_throttle": "1 for each clock event reason active on the GPU (NVML's names).",
    "asyncsoak_gpu_fault": "1 once the GPU reported a fault that fails a run (an Xid that "
    "fails, an uncorrectable ECC error, a row remap pending or failed, the GPU lost).",
    "asyncsoak_gpu_xid_errors_total": "Xid errors the kernel logged for the GPU, by Xid code.",
    "asyncsoak_sampler_degraded": "1 while a sampler is degraded (its readings missing or late).",
}

#: Every metric name asyncsoak exports (as a scrape shows them), the soak's and the worker's,
#: for the shipped rules (the step's figures aside).
METRIC_NAMES = WORKER_METRIC_NAMES | frozenset(_HELP)


class SoakMetrics:
    """One soak's metrics, read from ``run`` (fed by :meth:`observe` when not given), exported
    as families; ``now`` is the monotonic clock the events' ``t`` is measured on."""

    def __init__(
        self,
        soak_id: str,
        *,
        run: RunState | None = None,
        now: Callable[[], float] = time.monotonic,
        host: str | None = None,
    ) -> None:
        self.soak_id = soak_id
        self.run = run if run is not None else RunState()
        self._feed = run is None
        self._now = now
        self.host = host if host is not None else socket.gethostname()
        #: The tree's processes' roles, and each rank's CPU in the newest sample, in cores.
        self.roles = RoleFold()
        self.rank_cpu: dict[int, float] = {}
        self.growth_bytes_per_second: float | None = None
        self.projected_exhaustion: float | None = None
        #: Called after each event that changes what a textfile should say.
        self.on_change: Callable[[], None] | None = None

    def observe(self, event: Mapping[str, Any]) -> None:
        """Take one event in its JSON form (as the journal holds it)."""
        if self._feed:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.run.add(event)
        if event["kind"] == EventKind.SAMPLE:
            ranks = self.roles.add(event.get("processes") or [])
            # The first ranks listed, when a node runs more than a label set should hold.
            self.rank_cpu = {rank: (cpu or 0.0) * 0.01 for rank, cpu in islice(ranks.items(), 64)}
        if self.on_change is not None and event["kind"] in _CHANGES_TEXTFILE:
            self.on_change()

    @property
    def header(self) -> Mapping[str, Any]:
        return self.run.header or {}

    @property
    def config(self) -> Mapping[str, Any]:
        return self.header.get("config") or {}

    @property
    def started_epoch(self) -> float | None:
        return epoch(self.header.get("started_at"))

    def sample_t(self) -> float | None:
        """When the newest sample was taken, on the soak's clock (which /healthz ages)."""
        sample = self.run.latest.get("sample")
        return None if sample is None else float(sample["t"])

    def tree(self) -> Mapping[str, Any]:
        return ((self.run.latest.get("sample") or {}).get("points") or {}).get("tree") or {}

    def info(self) -> tuple[tuple[str, str], ...] | None:
        """``asyncsoak_soak_info``'s labels once the header is folded: what a person calls the
        run (the queue job's name, else SLURM's, else the program) and its start."""
        if self.run.header is None:
            return None
        command = [str(a) for a in self.header.get("command") or []]
        metadata = self.header.get("metadata") or {}
        job_id = metadata.get("job_id")
        job_name = _label_text(
            metadata.get("job_name")
            or metadata.get("name")
            or os.environ.get("SLURM_JOB_NAME")
            or program_name(command)
        )
        started = self.started_epoch
        started_at = (
            "" if started is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        )
        return (
            # One line: an inline script's newlines make a label no dashboard can show.
            ("command", " ".join(" ".join(a.split()) for a in command)[:200]),
            ("host", self.host),
            ("job_id", "" if job_id is None else str(job_id)),
            ("job_name", job_name),
            ("soak_id", self.soak_id),
            ("started_at", started_at),
            ("title", self.title(job_name, started_at)),
        )

    def gpus(self) -> dict[str, tuple[str, Mapping[str, Any], float | None]]:
        """The newest GPU sample's readings by index: (uuid, reading, the tree's memory on it
        when the sample listed the GPUs' processes)."""
        event = self.run.latest.get("gpu_sample") or {}
        readings = {str(r.get("index")): r for r in event.get("gpus") or []}
        held: dict[str, float] | None = None
        if event.get("processes") is not None:
            held = dict.fromkeys(readings, 0.0)
            by_uuid = {str(r.get("uuid") or ""): index for index, r in readings.items()}
            for process in event["processes"]:
                on_gpu = str(process.get("gpu_index"))
                index = on_gpu if on_gpu in readings else by_uuid.get(str(process.get("gpu_uuid")))
                used = scaled(process.get("used_gpu_memory_mib"), 2**20)
                if process.get("in_tree") and index is not None and used is not None:
                    held[index] += used
        return {
            index: (str(r.get("uuid") or ""), r, None if held is None else held[index])
            for index, r in readings.items()
        }

    def degraded(self) -> dict[str, bool]:
        """Each sampler: whether its newest word is that it is degraded."""
        degraded = dict.fromkeys(("proc", "gpu"), False)
        for note in self.run.sampler_notes:
            if note["kind"] in (EventKind.SAMPLER_DEGRADED, EventKind.SAMPLER_RECOVERED):
                degraded[str(note.get("sampler"))] = note["kind"] == EventKind.SAMPLER_DEGRADED
        return degraded

    def observe_trends(self, trends: Mapping[str, Mapping[str, Any]]) -> None:
        """Take the tree's memory trend from each evaluation of the soak's trends (``trend``
        events come once, maybe for a process's series)."""
        entry = next((trends[key] for key, _ in TREE_MEMORY_SERIES if key in trends), None)
        if entry is None:
            return
        slope = number(entry.get("slope_per_hour"))
        self.growth_bytes_per_second = None if slope is None else slope / 3600.0
        self.projected_exhaustion = epoch(entry.get("projected_limit_at"))

    def title(self, job_name: str, started_at: str) -> str:
        """The soak in a dashboard's selector: ``resnet on gpu-node-3, 2026-12-02 00:37 UTC``."""
        started = started_at.replace("T", " ")[:16]
        where = " " + _label_text(f"on {self.host}" + (f", {started} UTC" if started else ""))
        # A long job name is shortened, never the host and the start that tell soaks apart.
        room = max(24, TITLE_LABEL_MAX - len(where))
        name = job_name or "?"
        if len(name) > room:
            name = name[: room - 1] + "…"
        return _label_text(name + where)

    def elapsed(self) -> float | None:
        """Seconds since the soak started on the events' clock."""
        start = number(self.header.get("monotonic_start"))
        return None if start is None else self._now() - start

    def phase(self) -> str:
        run = self.run
        if run.status is not None:
            return "finished"
        if run.failures or run.stop["mode"] is not None or run.exit_t is not None:
            return "stopping"
        if run.started_t is None:
            return "starting"
        if run.last_progress is None:
            return "waiting_for_progress"
        return "running"

    def seconds_since_progress(self) -> float | None:
        """Since the last progress (or the start); None before the start and after the end."""
        elapsed, run = self.elapsed(), self.run
        if run.status is not None or run.started_t is None or elapsed is None:
            return None
        since = run.last_progress if run.last_progress is not None else run.started_t
        return max(0.0, elapsed - since)

    def stale_limit_seconds(self) -> float | None:
        """The limit ``seconds_since_progress`` is held against (startup's before progress)."""
        if self.run.last_progress is None:
            return number(self.config.get("startup_timeout_seconds"))
        if self.run.stale_limit is not None:  # ``--stale-progress auto``: the one learned
            return self.run.stale_limit
        return number(self.config.get("stale_progress_seconds"))

    def health(self) -> tuple[bool, str]:
        """Whether the samplers are alive (a sample within HEALTH_STALE_SAMPLES intervals, on the
        monotonic clock), and what to say."""
        if self.run.status is not None:
            return True, f"ok: the soak finished ({self.run.status})"
        elapsed = self.elapsed()
        if elapsed is None:
            return True, "ok: starting"
        sampled = self.sample_t()
        interval = number(self.config.get("sample_interval_seconds"))
        limit = max(HEALTH_MIN_SECONDS, HEALTH_STALE_SAMPLES * (interval or 0.0))
        age = max(0.0, elapsed - (sampled or 0.0))
        degraded = sorted(name for name, down in self.degraded().items() if down)
        note = f"; degraded: {', '.join(degraded)}" if degraded else ""
        what = "last sample" if sampled is not None else "start, no sample yet,"
        if age > limit:
            return False, f"unhealthy: {what} {age:.0f}s ago (limit {limit:g}s){note}"
        return True, f"ok: {what} {age:.1f}s ago{note}"

    def rows(self) -> list[Row]:
        """Every family as plain rows, which :meth:`collect` hands to ``prometheus_client``."""
        rows: list[Row] = []
        run, goodput = self.run, self.run.goodput_fold

        def add(
            name: str, samples: Iterable[tuple[Mapping[str, Any], float]], text: str = ""
        ) -> None:
            """A family of (labels, value) samples, by the name a scrape shows."""
            kind = "counter" if name.endswith("_total") else "gauge"
            kind = "info" if name.endswith("_info") else kind
            family = name if kind == "gauge" else name.rsplit("_", 1)[0]
            rows.append(
                (
                    family,
                    kind,
                    text or _HELP[name],
                    [
                        (name, _labels(labels, self.soak_id), float(value))
                        for labels, value in samples
                    ],
                )
            )

        def gauge(name: str, value: float | None, text: str = "") -> None:
            if value is not None:
                add(name, [({}, value)], text)

        def one_hot(name: str, label: str, values: Iterable[str], chosen: str) -> None:
            add(name, [({label: value}, value == chosen) for value in values])

        info = self.info()
        if info is not None:
            add("asyncsoak_soak_info", [(dict(info), 1.0)])
        one_hot("asyncsoak_soak_phase", "phase", PHASES, self.phase())
        if run.status is not None:
            one_hot("asyncsoak_soak_status", "status", SoakStatus, run.status)
        if run.status is not None and run.status != SoakStatus.CANCELLED:
            reasons = [failure["reason"] for failure in run.failures[:1]]
            code = exits.verdict_exit_code(run.status, reasons, detailed=True)
            gauge("asyncsoak_soak_exit_code", code)
        add("asyncsoak_progress_changes_total", [({}, run.progress_changes)])
        start, sampled = self.started_epoch, self.sample_t()
        if run.last_progress is not None and start is not None:
            gauge("asyncsoak_progress_last_change_timestamp_seconds", start + run.last_progress)
        sample_at = None if start is None or sampled is None else start + sampled
        gauge("asyncsoak_last_sample_timestamp_seconds", sample_at)
        gauge("asyncsoak_seconds_since_progress", self.seconds_since_progress())
        gauge("asyncsoak_stale_limit_seconds", self.stale_limit_seconds())
        if run.step is not None:  # the training's own figures, once the trainer wrote a step
            for name, key, text in _STEP_METRICS:
                gauge(name, number(run.step.get(key)), text)
        # The run's time so far as productive and lost (docs/goodput.md), counted once final:
        # 0 until the trainer's second step.
        add("asyncsoak_productive_seconds_total", [({}, goodput.productive_seconds)])
        badput = [({"kind": kind}, v) for kind, v in goodput.badput_seconds.items()]
        add("asyncsoak_badput_seconds_total", badput)
        tree = self.tree()
        for name, key, scale in _TREE_METRICS:
            gauge(name, scaled(tree.get(key), scale))
        gauge("asyncsoak_tree_memory_growth_bytes_per_second", self.growth_bytes_per_second)
        gauge("asyncsoak_memory_projected_exhaustion_timestamp_seconds", self.projected_exhaustion)
        if self.rank_cpu:
            gauge("asyncsoak_ranks", len(self.rank_cpu))
            ranks = sorted(self.rank_cpu.items())
            add("asyncsoak_rank_cpu_cores", [({"rank": rank}, cpu) for rank, cpu in ranks])
        for name, samples in self._gpu_samples().items():
            present = [(labels, value) for labels, value in samples if value is not None]
            if present:
                add(name, present)
        degraded = sorted(self.degraded().items())
        add("asyncsoak_sampler_degraded", [({"sampler": s}, down) for s, down in degraded])
        return rows

    def _gpu_samples(self) -> dict[str, list[tuple[dict[str, str], float | None]]]:
        """The GPU families' samples (None where a GPU lacks the figure); the Xid counter and
        the fault gauge labelled as dcgm-exporter labels GPUs (``gpu``, ``UUID``), so PromQL
        joins with its series."""
        gpus = sorted(self.gpus().items())
        at = [
            ({"gpu": index, "uuid": uuid}, reading, held) for index, (uuid, reading, held) in gpus
        ]
        samples = {
            name: [(labels, scaled(reading.get(key), scale)) for labels, reading, _ in at]
            for name, key, scale in _GPU_METRICS
        }
        samples["asyncsoak_tree_gpu_memory_bytes"] = [(labels, held) for labels, _, held in at]
        samples["asyncsoak_gpu_throttle"] = [
            ({**labels, "reason": reason}, reason in active)
            for labels, reading, _ in at
            if reading.get("clock_event_reasons") is not None
            for active in [{str(r) for r in reading["clock_event_reasons"]}]
            for reason in sorted(set(CLOCK_EVENT_REASONS.values()) | active)
        ]
        health = {
            ("" if i < 0 else str(i), gpu.uuid or ""): gpu
            for i, gpu in self.run.gpu_health.gpus.items()
        }
        faulted = {(index, uuid): False for index, (uuid, _, _) in gpus}
        faulted.update({key: True for key, gpu in health.items() if gpu.failed})
        samples["asyncsoak_gpu_fault"] = [
            ({"UUID": uuid, "gpu": index}, bad) for (index, uuid), bad in sorted(faulted.items())
        ]
        samples["asyncsoak_gpu_xid_errors_total"] = [
            ({"UUID": uuid, "gpu": index, "xid": xid}, count)
            for (index, uuid), gpu in sorted(health.items())
            for xid, count in sorted(gpu.xids.items())
        ]
        return samples

    def collect(self) -> Iterator[Metric]:
        """The families for a ``prometheus_client`` registry."""
        from prometheus_client.metrics_core import Metric

        for name, kind, help_text, samples in self.rows():
            family = Metric(name, help_text, kind)
            for sample_name, labels, value in samples:
                family.add_sample(sample_name, dict(labels), value)
            yield family


#: Interpreters whose script names the program (``python train.py``), a Python's version
#: aside (``python3.11``); ``shred`` or ``sha256sum`` are no shell.
_INTERPRETER = re.compile(r"(?:python|pypy)[\d.]*|bash|sh|uv|torchrun|accelerate|deepspeed")
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
    """A label a dashboard shows in a selector: one line, no double quote (Grafana's variable
    regex reads it out of ``query_result``'s text), bounded, a URL's password masked."""
    text = redact_url_passwords(" ".join(str(value).split())).replace('"', "'")
    return text[:TITLE_LABEL_MAX]


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def scaled(value: object, scale: float) -> float | None:
    figure = number(value)
    return None if figure is None else figure * scale


def _labels(labels: Mapping[str, Any], soak_id: str) -> Labels:
    """A sample's labels, the soak's id among them, sorted by name."""
    return tuple(sorted({**{k: str(v) for k, v in labels.items()}, "soak_id": soak_id}.items()))
