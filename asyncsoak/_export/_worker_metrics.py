"""A queue worker's metrics."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


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
