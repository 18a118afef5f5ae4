"""The artifact's optional parts, each read in one place.

A section the schema does not require (added in version 2, written only by some paths, or
missing from an artifact rebuilt from a journal) is read here with what its absence means,
so that every view says the same about a missing section.  The runtime snapshot is not
checked beyond being an object: it is read once into :class:`Probes`, each probe what it
found or a :class:`~asyncsoak._contract.ProbeFailure` saying why it found nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

from .._contract import (
    Artifact,
    ForensicsProcess,
    ForensicsSection,
    GpuHealth,
    GpuProbe,
    HostProbe,
    KubernetesPod,
    OomKillEntry,
    ProbeFailure,
    ProcessEntry,
    ProcessRecord,
    PythonStack,
    SamplerNoteEntry,
    Series,
    SlurmJob,
    SnapshotGpu,
    SoftwareProbe,
    SourceProbe,
    StallCulprit,
    StepsProgress,
    Stop,
    Trend,
)


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


def trend_verdicts(artifact: Artifact) -> dict[str, Trend]:
    """``trends`` (a version 2 section; a series judged too short has no entry)."""
    return artifact.get("trends", {})


def top_processes(artifact: Artifact) -> list[ProcessEntry]:
    """``processes``: the largest processes of the tree (a version 2 section)."""
    return artifact.get("processes", [])


def abandoned_processes(artifact: Artifact) -> list[ProcessRecord]:
    """Processes that would not die even after SIGKILL."""
    return artifact.get("abandoned_processes", [])


def oom_kills(artifact: Artifact) -> list[OomKillEntry]:
    """Processes of the tree the OOM killer ended."""
    return artifact.get("oom_kills", [])


def gpu_health(artifact: Artifact) -> dict[str, GpuHealth]:
    """``gpu_health``: empty without GPU data, or for an artifact written before it."""
    return artifact.get("gpu_health", {})


def events_dropped(artifact: Artifact) -> int:
    """How many events the artifact left out between the head and the tail it kept."""
    return artifact.get("events_dropped", 0)


def stop_section(artifact: Artifact) -> Stop | None:
    """``stop``; None for an artifact written before the stop sequence was recorded."""
    return artifact.get("stop")


def sampler_notes(artifact: Artifact) -> list[SamplerNoteEntry]:
    """The samplers' notes, degradations and recoveries (a version 2 key of ``monitor``)."""
    return artifact["monitor"].get("sampler_notes", [])


def stall_forensics(artifact: Artifact) -> ForensicsSection | None:
    """What a stalled tree was doing; None when the run did not stall."""
    return artifact.get("forensics")


def stall_ranks(artifact: Artifact) -> StallCulprit | None:
    """Which rank(s) a distributed run's stall waits on; None for another run."""
    section = stall_forensics(artifact)
    return None if section is None else section.get("ranks")


def training_steps(artifact: Artifact) -> StepsProgress | None:
    """``progress.steps``: None when the trainer wrote no step, or the artifact was written
    before steps were read."""
    return artifact["progress"].get("steps")


def counted_steps(artifact: Artifact) -> StepsProgress | None:
    """The training steps when they were the progress that counted (else the file changes
    were, and this is None)."""
    progress = artifact["progress"]
    steps = training_steps(artifact)
    return steps if steps is not None and progress.get("source") == "steps" else None


def process_role(process: ForensicsProcess | ProcessEntry) -> dict[str, Any] | None:
    """A process's role in a distributed run: ``{"launcher": ...}`` or its rank; None for
    another process, or in an artifact written before roles were recorded."""
    return process.get("role")


def _py_spy(process: ForensicsProcess) -> PythonStack | ProbeFailure | None:
    # None for a process that is not Python's (py-spy is not asked).
    return process.get("python_stack")


def python_stack(process: ForensicsProcess) -> str | None:
    """A Python process's py-spy dump: None for another process (none is taken), or where
    py-spy gave an error instead."""
    stack = _py_spy(process)
    return None if stack is None or "error" in stack else stack["stack"]


def python_stack_error(process: ForensicsProcess) -> str | None:
    """Why a Python process has no py-spy dump; None when it has one, or is not Python."""
    stack = _py_spy(process)
    return stack["error"] if stack is not None and "error" in stack else None


# -- the run's figures ---------------------------------------------------------------------


def series_group(artifact: Artifact, group: str) -> Series | None:
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

    source: SourceProbe | ProbeFailure | None = None
    gpus: GpuProbe | ProbeFailure | None = None
    software: SoftwareProbe | ProbeFailure | None = None
    host: HostProbe | ProbeFailure | None = None
    #: The SLURM job or Kubernetes pod the soak ran in; None outside one, or in an
    #: artifact written before it was recorded.
    scheduler: SlurmJob | KubernetesPod | None = None
    #: Why the snapshot was not taken, when it was not.
    error: str | None = None


def probes(artifact: Artifact) -> Probes:
    """The runtime snapshot, probe by probe."""
    return Probes.of(artifact["snapshot"])


def snapshot_gpus(artifact: Artifact) -> list[SnapshotGpu]:
    """The GPUs nvidia-smi listed; none when it was not there or did not answer."""
    probe = probes(artifact).gpus
    return [] if probe is None or "error" in probe else probe["gpus"]


def software_probe(artifact: Artifact) -> SoftwareProbe | None:
    """``snapshot.software``; None where the probe failed or is missing."""
    software = probes(artifact).software
    return None if software is None or "error" in software else software


def host_probe(artifact: Artifact) -> HostProbe | None:
    """``snapshot.host``; None where the probe failed or is missing."""
    host = probes(artifact).host
    return None if host is None or "error" in host else host
