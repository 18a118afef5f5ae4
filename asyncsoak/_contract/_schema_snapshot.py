"""The artifact's ``snapshot`` section as types: where the code, the GPUs, the software, the
host and the scheduler's job stood.  The probes are ``@final`` so that ``"error" in probe``
tells a :class:`ProbeFailure` apart for mypy too."""

# No ``from __future__ import annotations``: the generator reads evaluated annotations.
from typing import Literal, NotRequired, Required, TypedDict, final

from ._json_schema import Timestamp


class ProbeFailure(TypedDict):
    """A reading that could not be taken, and why: a probe of the runtime snapshot (which
    keeps beside it what it did learn: ``source`` its ``repository: null``, ``gpus`` its
    ``available: false``, the command's interpreter its ``executable``), the whole snapshot
    when it was not taken, a process's py-spy dump."""

    error: str


@final
class SourceProbe(TypedDict):
    """``snapshot.source``: the git repository the command ran from."""

    repository: str
    revision: str | None
    branch: str | None
    #: Null when ``git status`` failed (its error is in ``errors``).
    dirty: bool | None
    changed_files: int | None
    untracked_files: int | None
    diff_sha256: str | None
    errors: list[str]


class SnapshotGpu(TypedDict):
    """``snapshot.gpus.gpus[]``: one GPU of the machine, as nvidia-smi listed it."""

    index: int
    uuid: str | None
    name: str | None
    bus_id: str | None
    memory_total_mib: float | None
    power_limit_w: float | None
    clocks_max_sm_mhz: float | None
    driver_version: str | None
    compute_mode: str | None
    persistence_mode: str | None
    mig_mode: str | None


@final
class GpuProbe(TypedDict):
    """``snapshot.gpus``: the machine's GPUs and driver (nvidia-smi answered)."""

    available: bool
    nvidia_smi: str
    gpus: list[SnapshotGpu]
    errors: list[str]
    driver_version: str | None
    #: What ``nvidia-smi --version`` said, when it answered.
    cuda_version: NotRequired[str]
    nvidia_smi_version: NotRequired[str]
    nvml_version: NotRequired[str]


class PythonInfo(TypedDict):
    """``snapshot.software.python``: the interpreter the monitor ran in."""

    version: str
    implementation: str
    executable: str
    prefix: str


@final
class CommandPython(PythonInfo):
    """``snapshot.software.command_python``: the command's own interpreter, when it is
    another one than the monitor's, and its packages."""

    distributions: dict[str, str]


@final
class SoftwareProbe(TypedDict):
    """``snapshot.software``: the Python, platform and packages."""

    python: PythonInfo
    platform: str
    asyncsoak: str
    distributions: dict[str, str]
    command_python: NotRequired[CommandPython | ProbeFailure]


@final
class HostProbe(TypedDict):
    """``snapshot.host``: the machine."""

    hostname: str
    kernel: str
    kernel_version: str
    machine: str
    cpu_model: str | None
    cpu_count: int | None
    usable_cpus: int
    memory_total_bytes: int


class SlurmJob(TypedDict, total=False):
    """``snapshot.scheduler`` in a SLURM job: the job as its environment names it (null for
    a variable SLURM did not set), then what ``scontrol`` said.  Only ``kind`` is sure: the
    identity of a job whose ``scontrol`` did not answer in time lacks ``scontrol``'s keys,
    and readers take any key as possibly missing."""

    kind: Required[Literal["slurm"]]
    job_id: int | str
    array_job_id: int | str | None
    array_task_id: int | str | None
    step_id: int | str | None
    job_name: str | None
    node: str | None
    node_list: str | None
    num_nodes: int | str | None
    num_tasks: int | str | None
    rank: int | str | None
    local_rank: int | str | None
    node_rank: int | str | None
    restart_count: int | str
    partition: str | None
    account: str | None
    qos: str | None
    cluster: str | None
    gpus: str | None
    kill_wait_seconds: float | None
    end_time: str | None
    end_time_epoch: float | None
    time_limit: str | None
    errors: list[str]


class KubernetesPod(TypedDict, total=False):
    """``snapshot.scheduler`` in a Kubernetes pod: its names and indexes (null when nothing
    says them), cgroup limits and grace.  Only ``kind`` is sure: when reading the pod took too
    long, the record holds ``kind``, ``kill_wait_seconds`` and ``errors`` alone."""

    kind: Required[Literal["kubernetes"]]
    pod_name: str | None
    namespace: str | None
    node: str | None
    pod_uid: str | None
    pod_ip: str | None
    service_account: str | None
    hostname: str | None
    job_name: str | None
    completion_index: int | str | None
    jobset_name: str | None
    replicated_job_name: str | None
    job_index: int | str | None
    cpu_limit_cores: float | None
    memory_limit_bytes: int | None
    termination_grace_period_seconds: float | None
    termination_grace_source: str
    kill_wait_seconds: float | None
    errors: list[str]


class SnapshotSection(TypedDict, total=False):
    """``snapshot``: where the code, the GPUs, the software and the host stood, and the
    scheduler's job.  Every key may be missing: an artifact rebuilt from a journal that never
    got the snapshot holds ``{}``, and one whose snapshot was not taken holds ``error`` and
    ``scheduler`` only; ``scheduler`` is null outside a scheduler's job (and missing from
    artifacts written before it was recorded)."""

    taken_at: Timestamp
    root: str
    source: SourceProbe | ProbeFailure
    gpus: GpuProbe | ProbeFailure
    software: SoftwareProbe | ProbeFailure
    host: HostProbe | ProbeFailure
    #: The variables that shape a training run (credentials redacted), by name.
    environment: dict[str, str]
    scheduler: SlurmJob | KubernetesPod | None
    error: str
