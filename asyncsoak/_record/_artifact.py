"""The artifact: one JSON object that explains a soak after every process is gone.

:class:`ArtifactBuilder` folds journal events (their JSON form) into bounded state: the same
fold runs live in the serializer and offline in ``asyncsoak recover``, so an artifact rebuilt
from a dead monitor's journal has the same shape as one written at the end of a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from .._analysis import GpuHealthFold, TrendWatch
from .._contract import (
    SERIES_POINTS,
    AbandonedJson,
    Artifact,
    EventFold,
    EventKind,
    ExceptionInfo,
    ExceptionJson,
    Exit,
    ExitedJson,
    Failure,
    FailureJson,
    FailureReason,
    FinishedJson,
    ForensicsJson,
    ForensicsSection,
    GpuFaultJson,
    GpuSampleJson,
    HeaderJson,
    KeptEventJson,
    LeftoverJson,
    LimitsJson,
    OomKillEntry,
    OomKillJson,
    ProcessEntry,
    ProcessRecord,
    ProgressJson,
    RequeueJson,
    RunningStats,
    SampleJson,
    SamplerDegradedJson,
    SamplerNoteEntry,
    SamplerNoteJson,
    SamplerRecoveredJson,
    SeriesBuffer,
    SignalJson,
    SnapshotJson,
    SnapshotSection,
    SoakStatus,
    StartedJson,
    StepJson,
    StepsProgress,
    Stop,
    StopCause,
    StopJson,
    TreeGoneJson,
    Trend,
    TrendJson,
    UnreadableFileError,
    ValidationError,
    WarningJson,
    open_regular,
    parse_iso,
)

# Re-exported: the supervisor writes its times through the artifact module.
from .._contract import iso as iso

#: Version 2 added ``trends``, ``processes``, ``limits``, ``exit.exception`` and
#: ``series.progress_rate``; readers still take version 1 artifacts.
SCHEMA_VERSION = 2
SCHEMA_VERSIONS = frozenset({1, 2})
#: Events kept in the artifact (the journal keeps them all): the first and the last ones.
EVENTS_HEAD = 500
EVENTS_TAIL = 1500
#: Event kinds that live only in the journal (their figures are in series and summary).
SAMPLE_KINDS = frozenset({EventKind.SAMPLE, EventKind.GPU_SAMPLE})
#: Event kinds not kept as they are in ``artifact.events``: the samples, and the header and
#: snapshot, which have sections of their own.
#: Step events (one a scan at most) live on in ``progress.steps`` and the ``steps`` series.
#: A forensics record is large: kept once in its own section, and mentioned among the events.
_NOT_KEPT_AS_IS = SAMPLE_KINDS | {
    EventKind.HEADER,
    EventKind.SNAPSHOT,
    EventKind.STEP,
    EventKind.FORENSICS,
}
#: The series groups of the training steps, and of ``--stale-progress auto``'s limit.
STEPS_SERIES = "steps"
STALE_LIMIT_SERIES = "stale_limit"
#: Bytes of the captured output copied into the artifact.
LOG_TAIL_BYTES = 16 * 1024
#: Permissions of every file asyncsoak creates: the owner's only.
FILE_MODE = 0o600


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the artifact, shipped in the package."""
    text = resources.files("asyncsoak").joinpath("artifact.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


#: Schema versions of the artifacts this asyncsoak reads.
KNOWN_SCHEMA_VERSIONS = tuple(range(1, SCHEMA_VERSION + 1))

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class ArtifactError(ValidationError):
    """A file that is not a whole artifact of a schema version this asyncsoak reads."""


class UnknownWordError(ValueError):
    """An event names a status, reason or stop cause outside this asyncsoak's vocabulary: the
    journal may come from a newer asyncsoak."""


_Word = TypeVar("_Word", FailureReason, StopCause, SoakStatus)


def _member(vocabulary: type[_Word], word: str, what: str) -> _Word:
    try:
        return vocabulary(word)
    except ValueError:
        raise UnknownWordError(
            f"{what} {str(word)[:40]!r} is not one this asyncsoak knows; it may come from a "
            "newer asyncsoak: upgrade asyncsoak"
        ) from None


def check_artifact(data: object) -> Artifact:
    """``data`` when it is an artifact of a known schema version holding every field the
    shipped schema requires, with the types it gives; else :class:`ArtifactError` saying what
    is wrong.  The views (report, summary) load through it, so a truncated or foreign file is
    a clear error, never a ``KeyError`` half-way through a report."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ArtifactError("not an asyncsoak artifact (no schema_version)")
    version = data["schema_version"]
    if isinstance(version, bool) or version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
        raise ArtifactError(
            f"artifact schema version {version!r} is not one this asyncsoak reads ({known}); "
            "it may come from a newer asyncsoak: upgrade asyncsoak"
        )
    schema = load_schema()
    problem = _problem(data, schema, "", schema.get("$defs", {}))
    if problem is not None:
        raise ArtifactError(f"incomplete or damaged artifact: {problem}")
    _words_as_members(data)
    # The one cast from JSON to the typed artifact, and a sound one: ``data`` has every key
    # the schema requires, with the schema's types, and the TypedDicts in ``_schema`` mirror
    # that schema (``tests/test_vocabulary.py`` compares their required keys).
    return cast(Artifact, data)


def _words_as_members(data: dict[str, Any]) -> None:
    """The status, the failures' reasons and the stop's cause as the enums' members, as the
    ``Artifact`` type gives them (the schema check let only the vocabulary's words through;
    a member compares and serialises as its word)."""
    data["status"] = SoakStatus(data["status"])
    for failure in data["failures"]:
        failure["reason"] = FailureReason(failure["reason"])
    stop = data.get("stop")
    if stop is not None and stop["cause"] is not None:
        stop["cause"] = StopCause(stop["cause"])


def _problem(value: Any, schema: dict[str, Any], where: str, defs: dict[str, Any]) -> str | None:
    """The first way ``value`` breaks ``schema`` (the subset the artifact's schema uses:
    ``$ref``, ``anyOf``, ``type``, ``enum``, ``required``, ``properties``,
    ``additionalProperties``, ``items``)."""
    if "$ref" in schema:
        return _problem(value, defs[schema["$ref"].rsplit("/", 1)[-1]], where, defs)
    if "anyOf" in schema:
        problems = [_problem(value, option, where, defs) for option in schema["anyOf"]]
        return None if None in problems else problems[0]
    name = where or "the artifact"
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else types
        if not any(
            isinstance(value, _JSON_TYPES[t]) and not (isinstance(value, bool) and t != "boolean")
            for t in allowed
        ):
            return f"{name} is {type(value).__name__}, not {' or '.join(allowed)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{name} is {value!r}, not one of {', '.join(map(repr, schema['enum']))}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                return f"{name} has no {key!r}"
        properties = schema.get("properties", {})
        for key, sub in properties.items():
            if key in value and key != "schema_version":
                found = _problem(value[key], sub, f"{where}.{key}".lstrip("."), defs)
                if found is not None:
                    return found
        # The sections keyed by data (trends, series groups): each entry has the schema's shape.
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in properties:
                    found = _problem(item, extra, f"{where}.{key}".lstrip("."), defs)
                    if found is not None:
                        return found
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found = _problem(item, schema["items"], f"{where}[{i}]", defs)
            if found is not None:
                return found
    return None


class ArtifactBuilder:
    """Folds events, in journal order, into everything the artifact needs."""

    def __init__(self, max_points: int = SERIES_POINTS) -> None:
        self._max_points = max_points
        self.header: HeaderJson | None = None
        self._events_head: list[KeptEventJson] = []
        self._events_tail: deque[KeptEventJson] = deque(maxlen=EVENTS_TAIL)
        self._events_seen = 0
        self._series: dict[str, SeriesBuffer] = {}
        self._stats: dict[str, dict[str, RunningStats]] = {}
        self._labels: dict[str, dict[str, set[str]]] = {}
        self.samples: dict[str, int] = {}
        self.failures: list[Failure] = []
        self.warnings: list[str] = []
        self.exit: Exit = {
            "returncode": None,
            "signal": None,
            "pid": None,
            "exception": None,
        }
        #: Trends, per-process records and the progress rate (bounded).
        self.trends = TrendWatch()
        #: Each GPU's health (Xid errors, ECC, remaps, link, throttling).
        self.gpu_health = GpuHealthFold()
        self.exit_t: float | None = None
        self.stop: Stop = {
            "cause": None,
            "mode": None,
            "grace_seconds": None,
            "killed": False,
            "signals": [],
        }
        self.leftovers: list[ProcessRecord] = []
        self.abandoned: list[ProcessRecord] = []
        self.sampler_notes: list[SamplerNoteEntry] = []
        self.forensics: ForensicsSection | None = None
        self.oom_kills: list[OomKillEntry] = []
        self.progress_changes = 0
        #: The newest step event, when the trainer wrote steps; when the first came.
        self.step: StepJson | None = None
        self.step_first: float | None = None
        #: When the step last moved (a loss logged at the same step is not an advance).
        self.step_advanced_at: float | None = None
        #: Whether the steps were the progress that counted (else the file changes were).
        self.steps_count = False
        self.step_longest_gap = 0.0
        #: ``--stale-progress auto``: the limit in force, as the newest event said.
        self.stale_limit: float | None = None
        self.progress_first: float | None = None
        self.progress_last: float | None = None
        self.longest_gap = 0.0
        self.last_t = 0.0
        self.status: SoakStatus | None = None
        self.snapshot: SnapshotSection = {}

    # -- folding -------------------------------------------------------------------------

    _fold: ClassVar[EventFold[ArtifactBuilder]] = EventFold()

    def add(self, event: Mapping[str, Any]) -> None:
        t = float(event.get("t", 0.0))
        self.last_t = max(self.last_t, t)
        if event["kind"] not in _NOT_KEPT_AS_IS:
            # Sound: every other kind is a ``KeptEventJson``.
            self._keep_event(cast(KeptEventJson, event))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.HEADER)
    def _on_header(self, t: float, event: HeaderJson) -> None:
        self.header = event
        self.trends.configure(event.get("config") or {})

    @_fold.on(EventKind.SNAPSHOT)
    def _on_snapshot(self, t: float, event: SnapshotJson) -> None:
        self.snapshot = cast(SnapshotSection, event["data"])

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, event: SampleJson) -> None:
        self.trends.add_sample(t, event)
        self._add_series_source(t, event)

    @_fold.on(EventKind.GPU_SAMPLE)
    def _on_gpu_sample(self, t: float, event: GpuSampleJson) -> None:
        self.trends.add_gpu_sample(t, event)
        self.gpu_health.add_sample(t, event)
        self._add_series_source(t, event)

    @_fold.on(EventKind.STARTED)
    def _on_started(self, t: float, event: StartedJson) -> None:
        self.exit["pid"] = event["pid"]

    @_fold.on(EventKind.TREE_GONE)
    def _on_tree_gone(self, t: float, event: TreeGoneJson) -> None:
        self.trends.tree_gone(t)

    @_fold.on(EventKind.EXITED)
    def _on_exited(self, t: float, event: ExitedJson) -> None:
        self.exit["returncode"] = event["returncode"]
        self.exit["signal"] = event["signal"]
        self.exit["pid"] = event["pid"]
        self.exit_t = t
        self.trends.end(t)
        if self.stop["cause"] is None:
            self.stop["cause"] = StopCause.EXITED

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: ProgressJson) -> None:
        self.progress_changes += int(event["changed"])
        if self.progress_first is None:
            self.progress_first = t
        elif self.progress_last is not None:
            self.longest_gap = max(self.longest_gap, t - self.progress_last)
        self.progress_last = t
        self.trends.add_progress(t, event)
        self._add_stale_limit(t, event)

    @_fold.on(EventKind.EXCEPTION)
    def _on_exception(self, t: float, event: ExceptionJson) -> None:
        exception: ExceptionInfo = {
            "type": event["type"],
            "message": event["message"],
            "where": event["where"],
            "kind": event["exception_kind"],
        }
        if event.get("rank") is not None:
            exception["rank"] = event.get("rank")
            exception["rank_pid"] = event.get("rank_pid")
        self.exit["exception"] = exception

    @_fold.on(EventKind.LIMITS)
    def _on_limits(self, t: float, event: LimitsJson) -> None:
        self.trends.add_limits(event)

    @_fold.on(EventKind.TREND)
    def _on_trend(self, t: float, event: TrendJson) -> None:
        self.trends.add_live_call(t, event)

    @_fold.on(EventKind.FAILURE)
    def _on_failure(self, t: float, event: FailureJson) -> None:
        failure: Failure = {
            "reason": _member(FailureReason, event["reason"], "the failure reason"),
            "message": event["message"],
            "at": event["at"],
        }
        gpu, activity = event.get("gpu"), event.get("activity")
        if gpu is not None:
            failure["gpu"] = gpu
        if activity is not None:
            failure["activity"] = activity
        self.failures.append(failure)

    @_fold.on(EventKind.GPU_FAULT)
    def _on_gpu_fault(self, t: float, event: GpuFaultJson) -> None:
        self.gpu_health.add_fault(t, event)

    @_fold.on(EventKind.WARNING)
    def _on_warning(self, t: float, event: WarningJson) -> None:
        self.warnings.append(str(event["message"]))

    @_fold.on(EventKind.STOP)
    def _on_stop(self, t: float, event: StopJson) -> None:
        self.trends.end(t)
        self.stop["cause"] = _member(StopCause, event["cause"], "the stop cause")
        self.stop["mode"] = event["mode"]
        self.stop["grace_seconds"] = event["grace_seconds"]

    @_fold.on(EventKind.SIGNAL)
    def _on_signal(self, t: float, event: SignalJson) -> None:
        self.stop["signals"].append({"t": t, "signal": event["signal"], "target": event["target"]})
        if event["signal"] == "SIGKILL":
            self.stop["killed"] = True

    @_fold.on(EventKind.REQUEUE)
    def _on_requeue(self, t: float, event: RequeueJson) -> None:
        self.stop["requeue"] = {
            "job_id": event["job_id"],
            "ok": event["ok"],
            "returncode": event["returncode"],
            "message": event["message"],
            "t": event["t"],
        }

    @_fold.on(EventKind.LEFTOVER)
    def _on_leftover(self, t: float, event: LeftoverJson) -> None:
        self.leftovers.append(cast(ProcessRecord, event["process"]))

    @_fold.on(EventKind.ABANDONED)
    def _on_abandoned(self, t: float, event: AbandonedJson) -> None:
        self.abandoned.append(cast(ProcessRecord, event["process"]))

    @_fold.on(EventKind.FORENSICS)
    def _on_forensics(self, t: float, event: ForensicsJson) -> None:
        # A forensics record is large: the artifact keeps it once, in its own section, and
        # a mention of it among the events.
        data = event["data"]
        self._keep_event(
            {"t": t, "kind": EventKind.FORENSICS, "processes": len(data.get("processes", []))}
        )
        # The collector's own record (see ``Forensics``), under the event's reason.
        self.forensics = cast(ForensicsSection, {"reason": event["reason"], "t": t, **data})

    @_fold.on(EventKind.OOM_KILL)
    def _on_oom_kill(self, t: float, event: OomKillJson) -> None:
        self.oom_kills.append(
            {
                "pid": event["pid"],
                "name": event["name"],
                "message": event["message"],
                # Journals from before the cgroup's counter was read: the kernel log.
                "detected_by": event.get("detected_by", ["kernel_log"]),
                "cgroup_path": event.get("cgroup_path"),
                "cgroup_memory_limit_bytes": event.get("cgroup_memory_limit_bytes"),
            }
        )

    @_fold.on(EventKind.SAMPLER_NOTE, EventKind.SAMPLER_DEGRADED, EventKind.SAMPLER_RECOVERED)
    def _on_sampler_note(
        self, t: float, event: SamplerNoteJson | SamplerDegradedJson | SamplerRecoveredJson
    ) -> None:
        self.sampler_notes.append(cast(SamplerNoteEntry, event))

    @_fold.on(EventKind.FINISHED)
    def _on_finished(self, t: float, event: FinishedJson) -> None:
        self.status = _member(SoakStatus, event["status"], "the status")

    @_fold.on(EventKind.STEP)
    def _on_step(self, t: float, event: StepJson) -> None:
        if self.step_first is None:
            self.step_first = t
        gap = event.get("gap_seconds")
        if gap is not None:
            self.step_longest_gap = max(self.step_longest_gap, float(gap))
        if self.step is None or self.step.get("step") != event.get("step"):
            self.step_advanced_at = t
        if event.get("counts", True):
            self.steps_count = True
        self.step = event
        rate = event.get("steps_per_second")
        self.trends.add_step_rate(t, rate)
        values = {
            "step": event.get("step"),
            "steps_per_second": rate,
            "loss": event.get("loss"),
            "tokens_per_second": event.get("tokens_per_second"),
            "samples_per_second": event.get("samples_per_second"),
        }
        self._series_of(STEPS_SERIES).add(t, {k: v for k, v in values.items() if v is not None})
        self._add_stale_limit(t, event)

    def _add_stale_limit(self, t: float, event: ProgressJson | StepJson) -> None:
        limit = event.get("stale_limit_seconds")
        if limit is not None and limit != self.stale_limit:
            self.stale_limit = float(limit)
            self._series_of(STALE_LIMIT_SERIES).add(t, {"seconds": self.stale_limit})

    def _series_of(self, group: str) -> SeriesBuffer:
        series = self._series.get(group)
        if series is None:
            series = self._series[group] = SeriesBuffer(self._max_points)
        return series

    def _steps_progress(self) -> StepsProgress | None:
        step = self.step
        if step is None:
            return None
        return {
            "step": int(step["step"]),
            "max_steps": step.get("max_steps"),
            "source": str(step.get("source")),
            "source_kind": str(step.get("source_kind")),
            "first_step_at": self.wall(self.step_first),
            "last_step_at": self.wall(self.step_advanced_at),
            "longest_gap_seconds": round(self.step_longest_gap, 3),
            "loss": step.get("loss"),
            "loss_step": step.get("loss_step"),
            "steps_per_second": step.get("steps_per_second"),
            "tokens_per_second": step.get("tokens_per_second"),
            "samples_per_second": step.get("samples_per_second"),
            "eta_seconds": step.get("eta_seconds"),
        }

    def _keep_event(self, event: KeptEventJson) -> None:
        self._events_seen += 1
        if len(self._events_head) < EVENTS_HEAD:
            self._events_head.append(event)
        else:
            self._events_tail.append(event)

    def _add_series_source(self, t: float, event: SampleJson | GpuSampleJson) -> None:
        """A sample's count, series points and summary labels."""
        kind = str(event["kind"])
        self.samples[kind] = self.samples.get(kind, 0) + 1
        for group, values in (event.get("points") or {}).items():
            series = self._series.get(group)
            if series is None:
                series = self._series[group] = SeriesBuffer(self._max_points)
            series.add(t, values)
            stats = self._stats.setdefault(group, {})
            for name, value in values.items():
                stats.setdefault(name, RunningStats()).add(value)
        for group, labels in (event.get("labels") or {}).items():
            seen = self._labels.setdefault(group, {})
            for name, words in labels.items():
                seen.setdefault(name, set()).update(words)

    # -- the artifact ----------------------------------------------------------------------

    def _ranks(self) -> dict[str, Any] | None:
        """``ranks`` when the tree had ranks or a launcher (a distributed run)."""
        return self.trends.role_fold.section()

    def wall(self, t: float | None) -> str | None:
        """Seconds since the start as an ISO 8601 UTC time."""
        if t is None or self.header is None:
            return None
        return iso(parse_iso(self.header["started_at"]) + timedelta(seconds=t))

    def build(
        self,
        *,
        status: str,
        ended_t: float,
        log_tail: str,
        monitor: dict[str, Any],
    ) -> dict[str, Any]:
        """The artifact as a plain dict (see :meth:`build_typed`), ``status`` one of the
        statuses' words."""
        artifact = self.build_typed(
            status=SoakStatus(status), ended_t=ended_t, log_tail=log_tail, monitor=monitor
        )
        return cast("dict[str, Any]", artifact)

    def build_typed(
        self,
        *,
        status: SoakStatus,
        ended_t: float,
        log_tail: str,
        monitor: dict[str, Any],
    ) -> Artifact:
        """The artifact of the events folded so far, typed as the schema's ``Artifact``."""
        # A journal without its header (recover refuses one) leaves the defaults below.
        header: Mapping[str, Any] = self.header or {}
        events = list(self._events_head) + list(self._events_tail)
        dropped_events = self._events_seen - len(events)
        trailing_gap = ended_t - self.progress_last if self.progress_last is not None else 0.0
        summary: dict[str, Any] = {}
        for group, stats in sorted(self._stats.items()):
            summary[group] = {name: s.to_json() for name, s in sorted(stats.items())}
        for group, labels in sorted(self._labels.items()):
            summary.setdefault(group, {}).update(
                {name: sorted(values) for name, values in sorted(labels.items())}
            )
        summary["samples"] = dict(sorted(self.samples.items()))
        series = {group: s.to_json() for group, s in sorted(self._series.items())}
        if self.trends.rate.times:
            series["progress_rate"] = self.trends.rate.to_json()
        # Typed as the schema's ``Artifact``, so mypy checks what is written against what the
        # readers index.
        artifact: Artifact = {
            "schema_version": SCHEMA_VERSION,
            "status": status,
            # A GPU fault explains what came with it (a trainer killed by an Xid exits non-zero):
            # it is the primary reason whenever it holds.
            "failures": sorted(self.failures, key=lambda f: f["reason"] != "gpu_fault"),
            "warnings": self.warnings,
            "command": header.get("command", []),
            "cwd": header.get("cwd", ""),
            "config": header.get("config", {}),
            "metadata": header.get("metadata", {}),
            "started_at": header.get("started_at", iso(datetime.now(UTC))),
            "ended_at": self.wall(ended_t) or iso(datetime.now(UTC)),
            "duration_seconds": round(ended_t, 3),
            "exit": self.exit,
            "snapshot": self.snapshot,
            "progress": {
                "dir": header.get("config", {}).get("progress_dir"),
                "first_change_at": self.wall(self.progress_first),
                "last_change_at": self.wall(self.progress_last),
                "changes": self.progress_changes,
                "longest_gap_seconds": round(max(self.longest_gap, trailing_gap), 3),
                "source": "steps" if self.steps_count else "files",
                "steps": self._steps_progress(),
                "stale_limit_seconds": self.stale_limit,
            },
            "series": series,
            "series_resolution": {
                group: s.samples_per_point for group, s in sorted(self._series.items())
            },
            "summary": summary,
            "events": events,
            "events_dropped": dropped_events,
            "leftover_processes": self.leftovers,
            "abandoned_processes": self.abandoned,
            "oom_kills": self.oom_kills,
            # TrendWatch builds these as plain dicts, in the shapes the schema gives.
            "trends": cast("dict[str, Trend]", self.trends.evaluate(self.wall)),
            "processes": cast("list[ProcessEntry]", self.trends.top_processes()),
            "limits": self.trends.limits,
            "gpu_health": self.gpu_health.to_json(self.wall),
            "forensics": self.forensics,
            "stop": self.stop,
            "log": {"path": header.get("log_path"), "tail": log_tail},
            "monitor": {
                "journal_path": header.get("journal_path"),
                "monotonic_start": header.get("monotonic_start"),
                "samples": dict(sorted(self.samples.items())),
                "sampler_notes": self.sampler_notes,
                # The caller's own figures (the soak's or recover's): keys the schema leaves open.
                **monitor,  # type: ignore[typeddict-item]
            },
        }
        ranks = self._ranks()
        if ranks is not None:
            artifact["ranks"] = ranks
        if self.trends.stragglers:
            artifact["stragglers"] = list(self.trends.stragglers.values())
        return artifact


def create_private_file(path: Path) -> int:
    """Create (or truncate) ``path`` readable by its owner only; return a writable fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)


def write_artifact(artifact: Mapping[str, Any], path: Path) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then ``os.replace``.

    ``mkstemp`` creates the file readable by its owner only, and ``os.replace`` keeps that.
    """
    data = json.dumps(artifact, indent=1, allow_nan=False, default=str).encode() + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_log_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of the captured output, decoded leniently ("" when it cannot
    be read, or is no regular file: a journal rebuilt by ``recover`` names its log, and a
    doctored one may name a FIFO or ``/dev/zero``)."""
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except (OSError, UnreadableFileError):
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > max_bytes:
        # Drop the partial first line.
        text = text.partition("\n")[2]
    return text
