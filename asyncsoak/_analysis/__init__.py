"""Judgement over time.

The trend estimator and the fold of a run's series that the trend rules read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._activity import GpuActivity as GpuActivity
    from ._activity import describe_activity as describe_activity
    from ._activity import describe_gpus as describe_gpus
    from ._activity import recorded_gpus as recorded_gpus
    from ._activity import tree_verdict as tree_verdict
    from ._gpu_health import GpuHealthFold as GpuHealthFold
    from ._trends import MAX_WINDOWS as MAX_WINDOWS
    from ._trends import SAMPLES_PER_WINDOW as SAMPLES_PER_WINDOW
    from ._trends import describe_growth as describe_growth
    from ._trends import format_amount as format_amount
    from ._trends import format_bytes as format_bytes
    from ._trends import median as median
    from ._trends import theil_sen as theil_sen
    from ._trends import windowed_minima as windowed_minima
    from ._trendwatch import GPU_SETTLE_SECONDS as GPU_SETTLE_SECONDS
    from ._trendwatch import TREE_MEMORY_SERIES as TREE_MEMORY_SERIES
    from ._trendwatch import TrendWatch as TrendWatch
    from ._trendwatch import straggler_text as straggler_text
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "median": "._trends",
            "GpuActivity": "._activity",
            "describe_activity": "._activity",
            "describe_gpus": "._activity",
            "recorded_gpus": "._activity",
            "tree_verdict": "._activity",
            "GpuHealthFold": "._gpu_health",
            "MAX_WINDOWS": "._trends",
            "SAMPLES_PER_WINDOW": "._trends",
            "describe_growth": "._trends",
            "format_amount": "._trends",
            "format_bytes": "._trends",
            "theil_sen": "._trends",
            "windowed_minima": "._trends",
            "GPU_SETTLE_SECONDS": "._trendwatch",
            "TREE_MEMORY_SERIES": "._trendwatch",
            "TrendWatch": "._trendwatch",
            "straggler_text": "._trendwatch",
        },
    )
