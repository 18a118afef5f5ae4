"""A labelled corpus of memory shapes that real training makes, as real process trees.

Each shape is a :class:`Plan`: what every process of the tree keeps, as piecewise-linear
curves of the time since the run's start, drawn from a seeded ``random.Random``.  A plan is
defined once and used twice: run as a script, this file *is* the tree (it forks the plan's
processes and makes each one's memory follow its curves); the leak corpus benchmark reads the
same plan to simulate the samples the soak would take of it.

    python tests/leak_corpus.py late_leak --seed 0 --duration 60 --progress DIR

Anonymous memory is private anonymous ``mmap`` blocks with every page written (a block is
returned to the kernel the moment it is closed, whatever malloc's thresholds), file-backed
memory is pages of a mapped file read one by one, shared memory is files in ``/dev/shm``.  The
main process appends a line to ``DIR/metrics.jsonl`` at each step (several a second), so the
soak sees progress.  Every process prints ``ready ROLE PID`` when it starts.

Sizes are the same at every duration (a plan is drawn in fractions of the run), so the rates
quoted below are for a 60 s run.  The peaks stay under about 0.7 GiB of anonymous memory per
shape, and 1 GiB of file-backed pages for the mapped reader.

Standard library only: the child runs under any interpreter the test runs.
"""

from __future__ import annotations

import argparse
import bisect
import mmap
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MiB = 2**20
PAGE = mmap.PAGESIZE
#: The file the mapped reader streams and the page-cache reader reads (``--data``).
DATA_BYTES = 2**30
#: Shared-memory segments left in ``/dev/shm`` by ``shm_leak``, each this large.
SHM_SEGMENT_BYTES = 4 * MiB
#: Steps a second of every shape but the step-proportional one (a line each).
STEPS_PER_SECOND = 5.0
#: What every process keeps from the start beyond its interpreter (its working set).
WORKING_SET = 16 * MiB

Label = Literal["leak", "stable"]


