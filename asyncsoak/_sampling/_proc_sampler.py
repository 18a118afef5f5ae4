"""The proc sampler: the supervised process tree and the machine, read straight from /proc.

Every ``interval`` the sampler walks the tree afresh from the soak's reaper (the reaper itself
is not part of the tree) and reads, for each process, ``/proc/PID/stat`` (state, parent, CPU
ticks, threads, start time, RSS), ``/proc/PID/io``, the size of ``/proc/PID/fd`` and the
``children`` files that lead to the next level.  A single pass both discovers and measures
the tree, a handful of system calls per process: psutil would cost several times that, and
``psutil.Process.children`` scans every process on the machine.

A process is known by its pid *and* its start time (field 22 of ``stat``): a pid reused
between two samples is a new process with no CPU history, never a bogus delta.  A process
that vanishes while it is being read is simply absent from the sample, like psutil's
``NoSuchProcess``; one we may not read (``AccessDenied``) keeps the figures we could read.

Between samples the sampler keeps each process's files open (:class:`._procfs.OpenFiles`):
one system call per file instead of a path walk, an open, a read and a close.  A
single-threaded process that has not run since the previous sample (its ``schedstat`` run
time unchanged) can have done no IO and opened no file: its figures of both stand unread.

When the tree has a cgroup of its own (``run_soak`` makes one where the kernel allows), one
read of its ``cgroup.procs`` names every member, and no ``children`` file is read.

The reads run in a worker thread under a deadline: a stuck read (``/proc/PID/cmdline`` and
``smaps_rollup`` wait for the process's memory map lock) degrades this sampler only, and no
second read starts until the stuck one returns.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio

from .._contract import (
    Event,
    EventSink,
    Masker,
    Ride,
    Rides,
    SamplerDegraded,
    SamplerNote,
    SamplerRecovered,
    SeriesPoints,
    SummaryLabels,
    Ticker,
    TickSignal,
    TickTimeout,
    require_positive,
)
from .._process import launcher_of, parse_rank_environ, read_environ, role
from ._procfs import (
    FD_DIR_SIZE_IS_COUNT,
    PROC,
    SCHEDSTAT,
    VANISHED,
    OpenFiles,
    count_fds,
    descriptor_budget,
    pread_all,
    read_children,
    read_io,
    read_memory_shares,
    read_proc_file,
    read_run_time,
    read_shmem,
    read_stat,
    read_statm,
    run_time,
)

SAMPLER_NAME = "proc"
#: Events waiting for the serializer past which a new sample is dropped (counted) rather than
#: queued: the soak's figures stay current and a backlog never grows behind a slow fold.
SAMPLES_BEHIND = 2
#: How long one reading of the tree and the machine may take before the sampler is degraded.
READ_TIMEOUT_SECONDS = 5.0
#: A soak whose sampler has had no sample for this long (and :data:`BLIND_INTERVALS` sample
#: intervals) is not being watched: it fails closed (``monitor_error``), never passes blind.
BLIND_SECONDS = 20.0
BLIND_INTERVALS = 4


def blind_limit(interval: float) -> float:
    """How long the sampler may go without a sample before the soak fails closed."""
    return max(BLIND_SECONDS, BLIND_INTERVALS * interval)


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
# States worth a line in the artifact's summary: a process stuck on IO, unreaped or stopped.
_NOTABLE_STATES = frozenset({"disk-sleep", "zombie", "stopped", "tracing-stop"})


def _percent(part: float, whole: float) -> float:
    # Two decimals are more than /proc's precision and keep the journal short.
    return round(100.0 * part / whole, 2)


#: Seconds since boot: the clock of the start times in ``/proc/PID/stat``.
boot_clock: Callable[[], float] = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)


# The figures are not frozen: one is built for every process (and the tree's, the machine's,
# each disk's) at every sample, and a frozen dataclass's __init__ costs several times as much
# (benchmarks/proc_sampling.py).  Nobody changes them once built.
@dataclass(slots=True)
class ProcessFigures:
    """One process of the tree.  ``cmdline`` only the first time the process is sampled."""

    pid: int
    ppid: int
    name: str
    state: str
    #: Over the time since the previous sample; None the first time a process is sampled.
    #: The kernel counts CPU time in ticks (10 ms as a rule): coarse over short intervals.
    cpu_percent: float | None
    rss_bytes: int
    #: The memory that can run out: anonymous pages and shared memory (``RssAnon`` +
    #: ``RssShmem``), without the clean file-backed pages an mmap'd dataset or the page
    #: cache brings in, which the kernel can always drop.  Leaks and budgets judge this.
    anon_bytes: int
    threads: int
    fds: int | None
    read_bytes: int | None
    write_bytes: int | None
    cmdline: list[str] | None = None
    #: Its part in a distributed run, with ``cmdline``: ``{"launcher": "torchrun"}``, its
    #: rank (``rank``, ``local_rank``, ``world_size``, ``group_rank``, ``source``), or None.
    role: dict[str, Any] | None = None


@dataclass(slots=True)
class TreeFigures:
    """The tree's totals.  ``cpu_percent`` may exceed 100 (one full core is 100)."""

    processes: int
    cpu_percent: float | None
    rss_bytes: int
    #: Summed over the processes, like ``rss_bytes`` (pages forked workers share are counted
    #: once per process; ``anon_pss_bytes`` counts them once).
    anon_bytes: int
    uss_bytes: int | None
    pss_bytes: int | None
    #: ``--detailed-memory``: the proportional share of anonymous and shared memory
    #: (``Pss_Anon`` + ``Pss_Shmem``), the tree's honest figure of memory that can run out.
    anon_pss_bytes: int | None
    threads: int
    fds: int
    read_bytes: int
    write_bytes: int


