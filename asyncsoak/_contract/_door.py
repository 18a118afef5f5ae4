"""A room's door that opens on first use: it names its exports once, as imports only the type
checker runs, and :func:`lazy_door` imports a name's module when the name is first used."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

_IMPORT = re.compile(r"^\s+from (\.[\w.]*) import (\([^)]*\)|[^\n]*)", re.MULTILINE)


def door_names(source: str) -> dict[str, tuple[str, str | None]]:
    """What a door's ``if TYPE_CHECKING:`` block imports: name -> (module, name there), or
    (module, None) for a module handed out whole (``from . import _cgroup as cgroups``)."""
    block = source.partition("if TYPE_CHECKING:\n")[2].partition("\n\n")[0]
    names: dict[str, tuple[str, str | None]] = {}
    for module, imported in _IMPORT.findall(block):
        imported = re.sub(r"#[^\n]*", "", imported)  # comments
        for alias in imported.strip("()").replace("\n", " ").split(","):
            name, _, exported = alias.strip().partition(" as ")
            if name:
                names[exported or name] = (f".{name}", None) if module == "." else (module, name)
    return names


def lazy_door(room: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the door of ``room`` (its ``__name__``), whose
    ``__init__`` is ``init_file``; a namespace handed out whole may open the same way."""
    with open(init_file, encoding="utf-8") as source:
        names = door_names(source.read())

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {room!r} has no attribute {name!r}")
        module, attribute = names[name]
        value = importlib.import_module(module, sys.modules[room].__package__)
        if attribute is not None:
            value = getattr(value, attribute)
        setattr(sys.modules[room], name, value)  # the next use is a plain attribute read
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[room]), *names})

    return __getattr__, __dir__
