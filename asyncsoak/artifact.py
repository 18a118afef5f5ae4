"""Read what a soak wrote: its artifact, or its journal when the monitor never wrote one.

``artifact.load("runs/7/soak.json")`` (or ``soak.jsonl``, rebuilt as ``asyncsoak recover``
does) returns an :class:`Artifact`; ``artifact.summarize(run)`` is what ``asyncsoak summary
--json`` prints.  The artifact's shape is the JSON Schema :func:`schema` returns
(``artifact.schema.json`` in the package); its statuses, failure reasons, stop causes and event
kinds are the enums here.  :class:`Artifact` is the ``TypedDict`` that schema is generated from,
so ``mypy --strict`` checks what a script indexes.  Examples: docs/artifact.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._contract import Artifact, EventKind, FailureReason, SoakStatus, StopCause
from ._contract import bounded as _bounded
from ._record import KNOWN_SCHEMA_VERSIONS, SCHEMA_VERSION, ArtifactError
from ._record import JournalError as _JournalError
from ._record import artifact_from_journal as _artifact_from_journal
from ._record import check_artifact as _check_artifact
from ._record import is_journal as _is_journal
from ._record import load_schema as _load_schema
from ._view import summarize

__all__ = [
    "KNOWN_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactError",
    "EventKind",
    "FailureReason",
    "SoakStatus",
    "StopCause",
    "load",
    "schema",
    "summarize",
]


def load(path: str | os.PathLike[str]) -> Artifact:
    """The artifact at ``path``: a ``soak.json``, or a soak journal (``soak.jsonl``).

    A journal is folded into an artifact as ``asyncsoak recover`` does: a journal without its
    ``finished`` line (the monitor died) gives status ``failed`` with reason ``monitor_lost``.
    An artifact is checked against the schema of its version.  Raises :class:`ArtifactError`
    (a ``ValueError``) for a file that is neither (a device or a FIFO, an artifact larger than
    256 MiB, JSON nested more than 64 deep), and ``OSError`` when it cannot be read.
    """
    path = Path(path)
    if _is_journal(path):
        try:
            rebuilt = _artifact_from_journal(path)
        except (_JournalError, _bounded.UnreadableFileError) as exc:
            raise ArtifactError(str(exc)) from exc
        try:
            # Checked as a written artifact is: a doctored journal's values reach the views.
            return _check_artifact(rebuilt)
        except ArtifactError as exc:
            raise ArtifactError(f"{path}: {exc}") from exc
    try:
        data = _bounded.read_json_file(path)
    except _bounded.UnreadableFileError as exc:
        raise ArtifactError(str(exc)) from exc
    except ValueError as exc:
        raise ArtifactError(f"{path} is not an asyncsoak artifact or journal: {exc}") from exc
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ArtifactError(f"{path} is not an asyncsoak artifact or journal")
    try:
        return _check_artifact(data)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from exc


def schema() -> dict[str, Any]:
    """The artifact's JSON Schema (draft 2020-12), a fresh copy on each call."""
    return _load_schema()


# Shown, pickled and documented under the public path, as anyio and httpcore do.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) or callable(_value):
        _value.__module__ = __name__
del _name, _value
