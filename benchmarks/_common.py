"""What the benchmarks share: figures and sections, medians and percentiles, CPU clocks of
other processes, soak children that record their own times.

Every comparison is a ratio of medians taken in one process in one run; every latency is a
p50 and a p95 over at least 20 runs (fewer with ``--quick``, which is only a smoke run).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Figure:
    """One measured figure, its reference in the same run, and the target it is held to."""

    name: str
    value: float
    unit: str
    #: What ``ratio`` divides by, in words ("floor", "psrecord", "one core").
    reference: str = ""
    ratio: float | None = None
    #: The target in words ("<= 2x floor"); empty for figures given for context.
    target: str = ""
    met: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "reference": self.reference,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


@dataclass
class Section:
    """The figures of one benchmark item."""

    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def note(self, text: str) -> None:
        self.notes.append(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "figures": [f.to_json() for f in self.figures],
            "notes": self.notes,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        return cls(
            key=data["key"],
            title=data["title"],
            figures=[Figure(**f) for f in data["figures"]],
            notes=list(data["notes"]),
            seconds=float(data.get("seconds", 0.0)),
        )


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def thread_cpu_seconds(pid: int) -> float:
    """CPU time of a living process's threads at nanosecond resolution (``schedstat``).

    Threads that ended are not counted: use it for processes whose threads live on.
    """
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            continue
    return total / 1e9


def process_cpu_seconds(pid: int) -> float:
    """CPU time of a whole process by the scheduler's clock (nanoseconds, every thread,
    threads that already ended included): the process's CPU-time clock, readable for any
    process (``clock_getcpuclockid``'s clock id, built as glibc builds it)."""
    return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the process


def tick_cpu_seconds(pid: int) -> float:
    """``utime + stime`` of ``/proc/PID/stat``: the tick-based figure, kept for comparison
    (a short wake-up that meets a tick is charged a whole tick, one that does not, nothing)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def voluntary_switches(pid: int) -> int:
    """Times the process's live threads went to sleep and were woken (wake-ups)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue  # a thread that just ended
    return total


def python_child(code: str, *args: str) -> list[str]:
    """argv of a Python child running ``code`` (dedented)."""
    return [sys.executable, "-c", textwrap.dedent(code), *args]


#: A soak's command for the latency benchmarks: ``root`` forks ``size - 1`` children (all in
#: its process group, as a trainer's workers are), appends to the progress file ``writes``
#: times, records (monotonic clock) when it started and when its last write returned into
#: the stamp file, then waits for a signal.  ``ignore_term``: every process ignores SIGTERM.
STALLING_TREE = r"""
import json, os, signal, sys, time
started = time.monotonic()
progress, stamp, size, writes, ignore_term = sys.argv[1:6]
size, writes = int(size), int(writes)
if ignore_term == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
for _ in range(size - 1):
    if os.fork() == 0:
        os.close(r)
        os.write(w, b".")
        os.close(w)
        while True:
            signal.pause()
os.close(w)
got = 0
while got < size - 1:
    got += len(os.read(r, 65536))
last = None
if writes:
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for i in range(writes):
        os.write(fd, b'{"step": %d}\n' % i)
        last = time.monotonic()
        if i + 1 < writes:
            time.sleep(0.02)
    os.close(fd)
with open(stamp + ".tmp", "w") as f:
    json.dump({"started": started, "last_write": last, "pid": os.getpid()}, f)
os.rename(stamp + ".tmp", stamp)
while True:
    signal.pause()
"""


def stalling_tree(
    progress_file: Path, stamp: Path, *, size: int, writes: int, ignore_term: bool = False
) -> list[str]:
    return python_child(
        STALLING_TREE,
        str(progress_file),
        str(stamp),
        str(size),
        str(writes),
        "1" if ignore_term else "0",
    )


def read_stamp(stamp: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(stamp.read_text())
    return data


def events_of(artifact: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in artifact["events"] if e.get("kind") == kind]
