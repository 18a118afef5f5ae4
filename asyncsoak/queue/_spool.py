"""Final writes that could not reach the database, kept in ``<runs>/.spool/`` (one JSON file
per attempt, written atomically) until a worker with the same runs directory delivers them
through the same fenced ``finish``: an entry for an attempt taken over meanwhile is dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from .._record import write_artifact
from ._status import Outcome

SPOOL_DIR = ".spool"


@dataclasses.dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One attempt's final write: what ``JobStore.finish`` takes."""

    job_id: int
    attempt: int
    worker: str
    outcome: Outcome
    summary: dict[str, Any] | None
    note: str | None

    def keep(self, runs_dir: Path) -> Path:
        """Keep this write in ``runs_dir``'s spool; returns the file holding it."""
        path = runs_dir / SPOOL_DIR / f"{self.job_id}.{self.attempt}.json"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_artifact(dataclasses.asdict(self), path)
        return path


def pending(runs_dir: Path) -> list[tuple[Path, SpoolEntry]]:
    """The kept writes, oldest attempt first; unreadable files are left for a person."""
    entries = []
    with contextlib.suppress(OSError):
        for path in sorted((runs_dir / SPOOL_DIR).glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads(path.read_text())
                ids = (int(data["job_id"]), int(data["attempt"]), str(data["worker"]))
                outcome = Outcome(**data["outcome"])
                kept = (data.get("summary"), data.get("note"))
                entries.append((path, SpoolEntry(*ids, outcome, *kept)))
    return entries
