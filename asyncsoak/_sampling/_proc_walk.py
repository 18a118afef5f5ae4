"""A reading's walk down the tree: what it gathers on its way, and where it finds each process's
children (its threads' ``children`` files, or a scan of every process's parent)."""

from __future__ import annotations

import os

from ._proc_sample import ProcessFigures
from ._procfs import VANISHED, read_proc_file

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
