"""asyncsoak: supervise long training runs and explain them afterwards.

Imports are lazy so that ``import asyncsoak.trainer`` (used inside training scripts) pulls in
neither anyio nor psutil.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._errors import AsyncsoakError as AsyncsoakError
    from ._errors import MonitorError as MonitorError
    from ._errors import SoakFailureError as SoakFailureError
    from ._errors import ValidationError as ValidationError
    from ._errors import ValidationTypeError as ValidationTypeError
    from ._export._metrics import Metrics as Metrics
    from ._record._journal import read_journal as read_journal
    from ._record._snapshot import runtime_snapshot as runtime_snapshot
    from ._supervisor._config import SoakConfig as SoakConfig
    from ._supervisor._control import SoakControl as SoakControl
    from ._supervisor._soak import run_soak as run_soak

__all__ = [
    "AsyncsoakError",
    "Metrics",
    "MonitorError",
    "SoakConfig",
    "SoakControl",
    "SoakFailureError",
    "ValidationError",
    "ValidationTypeError",
    "read_journal",
    "run_soak",
    "runtime_snapshot",
]

_LAZY = {
    "AsyncsoakError": "._errors",
    "Metrics": "._export._metrics",
    "MonitorError": "._errors",
    "SoakConfig": "._supervisor._config",
    "SoakControl": "._supervisor._control",
    "SoakFailureError": "._errors",
    "read_journal": "._record._journal",
    "ValidationError": "._errors",
    "ValidationTypeError": "._errors",
    "run_soak": "._supervisor._soak",
    "runtime_snapshot": "._record._snapshot",
}

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncsoak' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    # Shown, pickled and documented as asyncsoak.NAME, as anyio and httpcore do.
    value.__module__ = __name__
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
