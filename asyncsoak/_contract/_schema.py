"""The artifact as types, the one definition of its shape: ``artifact.schema.json`` is generated
from them (``python -m asyncsoak._contract._schema``).  A key some artifacts lack is
``NotRequired``, read with ``.get``; the others are checked on load, so readers index them.
"""

# No ``from __future__ import annotations``: the generator reads evaluated annotations.
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast

from ._events import KeptEventJson
from ._json_schema import Keywords, NonNegative, NonNegativeInt, Timestamp, dump, json_schema
from ._schema_snapshot import SnapshotSection
from ._schema_tree import (
    ForensicsSection,
    GpuHealth,
    OomKillEntry,
    ProcessEntry,
    ProcessRecord,
    Rank,
    Ranks,
    Series,
    StartEnd,
    Straggler,
)
from ._vocabulary import FailureReason, SoakStatus, StopCause


# These shapes are the schema's alone for now: readers index them as plain dicts.
class FailureGpu(TypedDict):
    index: int | None
    uuid: str | None
    bus_id: str | None


class ActivityGpu(TypedDict):
    index: int
    verdict: Literal["idle", "busy", "spinning", "unknown"]
    utilization_percent: NotRequired[float | None]
    power_w: NotRequired[float | None]
    power_limit_w: NotRequired[float | None]


class Activity(TypedDict):
    """stale_progress, startup_timeout: what the tree and its GPUs were doing when the rule
    fired, the verdict its message and every view give."""

    tree: Literal["busy", "idle", "uninterruptible", "unknown"]
    #: Whose CPU the figures are: the ranks' once the tree has ranks, the whole tree's otherwise.
    cpu_of: NotRequired[Literal["tree", "ranks"]]
    #: The tree's CPU over its last samples, percent of one core.
    cpu_percent: NotRequired[float | None]
    #: Share of those samples with a process of the tree running or runnable.
    running_share: NotRequired[float | None]
    uninterruptible: NotRequired[list[str]]
    gpus: list[ActivityGpu]


class Failure(TypedDict):
    """``failures[]``: a fail-closed rule that fired."""

    reason: FailureReason
    message: str
    at: str | None
    #: gpu_fault: the GPU it is about (index as nvidia-smi numbers it; null for a GPU lost
    #: before it was ever listed).
    gpu: NotRequired[Annotated[dict[str, Any], FailureGpu]]
    activity: NotRequired[Annotated[dict[str, Any], Activity]]


class ExceptionInfo(TypedDict):
    """``exit.exception``: the command's last words, when it died of an exception."""

    type: str
    message: str
    where: str | None
    #: A rank that left no exception: ``signal`` or ``exit``.
    kind: NotRequired[
        Annotated[str, Keywords(enum=["python", "cuda_oom", "nccl", "killed", "signal", "exit"])]
    ]
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

    step: NonNegativeInt
    max_steps: NonNegativeInt | None
    source: str
    source_kind: Annotated[
        str,
        Keywords(enum=["asyncsoak.trainer.report", "json_lines", "lightning_csv", "trainer_state"]),
    ]
    first_step_at: Timestamp | None
    last_step_at: Timestamp | None
    longest_gap_seconds: NonNegative
    loss: float | None
    loss_step: int | None
    steps_per_second: NonNegative | None
    tokens_per_second: NonNegative | None
    samples_per_second: NonNegative | None
    eta_seconds: NonNegative | None
    #: The non-finite loss the run failed on (nan, inf, -inf): the views' headline loss.
    nonfinite_loss: NotRequired[Annotated[str, Keywords(enum=["nan", "inf", "-inf"])] | None]
    #: Non-finite gradient norms logged (fewer than 5 logged steps in a row of one file:
    #: counted, not failed).
    nonfinite_grad_norms: NotRequired[NonNegativeInt]
    #: The files that gave steps but never a loss.
    sources_without_loss: NotRequired[list[str]]


