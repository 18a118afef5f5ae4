"""The events of what the samplers and the watchdog read, each beside its JSON form, and the
JSON forms of the samples themselves (their classes are the samplers')."""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` when evaluated.
from typing import Any, Literal, NotRequired

from ._event import Event, EventJsonBase
from ._vocabulary import EventKind


class Progress(Event, kind=EventKind.PROGRESS):
    """One watchdog scan saw files created, grown or touched."""

    changed: int
    paths: list[str]
    gap_seconds: float | None
    grown_bytes: int = 0
    #: Bytes grown by the files that name a rank (``rank1.jsonl``), by rank: tells a straggler.
    rank_grown_bytes: dict[str, int] = {}  # noqa: RUF012 (copied for each event)
    stale_limit_seconds: float | None = None


class ProgressJson(EventJsonBase):
    kind: Literal[EventKind.PROGRESS]
    changed: int
    paths: list[str]
    gap_seconds: float | None
    grown_bytes: NotRequired[int]
    rank_grown_bytes: NotRequired[dict[str, int]]
    stale_limit_seconds: NotRequired[float | None]


class StepProgress(Event, kind=EventKind.STEP):
    """The trainer's step advanced (or its loss or total changed), as its files say."""

    step: int
    source: str
    source_kind: str
    gap_seconds: float | None
    max_steps: int | None = None
    loss: float | None = None
    loss_step: int | None = None
    nonfinite_loss: str | None = None
    steps_per_second: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    eta_seconds: float | None = None
    stale_limit_seconds: float | None = None
    #: Whether the steps are the progress that counts (else the file changes still are).
    counts: bool = True
    nonfinite_grad_norms: int = 0
    sources_without_loss: tuple[str, ...] = ()
    #: ``(step, the record's epoch time or None)`` per record that advanced: the ledger's marks.
    marks: tuple[tuple[int, float | None], ...] = ()


class StepJson(EventJsonBase):
    kind: Literal[EventKind.STEP]
    step: int
    source: str
    source_kind: str
    gap_seconds: float | None
    max_steps: NotRequired[int | None]
    loss: NotRequired[float | None]
    loss_step: NotRequired[int | None]
    nonfinite_loss: NotRequired[str | None]
    steps_per_second: NotRequired[float | None]
    tokens_per_second: NotRequired[float | None]
    samples_per_second: NotRequired[float | None]
    eta_seconds: NotRequired[float | None]
    stale_limit_seconds: NotRequired[float | None]
    counts: NotRequired[bool]
    nonfinite_grad_norms: NotRequired[int]
    sources_without_loss: NotRequired[list[str]]
    marks: NotRequired[list[list[float | None]]]


class Limits(Event, kind=EventKind.LIMITS):
    """What the run's resources cannot exceed: projections are made against these."""

    memory_total_bytes: int | None
    cgroup_memory_max_bytes: int | None
    disk_total_bytes: dict[str, int | None]
    cgroup_memory_high_bytes: int | None = None
    cgroup_memory_current_bytes: int | None = None
    cgroup_version: int | None = None
    cgroup_path: str | None = None
    memory_limit_bytes: int | None = None
    memory_limit_source: str | None = None
    memory_limit_cgroup: str | None = None


class LimitsJson(EventJsonBase):
    kind: Literal[EventKind.LIMITS]
    memory_total_bytes: int | None
    cgroup_memory_max_bytes: int | None
    disk_total_bytes: dict[str, int | None]
    cgroup_memory_high_bytes: NotRequired[int | None]
    cgroup_memory_current_bytes: NotRequired[int | None]
    cgroup_version: NotRequired[int | None]
    cgroup_path: NotRequired[str | None]
    memory_limit_bytes: NotRequired[int | None]
    memory_limit_source: NotRequired[str | None]
    memory_limit_cgroup: NotRequired[str | None]


#: The ``limits`` fields that say which memory limit applies (the artifact's ``limits`` too).
MEMORY_CGROUP_LIMITS = (
    "cgroup_memory_high_bytes",
    "cgroup_memory_current_bytes",
    "cgroup_version",
    "cgroup_path",
    "memory_limit_bytes",
    "memory_limit_source",
    "memory_limit_cgroup",
)


class SamplerDegraded(Event, kind=EventKind.SAMPLER_DEGRADED):
    sampler: str
    message: str


class SamplerDegradedJson(EventJsonBase):
    kind: Literal[EventKind.SAMPLER_DEGRADED]
    sampler: str
    message: str


class SamplerRecovered(Event, kind=EventKind.SAMPLER_RECOVERED):
    sampler: str
    message: str


class SamplerRecoveredJson(EventJsonBase):
    kind: Literal[EventKind.SAMPLER_RECOVERED]
    sampler: str
    message: str


class SamplerNote(Event, kind=EventKind.SAMPLER_NOTE):
    """Something a sampler records once (``nvidia-smi`` missing, an ECC counter rose...)."""

    sampler: str
    message: str
    data: dict[str, Any] = {}  # noqa: RUF012 (copied for each event)


class SamplerNoteJson(EventJsonBase):
    kind: Literal[EventKind.SAMPLER_NOTE]
    sampler: str
    message: str
    data: NotRequired[dict[str, Any]]


class RuleBroken(Event, kind=EventKind.RULE_BROKEN):
    """A producer's rule broken (a stall, a blind sampler): the run's rules turn it into
    the failure, unless the run has ended (journal only)."""

    reason: str
    message: str


class RuleBrokenJson(EventJsonBase):
    kind: Literal[EventKind.RULE_BROKEN]
    reason: str
    message: str


class GpuFault(Event, kind=EventKind.GPU_FAULT):
    """What a GPU said about its own health (an Xid, an uncorrectable ECC error...).  ``gpu`` is
    its index at its first sample; ``fails``: the rule fails the run for it on a GPU the tree
    uses (``used``), else it is a warning."""

    fault: str
    gpu: int | None
    uuid: str | None
    bus_id: str | None
    message: str
    fails: bool
    used: bool
    xid: int | None = None
    meaning: str | None = None
    action: str | None = None
    #: The kernel's time of an Xid record (seconds since boot).
    kernel_seconds: float | None = None


class GpuFaultJson(EventJsonBase):
    kind: Literal[EventKind.GPU_FAULT]
    fault: str  # a GpuFaultKind
    gpu: int | None
    uuid: str | None
    bus_id: str | None
    message: str
    fails: bool
    used: bool
    xid: NotRequired[int | None]
    meaning: NotRequired[str | None]
    action: NotRequired[str | None]
    kernel_seconds: NotRequired[float | None]


class SampleJson(EventJsonBase):
    """A sample of the tree (``_sampling._proc_sample.ProcSample``): its figures are the
    sampler's dataclasses as plain dicts."""

    kind: Literal[EventKind.SAMPLE]
    root_pid: int
    tree: dict[str, Any]
    processes: list[dict[str, Any]]
    machine: dict[str, Any]
    disks: dict[str, dict[str, Any]]
    #: Added by the journal (``SeriesSource``): the series points and summary labels.
    points: NotRequired[dict[str, dict[str, float | None]]]
    labels: NotRequired[dict[str, dict[str, list[str]]]]


class GpuSampleJson(EventJsonBase):
    """A sample of the GPUs (``_sampling._gpu_sample.GpuSample``)."""

    kind: Literal[EventKind.GPU_SAMPLE]
    gpus: list[dict[str, Any]]
    processes: list[dict[str, Any]] | None
    source: str
    points: NotRequired[dict[str, dict[str, float | None]]]
    labels: NotRequired[dict[str, dict[str, list[str]]]]
