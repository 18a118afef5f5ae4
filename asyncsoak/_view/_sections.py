"""The artifact's optional parts, each read in one place.

A section the schema does not require (added in version 2, written only by some paths, or
missing from an artifact rebuilt from a journal) is read here with what its absence means,
so that every view says the same about a missing section.  The runtime snapshot is not
checked beyond being an object: each of its probes is what the probe found, or a
:class:`~asyncsoak._contract.ProbeFailure` saying why it found nothing; the accessors below
give the probe's findings, or None where it failed or is missing.
"""

from __future__ import annotations

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
    SamplerNoteEntry,
    SlurmJob,
    SnapshotGpu,
    SoftwareProbe,
    SourceProbe,
    StallCulprit,
    StepsProgress,
    Stop,
    Trend,
)

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


def python_stack(process: ForensicsProcess) -> str | None:
    """A Python process's py-spy dump: None for another process (none is taken), or where
    py-spy gave an error instead."""
    stack = process.get("python_stack")
    return None if stack is None or "error" in stack else stack["stack"]


def python_stack_error(process: ForensicsProcess) -> str | None:
    """Why a Python process has no py-spy dump; None when it has one, or is not Python."""
    stack = process.get("python_stack")
    return stack["error"] if stack is not None and "error" in stack else None


# -- the runtime snapshot --------------------------------------------------------------------


def snapshot_error(artifact: Artifact) -> str | None:
    """Why the snapshot was not taken, when it was not."""
    return artifact["snapshot"].get("error")


def source_probe(artifact: Artifact) -> SourceProbe | ProbeFailure | None:
    """``snapshot.source``: the repository, or why there is none."""
    return artifact["snapshot"].get("source")


def gpu_probe(artifact: Artifact) -> GpuProbe | ProbeFailure | None:
    """``snapshot.gpus``: the machine's GPUs and driver, or why there are none."""
    return artifact["snapshot"].get("gpus")


def snapshot_gpus(artifact: Artifact) -> list[SnapshotGpu]:
    """The GPUs nvidia-smi listed; none when it was not there or did not answer."""
    probe = gpu_probe(artifact)
    return [] if probe is None or "error" in probe else probe["gpus"]


def software_probe(artifact: Artifact) -> SoftwareProbe | None:
    """``snapshot.software``; None where the probe failed or is missing."""
    software = artifact["snapshot"].get("software")
    return None if software is None or "error" in software else software


def host_probe(artifact: Artifact) -> HostProbe | None:
    """``snapshot.host``; None where the probe failed or is missing."""
    host = artifact["snapshot"].get("host")
    return None if host is None or "error" in host else host


def scheduler_record(artifact: Artifact) -> SlurmJob | KubernetesPod | None:
    """``snapshot.scheduler``: the SLURM job or Kubernetes pod the soak ran in; None outside
    one, or for an artifact written before it was recorded."""
    return artifact["snapshot"].get("scheduler")
