"""The events beside their JSON forms, a namespace the contract's door hands out whole
(``events.SampleJson``), each name's module imported on its first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._door import lazy_door

if TYPE_CHECKING:
    from ._event import Event as Event
    from ._event import SeriesPoints as SeriesPoints
    from ._event import SeriesSource as SeriesSource
    from ._event import SummaryLabels as SummaryLabels
    from ._events import EventFold as EventFold
    from ._events import EventJson as EventJson
    from ._events import FailureEvent as FailureEvent
    from ._events import FailureJson as FailureJson
    from ._events import KeptEventJson as KeptEventJson
    from ._events import TrendFound as TrendFound
    from ._events import TrendJson as TrendJson
    from ._events import WarningEvent as WarningEvent
    from ._events import WarningJson as WarningJson
    from ._events import event_to_json as event_to_json
    from ._sample_events import MEMORY_CGROUP_LIMITS as MEMORY_CGROUP_LIMITS
    from ._sample_events import GpuFault as GpuFault
    from ._sample_events import GpuFaultJson as GpuFaultJson
    from ._sample_events import GpuSampleJson as GpuSampleJson
    from ._sample_events import Limits as Limits
    from ._sample_events import LimitsJson as LimitsJson
    from ._sample_events import Progress as Progress
    from ._sample_events import ProgressJson as ProgressJson
    from ._sample_events import RuleBroken as RuleBroken
    from ._sample_events import RuleBrokenJson as RuleBrokenJson
    from ._sample_events import SampleJson as SampleJson
    from ._sample_events import SamplerDegraded as SamplerDegraded
    from ._sample_events import SamplerDegradedJson as SamplerDegradedJson
    from ._sample_events import SamplerNote as SamplerNote
    from ._sample_events import SamplerNoteJson as SamplerNoteJson
    from ._sample_events import SamplerRecovered as SamplerRecovered
    from ._sample_events import SamplerRecoveredJson as SamplerRecoveredJson
    from ._sample_events import StepJson as StepJson
    from ._sample_events import StepProgress as StepProgress
    from ._tree_events import Abandoned as Abandoned
    from ._tree_events import AbandonedJson as AbandonedJson
    from ._tree_events import CrashCause as CrashCause
    from ._tree_events import ExceptionJson as ExceptionJson
    from ._tree_events import Exited as Exited
    from ._tree_events import ExitedJson as ExitedJson
    from ._tree_events import Finished as Finished
    from ._tree_events import FinishedJson as FinishedJson
    from ._tree_events import Forensics as Forensics
    from ._tree_events import ForensicsJson as ForensicsJson
    from ._tree_events import Header as Header
    from ._tree_events import HeaderJson as HeaderJson
    from ._tree_events import Leftover as Leftover
    from ._tree_events import LeftoverJson as LeftoverJson
    from ._tree_events import OomKill as OomKill
    from ._tree_events import OomKillJson as OomKillJson
    from ._tree_events import Requeued as Requeued
    from ._tree_events import RequeueJson as RequeueJson
    from ._tree_events import SignalForwarded as SignalForwarded
    from ._tree_events import SignalJson as SignalJson
    from ._tree_events import SignalSent as SignalSent
    from ._tree_events import Snapshot as Snapshot
    from ._tree_events import SnapshotJson as SnapshotJson
    from ._tree_events import SpawnFailed as SpawnFailed
    from ._tree_events import Started as Started
    from ._tree_events import StartedJson as StartedJson
    from ._tree_events import StdinClosed as StdinClosed
    from ._tree_events import StopJson as StopJson
    from ._tree_events import StopRequested as StopRequested
    from ._tree_events import TreeGone as TreeGone
    from ._tree_events import TreeGoneJson as TreeGoneJson

if not TYPE_CHECKING:  # the type checker reads the names above, and only those
    __getattr__, __dir__ = lazy_door(__name__, __file__)
