"""Recording.

Events, the event sink, the serializer and the journal's format, the artifact builder, bounded
series, recovery, the runtime snapshot.
"""

from __future__ import annotations

from ._artifact import EVENTS_HEAD as EVENTS_HEAD
from ._artifact import FILE_MODE as FILE_MODE
from ._artifact import KNOWN_SCHEMA_VERSIONS as KNOWN_SCHEMA_VERSIONS
from ._artifact import SCHEMA_VERSION as SCHEMA_VERSION

# The door: what other rooms may use.
from ._artifact import ArtifactBuilder as ArtifactBuilder
from ._artifact import ArtifactError as ArtifactError
from ._artifact import check_artifact as check_artifact
from ._artifact import create_private_file as create_private_file
from ._artifact import load_schema as load_schema
from ._artifact import read_log_tail as read_log_tail
from ._artifact import write_artifact as write_artifact
from ._journal import JournalDecoder as JournalDecoder
from ._journal import first_line as first_line
from ._journal import is_journal as is_journal
from ._journal import journal_segments as journal_segments
from ._journal import read_journal as read_journal
from ._journal import remove_closed_segments as remove_closed_segments
from ._recover import JournalError as JournalError
from ._recover import artifact_from_journal as artifact_from_journal
from ._serializer import Serializer as Serializer
