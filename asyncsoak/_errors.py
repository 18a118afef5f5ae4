"""asyncsoak's exceptions: one base, messages built from fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class AsyncsoakError(Exception):
    """Base of asyncsoak's own errors."""


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
