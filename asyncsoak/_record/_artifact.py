"""The artifact: one JSON object that explains a soak after every process is gone, built by
:class:`RunState`, which folds the events live in the serializer and offline in ``recover``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from .._analysis import GoodputFold, GpuHealthFold, Ledger, TrendWatch
from .._contract import (
    SERIES_POINTS,
    EventKind,
    FailureReason,
    ProgressBins,
    RunningStats,
    SeriesBuffer,
    SoakStatus,
    StopCause,
    events,
    iso,
    parse_iso,
)
from ._deadlines import Deadlines

if TYPE_CHECKING:
    from .._contract import Artifact, schema  # types only: a run never imports the schema

#: Version 2 added ``trends``, ``processes``, ``limits``, ``exit.exception`` and
#: ``series.progress_rate``; readers still take version 1 artifacts.
SCHEMA_VERSION = 2
#: Events kept in the artifact (the journal keeps them all): the first and the last ones.
EVENTS_HEAD = 500
EVENTS_TAIL = 1500
#: Event kinds not kept as they are in ``artifact.events``: sections of their own hold them
#: (a forensics record, being large, is only mentioned among the events).
_NOT_KEPT_AS_IS = frozenset(
    {"sample", "gpu_sample", "header", "snapshot", "step", "forensics", "rule_broken"}
)
#: The series groups of the training steps, and of ``--stale-progress auto``'s limit.
STEPS_SERIES = "steps"
STALE_LIMIT_SERIES = "stale_limit"
#: A step event's figures kept in the steps series.
_STEP_FIGURES = ("step", "steps_per_second", "loss", "tokens_per_second", "samples_per_second")


class UnknownWordError(ValueError):
    """An event's status, reason or stop cause is no word of this asyncsoak's (a newer one's)."""


_Word = TypeVar("_Word", FailureReason, StopCause, SoakStatus)
_Found = TypeVar("_Found")


def _member(vocabulary: type[_Word], word: str, what: str) -> _Word:
    try:
        return vocabulary(word)
    except ValueError:
        raise UnknownWordError(
            f"{what} {str(word)[:40]!r} is not one this asyncsoak knows; it may come from a "
            "newer asyncsoak: upgrade asyncsoak"
        ) from None


class RunState:
    """The run's state, folded from its events in journal order: everything the artifact
    and the rules need (:meth:`build` gives the artifact)."""

    def __init__(self, max_points: int = SERIES_POINTS) -> None:
        self._max_points = max_points
        self.header: events.HeaderJson | None = None
        self._events_head: list[events.KeptEventJson] = []
        self._events_tail: deque[events.KeptEventJson] = deque(maxlen=EVENTS_TAIL)
        self._events_seen = 0
        self._series: dict[str, SeriesBuffer] = {}
        self._stats: dict[str, dict[str, RunningStats]] = {}
        self._labels: dict[str, dict[str, set[str]]] = {}
        self.samples: dict[str, int] = {}
        #: The newest event of each sample kind, and when the command started: what views show.
        self.latest: dict[str, Any] = {}
        self.started_t: float | None = None
        self.failures: list[schema.Failure] = []
        self._woken: Any = None  # an anyio.Event while a wait waits
        self.warnings: list[str] = []
        #: The first rule a producer found broken, and what the tree and its GPUs did then.
        self.broken_rule: events.RuleBrokenJson | None = None
        self.broken_activity: dict[str, Any] | None = None
        #: Rules (and series) whose judgement raised -> the exception.
        self.rule_errors: dict[str, str] = {}
        self.exit: schema.Exit = {
            "returncode": None,
            "signal": None,
            "pid": None,
            "exception": None,
        }
        self.trends = TrendWatch()
        self.gpu_health = GpuHealthFold()
        self.goodput_fold = GoodputFold()
        self.exit_t: float | None = None
        self.stop: schema.Stop = {
            "cause": None,
            "mode": None,
            "grace_seconds": None,
            "killed": False,
            "signals": [],
        }
        self.leftovers: list[schema.ProcessRecord] = []
        self.abandoned: list[schema.ProcessRecord] = []
        self.sampler_notes: list[schema.SamplerNoteEntry] = []
        self.forensics: schema.ForensicsSection | None = None
        self.oom_kills: list[schema.OomKillEntry] = []
        self.progress_changes = 0
        self.progress_bins = ProgressBins()
        self.step: events.StepJson | None = None
        self.step_first: float | None = None
        #: When the step last moved (a loss logged at the same step is not an advance).
        self.step_advanced_at: float | None = None
        #: Whether the steps were the progress that counted (else the file changes were).
        self.steps_count = False
        self.step_longest_gap = 0.0
        self.deadlines = Deadlines()
        #: ``--stale-progress auto``: the limit in force, as the newest event said.
        self.stale_limit: float | None = None
        self.progress_first: float | None = None
        self.progress_last: float | None = None
        self.longest_gap = 0.0
        self.last_t = 0.0
        #: The times of the last two proc samples (the trend rule's pace).
        self.sample_times: deque[float] = deque([0.0, 0.0], maxlen=2)
        #: The tree's pids in the newest sample, and every pid a sample has shown.
        self.tree_pids: frozenset[int] = frozenset()
        self.seen_pids: set[int] = set()
        self.status: SoakStatus | None = None
        self.snapshot: schema.SnapshotSection = {}

    _fold: ClassVar[events.EventFold[RunState]] = events.EventFold()

    async def wait_failed(self, reason: FailureReason | None = None) -> schema.Failure:
        """The run's first failure (for ``reason``), once one is folded: a run that fails ends."""
        return await self.wait_for(
            lambda: next((f for f in self.failures if reason in (None, f["reason"])), None)
        )

    async def wait_for(self, found: Callable[[], _Found | None]) -> _Found:
        """``found()`` once not None, tried again as each failure or broken rule (or a GPU
        reading after the tree was gone) is folded."""
        while (value := found()) is None:
            if self._woken is None:
                import anyio  # only live soaks wait: views that fold never import it

                self._woken = anyio.Event()
            await self._woken.wait()
        return value

    def _wake(self) -> None:
        if self._woken is not None:
            self._woken.set()
            self._woken = None

    def add(self, event: Mapping[str, Any]) -> None:
        t = float(event.get("t", 0.0))
        self.last_t = max(self.last_t, t)
        if event["kind"] not in _NOT_KEPT_AS_IS:
            # Sound: every other kind is a ``KeptEventJson``.
            self._keep_event(cast(events.KeptEventJson, event))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.HEADER)
    def _on_header(self, t: float, event: events.HeaderJson) -> None:
        self.header = event
        for fold in (self.trends, self.deadlines, self.goodput_fold):
            fold.configure(event.get("config") or {})

    @_fold.on(EventKind.SNAPSHOT)
    def _on_snapshot(self, t: float, event: events.SnapshotJson) -> None:
        self.snapshot = cast("schema.SnapshotSection", event["data"])

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, event: events.SampleJson) -> None:
        self.trends.add_sample(t, event)
        self.sample_times.append(t)
        self.tree_pids = frozenset([p["pid"] for p in event.get("processes") or ()])
        self.seen_pids.update(self.tree_pids)
        self._add_series_source(t, event)

    @_fold.on(EventKind.GPU_SAMPLE)
    def _on_gpu_sample(self, t: float, event: events.GpuSampleJson) -> None:
        self.trends.add_gpu_sample(t, event)
        self.gpu_health.add_sample(t, event)
        self._add_series_source(t, event)
        if self.trends.gpu_after_tree is not None:
            self._wake()  # what the end of a run waits on to tell the GPUs' release

    @_fold.on(EventKind.STARTED)
    def _on_started(self, t: float, event: events.StartedJson) -> None:
        self.started_t = t
        self.exit["pid"] = event["pid"]

    @_fold.on(EventKind.TREE_GONE)
    def _on_tree_gone(self, t: float, event: events.TreeGoneJson) -> None:
        self.trends.tree_gone(t)
        self.goodput_fold.end(t)

    @_fold.on(EventKind.EXITED)
    def _on_exited(self, t: float, event: events.ExitedJson) -> None:
        self.exit["returncode"] = event["returncode"]
        self.exit["signal"] = event["signal"]
        self.exit["pid"] = event["pid"]
        self.exit_t = t
        self.trends.end(t)
        if self.stop["cause"] is None:
            self.stop["cause"] = StopCause.EXITED

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: events.ProgressJson) -> None:
        self.progress_changes += int(event["changed"])
        if self.progress_first is None:
            self.progress_first = t
        elif self.progress_last is not None:
            self.longest_gap = max(self.longest_gap, t - self.progress_last)
        self.progress_last = t
        self.deadlines.add_paths(t, event.get("paths") or [])
        self.progress_bins.add(t, event.get("paths") or ())
        self.trends.add_progress(t, event)
        self.goodput_fold.add_progress(t, event.get("paths") or ())
        self._add_stale_limit(t, event)

    @_fold.on(EventKind.EXCEPTION)
    def _on_exception(self, t: float, event: events.ExceptionJson) -> None:
        exception: schema.ExceptionInfo = {
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
    def _on_limits(self, t: float, event: events.LimitsJson) -> None:
        self.trends.add_limits(event)

    @_fold.on(EventKind.TREND)
    def _on_trend(self, t: float, event: events.TrendJson) -> None:
        self.trends.add_live_call(t, event)

    @_fold.on(EventKind.FAILURE)
    def _on_failure(self, t: float, event: events.FailureJson) -> None:
        failure: schema.Failure = {
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
        self.goodput_fold.fail(t, failure["reason"])
        self._wake()

    @_fold.on(EventKind.RULE_BROKEN)
    def _on_rule_broken(self, t: float, event: events.RuleBrokenJson) -> None:
        if self.broken_rule is not None:
            return
        self.broken_rule = event
        self._wake()
        if event["reason"] not in (FailureReason.STALE_PROGRESS, FailureReason.STARTUP_TIMEOUT):
            return
        try:
            self.broken_activity = self.trends.activity()
        except Exception as exc:  # a bug, never the run's fault: the stall is told without it
            self.rule_errors.setdefault("the stall's activity", f"{type(exc).__name__}: {exc}")

    @_fold.on(EventKind.GPU_FAULT)
    def _on_gpu_fault(self, t: float, event: events.GpuFaultJson) -> None:
        self.gpu_health.add_fault(t, event)

    @_fold.on(EventKind.WARNING)
    def _on_warning(self, t: float, event: events.WarningJson) -> None:
        self.warnings.append(str(event["message"]))

    @_fold.on(EventKind.STOP)
    def _on_stop(self, t: float, event: events.StopJson) -> None:
        self.trends.end(t)
        self.goodput_fold.stop(t)
        self.stop["cause"] = _member(StopCause, event["cause"], "the stop cause")
        self.stop["mode"] = event["mode"]
        self.stop["grace_seconds"] = event["grace_seconds"]

    @_fold.on(EventKind.SIGNAL)
    def _on_signal(self, t: float, event: events.SignalJson) -> None:
        self.stop["signals"].append({"t": t, "signal": event["signal"], "target": event["target"]})
        if event["signal"] == "SIGKILL":
            self.stop["killed"] = True

    @_fold.on(EventKind.REQUEUE)
    def _on_requeue(self, t: float, event: events.RequeueJson) -> None:
        self.stop["requeue"] = {
            "job_id": event["job_id"],
            "ok": event["ok"],
            "returncode": event["returncode"],
            "message": event["message"],
            "t": event["t"],
        }

    @_fold.on(EventKind.LEFTOVER, EventKind.ABANDONED)
    def _on_leftover(self, t: float, event: events.LeftoverJson | events.AbandonedJson) -> None:
        into = self.leftovers if event["kind"] == EventKind.LEFTOVER else self.abandoned
        into.append(cast("schema.ProcessRecord", event["process"]))

    @_fold.on(EventKind.FORENSICS)
    def _on_forensics(self, t: float, event: events.ForensicsJson) -> None:
        data = event["data"]
        self._keep_event(
            {"t": t, "kind": EventKind.FORENSICS, "processes": len(data.get("processes", []))}
        )
        self.forensics = cast(
            "schema.ForensicsSection", {"reason": event["reason"], "t": t, **data}
        )

    @_fold.on(EventKind.OOM_KILL)
    def _on_oom_kill(self, t: float, event: events.OomKillJson) -> None:
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
        self,
        t: float,
        event: events.SamplerNoteJson | events.SamplerDegradedJson | events.SamplerRecoveredJson,
    ) -> None:
        self.sampler_notes.append(cast("schema.SamplerNoteEntry", event))

    @_fold.on(EventKind.FINISHED)
    def _on_finished(self, t: float, event: events.FinishedJson) -> None:
        self.status = _member(SoakStatus, event["status"], "the status")

    @_fold.on(EventKind.STEP)
    def _on_step(self, t: float, event: events.StepJson) -> None:
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
        self.goodput_fold.add_steps(t, event.get("marks") or ())
        rate = event.get("steps_per_second")
        self.trends.add_step_rate(t, rate)
        values: dict[str, Any] = {k: v for k in _STEP_FIGURES if (v := event.get(k)) is not None}
        self._series_of(STEPS_SERIES).add(t, values)
        self._add_stale_limit(t, event)

    def _add_stale_limit(self, t: float, event: events.ProgressJson | events.StepJson) -> None:
        limit = event.get("stale_limit_seconds")
        if limit is not None and limit != self.stale_limit:
            self.stale_limit = float(limit)
            self._series_of(STALE_LIMIT_SERIES).add(t, {"seconds": self.stale_limit})

    def _series_of(self, group: str) -> SeriesBuffer:
        series = self._series.get(group)
        if series is None:
            series = self._series[group] = SeriesBuffer(self._max_points)
        return series

    def _steps_progress(self, ended_t: float) -> schema.StepsProgress | None:
        step = self.step
        if step is None:
            return None
        # The time since the last advance is a gap too (a frozen step's).
        trailing = ended_t - (self.step_advanced_at or ended_t)
        return {
            "step": int(step["step"]),
            "max_steps": step.get("max_steps"),
            "source": str(step.get("source")),
            "source_kind": str(step.get("source_kind")),
            "first_step_at": self.wall(self.step_first),
            "last_step_at": self.wall(self.step_advanced_at),
            "longest_gap_seconds": round(max(self.step_longest_gap, trailing), 3),
            "loss": step.get("loss"),
            "loss_step": step.get("loss_step"),
            "nonfinite_loss": step.get("nonfinite_loss"),
            "steps_per_second": step.get("steps_per_second"),
            "tokens_per_second": step.get("tokens_per_second"),
            "samples_per_second": step.get("samples_per_second"),
            "eta_seconds": step.get("eta_seconds"),
            "nonfinite_grad_norms": int(step.get("nonfinite_grad_norms") or 0),
            "sources_without_loss": list(step.get("sources_without_loss") or []),
        }

    def _keep_event(self, event: events.KeptEventJson) -> None:
        self._events_seen += 1
        if len(self._events_head) < EVENTS_HEAD:
            self._events_head.append(event)
        else:
            self._events_tail.append(event)

    def _add_series_source(self, t: float, event: events.SampleJson | events.GpuSampleJson) -> None:
        """A sample's count, series points and summary labels."""
        kind = str(event["kind"])
        self.samples[kind] = self.samples.get(kind, 0) + 1
        self.latest[kind] = event
        for group, values in (event.get("points") or {}).items():
            self._series_of(group).add(t, values)
            stats = self._stats.setdefault(group, {})
            for name, value in values.items():
                stats.setdefault(name, RunningStats()).add(value)
        for group, labels in (event.get("labels") or {}).items():
            seen = self._labels.setdefault(group, {})
            for name, words in labels.items():
                seen.setdefault(name, set()).update(words)

    @property
    def last_progress(self) -> float | None:
        """The step's last advance once the steps are the progress, else the last change."""
        return self.step_advanced_at if self.steps_count else self.progress_last

    @property
    def steps_started(self) -> float | None:
        """The first step once the steps are the progress, else the first change."""
        return self.step_first if self.steps_count else self.progress_first

    def goodput(self, earlier_highest_step: int | None = None) -> Ledger:
        """The run's goodput ledger: launch -> the tree's end (the newest event's time while
        the tree lives); ``earlier_highest_step`` as :meth:`GoodputFold.ledger` takes it."""
        end = self.last_t if self.exit_t is None else self.exit_t
        return self.goodput_fold.ledger(end, earlier_highest_step)

    def peak(self, group: str, name: str) -> float | None:
        """The highest value of a sampled figure (the artifact's ``summary`` max)."""
        stats = self._stats.get(group, {}).get(name)
        return None if stats is None else stats.max

    def wall(self, t: float | None) -> str | None:
        """Seconds since the start as an ISO 8601 UTC time."""
        if t is None or self.header is None:
            return None
        return iso(parse_iso(self.header["started_at"]) + timedelta(seconds=t))

    def build(
        self, *, status: str, ended_t: float, log_tail: str, monitor: dict[str, Any]
    ) -> dict[str, Any]:
        """:meth:`build_typed` as a plain dict, ``status`` a word."""
        artifact = self.build_typed(
            status=SoakStatus(status), ended_t=ended_t, log_tail=log_tail, monitor=monitor
        )
        return cast("dict[str, Any]", artifact)

    def build_typed(
        self, *, status: SoakStatus, ended_t: float, log_tail: str, monitor: dict[str, Any]
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
                "steps": self._steps_progress(ended_t),
                "stale_limit_seconds": self.stale_limit,
                "bins": cast("schema.ProgressBinsSection", self.progress_bins.to_json()),
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
            "trends": cast("dict[str, schema.Trend]", self.trends.evaluate(self.wall)),
            "processes": cast("list[schema.ProcessEntry]", self.trends.top_processes()),
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
        ranks = self.trends.role_fold.section()  # a distributed run's
        if ranks is not None:
            artifact["ranks"] = ranks
        if self.trends.stragglers:
            artifact["stragglers"] = list(self.trends.stragglers.values())
        artifact["goodput"] = cast("schema.GoodputSection", self.goodput().to_json())
        return artifact