@dataclass(frozen=True, slots=True)
class Curve:
    """A piecewise-linear function of time through ``corners`` ``(t, value)``, sorted by t.

    Flat before the first corner and after the last; two corners at one time are a jump.
    """

    corners: tuple[tuple[float, float], ...]

    def at(self, t: float) -> float:
        times = [c[0] for c in self.corners]
        i = bisect.bisect_right(times, t)
        if i == 0:
            return self.corners[0][1]
        if i == len(times):
            return self.corners[-1][1]
        (t0, v0), (t1, v1) = self.corners[i - 1], self.corners[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    @property
    def peak(self) -> float:
        return max(v for _, v in self.corners)


def flat(value: float = 0.0) -> Curve:
    return Curve(((0.0, value),))


@dataclass(frozen=True, slots=True)
class Process:
    """One process of the tree: when it lives and what it keeps (beyond its interpreter)."""

    role: str
    #: The role of the process that forks it; None for the main process (the command).
    parent: str | None
    born: float
    #: When it exits; None: at the end of the run.
    dies: float | None
    #: Bytes of anonymous memory kept.
    anon: Curve
    #: Bytes of the data file mapped and touched (file-backed pages, never a leak).
    file: Curve = field(default_factory=flat)


@dataclass(frozen=True, slots=True)
class Tree:
    """What a shape draws: every process's memory, the steps, the memory outside processes."""

    #: The main process first, then the others in the order they are born.
    processes: tuple[Process, ...]
    #: Steps taken so far (the main process writes a progress line per step).
    steps: Curve
    #: Bytes left in ``/dev/shm`` segments.
    shm: Curve = field(default_factory=flat)
    #: Bytes of the data file read through the page cache (``read``, not mapped).
    reads: Curve = field(default_factory=flat)
    #: The role whose own memory leaks; None for stable shapes and for a leak that is in no
    #: process's memory (``/dev/shm``).
    leaker: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """One shape drawn for one seed and duration: its label and its tree."""

    shape: str
    label: Label
    seed: int
    duration: float
    tree: Tree

    def process(self, role: str) -> Process:
        return next(p for p in self.tree.processes if p.role == role)

    @property
    def needs_data(self) -> bool:
        return any(p.file.peak for p in self.tree.processes) or bool(self.tree.reads.peak)

    @property
    def machine_wide(self) -> bool:
        """Whether it leaks where only the machine's figures see it (``/dev/shm``)."""
        return bool(self.tree.shm.peak)


def steady_steps(duration: float) -> Curve:
    return Curve(((0.0, 0.0), (duration, STEPS_PER_SECOND * duration)))


def main_process(anon: Curve, file: Curve | None = None) -> Process:
    return Process("main", None, 0.0, None, anon, file or flat())


def _steady_leak(rng: random.Random, d: float) -> Tree:
    """Anonymous memory grows linearly all run (about 5 MiB/s)."""
    growth = rng.uniform(280, 360) * MiB
    anon = Curve(((0.0, WORKING_SET), (d, WORKING_SET + growth)))
    return Tree((main_process(anon),), steady_steps(d), leaker="main")


def _short_fast_leak(rng: random.Random, d: float) -> Tree:
    """Anonymous memory grows linearly all run, 400 MiB (10 MiB/s over a 40 s run): at the
    default 5 s interval too few samples for the leak check to judge."""
    anon = Curve(((0.0, WORKING_SET), (d, WORKING_SET + 400 * MiB)))
    return Tree((main_process(anon),), steady_steps(d), leaker="main")


def _late_leak(rng: random.Random, d: float) -> Tree:
    """Flat, then a leak of about 8 MiB/s from about 40 % of the run until the end."""
    working = rng.uniform(60, 100) * MiB
    start = d * rng.uniform(0.38, 0.42)
    growth = rng.uniform(260, 320) * MiB
    anon = Curve(((0.0, working), (start, working), (d, working + growth)))
    return Tree((main_process(anon),), steady_steps(d), leaker="main")


def _step_proportional_leak(rng: random.Random, d: float) -> Tree:
    """1 MiB kept per step; the step rate halves after a third of the run, then doubles to
    twice the first rate after two thirds (a machine whose load changed: slow, then fast)."""
    slow_from = d * rng.uniform(0.30, 0.36)
    fast_from = d * rng.uniform(0.60, 0.66)
    total = rng.uniform(260, 320)
    rate = total / (slow_from + (fast_from - slow_from) / 2 + 2 * (d - fast_from))
    at_slow = rate * slow_from
    at_fast = at_slow + rate / 2 * (fast_from - slow_from)
    steps = Curve(((0.0, 0.0), (slow_from, at_slow), (fast_from, at_fast), (d, total)))
    anon = Curve(tuple((t, WORKING_SET + v * MiB) for t, v in steps.corners))
    return Tree((main_process(anon),), steps, leaker="main")


def _late_grandchild_leak(rng: random.Random, d: float) -> Tree:
    """A worker forked at the start forks a grandchild at about 40 % that leaks about
    8 MiB/s until the end; the main process and the worker hold steady."""
    start = d * rng.uniform(0.38, 0.42)
    growth = rng.uniform(260, 320) * MiB
    processes = (
        main_process(flat(WORKING_SET)),
        Process("worker", "main", 0.0, None, flat(8 * MiB)),
        Process("grandchild", "worker", start, None, Curve(((start, 0.0), (d, growth)))),
    )
    return Tree(processes, steady_steps(d), leaker="grandchild")


def _shm_leak(rng: random.Random, d: float) -> Tree:
    """Shared-memory segments written to ``/dev/shm`` and never unlinked, growing steadily
    (a data loader's segments): in no process's memory once closed, but memory all the same."""
    growth = rng.uniform(260, 320) * MiB
    shm = Curve(((0.0, 0.0), (d, growth)))
    return Tree((main_process(flat(WORKING_SET)),), steady_steps(d), shm=shm)


def _mmap_stream(rng: random.Random, d: float) -> Tree:
    """A dataset streamed through ``mmap`` (Arrow, ``np.memmap``): file-backed pages rise all
    run, clean and reclaimable; anonymous memory holds steady."""
    streamed = DATA_BYTES * rng.uniform(0.85, 1.0)
    file = Curve(((0.0, 0.0), (d, streamed)))
    return Tree((main_process(flat(WORKING_SET), file),), steady_steps(d))


def _page_cache(rng: random.Random, d: float) -> Tree:
    """The data file read again and again with ``read``: the page cache fills, the process's
    own memory does not."""
    reads = Curve(((0.0, 0.0), (d, DATA_BYTES * rng.uniform(1.5, 2.5))))
    return Tree((main_process(flat(WORKING_SET)),), steady_steps(d), reads=reads)


def _ramp_plateau(rng: random.Random, d: float) -> Tree:
    """A caching allocator's warm-up: four steps of about 160 MiB in the first 40 % of the
    run (each over a second or two), then flat."""
    corners = [(0.0, float(WORKING_SET))]
    level = float(WORKING_SET)
    for i in range(4):
        at = d * (0.04 + 0.09 * i + rng.uniform(0.0, 0.03))
        level += rng.uniform(140, 180) * MiB
        corners += [(at, corners[-1][1]), (at + d * 0.02, level)]
    return Tree((main_process(Curve(tuple(corners))),), steady_steps(d))


def _sawtooth(rng: random.Random, d: float) -> Tree:
    """Allocate steadily, then free it all, five to seven times a run."""
    teeth = rng.randint(5, 7)
    period = d / teeth
    height = rng.uniform(150, 250) * MiB
    corners = [(0.0, float(WORKING_SET))]
    for k in range(teeth):
        top = (k + 1) * period
        corners += [(top, WORKING_SET + height), (top, float(WORKING_SET))]
    return Tree((main_process(Curve(tuple(corners))),), steady_steps(d))


def _one_step(rng: random.Random, d: float) -> Tree:
    """One large allocation, kept to the end, between 20 % and 45 % of the run."""
    at = d * rng.uniform(0.20, 0.45)
    size = rng.uniform(300, 450) * MiB
    anon = Curve(((0.0, WORKING_SET), (at, WORKING_SET), (at, WORKING_SET + size)))
    return Tree((main_process(anon),), steady_steps(d))


def _fork_storm(rng: random.Random, d: float) -> Tree:
    """Short-lived workers forked continually (a few a second), each keeping 16-48 MiB for
    half a second to a second and a half, then exiting."""
    workers: list[Process] = []
    born = rng.uniform(0.1, 0.3)
    while born < d - 2.0:
        size = rng.uniform(16, 48) * MiB
        life = rng.uniform(0.6, 1.5)
        workers.append(
            Process(f"fork{len(workers)}", "main", born, born + life, Curve(((born, size),)))
        )
        born += rng.uniform(0.2, 0.4)
    return Tree(
        (main_process(flat(WORKING_SET)), *workers),
        steady_steps(d),
    )


def _rss_drop(rng: random.Random, d: float) -> Tree:
    """A large allocation at the start, mostly freed between 30 % and 45 % of the run, as a
    process that frees (or is swapped out) does: memory falls, then holds."""
    big = WORKING_SET + rng.uniform(350, 450) * MiB
    kept = WORKING_SET + rng.uniform(20, 60) * MiB
    drop = d * rng.uniform(0.30, 0.45)
    anon = Curve(((0.0, WORKING_SET), (d * 0.05, big), (drop, big), (drop, kept)))
    return Tree((main_process(anon),), steady_steps(d))


#: Every shape by name, leaks first: its label and how its tree is drawn.
SHAPES: dict[str, tuple[Label, Callable[[random.Random, float], Tree]]] = {
    "steady_leak": ("leak", _steady_leak),
    "late_leak": ("leak", _late_leak),
    "short_fast_leak": ("leak", _short_fast_leak),
    "step_proportional_leak": ("leak", _step_proportional_leak),
    "late_grandchild_leak": ("leak", _late_grandchild_leak),
    "shm_leak": ("leak", _shm_leak),
    "mmap_stream": ("stable", _mmap_stream),
    "page_cache": ("stable", _page_cache),
    "ramp_plateau": ("stable", _ramp_plateau),
    "sawtooth": ("stable", _sawtooth),
    "one_step": ("stable", _one_step),
    "fork_storm": ("stable", _fork_storm),
    "rss_drop": ("stable", _rss_drop),
}


def plan(shape: str, seed: int, duration: float) -> Plan:
    """The plan of ``shape`` for ``seed`` over a run of ``duration`` seconds (at least 10)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    if duration < 10:
        raise ValueError(f"duration must be at least 10 s, got {duration:g}")
    label, draw = SHAPES[shape]
    # A string seed: the same draw in every process, whatever PYTHONHASHSEED.
    tree = draw(random.Random(f"{shape}:{seed}"), float(duration))
    return Plan(shape, label, seed, float(duration), tree)


def write_data_file(path: Path, size: int = DATA_BYTES) -> None:
    """The data file of the readers: ``size`` bytes really written (no holes), once."""
    if path.exists() and path.stat().st_size == size:
        return
    chunk = (b"asyncsoak leak corpus data\n" * (MiB // 27 + 1))[:MiB]
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        for _ in range(size // MiB):
            f.write(chunk)
    partial.replace(path)


# -- the child ------------------------------------------------------------------------------


class AnonymousMemory:
    """Private anonymous blocks, every page written: what ``RssAnon`` counts."""

    def __init__(self) -> None:
        self._blocks: list[mmap.mmap] = []
        self.held = 0

    def hold(self, target: float) -> None:
        """Keep about ``target`` bytes: free the newest blocks, or add one (1 MiB grain)."""
        while self._blocks and self.held > target:
            block = self._blocks.pop()
            self.held -= len(block)
            block.close()
        missing = int(target - self.held) // MiB * MiB
        if missing > 0:
            block = mmap.mmap(-1, missing, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            block[::PAGE] = b"\x01" * len(range(0, missing, PAGE))
            self._blocks.append(block)
            self.held += missing

    def drop_inherited(self) -> None:
        """In a forked child: let go of the parent's blocks (the parent keeps them)."""
        for block in self._blocks:
            block.close()
        self._blocks.clear()
        self.held = 0


class MappedFile:
    """The data file mapped read-only, touched page by page from its start."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.touched = 0

    def touch(self, target: float) -> None:
        end = min(len(self._map), int(target) // PAGE * PAGE)
        if end > self.touched:
            self._map[self.touched : end : PAGE]  # reading one byte per page faults it in
            self.touched = end


class Reader:
    """The data file read with ``read``, round and round, into one reused buffer."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115  # read all run long
        self._buffer = bytearray(MiB)
        self.read = 0

    def read_until(self, target: float) -> None:
        while self.read < target:
            n = self._file.readinto(self._buffer)
            if not n:
                self._file.seek(0)
                continue
            self.read += n


class SharedSegments:
    """Files in ``/dev/shm`` written and closed, never unlinked: a leak of shared memory."""

    def __init__(self, prefix: str, directory: Path = Path("/dev/shm")) -> None:
        self._prefix = directory / prefix
        self.left = 0

    def grow(self, target: float) -> None:
        while self.left + SHM_SEGMENT_BYTES <= target:
            fd = os.open(
                f"{self._prefix}-{self.left // SHM_SEGMENT_BYTES}",
                os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                0o600,
            )
            try:
                os.write(fd, b"\x01" * SHM_SEGMENT_BYTES)
            finally:
                os.close(fd)
            self.left += SHM_SEGMENT_BYTES


@dataclass
class Child:
    """What one process of the running tree needs: the plan and where things are."""

    plan: Plan
    origin: float
    tick: float
    progress: Path
    data: Path | None
    shm_prefix: str
    memory: AnonymousMemory = field(default_factory=AnonymousMemory)

    def now(self) -> float:
        return time.monotonic() - self.origin

    def live(self, role: str) -> None:
        """Be ``role`` until it dies (or the run ends), forking its own children on time."""
        me = self.plan.process(role)
        end = self.plan.duration if me.dies is None else me.dies
        tree = self.plan.tree
        children = [p for p in tree.processes if p.parent == role]
        forked: list[int] = []
        mapped = MappedFile(self.data) if self.data and me.file.peak else None
        main = role == "main"
        reader = Reader(self.data) if main and self.data and tree.reads.peak else None
        shm = SharedSegments(self.shm_prefix) if main and tree.shm.peak else None
        steps_written = 0
        print(f"ready {role} {os.getpid()}", flush=True)
        while (now := self.now()) < end:
            while children and children[0].born <= now:
                pid = self._fork(children.pop(0))
                forked.append(pid)
            self.memory.hold(me.anon.at(now))
            if mapped is not None:
                mapped.touch(me.file.at(now))
            if main:
                if reader is not None:
                    reader.read_until(tree.reads.at(now))
                if shm is not None:
                    shm.grow(tree.shm.at(now))
                steps = int(tree.steps.at(now))
                if steps > steps_written:
                    with open(self.progress / "metrics.jsonl", "a") as f:
                        f.writelines(
                            f'{{"step": {s}, "t": {now:.3f}}}\n'
                            for s in range(steps_written, steps)
                        )
                    steps_written = steps
            forked = [pid for pid in forked if not _reaped(pid)]
            wake = min([end, now + self.tick, *(c.born for c in children[:1])])
            time.sleep(max(0.0, wake - self.now()))
        for pid in forked:
            os.waitpid(pid, 0)  # every child's plan ends by the run's end: bounded

    def _fork(self, process: Process) -> int:
        sys.stdout.flush()
        pid = os.fork()
        if pid:
            return pid
        # The child: a process of its own plan, never back into the parent's loop.
        code = 0
        try:
            self.memory.drop_inherited()
            self.live(process.role)
        except BaseException:
            code = 1
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)


