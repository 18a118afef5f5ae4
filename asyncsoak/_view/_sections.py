"""The artifact's optional parts, each read in one place.

A section the schema does not require (added in version 2, written only by some paths, or
missing from an artifact rebuilt from a journal) is read here with what its absence means,
so that every view says the same about a missing section.  The runtime snapshot is not
checked beyond being an object: it is read once into :class:`Probes`, each probe what it
found or a :class:`~asyncsoak._contract.schema.ProbeFailure` saying why it found nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

from .._contract import Artifact, parse_iso, schema


@dataclass(frozen=True, slots=True)
class Recorded:
    """A record the schema leaves open (the runtime snapshot, ``snapshot.scheduler``), read
    into the fields a subclass names: a key the record lacks reads as its field's default,
    and a key the subclass does not name is left out."""

    @classmethod
    def of(cls, recorded: Mapping[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in recorded.items() if key in names})


# -- sections older writers lacked -----------------------------------------------------------


def trend_verdicts(artifact: Artifact) -> dict[str, schema.Trend]:
    """``trends`` (a version 2 section; a series judged too short has no entry)."""
    return artifact.get("trends", {})


def top_processes(artifact: Artifact) -> list[schema.ProcessEntry]:
    """``processes``: the largest processes of the tree (a version 2 section)."""
    return artifact.get("processes", [])


def abandoned_processes(artifact: Artifact) -> list[schema.ProcessRecord]:
    """Processes that would not die even after SIGKILL."""
    return artifact.get("abandoned_processes", [])


def oom_kills(artifact: Artifact) -> list[schema.OomKillEntry]:
    """Processes of the tree the OOM killer ended."""
    return artifact.get("oom_kills", [])


def gpu_health(artifact: Artifact) -> dict[str, schema.GpuHealth]:
    """``gpu_health``: empty without GPU data, or for an artifact written before it."""
    return artifact.get("gpu_health", {})


def events_dropped(artifact: Artifact) -> int:
    """How many events the artifact left out between the head and the tail it kept."""
    return artifact.get("events_dropped", 0)


def stop_section(artifact: Artifact) -> schema.Stop | None:
    """``stop``; None for an artifact written before the stop sequence was recorded."""
    return artifact.get("stop")


def sampler_notes(artifact: Artifact) -> list[schema.SamplerNoteEntry]:
    """The samplers' notes, degradations and recoveries (a version 2 key of ``monitor``)."""
    return artifact["monitor"].get("sampler_notes", [])


def stall_forensics(artifact: Artifact) -> schema.ForensicsSection | None:
    """What a stalled tree was doing; None when the run did not stall."""
    return artifact.get("forensics")


def stall_ranks(artifact: Artifact) -> schema.StallCulprit | None:
    """Which rank(s) a distributed run's stall waits on; None for another run."""
    section = stall_forensics(artifact)
    return None if section is None else section.get("ranks")


def training_steps(artifact: Artifact) -> schema.StepsProgress | None:
    """``progress.steps``: None when the trainer wrote no step, or the artifact was written
    before steps were read."""
    return artifact["progress"].get("steps")


def counted_steps(artifact: Artifact) -> schema.StepsProgress | None:
    """The training steps when they were the progress that counted (else the file changes
    were, and this is None)."""
    progress = artifact["progress"]
    steps = training_steps(artifact)
    return steps if steps is not None and progress.get("source") == "steps" else None


def process_role(process: schema.ForensicsProcess | schema.ProcessEntry) -> dict[str, Any] | None:
    """A process's role in a distributed run: ``{"launcher": ...}`` or its rank; None for
    another process, or in an artifact written before roles were recorded."""
    return process.get("role")


def _py_spy(process: schema.ForensicsProcess) -> schema.PythonStack | schema.ProbeFailure | None:
    # None for a process that is not Python's (py-spy is not asked).
    return process.get("python_stack")


def python_stack(process: schema.ForensicsProcess) -> str | None:
    """A Python process's py-spy dump: None for another process (none is taken), or where
    py-spy gave an error instead."""
    stack = _py_spy(process)
    return None if stack is None or "error" in stack else stack["stack"]


