"""The leak corpus, each shape a real process tree under a real soak at a 1 s interval for
60 s: every leak flagged (naming the leaking process where one is to blame), no stable shape.

The soaks run at once (a minute or so; the /dev/shm leak in a batch of its own); the module's
tests share them, and only the cases selected are run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak._record._serializer import journal_line_data
from asyncsoak._sampling._proc_sampler import ProcSampler

from .conftest import ReadyFifo, asyncsoak_cli
from .corpus_soaks import Mode, Outcome, real_run, real_runs, sample_event
from .leak_corpus import SHAPES, plan

pytestmark = pytest.mark.timeout(600)

INTERVAL = 1.0
DURATION = 60.0
SEED = 0
LEAKS = [shape for shape, (label, _) in SHAPES.items() if label == "leak"]
STABLE = [shape for shape, (label, _) in SHAPES.items() if label == "stable"]
#: Leaks whose own process is to blame: the warning names its pid.
PROCESS_LEAKS = [s for s in LEAKS if plan(s, SEED, DURATION).tree.leaker is not None]


def case_id(case: tuple[str, Mode]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.fixture(scope="module")
def corpus(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, Mode], Outcome]:
    """The outcome of every (shape, leak_check) case this session's selected tests look at."""
    wanted: set[tuple[str, Mode]] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            wanted.add(callspec.params["case"])
    base = tmp_path_factory.mktemp("corpus")
    cases = [(plan(shape, SEED, DURATION), mode) for shape, mode in sorted(wanted)]
    return anyio.run(lambda: real_runs(cases, base, interval=INTERVAL, data=base / "data.bin"))


@pytest.mark.slow
@pytest.mark.parametrize("case", [(s, "fail") for s in STABLE], ids=case_id)
def test_a_stable_shape_passes_with_no_leak_warning_under_fail(
    corpus: dict[tuple[str, Mode], Outcome], case: tuple[str, Mode]
) -> None:
    """A mapped dataset, the page cache, a ramp then plateau, a fork storm, a sawtooth, one
    step, a fall: the run passes under leak_check="fail", no warning says memory leaks, and
    no memory series of the artifact's trends is a leak."""
    result = corpus[case]
    assert not result.problems(), result.describe()


@pytest.mark.slow
@pytest.mark.parametrize("case", [(s, "warn") for s in LEAKS], ids=case_id)
def test_a_leak_is_a_warning_under_warn(
    corpus: dict[tuple[str, Mode], Outcome], case: tuple[str, Mode]
) -> None:
    """Every leak passes under leak_check="warn" with a warning that memory leaks, naming the
    leaking process's pid where one process is to blame (a grandchild born late included),
    and the artifact's trends say leak too: one verdict, live and final."""
    result = corpus[case]
    assert not result.problems(), result.describe()


@pytest.mark.slow
@pytest.mark.parametrize("case", [(s, "fail") for s in LEAKS], ids=case_id)
def test_a_leak_stops_the_run_under_fail(
    corpus: dict[tuple[str, Mode], Outcome], case: tuple[str, Mode]
) -> None:
    """Every leak ends the run under leak_check="fail" with the failure memory_leak."""
    result = corpus[case]
    assert not result.problems(), result.describe()


@pytest.mark.slow
def test_a_leak_too_short_to_judge_under_fail_is_no_clean_pass(tmp_path: Path) -> None:
    """10 MiB/s for 40 s at the default 5 s interval under leak_check="fail": too few samples
    for the check to judge, so summary --json's status is not passed and summary's first
    three lines say how much the memory grew and what to change."""
    case = plan("short_fast_leak", SEED, 40.0)
    outcome = anyio.run(
        lambda: real_run(case, tmp_path, interval=5.0, leak_check="fail", data=tmp_path / "d")
    )
    assert outcome.failure is None, outcome.describe()
    artifact = tmp_path / "soak.json"
    data = asyncsoak_cli("summary", "--json", str(artifact), cwd=tmp_path)
    assert json.loads(data.stdout)["status"] == "passed_with_warnings"
    first = asyncsoak_cli("summary", str(artifact), cwd=tmp_path).stdout.splitlines()[:3]
    assert "the leak check could not judge: memory grew" in "\n".join(first), first
    assert "--sample-interval" in "\n".join(first), first


@pytest.mark.slow
def test_simulated_samples_carry_every_field_the_sampler_writes(ready: ReadyFifo) -> None:
    """The benchmark's simulated samples have every field of a real sample of a real tree
    (the tree, each process, the machine, each disk, the series points), so they are judged
    as the sampler's would be."""
    code = f"""
        import os, time
        if os.fork() == 0:
            open({str(ready.path)!r}, "w").write("ready\\n")
            time.sleep(60)
        os.wait()
    """
    root = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], start_new_session=True)
    try:
        assert ready.line_sync() == "ready"
        sampler = ProcSampler(root.pid, disk_paths={"progress": Path.cwd(), "output": Path.cwd()})
        sampler.read(0.0)
        sample = sampler.read(1.0)
        assert sample is not None
        real: Mapping[str, Any] = journal_line_data(sample)
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait(timeout=10)
    simulated = sample_event(plan("late_grandchild_leak", 0, 60.0), 30.0, random.Random(0))
    assert set(real) <= set(simulated)
    for part in ("tree", "machine"):
        assert set(real[part]) <= set(simulated[part]), part
    assert set(real["processes"][0]) <= set(simulated["processes"][0])
    assert set(real["disks"]) == set(simulated["disks"])
    assert set(real["disks"]["progress"]) <= set(simulated["disks"]["progress"])
    for group in ("tree", "machine"):
        assert set(real["points"][group]) == set(simulated["points"][group]), group


def test_a_plan_is_the_same_for_a_seed_and_differs_between_seeds() -> None:
    """The child and the benchmark draw one plan from (shape, seed, duration), every time."""
    for shape in SHAPES:
        assert plan(shape, 3, 60.0) == plan(shape, 3, 60.0)
        assert plan(shape, 3, 60.0) != plan(shape, 4, 60.0), shape
