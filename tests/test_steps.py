"""Reading steps from what trainers write, and the rules over them (injected clock)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from asyncsoak._analysis._trendwatch import TrendWatch
from asyncsoak._contract._events import ProgressJson, SampleJson
from asyncsoak._sampling import _steps
from asyncsoak._sampling._step_rules import (
    AUTO_FLOOR_SECONDS,
    AUTO_SAFETY_FACTOR,
    StaleLimit,
    StepTracker,
)
from asyncsoak._sampling._steps import KeyChoice, StepReader, StepReading
from asyncsoak._sampling._watchdog import FileState, ProgressTracker, scan_progress_dir
from asyncsoak._supervisor._rules import slowdown

FIXTURES = Path(__file__).parent / "fixtures" / "hf_trainer"
REPO = Path(__file__).resolve().parent.parent


def read(reader: StepReader) -> StepReading:
    reading = reader.read(scan_progress_dir(reader.root).files)
    assert reading is not None
    return reading


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_json_lines_are_read_incrementally_with_partial_lines_and_nan(tmp_path: Path) -> None:
    """Only what was appended since the last read is read; a partial line waits for its end."""
    metrics = tmp_path / "metrics.jsonl"
    append(metrics, '{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    reader = StepReader(tmp_path)
    first = read(reader)
    assert [(r.step, r.loss) for r in first.records] == [(1, 2.0)]
    append(metrics, 'ss": NaN}\n{"global_step": 3, "train_loss": Infinity, "tokens": 96}\n')
    second = read(reader)
    assert [r.step for r in second.records] == [2, 3]
    assert math.isnan(second.records[0].loss or 0.0)
    assert second.records[1].loss == math.inf
    assert second.records[1].tokens == 96
    assert second.lines == {"metrics.jsonl": 2}
    assert read(reader).records == []


def test_garbage_and_huge_lines_are_skipped_counted_and_noted_once(tmp_path: Path) -> None:
    """Garbage is skipped with one note; a line past MAX_LINE_BYTES is never held whole."""
    metrics = tmp_path / "train.jsonl"
    huge = '{"step": 9, "pad": "' + "x" * (_steps.MAX_LINE_BYTES + 10) + '"}\n'
    append(metrics, 'garbage\n[1, 2]\n{"step": 1}\n' + huge + '{"step": 2}\nnot json either\n')
    reader = StepReader(tmp_path)
    reading = read(reader)
    assert [r.step for r in reading.records] == [1, 2]
    assert sum("not a JSON object" in n for n in reading.notes) == 1
    assert any("longer than" in n for n in reading.notes)
    assert reader.garbage() == {"train.jsonl": 3}


def test_a_line_growing_past_the_bound_without_a_newline_is_dropped(tmp_path: Path) -> None:
    """A writer that never ends its line costs at most MAX_LINE_BYTES of memory."""
    metrics = tmp_path / "m.jsonl"
    append(metrics, "y" * (_steps.MAX_LINE_BYTES + 1))
    reader = StepReader(tmp_path)
    assert read(reader).records == []
    append(metrics, 'zzz\n{"step": 4}\n')
    assert [r.step for r in read(reader).records] == [4]


def test_rotation_and_truncation_are_read_again_from_the_start(tmp_path: Path) -> None:
    """A replaced file (another inode) or a truncated one is read from its start, noted."""
    metrics = tmp_path / "metrics.jsonl"
    append(metrics, '{"step": 1}\n{"step": 2}\n')
    reader = StepReader(tmp_path)
    read(reader)
    metrics.rename(tmp_path / "old.log")
    append(metrics, '{"step": 3}\n')
    rotated = read(reader)
    assert [r.step for r in rotated.records] == [3]
    assert any("replaced" in n for n in rotated.notes)
    metrics.write_text('{"step":7}\n')  # truncated and rewritten, shorter
    truncated = read(reader)
    assert [r.step for r in truncated.records] == [7]
    assert any("truncated" in n for n in truncated.notes)


def test_a_backlog_larger_than_the_bound_is_skipped_to_its_newest_part(tmp_path: Path) -> None:
    """At most MAX_READ_BYTES a file a scan: a burst is skipped to its end, with a note."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    reader = StepReader(tmp_path)
    read(reader)
    line = '{"step": %d, "loss": 1.0, "pad": "' + "p" * 200 + '"}\n'
    append(metrics, "".join(line % i for i in range(12_000)))
    reading = read(reader)
    assert reading.records[-1].step == 11_999
    assert len(reading.records) < 12_000
    assert any("skipped" in n for n in reading.notes)


