"""The goodput ledger as the run's one state folds it: the step reader's marks, the step
events that carry them, checkpoint writes, the ends, and the live counters (recorded events,
no process)."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._analysis._goodput import BADPUT_KINDS, RunEnds, StepMark, ledger
from asyncsoak._analysis._goodput_fold import GoodputFold
from asyncsoak._contract import ValidationError
from asyncsoak._record import RunState
from asyncsoak._sampling._step_rules import StepTracker
from asyncsoak._supervisor import SoakConfig
from asyncsoak.cli._flags import soak_limits

from .conftest import asyncsoak_main
from .test_steps import append, read

EPOCH = 1_765_000_000.0


def test_each_step_record_gives_a_mark_with_the_trainers_time(tmp_path: Path) -> None:
    """Every record that advanced its file's step is a mark, its ``time`` (a number or ISO
    8601, the first of the time fields that parses) read as the trainer's own."""
    from asyncsoak._sampling._steps import StepReader

    append(
        tmp_path / "metrics.jsonl",
        '{"step": 1, "time": 1765000000.5}\n'
        '{"step": 2, "time": "soon", "timestamp": "2025-12-06T05:46:41Z"}\n'
        '{"step": 2, "loss": 1.0}\n'
        '{"step": 3}\n',
    )
    update = StepTracker().observe(read(StepReader(tmp_path)), now=4.0)
    assert update.marks == [(1, EPOCH + 0.5), (2, EPOCH + 1.0), (3, None)]


def header(**config: Any) -> dict[str, Any]:
    return {
        "t": 0.0,
        "kind": "header",
        "started_at": "2026-01-01T00:00:00.000Z",
        "config": {"sample_interval_seconds": 0.5, **config},
    }


def step(t: float, marks: list[list[Any]]) -> dict[str, Any]:
    return {
        "t": t,
        "kind": "step",
        "step": marks[-1][0],
        "source": "metrics.jsonl",
        "source_kind": "json_lines",
        "gap_seconds": None,
        "marks": marks,
    }


def progress(t: float, *paths: str) -> dict[str, Any]:
    return {"t": t, "kind": "progress", "changed": len(paths), "paths": list(paths)}


def recorded_run(failure: str | None = None) -> list[dict[str, Any]]:
    """3 s of start-up, then steps of 0.1 s seen 0.05 s late, five at a time (the first alone),
    a checkpoint written
    over 2 s after step 20 (steps 20 -> 21 take 2.1 s), the tree ending 0.4 s after the last;
    or, with ``failure``, failing 3 s after the last step."""
    out = [header(), {"t": 0.0, "kind": "started", "pid": 7}]
    t, n, pending = 3.0, 0, []
    while n < 40:
        n += 1
        t += 2.1 if n == 21 else (0.1 if n > 1 else 0.0)
        pending.append([n, EPOCH + t])
        if n == 20:
            out.append(step(t + 0.05, pending))
            pending = []
            out += [progress(t + 0.5, "run/checkpoint-20/model.safetensors"), progress(t + 1.5)]
        elif len(pending) == 5 or n == 1:
            out.append(step(t + 0.05, pending))
            pending = []
    end = t + 0.4
    if failure is not None:
        out.append({"t": t + 3.0, "kind": "failure", "reason": failure, "message": "", "at": ""})
        end = t + 3.5
    out.append({"t": end, "kind": "tree_gone"})
    return out


def fold(events: list[dict[str, Any]]) -> RunState:
    run = RunState()
    for event in events:
        run.add(event)
    return run


def test_the_fold_gives_the_ledger_of_its_marks_checkpoints_and_ends() -> None:
    """RunState.goodput() is the pure ledger of what it folded, kept in arrays, not objects."""
    run = fold(recorded_run())
    out = run.goodput()
    marks = [
        StepMark(int(s), e["t"], trainer)
        for e in recorded_run()
        if e["kind"] == "step"
        for s, trainer in e["marks"]
    ]
    end = recorded_run()[-1]["t"]
    writes = [e["t"] for e in recorded_run() if e["kind"] == "progress" and e["paths"]]
    assert out == ledger(marks, RunEnds(end_t=end), checkpoint_times=writes, lag_seconds=0.5)
    assert out.badput_seconds["checkpoint"] == pytest.approx(2.0, abs=0.01)
    assert out.badput_seconds["startup"] == pytest.approx(2.95, abs=0.01)  # seen 0.05 s late
    assert out.steps == 40
    assert out.productive_seconds + sum(out.badput_seconds.values()) == pytest.approx(end)
    fields = vars(run.goodput_fold)
    assert sum(isinstance(v, array) for v in fields.values()) == 3
    assert (
        run.build(status="passed", ended_t=end + 1, log_tail="", monitor={})["goodput"]
        == out.to_json()
    )


