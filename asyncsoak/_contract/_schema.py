"""The artifact's sections as types: what the package writes and what its readers may index.

These :class:`~typing.TypedDict` s follow ``artifact.schema.json``: a key the schema requires
is a plain key (an artifact is checked against the schema when it is loaded, so a reader
indexes it), a key it does not require (added in schema version 2, or written only by some
paths) is ``NotRequired`` and read with ``.get``.  The status, the failures' reasons and the
stop's cause are typed as the vocabulary's enums (:mod:`._vocabulary`): the artifact's builder
folds them into members, and ``check_artifact`` turns the words read back from JSON into
members too; a member *is* its string, so the JSON is the same.  Sections whose keys are data
(series groups, summary groups, the environment the snapshot recorded) stay ``dict[str, ...]``.

The runtime snapshot is not checked beyond being an object: each of its probes is either
what the probe found or a :class:`ProbeFailure`, and the probes' own TypedDicts are
``@final`` so that ``"error" in probe`` tells the two apart for the type checker too.
"""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` from evaluated
# annotations only, and ``__required_keys__`` is what the schema test compares.
from typing import Any, Literal, NotRequired, Required, TypedDict, cast, final

from ._events import KeptEventJson
from ._vocabulary import FailureReason, SoakStatus, StopCause

#: ``series`` (and a process's ``series``): field name to values, ``t`` first.
Series = dict[str, list[float | None]]


class Failure(TypedDict):
    """``failures[]``: a fail-closed rule that fired."""

    reason: FailureReason
    message: str
    at: str | None
    #: The GPU a ``gpu_fault`` is about: ``{"index", "uuid", "bus_id"}``.
    gpu: NotRequired[dict[str, Any]]
    #: A stall's verdict on what the tree and its GPUs were doing.
    activity: NotRequired[dict[str, Any]]


class ExceptionInfo(TypedDict):
    """``exit.exception``: the command's last words, when it died of an exception."""

    type: str
    message: str
    where: str | None
    # "python", "cuda_oom", "nccl", "killed"; a rank that left no exception: "signal", "exit"
    kind: NotRequired[str]
    #: The rank whose traceback this is (a distributed run), and its pid when known.
    rank: NotRequired[int | None]
    rank_pid: NotRequired[int | None]


class Exit(TypedDict):
    """``exit``: how the command ended (all null when it never started)."""

    returncode: int | None
    signal: str | None
    pid: int | None
    exception: NotRequired[ExceptionInfo | None]  # schema version 2


class StepsProgress(TypedDict):
    """``progress.steps``: where the training got to, as the trainer's own files say."""

    step: int
    max_steps: int | None
    source: str
    source_kind: str
    first_step_at: str | None
    last_step_at: str | None
    longest_gap_seconds: float
    loss: float | None
    loss_step: int | None
    steps_per_second: float | None
    tokens_per_second: float | None
    samples_per_second: float | None
    eta_seconds: float | None


class Progress(TypedDict):
    """``progress``: what the watched directory said about the run's progress."""

    dir: str | None
    first_change_at: str | None
    last_change_at: str | None
    changes: int
    longest_gap_seconds: float
    #: What counted as progress: ``"steps"`` once a step was read (else ``"files"``).
    source: NotRequired[str]
    #: The training steps, when the trainer wrote any (see :class:`StepsProgress`).
    steps: NotRequired[StepsProgress | None]
    #: ``--stale-progress auto``: the limit in force at the end of the run.
    stale_limit_seconds: NotRequired[float | None]


class StopSignal(TypedDict):
    """``stop.signals[]``: a signal the stop sequence sent."""

    t: float
    signal: str
    target: str


class Requeue(TypedDict):
    """``stop.requeue``: the scheduler's answer to a requeue."""

    job_id: str | int | None
    ok: bool
    returncode: int | None
    message: str
    t: float


class Stop(TypedDict):
    """``stop``: why and how the stop sequence ran."""

    cause: StopCause | None  # null when the sequence never ran
    mode: str | None
    killed: bool
    grace_seconds: NotRequired[float | None]
    signals: NotRequired[list[StopSignal]]
    requeue: NotRequired[Requeue]


class Log(TypedDict):
    """``log``: where the captured output is and its last lines."""

    path: str | None
    tail: str


class SamplerNoteEntry(TypedDict):
    """``monitor.sampler_notes[]``: a sampler's note, degradation or recovery, as journalled."""

    t: float
    kind: str  # an EventKind: sampler_note, sampler_degraded or sampler_recovered
    sampler: str
    message: str
    data: NotRequired[dict[str, Any]]  # sampler_note only


class Monitor(TypedDict):
    """``monitor``: the supervisor's account of itself."""

    journal_path: str | None
    monotonic_start: NotRequired[float | None]
    samples: NotRequired[dict[str, int]]
    sampler_notes: NotRequired[list[SamplerNoteEntry]]
    dropped_samples: NotRequired[int]
    recovered_from_journal: NotRequired[str]
    events: NotRequired[int]
    unreadable_journal_lines: NotRequired[int]
    # What the monitor itself cost and lost, as run_soak records it (not in a recovered one).
    cpu_seconds: NotRequired[float]
    sampler_errors: NotRequired[int]
    journal_error: NotRequired[str | None]
    journal_segments: NotRequired[int]
    journal_rotation_error: NotRequired[str | None]
    events_not_folded: NotRequired[int]
    fold_error: NotRequired[str | None]
    events_with_nonfinite_numbers: NotRequired[int]
    reaper_pid: NotRequired[int | None]
    pid: NotRequired[int]
    abandoned_calls: NotRequired[int]


class Config(TypedDict):
    """``config``: the settings of the run; the schema requires these, the rest are read
    with ``.get`` (a version 1 artifact, or a setting added since)."""

    progress_dir: str | None
    output_path: str
    sample_interval_seconds: float
    startup_timeout_seconds: float | None
    stale_progress_seconds: float | str | None  # "auto": learned from the run
    post_shutdown_grace_seconds: float
    min_duration_seconds: float | None


class Trend(TypedDict):
    """``trends[key]``: the verdict on one series' growth."""

    verdict: str  # "leak", "stable", "inconclusive" or "slowing"
    unit: str  # "bytes", "count" or "per_minute"
    label: str
    pid: NotRequired[int | None]
    name: NotRequired[str | None]
    slope_per_hour: float | None
    slope_interval_per_hour: list[float] | None
    growth: float | None
    span_seconds: float
    first: float | None
    last: float | None
    limit: float | None
    limit_source: str | None
    projected_seconds_to_limit: float | None
    projected_limit_at: str | None


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
    role: NotRequired[dict[str, Any] | None]


class OomKillEntry(TypedDict):
    """``oom_kills[]``: a process of the tree the OOM killer ended."""

    pid: int
    name: str
    message: str
    #: ``kernel_log`` and/or ``cgroup_counter``; the cgroup's path and limit come with it
    #: (all three are missing from artifacts written before the cgroup's counter was read).
    detected_by: NotRequired[list[str]]
    cgroup_path: NotRequired[str | None]
    cgroup_memory_limit_bytes: NotRequired[int | None]


class Stats(TypedDict):
    """``summary[group][field]`` for a numeric field: its figures over the run (a label
    field's entry is the list of values seen instead)."""

    max: float | None
    mean: float | None
    min: float | None
    last: float | None


class ProbeFailure(TypedDict):
    """A reading that could not be taken, and why: a probe of the runtime snapshot (which
    keeps beside it what it did learn: ``source`` its ``repository: null``, ``gpus`` its
    ``available: false``, the command's interpreter its ``executable``), the whole snapshot
    when it was not taken, a process's py-spy dump."""

    error: str


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
    role: NotRequired[dict[str, Any] | None]
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
    processes: NotRequired[list[dict[str, Any]]]  # ForensicsProcess, or pid and error
    skipped_for_time: NotRequired[int]
    py_spy: NotRequired[str | None]
    time_budget_seconds: NotRequired[float]
    #: A distributed run's stall: which rank(s) it waits on (``stall_culprit``).
    ranks: NotRequired[StallCulprit]


def readable_processes(forensics: ForensicsSection) -> list[ForensicsProcess]:
    """The processes the forensics could read: every one but those recorded as ``{"pid",
    "error"}`` (access denied), which hold nothing else."""
    return [cast(ForensicsProcess, p) for p in forensics.get("processes", []) if "error" not in p]


class GpuHealth(TypedDict):
    """``gpu_health[key]``: what one GPU said about its own health over the run."""

    index: int
    uuid: str | None
    bus_id: str | None
    lost: bool
    #: Each fault: ``t``, ``fault``, ``message``, ``fails``, ``used``, and when known ``at``,
    #: ``xid``, ``meaning``, ``action``.
    faults: list[dict[str, Any]]
    xid: list[dict[str, Any]]
    samples: NotRequired[int]
    faults_dropped: NotRequired[int]
    ecc_uncorrected: NotRequired[dict[str, Any]]
    remapped_rows: NotRequired[dict[str, Any]]
    retired_pages_pending: NotRequired[Any]
    pcie_link: NotRequired[Any]
    throttle_shares: NotRequired[dict[str, Any]]


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


@final
class SourceProbe(TypedDict):
    """``snapshot.source``: the git repository the command ran from."""

    repository: str
    revision: str | None
    branch: str | None
    #: Null when ``git status`` failed (its error is in ``errors``).
    dirty: bool | None
    changed_files: int | None
    untracked_files: int | None
    diff_sha256: str | None
    errors: list[str]


class SnapshotGpu(TypedDict):
    """``snapshot.gpus.gpus[]``: one GPU of the machine, as nvidia-smi listed it."""

    index: int
    uuid: str | None
    name: str | None
    bus_id: str | None
    memory_total_mib: float | None
    power_limit_w: float | None
    clocks_max_sm_mhz: float | None
    driver_version: str | None
    compute_mode: str | None
    persistence_mode: str | None
    mig_mode: str | None


@final
class GpuProbe(TypedDict):
    """``snapshot.gpus``: the machine's GPUs and driver (nvidia-smi answered)."""

    available: bool
    nvidia_smi: str
    gpus: list[SnapshotGpu]
    errors: list[str]
    driver_version: str | None
    #: What ``nvidia-smi --version`` said, when it answered.
    cuda_version: NotRequired[str]
    nvidia_smi_version: NotRequired[str]
    nvml_version: NotRequired[str]


class PythonInfo(TypedDict):
    """``snapshot.software.python``: the interpreter the monitor ran in."""

    version: str
    implementation: str
    executable: str
    prefix: str


@final
class CommandPython(PythonInfo):
    """``snapshot.software.command_python``: the command's own interpreter, when it is
    another one than the monitor's, and its packages."""

    distributions: dict[str, str]


@final
class SoftwareProbe(TypedDict):
    """``snapshot.software``: the Python, platform and packages."""

    python: PythonInfo
    platform: str
    asyncsoak: str
    distributions: dict[str, str]
    command_python: NotRequired[CommandPython | ProbeFailure]


@final
class HostProbe(TypedDict):
    """``snapshot.host``: the machine."""

    hostname: str
    kernel: str
    kernel_version: str
    machine: str
    cpu_model: str | None
    cpu_count: int | None
    usable_cpus: int
    memory_total_bytes: int


class SlurmJob(TypedDict, total=False):
    """``snapshot.scheduler`` in a SLURM job: the job as its environment names it (null for
    a variable SLURM did not set), then what ``scontrol`` said.  Only ``kind`` is sure: the
    identity of a job whose ``scontrol`` did not answer in time lacks ``scontrol``'s keys,
    and readers take any key as possibly missing."""

    kind: Required[Literal["slurm"]]
    job_id: int | str
    array_job_id: int | str | None
    array_task_id: int | str | None
    step_id: int | str | None
    job_name: str | None
    node: str | None
    node_list: str | None
    num_nodes: int | str | None
    num_tasks: int | str | None
    rank: int | str | None
    local_rank: int | str | None
    node_rank: int | str | None
    restart_count: int | str
    partition: str | None
    account: str | None
    qos: str | None
    cluster: str | None
    gpus: str | None
    kill_wait_seconds: float | None
    end_time: str | None
    end_time_epoch: float | None
    time_limit: str | None
    errors: list[str]


class KubernetesPod(TypedDict, total=False):
    """``snapshot.scheduler`` in a Kubernetes pod: its names and indexes (null when nothing
    says them), cgroup limits and grace.  Only ``kind`` is sure: when reading the pod took too
    long, the record holds ``kind``, ``kill_wait_seconds`` and ``errors`` alone."""

    kind: Required[Literal["kubernetes"]]
    pod_name: str | None
    namespace: str | None
    node: str | None
    pod_uid: str | None
    pod_ip: str | None
    service_account: str | None
    hostname: str | None
    job_name: str | None
    completion_index: int | str | None
    jobset_name: str | None
    replicated_job_name: str | None
    job_index: int | str | None
    cpu_limit_cores: float | None
    memory_limit_bytes: int | None
    termination_grace_period_seconds: float | None
    termination_grace_source: str
    kill_wait_seconds: float | None
    errors: list[str]


class SnapshotSection(TypedDict, total=False):
    """``snapshot``: where the code, the GPUs, the software and the host stood, and the
    scheduler's job.  Every key may be missing: an artifact rebuilt from a journal that never
    got the snapshot holds ``{}``, and one whose snapshot was not taken holds ``error`` and
    ``scheduler`` only; ``scheduler`` is null outside a scheduler's job (and missing from
    artifacts written before it was recorded)."""

    taken_at: str
    root: str
    source: SourceProbe | ProbeFailure
    gpus: GpuProbe | ProbeFailure
    software: SoftwareProbe | ProbeFailure
    host: HostProbe | ProbeFailure
    #: The variables that shape a training run (credentials redacted), by name.
    environment: dict[str, str]
    scheduler: SlurmJob | KubernetesPod | None
    error: str


class Artifact(TypedDict):
    """The whole artifact (``artifact.schema.json``)."""

    schema_version: int
    status: SoakStatus
    failures: list[Failure]
    warnings: list[str]
    command: list[str]
    cwd: str
    config: Config
    metadata: dict[str, Any]
    started_at: str
    ended_at: str
    duration_seconds: float
    exit: Exit
    snapshot: SnapshotSection
    progress: Progress
    series: dict[str, Series]
    summary: dict[str, Any]
    #: The events kept (see ``artifact.EVENTS_HEAD``): the schema requires ``t`` and
    #: ``kind`` only, and older artifacts may lack a key added to an event since.
    events: list[KeptEventJson]
    leftover_processes: list[ProcessRecord]
    log: Log
    monitor: Monitor
    # Not required by the schema: version 2 additions and sections older writers lacked.
    trends: NotRequired[dict[str, Trend]]
    processes: NotRequired[list[ProcessEntry]]
    limits: NotRequired[dict[str, Any]]
    series_resolution: NotRequired[dict[str, int]]
    events_dropped: NotRequired[int]
    abandoned_processes: NotRequired[list[ProcessRecord]]
    oom_kills: NotRequired[list[OomKillEntry]]
    forensics: NotRequired[ForensicsSection | None]
    stop: NotRequired[Stop]
    gpu_health: NotRequired[dict[str, GpuHealth]]
    #: A distributed run: each rank's process and the launchers.
    ranks: NotRequired[dict[str, Any]]
    #: Ranks whose progress fell behind the others' (a distributed run's per-rank progress).
    stragglers: NotRequired[list[dict[str, Any]]]


def series_times(series: Series) -> list[float]:
    """A series' ``t``: the schema allows null in every column alike, but the package writes
    a time in every slot of ``t`` (``SeriesBuffer.to_json``), where the other columns hold
    null for a sample that lacked the field."""
    return cast("list[float]", series["t"])
