"""The leak corpus (``tests/leak_corpus.py``) under the soak: real runs, simulated samples, and
what either says, read one way.

A real run is ``run_soak`` of the corpus child; its journal is read back.  A simulated run is
the samples the proc sampler would have taken of a plan at a given interval, as the journal
holds them (``sample_events``): the leak corpus benchmark folds those into the soak's own
artifact builder and judge.  :func:`outcome` reads either the same way: whether the run was
flagged as leaking memory, when first, and in which words.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio

from asyncsoak import SoakFailureError, read_journal, run_soak

from .leak_corpus import MiB, Plan, Process, write_data_file

CHILD = Path(__file__).with_name("leak_corpus.py")
SHM = Path("/dev/shm")
#: The child's memory before it keeps anything: its interpreter (measured on CPython 3.11).
INTERPRETER_ANON = 8 * MiB
INTERPRETER_FILE = 6 * MiB
#: How much a simulated process's memory wanders between samples (Python's own heap).
NOISE_BYTES = 256 * 1024
#: Simulated pids: the reaper, then the plan's processes in order.
REAPER_PID = 40_000
#: A progress line of the child, in bytes (about).
LINE_BYTES = 24
GiB = 2**30
MACHINE_MEMORY = 24 * GiB
MACHINE_BASE_USED = 4 * GiB
SHM_BASE_USED = 8 * MiB
#: The leak_check modes the corpus is judged under.
Mode = Literal["warn", "fail"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a shape came to, read from its events (real or simulated)."""

    plan: Plan
    interval: float
    leak_check: Mode
    #: The first failure's reason; None when the run passed.
    failure: str | None
    #: Memory-leak warnings and ``memory_leak`` failure messages.
    leak_messages: tuple[str, ...]
    #: Every warning, for the record.
    warnings: tuple[str, ...]
    #: Seconds into the run the soak first said so (a ``trend`` event, a warning, a failure).
    flagged_at: float | None
    #: The pid of each role of the plan (the child's ``ready`` lines, or the simulation's).
    pids: dict[str, int]
    #: The memory series whose final verdict (the artifact's ``trends``) is ``leak``.
    final_leaks: tuple[str, ...] = ()

    @property
    def flagged(self) -> bool:
        return bool(self.leak_messages)

    def names(self, role: str) -> bool:
        """Whether a leak message names the pid of ``role``."""
        pid = self.pids.get(role)
        return pid is not None and any(re.search(rf"\bpid {pid}\b", m) for m in self.leak_messages)

    def problems(self) -> list[str]:
        """What is wrong with the verdict, given the shape's label; empty when it is right.

        A stable shape: no failure, no warning that memory leaks, no memory series judged a
        leak at the end.  A leak under ``warn``: the run passes with a warning that memory
        leaks, naming the leaking process's pid where one is to blame, and the artifact's
        trends say leak too (one verdict, live and final).  A leak under ``fail``: the
        failure ``memory_leak``; but a leak only the machine's figures see (segments left in
        ``/dev/shm``, which no process of the tree maps) is a warning in both modes: another
        process of the machine may own them.
        """
        wrong: list[str] = []
        if self.plan.label == "stable":
            if self.failure is not None:
                wrong.append(f"failed with {self.failure}")
            if self.leak_messages:
                wrong.append("warned that memory leaks")
            if self.final_leaks:
                wrong.append("a memory series is a leak in the final trends")
        elif self.leak_check == "fail" and not self.plan.machine_wide:
            if self.failure != "memory_leak":
                wrong.append(f"not stopped with memory_leak (failure: {self.failure})")
        else:
            leaker = self.plan.tree.leaker
            if self.failure is not None:
                wrong.append(f"failed with {self.failure}")
            if not self.flagged:
                wrong.append("no warning that memory leaks")
            elif leaker is not None and not self.names(leaker):
                wrong.append(f"no leak warning names the {leaker}'s pid {self.pids.get(leaker)}")
            if not self.final_leaks:
                wrong.append("no memory series is a leak in the final trends")
        return wrong

    def describe(self) -> str:
        when = "" if self.flagged_at is None else f" at {self.flagged_at:.0f} s"
        return (
            f"{self.plan.shape} ({self.plan.label}) leak_check={self.leak_check}: "
            f"failure={self.failure}, flagged={self.flagged}{when}, "
            f"warnings={list(self.warnings)}, final leak verdicts={list(self.final_leaks)}"
        )


def is_memory_leak(message: str) -> bool:
    """A warning that memory leaks: its rise (``grew``) or where it is heading (``will reach``)."""
    return "memory" in message.lower() and (" grew " in message or " will reach " in message)


