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
from .._process import launcher_of, parse_rank_environ, read_environ, role
from ._proc_sample import DiskFigures, MachineFigures, ProcessFigures, percent_of

PROC = Path("/proc")
VANISHED = (FileNotFoundError, ProcessLookupError)
CHUNK = 8192


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


def descriptor_budget() -> int:
    """Descriptors the sampler may keep open: a quarter of the soft limit, 4096 at most (the
    rest is the host application's)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return 4096
    return min(soft // 4, 4096)


#: The files of one process kept open: stat, io, the fd directory, the main thread's children,
#: its schedstat, statm and status.
FILES_PER_PROCESS = 7
#: Where each of those files is in a process's list of descriptors (:attr:`OpenFiles.by_pid`).
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
        #: pid -> [stat, io, fd directory, children, schedstat, statm, status] descriptors (or
        #: DENIED, CLOSED), at the indices STAT, IO, FD_DIR, CHILDREN, SCHEDSTAT, STATM, STATUS.
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

    def close(self) -> None:
        self.keep_only(set())


def pread_all(fd: int) -> bytes:
    """The whole of an open procfs file, read again from its start until a read returns
    nothing (a ``children`` file comes a page at a time)."""
    data = os.pread(fd, CHUNK, 0)
    if not data:
        return data
    chunks = [data]
    offset = len(data)
    while chunk := os.pread(fd, CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


# Per file of a process: ``base`` is its directory with a trailing slash, ``files`` its kept
# descriptors or None to read by path.  A process that is gone raises one of VANISHED.


def read_stat(base: str, files: list[int] | None) -> bytes:
    """``stat``: state, parent, CPU ticks, threads, start time, RSS."""
    if files is None:
        return read_proc_file(base + "stat", one_piece=True)
    return os.pread(files[STAT], CHUNK, 0)


def read_statm(base: str, files: list[int] | None) -> bytes:
    """``statm``: sizes in pages (resident and shared are fields 2 and 3); empty if denied."""
    if files is None:
        return read_proc_file(base + "statm", one_piece=True)
    fd = OpenFiles.open(files, STATM, base + "statm")
    return os.pread(fd, 128, 0) if fd >= 0 else b""


def run_time(schedstat_fd: int) -> bytes:
    """The first field of an open ``schedstat``: the nanoseconds the process ran on a CPU
    (its one thread's, exact: unchanged means it has not run)."""
    return os.pread(schedstat_fd, 128, 0).split(None, 1)[0]


def read_run_time(base: str, files: list[int]) -> bytes | None:
    """:func:`run_time` of a process whose files are kept open; None if denied."""
    fd = OpenFiles.open(files, SCHEDSTAT, base + "schedstat")
    return run_time(fd) if fd >= 0 else None


def read_io(base: str, files: list[int] | None) -> list[bytes]:
    """The words of ``io``; none where it may not be read (another user's process)."""
    try:
        if files is None:
            return read_proc_file(base + "io", one_piece=True).split()
        fd = OpenFiles.open(files, IO, base + "io")
        return os.pread(fd, CHUNK, 0).split() if fd >= 0 else []
    except PermissionError:
        return []


def count_fds(base: str, files: list[int] | None, by_size: bool) -> int | None:
    """The files a process has open; None where its ``fd`` directory may not be read.
    ``by_size``: the directory's size is the count (:data:`FD_DIR_SIZE_IS_COUNT`)."""
    if files is not None and by_size:
        fd = OpenFiles.open(files, FD_DIR, base + "fd", os.O_DIRECTORY)
        if fd >= 0:
            return os.fstat(fd).st_size
    try:
        if by_size:
            return os.stat(base + "fd").st_size
        return len(os.listdir(base + "fd"))
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


def read_children(base: str, pid: int, files: list[int] | None) -> bytes:
    """The ``children`` file of the process's main thread: the pids it forked, by spaces."""
    path = f"{base}task/{pid}/children"
    if files is None:
        return read_proc_file(path)
    fd = OpenFiles.open(files, CHILDREN, path)
    return pread_all(fd) if fd >= 0 else b""


def read_shmem(base: str, files: list[int] | None = None) -> int:
    """``RssShmem`` of ``status`` in bytes (0 where the kernel does not say, or if denied);
    read from the kept descriptor when there is one (a full read reads every process's)."""
    try:
        if files is None:
            status = read_proc_file(base + "status", one_piece=True)
        else:
            fd = OpenFiles.open(files, STATUS, base + "status")
            status = os.pread(fd, CHUNK, 0) if fd >= 0 else b""
            if len(status) == CHUNK:  # built in one go: a short read is its end
                status = pread_all(fd)
    except PermissionError:
        return 0
    return kb_field(status, b"\nRssShmem:") or 0


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
    text = name.decode("utf-8", "replace")
    if launcher_of(text, cmdline) is not None:
        return cmdline, role(text, cmdline, None)
    try:
        rank = parse_rank_environ(read_environ(base + "environ"))
    except OSError:
        # Another user's (EACCES), or gone since its stat was read: no rank to tell.
        rank = None
    return cmdline, role(text, cmdline, rank)


#: What the previous sample read of a single-threaded process: its ``schedstat`` run time,
#: start time, ``io`` fields, open files, ``stat``, ``children`` (None when not read),
#: ``statm`` and the figures it gave.
Kept = tuple[bytes, int, list[bytes], int | None, bytes, bytes | None, bytes, ProcessFigures]


class Walk:
    """What one reading gathers on its way down the tree (a plain class: built at every
    sample, a dataclass costs twice as much to build)."""

    __slots__ = (
        "anon_bytes",
        "anon_pss",
        "by_membership",
        "children_of",
        "cpu_ticks",
        "described",
        "fds",
        "full",
        "history",
        "previous_walk",
        "processes",
        "pss",
        "ran",
        "read_bytes",
        "rss_bytes",
        "shmem",
        "stack",
        "threads",
        "uss",
        "write_bytes",
    )

    def __init__(
        self,
        previous_walk: float | None,
        detailed_memory: bool,
        children_of: dict[int, list[int]] | None,
        full: bool,
    ) -> None:
        self.previous_walk = previous_walk
        #: Read every process whole (see FULL_READ_SECONDS).
        self.full = full
        #: parent pid -> children, from a scan of /proc when there are no ``children`` files.
        self.children_of = children_of
        #: The stack holds every member of the tree's cgroup: no children to look for.
        self.by_membership = False
        self.stack: list[int] = []
        self.processes: list[ProcessFigures] = []
        #: pid -> (start time, CPU ticks, when read): the next walk's history.
        self.history: dict[int, tuple[int, int, float]] = {}
        self.ran: dict[int, Kept] = {}
        self.described: dict[int, tuple[int, bytes]] = {}
        #: CPU ticks the tree used since the previous walk.
        self.cpu_ticks = 0
        #: The tree's totals, added up as the processes are read (cheaper than summing after).
        self.rss_bytes = 0
        self.anon_bytes = 0
        #: pid -> ``RssShmem`` bytes: the next walk's (see ProcSampler._shmem).
        self.shmem: dict[int, int] = {}
        self.threads = 0
        self.fds = 0
        self.read_bytes = 0
        self.write_bytes = 0
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
        if self.uss is None or self.pss is None:
            return
        if shares is None:
            # Unreadable smaps: a partial total would mislead.
            self.uss = self.pss = self.anon_pss = None
            return
        self.uss += shares[0]
        self.pss += shares[1]
        if self.anon_pss is not None:
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
        try:
            out.extend(map(int, read_proc_file(f"{task}{tid}/children").split()))
        except VANISHED:
            continue  # That thread has ended; its children moved to another thread.
    return out


def scan_parents(proc: str) -> dict[int, list[int]]:
    """parent pid -> children, for every process on the machine."""
    children_of: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            stat = read_proc_file(f"{proc}/{name}/stat", one_piece=True)
        except VANISHED:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])
        children_of.setdefault(ppid, []).append(int(name))
    return children_of


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
