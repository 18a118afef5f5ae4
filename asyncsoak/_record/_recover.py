"""Rebuild an artifact from a soak's journal, the record a dead monitor leaves, folded through
the serializer's :class:`RunState`; without a ``finished`` line, the monitor was lost."""

from __future__ import annotations

import os
from pathlib import Path

from .._analysis import Ledger
from .._contract import Artifact, FailureReason, Masker, SoakStatus, secret_values
from ._artifact import RunState, UnknownWordError
from ._artifact_io import read_log_tail
from ._journal import JournalReader


class JournalError(ValueError):
    """The file is not a soak journal (no header line), or one whose events are damaged."""


#: What folding an event of the wrong shape raises (a field missing, text for a number).
_DAMAGE = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


def artifact_from_journal(path: Path) -> Artifact:
    """The artifact of the soak whose journal is ``path``, valid against the schema (lines it
    cannot read skipped, counted in ``monitor.unreadable_journal_lines``)."""
    builder, folded, unreadable = _fold(path)
    try:
        return _fold_end(path, builder, folded, unreadable)
    except _DAMAGE as exc:
        raise JournalError(
            f"{path}: its header or events are damaged ({type(exc).__name__}: "
            f"{str(exc)[:80]}): not a journal asyncsoak wrote"
        ) from None


def journal_goodput(path: Path, earlier_highest_step: int | None) -> Ledger:
    """The goodput ledger of the soak whose journal is ``path``, its steps at or below
    ``earlier_highest_step`` (an earlier attempt's) counted as redone."""
    return _fold(path)[0].goodput(earlier_highest_step)


def _fold(path: Path) -> tuple[RunState, int, int]:
    """The journal folded: the state, the events folded and the lines unreadable."""
    builder = RunState()
    folded = 0
    reader = JournalReader(path)
    for event in reader:
        try:
            builder.add(event)
        except UnknownWordError as exc:
            raise JournalError(f"{path}: event {folded + 1}: {exc}") from None
        except _DAMAGE as exc:  # a foreign or doctored file: refused whole, never a traceback
            raise JournalError(
                f"{path}: event {folded + 1} ({str(event.get('kind'))[:40]!r}) is damaged "
                f"({type(exc).__name__}: {str(exc)[:80]}): not a journal asyncsoak wrote"
            ) from None
        folded += 1
    if builder.header is None:
        raise JournalError(f"{path} is not an asyncsoak journal: it has no header line")
    return builder, folded, reader.unreadable


def _fold_end(path: Path, builder: RunState, folded: int, unreadable: int) -> Artifact:
    """The artifact once every event is folded: the lost monitor, the log's tail."""
    header = builder.header
    assert header is not None  # _fold refuses a journal without one
    status = builder.status
    if status is None:
        status = SoakStatus.FAILED
        message = (
            f"the monitor stopped {builder.last_t:.1f}s into the run without finishing its "
            "journal (killed, out of memory, or the machine went down); "
        )
        if builder.exit_t is not None:
            message += f"the command had exited with status {builder.exit['returncode']}"
        else:
            message += "what the command did after that is unknown"
        lost = FailureReason.MONITOR_LOST
        at = builder.wall(builder.last_t)
        builder.failures.append({"reason": lost, "message": message, "at": at})
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
            "events": folded,
            "unreadable_journal_lines": unreadable,
        },
    )
    if artifact["monitor"]["journal_path"] is None:
        artifact["monitor"]["journal_path"] = str(path)
    return artifact
