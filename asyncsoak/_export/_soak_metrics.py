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


#: A sample: its name, its labels, its value.
Sample = tuple[str, tuple[tuple[str, str], ...], float]
#: A family: its name, type and help, and its samples.
Row = tuple[str, str, str, list[Sample]]

#: The soak's phases, exported one-hot as ``asyncsoak_soak_phase{phase}``.
PHASES = ("starting", "waiting_for_progress", "running", "stopping", "finished")
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
#: A GPU's figures: (metric, reading key, scale, help).
_GPU_METRICS = (
    (
        "asyncsoak_gpu_utilization_ratio",
        "utilization_gpu_percent",
        0.01,
        "GPU utilisation (0 to 1).",
    ),
    (
        "asyncsoak_gpu_memory_used_bytes",
        "memory_used_mib",
        2**20,
        "GPU memory used (by every process).",
    ),
    ("asyncsoak_gpu_power_watts", "power_draw_w", 1.0, "GPU power draw."),
    ("asyncsoak_gpu_temperature_celsius", "temperature_gpu_c", 1.0, "GPU temperature."),
)
_TREE_GPU = "asyncsoak_tree_gpu_memory_bytes"
_THROTTLE = "asyncsoak_gpu_throttle"

#: Every metric name asyncsoak exports (as a scrape shows them), the soak's and the worker's,
#: for the shipped rules.
METRIC_NAMES = WORKER_METRIC_NAMES | frozenset(
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
        *(name for name, *_ in _GPU_METRICS),
        _TREE_GPU,
        "asyncsoak_gpu_throttle",
        "asyncsoak_gpu_fault",
        "asyncsoak_gpu_xid_errors_total",
        "asyncsoak_sampler_degraded",
        "asyncsoak_productive_seconds_total",
        "asyncsoak_badput_seconds_total",
    }
)


