"""The package's rooms and the one-way doors between them (docs/architecture.md draws them).

Each subpackage is a room; its ``__init__`` is its door and re-exports what other rooms may use.
A module imports from another room only through that room's door, only from a lower layer, and
never from the package root: so the layers cannot form a cycle, and a room's private modules can
move without touching anyone else.  Read from the source, so a lazy import inside a function
counts as much as one at the top.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsoak._contract._door import door_names

PACKAGE = Path(__file__).resolve().parent.parent / "asyncsoak"

#: Lowest first.  A room imports only from rooms in a lower layer.
LAYERS: tuple[frozenset[str], ...] = (
    # The vocabulary, schema, events, sink, exit and crash decoding, errors and units; and the
    # helpers a training script imports, which pull in nothing else.
    frozenset({"_contract", "trainer"}),
    frozenset({"_process"}),
    frozenset({"_sampling", "_analysis"}),
    frozenset({"_record"}),
    frozenset({"_export"}),
    frozenset({"_supervisor"}),
    frozenset({"queue", "_view"}),
    frozenset({"artifact"}),
    frozenset({"cli"}),
)
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}

#: Scripts that run as programs, not imported by any room: they may use any door.
ENTRY_POINTS = frozenset({"asyncsoak.__main__", "asyncsoak.queue.__main__"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str | None:
    """The room a module belongs to; None for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(path: Path, source: str | None = None) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) for every import of the package in ``path``."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "asyncsoak" or target.startswith("asyncsoak."):
                yield node.lineno, target, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "asyncsoak" or alias.name.startswith("asyncsoak."):
                    yield node.lineno, alias.name, []


def handed_out_whole(target: str) -> bool:
    """Whether ``target`` is a namespace its room's door hands out whole under its own name
    (``asyncsoak._contract.events``): a door of its own."""
    room, _, name = target.removeprefix("asyncsoak.").partition(".")
    init = PACKAGE / room / "__init__.py"
    return init.exists() and door_names(init.read_text()).get(name) == (f".{name}", None)


def offences(path: Path, source: str | None = None) -> Iterator[str]:
    module = module_name(path)
    if module == "asyncsoak" or module in ENTRY_POINTS:
        return
    room = room_of(module)
    assert room is not None
    where = path.relative_to(PACKAGE.parent)
    for line, target, names in imports(path, source):
        shown = f"{where}:{line}: from {target} import {', '.join(names) or '*'}"
        target_room = room_of(target)
        if target_room is None:
            yield f"{shown}: imports the package root (its names come from the rooms)"
            continue
        if target_room == room:
            continue
        if target_room not in RANK or room not in RANK:
            yield f"{shown}: {target_room if target_room not in RANK else room} is in no layer"
            continue
        if RANK[target_room] >= RANK[room]:
            yield f"{shown}: {room} may not import {target_room} (same or higher layer)"
        if target != f"asyncsoak.{target_room}" and not handed_out_whole(target):
            yield f"{shown}: reaches past {target_room}'s door"
        private = [name for name in names if name.startswith("_")]
        if private:
            yield f"{shown}: takes private names {private} through {target_room}'s door"


def test_every_room_is_in_a_layer() -> None:
    rooms = {room_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    rooms -= {None, "__main__", "_demo_trainer"}
    assert rooms == set(RANK), "add new rooms to LAYERS (and docs/architecture.md)"


def test_rooms_import_each_other_through_doors_and_downwards_only() -> None:
    found = [offence for path in sorted(PACKAGE.rglob("*.py")) for offence in offences(path)]
    assert not found, "imports that break the layers:\n" + "\n".join(found)


def test_the_demo_trainer_and_the_trainer_helpers_stand_alone() -> None:
    """Both run inside training scripts: they import nothing else of the package (the trainer
    room's modules only each other)."""
    assert not list(imports(PACKAGE / "_demo_trainer.py"))
    for path in (PACKAGE / "trainer").glob("*.py"):
        outside = [t for _, t, _ in imports(path) if not t.startswith("asyncsoak.trainer")]
        assert not outside, (path.name, outside)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from .._contract._events import Progress\n", "reaches past _contract's door"),
        ("from .._supervisor import run_soak\n", "same or higher layer"),
        ("from .. import __version__\n", "imports the package root"),
        ("from .._process import _tree\n", "takes private names"),
    ],
)
def test_an_offending_import_is_named(source: str, problem: str) -> None:
    """The check itself: each kind of offence is caught and printed with its file and line."""
    found = list(offences(PACKAGE / "_analysis" / "_layer_probe.py", source))
    assert len(found) == 1
    assert "asyncsoak/_analysis/_layer_probe.py:1: from asyncsoak" in found[0]
    assert problem in found[0]