def test_a_stall_is_lost_until_the_failure_and_an_earlier_attempts_steps_are_redone() -> None:
    """stale_progress (and overdue, by its word) makes the last step -> the failure a stall;
    the header's earlier_highest_step makes the steps up to it wasted."""
    run = fold(recorded_run(failure="stale_progress"))
    assert run.goodput().badput_seconds["stall"] == pytest.approx(2.95, abs=0.01)
    overdue = GoodputFold()  # a reason this branch's RunState does not know yet
    overdue.fail(5.0, "overdue")
    assert overdue.stalled
    events = recorded_run()
    events[0] = header(earlier_highest_step=10)
    out = fold(events).goodput()
    assert out.steps == 30
    assert out.badput_seconds["wasted"] == pytest.approx(1.0, abs=0.05)
    assert fold(events).goodput(earlier_highest_step=0).steps == 40
    live = fold(events).goodput_fold.badput_seconds["wasted"]
    assert live == pytest.approx(out.badput_seconds["wasted"], abs=0.15)  # live says it too


def test_live_counters_of_batched_records_agree_with_the_ledger() -> None:
    """Records without times read ten at a scan a second apart: the live counters and the
    artifact's ledger both count them as steps of 0.1 s (productive), not steps of no time."""
    run = RunState()
    run.add(header())
    for scan in range(1, 21):
        run.add(step(2.0 + scan, [[i, None] for i in range(scan * 10 - 9, scan * 10 + 1)]))
    live = run.goodput_fold
    final = run.goodput()
    assert final.ideal_step_seconds == pytest.approx(0.1, abs=1e-3)
    assert live.productive_seconds == pytest.approx(final.productive_seconds, rel=0.1)
    assert live.badput_seconds["slow_steps"] == pytest.approx(0.0, abs=0.05)


def test_the_live_counters_only_grow_and_count_each_part() -> None:
    """After every event the counters are at least what they were; at the end they hold the
    start-up, the checkpoint pause and the shutdown, and add up to the wall time."""
    run, before = RunState(), dict.fromkeys(("productive", *BADPUT_KINDS), 0.0)
    events = recorded_run()
    for event in events:
        run.add(event)
        now = {"productive": run.goodput_fold.productive_seconds}
        now.update(run.goodput_fold.badput_seconds)
        assert all(now[k] >= before[k] for k in now), (event, before, now)
        before = now
    assert before["startup"] == pytest.approx(2.95, abs=0.01)
    assert before["checkpoint"] == pytest.approx(2.0, abs=0.01)
    assert before["shutdown"] == pytest.approx(0.35, abs=0.01)
    assert sum(before.values()) == pytest.approx(events[-1]["t"], abs=0.01)


def test_checkpoint_globs_are_checked_and_shared_by_run_and_submit(tmp_path: Path) -> None:
    """--checkpoint-glob is repeatable, replaces the defaults, refuses a pattern with a '/'
    naming the flag; the config records it and earlier_highest_step."""
    from asyncsoak.cli import build_parser

    parser = build_parser()
    run = ["run", "--progress-dir", str(tmp_path), "--output", str(tmp_path / "s.json")]
    for command in (run, ["submit"]):
        args = parser.parse_args([*command, "--checkpoint-glob", "ckpt_*", "--", "true"])
        assert soak_limits(args)["checkpoint_globs"] == ("ckpt_*",)
    args = parser.parse_args([*run, "--", "true"])
    assert "*.safetensors" in soak_limits(args)["checkpoint_globs"]
    args = parser.parse_args([*run, "--checkpoint-glob", "a/b", "--", "true"])
    with pytest.raises(ValidationError, match=r"^--checkpoint-glob .*got 'a/b'"):
        soak_limits(args)
    refused = asyncsoak_main(*run, "--checkpoint-glob", "", "--", "true", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--checkpoint-glob" in refused.stderr
    config = SoakConfig(
        command=("true",),
        progress_dir=tmp_path,
        output_path=tmp_path / "s.json",
        checkpoint_globs=("*.bin",),
        earlier_highest_step=30,
    )
    assert config.effective()["checkpoint_globs"] == ("*.bin",)
    assert config.effective()["earlier_highest_step"] == 30
    with pytest.raises(ValidationError, match="earlier_highest_step"):
        SoakConfig(
            command=("true",),
            progress_dir=tmp_path,
            output_path=tmp_path / "s.json",
            earlier_highest_step=-1,
        )


def test_the_live_lines_last_frame_says_the_goodput() -> None:
    """Once the run finished, the live line's frame carries the goodput line; before, not."""
    from asyncsoak._view._live_state import LiveState

    live = LiveState()
    for event in recorded_run():
        live.add(event)
    assert live.status(now=2e9).goodput == ""
    live.add({"t": 30.0, "kind": "finished", "status": "passed"})
    frame = live.status(now=2e9)
    assert frame.goodput.startswith("goodput ")
    assert "start-up" in frame.goodput
    assert frame.goodput in frame.plain()