class SoakMetrics(SoakFold):
    """One soak's metrics: its fold (see :class:`SoakFold`), exported as families."""

    def rows(self) -> list[Row]:
        """Every family as plain rows, which :meth:`collect` hands to ``prometheus_client``."""
        soak = (("soak_id", self.soak_id),)
        rows: list[Row] = []

        def gauge(name: str, help_text: str, value: float | None) -> None:
            if value is not None:
                rows.append((name, "gauge", help_text, [(name, soak, value)]))

        def labelled(name: str, help_text: str, label: str, values: Iterable[Any]) -> None:
            """A gauge by ``label``: a sample per ``(label value, value)``."""
            samples = [
                (name, tuple(sorted(((label, str(key)), *soak))), float(value))
                for key, value in values
            ]
            rows.append((name, "gauge", help_text, samples))

        run = self.run
        info = self.info()
        if info is not None:
            rows.append(
                ("asyncsoak_soak", "info", "The supervised soak.", [(_SOAK_INFO, info, 1.0)])
            )
        phase = self.phase()
        labelled(
            "asyncsoak_soak_phase",
            "The soak's phase (one-hot).",
            "phase",
            ((name, name == phase) for name in PHASES),
        )
        if run.status is not None:
            labelled(
                "asyncsoak_soak_status",
                "The soak's verdict once it ended (one-hot).",
                "status",
                ((name, name == run.status) for name in SoakStatus),
            )
        if run.status is not None and run.status != SoakStatus.CANCELLED:
            reasons = [failure["reason"] for failure in run.failures[:1]]
            gauge(
                "asyncsoak_soak_exit_code",
                "The soak's status under --detailed-exit-codes once it ended: 0 passed, else "
                "its primary reason's (see asyncsoak exit-codes); absent when cancelled.",
                float(exits.verdict_exit_code(run.status, reasons, detailed=True)),
            )
        rows.append(
            _counter(
                "asyncsoak_progress_changes",
                "File changes seen in the progress directory.",
                [(soak, float(run.progress_changes))],
            )
        )
        start, sampled = self.started_epoch, self.sample_t()
        if run.last_progress is not None and start is not None:
            gauge(
                "asyncsoak_progress_last_change_timestamp_seconds",
                "When progress was last seen (Unix time).",
                start + run.last_progress,
            )
        gauge(
            "asyncsoak_last_sample_timestamp_seconds",
            "When the monitor last sampled the tree (Unix time): its heartbeat, which stops "
            "moving when the monitor dies or hangs (a textfile keeps its last values).",
            None if start is None or sampled is None else start + sampled,
        )
        gauge(
            "asyncsoak_seconds_since_progress",
            "Seconds since the last progress (since the start before the first one); "
            "absent once the soak ended.",
            self.seconds_since_progress(),
        )
        gauge(
            "asyncsoak_stale_limit_seconds",
            "The limit asyncsoak_seconds_since_progress is held against (the startup "
            "timeout before the first progress, 0 for none).",
            self.stale_limit_seconds(),
        )
        step: Mapping[str, Any] | None = run.step
        if step is not None:  # the training's own figures, once the trainer wrote a step
            gauge("asyncsoak_step", "The training step, as the trainer's files say.", step["step"])
            for name, key, help_text in _STEP_METRICS:
                gauge(name, help_text, number(step.get(key)))
        # The run's time so far as productive and lost (docs/goodput.md), counted once final:
        # 0 until the trainer's second step.
        goodput = run.goodput_fold
        rows.append(
            _counter(
                "asyncsoak_productive_seconds",
                "Seconds of the run spent in productive training steps (the ideal step x the "
                "new steps), counted when each step is final.",
                [(soak, goodput.productive_seconds)],
            )
        )
        rows.append(
            _counter(
                "asyncsoak_badput_seconds",
                "Seconds of the run lost, by kind (startup, slow_steps, checkpoint, stall, "
                "wasted, shutdown, other), counted when final.",
                [((("kind", k), *soak), v) for k, v in goodput.badput_seconds.items()],
            )
        )
        tree = self.tree()
        for name, key, scale, help_text in _TREE_METRICS:
            gauge(name, help_text, scaled(tree.get(key), scale))
        gauge(
            "asyncsoak_tree_memory_growth_bytes_per_second",
            "The trend of the tree's memory that can run out (anonymous + shared: the soak's "
            "trend estimate, after its warm-up).",
            self.growth_bytes_per_second,
        )
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
            labelled(
                "asyncsoak_rank_cpu_cores",
                "CPU each rank uses (its process and its workers), in cores.",
                "rank",
                sorted(self.rank_cpu.items()),
            )
        rows.extend(self._gpu_rows())
        rows.extend(self._gpu_health_rows())
        labelled(
            "asyncsoak_sampler_degraded",
            "1 while a sampler is degraded (its readings missing or late).",
            "sampler",
            sorted(self.degraded().items()),
        )
        return rows

    def _gpu_rows(self) -> list[Row]:
        samples: dict[str, list[Sample]] = {name: [] for name, *_ in _GPU_METRICS}
        samples[_TREE_GPU], samples[_THROTTLE] = [], []
        for index, (uuid, reading, tree_bytes) in sorted(self.gpus().items()):
            key = (("gpu", index), ("soak_id", self.soak_id), ("uuid", uuid))
            for name, field, scale, _ in _GPU_METRICS:
                value = scaled(reading.get(field), scale)
                if value is not None:
                    samples[name].append((name, key, value))
            if tree_bytes is not None:
                samples[_TREE_GPU].append((_TREE_GPU, key, tree_bytes))
            reasons = reading.get("clock_event_reasons")
            if reasons is not None:
                active = {str(r) for r in reasons}
                for reason in sorted(set(CLOCK_EVENT_REASONS.values()) | active):
                    labels = (key[0], ("reason", reason), key[1], key[2])
                    samples[_THROTTLE].append((_THROTTLE, labels, float(reason in active)))
        helps = [(name, help_text) for name, _, _, help_text in _GPU_METRICS]
        helps += [
            (_TREE_GPU, "GPU memory held by the supervised tree's processes."),
            (_THROTTLE, "1 for each clock event reason active on the GPU (NVML's names)."),
        ]
        return [(name, "gauge", text, samples[name]) for name, text in helps if samples[name]]

    def _gpu_health_rows(self) -> list[Row]:
        """The Xid counter by code and the fault gauge per GPU, labelled as dcgm-exporter
        labels GPUs (``gpu``, ``UUID``), so PromQL joins with its series."""
        soak = ("soak_id", self.soak_id)
        faulted = {(index, uuid): False for index, (uuid, _, _) in self.gpus().items()}
        health = {
            ("" if i < 0 else str(i), gpu.uuid or ""): gpu
            for i, gpu in self.run.gpu_health.gpus.items()
        }
        faulted.update({key: True for key, gpu in health.items() if gpu.failed})
        xids = {
            (*key, xid): count for key, gpu in health.items() for xid, count in gpu.xids.items()
        }
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
        if xids:
            rows.append(
                _counter(
                    "asyncsoak_gpu_xid_errors",
                    "Xid errors the kernel logged for the GPU, by Xid code.",
                    [
                        ((("UUID", uuid), ("gpu", index), soak, ("xid", xid)), float(count))
                        for (index, uuid, xid), count in sorted(xids.items())
                    ],
                )
            )
        return rows

    def collect(self) -> Iterator[Metric]:
        """The families for a ``prometheus_client`` registry."""
        from prometheus_client.metrics_core import Metric

        for name, kind, help_text, samples in self.rows():
            family = Metric(name, help_text, kind)
            for sample_name, labels, value in samples:
                family.add_sample(sample_name, dict(labels), value)
            yield family


def _counter(
    name: str, help_text: str, samples: list[tuple[tuple[tuple[str, str], ...], float]]
) -> Row:
    """A counter's row: its samples are ``NAME_total``."""
    return (name, "counter", help_text, [(f"{name}_total", labels, v) for labels, v in samples])
