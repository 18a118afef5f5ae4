"""Recording: the serializer, the journal's format, the run's state that builds the artifact,
and recovery of an artifact from a journal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._artifact import EVENTS_HEAD as EVENTS_HEAD
    from ._artifact import SCHEMA_VERSION as SCHEMA_VERSION
    from ._artifact import RunState as RunState
    from ._artifact_io import FILE_MODE as FILE_MODE
    from ._artifact_io import KNOWN_SCHEMA_VERSIONS as KNOWN_SCHEMA_VERSIONS
    from ._artifact_io import ArtifactError as ArtifactError
    from ._artifact_io import check_artifact as check_artifact
    from ._artifact_io import create_private_file as create_private_file
    from ._artifact_io import load_schema as load_schema
    from ._artifact_io import read_log_tail as read_log_tail
    from ._artifact_io import write_artifact as write_artifact
    from ._deadlines import Deadline as Deadline
    from ._deadlines import overdue_message as overdue_message
    from ._journal import JournalDecoder as JournalDecoder
    from ._journal import JournalReader as JournalReader
    from ._journal import first_line as first_line
    from ._journal import is_journal as is_journal
    from ._journal import journal_segments as journal_segments
    from ._journal import monitor_holds as monitor_holds
    from ._journal import read_journal as read_journal
    from ._journal import remove_closed_segments as remove_closed_segments
    from ._recover import JournalError as JournalError
    from ._recover import artifact_from_journal as artifact_from_journal
    from ._recover import journal_goodput as journal_goodput
    from ._serializer import Observer as Observer
    from ._serializer import Serializer as Serializer

__getattr__, __dir__ = lazy_door(__name__, __file__)