def python_stack_error(process: schema.ForensicsProcess) -> str | None:
    """Why a Python process has no py-spy dump; None when it has one, or is not Python."""
    stack = _py_spy(process)
    return stack["error"] if stack is not None and "error" in stack else None


# -- the run's figures ---------------------------------------------------------------------


def series_group(artifact: Artifact, group: str) -> schema.Series | None:
    """A group's series; None when the run did not sample the group."""
    return artifact["series"].get(group)


def column(series: Mapping[str, Sequence[Any]] | None, name: str) -> Sequence[Any]:
    """A field's values in a group's series (``t`` the times); empty when the run did not
    sample the group, or the group lacked the field."""
    return [] if series is None else series.get(name, [])


def summary_entry(artifact: Artifact, group: str, name: str) -> object:
    """``summary[group][name]``: a numeric field's figures (max, mean, min, last), or the
    values a label field took; None when the run never sampled the group or the field."""
    return artifact["summary"].get(group, {}).get(name)


# -- the runtime snapshot --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probes(Recorded):
    """The runtime snapshot's probes, each what it found or why it found nothing; None
    where the snapshot lacks it (it was not taken, the journal never got it)."""

    source: schema.SourceProbe | schema.ProbeFailure | None = None
    gpus: schema.GpuProbe | schema.ProbeFailure | None = None
    software: schema.SoftwareProbe | schema.ProbeFailure | None = None
    host: schema.HostProbe | schema.ProbeFailure | None = None
    #: The SLURM job or Kubernetes pod the soak ran in; None outside one, or in an
    #: artifact written before it was recorded.
    scheduler: schema.SlurmJob | schema.KubernetesPod | None = None
    #: Why the snapshot was not taken, when it was not.
    error: str | None = None


def probes(artifact: Artifact) -> Probes:
    """The runtime snapshot, probe by probe."""
    return Probes.of(artifact["snapshot"])


def snapshot_gpus(artifact: Artifact) -> list[schema.SnapshotGpu]:
    """The GPUs nvidia-smi listed; none when it was not there or did not answer."""
    probe = probes(artifact).gpus
    return [] if probe is None or "error" in probe else probe["gpus"]


def software_probe(artifact: Artifact) -> schema.SoftwareProbe | None:
    """``snapshot.software``; None where the probe failed or is missing."""
    software = probes(artifact).software
    return None if software is None or "error" in software else software


def host_probe(artifact: Artifact) -> schema.HostProbe | None:
    """``snapshot.host``; None where the probe failed or is missing."""
    host = probes(artifact).host
    return None if host is None or "error" in host else host


def seconds_at(artifact: Artifact, iso_time: str | None) -> float | None:
    """Seconds from the soak's start to an artifact timestamp."""
    started = artifact["started_at"]
    if not iso_time or not started:
        return None
    try:
        delta = parse_iso(iso_time) - parse_iso(started)
    except ValueError:
        return None
    return round(delta.total_seconds(), 3)


def config_setting(artifact: Artifact, name: str) -> object:
    """A setting of the run; None when the artifact lacks it."""
    # A setting the schema does not require (added since version 1) may be absent.
    settings: Mapping[str, object] = artifact["config"]
    return settings.get(name)


def config_value(artifact: Artifact, name: str) -> float | None:
    """A numeric setting of the run; None when it is not a number, or missing."""
    value = config_setting(artifact, name)
    return float(value) if isinstance(value, int | float) else None


def event_times(artifact: Artifact, kind: str) -> list[float]:
    return [float(e["t"]) for e in artifact["events"] if e["kind"] == kind]


def summary_figure(artifact: Artifact, group: str, name: str, key: str) -> float | None:
    """``key`` (max, mean, min, last) of a field over the run, from ``summary``; None when
    the run never sampled the group or the field (no GPU, a sampler that degraded)."""
    stats = summary_entry(artifact, group, name)
    value = stats[key] if isinstance(stats, dict) else None
    return float(value) if isinstance(value, int | float) else None
