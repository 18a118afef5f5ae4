"""The events a soak's tasks send to the serializer, and their one JSON form.

Every event is a frozen, slotted dataclass with a ``KIND`` tag and ``t``: seconds since the
soak's start on the monitor's monotonic clock.  :func:`event_to_json` is the only place an
event becomes JSON; :func:`event_from_json` is only needed by ``asyncsoak recover``, which
reads journals back as plain dicts.

Samples (``sample``, ``gpu_sample``) may be dropped when the serializer falls behind;
every other kind is always delivered.  A sample feeds the artifact's bounded time series
through :meth:`SeriesSource.series_points` and the summary's label sets through
:meth:`SeriesSource.summary_labels`.

Each kind's JSON form is a :class:`~typing.TypedDict` (``HeaderJson`` ...), tagged by its
``kind``; :data:`EventJson` is their union, what the folds (artifact, live view, metrics)
read.  A field with a default is ``NotRequired`` there: journals written before it was added
lack it.  :class:`EventFold` is the one dispatch on ``kind`` those folds share.
"""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` from evaluated
# annotations only, and ``tests/test_event_json.py`` compares the required keys.
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import (
    Any,
    ClassVar,
    Generic,
    Literal,
    NotRequired,
    Protocol,
    TypedDict,
    TypeVar,
    cast,
    runtime_checkable,
)

from ._vocabulary import EventKind

#: A series group (``"tree"``, ``"machine"``, ``"gpu0"``) to field name to value.
SeriesPoints = Mapping[str, Mapping[str, float | None]]
#: A summary group to label name to values seen (``{"gpu0": {"throttle_reasons": [...]}}``).
SummaryLabels = Mapping[str, Mapping[str, list[str]]]


@runtime_checkable
class SeriesSource(Protocol):
    """A sample that contributes to the artifact's ``series`` and ``summary``."""

    t: float

    def series_points(self) -> SeriesPoints: ...

    def summary_labels(self) -> SummaryLabels: ...


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: ``t`` is seconds since the soak started."""

    KIND: ClassVar[str] = "event"
    #: Samples may be dropped under back-pressure; other events never are.
    DROPPABLE: ClassVar[bool] = False

    t: float


@dataclass(frozen=True, slots=True)
class Header(Event):
    """First journal line: everything needed to rebuild the artifact from the journal."""

    KIND: ClassVar[str] = EventKind.HEADER

    command: list[str]
    cwd: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    started_at: str
    journal_path: str
    log_path: str
    output_path: str
    monitor_pid: int
    #: The monitor's monotonic clock at the start, to line ``t`` up with other processes'
    #: ``time.monotonic()`` (CLOCK_MONOTONIC is system-wide).
    monotonic_start: float


@dataclass(frozen=True, slots=True)
class Snapshot(Event):
    """Where the run came from: source, GPUs, software, host, environment (redacted)."""

    KIND: ClassVar[str] = EventKind.SNAPSHOT

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Started(Event):
    """The command is running; ``pid`` leads its own session and process group."""

    KIND: ClassVar[str] = EventKind.STARTED

    pid: int
    reaper_pid: int


@dataclass(frozen=True, slots=True)
class SpawnFailed(Event):
    KIND: ClassVar[str] = EventKind.SPAWN_FAILED

    message: str


@dataclass(frozen=True, slots=True)
class Exited(Event):
    """The command itself ended.  ``returncode`` is negative for a signal, as in Python."""

    KIND: ClassVar[str] = EventKind.EXITED

    pid: int
    returncode: int
    signal: str | None


@dataclass(frozen=True, slots=True)
class TreeGone(Event):
    """Every process of the tree has been reaped."""

    KIND: ClassVar[str] = EventKind.TREE_GONE


@dataclass(frozen=True, slots=True)
class Progress(Event):
    """One watchdog scan saw files created, grown or touched."""

    KIND: ClassVar[str] = EventKind.PROGRESS

    changed: int
    paths: list[str]
    gap_seconds: float | None
    #: Bytes the changed files grew by (a new file counts its size).
    grown_bytes: int = 0
    #: The same for the files that name a rank (``rank1.jsonl``), by rank: each rank's own
    #: progress, whose rates tell a straggler.
    rank_grown_bytes: dict[str, int] = field(default_factory=dict)
    #: ``--stale-progress auto``: the limit in force from this change on (None otherwise).
    stale_limit_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class StepProgress(Event):
    """The trainer's step advanced (or its loss or total changed), as its files say."""

    KIND: ClassVar[str] = EventKind.STEP

    step: int
    #: The file the step was read from, and its kind (``json_lines``, ``trainer_state``, ...).
    source: str
    source_kind: str
    gap_seconds: float | None
    max_steps: int | None = None
    #: The newest finite loss and its step (a non-finite one is a failure or a warning).
    loss: float | None = None
    loss_step: int | None = None
    steps_per_second: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    eta_seconds: float | None = None
    #: ``--stale-progress auto``: the limit in force from this step on (None otherwise).
    stale_limit_seconds: float | None = None
    #: Whether the steps are the progress that counts (else the file changes still are:
    #: ``trainer_state.json`` alone under ``--progress-source auto``).
    counts: bool = True


@dataclass(frozen=True, slots=True)
class FailureEvent(Event):
    KIND: ClassVar[str] = EventKind.FAILURE

    reason: str
    message: str
    at: str
    #: The GPU a ``gpu_fault`` is about: ``{"index", "uuid", "bus_id"}`` (the queue reads it).
    gpu: dict[str, Any] | None = None
    #: A stall's verdict on what the tree and its GPUs were doing (``_analysis._activity``).
    activity: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class WarningEvent(Event):
    """Something worth knowing that is no failure (a skipped directory, a late start)."""

    KIND: ClassVar[str] = EventKind.WARNING

    message: str


@dataclass(frozen=True, slots=True)
class StopRequested(Event):
    """The monitor decided to end the run: ``cause`` is why."""

    KIND: ClassVar[str] = EventKind.STOP

    cause: str
    mode: str
    grace_seconds: float


@dataclass(frozen=True, slots=True)
class SignalSent(Event):
    KIND: ClassVar[str] = EventKind.SIGNAL

    signal: str
    target: str
    pids: list[int]


@dataclass(frozen=True, slots=True)
class SignalForwarded(Event):
    """A signal the monitor received (``--forward-signal``), passed on to the command."""

    KIND: ClassVar[str] = EventKind.FORWARDED

    signal: str
    target: str
    pids: list[int]
    sent: bool


@dataclass(frozen=True, slots=True)
class Requeued(Event):
    """The scheduler was asked to requeue the job (``--requeue-on``): its answer."""

    KIND: ClassVar[str] = EventKind.REQUEUE

    job_id: str
    ok: bool
    returncode: int | None
    message: str


@dataclass(frozen=True, slots=True)
class StdinClosed(Event):
    KIND: ClassVar[str] = EventKind.STDIN_CLOSED


@dataclass(frozen=True, slots=True)
class Leftover(Event):
    """A process of the tree still alive when it should have been gone."""

    KIND: ClassVar[str] = EventKind.LEFTOVER

    process: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Abandoned(Event):
    """A process that would not die within the bounded wait (often stuck in ``D``)."""

    KIND: ClassVar[str] = EventKind.ABANDONED

    process: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Forensics(Event):
    """What every process of a stalled tree was doing, recorded before the first signal."""

    KIND: ClassVar[str] = EventKind.FORENSICS

    reason: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OomKill(Event):
    """The kernel's OOM killer ended a process of the tree."""

    KIND: ClassVar[str] = EventKind.OOM_KILL

    pid: int
    name: str
    message: str
    #: What saw it: ``kernel_log`` (the kernel's "Killed process" record), ``cgroup_counter``
    #: (the ``oom_kill`` counter of the tree's memory cgroup rose), or both.
    detected_by: tuple[str, ...] = ("kernel_log",)
    #: The memory cgroup whose counter rose, and its hard limit, when the counter saw it.
    cgroup_path: str | None = None
    cgroup_memory_limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SamplerDegraded(Event):
    KIND: ClassVar[str] = EventKind.SAMPLER_DEGRADED

    sampler: str
    message: str


@dataclass(frozen=True, slots=True)
class SamplerRecovered(Event):
    KIND: ClassVar[str] = EventKind.SAMPLER_RECOVERED

    sampler: str
    message: str


@dataclass(frozen=True, slots=True)
class SamplerNote(Event):
    """Something a sampler records once (``nvidia-smi`` missing, an ECC counter rose...)."""

    KIND: ClassVar[str] = EventKind.SAMPLER_NOTE

    sampler: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuFault(Event):
    """What a GPU said about its own health: an Xid in the kernel log, an uncorrectable ECC
    error, a row remap pending or failed, a page pending retirement, the GPU lost, its PCIe link
    trained down.  ``fails``: the rule fails the run for it on a GPU the tree uses (``used``);
    otherwise it is a warning."""

    KIND: ClassVar[str] = EventKind.GPU_FAULT

    #: A :class:`~._vocabulary.GpuFaultKind`.
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


@dataclass(frozen=True, slots=True)
class TrendFound(Event):
    """A series' trend became confident: a leak, a projected breach, progress slowing."""

    KIND: ClassVar[str] = EventKind.TREND

    series: str
    verdict: str
    slope_per_hour: float | None
    growth: float | None
    projected_limit_at: str | None
    message: str


@dataclass(frozen=True, slots=True)
class CrashCause(Event):
    """What the end of a failed command's log says killed it (``exit.exception``)."""

    KIND: ClassVar[str] = EventKind.EXCEPTION

    type: str
    message: str
    where: str | None
    #: ``python`` (a traceback), ``cuda_oom``, ``nccl``, ``killed`` (a shell's "Killed");
    #: ``signal`` or ``exit`` for a rank that left no exception (torchrun's report of it).
    exception_kind: str
    #: A distributed run: the rank that failed first (whose exception this is), its pid.
    rank: int | None = None
    rank_pid: int | None = None


@dataclass(frozen=True, slots=True)
class Limits(Event):
    """What the run's resources cannot exceed: projections are made against these."""

    KIND: ClassVar[str] = EventKind.LIMITS

    memory_total_bytes: int | None
    #: The hard limit of the command's memory cgroup (v2 ``memory.max``, v1
    #: ``memory.limit_in_bytes``), the tightest from its cgroup up.
    cgroup_memory_max_bytes: int | None
    #: Size of the progress and output filesystems.
    disk_total_bytes: dict[str, int | None]
    #: v2 ``memory.high`` (the tightest from the cgroup up).
    cgroup_memory_high_bytes: int | None = None
    #: The cgroup's usage at the start (``memory.current``, ``memory.usage_in_bytes``).
    cgroup_memory_current_bytes: int | None = None
    #: 1 or 2; None where the command's memory cgroup could not be read.
    cgroup_version: int | None = None
    #: The command's memory cgroup, as ``/proc/PID/cgroup`` names it.
    cgroup_path: str | None = None
    #: The lowest limit that applies, what it is ("cgroup memory.max (SLURM job 123)",
    #: "machine memory"), and the cgroup that sets it (None for the machine's).
    memory_limit_bytes: int | None = None
    memory_limit_source: str | None = None
    memory_limit_cgroup: str | None = None


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


@dataclass(frozen=True, slots=True)
class Finished(Event):
    """Last journal line of a soak whose monitor lived to the end."""

    KIND: ClassVar[str] = EventKind.FINISHED

    status: str


# -- the JSON forms ---------------------------------------------------------------------------
# Words of the vocabulary (a reason, a cause, a status) are ``str`` here: read back from a
# journal they are plain strings, which compare equal to the enum members.


class _EventJsonBase(TypedDict):
    t: float


class HeaderJson(_EventJsonBase):
    kind: Literal[EventKind.HEADER]
    command: list[str]
    cwd: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    started_at: str
    journal_path: str
    log_path: str
    output_path: str
    monitor_pid: int
    monotonic_start: float


class SnapshotJson(_EventJsonBase):
    kind: Literal[EventKind.SNAPSHOT]
    data: dict[str, Any]


class StartedJson(_EventJsonBase):
    kind: Literal[EventKind.STARTED]
    pid: int
    reaper_pid: int


class SpawnFailedJson(_EventJsonBase):
    kind: Literal[EventKind.SPAWN_FAILED]
    message: str


class ExitedJson(_EventJsonBase):
    kind: Literal[EventKind.EXITED]
    pid: int
    returncode: int
    signal: str | None


class TreeGoneJson(_EventJsonBase):
    kind: Literal[EventKind.TREE_GONE]


class ProgressJson(_EventJsonBase):
    kind: Literal[EventKind.PROGRESS]
    changed: int
    paths: list[str]
    gap_seconds: float | None
    grown_bytes: NotRequired[int]
    rank_grown_bytes: NotRequired[dict[str, int]]
    stale_limit_seconds: NotRequired[float | None]


class StepJson(_EventJsonBase):
    kind: Literal[EventKind.STEP]
    step: int
    source: str
    source_kind: str
    gap_seconds: float | None
    max_steps: NotRequired[int | None]
    loss: NotRequired[float | None]
    loss_step: NotRequired[int | None]
    steps_per_second: NotRequired[float | None]
    tokens_per_second: NotRequired[float | None]
    samples_per_second: NotRequired[float | None]
    eta_seconds: NotRequired[float | None]
    stale_limit_seconds: NotRequired[float | None]
    counts: NotRequired[bool]


class FailureJson(_EventJsonBase):
    kind: Literal[EventKind.FAILURE]
    reason: str  # a FailureReason
    message: str
    at: str
    gpu: NotRequired[dict[str, Any] | None]
    activity: NotRequired[dict[str, Any] | None]


class WarningJson(_EventJsonBase):
    kind: Literal[EventKind.WARNING]
    message: str


class StopJson(_EventJsonBase):
    kind: Literal[EventKind.STOP]
    cause: str  # a StopCause
    mode: str
    grace_seconds: float


class SignalJson(_EventJsonBase):
    kind: Literal[EventKind.SIGNAL]
    signal: str
    target: str
    pids: list[int]


class ForwardedJson(_EventJsonBase):
    kind: Literal[EventKind.FORWARDED]
    signal: str
    target: str
    pids: list[int]
    sent: bool


class RequeueJson(_EventJsonBase):
    kind: Literal[EventKind.REQUEUE]
    job_id: str
    ok: bool
    returncode: int | None
    message: str


class StdinClosedJson(_EventJsonBase):
    kind: Literal[EventKind.STDIN_CLOSED]


class LeftoverJson(_EventJsonBase):
    kind: Literal[EventKind.LEFTOVER]
    process: dict[str, Any]


class AbandonedJson(_EventJsonBase):
    kind: Literal[EventKind.ABANDONED]
    process: dict[str, Any]


class ForensicsJson(_EventJsonBase):
    kind: Literal[EventKind.FORENSICS]
    reason: str
    data: dict[str, Any]


class ForensicsMentionJson(_EventJsonBase):
    """What ``artifact.events`` keeps of a forensics event: its ``forensics`` section holds
    the record itself."""

    kind: Literal[EventKind.FORENSICS]
    processes: int


class OomKillJson(_EventJsonBase):
    kind: Literal[EventKind.OOM_KILL]
    pid: int
    name: str
    message: str
    detected_by: NotRequired[list[str]]
    cgroup_path: NotRequired[str | None]
    cgroup_memory_limit_bytes: NotRequired[int | None]


class SamplerDegradedJson(_EventJsonBase):
    kind: Literal[EventKind.SAMPLER_DEGRADED]
    sampler: str
    message: str


class SamplerRecoveredJson(_EventJsonBase):
    kind: Literal[EventKind.SAMPLER_RECOVERED]
    sampler: str
    message: str


class SamplerNoteJson(_EventJsonBase):
    kind: Literal[EventKind.SAMPLER_NOTE]
    sampler: str
    message: str
    data: NotRequired[dict[str, Any]]


class GpuFaultJson(_EventJsonBase):
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


class TrendJson(_EventJsonBase):
    kind: Literal[EventKind.TREND]
    series: str
    verdict: str  # "leak", "breach_projected", "slowing", "withdrawn" ...
    slope_per_hour: float | None
    growth: float | None
    projected_limit_at: str | None
    message: str


class ExceptionJson(_EventJsonBase):
    kind: Literal[EventKind.EXCEPTION]
    type: str
    message: str
    where: str | None
    exception_kind: str
    rank: NotRequired[int | None]
    rank_pid: NotRequired[int | None]


class LimitsJson(_EventJsonBase):
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


class FinishedJson(_EventJsonBase):
    kind: Literal[EventKind.FINISHED]
    status: str  # a SoakStatus


class SampleJson(_EventJsonBase):
    """A sample of the tree (``_sampling._proc_sampler.ProcSample``): its figures are the
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


class GpuSampleJson(_EventJsonBase):
    """A sample of the GPUs (``_sampling._gpu_sampler.GpuSample``)."""

    kind: Literal[EventKind.GPU_SAMPLE]
    gpus: list[dict[str, Any]]
    processes: list[dict[str, Any]] | None
    source: str
    points: NotRequired[dict[str, dict[str, float | None]]]
    labels: NotRequired[dict[str, dict[str, list[str]]]]


#: The keys the journal adds to a sample's JSON form (see ``SampleJson``).
JOURNAL_SAMPLE_KEYS = frozenset({"points", "labels"})

#: Any event's JSON form, one member per :class:`EventKind`.
EventJson = (
    HeaderJson
    | SnapshotJson
    | StartedJson
    | SpawnFailedJson
    | ExitedJson
    | TreeGoneJson
    | ProgressJson
    | StepJson
    | FailureJson
    | WarningJson
    | StopJson
    | SignalJson
    | ForwardedJson
    | RequeueJson
    | StdinClosedJson
    | LeftoverJson
    | AbandonedJson
    | ForensicsJson
    | OomKillJson
    | SamplerDegradedJson
    | SamplerRecoveredJson
    | SamplerNoteJson
    | GpuFaultJson
    | TrendJson
    | ExceptionJson
    | LimitsJson
    | FinishedJson
    | SampleJson
    | GpuSampleJson
)

#: An event as ``artifact.events`` keeps it: not the samples, header, snapshot and steps
#: (sections of their own hold them), and a forensics event as a mention.
KeptEventJson = (
    StartedJson
    | SpawnFailedJson
    | ExitedJson
    | TreeGoneJson
    | ProgressJson
    | FailureJson
    | WarningJson
    | StopJson
    | SignalJson
    | ForwardedJson
    | RequeueJson
    | StdinClosedJson
    | LeftoverJson
    | AbandonedJson
    | ForensicsMentionJson
    | OomKillJson
    | SamplerDegradedJson
    | SamplerRecoveredJson
    | SamplerNoteJson
    | GpuFaultJson
    | TrendJson
    | ExceptionJson
    | LimitsJson
    | FinishedJson
)


# -- the one dispatch on ``kind`` -------------------------------------------------------------

Owner = TypeVar("Owner")
#: A fold's handler of one kind: ``(the fold, t, the event's JSON form)``.  The event is typed
#: ``Any`` here so each handler names its own kind's TypedDict (``tests/test_event_json.py``
#: checks that every handler takes the kinds it is registered for).
Handler = Callable[[Owner, float, Any], None]
AnyHandler = TypeVar("AnyHandler", bound=Callable[..., None])


class EventFold(Generic[Owner]):
    """A fold's handlers, one per kind it reads; a kind without one is ignored (a journal
    holds kinds each fold has no use for, and may come from a newer asyncsoak).

    :meth:`dispatch` is where a line becomes its kind's JSON form: it takes any mapping (an
    :data:`EventJson` from the serializer, a journal line read back, a test's hand-made line)
    and hands it to the handler of its ``kind``, which reads it as that kind's TypedDict.  A
    line from another asyncsoak may lack a key: the folds read the keys journals of other
    versions may lack with ``.get``.

    Declared in the folding class's body, its handlers registered with :meth:`on`::

        class Builder:
            _fold: ClassVar[EventFold[Builder]] = EventFold()

            def add(self, event: Mapping[str, Any]) -> None:
                self._fold.dispatch(self, event)

            @_fold.on(EventKind.STARTED)
            def _on_started(self, t: float, event: StartedJson) -> None: ...
    """

    __slots__ = ("handlers",)

    def __init__(self) -> None:
        #: Kind -> handler (a StrEnum member hashes as its string: a journal's kind finds it).
        self.handlers: dict[str, Handler[Owner]] = {}

    def on(self, *kinds: EventKind) -> Callable[[AnyHandler], AnyHandler]:
        """Register the decorated method as the handler of ``kinds``."""

        def register(handler: AnyHandler) -> AnyHandler:
            for kind in kinds:
                if kind in self.handlers:
                    raise ValueError(f"two handlers of {kind!r} events")
                self.handlers[kind] = handler
            return handler

        return register

    def dispatch(self, owner: Owner, event: Mapping[str, Any]) -> bool:
        """Fold ``event`` into ``owner``; False when no handler reads its kind."""
        kind = event.get("kind")
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return False
        handler(owner, float(event.get("t") or 0.0), event)
        return True


def event_to_json(event: Event) -> EventJson:
    """The one JSON form of an event: ``{"t": ..., "kind": ..., **fields}``."""
    out: dict[str, Any] = {"t": round(event.t, 6), "kind": event.KIND}
    for name in _field_names(type(event)):
        if name != "t":
            out[name] = _plain(getattr(event, name))
    # Sound: the fields are the event class's, and tests/test_event_json.py holds each
    # class's fields to its kind's TypedDict.
    return cast(EventJson, out)


#: Field names of each dataclass met: ``dataclasses.fields()`` builds a new tuple at every
#: call, and a sample of a large tree holds a dataclass per process, every sample.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
#: Types returned as they are, checked first: they are most of what a sample holds.
_AS_IS = frozenset({int, str, bool, type(None)})


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _plain(value: Any) -> Any:
    cls = type(value)
    if cls in _AS_IS:
        return value
    if cls is float:
        return None if value != value else value  # NaN: the artifact is allow_nan=False
    # Inside containers, values of the types kept as they are skip the call: a sample holds a
    # dataclass per process, and most of their fields are ints and strings.
    if dataclasses.is_dataclass(cls):  # an instance: a class's type is never a dataclass
        out = {}
        for name in _field_names(cls):
            field = getattr(value, name)
            kind = type(field)
            if kind in _AS_IS:
                out[name] = field
            elif kind is float:
                out[name] = None if field != field else field
            else:
                out[name] = _plain(field)
        return out
    if isinstance(value, Mapping):
        return {str(k): v if type(v) in _AS_IS else _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = [v if type(v) in _AS_IS else _plain(v) for v in value]
        return sorted(items) if isinstance(value, frozenset | set) else items
    if isinstance(value, float) and value != value:
        return None
    return value
