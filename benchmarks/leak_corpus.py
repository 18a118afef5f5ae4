"""Leak corpus: is each shape of ``tests/leak_corpus.py`` flagged as a leak, and how soon.

    python -m benchmarks --only leak_corpus      (or: python -m benchmarks.leak_corpus)

Twelve labelled shapes (five leaks, seven stable ones that real training makes), each a plan
of every process's memory drawn from a seed; the same plan is what the corpus's real child
makes of its process tree.  Target: every leak flagged, no stable shape flagged, at 1 s and at
5 s intervals, under ``leak_check`` ``warn`` and ``fail`` alike.

1. Simulated, 20 seeds per shape: the samples the proc sampler would take of the plan (every
   field it writes, ``rss_bytes`` and the anonymous part ``anon_bytes`` per process and for the
   tree, ``/dev/shm`` in ``machine.shm_used_bytes``), every 1 s over 60 s and every 5 s over
   300 s (60 samples either way), folded into the soak's own artifact builder and judged by
   its own run judge: live, at the pace the soak judges, then once more at the end.  Nothing
   waits for wall time.
2. Real, one seed per shape at 1 s over 60 s: the corpus's child under ``run_soak``, every
   shape at once (the ``warn`` runs, then the ``fail`` runs), read from its journal.  Skipped
   with ``--quick``.

Flagged: a warning that memory leaks (or will reach a limit), or the failure
``memory_leak``.  Time to flag: seconds into the run the soak first said so (a live ``trend``
event, a warning, the failure), the median over the seeds flagged.  Judged right: as the
corpus tests require (``Outcome.problems`` in ``tests/corpus_soaks.py``): a stable shape
neither flagged nor a leak in the final trends; a leak stopped with ``memory_leak`` under
``fail``, and under ``warn`` a warning naming the leaking pid with the final trends agreeing.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio

from asyncsoak import run_soak
from asyncsoak._contract import events
from asyncsoak._contract._sink import EventSink, SoakClock
from asyncsoak._contract._timestamps import iso
from asyncsoak._record._artifact import RunState
from asyncsoak._record._serializer import journal_line_data
from asyncsoak._supervisor._config import SoakConfig
from asyncsoak._supervisor._judge import RunJudge
from benchmarks._common import Figure, Section
from tests.corpus_soaks import (
    MACHINE_MEMORY,
    REAPER_PID,
    Mode,
    Outcome,
    outcome,
    real_runs,
    simulated_events,
    simulated_pids,
)
from tests.leak_corpus import SHAPES, Plan, plan

#: Sample intervals, and the samples of a run at each (the run lasts as many intervals).
INTERVALS = (1.0, 5.0)
SAMPLES = 60
MODES: tuple[Mode, ...] = ("warn", "fail")
TARGET = "every leak flagged, no stable shape flagged"


class SimulatedClock(SoakClock):
    """The soak's clock, at the simulated sample's time."""

    def __init__(self) -> None:
        super().__init__(start=0.0)
        self.now = 0.0

    def elapsed(self) -> float:
        return self.now


def soak_config(where: Path, interval: float, leak_check: Mode) -> SoakConfig:
    """The config ``run_soak`` would make of its defaults and these settings."""
    arguments: dict[str, Any] = {
        name: p.default
        for name, p in inspect.signature(run_soak).parameters.items()
        if p.default is not inspect.Parameter.empty and name not in ("control", "metrics", "config")
    }
    arguments.update(
        command=[sys.executable, "tests/leak_corpus.py"],
        progress_dir=where,
        output_path=where / "soak.json",
        sample_interval_seconds=interval,
        stale_progress_seconds=30.0,
        nvidia_smi=None,
        leak_check=leak_check,
    )
    return SoakConfig(**arguments)


async def simulate(plan: Plan, interval: float, leak_check: Mode, where: Path) -> Outcome:
    """One simulated run: the plan's journal lines folded and judged as the soak does."""
    cfg = soak_config(where, interval, leak_check)
    builder = RunState()
    clock = SimulatedClock()
    send, receive = anyio.create_memory_object_stream[events.Event](10_000)
    sink = EventSink(send, clock)
    folded: list[Mapping[str, Any]] = []
    stopped_at: float | None = None

    def fold(data: Mapping[str, Any]) -> None:
        folded.append(data)
        builder.add(data)

    judge = RunJudge(cfg, builder, ended=lambda: stopped_at is not None)
    # The last evaluation is the final one: the artifact's ``trends``.
    judged: list[Mapping[str, Mapping[str, Any]]] = [{}]
    judge.trend_observers.append(lambda trends: judged.__setitem__(0, trends))

    async def serializer() -> None:
        async with receive:
            async for event in receive:
                fold(journal_line_data(event))

    pid = simulated_pids(plan)["main"]
    fold(
        journal_line_data(
            events.Header(
                t=0.0,
                command=list(cfg.command),
                cwd=str(where),
                config=cfg.effective(),
                metadata={},
                started_at=iso(datetime.now(UTC)),
                journal_path=str(cfg.journal_path),
                log_path=str(cfg.log_path),
                output_path=str(cfg.output_path),
                monitor_pid=REAPER_PID - 1,
                monotonic_start=0.0,
            )
        )
    )
    fold(
        journal_line_data(
            events.Limits(
                t=0.0,
                memory_total_bytes=MACHINE_MEMORY,
                cgroup_memory_max_bytes=None,
                disk_total_bytes={"progress": 2**40, "output": 2**40},
            )
        )
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(serializer)
        for data in simulated_events(plan, interval):
            clock.now = data["t"]
            fold(data)
            if data["kind"] == "sample":
                # The serializer's rule, as the soak runs it: what it returns is folded back.
                for event in judge.trend_rule(builder, cast(events.EventJson, data)):
                    fold(journal_line_data(event))
                if builder.failures:
                    stopped_at = clock.now
                    break
        if stopped_at is not None:
            fold(
                journal_line_data(
                    events.StopRequested(
                        t=stopped_at, cause="failure", mode="group", grace_seconds=5.0
                    )
                )
            )
        end = plan.duration if stopped_at is None else stopped_at
        clock.now = end
        returncode = 0 if stopped_at is None else -15
        signal = None if stopped_at is None else "SIGTERM"
        fold(journal_line_data(events.Exited(t=end, pid=pid, returncode=returncode, signal=signal)))
        await judge.judge_final(sink)
        send.close()
    return outcome(plan, interval, leak_check, folded, simulated_pids(plan), judged[0])


def simulated(seeds: int, where: Path) -> dict[tuple[str, float, Mode], list[Outcome]]:
    async def every_run() -> dict[tuple[str, float, Mode], list[Outcome]]:
        out: dict[tuple[str, float, Mode], list[Outcome]] = {}
        for shape in SHAPES:
            for interval in INTERVALS:
                for mode in MODES:
                    out[shape, interval, mode] = [
                        await simulate(plan(shape, seed, SAMPLES * interval), interval, mode, where)
                        for seed in range(seeds)
                    ]
        return out

    return anyio.run(every_run)


def real(where: Path) -> dict[tuple[str, Mode], Outcome]:
    duration = SAMPLES * INTERVALS[0]
    cases = [(plan(shape, 0, duration), mode) for shape in SHAPES for mode in MODES]
    return anyio.run(
        lambda: real_runs(cases, where, interval=INTERVALS[0], data=where / "data.bin")
    )


@dataclass(frozen=True)
class Row:
    """One line of the table: a shape at an interval under a mode, over its runs."""

    shape: str
    kind: str  # "simulated" or "real"
    interval: float
    mode: Mode
    runs: Sequence[Outcome]

    @property
    def label(self) -> str:
        return SHAPES[self.shape][0]

    @property
    def flagged(self) -> int:
        return sum(r.flagged for r in self.runs)

    @property
    def right(self) -> int:
        """Runs judged right (the corpus tests' criteria: ``Outcome.problems``)."""
        return sum(not r.problems() for r in self.runs)

    @property
    def median_to_flag(self) -> float | None:
        times = [r.flagged_at for r in self.runs if r.flagged and r.flagged_at is not None]
        return statistics.median(times) if times else None

    def figure(self) -> Figure:
        median = self.median_to_flag
        duration = self.runs[0].plan.duration
        return Figure(
            f"{self.shape} ({self.label}), {self.kind} at {self.interval:g} s, {self.mode}: "
            "flagged",
            self.flagged,
            f"of {len(self.runs)}",
            reference=""
            if median is None
            else f"median {median:.0f} s to flag ({100 * median / duration:.0f} % of the run)",
            target=f"all judged right ({self.right} of {len(self.runs)})"
            if self.label == "leak"
            else f"none, all judged right ({self.right} of {len(self.runs)})",
            met=self.right == len(self.runs),
        )

    def line(self) -> str:
        median = self.median_to_flag
        return " | ".join(
            [
                self.shape,
                self.label,
                self.kind,
                f"{self.interval:g} s",
                self.mode,
                f"{self.flagged}/{len(self.runs)}",
                "-" if median is None else f"{median:.0f} s",
                f"{self.right}/{len(self.runs)}",
            ]
        )


TABLE_HEADER = (
    "shape | label | run | interval | mode | flagged | median time to flag | judged right"
)


def run(quick: bool = False) -> Section:
    started = time.monotonic()
    section = Section("leak_corpus", "15. Leak corpus")
    seeds = 5 if quick else 20
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="asyncsoak-corpus-") as tmp:
        where = Path(tmp)
        sims = simulated(seeds, where)
        for shape in SHAPES:
            for interval in INTERVALS:
                for mode in MODES:
                    rows.append(
                        Row(shape, "simulated", interval, mode, sims[shape, interval, mode])
                    )
        if quick:
            section.note("the real runs are skipped with --quick")
        else:
            runs = real(where)
            for shape in SHAPES:
                for mode in MODES:
                    rows.append(Row(shape, "real", INTERVALS[0], mode, [runs[shape, mode]]))
    for r in rows:
        section.add(r.figure())
    wrong = [r for r in rows if r.right < len(r.runs)]
    section.add(
        Figure(
            f"table lines with a run judged wrong (of {len(rows)})",
            len(wrong),
            "lines",
            target=f"0: {TARGET}",
            met=not wrong,
        )
    )
    section.note(
        f"{seeds} seeds per shape simulated; {SAMPLES} samples a run "
        f"({', '.join(f'{SAMPLES * i:g} s at {i:g} s' for i in INTERVALS)})"
    )
    section.note(TABLE_HEADER)
    for r in rows:
        section.note(r.line())
    for r in wrong:
        # One run per wrong line, in the soak's own words.
        example = next(run for run in r.runs if run.problems())
        section.note(
            f"judged wrong, {r.kind} at {r.interval:g} s, seed {example.plan.seed}: "
            f"{'; '.join(example.problems())}: {example.describe()}"
        )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
