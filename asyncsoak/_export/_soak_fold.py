"""One soak's figures for its metrics, read from its ``RunState`` (the serializer's, or one fed
from the events observed); :class:`~._soak_metrics.SoakMetrics` exports them."""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

from .._analysis import TREE_MEMORY_SERIES
from .._contract import EventKind, epoch, redact_url_passwords
from .._process import RoleFold
from .._record import RunState

#: ``/healthz`` says 503 once no sample came for this many sample intervals, and never sooner
#: than HEALTH_MIN_SECONDS (a failed liveness probe restarts the training with the container).
HEALTH_STALE_SAMPLES = 10
HEALTH_MIN_SECONDS = 60.0

#: The events after which a textfile is written again (others change it only with a sample).
_CHANGES_TEXTFILE = frozenset({"sample", "started", "finished", "failure", "gpu_fault"})


class SoakFold:
    """One soak's metrics, read from ``run`` (fed by :meth:`observe` when not given); ``now``
    is the monotonic clock the events' ``t`` is measured on."""

    def __init__(
        self,
        soak_id: str,
        *,
        run: RunState | None = None,
        now: Callable[[], float] = time.monotonic,
        host: str | None = None,
    ) -> None:
        self.soak_id = soak_id
        self.run = run if run is not None else RunState()
        self._feed = run is None
        self._now = now
        self.host = host if host is not None else socket.gethostname()
        #: The tree's processes' roles, and each rank's CPU in the newest sample, in cores.
        self.roles = RoleFold()
        self.rank_cpu: dict[int, float] = {}
        self.growth_bytes_per_second: float | None = None
        self.projected_exhaustion: float | None = None
        #: Called after each event that changes what a textfile should say.
        self.on_change: Callable[[], None] | None = None

    def observe(self, event: Mapping[str, Any]) -> None:
        """Take one event in its JSON form (as the journal holds it)."""
        if self._feed:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.run.add(event)
        if event["kind"] == EventKind.SAMPLE:
            ranks = self.roles.add(event.get("processes") or [])
            # The first ranks listed, when a node runs more than a label set should hold.
            self.rank_cpu = {rank: (cpu or 0.0) * 0.01 for rank, cpu in islice(ranks.items(), 64)}
        if self.on_change is not None and event["kind"] in _CHANGES_TEXTFILE:
            self.on_change()

    @property
    def header(self) -> Mapping[str, Any]:
        return self.run.header or {}

    @property
    def config(self) -> Mapping[str, Any]:
        return self.header.get("config") or {}

    @property
    def started_epoch(self) -> float | None:
        return epoch(self.header.get("started_at"))

    def sample_t(self) -> float | None:
        """When the newest sample was taken, on the soak's clock (which /healthz ages)."""
        sample = self.run.latest.get("sample")
        return None if sample is None else float(sample["t"])

    def tree(self) -> Mapping[str, Any]:
        return ((self.run.latest.get("sample") or {}).get("points") or {}).get("tree") or {}

    def info(self) -> tuple[tuple[str, str], ...] | None:
        """``asyncsoak_soak_info``'s labels once the header is folded: what a person calls the
        run (the queue job's name, else SLURM's, else the program) and its start."""
        if self.run.header is None:
            return None
        command = [str(a) for a in self.header.get("command") or []]
        metadata = self.header.get("metadata") or {}
        job_id = metadata.get("job_id")
        job_name = _label_text(
            metadata.get("job_name")
            or metadata.get("name")
            or os.environ.get("SLURM_JOB_NAME")
            or program_name(command)
        )
        started = self.started_epoch
        started_at = (
            "" if started is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        )
        return (
            # One line: an inline script's newlines make a label no dashboard can show.
            ("command", " ".join(" ".join(a.split()) for a in command)[:200]),
            ("host", self.host),
            ("job_id", "" if job_id is None else str(job_id)),
            ("job_name", job_name),
            ("soak_id", self.soak_id),
            ("started_at", started_at),
            ("title", self.title(job_name, started_at)),
        )

    def gpus(self) -> dict[str, tuple[str, Mapping[str, Any], float | None]]:
        """The newest GPU sample's readings by index: (uuid, reading, the tree's memory on it
        when the sample listed the GPUs' processes)."""
        event = self.run.latest.get("gpu_sample") or {}
        readings = {str(r.get("index")): r for r in event.get("gpus") or []}
        held: dict[str, float] | None = None
        if event.get("processes") is not None:
            held = dict.fromkeys(readings, 0.0)
            by_uuid = {str(r.get("uuid") or ""): index for index, r in readings.items()}
            for process in event["processes"]:
                on_gpu = str(process.get("gpu_index"))
                index = on_gpu if on_gpu in readings else by_uuid.get(str(process.get("gpu_uuid")))
                used = scaled(process.get("used_gpu_memory_mib"), 2**20)
                if process.get("in_tree") and index is not None and used is not None:
                    held[index] += used
        return {
            index: (str(r.get("uuid") or ""), r, None if held is None else held[index])
            for index, r in readings.items()
        }

    def degraded(self) -> dict[str, bool]:
        """Each sampler: whether its newest word is that it is degraded."""
        degraded = dict.fromkeys(("proc", "gpu"), False)
        for note in self.run.sampler_notes:
            if note["kind"] in (EventKind.SAMPLER_DEGRADED, EventKind.SAMPLER_RECOVERED):
                degraded[str(note.get("sampler"))] = note["kind"] == EventKind.SAMPLER_DEGRADED
        return degraded

    def observe_trends(self, trends: Mapping[str, Mapping[str, Any]]) -> None:
        """Take the tree's memory trend from each evaluation of the soak's trends (``trend``
        events come once, maybe for a process's series)."""
        entry = next((trends[key] for key, _ in TREE_MEMORY_SERIES if key in trends), None)
        if entry is None:
            return
        slope = number(entry.get("slope_per_hour"))
        self.growth_bytes_per_second = None if slope is None else slope / 3600.0
        self.projected_exhaustion = epoch(entry.get("projected_limit_at"))

    def title(self, job_name: str, started_at: str) -> str:
        """The soak in a dashboard's selector: ``resnet on gpu-node-3, 2026-12-02 00:37 UTC``."""
        started = started_at.replace("T", " ")[:16]
        where = " " + _label_text(f"on {self.host}" + (f", {started} UTC" if started else ""))
        # A long job name is shortened, never the host and the start that tell soaks apart.
        room = max(24, TITLE_LABEL_MAX - len(where))
        name = job_name or "?"
        if len(name) > room:
            name = name[: room - 1] + "…"
        return _label_text(name + where)

    def elapsed(self) -> float | None:
        """Seconds since the soak started on the events' clock."""
        start = number(self.header.get("monotonic_start"))
        return None if start is None else self._now() - start

    def phase(self) -> str:
        run = self.run
        if run.status is not None:
            return "finished"
        if run.failures or run.stop["mode"] is not None or run.exit_t is not None:
            return "stopping"
        if run.started_t is None:
            return "starting"
        if run.last_progress is None:
            return "waiting_for_progress"
        return "running"

    def seconds_since_progress(self) -> float | None:
        """Since the last progress (or the start); None before the start and after the end."""
        elapsed, run = self.elapsed(), self.run
        if run.status is not None or run.started_t is None or elapsed is None:
            return None
        since = run.last_progress if run.last_progress is not None else run.started_t
        return max(0.0, elapsed - since)

    def stale_limit_seconds(self) -> float | None:
        """The limit ``seconds_since_progress`` is held against (startup's before progress)."""
        if self.run.last_progress is None:
            return number(self.config.get("startup_timeout_seconds"))
        if self.run.stale_limit is not None:  # ``--stale-progress auto``: the one learned
            return self.run.stale_limit
        return number(self.config.get("stale_progress_seconds"))

    def health(self) -> tuple[bool, str]:
        """Whether the samplers are alive (a sample within HEALTH_STALE_SAMPLES intervals, on the
        monotonic clock), and what to say."""
        if self.run.status is not None:
            return True, f"ok: the soak finished ({self.run.status})"
        elapsed = self.elapsed()
        if elapsed is None:
            return True, "ok: starting"
        sampled = self.sample_t()
        interval = number(self.config.get("sample_interval_seconds"))
        limit = max(HEALTH_MIN_SECONDS, HEALTH_STALE_SAMPLES * (interval or 0.0))
        age = max(0.0, elapsed - (sampled or 0.0))
        degraded = sorted(name for name, down in self.degraded().items() if down)
        note = f"; degraded: {', '.join(degraded)}" if degraded else ""
        what = "last sample" if sampled is not None else "start, no sample yet,"
        if age > limit:
            return False, f"unhealthy: {what} {age:.0f}s ago (limit {limit:g}s){note}"
        return True, f"ok: {what} {age:.1f}s ago{note}"


