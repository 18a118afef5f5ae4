"""Final writes that could not reach the database, kept on this host until they can.

A worker whose final write fails every retry (the database is away) keeps it here, in
``<runs>/.spool/``, one JSON file per attempt, written atomically.  The worker, or the next one
started with the same runs directory, delivers each entry when the database is back, through
the same fenced ``finish`` as any final write: an entry for an attempt another worker took
over meanwhile is refused and dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._record import write_artifact
from ._status import Outcome

SPOOL_DIR = ".spool"


@dataclasses.dataclass(frozen=True, slots=True)
class SpoolEntry:
    job_id: int
    attempt: int
    worker: str
    outcome: Outcome
    summary: dict[str, Any] | None
    note: str | None
    path: Path


class Spool:
    def __init__(self, runs_dir: Path) -> None:
        self.dir = runs_dir / SPOOL_DIR

    def keep(
        self,
        job_id: int,
        attempt: int,
        worker: str,
        outcome: Outcome,
        summary: Mapping[str, Any] | None,
        note: str | None,
    ) -> Path:
        """Keep one attempt's final write; returns the file holding it."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.dir / f"{job_id}.{attempt}.json"
        record = {
            "job_id": job_id,
            "attempt": attempt,
            "worker": worker,
            "outcome": dataclasses.asdict(outcome),
            "summary": None if summary is None else dict(summary),
            "note": note,
        }
        write_artifact(record, path)
        return path

    def pending(self) -> list[SpoolEntry]:
        """The kept writes, oldest attempt first; unreadable files are left for a person."""
        entries = []
        with contextlib.suppress(OSError):
            for path in sorted(self.dir.glob("*.json")):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    data = json.loads(path.read_text())
                    ids = (int(data["job_id"]), int(data["attempt"]), str(data["worker"]))
                    outcome = Outcome(**data["outcome"])
                    entries.append(
                        SpoolEntry(*ids, outcome, data.get("summary"), data.get("note"), path)
                    )
        return entries

    def remove(self, entry: SpoolEntry) -> None:
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()
