"""Artifacts as files: the shipped schema, the check every view loads through, the atomic
write, the log's tail, and the owner-only files asyncsoak creates."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._contract import FailureReason, SoakStatus, StopCause, ValidationError, bounded
from ._artifact import SCHEMA_VERSION

if TYPE_CHECKING:
    from .._contract import Artifact  # a type only: a run never imports the schema

#: Bytes of the captured output copied into the artifact.
LOG_TAIL_BYTES = 16 * 1024
#: Permissions of every file asyncsoak creates: the owner's only.
FILE_MODE = 0o600


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the artifact, shipped in the package."""
    from importlib import resources  # here: a soak never reads the schema

    text = resources.files("asyncsoak").joinpath("artifact.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


#: Schema versions of the artifacts this asyncsoak reads.
KNOWN_SCHEMA_VERSIONS = tuple(range(1, SCHEMA_VERSION + 1))

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class ArtifactError(ValidationError):
    """A file that is not a whole artifact of a schema version this asyncsoak reads."""


def check_artifact(data: object) -> Artifact:
    """``data`` when it is an artifact of a known schema version with every field the shipped
    schema requires, of its types; else :class:`ArtifactError` saying what is wrong (never a
    ``KeyError`` half-way through a view)."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ArtifactError("not an asyncsoak artifact (no schema_version)")
    version = data["schema_version"]
    if isinstance(version, bool) or version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
        raise ArtifactError(
            f"artifact schema version {version!r} is not one this asyncsoak reads ({known}); "
            "it may come from a newer asyncsoak: upgrade asyncsoak"
        )
    schema = load_schema()
    problem = _problem(data, schema, "", schema.get("$defs", {}))
    if problem is not None:
        raise ArtifactError(f"incomplete or damaged artifact: {problem}")
    # The words the schema let through as the enums' members, as ``Artifact`` gives them.
    data["status"] = SoakStatus(data["status"])
    for failure in data["failures"]:
        failure["reason"] = FailureReason(failure["reason"])
    stop = data.get("stop")
    if stop is not None and stop["cause"] is not None:
        stop["cause"] = StopCause(stop["cause"])
    # Sound: the TypedDicts mirror the schema checked (tests/test_vocabulary.py).
    return cast("Artifact", data)


def _problem(value: Any, schema: dict[str, Any], where: str, defs: dict[str, Any]) -> str | None:
    """The first way ``value`` breaks ``schema`` (the subset the artifact's schema uses:
    ``$ref``, ``anyOf``, ``type``, ``enum``, ``required``, ``properties``,
    ``additionalProperties``, ``items``)."""
    if "$ref" in schema:
        return _problem(value, defs[schema["$ref"].rsplit("/", 1)[-1]], where, defs)
    if "anyOf" in schema:
        problems = [_problem(value, option, where, defs) for option in schema["anyOf"]]
        return None if None in problems else problems[0]
    name = where or "the artifact"
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else types
        if not any(
            isinstance(value, _JSON_TYPES[t]) and not (isinstance(value, bool) and t != "boolean")
            for t in allowed
        ):
            return f"{name} is {type(value).__name__}, not {' or '.join(allowed)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{name} is {value!r}, not one of {', '.join(map(repr, schema['enum']))}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                return f"{name} has no {key!r}"
        properties = schema.get("properties", {})
        for key, sub in properties.items():
            if key in value and key != "schema_version":
                found = _problem(value[key], sub, f"{where}.{key}".lstrip("."), defs)
                if found is not None:
                    return found
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in properties:
                    found = _problem(item, extra, f"{where}.{key}".lstrip("."), defs)
                    if found is not None:
                        return found
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found = _problem(item, schema["items"], f"{where}[{i}]", defs)
            if found is not None:
                return found
    return None


def create_private_file(path: Path) -> int:
    """Create (or truncate) ``path`` readable by its owner only; return a writable fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)


def write_artifact(artifact: Mapping[str, Any], path: Path) -> None:
    """Write atomically, readable by the owner only: ``mkstemp`` beside it, fsync, replace."""
    data = json.dumps(artifact, indent=1, allow_nan=False, default=str).encode() + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_log_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of the captured output, decoded leniently; "" when it cannot be
    read or is no regular file (a doctored journal may name ``/dev/zero``)."""
    try:
        with bounded.open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except (OSError, bounded.UnreadableFileError):
        return ""
    text = data.decode("utf-8", errors="replace")
    return text.partition("\n")[2] if size > max_bytes else text  # no partial first line