def test_a_file_present_at_the_start_is_read_from_its_newest_part(tmp_path: Path) -> None:
    """An earlier run's long history is not re-read: its tail gives the step to resume from."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(20_000)))
    reader = StepReader(
        tmp_path, baseline={"metrics.jsonl": (tmp_path / "metrics.jsonl").stat().st_size}
    )
    reading = read(reader)
    assert reading.records[-1].step == 19_999
    assert len(reading.records) < 20_000


def test_lightning_metrics_csv_rows_and_a_rewrite_with_new_columns(tmp_path: Path) -> None:
    """Lightning's CSV: empty cells are absent figures; a rewrite with a new column is read."""
    csv = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("epoch,step,train_loss\n0,49,2.31\n0,99,nan\n")
    reader = StepReader(tmp_path)
    reading = read(reader)
    assert [r.step for r in reading.records] == [49, 99]
    assert reading.records[0].loss == 2.31
    assert math.isnan(reading.records[1].loss or 0.0)
    csv.write_text("epoch,step,train_loss,val_loss\n0,49,2.31,\n0,99,2.1,\n0,149,1.9,2.0\n")
    rewritten = read(reader)
    assert [r.step for r in rewritten.records][-1] == 149


def test_hugging_face_trainer_state_and_its_checkpoint_copies(tmp_path: Path) -> None:
    """trainer_state.json (as transformers writes it) gives global_step, max_steps, losses;
    a checkpoint's copy of entries read already adds nothing twice."""
    shutil.copytree(FIXTURES / "checkpoint-10", tmp_path / "checkpoint-10")
    reader = StepReader(tmp_path)
    tracker = StepTracker()
    tracker.observe(read(reader), now=1.0)
    assert (tracker.step, tracker.max_steps, tracker.loss) == (10, 20, 2.350318193435669)
    assert tracker.source_kind == "trainer_state"
    shutil.copytree(FIXTURES / "checkpoint-20", tmp_path / "checkpoint-20")
    update = tracker.observe(read(reader), now=2.0)
    assert update.advanced
    assert not update.notes  # no "step went back" from the copies
    assert (tracker.step, tracker.loss) == (20, 1.2152782678604126)
    assert tracker.steps_per_second == 10.0


def test_a_whole_hugging_face_run_seen_in_one_scan_keeps_its_last_loss(tmp_path: Path) -> None:
    """A Trainer faster than a sample (all its trainer_state.json copies in one scan): the
    last step's loss stays the loss, and the copies' older entries raise no divergence."""
    for mtime, name in enumerate(["checkpoint-10", "checkpoint-20", ""], start=1):
        state = tmp_path / name / "trainer_state.json"
        state.parent.mkdir(exist_ok=True)
        shutil.copy(FIXTURES / name / "trainer_state.json", state)
        os.utime(state, ns=(mtime * 10**9, mtime * 10**9))
    tracker = StepTracker()
    update = tracker.observe(read(StepReader(tmp_path)), now=1.0)
    assert (tracker.step, tracker.max_steps) == (20, 20)
    assert (tracker.loss, tracker.loss_step) == (1.2152782678604126, 20)
    assert tracker.source != "checkpoint-10/trainer_state.json"
    assert (update.warnings, update.notes) == ([], [])


