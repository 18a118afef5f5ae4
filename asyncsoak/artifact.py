"""Read what a soak wrote: :func:`load` gives the :class:`Artifact` (a ``TypedDict``, so
``mypy --strict`` checks what a script indexes) of a ``soak.json``, or of its journal;
:func:`summarize` is ``asyncsoak summary --json``; :func:`schema` the JSON Schema."""

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
    """The artifact at ``path`` (``soak.json``), or rebuilt from a journal (``soak.jsonl``) as
    ``recover`` does (no ``finished`` line: ``failed``, ``monitor_lost``); checked against its
    version's schema.  :class:`ArtifactError` (a ``ValueError``) for a file that is neither (a
    FIFO, over 256 MiB, nested over 64 deep), ``OSError`` when it cannot be read."""
    path = Path(path)
    if _is_journal(path):
        try:
            data: Any = _artifact_from_journal(path)
        except (_JournalError, _bounded.UnreadableFileError) as exc:
            raise ArtifactError(str(exc)) from exc
    else:
        try:
            data = _bounded.read_json_file(path)
        except _bounded.UnreadableFileError as exc:
            raise ArtifactError(str(exc)) from exc
        except ValueError as exc:
            raise ArtifactError(f"{path} is not an asyncsoak artifact or journal: {exc}") from exc
        if not isinstance(data, dict) or "schema_version" not in data:
            raise ArtifactError(f"{path} is not an asyncsoak artifact or journal")
    try:
        # A rebuilt journal too: a doctored journal's values reach the views.
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