@dataclass(slots=True)
class MachineFigures:
    """The whole machine.  ``cpu_percent`` is of all CPUs (100 means every core busy)."""

    cpu_percent: float | None
    memory_used_bytes: int | None
    memory_available_bytes: int | None
    memory_percent: float | None
    swap_used_bytes: int | None
    swap_percent: float | None
    #: Used bytes of ``/dev/shm``: shared-memory segments (a data loader's) live on there
    #: after every process that mapped them is gone, until someone unlinks them.
    shm_used_bytes: int | None
    load1: float | None
    load5: float | None
    load15: float | None


@dataclass(slots=True)
class DiskFigures:
    """The filesystem holding ``path`` (or its nearest existing parent)."""

    path: str
    free_bytes: int | None
    percent_used: float | None


@dataclass(frozen=True, slots=True)
class ProcSample(Event):
    """One reading of the supervised tree and the machine."""

    KIND: ClassVar[str] = "sample"
    DROPPABLE: ClassVar[bool] = True

    root_pid: int
    tree: TreeFigures
    processes: list[ProcessFigures]
    machine: MachineFigures
    disks: dict[str, DiskFigures]

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(p.pid for p in self.processes)

    def series_points(self) -> SeriesPoints:
        tree = self.tree
        machine = self.machine
        machine_points: dict[str, float | None] = {
            "cpu_percent": machine.cpu_percent,
            "memory_used_bytes": machine.memory_used_bytes,
            "memory_percent": machine.memory_percent,
            "swap_percent": machine.swap_percent,
            "load1": machine.load1,
            "shm_used_bytes": machine.shm_used_bytes,
        }
        for label, disk in self.disks.items():
            machine_points[f"disk_free_bytes_{label}"] = disk.free_bytes
        tree_points: dict[str, float | None] = {
            "cpu_percent": tree.cpu_percent,
            "rss_bytes": tree.rss_bytes,
            "anon_bytes": tree.anon_bytes,
            "processes": tree.processes,
            "threads": tree.threads,
            "fds": tree.fds,
            "read_bytes": tree.read_bytes,
            "write_bytes": tree.write_bytes,
        }
        if tree.pss_bytes is not None:
            # --detailed-memory: shared pages counted once, the tree's honest figure.
            tree_points["pss_bytes"] = tree.pss_bytes
            tree_points["anon_pss_bytes"] = tree.anon_pss_bytes
        return {"tree": tree_points, "machine": machine_points}

    def summary_labels(self) -> SummaryLabels:
        notable = sorted({p.state for p in self.processes} & _NOTABLE_STATES)
        return {"tree": {"process_states": notable}} if notable else {}


#: What the previous sample read of a single-threaded process: its ``schedstat`` run time,
#: start time, ``io`` fields, open files, ``stat``, ``children`` (None when not read) and
#: ``statm``.
_Kept = tuple[bytes, int, list[bytes], int | None, bytes, bytes | None, bytes]
#: Every this many samples each process is read whole, run or not: the figures that change
#: while a process sleeps (its RSS, lost to reclaim; its parent, when that one died) are never
#: older than this.
FULL_READ_EVERY = 10