def test_explicit_keys_override_the_detection(tmp_path: Path) -> None:
    """--step-key/--loss-key pick the keys; an unknown step key is a warning naming the keys."""
    (tmp_path / "log.jsonl").write_text('{"batch": 3, "objective": 0.5, "step": 99}\n')
    reading = read(StepReader(tmp_path, keys=KeyChoice("batch", "objective")))
    assert [(r.step, r.loss) for r in reading.records] == [(3, 0.5)]
    tracker = StepTracker(step_key="nope")
    update = tracker.observe(read(StepReader(tmp_path, keys=KeyChoice("nope"))), now=1.0)
    assert tracker.step is None
    assert update.warnings == [
        "no record of log.jsonl carries 'nope' (its keys: batch, objective, step)"
    ]
    waiting = ProgressTracker(
        {}, startup_timeout=5.0, stale_after=5.0, steps=tracker, source="steps"
    )
    assert waiting.verdict(5.0) == (
        "startup_timeout",
        "no training step within startup_timeout_seconds=5 (no record of log.jsonl carries 'nope')",
    )


def test_the_report_file_comes_first_and_is_not_read_twice(tmp_path: Path) -> None:
    """asyncsoak.trainer.report's file outranks metrics files, even inside the progress dir."""
    report = tmp_path / "soak.steps.jsonl"
    report.write_text('{"step": 40}\n')
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n')
    reader = StepReader(tmp_path, report_file=report)
    tracker = StepTracker()
    tracker.observe(read(reader), now=1.0)
    assert (tracker.step, tracker.source_kind) == (40, "asyncsoak.trainer.report")


def test_a_step_that_goes_back_is_a_note_and_an_advance() -> None:
    """A resume from an earlier checkpoint moves the step back: noted, never a stall."""
    tracker = StepTracker()
    kind = _steps.KIND_JSONL
    tracker.observe(StepReading(records=[_steps.StepRecord(120, "m.jsonl", kind)]), now=1.0)
    update = tracker.observe(
        StepReading(records=[_steps.StepRecord(100, "m.jsonl", kind, where="line 9")]), now=2.0
    )
    assert update.advanced
    assert tracker.step == 100
    assert update.notes == [
        "the step went back from 120 to 100 in m.jsonl (line 9): a resume from an earlier "
        "checkpoint?"
    ]


def test_rate_and_eta_from_advances() -> None:
    """Steps per second over the recent advances; the ETA to max_steps at that rate."""
    tracker = StepTracker()
    kind = _steps.KIND_JSONL
    for i in range(11):
        record = _steps.StepRecord(i * 50, "m.jsonl", kind, loss=1.0, max_steps=1_000)
        tracker.observe(StepReading(records=[record]), now=float(i))
    assert tracker.steps_per_second == pytest.approx(50.0)
    assert tracker.eta_seconds() == pytest.approx(10.0)


def test_the_first_non_finite_loss_names_its_step_and_value_once() -> None:
    """NaN and infinities are caught on any record, said once; loss_check=off says nothing."""
    kind = _steps.KIND_JSONL
    records = [
        _steps.StepRecord(29, "m.jsonl", kind, loss=0.5, where="line 30"),
        _steps.StepRecord(30, "m.jsonl", kind, loss=math.nan, where="line 31"),
        _steps.StepRecord(31, "m.jsonl", kind, loss=-math.inf, where="line 32"),
    ]
    tracker = StepTracker()
    update = tracker.observe(StepReading(records=records), now=1.0)
    assert update.nonfinite == "the loss is NaN at step 30 (m.jsonl line 31)"
    assert tracker.loss == 0.5  # the newest finite one
    assert tracker.observe(StepReading(records=records), now=2.0).nonfinite is None
    off = StepTracker(loss_check="off")
    assert off.observe(StepReading(records=records), now=1.0).nonfinite is None


