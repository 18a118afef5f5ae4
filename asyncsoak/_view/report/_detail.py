"""DOC _journal"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..._contract import (
    Artifact,
    EventFold,
    EventJson,
    EventKind,
    GpuSampleJson,
    ProgressJson,
    SampleJson,
    UnreadableFileError,
)
from ..._record import JournalReader
from .._summary import IDLE_THROTTLE


@dataclass(slots=True)
class JournalDetail:
    """What only the journal has: every progress time, and GPU throttling over time."""

    progress_times: list[float] = field(default_factory=list)
    #: The files each progress change touched (names, parallel to ``progress_times``).
    progress_files: list[str] = field(default_factory=list)
    #: group -> [(start, end, reasons)]
    throttle_spans: dict[str, list[tuple[float, float, list[str]]]] = field(default_factory=dict)


def read_journal_detail(path: Path) -> JournalDetail:
    """Progress times and throttle spans from a journal, skipping lines it cannot read."""
    fold = _DetailFold()
    for event in JournalReader(path):
        fold.add(event)
    return fold.end()


class _DetailFold:
    """A journal's events folded into its :class:`JournalDetail`."""

    _fold: ClassVar[EventFold[_DetailFold]] = EventFold()

    def __init__(self) -> None:
        self.detail = JournalDetail()
        #: group -> (start, reasons) of the throttling going on.
        self.open_spans: dict[str, tuple[float, set[str]]] = {}
        self.last_t = 0.0

    def add(self, event: EventJson) -> None:
        self.last_t = max(self.last_t, float(event.get("t", 0.0)))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: ProgressJson) -> None:
        self.detail.progress_times.append(t)
        self.detail.progress_files.append(file_names(event.get("paths")))

    @_fold.on(EventKind.SAMPLE, EventKind.GPU_SAMPLE)
    def _on_sample(self, t: float, event: SampleJson | GpuSampleJson) -> None:
        for group, labels in (event.get("labels") or {}).items():
            reasons = set(labels.get("throttle_reasons") or []) - IDLE_THROTTLE
            current = self.open_spans.get(group)
            if current is not None and current[1] != reasons:
                self.detail.throttle_spans.setdefault(group, []).append(
                    (current[0], t, sorted(current[1]))
                )
                current = None
                del self.open_spans[group]
            if reasons and current is None:
                self.open_spans[group] = (t, reasons)

    def end(self) -> JournalDetail:
        """The detail, the throttling still going on at the last event closed there."""
        for group, (start, reasons) in self.open_spans.items():
            self.detail.throttle_spans.setdefault(group, []).append(
                (start, self.last_t, sorted(reasons))
            )
        return self.detail


def journal_detail_for(artifact: Artifact, journal: Path | None) -> JournalDetail | None:
    path = journal
    if path is None:
        recorded = artifact["monitor"]["journal_path"]
        path = Path(recorded) if recorded else None
    if path is None or not path.is_file():
        return None
    try:
        return read_journal_detail(path)
    except (OSError, UnreadableFileError):
        return None


def file_names(paths: object, shown: int = 3) -> str:
    """``checkpoint-30/trainer_state.json, metrics.jsonl`` (and how many more)."""
    if not isinstance(paths, list) or not paths:
        return ""
    names = ", ".join(str(p) for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
