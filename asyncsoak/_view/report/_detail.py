"""What the report draws over time beyond the series: the progress changes (in bins) and when
each GPU was held back, from the artifact, or the journal for an artifact older than both."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from ..._contract import Artifact, EventKind, bounded, events, file_names
from ..._record import JournalReader
from .._hints import IDLE_THROTTLE, throttled
from .._sections import events_dropped


class ProgressBin(NamedTuple):
    """Neighbouring progress changes (one change, for a run of few), as ``progress.bins``."""

    first: float
    last: float
    changes: int
    #: The longest gap before a change of the bin (from the change before, or the start).
    longest_gap: float
    longest_gap_t: float
    files: str


@dataclass(slots=True)
class RunDetail:
    """Every progress change, in bins in time order, and GPU throttling over time."""

    progress: list[ProgressBin] = field(default_factory=list)
    #: group -> [(start, end, reasons)]
    throttle_spans: dict[str, list[tuple[float, float, list[str]]]] = field(default_factory=dict)


def one_change_bins(changes: Iterable[tuple[float, str]]) -> list[ProgressBin]:
    """A bin per change, (time, files), in time order."""
    bins, before = [], 0.0
    for t, files in sorted(changes):
        bins.append(ProgressBin(t, t, 1, t - before, t, files))
        before = t
    return bins


def in_slices(bins: Sequence[ProgressBin], count: int) -> list[ProgressBin]:
    """``bins`` merged into at most ``count`` slices of the run's time, each keeping its
    longest gap (a day of changes every second would not draw in time)."""
    if len(bins) <= count:
        return list(bins)
    start = bins[0].first
    width = (bins[-1].last - start) / count or 1.0
    slices: dict[int, list[ProgressBin]] = {}
    for b in bins:
        slices.setdefault(min(int((b.last - start) / width), count - 1), []).append(b)
    merged = []
    for members in slices.values():
        longest = max(members, key=lambda b: b.longest_gap)
        changes = sum(b.changes for b in members)
        merged.append(
            ProgressBin(
                members[0].first, members[-1].last, changes, *longest[3:5], members[-1].files
            )
        )
    return merged


def artifact_detail(artifact: Artifact) -> RunDetail | None:
    """The detail the artifact holds; None for one written before ``progress.bins``."""
    bins = artifact["progress"].get("bins")
    if bins is None:
        return None
    keys = ("first_t", "last_t", "changes", "longest_gap_seconds", "longest_gap_t", "files")
    columns: Mapping[str, Any] = bins
    rows = zip(*(columns[k] for k in keys), strict=True)
    detail = RunDetail([ProgressBin(*row) for row in rows])
    for group, health in artifact.get("gpu_health", {}).items():
        for span in health.get("throttle_spans", []):
            reasons = [r for r in span["reasons"] if r not in IDLE_THROTTLE]
            if reasons:
                spans = detail.throttle_spans.setdefault(group, [])
                spans.append((span["start"], span["end"], reasons))
    return detail


def read_journal_detail(
    path: Path,
    kinds: frozenset[str] = frozenset({EventKind.PROGRESS, EventKind.GPU_SAMPLE}),
    end: float = 0.0,
) -> RunDetail:
    """Progress changes and throttle spans from a journal's lines of ``kinds`` (throttling is
    only in GPU samples), skipping lines it cannot read; throttling still going on is closed
    at the last event read, or at ``end`` if later."""
    fold = _DetailFold()
    fold.last_t = end
    for event in JournalReader(path, kinds):
        fold.add(event)
    return fold.end()


class _DetailFold:
    """A journal's events folded into its :class:`RunDetail`."""

    _fold: ClassVar[events.EventFold[_DetailFold]] = events.EventFold()

    def __init__(self) -> None:
        self.detail = RunDetail()
        self.changes: list[tuple[float, str]] = []
        #: group -> (start, reasons) of the throttling going on.
        self.open_spans: dict[str, tuple[float, set[str]]] = {}
        self.last_t = 0.0

    def add(self, event: events.EventJson) -> None:
        self.last_t = max(self.last_t, float(event.get("t", 0.0)))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: events.ProgressJson) -> None:
        self.changes.append((t, file_names(event.get("paths"))))

    @_fold.on(EventKind.SAMPLE, EventKind.GPU_SAMPLE)
    def _on_sample(self, t: float, event: events.SampleJson | events.GpuSampleJson) -> None:
        for group, labels in (event.get("labels") or {}).items():
            reasons = set(labels.get("throttle_reasons") or []) - IDLE_THROTTLE
            current = self.open_spans.get(group)
            if current is not None and current[1] != reasons:
                spans = self.detail.throttle_spans.setdefault(group, [])
                spans.append((current[0], t, sorted(current[1])))
                current = None
                del self.open_spans[group]
            if reasons and current is None:
                self.open_spans[group] = (t, reasons)

    def end(self) -> RunDetail:
        """The detail, the throttling still going on at the last event closed there."""
        for group, (start, reasons) in self.open_spans.items():
            spans = self.detail.throttle_spans.setdefault(group, [])
            spans.append((start, self.last_t, sorted(reasons)))
        self.detail.progress = one_change_bins(self.changes)
        return self.detail


def detail_for(artifact: Artifact, journal: Path | None) -> RunDetail | None:
    """The run's detail: the artifact's, else what an older artifact lacks read from its
    journal (``journal``, else the one it names); None when that journal cannot be read."""
    detail = artifact_detail(artifact)
    if detail is not None:
        return detail
    recorded = artifact["monitor"]["journal_path"]
    path = journal or (Path(recorded) if recorded else None)
    if path is None or not path.is_file():
        return None
    kept = [e for e in artifact["events"] if e["kind"] == EventKind.PROGRESS]
    dropped = events_dropped(artifact) > 0
    kinds = {EventKind.PROGRESS} if dropped else set()
    if any(throttled(artifact, group) for group in artifact["summary"]):
        kinds.add(EventKind.GPU_SAMPLE)
    try:
        end = max((float(e["t"]) for e in artifact["events"]), default=0.0)
        detail = read_journal_detail(path, frozenset(kinds), end) if kinds else RunDetail()
    except (OSError, bounded.UnreadableFileError):
        return None
    if not dropped:
        detail.progress = one_change_bins((float(e["t"]), file_names(e["paths"])) for e in kept)
    return detail