def test_divergence_is_a_warning_once() -> None:
    """The recent median above 2x the run's best median: one warning, the run goes on."""
    tracker = StepTracker()
    kind = _steps.KIND_JSONL
    losses = [2.0 - i * 0.05 for i in range(30)] + [5.0] * 10
    warnings = []
    for step, loss in enumerate(losses):
        record = _steps.StepRecord(step, "m.jsonl", kind, loss=loss)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert len(warnings) == 1
    assert warnings[0].startswith("the loss is diverging")
    steady = StepTracker()
    for step in range(200):
        record = _steps.StepRecord(step, "m.jsonl", kind, loss=1.0 + 0.3 * (step % 7))
        assert not steady.observe(StepReading(records=[record]), now=float(step)).warnings


def checkpointing_run(limit: StaleLimit, *, until: float, hang_at: float | None = None) -> float:
    """Steps seen every 0.25 s, a 6 s pause every 15 s; the time the limit would fire, or
    ``until`` when it never does."""
    now, last, next_pause = 0.5, None, 15.5
    while now < until:
        if hang_at is not None and now >= hang_at:
            assert last is not None
            return last + limit.limit
        if last is not None and now - last > limit.limit:
            return last + limit.limit
        limit.advance(now, None if last is None else now - last)
        last = now
        if now >= next_pause:
            now += 6.0
            next_pause += 21.0
        else:
            now += 0.25
    return until


def test_auto_limit_learns_checkpoint_pauses_and_bounds_a_hang() -> None:
    """The documented rule: the startup limit in the warm-up, then 3 x the time-weighted
    high quantile of the gaps: 6 s checkpoints pass, a hang fails within 3 x 6 s."""
    passing = StaleLimit(startup_limit=20.0)
    assert checkpointing_run(passing, until=300.0) == 300.0
    assert passing.learned is not None
    assert 6.0 * AUTO_SAFETY_FACTOR <= passing.learned <= 6.0 * AUTO_SAFETY_FACTOR * 1.06
    hanging = StaleLimit(startup_limit=20.0)
    fired = checkpointing_run(hanging, until=300.0, hang_at=35.0)
    assert fired - 35.0 <= AUTO_SAFETY_FACTOR * 6.0 * 1.06


def test_auto_limit_floor_and_carried_limit() -> None:
    """A fast steady run is floored; a carried limit applies from the start and stays a floor."""
    steady = StaleLimit(startup_limit=5.0)
    for i in range(100):
        steady.advance(i * 0.1, None if i == 0 else 0.1)
    assert steady.learned == AUTO_FLOOR_SECONDS
    carried = StaleLimit(startup_limit=600.0, carried=90.0)
    assert carried.limit == 90.0
    for i in range(100):
        carried.advance(i * 10.0, None if i == 0 else 10.0)
    assert carried.learned == 90.0


def test_files_that_grow_do_not_hide_a_frozen_step() -> None:
    """With a step source, the deadline is the last advance plus the limit, whatever changes."""
    tracker = ProgressTracker({}, startup_timeout=10.0, stale_after=5.0, steps=StepTracker())
    kind = _steps.KIND_JSONL
    assert tracker.stepping() is False
    frozen = StepReading(records=[_steps.StepRecord(5, "metrics.jsonl", kind)])
    tracker.observe_steps(frozen, now=1.0)
    assert tracker.stepping()
    for t in range(2, 7):
        tracker.observe({"metrics.jsonl": _state(t)}, now=float(t))
        tracker.observe_steps(StepReading(records=frozen.records, lines={"metrics.jsonl": 10}), t)
    assert tracker.verdict(5.9) is None
    assert tracker.verdict(6.0) == (
        "stale_progress",
        "step 5 has not advanced for 5.0 s although metrics.jsonl grew 50 lines "
        "(stale_progress_seconds=5)",
    )