class ProgressBinsSection(TypedDict):
    """``progress.bins``: columns, one value per bin of neighbouring changes."""

    first_t: list[float]
    last_t: list[float]
    changes: list[NonNegativeInt]
    #: The longest gap before a change in the bin (from the change before, or the start),
    #: and when that change came.
    longest_gap_seconds: list[NonNegative]
    longest_gap_t: list[float]
    #: The files the bin's last change touched, named (three at most, then how many more).
    files: list[str]


class Progress(TypedDict):
    """``progress``: what the watched directory said about the run's progress."""

    dir: str | None
    first_change_at: Timestamp | None
    last_change_at: Timestamp | None
    changes: NonNegativeInt
    longest_gap_seconds: NonNegative
    #: What counted as progress: training steps once the trainer wrote one, else file changes.
    source: NotRequired[Annotated[str, Keywords(enum=["files", "steps"])]]
    #: Where the training got to, as the trainer's own files say (null: no step was read).
    steps: NotRequired[StepsProgress | None]
    #: --stale-progress auto: the limit in force at the end (the series stale_limit holds it
    #: over time).
    stale_limit_seconds: NotRequired[NonNegative | None]
    #: Every change, binned in time order (at most 1,000 bins): what the report draws of
    #: progress, without the journal.
    bins: NotRequired[ProgressBinsSection]


class GoodputBadput(TypedDict):
    """``goodput.badput_seconds``: the run's lost time by cause (docs/goodput.md)."""

    startup: NonNegative
    slow_steps: NonNegative
    checkpoint: NonNegative
    stall: NonNegative
    wasted: NonNegative
    shutdown: NonNegative
    other: NonNegative


class GoodputSection(TypedDict):
    """``goodput``: the run's wall time (launch -> the tree's end) as productive time and the
    badput parts, which add up to it (docs/goodput.md)."""

    wall_seconds: NonNegative
    productive_seconds: NonNegative
    #: productive / wall; null for a run without steps.
    ratio: NonNegative | None
    #: The mean of the step durations at or below median + 3 MAD; null without steps.
    ideal_step_seconds: NonNegative | None
    #: The new steps (above the highest step an earlier attempt reached).
    steps: NonNegativeInt
    badput_seconds: GoodputBadput
    #: Why there is no ledger to speak of (a run without steps).
    note: NotRequired[str]


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

    #: Null when the stop sequence never ran.
    cause: StopCause | None
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

    verdict: Literal["leak", "stable", "inconclusive", "slowing"]
    unit: Literal["bytes", "count", "per_minute", "per_second"]
    label: str
    pid: NotRequired[int | None]
    name: NotRequired[str | None]
    slope_per_hour: float | None
    slope_interval_per_hour: Annotated[list[float], Keywords(minItems=2, maxItems=2)] | None
    growth: float | None
    span_seconds: NonNegative
    #: The series' floor at the start of the analysed span (its first window minimum); for an
    #: ``inconclusive`` verdict, the first sample after the warm-up.
    first: float | None
    #: The floor at the end of the span; for ``inconclusive``, the last sample.
    last: float | None
    limit: float | None
    limit_source: str | None
    projected_seconds_to_limit: float | None
    projected_limit_at: Timestamp | None


class LimitsSection(TypedDict, total=False):
    """``limits``: what the run's resources cannot exceed (the ``limits`` event's fields)."""

    memory_total_bytes: int | None
    #: The hard limit of the command's memory cgroup: memory.max (v2) or
    #: memory.limit_in_bytes (v1), the tightest from its cgroup up.
    cgroup_memory_max_bytes: int | None
    #: memory.high (v2).
    cgroup_memory_high_bytes: int | None
    #: The cgroup's usage at the start: memory.current (v2) or memory.usage_in_bytes (v1).
    cgroup_memory_current_bytes: int | None
    cgroup_version: Literal[1, 2] | None
    #: The command's memory cgroup, as /proc/PID/cgroup names it.
    cgroup_path: str | None
    #: The lowest memory limit that applies; leaks are projected against it.
    memory_limit_bytes: int | None
    #: What that limit is: machine memory, cgroup memory.max (SLURM job 123), cgroup
    #: memory.high, cgroup memory.limit_in_bytes.
    memory_limit_source: str | None
    #: The cgroup that sets it; null for the machine's memory.
    memory_limit_cgroup: str | None
    #: The size of the progress and output filesystems.
    disk_total_bytes: dict[str, int | None]


