"""Rebuild an artifact from a soak's journal: the record a dead monitor leaves behind.

The journal is flushed on every batch, so it holds everything up to the moment the monitor
died; it is read through ``_journal`` (its segments, compressed or not, full and compact
lines).  Folding it through the same :class:`ArtifactBuilder` the serializer uses gives an
artifact of the same shape; a journal without a ``finished`` line means the monitor never
finished, which is the ``monitor_lost`` failure.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._redact import Masker, secret_values
from ._artifact import ArtifactBuilder, read_log_tail
from ._journal import JournalReader
from ._schema import Artifact
from ._vocabulary import FailureReason, SoakStatus


class JournalError(ValueError):
    """The file is not a soak journal (no header line)."""


def artifact_from_journal(path: Path) -> Artifact:
    """The artifact of the soak whose journal is ``path``, valid against the schema.

    A truncated last line (the monitor died mid-write) and any other unreadable line are
    skipped and counted in ``monitor.unreadable_journal_lines``.
    """
    builder = ArtifactBuilder()
    events = 0
    reader = JournalReader(path)
    for event in reader:
        builder.add(event)
        events += 1
    unreadable = reader.unreadable
    header = builder.header
    if header is None:
        raise JournalError(f"{path} is not an asyncsoak journal: it has no header line")
    status = builder.status
    if status is None:
        status = SoakStatus.FAILED
        builder.failures.append(
            {
                "reason": FailureReason.MONITOR_LOST,
                "message": _lost_message(builder),
                "at": builder.wall(builder.last_t),
            }
        )
    log_tail = ""
    log_path = header.get("log_path")
    if log_path:
        # The monitor masked secrets of the command's environment; that environment is gone,
        # so mask those of the environment recovering it (usually the same shell or worker).
        masker = Masker(secret_values(os.environ, header.get("metadata") or {}))
        log_tail = masker(read_log_tail(Path(log_path)))
    artifact = builder.build_typed(
        status=status,
        ended_t=builder.last_t,
        log_tail=log_tail,
        monitor={
            "recovered_from_journal": str(path),
            "events": events,
            "unreadable_journal_lines": unreadable,
        },
    )
    if artifact["monitor"]["journal_path"] is None:
        artifact["monitor"]["journal_path"] = str(path)
    return artifact


def _lost_message(builder: ArtifactBuilder) -> str:
    message = (
        f"the monitor stopped {builder.last_t:.1f}s into the run without finishing its "
        "journal (killed, out of memory, or the machine went down)"
    )
    if builder.exit_t is not None:
        returncode = builder.exit["returncode"]
        return f"{message}; the command had exited with status {returncode}"
    return f"{message}; what the command did after that is unknown"