def _reaped(pid: int) -> bool:
    done, _ = os.waitpid(pid, os.WNOHANG)
    return done == pid


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (at least 10)")
    parser.add_argument("--tick", type=float, default=0.2, help="seconds between updates")
    parser.add_argument("--progress", type=Path, required=True, help="the progress directory")
    parser.add_argument("--data", type=Path, help="the readers' data file (made if missing)")
    parser.add_argument("--shm-prefix", default=None, help="name prefix of /dev/shm segments")
    args = parser.parse_args(argv)
    if not 0 < args.tick <= 1:
        parser.error(f"--tick must be in (0, 1] seconds, got {args.tick:g}")
    try:
        drawn = plan(args.shape, args.seed, args.duration)
    except ValueError as exc:
        parser.error(str(exc))
    if drawn.needs_data:
        if args.data is None:
            parser.error(f"{args.shape} reads a data file: give --data FILE")
        write_data_file(args.data)
    args.progress.mkdir(parents=True, exist_ok=True)
    child = Child(
        drawn,
        origin=time.monotonic(),
        tick=args.tick,
        progress=args.progress,
        data=args.data,
        shm_prefix=args.shm_prefix or f"asyncsoak-corpus-{os.getpid()}",
    )
    child.live("main")
    return 0


if __name__ == "__main__":
    sys.exit(main())
