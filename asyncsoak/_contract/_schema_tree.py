"""The artifact's sections about the tree as types: its processes and ranks, those left over
or OOM-killed, the forensics of a stall, each GPU's health."""

# No ``from __future__ import annotations``: the generator reads evaluated annotations.
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast, final

from ._json_schema import Keywords, NonNegativeInt
from ._schema_snapshot import ProbeFailure
from ._vocabulary import GpuFaultKind

#: ``series`` (and a process's ``series``): field name to values, ``t`` first.
Series = Annotated[dict[str, list[float | None]], Keywords(required=["t"])]


class Rank(TypedDict):
    """A process's rank in a distributed run, as its environment says."""

    rank: NonNegativeInt
    local_rank: NonNegativeInt | None
    world_size: NonNegativeInt | None
    group_rank: NonNegativeInt | None
    source: Literal["torch", "openmpi", "pmi", "slurm"]
    run_id: NotRequired[str]


class LauncherRole(TypedDict):
    launcher: Literal["torchrun", "accelerate", "deepspeed", "mpirun", "srun"]


class RankProcess(Rank):
    pid: int
    name: str | None


class Launcher(TypedDict):
    pid: int
    name: str | None
    launcher: str


class Ranks(TypedDict):
    ranks: list[RankProcess]
    launchers: list[Launcher]


class Straggler(TypedDict):
    rank: int
    rate_per_minute: float
    median_rate_per_minute: float
    behind_seconds: float


class ProcessRecord(TypedDict):
    """``leftover_processes[]``, ``abandoned_processes[]`` (and a ``leftover`` or ``abandoned``
    event's ``process``): a process of the tree that outlived the command.  A process that
    could not be read holds null ``name`` and ``cmdline`` and the state ``unknown``."""

    pid: int
    name: str | None
    state: str
    cmdline: list[str] | None
    ppid: NotRequired[int]
    pgid: NotRequired[int]
    sid: NotRequired[int]
    create_time: NotRequired[float]
    #: In words, how it left the command's process group (or that it did not).
    left_group: NotRequired[str]


class ProcessEntry(TypedDict):
    """``processes[]``: one of the largest processes of the tree, over the run."""

    pid: int
    name: str
    first_rss_bytes: int
    peak_rss_bytes: int
    last_rss_bytes: int
    mean_cpu_percent: float | None
    peak_gpu_memory_bytes: int | None
    peak_threads: int
    series: Series
    #: ``{"launcher": ...}`` or the process's rank (``ranks``), when it has one.
    role: NotRequired[Annotated[dict[str, Any] | None, Rank | LauncherRole | None]]


class OomKillEntry(TypedDict):
    """``oom_kills[]``: a process of the tree the OOM killer ended."""

    pid: int
    name: str
    message: str
    #: ``kernel_log`` and/or ``cgroup_counter``; the cgroup's path and limit come with it
    #: (all three are missing from artifacts written before the cgroup's counter was read).
    detected_by: NotRequired[list[Annotated[str, Keywords(enum=["kernel_log", "cgroup_counter"])]]]
    cgroup_path: NotRequired[str | None]
    cgroup_memory_limit_bytes: NotRequired[int | None]


@final
class PythonStack(TypedDict):
    """``forensics.processes[].python_stack`` when py-spy answered: its dump."""

    stack: str


class ForensicsProcess(TypedDict):
    """``forensics.processes[]``: what one process of a stalled tree was doing.  A process
    that could not be read holds ``pid`` and ``error`` only (:func:`readable_processes`)."""

    pid: int
    ppid: int
    name: str
    state: str
    num_threads: int
    cmdline: list[str]
    #: ``{"launcher": ...}`` or the process's rank, when it has one (newer artifacts only).
    role: NotRequired[Annotated[dict[str, Any] | None, Rank | LauncherRole | None]]
    wchan: str | None
    kernel_stack: str | None
    threads: list[dict[str, Any]]
    #: A Python process's stack from py-spy, or why there is none.
    python_stack: NotRequired[PythonStack | ProbeFailure]