class _Walk:
    """What one reading gathers on its way down the tree.

    A plain class: built at every sample, and a dataclass with default factories and an
    ``InitVar`` costs twice as much to build.
    """

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
        #: Read every process whole (see FULL_READ_EVERY).
        self.full = full
        #: parent pid -> children, from a scan of /proc when there are no ``children`` files.
        self.children_of = children_of
        #: The stack holds every member of the tree's cgroup: no children to look for.
        self.by_membership = False
        self.stack: list[int] = []
        self.processes: list[ProcessFigures] = []
        #: pid -> (start time, CPU ticks, when read): the next walk's history.
        self.history: dict[int, tuple[int, int, float]] = {}
        self.ran: dict[int, _Kept] = {}
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


class ProcSampler:
    """Reads the tree below ``root_pid`` and the machine; keeps what CPU deltas need.

    :meth:`read` is blocking (call it in a worker thread) and never runs twice at once: a
    call made while another is still running returns None at once.
    """

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
        #: The ``cgroup.procs`` of a cgroup that holds the tree (the reaper outside it): one
        #: read gives every member, instead of a ``children`` file per process.
        self.members_file = members_file
        self._members_fd: int | None = None
        self.disk_paths = dict(disk_paths or {})
        self.detailed_memory = detailed_memory
        self._proc = str(proc)
        self._machine_paths = tuple(
            f"{self._proc}/{name}" for name in ("stat", "meminfo", "loadavg")
        )
        self._clock = clock
        # Command lines carry tokens as often as environments do.
        self._masker = masker if masker is not None else Masker()
        #: Count open files with one stat() of /proc/PID/fd rather than listing it.
        self.counts_fds_by_size = FD_DIR_SIZE_IS_COUNT and proc == PROC
        self._lock = threading.Lock()
        #: Files kept open between samples; only on the real /proc (a test's fake tree may
        #: replace its files, and an open file would keep reading the replaced one).
        self._open_files = OpenFiles(self._proc, descriptor_budget()) if proc == PROC else None
        self._machine_fds: list[int] | None = None
        self._closed = False
        #: pid -> (start time, CPU ticks, when read) at the previous sample.
        self._history: dict[int, tuple[int, int, float]] = {}
        #: pid -> what was read of each single-threaded process at the previous sample (see
        #: _read_process).
        self._ran: dict[int, _Kept] = {}
        self._walks = 0
        #: pid -> its ``RssShmem`` in bytes, from ``/proc/PID/status``: read when a process
        #: is first seen and at every full read (FULL_READ_EVERY), as that file costs five
        #: times ``statm`` (whose "shared" lumps shared memory in with file pages).
        self._shmem: dict[int, int] = {}
        #: pid -> (start time, name) of the processes whose cmdline has been handed out.
        self._described: dict[int, tuple[int, bytes]] = {}
        self._previous_walk: float | None = None
        self._previous_machine_cpu: tuple[int, int] | None = None
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
            if self._closed:
                return None
            return self._read(t)
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
            self._open_files.close()
        if self._machine_fds is not None:
            for fd in self._machine_fds:
                os.close(fd)
            self._machine_fds = None
        if self._members_fd is not None:
            os.close(self._members_fd)
            self._members_fd = None

    def forget_descriptions(self, sample: ProcSample) -> None:
        """The sample was never delivered: describe its new processes again next time."""
        if not self._lock.acquire(blocking=False):
            return  # A read is running; describing a process twice is harmless.
        try:
            for process in sample.processes:
                if process.cmdline is not None:
                    self._described.pop(process.pid, None)
        finally:
            self._lock.release()

    def _read(self, t: float) -> ProcSample:
        walk_started = self._clock()
        children_of = None if self.has_children_files else self._scan_parents()
        self._walks += 1
        full = self._walks % FULL_READ_EVERY == 0
        walk = _Walk(self._previous_walk, self.detailed_memory, children_of, full)
        members = self._members()
        if members is not None:
            # Every member at once: the walk reads no children files (see _read_process).
            walk.by_membership = True
            walk.stack = members
        else:
            walk.stack = self._children(self.root_pid, walk)
        seen = {self.root_pid}
        while walk.stack:
            pid = walk.stack.pop()
            if pid not in seen:
                seen.add(pid)
                self._read_process(pid, walk)
        if self._open_files is not None:
            self._open_files.keep_only(seen)

        processes = walk.processes
        tree_cpu: float | None = None
        if walk.previous_walk is not None and walk_started > walk.previous_walk:
            seconds = walk.cpu_ticks / CLOCK_TICKS
            tree_cpu = _percent(seconds, walk_started - walk.previous_walk)
        self._history = walk.history
        self._ran = walk.ran
        self._described = walk.described
        self._shmem = walk.shmem
        self._previous_walk = walk_started
        return ProcSample(
            t=t,
            root_pid=self.root_pid,
            tree=TreeFigures(
                processes=len(processes),
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
            processes=processes,
            machine=self._read_machine(),
            disks={label: _read_disk(path) for label, path in self.disk_paths.items()},
        )

    def _read_process(self, pid: int, walk: _Walk) -> None:
        """Add one process to ``walk`` and its children to the walk's stack.

        A process that vanishes while being read is left out.  This runs for every process
        at every sample, so it is written for speed (benchmarks/proc_sampling.py): one reader
        per file (:mod:`._procfs`), and what an idle process's files said last time stands.
        """
        base = f"{self._proc}/{pid}/"
        files: list[int] | None = None
        try:
            files, kept_before = self._kept_files(pid)
            idle = self._idle_since_last_sample(pid, files, walk)
            if idle is None:
                stat, files = self._read_stat(pid, base, files, kept_before)
            else:
                stat = idle[4]
            read_at = self._clock()
            # comm (field 2) may hold spaces and parentheses: it ends at the last ')'.
            name_end = stat.rfind(b")")
            fields = stat[name_end + 2 :].split(None, 22)
            start_ticks = int(fields[19])  # field 22
            thread_count = int(fields[17])  # field 20
            statm = read_statm(base, files) if idle is None else idle[6]
            ran, unchanged = (
                (idle[0], idle)
                if idle is not None
                else self._ran_since_last_sample(pid, base, files, thread_count, start_ticks)
            )
            if unchanged is None:
                io = read_io(base, files)
                fds = count_fds(base, files, self.counts_fds_by_size)
            else:
                io, fds = unchanged[2], unchanged[3]
            children = self._push_children(
                pid, base, files, thread_count, idle[5] if idle is not None else None, walk
            )
            memory = read_memory_shares(base) if walk.uss is not None else None
            name = stat[stat.find(b"(") + 1 : name_end]
            # Described again after an exec (a new name): a forked launcher becomes a rank.
            described = self._described.get(pid) == (start_ticks, name)
            cmdline, role = (None, None) if described else self._describe(base, name)
            shmem = self._shmem.get(pid)
            if shmem is None or not described or walk.full:
                shmem = read_shmem(base)
        except VANISHED:
            if files is not None and self._open_files is not None:
                self._open_files.drop(pid)
            return

        cpu_ticks = int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)
        cpu_percent = self._cpu_percent(pid, start_ticks, cpu_ticks, read_at, walk)
        if walk.uss is not None:
            walk.add_memory_shares(memory)
        walk.history[pid] = (start_ticks, cpu_ticks, read_at)
        walk.described[pid] = (start_ticks, name)
        if ran is not None:
            walk.ran[pid] = (ran, start_ticks, io, fds, stat, children, statm)
        walk.shmem[pid] = shmem
        read_bytes, write_bytes = _io_bytes(io)
        rss = int(fields[21]) * PAGE_SIZE  # field 24
        walk.add(
            ProcessFigures(  # positional, in field order: keywords cost more at this rate
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
        )

    def _kept_files(self, pid: int) -> tuple[list[int] | None, bool]:
        """The files of ``pid`` kept open (None: read it by path), and whether they were
        open before this sample."""
        open_files = self._open_files
        if open_files is None:
            return None, False
        kept_before = pid in open_files.by_pid
        return open_files.get(pid), kept_before

    def _idle_since_last_sample(
        self, pid: int, files: list[int] | None, walk: _Walk
    ) -> _Kept | None:
        """What the previous sample read of ``pid``, if it still stands: one read instead of
        four.

        A single-threaded process that has not run since then (its schedstat run time, its
        one thread's, exact to the nanosecond, has not moved) has changed neither its stat
        nor its children, done no IO and opened no file.  Never on a full read.
        """
        if files is None or walk.full:
            return None
        kept = self._ran.get(pid)
        if kept is None or files[SCHEDSTAT] < 0:
            return None
        try:
            return kept if run_time(files[SCHEDSTAT]) == kept[0] else None
        except ProcessLookupError:
            return None  # gone, or its pid is another's: read afresh

    def _read_stat(
        self, pid: int, base: str, files: list[int] | None, kept_before: bool
    ) -> tuple[bytes, list[int] | None]:
        """The ``stat`` of ``pid``, and its files: opened afresh when the kept ones were a
        process that is gone (the pid, found again in a children file, is another's now)."""
        try:
            return read_stat(base, files), files
        except ProcessLookupError:
            if not kept_before or self._open_files is None:
                raise
            self._open_files.drop(pid)
            files = self._open_files.get(pid)
            assert files is not None
            return read_stat(base, files), files

    def _ran_since_last_sample(
        self, pid: int, base: str, files: list[int] | None, thread_count: int, start_ticks: int
    ) -> tuple[bytes | None, _Kept | None]:
        """The run time of a single-threaded process with kept files (else None), and what the
        previous sample read of it if it has not run since: its IO and open files stand."""
        if files is None or thread_count != 1:
            return None, None
        ran = read_run_time(base, files)
        kept = self._ran.get(pid)
        if ran is not None and kept is not None and kept[0] == ran and kept[1] == start_ticks:
            return ran, kept
        return ran, None

    def _push_children(
        self,
        pid: int,
        base: str,
        files: list[int] | None,
        thread_count: int,
        kept_children: bytes | None,
        walk: _Walk,
    ) -> bytes | None:
        """Put the children of ``pid`` on the walk's stack; the content of its ``children``
        file if that was read (``kept_children``: the previous sample's, for an idle one)."""
        if walk.by_membership:
            return None  # every member is on the stack already
        if thread_count != 1 or walk.children_of is not None:
            walk.stack.extend(self._children(pid, walk))
            return None
        children = kept_children if kept_children is not None else read_children(base, pid, files)
        if children:  # most processes of a tree are leaves
            walk.stack.extend(map(int, children.split()))
        return children

    def _describe(self, base: str, name: bytes) -> tuple[list[str] | None, Any]:
        """A process's command line and its part in a distributed run."""
        cmdline = self._read_cmdline(base)
        return cmdline, self._read_role(base, name, cmdline)

    def _cpu_percent(
        self, pid: int, start_ticks: int, cpu_ticks: int, read_at: float, walk: _Walk
    ) -> float | None:
        """The process's CPU since the previous sample (None the first time); its ticks since
        then go to the tree's total."""
        previous = self._history.get(pid)
        if previous is not None and previous[0] == start_ticks:
            walk.cpu_ticks += cpu_ticks - previous[1]
            if read_at > previous[2]:
                # _percent inlined: one call fewer per process.
                return round(
                    100.0 * (cpu_ticks - previous[1]) / CLOCK_TICKS / (read_at - previous[2]), 2
                )
        elif walk.previous_walk is not None and start_ticks / CLOCK_TICKS >= walk.previous_walk:
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

    def _children(self, pid: int, walk: _Walk) -> list[int]:
        """Children of ``pid`` from each thread's ``children`` file: a child belongs to the
        thread that forked it."""
        if walk.children_of is not None:
            return walk.children_of.get(pid, [])
        task = f"{self._proc}/{pid}/task/"
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

    def _scan_parents(self) -> dict[int, list[int]]:
        """parent pid -> children, for every process on the machine."""
        children_of: dict[int, list[int]] = {}
        for name in os.listdir(self._proc):
            if not name.isdigit():
                continue
            try:
                stat = read_proc_file(f"{self._proc}/{name}/stat", one_piece=True)
            except VANISHED:
                continue
            ppid = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])
            children_of.setdefault(ppid, []).append(int(name))
        return children_of

    def _read_cmdline(self, base: str) -> list[str] | None:
        try:
            data = read_proc_file(base + "cmdline")
        except PermissionError:
            return None
        if not data:
            return []  # a zombie's, or one that cleared its own
        # Each argument ends with a NUL; an empty last argument is a NUL of its own.
        args = data[:-1] if data.endswith(b"\0") else data
        return self._masker.argv(arg.decode(errors="replace") for arg in args.split(b"\0"))

    def _read_role(self, base: str, name: bytes, cmdline: list[str] | None) -> Any:
        """A new process's part in a distributed run (see
        :func:`asyncsoak._process._ranks.role`): its rank from a bounded read of its environment,
        once (an environment does not change)."""
        text = name.decode("utf-8", "replace")
        if launcher_of(text, cmdline) is not None:
            return role(text, cmdline, None)
        try:
            rank = parse_rank_environ(read_environ(base + "environ"))
        except OSError:
            # Another user's (EACCES), or gone since its stat was read: no rank to tell.
            rank = None
        return role(text, cmdline, rank)

    def _read_machine_files(self) -> tuple[bytes, bytes, bytes]:
        """/proc/stat, meminfo and loadavg: kept open on the real /proc, as a process's."""
        if self._open_files is None:
            stat, meminfo, loadavg = (
                read_proc_file(p, one_piece=True) for p in self._machine_paths
            )
            return stat, meminfo, loadavg
        if self._machine_fds is None:
            self._machine_fds = [
                os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in self._machine_paths
            ]
        stat, meminfo, loadavg = (pread_all(fd) for fd in self._machine_fds)
        return stat, meminfo, loadavg

    def _read_machine(self) -> MachineFigures:
        machine_stat, meminfo_file, loadavg = self._read_machine_files()
        cpu_line = machine_stat[: machine_stat.find(b"\n")]
        # user nice system idle iowait irq softirq steal (guest time is inside user and nice)
        ticks = list(map(int, cpu_line.split()[1:9]))
        total = sum(ticks)
        busy = total - ticks[3] - ticks[4]
        cpu: float | None = None
        if self._previous_machine_cpu is not None:
            previous_busy, previous_total = self._previous_machine_cpu
            if total > previous_total:
                cpu = _percent(busy - previous_busy, total - previous_total)
        self._previous_machine_cpu = (busy, total)

        # A leading newline lets every key be found as "\nKey:", the first one too.
        meminfo = b"\n" + meminfo_file
        mem_total = _meminfo_bytes(meminfo, b"\nMemTotal:")
        mem_available = _meminfo_bytes(meminfo, b"\nMemAvailable:")
        mem_used = mem_percent = None
        if mem_total and mem_available is not None:
            mem_used = mem_total - mem_available
            mem_percent = _percent(mem_used, mem_total)
        swap_total = _meminfo_bytes(meminfo, b"\nSwapTotal:")
        swap_free = _meminfo_bytes(meminfo, b"\nSwapFree:")
        swap_used = swap_percent = None
        if swap_total is not None and swap_free is not None:
            swap_used = swap_total - swap_free
            swap_percent = _percent(swap_used, swap_total) if swap_total else 0.0

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


