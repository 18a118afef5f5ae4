"""asyncsoak: supervise long training runs and explain them afterwards.  Imports are lazy:
``import asyncsoak.trainer`` (inside training scripts) pulls in neither anyio nor psutil."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._contract import AsyncsoakError as AsyncsoakError
    from ._contract import MonitorError as MonitorError
    from ._contract import SoakFailureError as SoakFailureError
    from ._contract import ValidationError as ValidationError
    from ._contract import ValidationTypeError as ValidationTypeError
    from ._export import Metrics as Metrics
    from ._record import read_journal as read_journal
    from ._sampling import runtime_snapshot as runtime_snapshot
    from ._supervisor import SoakConfig as SoakConfig
    from ._supervisor import SoakControl as SoakControl
    from ._supervisor import run_soak as run_soak

#: Served by :func:`__getattr__` from the contract room, where pyproject.toml reads it too.
__version__: str

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
    "AsyncsoakError": "._contract",
    "Metrics": "._export",
    "MonitorError": "._contract",
    "SoakConfig": "._supervisor",
    "SoakControl": "._supervisor",
    "SoakFailureError": "._contract",
    "read_journal": "._record",
    "ValidationError": "._contract",
    "ValidationTypeError": "._contract",
    "run_soak": "._supervisor",
    "runtime_snapshot": "._sampling",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # From the contract room, where pyproject.toml reads it too.
        return importlib.import_module("._contract._version", __name__).VERSION
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
