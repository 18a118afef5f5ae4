"""asyncsoak's exceptions: one base, messages built from fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class AsyncsoakError(Exception):
    """Base of asyncsoak's own errors."""


class ValidationError(AsyncsoakError, ValueError):
    """Bad input from the caller, refused before anything is launched or written: the only
    error the CLI reports as usage (exit 2) and the worker as ``invalid_job``."""


class ValidationTypeError(ValidationError, TypeError):
    """Bad input of the wrong type (a string where argv is expected...): also a ``TypeError``."""


class SoakFailureError(RuntimeError, AsyncsoakError):
    """Raised when a supervised soak violates a fail-closed condition.

    The artifact has already been written when this is raised.  ``reason`` is the primary
    reason code; ``failures`` lists every rule that fired as ``{reason, message, at}``.
    """

    def __init__(self, artifact: dict[str, Any], artifact_path: Path) -> None:
        self.artifact = artifact
        self.artifact_path = artifact_path
        self.failures: list[dict[str, Any]] = list(artifact.get("failures", []))
        self.reason: str = self.failures[0]["reason"] if self.failures else "unknown"
        message = self.failures[0]["message"] if self.failures else "soak failed"
        super().__init__(f"soak failed: {self.reason}: {message} (artifact: {artifact_path})")


class MonitorError(AsyncsoakError):
    """The monitor itself broke (a bug or an environment problem), not the supervised run."""


# The public errors show (in tracebacks, reprs, pickles) under their public path, asyncsoak.NAME,
# whichever module raised them, as anyio and httpcore do.
for _error in (
    AsyncsoakError,
    ValidationError,
    ValidationTypeError,
    SoakFailureError,
    MonitorError,
):
    _error.__module__ = "asyncsoak"
del _error
