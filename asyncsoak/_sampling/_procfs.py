"""Reading procfs with the fewest system calls, files kept open between readings (a ``pread``
makes the kernel build the file afresh).  An open file keeps its process, never a later one with
the same pid: reading it then fails (``ESRCH``) and the pid is opened afresh.
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path
from typing import Any

from .._contract import Masker
from .._process import launcher_of, parse_rank_environ, read_environ, role

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
#: its schedstat and statm.
FILES_PER_PROCESS = 6
#: Where each of those files is in a process's list of descriptors (:attr:`OpenFiles.by_pid`).
STAT, IO, FD_DIR, CHILDREN, SCHEDSTAT, STATM = range(FILES_PER_PROCESS)
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
        #: pid -> [stat, io, fd directory, children, schedstat, statm] descriptors (or
        #: DENIED, CLOSED), at the indices STAT, IO, FD_DIR, CHILDREN, SCHEDSTAT, STATM.
        self.by_pid: dict[int, list[int]] = {}

    def get(self, pid: int) -> list[int] | None:
        """The descriptors of ``pid``, opening ``stat`` if new; None past the budget."""
        files = self.by_pid.get(pid)
        if files is None:
            if len(self.by_pid) >= self._max_processes:
                return None
            stat = os.open(f"{self._proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            files = self.by_pid[pid] = [stat, CLOSED, CLOSED, CLOSED, CLOSED, CLOSED]
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


def read_shmem(base: str) -> int:
    """``RssShmem`` of ``status`` in bytes (0 where the kernel does not say, or if denied)."""
    try:
        status = read_proc_file(base + "status", one_piece=True)
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