def outcome(
    plan: Plan,
    interval: float,
    leak_check: Mode,
    events: Sequence[Mapping[str, Any]],
    pids: dict[str, int],
    trends: Mapping[str, Mapping[str, Any]],
) -> Outcome:
    """Read a run's journal events and final ``trends`` (or the simulation's, in that form)."""
    failures = [e for e in events if e["kind"] == "failure"]
    warnings = tuple(str(e["message"]) for e in events if e["kind"] == "warning")
    leak_failures = [e for e in failures if e["reason"] == "memory_leak"]
    messages = tuple(w for w in warnings if is_memory_leak(w)) + tuple(
        str(e["message"]) for e in leak_failures
    )
    flagged_at = None
    if messages:
        said = [
            float(e["t"])
            for e in events
            if (e["kind"] == "trend" and e["verdict"] == "leak" and "memory" in e["message"])
            or (e["kind"] == "warning" and is_memory_leak(e["message"]))
            or (e["kind"] == "failure" and e["reason"] == "memory_leak")
        ]
        flagged_at = min(said) if said else None
    return Outcome(
        plan=plan,
        interval=interval,
        leak_check=leak_check,
        failure=failures[0]["reason"] if failures else None,
        leak_messages=messages,
        warnings=warnings,
        flagged_at=flagged_at,
        pids=pids,
        final_leaks=tuple(
            sorted(
                key
                for key, entry in trends.items()
                if entry["verdict"] == "leak"
                and entry["unit"] == "bytes"
                and not key.startswith("disk.")
            )
        ),
    )


# -- real runs -------------------------------------------------------------------------------


def child_command(
    plan: Plan, progress: Path, *, data: Path | None, shm_prefix: str, tick: float = 0.2
) -> list[str]:
    command = [
        sys.executable,
        str(CHILD),
        plan.shape,
        "--seed",
        str(plan.seed),
        "--duration",
        f"{plan.duration:g}",
        "--tick",
        f"{tick:g}",
        "--progress",
        str(progress),
        "--shm-prefix",
        shm_prefix,
    ]
    if data is not None:
        command += ["--data", str(data)]
    return command


def ready_pids(log: Path) -> dict[str, int]:
    """Each role's pid from the child's ``ready ROLE PID`` lines in the soak's log."""
    pids = {}
    for line in log.read_text(errors="replace").splitlines():
        found = re.search(r"\bready (\S+) (\d+)$", line)
        if found:
            pids[found[1]] = int(found[2])
    return pids


async def real_run(
    plan: Plan, base: Path, *, interval: float, leak_check: Mode, data: Path
) -> Outcome:
    """Run ``plan`` under ``run_soak`` in ``base``; its outcome, read from the journal.

    ``data`` is the readers' data file (made beforehand: writing it is no part of the run).
    The ``/dev/shm`` segments a shape leaks on purpose are removed afterwards.
    """
    base.mkdir(parents=True, exist_ok=True)
    output = base / "soak.json"
    shm_prefix = f"asyncsoak-corpus-{uuid.uuid4().hex[:12]}"
    command = child_command(
        plan,
        base / "progress",
        data=data if plan.needs_data else None,
        shm_prefix=shm_prefix,
    )
    try:
        # A failure is a verdict like any other: read from the journal below.
        with anyio.fail_after(plan.duration + 120), contextlib.suppress(SoakFailureError):
            await run_soak(
                command=command,
                progress_dir=base / "progress",
                output_path=output,
                sample_interval_seconds=interval,
                startup_timeout_seconds=60.0,
                stale_progress_seconds=30.0,
                post_shutdown_grace_seconds=5.0,
                nvidia_smi=None,
                leak_check=leak_check,
            )
    finally:
        for segment in SHM.glob(f"{shm_prefix}-*"):
            segment.unlink(missing_ok=True)
    events = list(read_journal(output.with_suffix(".jsonl")))
    trends = json.loads(output.read_text())["trends"]
    pids = ready_pids(output.with_suffix(".log"))
    return outcome(plan, interval, leak_check, events, pids, trends)


# -- simulated samples -----------------------------------------------------------------------


def simulated_pids(plan: Plan) -> dict[str, int]:
    return {p.role: REAPER_PID + 1 + i for i, p in enumerate(plan.tree.processes)}


def _alive(process: Process, t: float) -> bool:
    return process.born <= t and (process.dies is None or t < process.dies)


def sample_times(plan: Plan, interval: float) -> Iterator[float]:
    """When the sampler reads the tree: from just after the spawn, every ``interval``."""
    k = 0
    while (t := 0.05 + k * interval) < plan.duration:
        yield round(t, 3)
        k += 1


