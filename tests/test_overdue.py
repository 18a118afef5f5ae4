"""Deadlines the training keeps (``--expect-every GLOB=SECONDS``) and the reason ``overdue``:
the rule on recorded events, the live line's countdown, the flag's refusals, and real trainers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import run_soak
from asyncsoak._contract import events
from asyncsoak._record import RunState
from asyncsoak._sampling._progress_rules import PATHS_PER_EVENT, named_paths
from asyncsoak._supervisor._judge import overdue_failure
from asyncsoak._view._live_state import LiveState

from .conftest import asyncsoak_cli, asyncsoak_main, fast_limits, py

EVERY = {"checkpoint-*": 2.0}
HEADER = {"t": 0.0, "kind": "header", "started_at": "2026-01-01T00:00:00Z"}


def step(t: float, n: int) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": n, "source": "metrics.jsonl",
            "source_kind": "json_lines", "gap_seconds": None}  # fmt: skip


def progress(t: float, *paths: str) -> dict[str, Any]:
    return {"t": t, "kind": "progress", "changed": len(paths), "paths": list(paths),
            "gap_seconds": None}  # fmt: skip


def judged(
    *fed: dict[str, Any], every: dict[str, float] = EVERY, interval: float | None = None
) -> list[dict[str, Any]]:
    """The failures the rule finds, each event folded first as the serializer does."""
    state = RunState()
    state.add({**HEADER, "config": {"expect_every": every, "sample_interval_seconds": interval}})
    found = []
    for event in fed:
        state.add(event)
        for failure in overdue_failure(state, event):  # type: ignore[arg-type]
            found.append(dict(events.event_to_json(failure)))
            state.add(found[-1])
    return found


def test_the_first_match_is_due_seconds_after_the_first_step() -> None:
    """Steps from 1.0 s and no checkpoint: a step at 2.9 s is in time, one at 3.1 s finds
    the deadline (3.0 s) missed while the steps advance, naming the GLOB and how late."""
    assert judged(step(1.0, 1), step(2.9, 2)) == []
    [failure] = judged(step(1.0, 1), step(2.9, 2), step(3.1, 3))
    assert failure["reason"] == "overdue"
    assert failure["t"] == 3.1
    assert failure["message"].startswith(
        "checkpoint-*: no match since the steps started at 1.0s, 0.1s late"
    )


def test_a_match_in_a_nested_path_moves_the_deadline_on() -> None:
    """`checkpoint-*` matches a part of `run/checkpoint-1/model.safetensors`: the next match
    is due 2 s after it; the step past that is the failure, naming the last match."""
    saved = progress(2.5, "metrics.jsonl", "run/checkpoint-1/model.safetensors")
    assert judged(step(1.0, 1), saved, step(4.4, 2)) == []
    [failure] = judged(step(1.0, 1), saved, step(4.4, 2), step(4.6, 3))
    assert "last match run/checkpoint-1/model.safetensors at 2.5s, 0.1s late" in failure["message"]


def test_a_checkpoint_on_the_periods_dot_is_no_miss() -> None:
    """Saves every 2.01 s (a trainer saving on a 2 s clock), seen by scans 0.5 s apart, the
    steps going on: never overdue; a save 0.6 s late is (more than a look at the files)."""
    fed, saved = [step(1.0, 1)], 0
    for scan in range(3, 40):
        t = scan * 0.5  # each scan sees the steps first, then the save it made since
        fed.append(step(t, scan))
        if (t - 1.0) // 2.01 > saved:
            saved += 1
            fed.append(progress(t, f"checkpoint-{saved}"))
    assert judged(*fed, interval=0.5) == []
    late = [step(1.0, 1), progress(3.0, "checkpoint-1"), step(5.6, 2), step(5.61, 3)]
    assert judged(*late, interval=0.5)[0]["reason"] == "overdue"


def test_steps_that_stopped_before_the_deadline_are_no_overdue() -> None:
    """The step froze at 2.9 s (files still grow): no overdue, however late; the stall is
    stale_progress's to tell."""
    frozen = [step(1.0, 1), step(2.9, 2), step(5.0, 2), progress(9.0, "metrics.jsonl")]
    assert judged(*frozen) == []


def test_without_steps_progress_is_the_steps() -> None:
    """A run that writes no step: its file changes start the clock and are its advances."""
    changes = [progress(1.0, "log.txt"), progress(2.5, "checkpoint-1/w.bin")]
    assert judged(*changes, progress(4.0, "log.txt")) == []
    [failure] = judged(*changes, progress(4.6, "log.txt"))
    assert failure["message"].startswith("checkpoint-*: last match checkpoint-1/w.bin at 2.5s")


