"""A room's door that opens on first use.

Every room's ``__init__`` names what other rooms may use, as imports that only the type checker
reads, and hands the same names to :func:`lazy_door`.  A name's module is imported when the name
is first used, so touching one name costs one module: the reaper, the command line's parser and
``import asyncsoak.trainer`` do not pay for the rooms they never use.  ``tests/test_layers.py``
holds the two lists to each other.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_door(
    room: str, names: Mapping[str, str], modules: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the door of ``room`` (its ``__name__``).

    ``names`` maps each exported name to the room's module that defines it (``"._config"``);
    ``modules`` maps a name to a module exported whole, as a namespace (``slurm.in_job()``).
    """
    wholes = dict(modules or {})

    def __getattr__(name: str) -> Any:
        if name in wholes:
            value: Any = importlib.import_module(wholes[name], room)
        elif name in names:
            value = getattr(importlib.import_module(names[name], room), name)
        else:
            raise AttributeError(f"module {room!r} has no attribute {name!r}")
        setattr(sys.modules[room], name, value)  # the next use is a plain attribute read
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[room]), *names, *wholes})

    return __getattr__, __dir__
