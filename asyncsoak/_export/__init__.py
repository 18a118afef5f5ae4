"""Live metrics for Prometheus: the soak's and the worker's, the bounded endpoint, the textfile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._metrics import Metrics as Metrics
    from ._metrics import MetricsUnavailableError as MetricsUnavailableError
    from ._metrics import WorkerMetrics as WorkerMetrics
    from ._metrics import new_registry as new_registry
    from ._metrics import render as render
    from ._metrics import validate_metrics as validate_metrics
    from ._metrics_server import MetricsServer as MetricsServer
    from ._metrics_server import open_listener as open_listener
    from ._metrics_server import open_soak_metrics as open_soak_metrics

__getattr__, __dir__ = lazy_door(__name__, __file__)
