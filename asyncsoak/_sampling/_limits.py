"""What a run's memory and disks cannot exceed, read once at the start (blocking): the
machine's memory, the command's memory cgroup and its OOM-kill counter, the filesystems
(docs/architecture.md, "The proc sampler and the limits")."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The environment variable that names a SLURM job (the cgroup path says it too: ``job_123``).
SLURM_JOB_VARIABLE = "SLURM_JOB_ID"
_SLURM_JOB_DIRECTORY = re.compile(r"(?:^|/)job_(\d+)(?:/|$)")

#: Per version: the files of the hard limit, the usage, the OOM-kill counter, the soft limit.
_FILES = {
    2: ("memory.max", "memory.current", "memory.events", "memory.high"),
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control", None),
}


class CgroupLimit(NamedTuple):
    """One limit of a memory cgroup: its value, the file it is read from, the cgroup setting it."""

    bytes: int
    file: str  # ``memory.max``, ``memory.high`` or ``memory.limit_in_bytes``
    path: str  # the cgroup that sets it, as ``/proc/PID/cgroup`` names it


class MemoryCgroup(NamedTuple):
    """The memory cgroup a process runs in, the limits that apply to it, its OOM-kill counter."""

    version: int
    path: str  # as ``/proc/PID/cgroup`` names it
    directory: Path  # where its files are
    hard: CgroupLimit | None  # the OOM killer's
    high: CgroupLimit | None  # ``memory.high`` (v2 only)
    current_bytes: int | None
    oom_kills: int | None  # the OOM-kill counter when read

    @property
    def hard_bytes(self) -> int | None:
        return None if self.hard is None else self.hard.bytes

    @property
    def high_bytes(self) -> int | None:
        return None if self.high is None else self.high.bytes

    def read_oom_kills(self) -> int | None:
        """The cgroup's OOM-kill counter now (blocking)."""
        return _oom_kill_counter(self.directory / _FILES[self.version][2])