def test_a_progress_event_names_each_globs_match_beyond_its_first_paths() -> None:
    """Many files changed at once: the event names the first ones, and the first match of
    each GLOB they leave out, so the deadline sees it."""
    changed = [f"a{i}.log" for i in range(PATHS_PER_EVENT + 2)] + ["z/checkpoint-9/w.bin"]
    assert named_paths(changed, ["checkpoint-*", "nothing-*"]) == [
        *changed[:PATHS_PER_EVENT],
        "z/checkpoint-9/w.bin",
    ]


def test_the_live_line_counts_down_to_the_nearest_deadline() -> None:
    """The deadline nearer than the stale limit's is the one the line counts down to."""
    state = LiveState()
    config = {"stale_progress_seconds": 120.0, "expect_every": {"checkpoint-*": 62.0}}
    for event in (
        {**HEADER, "config": config},
        {"t": 0.1, "kind": "started", "pid": 1},
        step(1.0, 1),
    ):
        state.add(event)
    assert state.started_at is not None
    line = state.status(state.started_at + 1.0).plain()
    assert "checkpoint-* due in 1m02s" in line
    far = LiveState()
    for event in ({**HEADER, "config": {**config, "expect_every": {"checkpoint-*": 600.0}}},
                  {"t": 0.1, "kind": "started", "pid": 1}, step(1.0, 1)):  # fmt: skip
        far.add(event)
    assert far.started_at is not None
    assert "last progress" in far.status(far.started_at + 1.0).plain()


@pytest.mark.parametrize("value", ["x", "checkpoint-*=0", "checkpoint-*=-1", "checkpoint-*=abc"])
def test_a_bad_expect_every_is_refused_naming_the_flag_and_value(
    tmp_path: Path, value: str
) -> None:
    """Exit status 2, one line naming --expect-every and the value as typed; nothing written."""
    result = asyncsoak_main(
        "run", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", str(tmp_path / "out" / "soak.json"), "--expect-every", value,
        "--", sys.executable, "-c", "pass", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--expect-every" in result.stderr
    assert repr(value) in result.stderr
    assert not (tmp_path / "out").exists()


#: Steps every 0.1 s into metrics.jsonl; a checkpoint-N/ dir every 10 steps for the first
#: argv[2] seconds; argv[3] steps in all.
TRAINER = """
    import json, os, sys, time
    out, saving_for, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        for n in range(1, steps + 1):
            f.write(json.dumps({"step": n, "loss": 1.0 / n}) + "\\n")
            f.flush()
            if n % 10 == 0 and time.monotonic() - start < saving_for:
                os.makedirs(os.path.join(out, f"checkpoint-{n}"))
                with open(os.path.join(out, f"checkpoint-{n}", "model.safetensors"), "w") as m:
                    m.write("weights")
            time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_trainer_that_stops_checkpointing_fails_overdue(tmp_path: Path) -> None:
    """It stops checkpointing after 4 s and keeps stepping: `overdue` by 8.5 s into the run,
    the first line naming checkpoint-*; detailed exit status 23."""
    output = tmp_path / "soak.json"
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--detailed-exit-codes", "--progress-dir",
        str(tmp_path / "p"), "--output", str(output), "--expect-every", "checkpoint-*=2",
        "--sample-interval", "0.5", "--stale-progress", "10", "--grace", "2",
        "--", *py(TRAINER), str(tmp_path / "p"), "4", "300", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 23, result.stderr
    assert "asyncsoak: soak failed: overdue: checkpoint-*: last match checkpoint-" in (
        result.stderr
    )
    artifact = json.loads(output.read_text())
    failure = next(e for e in artifact["events"] if e["kind"] == "failure")
    assert (failure["reason"], failure["t"] <= 8.5) == ("overdue", True), failure
    assert artifact["config"]["expect_every"] == {"checkpoint-*": 2.0}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_same_trainer_checkpointing_every_second_passes(tmp_path: Path) -> None:
    """A checkpoint every second against `checkpoint-*=2`: the soak passes."""
    progress_dir = tmp_path / "progress"
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(TRAINER), str(progress_dir), "60", "60"],
            **fast_limits(tmp_path, sample_interval_seconds=0.5, expect_every=EVERY),
        )
    assert artifact["status"] == "passed", artifact["failures"]


def test_run_soak_refuses_a_glob_with_a_slash(tmp_path: Path) -> None:
    """A GLOB is matched against one part of a path: one holding '/' could never match."""
    from asyncsoak import SoakConfig, ValidationError

    with pytest.raises(ValidationError, match="expect_every: the GLOB 'run/ckpt-\\*'"):
        SoakConfig(**fast_limits(tmp_path, expect_every={"run/ckpt-*": 60}), command=("true",))