def test_checkpoint_steps_alone_leave_file_changes_as_the_progress_under_auto() -> None:
    """trainer_state.json moves only at checkpoint saves: under auto the file changes stay
    the progress (a limit set for them must not kill the run between two saves); under
    steps, the checkpoints' steps count."""
    record = _steps.StepRecord(500, "checkpoint-500/trainer_state.json", _steps.KIND_STATE)
    saved = StepReading(records=[record])
    auto = ProgressTracker({}, startup_timeout=10.0, stale_after=5.0, steps=StepTracker())
    auto.observe_steps(saved, now=1.0)
    assert (auto.stepping(), auto.steps and auto.steps.step) == (False, 500)
    steps = ProgressTracker(
        {}, startup_timeout=10.0, stale_after=5.0, steps=StepTracker(), source="steps"
    )
    steps.observe_steps(saved, now=1.0)
    assert steps.stepping()
    assert steps.deadline() == 6.0


def test_steps_source_waits_for_the_first_step() -> None:
    """--progress-source steps: file changes never end the startup; the first step does."""
    tracker = ProgressTracker(
        {}, startup_timeout=10.0, stale_after=5.0, steps=StepTracker(), source="steps"
    )
    tracker.observe({"log.txt": _state(1)}, now=1.0)
    assert tracker.deadline() == 10.0
    reason, message = tracker.verdict(10.0) or ("", "")
    assert reason == "startup_timeout"
    assert "no training step" in message


def _state(size: int) -> FileState:
    return FileState(dev=1, ino=1, size=size, mtime_ns=size)


REPORT_CHILD = """
import json, math, os, sys
from asyncsoak import trainer
path = os.environ["ASYNCSOAK_STEPS_FILE"]
for step in range(100):
    trainer.report(step, loss=1.0)
throttled = open(path).read().splitlines()
trainer.report(100, loss=float("nan"))
urgent = open(path).read().splitlines()
errors = []
for bad in ((True,), (-1,), ("5",)):
    try:
        trainer.report(*bad)
    except (TypeError, ValueError) as exc:
        errors.append(type(exc).__name__)
try:
    trainer.report(1, loss="low")
except TypeError:
    errors.append("TypeError")
print(json.dumps({"throttled": throttled, "urgent": urgent[-1], "errors": errors}))
"""


