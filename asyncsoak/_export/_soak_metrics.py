"""A soak's metrics as Prometheus families, read from its fold at each scrape or textfile
write.  Every soak metric carries a ``soak_id`` label, so soaks sharing a node_exporter
directory never collide; label sets are bounded (never a pid)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._contract import SoakStatus, exits
from .._sampling import CLOCK_EVENT_REASONS
from ._soak_fold import SoakFold, number, scaled
from ._worker_metrics import WORKER_METRIC_NAMES

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

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


class SoakMetrics(SoakFold):
    """One soak's metrics: its fold (see :class:`SoakFold`), exported as families."""

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


def _labels(labels: Mapping[str, Any], soak_id: str) -> Labels:
    """A sample's labels, the soak's id among them, sorted by name."""
    return tuple(sorted({**{k: str(v) for k, v in labels.items()}, "soak_id": soak_id}.items()))