def test_a_namespace_a_door_hands_out_whole_is_a_door_too() -> None:
    probe = PACKAGE / "_analysis" / "_layer_probe.py"
    assert not list(offences(probe, "from .._contract.events import Progress\n"))
    assert list(offences(probe, "from .._process._cgroup import read_limits\n"))


def door_lists(init: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A door's names as the type checker reads them, and as :func:`lazy_door` reads them."""
    typed: dict[str, str] = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                for alias in statement.names:
                    whole = statement.module is None  # a module exported whole, a namespace
                    typed[alias.asname or alias.name] = (
                        f".{alias.name}" if whole else f".{statement.module}"
                    )
    lazy = {name: module for name, (module, _) in door_names(init.read_text()).items()}
    return typed, lazy


@pytest.mark.parametrize(
    "init",
    sorted(
        path
        for path in PACKAGE.rglob("*/*.py")
        if "lazy_door(" in path.read_text() and path.name != "_door.py"
    ),
    ids=lambda path: str(path.parent.relative_to(PACKAGE)),
)
def test_each_door_opens_on_what_it_declares(init: Path) -> None:
    """What the type checker is told a door exports is what the door hands out, and each name
    is found in its module (every door that opens lazily, at any depth; the command line's is
    its own module)."""
    typed, lazy = door_lists(init)
    assert typed, f"{init.parent.name}'s door declares nothing"
    assert typed == lazy
    door = importlib.import_module(module_name(init))
    missing = [name for name in typed if not hasattr(door, name)]
    assert not missing


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, every import counted (a function's, a
    ``TYPE_CHECKING`` one).  A room's door (``asyncsoak.X``) and the package root are no
    modules of a loop; a sub-room's door (``report``) is, as its imports run at once."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = {m for m in paths if m.count(".") > 1 or paths[m].name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for module in modules:
        targets: set[str] = set()
        for _, target, names in imports(paths[module]):
            targets.update(f"{target}.{name}" for name in names)  # ``from . import _x``
            targets.add(target)
        graph[module] = (targets & modules) - {module}
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[tuple[frozenset[str], list[str]]]:
    """Each set of modules that import each other (strongly connected, two or more: Tarjan's),
    with one loop through it as a path that ends where it starts."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[tuple[frozenset[str], list[str]]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(members) > 1:
                loops.append((frozenset(members), _path_back(graph, min(members), set(members))))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return loops


def _path_back(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest way from ``start`` back to itself within ``members``."""
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module] & members):
            if target == start:
                back = [module]
                while back[-1] != start:
                    back.append(came_from[back[-1]])
                return [*reversed(back), start]
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"{start} is in no loop")


def test_no_two_modules_import_each_other_in_a_loop() -> None:
    """No two modules of the package import each other, directly or round a loop, counting
    every import (a function's, a ``TYPE_CHECKING`` one): each loop found is named."""
    new = [" -> ".join(loop) for _, loop in import_loops(import_graph())]
    assert not new, "modules that import each other in a loop:\n" + "\n".join(new)


def test_an_import_loop_is_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_loops(graph) == [(frozenset("abc"), ["a", "b", "c", "a"])]


def test_the_contract_door_hands_out_at_most_60_names() -> None:
    """Every room reads the contract's door: it names what all of them use (the vocabulary,
    errors, units, ``run_blocking``, the sink) and hands out the events, the artifact's schema
    and the exits as namespaces (``events.SampleJson``), so a reader takes it in at a glance."""
    door = importlib.import_module("asyncsoak._contract")
    names = {name for name in dir(door) if not name.startswith("_")}
    names -= {"annotations", "TYPE_CHECKING"}  # the door's own imports
    assert len(names) <= 60, f"{len(names)} names: {sorted(names)}"
