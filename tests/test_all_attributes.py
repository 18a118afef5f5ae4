"""Each public module's ``__all__`` is exactly what it exports, under the public path."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import ModuleType

import anyio
import pytest

import asyncsoak
from asyncsoak import artifact

PUBLIC = [asyncsoak, artifact]
#: The exceptions the package exports.
ERRORS = (
    "AsyncsoakError",
    "MonitorError",
    "SoakFailureError",
    "ValidationError",
    "ValidationTypeError",
)


def _defined_in_asyncsoak(value: object) -> bool:
    """Whether ``value`` is a class or function of asyncsoak (not an imported helper)."""
    if inspect.ismodule(value) or not (inspect.isclass(value) or inspect.isroutine(value)):
        return False
    return inspect.getmodule(value) is not None and str(
        getattr(inspect.getmodule(value), "__name__", "")
    ).startswith("asyncsoak")


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_all_is_sorted_and_unique(module: ModuleType) -> None:
    """__all__ is sorted (constants, classes, functions: ruff's order), without repeats."""
    assert module.__all__ == sorted(set(module.__all__), key=_isort_key)


def _isort_key(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_every_name_in_all_resolves_under_the_public_path(module: ModuleType) -> None:
    """Every name in __all__ resolves, and its classes and functions name the public module."""
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isroutine(value):
            assert value.__module__ == module.__name__, name


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_every_public_class_and_function_is_in_all(module: ModuleType) -> None:
    """No class or function of asyncsoak is reachable by a public name without being in __all__."""
    for name in module.__all__:
        getattr(module, name)  # resolve the lazy ones, so dir() shows them
    public = {
        name
        for name in dir(module)
        if not name.startswith("_") and _defined_in_asyncsoak(getattr(module, name))
    }
    assert public <= set(module.__all__), public - set(module.__all__)


def test_the_package_lazily_offers_exactly_all() -> None:
    """The names the package resolves lazily are exactly __all__, and others are refused."""
    lazy: dict[str, str] = vars(asyncsoak)["_LAZY"]
    assert sorted(lazy) == asyncsoak.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = asyncsoak.no_such_name


def test_errors_show_their_public_path_before_the_package_resolves_them() -> None:
    """An error raised by a private module is shown as asyncsoak.NAME in a fresh interpreter."""
    names = ", ".join(ERRORS)
    code = (
        f"from asyncsoak._contract._errors import {names}\n"
        f"print(*(e.__module__ for e in ({names},)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["asyncsoak"] * len(ERRORS)


def test_public_errors_and_enums_pickle_by_their_public_path() -> None:
    """A pickled error or enum member names the public module and loads back equal."""
    error = asyncsoak.ValidationError("bad --interval")
    data = pickle.dumps(error)
    assert b"asyncsoak._contract._errors" not in data
    loaded = pickle.loads(data)
    assert type(loaded) is asyncsoak.ValidationError
    assert loaded.args == error.args
    status = pickle.dumps(artifact.SoakStatus.PASSED)
    assert b"asyncsoak.artifact" in status
    assert pickle.loads(status) is artifact.SoakStatus.PASSED


def test_the_error_hierarchy_is_exported(tmp_path: Path) -> None:
    """AsyncsoakError is the base of the exported errors; ValidationError is a ValueError, and
    its type flavour also a TypeError, so callers catch bad input either way."""
    for name in ERRORS:
        assert name in asyncsoak.__all__, name
        assert issubclass(getattr(asyncsoak, name), asyncsoak.AsyncsoakError), name
    assert issubclass(asyncsoak.ValidationError, ValueError)
    assert issubclass(asyncsoak.ValidationTypeError, asyncsoak.ValidationError)
    assert issubclass(asyncsoak.ValidationTypeError, TypeError)
    soak = partial(
        asyncsoak.run_soak,
        command="python train.py",  # a string, not argv: refused as a type error
        progress_dir=tmp_path,
        output_path=tmp_path / "soak.json",
    )
    with pytest.raises(asyncsoak.ValidationTypeError, match="argv"):
        anyio.run(soak)
    assert list(tmp_path.iterdir()) == []
    assert issubclass(asyncsoak.SoakFailureError, asyncsoak.AsyncsoakError)
    assert issubclass(artifact.ArtifactError, asyncsoak.ValidationError)
