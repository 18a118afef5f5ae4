"""The artifact's optional parts, each read in one place with what its absence means, so every
view says the same about a missing section (an older writer, a path that never writes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

from .._contract import Artifact, parse_iso, schema


def trend_verdicts(artifact: Artifact) -> dict[str, schema.Trend]:
    """``trends``: a series judged too short has no entry."""
    return artifact.get("trends", {})


def top_processes(artifact: Artifact) -> list[schema.ProcessEntry]:
    return artifact.get("processes", [])


def abandoned_processes(artifact: Artifact) -> list[schema.ProcessRecord]:
    """Processes that would not die even after SIGKILL."""
    return artifact.get("abandoned_processes", [])


def oom_kills(artifact: Artifact) -> list[schema.OomKillEntry]:
    return artifact.get("oom_kills", [])


def events_dropped(artifact: Artifact) -> int:
    """Events left out between the head and the tail the artifact kept."""
    return artifact.get("events_dropped", 0)


def stop_section(artifact: Artifact) -> schema.Stop | None:
    return artifact.get("stop")


def sampler_notes(artifact: Artifact) -> list[schema.SamplerNoteEntry]:
    return artifact["monitor"].get("sampler_notes", [])


def stall_forensics(artifact: Artifact) -> schema.ForensicsSection | None:
    """What a stalled tree was doing; None when the run did not stall."""
    return artifact.get("forensics")


def stall_ranks(artifact: Artifact) -> schema.StallCulprit | None:
    """Which rank(s) a distributed run's stall waits on; None for another run."""
    section = stall_forensics(artifact)
    return None if section is None else section.get("ranks")


def counted_steps(artifact: Artifact) -> schema.StepsProgress | None:
    """The training steps when they were the progress that counted (else None)."""
    progress = artifact["progress"]
    return progress.get("steps") if progress.get("source") == "steps" else None


def process_role(process: schema.ForensicsProcess | schema.ProcessEntry) -> dict[str, Any] | None:
    """A process's role in a distributed run (``{"launcher": ...}`` or its rank), else None."""
    return process.get("role")


def python_stack(process: schema.ForensicsProcess) -> str | None:
    """A Python process's py-spy dump; None for another process, or where py-spy failed."""
    stack = process.get("python_stack")
    return None if stack is None or "error" in stack else stack["stack"]


def python_stack_error(process: schema.ForensicsProcess) -> str | None:
    """Why a Python process has no py-spy dump; None when it has one, or is not Python."""
    stack = process.get("python_stack")
    return stack["error"] if stack is not None and "error" in stack else None


def series_group(artifact: Artifact, group: str) -> schema.Series | None:
    return artifact["series"].get(group)


def column(series: Mapping[str, Sequence[Any]] | None, name: str) -> Sequence[Any]:
    """A field's values in a group's series; empty when the group or the field is missing."""
    return [] if series is None else series.get(name, [])


def found_probe(artifact: Artifact, name: str) -> Any:
    """A runtime snapshot probe's finding; None when it is missing or failed."""
    snapshot: Mapping[str, Any] = artifact["snapshot"]
    probe = snapshot.get(name)
    return None if probe is None or "error" in probe else probe


def host_probe(artifact: Artifact) -> schema.HostProbe | None:
    host: schema.HostProbe | None = found_probe(artifact, "host")
    return host


def seconds_at(artifact: Artifact, iso_time: str | None) -> float | None:
    """Seconds from the soak's start to an artifact timestamp."""
    started = artifact["started_at"]
    if not iso_time or not started:
        return None
    try:
        return round((parse_iso(iso_time) - parse_iso(started)).total_seconds(), 3)
    except ValueError:
        return None


def wall_clock(artifact: Artifact, t: float, form: str = "%H:%M:%S UTC") -> str:
    """The UTC time ``t`` seconds into the run; empty when the start is unknown."""
    started = artifact["started_at"]
    if not started:
        return ""
    return (parse_iso(started) + timedelta(seconds=t)).astimezone(UTC).strftime(form)


def config_value(artifact: Artifact, name: str) -> float | None:
    """A number setting of the run; None when the artifact lacks it (added since version 1)."""
    settings: Mapping[str, object] = artifact["config"]
    value = settings.get(name)
    return float(value) if isinstance(value, int | float) else None


def event_times(artifact: Artifact, kind: str) -> list[float]:
    return [float(e["t"]) for e in artifact["events"] if e["kind"] == kind]


def summary_figure(artifact: Artifact, group: str, name: str, key: str) -> float | None:
    """``key`` (max, mean, min, last) of a field over the run; None when never sampled."""
    stats = artifact["summary"].get(group, {}).get(name)
    value = stats[key] if isinstance(stats, dict) else None
    return float(value) if isinstance(value, int | float) else None
