"""What a worker keeps in its runs directory.  Final writes that could not reach the database
wait in ``<runs>/.spool/`` (one JSON file per attempt) for a worker with the same runs directory
to deliver them through the same fenced ``finish`` (an attempt taken over meanwhile: dropped).
``--stale-progress auto``'s learned stall limit is kept in ``<runs>/stale-limits/<hash of the
job's name>.json`` (no path is built from the name): the next job of that name starts there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
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


#: Below the runs directory: one small file per job name.
LEARNED_DIR = "stale-limits"
#: The file is read only up to this many bytes.
MAX_FILE_BYTES = 4096


def _path(runs_dir: Path, name: str) -> Path:
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return runs_dir / LEARNED_DIR / f"{digest}.json"


def carried_limit(runs_dir: Path, name: str | None) -> float | None:
    """The limit the last run of a job named ``name`` learned; None when unknown or unreadable."""
    if not name:
        return None
    try:
        with open(_path(runs_dir, name), "rb") as handle:
            data = json.loads(handle.read(MAX_FILE_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("name") != name:
        return None
    value = data.get("stale_limit_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def remember_limit(runs_dir: Path, name: str | None, artifact: Mapping[str, Any] | None) -> None:
    """Keep the limit an ``auto`` run learned (its ``progress.stale_limit_seconds``, when it
    is not the startup limit of its warm-up) for the next job of the same name."""
    if not name or artifact is None:
        return
    progress = artifact.get("progress") or {}
    config = artifact.get("config") or {}
    learned = progress.get("stale_limit_seconds")
    if config.get("stale_progress_seconds") != "auto" or not isinstance(learned, int | float):
        return
    if not math.isfinite(learned) or learned == config.get("startup_timeout_seconds"):
        return  # the warm-up never ended: nothing was learned
    path = _path(runs_dir, name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_artifact({"name": name, "stale_limit_seconds": learned}, path)