#: Interpreters whose script names the program (``python train.py``), a Python's version
#: aside (``python3.11``); ``shred`` or ``sha256sum`` are no shell.
_INTERPRETER = re.compile(r"(?:python|pypy)[\d.]*|bash|sh|uv|torchrun|accelerate|deepspeed")
#: Characters a label shown in a dashboard's selector keeps at most.
TITLE_LABEL_MAX = 120


def program_name(command: list[str]) -> str:
    """The program a command runs, as a person names it: ``train.py`` for ``python train.py
    --lr 3e-4``, ``mypkg.train`` for ``python -m mypkg.train``, else its executable's name."""
    if not command:
        return ""
    name = os.path.basename(command[0])
    if not _INTERPRETER.fullmatch(name):
        return name
    rest = command[1:]
    for i, arg in enumerate(rest):
        if arg == "-c":
            return name  # an inline script has no name
        if arg == "-m" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.endswith((".py", ".sh")):
            return os.path.basename(arg)
    return name


def _label_text(value: object) -> str:
    """A label a dashboard shows in a selector: one line, no double quote (Grafana's variable
    regex reads it out of ``query_result``'s text), bounded, a URL's password masked."""
    text = redact_url_passwords(" ".join(str(value).split())).replace('"', "'")
    return text[:TITLE_LABEL_MAX]


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def scaled(value: object, scale: float) -> float | None:
    figure = number(value)
    return None if figure is None else figure * scale