def _meminfo_bytes(meminfo: bytes, needle: bytes) -> int | None:
    """The value of ``needle`` (``b"\\nKey:"``) in kB, as bytes."""
    # Four lookups by name in ~50 lines: find() beats splitting every line.
    at = meminfo.find(needle)
    if at < 0:
        return None
    start = at + len(needle)
    return int(meminfo[start : meminfo.index(b"kB", start)]) * 1024


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


#: Where POSIX shared memory lives (``shm_open``, a data loader's segments).
SHM_DIR = "/dev/shm"


def _shm_used_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _read_disk(path: Path) -> DiskFigures:
    try:
        st = os.statvfs(path)
    except FileNotFoundError:
        # The progress directory may not exist yet: its filesystem is its nearest parent's.
        existing = path.absolute().parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            st = os.statvfs(existing)
        except OSError:
            return DiskFigures(path=str(path), free_bytes=None, percent_used=None)
    except OSError:
        return DiskFigures(path=str(path), free_bytes=None, percent_used=None)
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    # As df and psutil: the share of what an unprivileged user could fill.
    percent = _percent(used, used + free) if used + free else 0.0
    return DiskFigures(path=str(path), free_bytes=free, percent_used=percent)


@dataclass(slots=True)
class _TickOutcome:
    """What one tick's job did, filled in as it goes (a job that hangs leaves it half done)."""

    rides: list[Ride[Any]]
    #: Whether the read returned (with a sample, or None when another read was under way).
    read: bool = False
    sample: ProcSample | None = None
    error: Exception | None = None