class EventHead(TypedDict):
    """What the schema checks of a kept event (older artifacts may lack a key added since)."""

    t: float
    kind: str


class Artifact(TypedDict):
    """One self-contained record of a supervised run (schema_version 2; version 1 artifacts,
    without trends and processes, are still read)."""

    schema_version: Annotated[int, Keywords(enum=[1, 2])]
    status: SoakStatus
    failures: list[Failure]
    warnings: list[str]
    command: list[str]
    cwd: str
    config: Config
    metadata: dict[str, Any]
    started_at: Timestamp
    ended_at: Timestamp
    duration_seconds: NonNegative
    exit: Exit
    snapshot: SnapshotSection
    progress: Progress
    series: dict[str, Series]
    summary: dict[str, Any]
    #: The events, less samples, steps, header and snapshot (sections of their own hold them):
    #: the first and the last ones of a long run (the journal keeps them all).
    events: Annotated[list[KeptEventJson], list[EventHead]]
    leftover_processes: list[ProcessRecord]
    log: Log
    monitor: Monitor
    # Not required by the schema: version 2 additions and sections older writers lacked.
    trends: NotRequired[dict[str, Trend]]
    processes: NotRequired[Annotated[list[ProcessEntry], Keywords(maxItems=8)]]
    limits: NotRequired[Annotated[dict[str, Any], LimitsSection]]
    series_resolution: NotRequired[dict[str, int]]
    events_dropped: NotRequired[int]
    #: Processes that would not die even after SIGKILL (often stuck in D).
    abandoned_processes: NotRequired[list[ProcessRecord]]
    oom_kills: NotRequired[list[OomKillEntry]]
    forensics: NotRequired[ForensicsSection | None]
    stop: NotRequired[Stop]
    #: Each GPU's health over the run, keyed gpuN ('unlisted' for a GPU lost before
    #: nvidia-smi listed it): its faults (Xid errors, uncorrectable ECC rises, row remaps,
    #: pages pending retirement, the GPU lost, a PCIe link trained down, the GPU needing a
    #: reset), counts at the start and end, the PCIe link, and the share of samples each clock
    #: event reason was active.
    gpu_health: NotRequired[dict[str, GpuHealth]]
    #: A distributed run: each rank's process and the launchers.
    ranks: NotRequired[Annotated[dict[str, Any], Ranks]]
    #: Ranks whose progress fell behind the others' (a distributed run's per-rank progress).
    stragglers: NotRequired[Annotated[list[dict[str, Any]], list[Straggler]]]
    #: Where the run's time went: productive steps and the badput by cause.
    goodput: NotRequired[GoodputSection]


def series_times(series: Series) -> list[float]:
    """A series' ``t``: the schema allows null in every column alike, but the package writes
    a time in every slot of ``t`` (``SeriesBuffer.to_json``), where the other columns hold
    null for a sample that lacked the field."""
    return cast("list[float]", series["t"])


def schema_text() -> str:
    """``artifact.schema.json``'s text: the artifact's JSON Schema (draft 2020-12)."""
    named = {"process": ProcessRecord, "rank": Rank, "timestamp": Timestamp, "start_end": StartEnd}
    root, defs = json_schema(Artifact, named)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://asyncsoak.invalid/artifact.schema.json",
        "title": "asyncsoak soak artifact",
        **root,
        "if": {"properties": {"schema_version": {"const": 2}}},
        "then": {"required": ["trends", "processes"]},
        "$defs": defs,
    }
    return dump(schema) + "\n"


if __name__ == "__main__":  # python -m asyncsoak._contract._schema: rewrite the shipped file
    Path(__file__).parents[1].joinpath("artifact.schema.json").write_text(schema_text())
