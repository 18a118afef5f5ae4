"""The contract every room shares.

The vocabulary, the artifact's schema, the events and their JSON form, series, the event sink and
the soak's clock, exit statuses and the decoding of exits and crashes, bounded reads, errors,
units, timestamps, secret masking, terminal-safe text, the version, and ``run_blocking``.  It
imports no other room.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._door import lazy_door as lazy_door

if TYPE_CHECKING:
    from ._blocking import EXECUTOR as EXECUTOR
    from ._blocking import BlockingCallTimeout as BlockingCallTimeout
    from ._blocking import Ride as Ride
    from ._blocking import Rides as Rides
    from ._blocking import Ticker as Ticker
    from ._blocking import TickSignal as TickSignal
    from ._blocking import TickTimeout as TickTimeout
    from ._blocking import abandoned_calls as abandoned_calls
    from ._blocking import next_tick as next_tick
    from ._blocking import require_asyncio as require_asyncio
    from ._blocking import ride_or_run as ride_or_run
    from ._blocking import run_blocking as run_blocking
    from ._bounded import MAX_JOURNAL_BYTES as MAX_JOURNAL_BYTES
    from ._bounded import MAX_LINE_BYTES as MAX_LINE_BYTES
    from ._bounded import MAX_METADATA_DEPTH as MAX_METADATA_DEPTH
    from ._bounded import UnreadableFileError as UnreadableFileError
    from ._bounded import bounded_lines as bounded_lines
    from ._bounded import loads_bounded as loads_bounded
    from ._bounded import nested_too_deep as nested_too_deep
    from ._bounded import open_regular as open_regular
    from ._bounded import read_json_file as read_json_file
    from ._crash import LAUNCHER_EXCEPTIONS as LAUNCHER_EXCEPTIONS
    from ._crash import CrashInLog as CrashInLog
    from ._crash import RankCrash as RankCrash
    from ._crash import describe_crash as describe_crash
    from ._crash import describe_rank_crash as describe_rank_crash
    from ._crash import find_exception as find_exception
    from ._crash import find_rank_exception as find_rank_exception
    from ._crash import last_traceback as last_traceback
    from ._errors import AsyncsoakError as AsyncsoakError
    from ._errors import MonitorError as MonitorError
    from ._errors import SoakFailureError as SoakFailureError
    from ._errors import ValidationError as ValidationError
    from ._errors import ValidationTypeError as ValidationTypeError
    from ._events import JOURNAL_SAMPLE_KEYS as JOURNAL_SAMPLE_KEYS
    from ._events import MEMORY_CGROUP_LIMITS as MEMORY_CGROUP_LIMITS
    from ._events import Abandoned as Abandoned
    from ._events import AbandonedJson as AbandonedJson
    from ._events import CrashCause as CrashCause
    from ._events import Event as Event
    from ._events import EventFold as EventFold
    from ._events import EventJson as EventJson
    from ._events import ExceptionJson as ExceptionJson
    from ._events import Exited as Exited
    from ._events import ExitedJson as ExitedJson
    from ._events import FailureEvent as FailureEvent
    from ._events import FailureJson as FailureJson
    from ._events import Finished as Finished
    from ._events import FinishedJson as FinishedJson
    from ._events import Forensics as Forensics
    from ._events import ForensicsJson as ForensicsJson
    from ._events import ForensicsMentionJson as ForensicsMentionJson
    from ._events import ForwardedJson as ForwardedJson
    from ._events import GpuFault as GpuFault
    from ._events import GpuFaultJson as GpuFaultJson
    from ._events import GpuSampleJson as GpuSampleJson
    from ._events import Header as Header
    from ._events import HeaderJson as HeaderJson
    from ._events import KeptEventJson as KeptEventJson
    from ._events import Leftover as Leftover
    from ._events import LeftoverJson as LeftoverJson
    from ._events import Limits as Limits
    from ._events import LimitsJson as LimitsJson
    from ._events import OomKill as OomKill
    from ._events import OomKillJson as OomKillJson
    from ._events import Progress as Progress
    from ._events import ProgressJson as ProgressJson
    from ._events import Requeued as Requeued
    from ._events import RequeueJson as RequeueJson
    from ._events import SampleJson as SampleJson
    from ._events import SamplerDegraded as SamplerDegraded
    from ._events import SamplerDegradedJson as SamplerDegradedJson
    from ._events import SamplerNote as SamplerNote
    from ._events import SamplerNoteJson as SamplerNoteJson
    from ._events import SamplerRecovered as SamplerRecovered
    from ._events import SamplerRecoveredJson as SamplerRecoveredJson
    from ._events import SeriesPoints as SeriesPoints
    from ._events import SeriesSource as SeriesSource
    from ._events import SignalForwarded as SignalForwarded
    from ._events import SignalJson as SignalJson
    from ._events import SignalSent as SignalSent
    from ._events import Snapshot as Snapshot
    from ._events import SnapshotJson as SnapshotJson
    from ._events import SpawnFailed as SpawnFailed
    from ._events import SpawnFailedJson as SpawnFailedJson
    from ._events import Started as Started
    from ._events import StartedJson as StartedJson
    from ._events import StdinClosed as StdinClosed
    from ._events import StdinClosedJson as StdinClosedJson
    from ._events import StepJson as StepJson
    from ._events import StepProgress as StepProgress
    from ._events import StopJson as StopJson
    from ._events import StopRequested as StopRequested
    from ._events import SummaryLabels as SummaryLabels
    from ._events import TreeGone as TreeGone
    from ._events import TreeGoneJson as TreeGoneJson
    from ._events import TrendFound as TrendFound
    from ._events import TrendJson as TrendJson
    from ._events import WarningEvent as WarningEvent
    from ._events import WarningJson as WarningJson
    from ._events import event_to_json as event_to_json
    from ._exit_codes import DETAILED_EXIT_CODES as DETAILED_EXIT_CODES
    from ._exit_codes import EXIT_FAILED as EXIT_FAILED
    from ._exit_codes import EXIT_PASSED as EXIT_PASSED
    from ._exit_codes import EXIT_USAGE as EXIT_USAGE
    from ._exit_codes import detailed_exit_code as detailed_exit_code
    from ._exit_codes import verdict_exit_code as verdict_exit_code
    from ._exits import SHELL_SIGNAL_BASE as SHELL_SIGNAL_BASE
    from ._exits import decode as decode
    from ._exits import describe_exit_status as describe_exit_status
    from ._exits import forwarded_signals as forwarded_signals
    from ._exits import signal_name as signal_name
    from ._redact import Masker as Masker
    from ._redact import argv_secrets as argv_secrets
    from ._redact import public_conninfo as public_conninfo
    from ._redact import redact_env as redact_env
    from ._redact import redact_mapping as redact_mapping
    from ._redact import redact_url_passwords as redact_url_passwords
    from ._redact import secret_values as secret_values
    from ._schema import Artifact as Artifact
    from ._schema import ExceptionInfo as ExceptionInfo
    from ._schema import Exit as Exit
    from ._schema import Failure as Failure
    from ._schema import ForensicsProcess as ForensicsProcess
    from ._schema import ForensicsSection as ForensicsSection
    from ._schema import GpuHealth as GpuHealth
    from ._schema import GpuProbe as GpuProbe
    from ._schema import HostProbe as HostProbe
    from ._schema import KubernetesPod as KubernetesPod
    from ._schema import OomKillEntry as OomKillEntry
    from ._schema import ProbeFailure as ProbeFailure
    from ._schema import ProcessEntry as ProcessEntry
    from ._schema import ProcessRecord as ProcessRecord
    from ._schema import PythonStack as PythonStack
    from ._schema import SamplerNoteEntry as SamplerNoteEntry
    from ._schema import Series as Series
    from ._schema import SlurmJob as SlurmJob
    from ._schema import SnapshotGpu as SnapshotGpu
    from ._schema import SnapshotSection as SnapshotSection
    from ._schema import SoftwareProbe as SoftwareProbe
    from ._schema import SourceProbe as SourceProbe
    from ._schema import StallCulprit as StallCulprit
    from ._schema import StepsProgress as StepsProgress
    from ._schema import Stop as Stop
    from ._schema import Trend as Trend
    from ._schema import readable_processes as readable_processes
    from ._schema import series_times as series_times
    from ._series import SERIES_POINTS as SERIES_POINTS
    from ._series import RunningStats as RunningStats
    from ._series import SeriesBuffer as SeriesBuffer
    from ._sink import EventSink as EventSink
    from ._sink import SinkCounters as SinkCounters
    from ._sink import SoakClock as SoakClock
    from ._sink import open_event_queue as open_event_queue
    from ._terminal import terminal_text as terminal_text
    from ._timestamps import epoch as epoch
    from ._timestamps import iso as iso
    from ._timestamps import parse_iso as parse_iso
    from ._timestamps import parse_iso_or_none as parse_iso_or_none
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
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "readable_processes": "._schema",
            "OomKillEntry": "._schema",
            "ForensicsSection": "._schema",
            "ForensicsProcess": "._schema",
            "BlockingCallTimeout": "._blocking",
            "EXECUTOR": "._blocking",
            "Ride": "._blocking",
            "Rides": "._blocking",
            "TickSignal": "._blocking",
            "TickTimeout": "._blocking",
            "Ticker": "._blocking",
            "abandoned_calls": "._blocking",
            "next_tick": "._blocking",
            "require_asyncio": "._blocking",
            "ride_or_run": "._blocking",
            "run_blocking": "._blocking",
            "MAX_JOURNAL_BYTES": "._bounded",
            "MAX_LINE_BYTES": "._bounded",
            "MAX_METADATA_DEPTH": "._bounded",
            "UnreadableFileError": "._bounded",
            "bounded_lines": "._bounded",
            "loads_bounded": "._bounded",
            "nested_too_deep": "._bounded",
            "open_regular": "._bounded",
            "read_json_file": "._bounded",
            "CrashInLog": "._crash",
            "LAUNCHER_EXCEPTIONS": "._crash",
            "RankCrash": "._crash",
            "describe_crash": "._crash",
            "describe_rank_crash": "._crash",
            "find_exception": "._crash",
            "find_rank_exception": "._crash",
            "last_traceback": "._crash",
            "AsyncsoakError": "._errors",
            "MonitorError": "._errors",
            "SoakFailureError": "._errors",
            "ValidationError": "._errors",
            "ValidationTypeError": "._errors",
            "Abandoned": "._events",
            "CrashCause": "._events",
            "Event": "._events",
            "Exited": "._events",
            "FailureEvent": "._events",
            "Finished": "._events",
            "Forensics": "._events",
            "GpuFault": "._events",
            "Header": "._events",
            "Leftover": "._events",
            "Limits": "._events",
            "MEMORY_CGROUP_LIMITS": "._events",
            "OomKill": "._events",
            "Progress": "._events",
            "Requeued": "._events",
            "SamplerDegraded": "._events",
            "SamplerNote": "._events",
            "SamplerRecovered": "._events",
            "SeriesPoints": "._events",
            "SeriesSource": "._events",
            "SignalForwarded": "._events",
            "SignalSent": "._events",
            "Snapshot": "._events",
            "SpawnFailed": "._events",
            "Started": "._events",
            "StdinClosed": "._events",
            "StepProgress": "._events",
            "StopRequested": "._events",
            "SummaryLabels": "._events",
            "TreeGone": "._events",
            "TrendFound": "._events",
            "WarningEvent": "._events",
            "event_to_json": "._events",
            "AbandonedJson": "._events",
            "EventFold": "._events",
            "EventJson": "._events",
            "ExceptionJson": "._events",
            "ExitedJson": "._events",
            "FailureJson": "._events",
            "FinishedJson": "._events",
            "ForensicsJson": "._events",
            "ForensicsMentionJson": "._events",
            "ForwardedJson": "._events",
            "GpuFaultJson": "._events",
            "GpuSampleJson": "._events",
            "HeaderJson": "._events",
            "JOURNAL_SAMPLE_KEYS": "._events",
            "KeptEventJson": "._events",
            "LeftoverJson": "._events",
            "LimitsJson": "._events",
            "OomKillJson": "._events",
            "ProgressJson": "._events",
            "RequeueJson": "._events",
            "SampleJson": "._events",
            "SamplerDegradedJson": "._events",
            "SamplerNoteJson": "._events",
            "SamplerRecoveredJson": "._events",
            "SignalJson": "._events",
            "SnapshotJson": "._events",
            "SpawnFailedJson": "._events",
            "StartedJson": "._events",
            "StdinClosedJson": "._events",
            "StepJson": "._events",
            "StopJson": "._events",
            "TreeGoneJson": "._events",
            "TrendJson": "._events",
            "WarningJson": "._events",
            "DETAILED_EXIT_CODES": "._exit_codes",
            "EXIT_FAILED": "._exit_codes",
            "EXIT_PASSED": "._exit_codes",
            "EXIT_USAGE": "._exit_codes",
            "detailed_exit_code": "._exit_codes",
            "verdict_exit_code": "._exit_codes",
            "SHELL_SIGNAL_BASE": "._exits",
            "decode": "._exits",
            "describe_exit_status": "._exits",
            "forwarded_signals": "._exits",
            "signal_name": "._exits",
            "Masker": "._redact",
            "argv_secrets": "._redact",
            "public_conninfo": "._redact",
            "redact_env": "._redact",
            "redact_mapping": "._redact",
            "redact_url_passwords": "._redact",
            "secret_values": "._redact",
            "Artifact": "._schema",
            "ExceptionInfo": "._schema",
            "Exit": "._schema",
            "Failure": "._schema",
            "ProcessEntry": "._schema",
            "GpuHealth": "._schema",
            "SamplerNoteEntry": "._schema",
            "Series": "._schema",
            "StallCulprit": "._schema",
            "GpuProbe": "._schema",
            "HostProbe": "._schema",
            "KubernetesPod": "._schema",
            "ProbeFailure": "._schema",
            "ProcessRecord": "._schema",
            "PythonStack": "._schema",
            "SlurmJob": "._schema",
            "SnapshotSection": "._schema",
            "SnapshotGpu": "._schema",
            "SoftwareProbe": "._schema",
            "SourceProbe": "._schema",
            "StepsProgress": "._schema",
            "Stop": "._schema",
            "Trend": "._schema",
            "series_times": "._schema",
            "RunningStats": "._series",
            "SERIES_POINTS": "._series",
            "SeriesBuffer": "._series",
            "EventSink": "._sink",
            "SinkCounters": "._sink",
            "SoakClock": "._sink",
            "open_event_queue": "._sink",
            "terminal_text": "._terminal",
            "epoch": "._timestamps",
            "iso": "._timestamps",
            "parse_iso": "._timestamps",
            "parse_iso_or_none": "._timestamps",
            "MAX_SECONDS": "._units",
            "check_size": "._units",
            "format_duration": "._units",
            "parse_size": "._units",
            "require_positive": "._units",
            "VERSION": "._version",
            "EventKind": "._vocabulary",
            "FailureReason": "._vocabulary",
            "GpuFaultKind": "._vocabulary",
            "SoakStatus": "._vocabulary",
            "StopCause": "._vocabulary",
        },
    )
