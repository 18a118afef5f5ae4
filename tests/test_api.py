"""The public surface: exports, lazy imports, the error type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncsoak
from asyncsoak import SoakFailureError


def test_all_lists_exactly_the_public_exports() -> None:
    """__all__ is sorted and every name in it resolves."""
    assert asyncsoak.__all__ == sorted(asyncsoak.__all__)
    for name in asyncsoak.__all__:
        assert getattr(asyncsoak, name) is not None
    public = {n for n in dir(asyncsoak) if not n.startswith("_")}
    assert set(asyncsoak.__all__) <= public


def test_importing_the_package_is_lazy() -> None:
    """`import asyncsoak` pulls in neither anyio nor psutil until a name is used."""
    code = "import sys, asyncsoak; print('anyio' in sys.modules, 'psutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_soak_failure_error_is_a_runtime_error() -> None:
    """SoakFailureError is a RuntimeError carrying the reason, failures and artifact path."""
    artifact = {"failures": [{"reason": "stale_progress", "message": "m", "at": None}]}
    error = SoakFailureError(artifact, Path("x.json"))
    assert isinstance(error, RuntimeError)
    assert error.reason == "stale_progress"
    assert error.failures == artifact["failures"]
    assert error.artifact_path == Path("x.json")
