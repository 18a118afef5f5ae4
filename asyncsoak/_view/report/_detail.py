"""DOC _journal"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..._contract import Artifact, EventKind, UnreadableFileError
from ..._record import read_journal
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
    detail = JournalDetail()
    open_spans: dict[str, tuple[float, set[str]]] = {}
    last_t = 0.0
    for event in read_journal(path):
        t = float(event.get("t", 0.0))
        last_t = max(last_t, t)
        if event.get("kind") == EventKind.PROGRESS:
            detail.progress_times.append(t)
            detail.progress_files.append(file_names(event.get("paths")))
            continue
        for group, labels in (event.get("labels") or {}).items():
            reasons = set(labels.get("throttle_reasons") or []) - IDLE_THROTTLE
            current = open_spans.get(group)
            if current is not None and current[1] != reasons:
                detail.throttle_spans.setdefault(group, []).append(
                    (current[0], t, sorted(current[1]))
                )
                current = None
                del open_spans[group]
            if reasons and current is None:
                open_spans[group] = (t, reasons)
    for group, (start, reasons) in open_spans.items():
        detail.throttle_spans.setdefault(group, []).append((start, last_t, sorted(reasons)))
    return detail


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
