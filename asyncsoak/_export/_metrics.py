"""Where a soak's live metrics go, checked before anything starts, how a registry is
written (a scrape's body or the node_exporter textfile), and a queue worker's metrics."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._contract import MAX_SECONDS, ValidationError, ValidationTypeError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry


INSTALL_HINT = "prometheus_client is not installed: pip install 'asyncsoak[metrics]'"


class MetricsUnavailableError(ValidationError):
    """Metrics were asked for but ``prometheus_client`` is not installed."""

    def __init__(self, what: str = "live metrics") -> None:
        super().__init__(f"{what}: {INSTALL_HINT}")


@dataclass(frozen=True, slots=True)
class Metrics:
    """Where a soak's live metrics go (``run_soak(metrics=...)``): ``/metrics`` served on
    ``port`` while the soak runs (and up to ``linger_seconds`` after, until a scrape read the
    final status), ``asyncsoak_<soak id>.prom`` written to ``textfile_dir`` at every sample,
    and the soak's collector registered in ``registry`` while it runs."""

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
            raise ValidationError(f"metrics textfile directory is unwritable: {textfile_dir}")
    if port is None and textfile_dir is None and metrics.registry is None:
        raise ValidationError("metrics needs a port, a textfile directory or a registry")
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailableError() from None
    return replace(metrics, textfile_dir=textfile_dir, linger_seconds=float(linger))


def new_registry(*collectors: Any) -> CollectorRegistry:
    """A registry of ``collectors`` (not described at registration: nothing collected)."""
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """A scrape's body and content type: OpenMetrics when ``accept`` asks, else text 0.0.4."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def write_textfile(path: Path, data: bytes) -> None:
    """Replace ``path`` at once: node_exporter reads only ``*.prom``, never the temp name."""
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


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
