"""The contract every room shares, importing no other room: the vocabulary, errors, units and
the like as names; the events, the artifact's sections, exits and bounded reads as namespaces
(``events``, ``schema``, ``exits``, ``bounded``) it hands out whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._door import lazy_door as lazy_door

if TYPE_CHECKING:
    from . import _bounded as bounded  # noqa: F401 (a module the door hands out whole)
    from . import events as events
    from . import exits as exits
    from . import schema as schema
    from ._blocking import EXECUTOR as EXECUTOR
    from ._blocking import BlockingCallTimeout as BlockingCallTimeout
    from ._blocking import abandoned_calls as abandoned_calls
    from ._blocking import host_cancelled as host_cancelled
    from ._blocking import next_tick as next_tick
    from ._blocking import require_asyncio as require_asyncio
    from ._blocking import run_blocking as run_blocking
    from ._errors import AsyncsoakError as AsyncsoakError
    from ._errors import MonitorError as MonitorError
    from ._errors import SoakFailureError as SoakFailureError
    from ._errors import ValidationError as ValidationError
    from ._errors import ValidationTypeError as ValidationTypeError
    from ._redact import Masker as Masker
    from ._redact import argv_secrets as argv_secrets
    from ._redact import public_conninfo as public_conninfo
    from ._redact import redact_env as redact_env
    from ._redact import redact_mapping as redact_mapping
    from ._redact import redact_url_passwords as redact_url_passwords
    from ._redact import secret_values as secret_values
    from ._schema import Artifact as Artifact
    from ._series import SERIES_POINTS as SERIES_POINTS
    from ._series import ProgressBins as ProgressBins
    from ._series import RunningStats as RunningStats
    from ._series import SeriesBuffer as SeriesBuffer
    from ._series import file_names as file_names
    from ._sink import EventSink as EventSink
    from ._sink import SinkCounters as SinkCounters
    from ._sink import SoakClock as SoakClock
    from ._sink import open_event_queue as open_event_queue
    from ._terminal import terminal_text as terminal_text
    from ._timestamps import STEP_TIME_FIELDS as STEP_TIME_FIELDS
    from ._timestamps import epoch as epoch
    from ._timestamps import iso as iso
    from ._timestamps import parse_iso as parse_iso
    from ._timestamps import parse_iso_or_none as parse_iso_or_none
    from ._timestamps import trainer_seconds as trainer_seconds
    from ._units import MAX_SECONDS as MAX_SECONDS
    from ._units import check_size as check_size
    from ._units import format_duration as format_duration
    from ._units import parse_size as parse_size
    from ._units import require_positive as require_positive
    from ._version import VERSION as VERSION
    from ._vocabulary import EventKind as EventKind
    from ._vocabulary import FailureReason as FailureReason
    from ._vocabulary import GpuFaultKind as GpuFaultKind
    from ._vocabulary import SoakStatus as SoakStatus
    from ._vocabulary import StopCause as StopCause

if not TYPE_CHECKING:  # the type checker reads the names above, and only those
    __getattr__, __dir__ = lazy_door(__name__, __file__)
