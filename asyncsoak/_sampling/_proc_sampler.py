"""The proc sampler: the supervised process tree and the machine, read straight from /proc.

A process is known by its pid and start time, so a reused pid never makes a bogus delta.  Which
files, and what is kept open or left unread: docs/architecture.md, "The proc sampler and the
limits".
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .._contract import Masker
from ._proc_sample import ProcessFigures, ProcSample, TreeFigures, percent_of
from ._procfs import (
    CHILDREN,
    CHUNK,
    FD_DIR_SIZE_IS_COUNT,
    IO,
    PROC,
    SCHEDSTAT,
    STAT,
    STATM,
    STATUS,
    VANISHED,
    Kept,
    MachineReader,
    OpenFiles,
    Seen,
    Walk,
    count_fds,
    describe,
    descriptor_budget,
    find_children,
    kb_field,
    pread_all,
    read_disks,
    read_file,
    read_memory_shares,
    read_proc_file,
    run_time,
    scan_parents,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# psutil's words for the one-letter states of /proc/PID/stat.
_STATES = {
    b"R": "running",
    b"S": "sleeping",
    b"D": "disk-sleep",
    b"T": "stopped",
    b"t": "tracing-stop",
    b"Z": "zombie",
    b"X": "dead",
    b"x": "dead",
    b"K": "wake-kill",
    b"W": "waking",
    b"I": "idle",
    b"P": "parked",
}

#: Seconds since boot: the clock of the start times in ``/proc/PID/stat``.
boot_clock: Callable[[], float] = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)

#: Every this long (the sampler's clock) each process is read whole, run or not: the figures
#: that change while a process sleeps (its RSS, lost to reclaim; its parent, when that one
#: died) are never older than this, at any sample interval.
FULL_READ_SECONDS = 10.0


class ProcSampler:
    """Reads the tree below ``root_pid`` and the machine (blocking: call :meth:`read` in a
    thread; a call made while another still runs returns None at once)."""

    def __init__(
        self,
        root_pid: int,
        *,
        disk_paths: Mapping[str, Path] | None = None,
        detailed_memory: bool = False,
        proc: Path = PROC,
        clock: Callable[[], float] = boot_clock,
        masker: Masker | None = None,
        members_file: str | None = None,
    ) -> None:
        self.root_pid = root_pid
        #: The ``cgroup.procs`` of a cgroup holding the tree: every member in one read.
        self.members_file = members_file
        self._members_fd: int | None = None
        self.disk_paths = dict(disk_paths or {})
        self.detailed_memory = detailed_memory
        self._proc = str(proc)
        self._clock = clock
        # Command lines carry tokens as often as environments do.
        self._masker = masker if masker is not None else Masker()
        #: Count open files with one stat() of /proc/PID/fd rather than listing it.
        self.counts_fds_by_size = FD_DIR_SIZE_IS_COUNT and proc == PROC
        self._lock = threading.Lock()
        #: Files are kept open only on the real /proc (a test's fake tree replaces its files).
        self._open_files = OpenFiles(self._proc, descriptor_budget()) if proc == PROC else None
        self._machine = MachineReader(self._proc, keep_open=proc == PROC)
        self._closed = False
        #: pid -> what the previous sample saw of each process, and read of each
        #: single-threaded one.  ``status`` (for ``RssShmem``) costs five times ``statm``: it
        #: is read when a process is first seen and at every full read.
        self._seen: dict[int, Seen] = {}
        self._ran: dict[int, Kept] = {}
        #: When the last full read (or the first read) began, by ``clock``.
        self._full_at: float | None = None
        self._previous_walk: float | None = None
        # /proc/PID/task/TID/children needs CONFIG_PROC_CHILDREN (on in common distribution
        # kernels); without it each reading scans every process's parent, as psutil does.
        root_task = f"{self._proc}/{root_pid}/task/{root_pid}"
        self.has_children_files = not os.path.isdir(root_task) or os.path.exists(
            f"{root_task}/children"
        )

    def read(self, t: float) -> ProcSample | None:
        """One sample stamped ``t``; None when another read is still running."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return None if self._closed else self._read(t)
        finally:
            if self._closed:
                self._close_files()  # closed while this read ran: the files are ours to close
            self._lock.release()

    def close(self) -> None:
        """Close the files kept open.  A read under way (a stuck thread) closes them when it
        returns: closed under it, their numbers could be reused by files opened meanwhile."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._close_files()
            finally:
                self._lock.release()

    def _close_files(self) -> None:
        if self._open_files is not None:
            self._open_files.keep_only(set())
        self._machine.close()
        if self._members_fd is not None:
            os.close(self._members_fd)
            self._members_fd = None

    def forget_descriptions(self, sample: ProcSample) -> None:
        """The sample was never delivered: describe its new processes again next time."""
        if not self._lock.acquire(blocking=False):
            return  # A read is running; describing a process twice is harmless.
        try:
            for process in sample.processes:
                seen = self._seen.get(process.pid)
                if process.cmdline is not None and seen is not None:
                    self._seen[process.pid] = (*seen[:3], None, seen[4])
        finally:
            self._lock.release()

    def _read(self, t: float) -> ProcSample:
        walk_started = self._clock()
        children_of = None if self.has_children_files else scan_parents(self._proc)
        if self._full_at is None:
            self._full_at = walk_started  # the first read reads every process it meets
        full = walk_started - self._full_at >= FULL_READ_SECONDS
        if full:
            self._full_at = walk_started
        walk = Walk(self.detailed_memory, children_of, full)
        members = self._members()
        # Every member at once: the walk reads no children files (see _push_children).
        walk.by_membership = members is not None
        walk.stack = (
            members if members is not None else find_children(self._proc, self.root_pid, walk)
        )
        seen = {self.root_pid}
        while walk.stack:
            pid = walk.stack.pop()
            if pid not in seen:
                seen.add(pid)
                self._read_process(pid, walk)
        if self._open_files is not None:
            self._open_files.keep_only(seen)

        tree_cpu: float | None = None
        if self._previous_walk is not None and walk_started > self._previous_walk:
            seconds = walk.cpu_ticks / CLOCK_TICKS
            tree_cpu = percent_of(seconds, walk_started - self._previous_walk)
        self._seen = walk.seen
        self._ran = walk.ran
        self._previous_walk = walk_started
        return ProcSample(
            t=t,
            root_pid=self.root_pid,
            tree=TreeFigures(
                processes=len(walk.processes),
                cpu_percent=tree_cpu,
                rss_bytes=walk.rss_bytes,
                anon_bytes=walk.anon_bytes,
                uss_bytes=walk.uss,
                pss_bytes=walk.pss,
                anon_pss_bytes=walk.anon_pss,
                threads=walk.threads,
                fds=walk.fds,
                read_bytes=walk.read_bytes,
                write_bytes=walk.write_bytes,
            ),
            processes=walk.processes,
            machine=self._machine.read(),
            disks=read_disks(self.disk_paths),
        )

    def _read_process(self, pid: int, walk: Walk) -> None:
        """Add one process to ``walk`` (left out if it vanishes meanwhile) and its children to
        the walk's stack.  Written for speed: it runs for every process at every sample."""
        base = f"{self._proc}/{pid}/"
        files: list[int] | None = None
        open_files = self._open_files
        kept = self._ran.get(pid)
        idle: Kept | None = None
        try:
            kept_before = open_files is not None and pid in open_files.by_pid
            files = None if open_files is None else open_files.get(pid)
            # What the previous sample read of a single-threaded process stands (never on a
            # full read) if its schedstat run time has not moved: it has changed neither its
            # stat nor its children, done no IO and opened no file.
            if kept is not None and files is not None and not walk.full and files[SCHEDSTAT] >= 0:
                try:
                    moved = run_time(files[SCHEDSTAT]) != kept[0]
                except ProcessLookupError:
                    moved = True  # gone, or its pid is another's: read afresh
                if not moved:
                    idle = kept
                    # Asleep through the previous sample too (0 % CPU), described and needing
                    # no smaps: added with that sample's figures, unchanged.
                    figures = kept[7]
                    if figures.cpu_percent == 0.0 and figures.role is None and walk.uss is None:
                        start_ticks, cpu_ticks, _, name, shmem = self._seen[pid]
                        if name is not None and figures.cmdline is None:
                            self._push_children(pid, base, files, figures.threads, kept[5], walk)
                            walk.seen[pid] = (start_ticks, cpu_ticks, self._clock(), name, shmem)
                            walk.ran[pid] = kept
                            walk.add(figures)
                            return
            if idle is not None:
                stat, statm = idle[4], idle[6]
            elif files is None:
                stat = read_proc_file(base + "stat", one_piece=True)
            else:
                try:
                    stat = os.pread(files[STAT], CHUNK, 0)
                except ProcessLookupError:
                    # The kept files were a process that is gone: the pid, found again in a
                    # children file, is another's now.  Its files are opened afresh.
                    if not kept_before or open_files is None:
                        raise
                    open_files.drop(pid)
                    files = open_files.get(pid)
                    assert files is not None
                    stat = os.pread(files[STAT], CHUNK, 0)
            if idle is None:
                statm = read_file(base, files, STATM, "statm", 128)
            read_at = self._clock()
            # comm (field 2) may hold spaces and parentheses: it ends at the last ')'.
            name_end = stat.rfind(b")")
            fields = stat[name_end + 2 :].split(None, 22)
            start_ticks = int(fields[19])  # field 22
            thread_count = int(fields[17])  # field 20
            # The run time of a single-threaded process with kept files, and what the previous
            # sample read of it if it has not run since: its IO and open files stand.
            ran: bytes | None = None
            unchanged = idle
            if idle is not None:
                ran = idle[0]
            elif files is not None and thread_count == 1:
                fd = OpenFiles.open(files, SCHEDSTAT, base + "schedstat")
                ran = run_time(fd) if fd >= 0 else None
                if kept is not None and kept[0] == ran and kept[1] == start_ticks:
                    unchanged = kept
            if unchanged is None:
                io = read_file(base, files, IO, "io", CHUNK).split()
                fds = count_fds(base, files, self.counts_fds_by_size)
            else:
                io, fds = unchanged[2], unchanged[3]
            children = self._push_children(
                pid, base, files, thread_count, idle[5] if idle is not None else None, walk
            )
            memory = read_memory_shares(base) if walk.uss is not None else None
            name = stat[stat.find(b"(") + 1 : name_end]
            previous = self._seen.get(pid)
            # Described again after an exec (a new name): a forked launcher becomes a rank.
            same = previous is not None and previous[0] == start_ticks and previous[3] == name
            described = previous if same else None
            cmdline, role = (None, None) if described else describe(base, name, self._masker)
            if described is not None and not walk.full:
                shmem = described[4]
            else:
                status = read_file(base, files, STATUS, "status", CHUNK)
                shmem = kb_field(status, b"\nRssShmem:") or 0
        except VANISHED:
            if files is not None and open_files is not None:
                open_files.drop(pid)
            return

        cpu_ticks = int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)
        cpu_percent = self._cpu_percent(previous, start_ticks, cpu_ticks, read_at, walk)
        if walk.uss is not None:
            walk.add_memory_shares(memory)
        walk.seen[pid] = (start_ticks, cpu_ticks, read_at, name, shmem)
        read_bytes, write_bytes = _io_bytes(io)
        rss = int(fields[21]) * PAGE_SIZE  # field 24
        figures = ProcessFigures(  # positional, in field order: keywords cost more at this rate
            pid,
            int(fields[1]),  # ppid
            # Positional arguments: decode(errors=...) parses keywords, twice the cost.
            name.decode("utf-8", "replace"),
            _STATES.get(fields[0]) or fields[0].decode("utf-8", "replace"),
            cpu_percent,
            rss,
            _anon_bytes(statm, shmem, rss),
            thread_count,
            fds,
            read_bytes,
            write_bytes,
            cmdline,
            role,
        )
        walk.add(figures)
        if ran is not None:
            walk.ran[pid] = (ran, start_ticks, io, fds, stat, children, statm, figures)

    def _push_children(
        self,
        pid: int,
        base: str,
        files: list[int] | None,
        thread_count: int,
        kept_children: bytes | None,
        walk: Walk,
    ) -> bytes | None:
        """Put the children of ``pid`` on the walk's stack; the content of its ``children``
        file if that was read (``kept_children``: the previous sample's, for an idle one)."""
        if walk.by_membership:
            return None  # every member is on the stack already
        if thread_count != 1 or walk.children_of is not None:
            walk.stack.extend(find_children(self._proc, pid, walk))
            return None
        children = kept_children
        if children is None:
            children = read_file(base, files, CHILDREN, f"task/{pid}/children", 0)
        if children:  # most processes of a tree are leaves
            walk.stack.extend(map(int, children.split()))
        return children

    def _cpu_percent(
        self, previous: Seen | None, start_ticks: int, cpu_ticks: int, read_at: float, walk: Walk
    ) -> float | None:
        """The process's CPU since the previous sample (None the first time); its ticks since
        then go to the tree's total."""
        if previous is not None and previous[0] == start_ticks:
            walk.cpu_ticks += cpu_ticks - previous[1]
            if read_at > previous[2]:
                # percent_of inlined: one call fewer per process.
                return round(
                    100.0 * (cpu_ticks - previous[1]) / CLOCK_TICKS / (read_at - previous[2]), 2
                )
        elif self._previous_walk is not None and start_ticks / CLOCK_TICKS >= self._previous_walk:
            # Born since the previous walk: all of its CPU time counts in the tree's total,
            # but a percentage of its own needs two readings (a few ms of life say nothing).
            walk.cpu_ticks += cpu_ticks
        return None

    def _members(self) -> list[int] | None:
        """The pids in the tree's cgroup, newest list; None when there is none to read (no
        cgroup, or it is gone: the walk by ``children`` files takes over)."""
        if self.members_file is None:
            return None
        try:
            if self._members_fd is None:
                self._members_fd = os.open(self.members_file, os.O_RDONLY | os.O_CLOEXEC)
            return [int(pid) for pid in pread_all(self._members_fd).split()]
        except OSError:
            self.members_file = None
            if self._members_fd is not None:
                os.close(self._members_fd)
                self._members_fd = None
            return None


def _io_bytes(io: list[bytes]) -> tuple[int | None, int | None]:
    """(read_bytes, write_bytes) from the words of an ``io`` file, or None for both."""
    # Without CONFIG_TASK_IO_ACCOUNTING the file stops after syscw.
    if len(io) > 11 and io[8] == b"read_bytes:":
        return int(io[9]), int(io[11])
    return None, None


def _anon_bytes(statm: bytes, shmem: int, rss: int) -> int:
    """The memory that can run out: resident pages not shared (``statm`` fields 2 and 3) and
    shared memory (``shmem``); the RSS where ``statm`` could not be read."""
    pages = statm.split(None, 3)
    return (int(pages[1]) - int(pages[2])) * PAGE_SIZE + shmem if len(pages) > 2 else rss