def sample_event(
    plan: Plan, t: float, rng: random.Random, *, first: bool = False
) -> dict[str, Any]:
    """The ``sample`` journal line the proc sampler writes of ``plan``'s tree at ``t``.

    Every field the sampler writes is there; the memory is the plan's plus the interpreter's
    own, with a little wander.  ``rss_bytes`` is anonymous plus file-backed pages,
    ``anon_bytes`` the anonymous (and shared-memory) part alone, per process and for the
    tree; ``machine.shm_used_bytes`` is what ``/dev/shm`` holds.
    """
    pids = simulated_pids(plan)
    processes: list[dict[str, Any]] = []
    for process in plan.tree.processes:
        if not _alive(process, t):
            continue
        anon = int(INTERPRETER_ANON + process.anon.at(t) + rng.gauss(0, NOISE_BYTES))
        rss = anon + int(INTERPRETER_FILE + process.file.at(t))
        parent = REAPER_PID if process.parent is None else pids[process.parent]
        processes.append(
            {
                "pid": pids[process.role],
                "ppid": parent,
                "name": "python",
                "state": "sleeping",
                "cpu_percent": None if first else 3.0,
                "rss_bytes": rss,
                "anon_bytes": anon,
                "threads": 1,
                "fds": 4,
                "read_bytes": 0,
                "write_bytes": 0,
                "cmdline": None,
                "role": None,
            }
        )
    count = len(processes)
    tree_rss = sum(int(p["rss_bytes"]) for p in processes)
    tree_anon = sum(int(p["anon_bytes"]) for p in processes)
    cpu = None if first else 3.0 * count
    tree = {
        "processes": count,
        "cpu_percent": cpu,
        "rss_bytes": tree_rss,
        "anon_bytes": tree_anon,
        "uss_bytes": None,
        "pss_bytes": None,
        "anon_pss_bytes": None,
        "threads": count,
        "fds": 4 * count,
        "read_bytes": 0,
        "write_bytes": 0,
    }
    shm = int(SHM_BASE_USED + plan.tree.shm.at(t))
    used = MACHINE_BASE_USED + tree_anon + shm
    percent = round(100 * used / MACHINE_MEMORY, 2)
    machine = {
        "cpu_percent": 30.0,
        "memory_used_bytes": used,
        "memory_available_bytes": MACHINE_MEMORY - used,
        "memory_percent": percent,
        "swap_used_bytes": 0,
        "swap_percent": 0.0,
        "load1": 1.0,
        "load5": 1.0,
        "load15": 1.0,
        "shm_used_bytes": shm,
    }
    free = 500 * GiB
    disk = {"path": "/data", "free_bytes": free, "percent_used": 50.0}
    # The series points, as ProcSample.series_points() makes them.
    points = {
        "tree": {
            "cpu_percent": cpu,
            "rss_bytes": tree_rss,
            "anon_bytes": tree_anon,
            "processes": count,
            "threads": count,
            "fds": 4 * count,
            "read_bytes": 0,
            "write_bytes": 0,
        },
        "machine": {
            "cpu_percent": 30.0,
            "memory_used_bytes": used,
            "memory_percent": percent,
            "swap_percent": 0.0,
            "load1": 1.0,
            "shm_used_bytes": shm,
            "disk_free_bytes_progress": free,
            "disk_free_bytes_output": free,
        },
    }
    return {
        "t": t,
        "kind": "sample",
        "root_pid": REAPER_PID,
        "tree": tree,
        "processes": processes,
        "machine": machine,
        "disks": {"progress": dict(disk), "output": dict(disk)},
        "points": points,
    }


def simulated_events(plan: Plan, interval: float) -> Iterator[dict[str, Any]]:
    """The ``progress`` and ``sample`` journal lines of ``plan`` sampled every ``interval``.

    A progress line comes before each sample that follows new steps: the main process's
    progress file grew by a line per step (one file changed).
    """
    rng = random.Random(f"noise:{plan.shape}:{plan.seed}:{interval}")
    steps_before = 0
    previous: float | None = None
    for i, t in enumerate(sample_times(plan, interval)):
        steps = math.floor(plan.tree.steps.at(t))
        if steps > steps_before:
            yield {
                "t": t,
                "kind": "progress",
                "changed": 1,
                "paths": ["metrics.jsonl"],
                "gap_seconds": None if previous is None else round(t - previous, 3),
                "grown_bytes": (steps - steps_before) * LINE_BYTES,
            }
            steps_before, previous = steps, t
        yield sample_event(plan, t, rng, first=i == 0)


async def real_runs(
    cases: Sequence[tuple[Plan, Mode]], base: Path, *, interval: float, data: Path
) -> dict[tuple[str, Mode], Outcome]:
    """Every ``(plan, leak_check)`` run for real, by ``(shape, leak_check)``.

    The runs run at once, in one event loop (a few GiB at the peak), those that leak into
    ``/dev/shm`` after the others.
    """
    if any(plan.needs_data for plan, _ in cases):
        await anyio.to_thread.run_sync(write_data_file, data)
    outcomes: dict[tuple[str, Mode], Outcome] = {}

    async def one(plan: Plan, leak_check: Mode) -> None:
        where = base / f"{plan.shape}-{leak_check}"
        outcomes[plan.shape, leak_check] = await real_run(
            plan, where, interval=interval, leak_check=leak_check, data=data
        )

    # /dev/shm is the machine's: a leak there is seen by every soak running beside it, so the
    # plans that leak into it run in a batch of their own.
    for machine_wide in (False, True):
        async with anyio.create_task_group() as tg:
            for plan, leak_check in cases:
                if plan.machine_wide == machine_wide:
                    tg.start_soon(one, plan, leak_check)
    return outcomes
