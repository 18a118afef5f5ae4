"""The machine's figures: CPU, memory, swap and load from /proc, ``/dev/shm`` and the disks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ._proc_sample import DiskFigures, MachineFigures, percent_of
from ._procfs import kb_field, pread_all, read_proc_file

#: Where POSIX shared memory lives (``shm_open``, a data loader's segments).
SHM_DIR = "/dev/shm"


def _shm_used_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class MachineReader:
    """The machine's CPU (since the previous reading), memory, swap, load and ``/dev/shm``."""

    def __init__(self, proc: str, keep_open: bool) -> None:
        self._paths = tuple(f"{proc}/{name}" for name in ("stat", "meminfo", "loadavg"))
        self._keep_open = keep_open
        self._fds: list[int] | None = None
        self._previous_cpu: tuple[int, int] | None = None

    def close(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def _read_files(self) -> tuple[bytes, bytes, bytes]:
        """/proc/stat, meminfo and loadavg: kept open on the real /proc, as a process's."""
        if not self._keep_open:
            stat, meminfo, loadavg = (read_proc_file(p, one_piece=True) for p in self._paths)
            return stat, meminfo, loadavg
        if self._fds is None:
            self._fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in self._paths]
        stat, meminfo, loadavg = (pread_all(fd) for fd in self._fds)
        return stat, meminfo, loadavg

    def read(self) -> MachineFigures:
        machine_stat, meminfo_file, loadavg = self._read_files()
        cpu_line = machine_stat[: machine_stat.find(b"\n")]
        # user nice system idle iowait irq softirq steal (guest time is inside user and nice)
        ticks = list(map(int, cpu_line.split()[1:9]))
        total = sum(ticks)
        busy = total - ticks[3] - ticks[4]
        cpu: float | None = None
        if self._previous_cpu is not None:
            previous_busy, previous_total = self._previous_cpu
            if total > previous_total:
                cpu = percent_of(busy - previous_busy, total - previous_total)
        self._previous_cpu = (busy, total)

        # A leading newline lets every key be found as "\nKey:", the first one too.
        meminfo = b"\n" + meminfo_file
        mem_total = kb_field(meminfo, b"\nMemTotal:")
        mem_available = kb_field(meminfo, b"\nMemAvailable:")
        mem_used = mem_percent = None
        if mem_total and mem_available is not None:
            mem_used = mem_total - mem_available
            mem_percent = percent_of(mem_used, mem_total)
        swap_total = kb_field(meminfo, b"\nSwapTotal:")
        swap_free = kb_field(meminfo, b"\nSwapFree:")
        swap_used = swap_percent = None
        if swap_total is not None and swap_free is not None:
            swap_used = swap_total - swap_free
            swap_percent = percent_of(swap_used, swap_total) if swap_total else 0.0

        loads = loadavg.split()
        return MachineFigures(
            cpu_percent=cpu,
            memory_used_bytes=mem_used,
            memory_available_bytes=mem_available,
            memory_percent=mem_percent,
            swap_used_bytes=swap_used,
            swap_percent=swap_percent,
            shm_used_bytes=_shm_used_bytes(),
            load1=float(loads[0]),
            load5=float(loads[1]),
            load15=float(loads[2]),
        )


def read_disks(paths: Mapping[str, Path]) -> dict[str, DiskFigures]:
    """Each path's filesystem, read once per filesystem: directories on one filesystem get
    one reading, so their figures agree even while the disk is being written to."""
    by_device: dict[int, os.statvfs_result] = {}
    disks: dict[str, DiskFigures] = {}
    for label, path in paths.items():
        # The progress directory may not exist yet: its filesystem is its nearest parent's.
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.absolute().parent
        try:
            device = existing.stat().st_dev
            st = by_device.get(device)
            if st is None:
                st = by_device[device] = os.statvfs(existing)
        except OSError:
            disks[label] = DiskFigures(path=str(path), free_bytes=None, percent_used=None)
            continue
        free = st.f_bavail * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        # As df and psutil: the share of what an unprivileged user could fill.
        percent = percent_of(used, used + free) if used + free else 0.0
        disks[label] = DiskFigures(path=str(path), free_bytes=free, percent_used=percent)
    return disks
