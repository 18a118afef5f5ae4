"""What a run's memory and disks cannot exceed, read once at the start (blocking: use a thread).

The trend rules project a leak onto these: the machine's memory, the cgroup's ``memory.max``
(a container or a SLURM job is killed at its cgroup's limit long before the machine fills),
and the size of the progress and output filesystems.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_memory_max_bytes(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> int | None:
    """The tightest ``memory.max`` from this process's cgroup (v2) up to the root, or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in lines if line.startswith("0::")), None)
    if relative is None:
        return None
    directory = root / relative.lstrip("/")
    tightest: int | None = None
    while True:
        try:
            text = (directory / "memory.max").read_text().strip()
        except OSError:
            text = "max"
        if text != "max":
            try:
                value = int(text)
            except ValueError:
                value = None
            if value is not None and (tightest is None or value < tightest):
                tightest = value
        if directory == root or root not in directory.parents:
            return tightest
        directory = directory.parent


def disk_total_bytes(path: Path) -> int | None:
    """Size of the filesystem holding ``path`` or its nearest existing parent."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_blocks * st.f_frsize
    return None


def read_limits(disk_paths: Mapping[str, Path]) -> dict[str, Any]:
    """The ``limits`` event's fields."""
    return {
        "memory_total_bytes": memory_total_bytes(),
        "cgroup_memory_max_bytes": cgroup_memory_max_bytes(),
        "disk_total_bytes": {label: disk_total_bytes(p) for label, p in disk_paths.items()},
    }