def _tick_job(
    sampler: ProcSampler, rides: Rides | None, start: float
) -> Callable[[float, dict[str, Any]], _TickOutcome]:
    """The job of each tick, in the ticker's thread: the rides posted by then are taken and
    run (the watchdog's scan, then the journal's write), then the tree is read.  The rides go
    first: a read of a huge tree on a starved machine can take seconds, and neither the scan
    (the stall rules) nor the journal may wait behind it."""

    def job(_tick: float, partial: dict[str, Any]) -> _TickOutcome:
        outcome = partial["outcome"] = _TickOutcome(rides.take() if rides is not None else [])
        for ride in outcome.rides:
            ride.run()
        try:
            outcome.sample = sampler.read(time.monotonic() - start)
            outcome.read = True
        except Exception as exc:
            outcome.error = exc
        return outcome

    return job


async def run_proc_sampler(
    sink: EventSink,
    *,
    root_pid: int,
    interval: float,
    disk_paths: Mapping[str, Path],
    detailed_memory: bool = False,
    on_tree: Callable[[frozenset[int]], None] | None = None,
    masker: Masker | None = None,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    proc: Path = PROC,
    rides: Rides | None = None,
    ticks: TickSignal | None = None,
    members_file: str | None = None,
    tree_gone: anyio.Event | None = None,
    on_blind: Callable[[str, str], Awaitable[None]] | None = None,
    blind_after: float | None = None,
) -> None:
    """Offer a :class:`ProcSample` every ``interval`` seconds until cancelled, or until the
    tree is gone (``tree_gone`` set, and a read finds it empty).

    A sampler that has had no sample for ``blind_after`` seconds (default
    :func:`blind_limit`), whatever the cause (reads that hang or fail, no thread to read in),
    calls ``on_blind("monitor_error", message)`` once: the soak fails closed.

    The tree is every descendant of ``root_pid`` (the soak's reaper), found afresh each time;
    ``on_tree`` then gets its pids.  USS and PSS are read only with ``detailed_memory``:
    ``smaps_rollup`` of a process holding a CUDA context can take long.  Command lines go
    through ``masker`` (URL passwords are redacted even without one).  An error is counted
    in ``sink.counters.sampler_errors`` and told once as a ``sampler_note``; a read that
    outlives ``read_timeout`` degrades the sampler until a read succeeds again.  Sampling
    goes on in every case.  The sampler owns ``sink`` (give it a clone) and closes it.

    The reads run on the soak's grid (start + k * interval) in the thread of a
    :class:`~asyncsoak._contract._blocking.Ticker`, which wakes the loop once per sample, and
    only once the loop has handled the last sample (a loop that falls behind skips ticks rather than
    queueing them).  The blocking calls posted to ``rides`` (the watchdog's scan, the
    journal's batched write) run in that thread before each read: no thread hop of their own,
    and none of them waits behind a slow read.  ``ticks`` is told once each sample has been
    handled (the GPU sampler reads its loops then, on the same wake-up).  ``members_file``
    gives the ``cgroup.procs`` of the tree's cgroup once there is one (see :class:`ProcSampler`).
    """
    async with sink:
        require_positive("interval", interval)
        require_positive("read_timeout", read_timeout)
        sampler = ProcSampler(
            root_pid,
            disk_paths=disk_paths,
            detailed_memory=detailed_memory,
            proc=proc,
            masker=masker,
            members_file=members_file,
        )
        job = _tick_job(sampler, rides, sink.clock.start)
        # The files kept open are closed however the sampler ends.
        with contextlib.closing(sampler):
            ticker = Ticker(job, start=sink.clock.start, interval=interval, more_time=_rides_time)
            async with ticker:
                await _sample_on_ticks(
                    sink,
                    ticker,
                    sampler,
                    rides,
                    ticks,
                    on_tree=on_tree,
                    read_timeout=read_timeout,
                    tree_gone=tree_gone,
                    on_blind=on_blind,
                    blind_after=blind_limit(interval) if blind_after is None else blind_after,
                )


