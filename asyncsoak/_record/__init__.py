"""Recording.

The serializer that drains the events into the journal, the journal's format, the artifact
builder (every event folded into one artifact) and recovery of an artifact from a journal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._artifact import EVENTS_HEAD as EVENTS_HEAD
    from ._artifact import FILE_MODE as FILE_MODE
    from ._artifact import KNOWN_SCHEMA_VERSIONS as KNOWN_SCHEMA_VERSIONS
    from ._artifact import SCHEMA_VERSION as SCHEMA_VERSION
    from ._artifact import ArtifactBuilder as ArtifactBuilder
    from ._artifact import ArtifactError as ArtifactError
    from ._artifact import check_artifact as check_artifact
    from ._artifact import create_private_file as create_private_file
    from ._artifact import load_schema as load_schema
    from ._artifact import read_log_tail as read_log_tail
    from ._artifact import write_artifact as write_artifact
    from ._journal import JournalDecoder as JournalDecoder
    from ._journal import JournalReader as JournalReader
    from ._journal import first_line as first_line
    from ._journal import is_journal as is_journal
    from ._journal import journal_segments as journal_segments
    from ._journal import read_journal as read_journal
    from ._journal import remove_closed_segments as remove_closed_segments
    from ._recover import JournalError as JournalError
    from ._recover import artifact_from_journal as artifact_from_journal
    from ._serializer import Observer as Observer
    from ._serializer import Serializer as Serializer
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "ArtifactBuilder": "._artifact",
            "ArtifactError": "._artifact",
            "EVENTS_HEAD": "._artifact",
            "FILE_MODE": "._artifact",
            "KNOWN_SCHEMA_VERSIONS": "._artifact",
            "SCHEMA_VERSION": "._artifact",
            "check_artifact": "._artifact",
            "create_private_file": "._artifact",
            "load_schema": "._artifact",
            "read_log_tail": "._artifact",
            "write_artifact": "._artifact",
            "JournalDecoder": "._journal",
            "JournalReader": "._journal",
            "first_line": "._journal",
            "is_journal": "._journal",
            "journal_segments": "._journal",
            "read_journal": "._journal",
            "remove_closed_segments": "._journal",
            "JournalError": "._recover",
            "artifact_from_journal": "._recover",
            "Observer": "._serializer",
            "Serializer": "._serializer",
        },
    )