def memory_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    for line in (_read_text(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            words = line.split()
            return int(words[1]) * 1024 if len(words) > 1 and words[1].isdigit() else None
    return None


def memory_cgroup(
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    root: Path = CGROUP_ROOT,
    *,
    machine_bytes: int | None = None,
) -> MemoryCgroup | None:
    """The memory cgroup named by ``proc_cgroup`` (a ``/proc/PID/cgroup``), or None.  A limit
    at or above ``machine_bytes`` is no limit (v1 writes "none" as a huge number)."""
    found = _controller_hierarchy(proc_cgroup, root, "memory")
    if found is None:
        return None
    version, hierarchy, relative = found
    hard_file, usage_file, oom_kill_file, high_file = _FILES[version]
    # The nearest cgroup with a usage file: a v2 group whose parent did not enable the
    # memory controller for it (the soak's own tree group, say) has none.
    directory = hierarchy.nearest(relative, usage_file)
    return MemoryCgroup(
        version=version,
        path=hierarchy.name(directory),
        directory=directory,
        hard=hierarchy.tightest(directory, hard_file, machine_bytes),
        high=None if high_file is None else hierarchy.tightest(directory, high_file, machine_bytes),
        current_bytes=_read_int(directory / usage_file),
        oom_kills=_oom_kill_counter(directory / oom_kill_file),
    )


def cgroup_memory_max_bytes(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> int | None:
    """The tightest hard memory limit of the cgroup ``proc_cgroup`` names, or None."""
    cgroup = memory_cgroup(proc_cgroup, root, machine_bytes=memory_total_bytes())
    return None if cgroup is None else cgroup.hard_bytes


def memory_limit(
    machine_bytes: int | None,
    cgroup: MemoryCgroup | None,
    environ: Mapping[str, str] = os.environ,
) -> tuple[int | None, str | None, str | None]:
    """The lowest memory limit that applies: (bytes, what it is, the cgroup that sets it), what
    it is as "machine memory" or "cgroup memory.max (SLURM job 123)"."""
    candidates: list[tuple[int, str, str | None]] = []
    if machine_bytes is not None:
        candidates.append((machine_bytes, "machine memory", None))
    if cgroup is not None:
        owner = cgroup_owner(cgroup.path, environ)
        for limit in (cgroup.hard, cgroup.high):
            if limit is not None:
                source = f"cgroup {limit.file}" + (f" ({owner})" if owner else "")
                candidates.append((limit.bytes, source, limit.path))
    if not candidates:
        return None, None, None
    # The lowest wins; between equal ones the machine's, then the hard limit (listed first).
    return min(candidates, key=lambda candidate: candidate[0])


def cgroup_owner(path: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """What a cgroup belongs to, as people say it: "SLURM job 123", "Kubernetes pod", or None."""
    job = _SLURM_JOB_DIRECTORY.search(path)
    if job is not None:
        return f"SLURM job {job[1]}"
    if "kubepods" in path:
        return "Kubernetes pod"
    if environ.get(SLURM_JOB_VARIABLE, "").isdigit():
        return f"SLURM job {environ[SLURM_JOB_VARIABLE]}"
    return None


def disk_total_bytes(path: Path) -> int | None:
    """Size of the filesystem holding ``path`` or its nearest existing parent."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_blocks * st.f_frsize
    return None


def read_limits(
    disk_paths: Mapping[str, Path],
    pid: int | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    root: Path = CGROUP_ROOT,
) -> tuple[dict[str, Any], MemoryCgroup | None]:
    """The ``limits`` event's fields, and the memory cgroup of process ``pid`` (the command),
    else this process's."""
    machine = memory_total_bytes()
    cgroup = None
    if pid is not None:
        cgroup = memory_cgroup(Path(f"/proc/{pid}/cgroup"), root, machine_bytes=machine)
    if cgroup is None:
        cgroup = memory_cgroup(Path("/proc/self/cgroup"), root, machine_bytes=machine)
    limit, source, limit_cgroup = memory_limit(machine, cgroup, environ)
    fields = {
        "memory_total_bytes": machine,
        "cgroup_memory_max_bytes": None if cgroup is None else cgroup.hard_bytes,
        "cgroup_memory_high_bytes": None if cgroup is None else cgroup.high_bytes,
        "cgroup_memory_current_bytes": None if cgroup is None else cgroup.current_bytes,
        "cgroup_version": None if cgroup is None else cgroup.version,
        "cgroup_path": None if cgroup is None else cgroup.path,
        "memory_limit_bytes": limit,
        "memory_limit_source": source,
        "memory_limit_cgroup": limit_cgroup,
        "disk_total_bytes": {label: disk_total_bytes(p) for label, p in disk_paths.items()},
    }
    return fields, cgroup


def _controller_hierarchy(
    proc_cgroup: Path, root: Path, controller: str
) -> tuple[int, _Hierarchy, str] | None:
    """(version, hierarchy, cgroup path) of ``controller``'s line in ``proc_cgroup``, or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    unified: str | None = None
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if not controllers:
            unified = path
        elif controller in controllers.split(","):
            for name in (controllers, controller):
                if (root / name / "cgroup.procs").exists():
                    return 1, _Hierarchy(root / name, path), path
    if unified is None:
        return None
    for mount in (root, root / "unified"):
        if controller in (_read_text(mount / "cgroup.controllers") or "").split():
            return 2, _Hierarchy(mount, unified), unified
    return None


def cgroup_cpu_limit_cores(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> float | None:
    """The tightest CPU quota of the cgroup ``proc_cgroup`` names, in cores (a container's
    ``resources.limits.cpu``), or None."""
    found = _controller_hierarchy(proc_cgroup, root, "cpu")
    if found is None:
        return None
    version, hierarchy, relative = found
    marker = "cpu.max" if version == 2 else "cpu.cfs_quota_us"
    quotas = (
        _cpu_quota_cores(d, version) for d in hierarchy.up(hierarchy.nearest(relative, marker))
    )
    return min((cores for cores in quotas if cores is not None), default=None)


def _cpu_quota_cores(directory: Path, version: int) -> float | None:
    if version == 2:
        quota, _, period = (_read_text(directory / "cpu.max") or "").strip().partition(" ")
    else:
        quota = (_read_text(directory / "cpu.cfs_quota_us") or "").strip()
        period = (_read_text(directory / "cpu.cfs_period_us") or "").strip()
    if not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


class _Hierarchy:
    """One mounted cgroup hierarchy, and the names ``/proc/PID/cgroup`` gives its cgroups."""

    def __init__(self, mount: Path, relative: str) -> None:
        self.mount = mount
        #: The name of the mount's root cgroup: "/", except in a container without a cgroup
        #: namespace, which sees the host's name for its cgroup but has only that cgroup
        #: mounted (the mount's root is then the cgroup ``relative`` names).
        self.mount_name = "/"
        if not (mount / relative.strip().lstrip("/")).is_dir():
            self.mount_name = relative.strip() or "/"

    def name(self, directory: Path) -> str:
        parts = directory.relative_to(self.mount).parts
        return "/".join((self.mount_name.rstrip("/"), *parts)) or "/"

    def nearest(self, relative: str, marker: str) -> Path:
        """The directory of cgroup ``relative``, or of its nearest ancestor holding ``marker``."""
        directory = self.mount
        if self.mount_name == "/":
            directory = self.mount / relative.strip().lstrip("/")
        while directory != self.mount and not (directory / marker).exists():
            directory = directory.parent
        return directory

    def up(self, directory: Path) -> list[Path]:
        """``directory`` and its parents up to the mount: limits are inherited."""
        return [directory, *directory.parents[: len(directory.relative_to(self.mount).parts)]]

    def tightest(self, directory: Path, file: str, machine_bytes: int | None) -> CgroupLimit | None:
        """The lowest limit in ``file`` from ``directory`` up to the root ("max", or the
        machine's memory or more, is none)."""
        limits = [
            CgroupLimit(value, file, self.name(cgroup))
            for cgroup in self.up(directory)
            if (value := _read_int(cgroup / file)) is not None
            and (machine_bytes is None or value < machine_bytes)
        ]
        return min(limits, key=lambda limit: limit.bytes, default=None)


def _oom_kill_counter(path: Path) -> int | None:
    """The ``oom_kill`` line of ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
    for line in (_read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None