def _rides_time(partial: dict[str, Any]) -> float:
    """The bounds of the rides a tick's job took: its deadline grows by them."""
    outcome: _TickOutcome | None = partial.get("outcome")
    return sum(ride.timeout for ride in outcome.rides) if outcome is not None else 0.0


async def _sample_on_ticks(
    sink: EventSink,
    ticker: Ticker[_TickOutcome],
    sampler: ProcSampler,
    rides: Rides | None,
    ticks: TickSignal | None,
    *,
    on_tree: Callable[[frozenset[int]], None] | None,
    read_timeout: float,
    tree_gone: anyio.Event | None,
    on_blind: Callable[[str, str], Awaitable[None]] | None,
    blind_after: float,
) -> None:
    """Hand each tick's sample to the sink, telling what goes wrong, until cancelled or the
    tree is gone; past ``blind_after`` seconds without a sample, call ``on_blind``."""
    handling = _TickHandling(
        sink,
        sampler,
        on_tree=on_tree,
        read_timeout=read_timeout,
        tree_gone=tree_gone,
        on_blind=on_blind,
        blind_after=blind_after,
    )
    while True:
        outcome, ride_hung = await _next_tick(ticker, read_timeout)
        if await handling.handle(outcome, ride_hung):
            return
        if ticks is not None:
            ticks.notify()


