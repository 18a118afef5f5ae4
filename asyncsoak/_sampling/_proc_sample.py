"""The proc sampler's sample: the figures of each process, the tree, the machine and its disks,
built whole in the thread that read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .._contract import events

# States worth a line in the artifact's summary: a process stuck on IO, unreaped or stopped.
_NOTABLE_STATES = frozenset({"disk-sleep", "zombie", "stopped", "tracing-stop"})


def percent_of(part: float, whole: float) -> float:
    """Two decimals: more than /proc's precision, and the journal stays short."""
    return round(100.0 * part / whole, 2)


# The figures are not frozen: one is built for every process (and the tree's, the machine's,
# each disk's) at every sample, and a frozen dataclass's __init__ costs several times as much
# (benchmarks/proc_sampling.py).  Nobody changes them once built.
@dataclass(slots=True)
class ProcessFigures:
    """One process of the tree.  ``cmdline`` only the first time the process is sampled."""

    #: A sleeping process's figures are given again sample after sample: their JSON form too.
    JSON_AGAIN: ClassVar[bool] = True

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


class ProcSample(events.Event):
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

    def series_points(self) -> events.SeriesPoints:
        tree, machine = self.tree, self.machine
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
        if tree.pss_bytes is not None:  # --detailed-memory
            tree_points["pss_bytes"] = tree.pss_bytes
            tree_points["anon_pss_bytes"] = tree.anon_pss_bytes
        return {"tree": tree_points, "machine": machine_points}

    def summary_labels(self) -> events.SummaryLabels:
        notable = sorted({p.state for p in self.processes} & _NOTABLE_STATES)
        return {"tree": {"process_states": notable}} if notable else {}
