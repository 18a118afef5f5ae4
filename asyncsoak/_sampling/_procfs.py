"""Reading procfs with the fewest system calls, files kept open between readings (a ``pread``
makes the kernel build the file afresh); what a reading gathers on its way down the tree; the
machine and its disks.  An open file keeps its process, never a later one with the same pid:
reading it then fails (``ESRCH``) and the pid is opened afresh.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._contract import Masker
from .._process import launcher_of, read_rank
from ._proc_sample import DiskFigures, MachineFigures, ProcessFigures, percent_of

PROC = Path("/proc")
VANISHED = (FileNotFoundError, ProcessLookupError)
CHUNK = 8192
#: Where POSIX shared memory lives (``shm_open``, a data loader's segments).
SHM_DIR = "/dev/shm"


def _fd_dir_size_is_count() -> bool:
    # Since Linux 6.2 stat() of /proc/PID/fd reports the number of open files: one system
    # call instead of listing the directory.  Older kernels report 0; this process has fds.
    try:
        return os.stat(f"/proc/{os.getpid()}/fd").st_size > 0
    except OSError:
        return False


FD_DIR_SIZE_IS_COUNT = _fd_dir_size_is_count()


def read_proc_file(path: str, *, one_piece: bool = False) -> bytes:
    """The whole content of a /proc file.  ``one_piece``: procfs builds it in one go (stat,
    io, meminfo...), so a short read is its end; others (``children``) come a page at a time."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, CHUNK)
        if not data or (one_piece and len(data) < CHUNK):
            return data
        chunks = [data]
        while chunk := os.read(fd, CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def pread_all(fd: int) -> bytes:
    """The whole of an open procfs file, read again from its start until a read returns
    nothing (a ``children`` file comes a page at a time)."""
    chunks = [os.pread(fd, CHUNK, 0)]
    offset = len(chunks[0])
    while chunks[-1] and (chunk := os.pread(fd, CHUNK, offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def descriptor_budget() -> int:
    """Descriptors the sampler may keep open: a quarter of the soft limit, 4096 at most (the
    rest is the host application's)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    return 4096 if soft == resource.RLIM_INFINITY else min(soft // 4, 4096)


#: The files of one process kept open, at these indices of its list in OpenFiles.by_pid.
FILES_PER_PROCESS = 7
STAT, IO, FD_DIR, CHILDREN, SCHEDSTAT, STATM, STATUS = range(FILES_PER_PROCESS)
#: A file that could not be opened for want of permission (``io`` of another user's process).
DENIED = -1
#: A file not opened (yet).
CLOSED = -2


class OpenFiles:
    """The tree's ``/proc`` files kept open between samples, touched only under the sampler's
    lock.  Processes past the budget of descriptors are read by path."""

    def __init__(self, proc: str, budget: int) -> None:
        self._proc = proc
        self._max_processes = budget // FILES_PER_PROCESS
        #: pid -> its descriptors (or DENIED, CLOSED), ``stat`` opened first.
        self.by_pid: dict[int, list[int]] = {}

    def get(self, pid: int) -> list[int] | None:
        """The descriptors of ``pid``, opening ``stat`` if new; None past the budget."""
        files = self.by_pid.get(pid)
        if files is None:
            if len(self.by_pid) >= self._max_processes:
                return None
            stat = os.open(f"{self._proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            files = self.by_pid[pid] = [stat, *[CLOSED] * (FILES_PER_PROCESS - 1)]
        return files

    @staticmethod
    def open(files: list[int], which: int, path: str, flags: int = 0) -> int:
        """The descriptor ``which`` of ``files``, opened from ``path`` on first use."""
        fd = files[which]
        if fd == CLOSED:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
            except PermissionError:
                fd = DENIED
            files[which] = fd
        return fd

    def drop(self, pid: int) -> None:
        for fd in self.by_pid.pop(pid, ()):
            if fd >= 0:
                os.close(fd)

    def keep_only(self, pids: set[int]) -> None:
        """Close the files of every process not in ``pids`` (gone, or out of the tree)."""
        for pid in [pid for pid in self.by_pid if pid not in pids]:
            self.drop(pid)


def read_file(base: str, files: list[int] | None, which: int, name: str, size: int) -> bytes:
    """The file ``name`` of the process whose directory is ``base`` (a trailing slash), from
    its kept descriptor ``which`` of ``files`` (None: by path); empty where it may not be read.
    ``size``: procfs builds the file in one go, so a shorter read is its end; 0: it comes a
    page at a time (``children``).  A process that is gone raises one of VANISHED."""
    try:
        if files is None:
            return read_proc_file(base + name, one_piece=size > 0)
        fd = OpenFiles.open(files, which, base + name)
        if fd < 0:
            return b""
        data = os.pread(fd, size, 0) if size else b""
        return data if 0 < len(data) < size else pread_all(fd)
    except PermissionError:
        return b""


def run_time(schedstat_fd: int) -> bytes:
    """The first field of an open ``schedstat``: the nanoseconds the process ran on a CPU
    (its one thread's, exact: unchanged means it has not run)."""
    return os.pread(schedstat_fd, 128, 0).split(None, 1)[0]


def count_fds(base: str, files: list[int] | None, by_size: bool) -> int | None:
    """The files a process has open; None where its ``fd`` directory may not be read.
    ``by_size``: the directory's size is the count (:data:`FD_DIR_SIZE_IS_COUNT`)."""
    if files is not None and by_size:
        fd = OpenFiles.open(files, FD_DIR, base + "fd", os.O_DIRECTORY)
        if fd >= 0:
            return os.fstat(fd).st_size
    try:
        return os.stat(base + "fd").st_size if by_size else len(os.listdir(base + "fd"))
    except PermissionError:
        return None


def kb_field(text: bytes, needle: bytes) -> int | None:
    """The value of ``needle`` (``b"\\nKey:"``) in kB, as bytes."""
    # A few lookups by name in ~50 lines: find() beats splitting every line.
    at = text.find(needle)
    if at < 0:
        return None
    start = at + len(needle)
    return int(text[start : text.index(b"kB", start)]) * 1024


def read_memory_shares(base: str) -> tuple[int, int, int] | None:
    """(USS, PSS, PSS of anonymous and shared memory) in bytes from ``smaps_rollup`` (the
    first two as psutil's ``memory_full_info``); None if denied."""
    try:
        data = read_proc_file(base + "smaps_rollup", one_piece=True)
    except PermissionError:
        return None
    uss = pss = anon_pss = 0
    for line in data.splitlines():
        key, _, rest = line.partition(b":")
        if key in (b"Private_Clean", b"Private_Dirty", b"Private_Hugetlb"):
            uss += int(rest.split()[0]) * 1024
        elif key == b"Pss":
            pss = int(rest.split()[0]) * 1024
        elif key in (b"Pss_Anon", b"Pss_Shmem"):
            anon_pss += int(rest.split()[0]) * 1024
    return uss, pss, anon_pss


def describe(base: str, name: bytes, masker: Masker) -> tuple[list[str] | None, Any]:
    """A new process's command line and its part in a distributed run (see
    :func:`asyncsoak._process._ranks.role`): its rank from a bounded read of its environment,
    once (an environment does not change)."""
    cmdline: list[str] | None = None
    with contextlib.suppress(PermissionError):
        data = read_proc_file(base + "cmdline")  # empty: a zombie's, or one that cleared it
        # Each argument ends with a NUL; an empty last argument is a NUL of its own.
        args = data.removesuffix(b"\0").split(b"\0")
        cmdline = masker.argv(arg.decode(errors="replace") for arg in args) if data else []
    launcher = launcher_of(name.decode("utf-8", "replace"), cmdline)
    return cmdline, read_rank(base + "environ") if launcher is None else {"launcher": launcher}


#: What the previous sample read of a single-threaded process: its ``schedstat`` run time,
#: start time, ``io`` words, open files, ``stat``, ``children`` (None when not read),
#: ``statm`` and the figures it gave.
Kept = tuple[bytes, int, list[bytes], int | None, bytes, bytes | None, bytes, ProcessFigures]
#: What a walk keeps of each process for the next: start time, CPU ticks, when read, its name
#: when described (None: to describe again) and its ``RssShmem`` bytes.
Seen = tuple[int, int, float, bytes | None, int]


class Walk:
    """What one reading gathers on its way down the tree (a plain class: built at every
    sample, a dataclass costs twice as much to build)."""

    __slots__ = (
        "anon_bytes",
        "anon_pss",
        "by_membership",
        "children_of",
        "cpu_ticks",
        "fds",
        "full",
        "processes",
        "pss",
        "ran",
        "read_bytes",
        "rss_bytes",
        "seen",
        "stack",
        "threads",
        "uss",
        "write_bytes",
    )

    def __init__(
        self, detailed_memory: bool, children_of: dict[int, list[int]] | None, full: bool
    ) -> None:
        #: Read every process whole (see FULL_READ_SECONDS).
        self.full = full
        #: parent pid -> children, from a scan of /proc when there are no ``children`` files.
        self.children_of = children_of
        #: The stack holds every member of the tree's cgroup: no children to look for.
        self.by_membership = False
        self.stack: list[int] = []
        self.processes: list[ProcessFigures] = []
        self.seen: dict[int, Seen] = {}
        self.ran: dict[int, Kept] = {}
        #: CPU ticks the tree used since the previous walk, and the tree's totals (added up
        #: as the processes are read: cheaper than summing after).
        self.cpu_ticks = self.rss_bytes = self.anon_bytes = self.threads = self.fds = 0
        self.read_bytes = self.write_bytes = 0
        self.uss: int | None = 0 if detailed_memory else None
        self.pss: int | None = 0 if detailed_memory else None
        self.anon_pss: int | None = 0 if detailed_memory else None

    def add(self, process: ProcessFigures) -> None:
        """One process of the tree, counted in its totals."""
        self.processes.append(process)
        self.rss_bytes += process.rss_bytes
        self.anon_bytes += process.anon_bytes
        self.threads += process.threads
        if process.fds is not None:
            self.fds += process.fds
        if process.read_bytes is not None:
            self.read_bytes += process.read_bytes
        if process.write_bytes is not None:
            self.write_bytes += process.write_bytes

    def add_memory_shares(self, shares: tuple[int, int, int] | None) -> None:
        """A process's USS, PSS and anonymous PSS (``--detailed-memory``); None: unreadable."""
        if self.uss is None or self.pss is None or self.anon_pss is None:
            return
        if shares is None:
            # Unreadable smaps: a partial total would mislead.
            self.uss = self.pss = self.anon_pss = None
            return
        self.uss += shares[0]
        self.pss += shares[1]
        self.anon_pss += shares[2]


def find_children(proc: str, pid: int, walk: Walk) -> list[int]:
    """Children of ``pid`` from each thread's ``children`` file: a child belongs to the
    thread that forked it."""
    if walk.children_of is not None:
        return walk.children_of.get(pid, [])
    task = f"{proc}/{pid}/task/"
    try:
        tids = os.listdir(task)
    except VANISHED:
        return []
    out: list[int] = []
    for tid in tids:
        # A thread that has ended: its children moved to another thread.
        with contextlib.suppress(*VANISHED):
            out.extend(map(int, read_proc_file(f"{task}{tid}/children").split()))
    return out


def scan_parents(proc: str) -> dict[int, list[int]]:
    """parent pid -> children, for every process on the machine."""
    children_of: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir(proc)):
        try:
            stat = read_proc_file(f"{proc}/{name}/stat", one_piece=True)
        except VANISHED:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])
        children_of.setdefault(ppid, []).append(int(name))
    return children_of


class MachineReader:
    """The machine's CPU (since the previous reading), memory, swap, load and ``/dev/shm``;
    its files kept open on the real /proc, as a process's."""

    def __init__(self, proc: str, keep_open: bool) -> None:
        self._paths = [f"{proc}/{name}" for name in ("stat", "meminfo", "loadavg")]
        self._keep_open = keep_open
        self._fds: list[int] = []
        self._previous_cpu: tuple[int, int] | None = None

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def read(self) -> MachineFigures:
        if not self._keep_open:
            files = [read_proc_file(path, one_piece=True) for path in self._paths]
        else:
            if not self._fds:
                self._fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in self._paths]
            files = [pread_all(fd) for fd in self._fds]
        machine_stat, meminfo_file, loadavg = files
        # user nice system idle iowait irq softirq steal (guest time is inside user and nice)
        ticks = list(map(int, machine_stat[: machine_stat.find(b"\n")].split()[1:9]))
        total = sum(ticks)
        busy = total - ticks[3] - ticks[4]
        cpu: float | None = None
        if self._previous_cpu is not None and total > self._previous_cpu[1]:
            cpu = percent_of(busy - self._previous_cpu[0], total - self._previous_cpu[1])
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
        shm_used = None
        with contextlib.suppress(OSError):
            st = os.statvfs(SHM_DIR)
            shm_used = (st.f_blocks - st.f_bfree) * st.f_frsize
        load1, load5, load15 = map(float, loadavg.split()[:3])
        return MachineFigures(
            cpu_percent=cpu,
            memory_used_bytes=mem_used,
            memory_available_bytes=mem_available,
            memory_percent=mem_percent,
            swap_used_bytes=swap_used,
            swap_percent=swap_percent,
            shm_used_bytes=shm_used,
            load1=load1,
            load5=load5,
            load15=load15,
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
            disks[label] = DiskFigures(str(path), None, None)
            continue
        free = st.f_bavail * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        # As df and psutil: the share of what an unprivileged user could fill.
        percent = percent_of(used, used + free) if used + free else 0.0
        disks[label] = DiskFigures(str(path), free, percent)
    return disks