async def _next_tick(
    ticker: Ticker[_TickOutcome], read_timeout: float
) -> tuple[_TickOutcome | None, bool]:
    """What the next tick's job did (None if it had not begun by ``read_timeout``), and
    whether one of its rides hung."""
    try:
        return await ticker.next(timeout=read_timeout), False
    except TickTimeout as exc:
        outcome: _TickOutcome | None = exc.partial.get("outcome")
        # A ride that hung (the rides run before the read) is its rider's to tell; the
        # next tick's read, in a new thread, is not held up by it.
        return outcome, outcome is not None and not all(ride.finished for ride in outcome.rides)


class _TickHandling:
    """What the sampler's task does with each tick: the sample handed to the sink, the
    sampler degraded (reads that hang) and recovered, an error told once (then counted),
    and a sampler without samples for too long told once as blind."""

    def __init__(
        self,
        sink: EventSink,
        sampler: ProcSampler,
        *,
        on_tree: Callable[[frozenset[int]], None] | None,
        read_timeout: float,
        tree_gone: anyio.Event | None,
        on_blind: Callable[[str, str], Awaitable[None]] | None,
        blind_after: float,
    ) -> None:
        self.sink = sink
        self.sampler = sampler
        self.on_tree = on_tree
        self.read_timeout = read_timeout
        self.tree_gone = tree_gone
        self.on_blind = on_blind
        self.blind_after = blind_after
        self.error_told = False
        self.degraded = False
        self.blind_told = False
        self.last_sample_at = sink.elapsed()

    async def handle(self, outcome: _TickOutcome | None, ride_hung: bool) -> bool:
        """Handle one tick; True when the tree is gone (the sampler is done)."""
        sampled = False
        try:
            if outcome is not None:
                for ride in outcome.rides:
                    if ride.finished:
                        ride.mark_done()
                if outcome.error is not None:
                    raise outcome.error
            sample = outcome.sample if outcome is not None else None
            gone = self.tree_gone is not None and self.tree_gone.is_set()
            if sample is not None and not sample.processes and gone:
                # Read after the reaper's last child went: an empty tree, not a sample of the
                # run (its "0 processes" would end every series), and the last there is.
                return True
            busy = outcome is not None and outcome.read and sample is None
            if sample is not None:
                sampled = True
                await self._deliver(sample)
            elif not busy and not self.degraded and not ride_hung:
                await self._degrade()
        except Exception as exc:
            await self._count_error(exc)
        await self._tell_if_blind(sampled)
        return False

    async def _deliver(self, sample: ProcSample) -> None:
        sink = self.sink
        if self.degraded:
            self.degraded = False
            await sink.emit(SamplerRecovered(sink.elapsed(), SAMPLER_NAME, "/proc reads are back"))
        if sink.waiting() >= SAMPLES_BEHIND:
            # The ticker waits for this task, not for the serializer: while the serializer
            # is behind (a huge tree, a starved machine), a new sample is dropped and
            # counted, never queued up behind it.
            sink.counters.dropped_samples += 1
            self.sampler.forget_descriptions(sample)
        elif not sink.offer(sample):
            self.sampler.forget_descriptions(sample)
        if self.on_tree is not None:
            self.on_tree(sample.pids)

    async def _degrade(self) -> None:
        # The thread is abandoned, not stopped: the next reads return None at once until it
        # comes back, so stuck threads never pile up.
        self.degraded = True
        self.sink.counters.sampler_errors += 1
        await self.sink.emit(
            SamplerDegraded(
                self.sink.elapsed(),
                SAMPLER_NAME,
                f"reading /proc took more than {self.read_timeout:g} s; "
                "skipping samples until it returns",
            )
        )

    async def _count_error(self, exc: Exception) -> None:
        self.sink.counters.sampler_errors += 1
        if self.error_told:
            return
        self.error_told = True
        await self.sink.emit(
            SamplerNote(
                self.sink.elapsed(),
                SAMPLER_NAME,
                f"proc sampler error (later ones are only counted): {exc!r}",
                {"error": repr(exc), "type": type(exc).__name__},
            )
        )

    async def _tell_if_blind(self, sampled: bool) -> None:
        now = self.sink.elapsed()
        if sampled:
            self.last_sample_at = now
            return
        if self.on_blind is None or self.blind_told or now - self.last_sample_at < self.blind_after:
            return
        self.blind_told = True
        await self.on_blind(
            "monitor_error",
            f"the proc sampler had no sample of the process tree for "
            f"{now - self.last_sample_at:.1f}s (reads that hang or fail, or no thread to read "
            "in): the run was not being watched",
        )