class StallCulprit(TypedDict):
    """``forensics.ranks``: which rank(s) a distributed run's stall waits on.  ``text`` is
    None when no rank stands out; when it names one, ``where``, ``pid`` and ``node`` say
    where that rank stopped."""

    culprits: list[int]
    text: str | None
    waiting: str | None
    ranks: list[dict[str, Any]]
    where: NotRequired[str | None]
    pid: NotRequired[int | None]
    node: NotRequired[str | None]


class ForensicsSection(TypedDict):
    """``forensics``: what the tree was doing before the first signal of a stall.  When it
    could not be taken, ``error`` says why and the figures are missing."""

    reason: str
    t: float
    error: NotRequired[str]
    #: Each a :class:`ForensicsProcess`, or ``pid`` and ``error``.
    processes: NotRequired[Annotated[list[dict[str, Any]], list[ForensicsProcess | ProbeFailure]]]
    skipped_for_time: NotRequired[int]
    py_spy: NotRequired[str | None]
    time_budget_seconds: NotRequired[float]
    #: A distributed run's stall: which rank(s) it waits on (``stall_culprit``).
    ranks: NotRequired[StallCulprit]


def readable_processes(forensics: ForensicsSection) -> list[ForensicsProcess]:
    """The processes the forensics could read: every one but those recorded as ``{"pid",
    "error"}`` (access denied), which hold nothing else."""
    return [cast(ForensicsProcess, p) for p in forensics.get("processes", []) if "error" not in p]


class GpuFaultEntry(TypedDict):
    """``gpu_health[key].faults[]``: one fault the GPU reported."""

    t: float
    at: NotRequired[str | None]
    fault: GpuFaultKind
    message: str
    #: The rule fails a run for it on a GPU the run uses.
    fails: bool
    #: Whether the run used the GPU (CUDA_VISIBLE_DEVICES, or a process of the tree on it).
    used: bool
    xid: NotRequired[int | None]
    meaning: NotRequired[str | None]
    action: NotRequired[str | None]


class XidEntry(TypedDict):
    t: float
    at: NotRequired[str | None]
    code: int
    meaning: str
    action: str
    fails: NotRequired[bool]


class StartEnd(TypedDict, total=False):
    """A GPU health figure at the run's first and last reading (null where the GPU does not
    report it)."""

    start: int | bool | None
    end: int | bool | None


class ThrottleSpan(TypedDict):
    """``gpu_health[key].throttle_spans[i]``: a stretch of the run with the same reasons."""

    start: float
    end: float
    reasons: list[str]


class GpuHealth(TypedDict):
    """``gpu_health[key]``: what one GPU said about its own health over the run."""

    index: int
    uuid: str | None
    bus_id: str | None
    lost: bool
    faults: Annotated[list[dict[str, Any]], list[GpuFaultEntry]]
    xid: Annotated[list[dict[str, Any]], list[XidEntry]]
    samples: NotRequired[int]
    faults_dropped: NotRequired[int]
    ecc_uncorrected: NotRequired[Annotated[dict[str, Any], StartEnd]]
    remapped_rows: NotRequired[Annotated[dict[str, Any], dict[str, StartEnd]]]
    retired_pages_pending: NotRequired[Annotated[Any, StartEnd]]
    #: gen_max, width_max, gen_last, width_last, and the lowest seen under load
    #: (gen_min_under_load, width_min_under_load).
    pcie_link: NotRequired[Annotated[Any, dict[str, int | None]]]
    #: Share of the GPU's samples (0 to 1) with each clock event reason active (gpu_idle left
    #: out).
    throttle_shares: NotRequired[Annotated[dict[str, Any], dict[str, float]]]
    #: When the clocks were held back (gpu_idle left out), to within the artifact's
    #: resolution: at most 256 spans however long the run.
    throttle_spans: NotRequired[list[ThrottleSpan]]
