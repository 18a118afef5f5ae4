"""The artifact's sections as types, a namespace the contract's door hands out whole
(``schema.Failure``), each name's module imported on its first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._door import lazy_door

if TYPE_CHECKING:
    from ._schema import ExceptionInfo as ExceptionInfo
    from ._schema import Exit as Exit
    from ._schema import Failure as Failure
    from ._schema import GoodputSection as GoodputSection
    from ._schema import ProgressBinsSection as ProgressBinsSection
    from ._schema import SamplerNoteEntry as SamplerNoteEntry
    from ._schema import StepsProgress as StepsProgress
    from ._schema import Stop as Stop
    from ._schema import Trend as Trend
    from ._schema import series_times as series_times
    from ._schema_snapshot import GpuProbe as GpuProbe
    from ._schema_snapshot import HostProbe as HostProbe
    from ._schema_snapshot import KubernetesPod as KubernetesPod
    from ._schema_snapshot import ProbeFailure as ProbeFailure
    from ._schema_snapshot import SlurmJob as SlurmJob
    from ._schema_snapshot import SnapshotGpu as SnapshotGpu
    from ._schema_snapshot import SnapshotSection as SnapshotSection
    from ._schema_snapshot import SoftwareProbe as SoftwareProbe
    from ._schema_snapshot import SourceProbe as SourceProbe
    from ._schema_tree import ForensicsProcess as ForensicsProcess
    from ._schema_tree import ForensicsSection as ForensicsSection
    from ._schema_tree import GpuHealth as GpuHealth
    from ._schema_tree import OomKillEntry as OomKillEntry
    from ._schema_tree import ProcessEntry as ProcessEntry
    from ._schema_tree import ProcessRecord as ProcessRecord
    from ._schema_tree import PythonStack as PythonStack
    from ._schema_tree import Series as Series
    from ._schema_tree import StallCulprit as StallCulprit
    from ._schema_tree import readable_processes as readable_processes

if not TYPE_CHECKING:  # the type checker reads the names above, and only those
    __getattr__, __dir__ = lazy_door(__name__, __file__)