@pytest.mark.slow
def test_trainer_report_throttles_writes_nan_at_once_and_checks_its_arguments(
    tmp_path: Path,
) -> None:
    """report() writes one line per 0.1 s at most, a NaN loss at once (as json writes it),
    refuses a step that is not a whole number >= 0, and writes nothing outside asyncsoak."""
    steps = tmp_path / "soak.steps.jsonl"
    env = {**os.environ, "ASYNCSOAK_STEPS_FILE": str(steps), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", REPORT_CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["throttled"] == ['{"step":0,"loss":1.0}']
    assert seen["urgent"] == '{"step":100,"loss":NaN}'
    assert seen["errors"] == ["TypeError", "ValueError", "TypeError", "TypeError"]
    del env["ASYNCSOAK_STEPS_FILE"]
    outside = "from asyncsoak import trainer; trainer.report(3, loss=1.0)"
    subprocess.run([sys.executable, "-c", outside], env=env, check=True, timeout=60)
    assert steps.read_text().splitlines()[-1] == '{"step":100,"loss":NaN}'


def test_the_slowdown_warning_is_judged_on_the_step_rate() -> None:
    """Steps that slow to a fifth of their early rate: the warning speaks in steps/s, even
    while the files change at an even pace."""
    watch = TrendWatch()
    for i in range(200):
        t = float(i)
        watch.add_step_rate(t, 50.0 if i < 100 else 10.0)
        # Only what the trends read of each.
        watch.add_progress(t, cast(ProgressJson, {"changed": 1, "grown_bytes": 100}))
        watch.add_sample(
            t, cast(SampleJson, {"points": {"tree": {"rss_bytes": 1e6}}, "processes": []})
        )
    trends = watch.evaluate(lambda t: None)
    assert trends["progress.steps_per_second"]["verdict"] == "slowing"
    finding = slowdown(trends)
    assert finding is not None
    assert finding.series == "progress.steps_per_second"
    assert (
        finding.message
        == "progress slowing: 10 steps/s in the last quarter against 50 in the first"
    )


def test_a_stall_on_a_rarely_logged_step_says_what_to_set() -> None:
    """A trainer that logs its step minutes apart: the failure says the limit is shorter than
    its logging interval and what to set; a hang after steady steps says nothing of it."""
    metrics = "metrics.jsonl"
    rare = ProgressTracker({}, startup_timeout=600.0, stale_after=120.0, steps=StepTracker())
    rare.observe_steps(StepReading(records=[_steps.StepRecord(500, metrics, 1)]), now=60.0)
    broken = rare.verdict(181.0)
    assert broken is not None
    assert broken[0] == "stale_progress"
    assert "no second step yet" in broken[1]
    assert "set --stale-progress above its logging interval, or auto" in broken[1]
    steady = ProgressTracker({}, startup_timeout=600.0, stale_after=120.0, steps=StepTracker())
    for step in range(1, 30):
        steady.observe_steps(StepReading(records=[_steps.StepRecord(step, metrics, 1)]), step)
    broken = steady.verdict(150.0)
    assert broken == (
        "stale_progress",
        "step 29 has not advanced for 121.0 s (stale_progress_seconds=120)",
    )


def test_a_step_counted_within_each_epoch_is_noted_once(tmp_path: Path) -> None:
    """A loop that logs {"epoch", "step"} with the step restarting at each epoch: progress,
    said once, not a resume note at every epoch."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.touch()
    reader, tracker = StepReader(tmp_path), StepTracker()
    notes: list[str] = []
    for now, (epoch, step) in enumerate((e, s) for e in range(4) for s in (0, 50, 100)):
        append(metrics, json.dumps({"epoch": epoch, "step": step, "loss": 1.0}) + "\n")
        update = tracker.observe(read(reader), now=float(now))
        assert update.advanced
        notes += update.notes
    assert notes == ["metrics.jsonl counts its step within each epoch (it restarted at epoch 1)"]
    assert tracker.step == 100
    assert tracker.steps_per_second == 50.0


def test_a_second_file_with_its_own_counter_does_not_hide_a_frozen_step() -> None:
    """train.jsonl frozen at step 300 while eval.jsonl counts its batches 0, 1, 2 over and
    over (an eval loop that never ends): not an advance, not a resume, and the run stays at
    step 300."""
    tracker = StepTracker()
    kind = _steps.KIND_JSONL

    def reading(train: int, *, eval_first: bool = False) -> StepReading:
        records = [_steps.StepRecord(batch, "eval.jsonl", kind) for batch in range(3)]
        train_record = _steps.StepRecord(train, "train.jsonl", kind)
        records.insert(len(records) if eval_first else 0, train_record)
        return StepReading(records=records)

    assert tracker.observe(reading(300, eval_first=True), now=1.0).advanced
    notes = []
    for now in range(2, 6):
        update = tracker.observe(reading(300), now=float(now))
        assert not update.advanced
        assert tracker.step == 300
        notes += update.notes
    assert not any("resume" in note for note in notes)


def test_a_resume_is_read_in_the_file_that_led_though_another_is_ahead() -> None:
    """train.jsonl (which led the run) resumes at 4001 while eval.jsonl last said 5000: a
    resume, the run is back at 4001 (not held at 5000 until train.jsonl passes it)."""
    tracker = StepTracker()
    kind = _steps.KIND_JSONL
    tracker.observe(StepReading(records=[_steps.StepRecord(4990, "train.jsonl", kind)]), 1.0)
    tracker.observe(StepReading(records=[_steps.StepRecord(5000, "eval.jsonl", kind)]), 2.0)
    update = tracker.observe(
        StepReading(records=[_steps.StepRecord(4001, "train.jsonl", kind)]), now=3.0
    )
    assert update.advanced
    assert tracker.step == 4001
    assert "a resume from an earlier checkpoint?" in update.notes[0]


def test_an_earlier_runs_trainer_state_is_where_the_run_resumes_from(tmp_path: Path) -> None:
    """trainer_state.json present at the start, its last loss NaN (why the run is resumed):
    not this run's step nor its loss; the next save's new entries are."""
    state = json.loads((FIXTURES / "checkpoint-10" / "trainer_state.json").read_text())
    state["log_history"][-1]["loss"] = math.nan
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    reader = StepReader(tmp_path, baseline={"trainer_state.json": path.stat().st_size})
    tracker = StepTracker()
    update = tracker.observe(read(reader), now=1.0)
    assert (update.advanced, update.nonfinite, tracker.step) == (False, None, None)
    assert tracker.max_steps == 20
    state["global_step"] = 11
    state["log_history"].append({"step": 11, "loss": math.inf, "epoch": 1.1})
    path.write_text(json.dumps(state))
    update = tracker.observe(read(reader), now=2.0)
    assert update.advanced
    assert tracker.step == 11
    assert update.nonfinite is not None
    assert update.nonfinite.startswith("the loss is Infinity at step 11 ")


def test_noise_of_a_loss_near_zero_is_not_a_divergence() -> None:
    """A loss trained from 2.3 down to 0.002 (a small set memorised) then wobbling between
    0.002 and 0.01: twice its best, but a sliver of what it learned: no warning; a climb back
    to 0.5 is one."""
    kind = _steps.KIND_JSONL
    trained = [2.3 * 0.8**i for i in range(35)]  # down to about 0.002
    wobble = [0.002, 0.009, 0.004, 0.01, 0.006] * 20
    tracker = StepTracker()
    warnings = []
    for step, loss in enumerate(trained + wobble):
        record = _steps.StepRecord(step, "m.jsonl", kind, loss=loss)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert warnings == []
    for step in range(len(trained + wobble), len(trained + wobble) + 10):
        record = _steps.StepRecord(step, "m.jsonl", kind, loss=0.5)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert len(warnings) == 1
    assert warnings[0].startswith("the loss is diverging")


def test_a_negative_or_zero_loss_is_no_divergence_and_not_non_finite() -> None:
    """A log-likelihood loss falling from -10 to -500, and a loss of exactly 0.0: no warning,
    no failure, the loss shown as logged."""
    kind = _steps.KIND_JSONL
    for losses in ([-10.0 - 5 * i + (i % 3) for i in range(100)], [0.0] * 50):
        tracker = StepTracker()
        for step, loss in enumerate(losses):
            record = _steps.StepRecord(step, "m.jsonl", kind, loss=loss)
            update = tracker.observe(StepReading(records=[record]), now=float(step))
            assert (update.warnings, update.nonfinite) == ([], None)
        assert tracker.loss == losses[-1]


def test_an_auto_stall_says_the_longest_gap_it_learned_from() -> None:
    """A stall under auto names the longest gap the limit was learned from (a first checkpoint
    longer than any seen is then plain) and the --startup-timeout that covers it."""
    auto = StaleLimit(startup_limit=5.0)
    tracker = ProgressTracker(
        {}, startup_timeout=5.0, stale_after=5.0, auto=auto, steps=StepTracker()
    )
    for step in range(40):
        record = _steps.StepRecord(step, "metrics.jsonl", _steps.KIND_JSONL)
        tracker.observe_steps(StepReading(records=[record]), now=step * 0.5)
    broken = tracker.verdict(19.5 + 10.5)
    assert broken is not None
    assert broken[1] == (
        "step 39 has not advanced for 10.5 s (stale_progress_seconds=auto, 10.0 s learned from "
        "gaps of at most 0.5 s; a --startup-timeout longer than the run's first checkpoint or "
        "evaluation lets the warm-up see it)"
    )
