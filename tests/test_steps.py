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
from asyncsoak._contract import events
from asyncsoak._sampling import _step_files, _steps
from asyncsoak._sampling._progress_rules import ProgressTracker
from asyncsoak._sampling._progress_scan import FileState, scan_progress_dir
from asyncsoak._sampling._step_files import KeyChoice, StepReading
from asyncsoak._sampling._step_rules import (
    AUTO_FLOOR_SECONDS,
    AUTO_SAFETY_FACTOR,
    LossCheck,
    StaleLimit,
    StepTracker,
)
from asyncsoak._sampling._steps import StepReader
from asyncsoak._supervisor._judge import slowdown
from asyncsoak._view._training import loss_text

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
    huge = '{"step": 9, "pad": "' + "x" * (_step_files.MAX_LINE_BYTES + 10) + '"}\n'
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
    append(metrics, "y" * (_step_files.MAX_LINE_BYTES + 1))
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


def test_an_unknown_step_key_names_a_csvs_columns_in_the_files_order(tmp_path: Path) -> None:
    """A CSV's keys are named as its header lists them (the first 20 of a wide log), not sorted."""
    columns = ["train_loss", "epoch", "lr", *(f"col{i:02d}" for i in range(20)), "a_last"]
    rows = ",".join(columns) + "\n" + ",".join(str(i) for i in range(len(columns))) + "\n"
    (tmp_path / "metrics.csv").write_text(rows)
    tracker = StepTracker(step_key="nope")
    update = tracker.observe(read(StepReader(tmp_path, keys=KeyChoice("nope"))), now=1.0)
    assert update.warnings == [
        f"no record of metrics.csv carries 'nope' (its keys: {', '.join(columns[:20])})"
    ]


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
    kind = _step_files.KIND_JSONL
    tracker.observe(StepReading(records=[_step_files.StepRecord(120, "m.jsonl", kind)]), now=1.0)
    update = tracker.observe(
        StepReading(records=[_step_files.StepRecord(100, "m.jsonl", kind, where="line 9")]), now=2.0
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
    kind = _step_files.KIND_JSONL
    for i in range(11):
        record = _step_files.StepRecord(i * 50, "m.jsonl", kind, loss=1.0, max_steps=1_000)
        tracker.observe(StepReading(records=[record]), now=float(i))
    assert tracker.steps_per_second == pytest.approx(50.0)
    assert tracker.eta_seconds() == pytest.approx(10.0)


def test_the_rate_is_over_the_last_ten_steps_or_thirty_seconds_whichever_is_shorter() -> None:
    """A step a second for 20 s, then ten steps in one second: 10 steps/s, not a blend of
    the last 30 s; a step a minute: the rate over the last two advances."""
    tracker = StepTracker()
    kind = _step_files.KIND_JSONL
    times = [float(i) for i in range(21)] + [20.0 + 0.1 * i for i in range(1, 11)]
    for step, now in enumerate(times):
        tracker.observe(StepReading(records=[_step_files.StepRecord(step, "m.jsonl", kind)]), now)
    assert tracker.steps_per_second == pytest.approx(10.0)
    slow = StepTracker()
    for step in range(4):
        slow.observe(
            StepReading(records=[_step_files.StepRecord(step, "m.jsonl", kind)]), 60.0 * step
        )
    assert slow.steps_per_second == pytest.approx(1 / 60)


def test_the_rate_is_zero_once_no_step_came_for_three_median_gaps() -> None:
    """Steps 0.5 s apart, then none: the rate holds for 1.5 s after the last advance, then is
    0 (a figure that changed: the step line is written again), and the ETA unknown."""
    tracker = StepTracker()
    kind = _step_files.KIND_JSONL
    for step in range(12):
        record = _step_files.StepRecord(step, "m.jsonl", kind, max_steps=100)
        tracker.observe(StepReading(records=[record]), now=0.5 * step)
    assert tracker.steps_per_second == pytest.approx(2.0)
    assert not tracker.observe(StepReading(), now=5.5 + 1.4).changed
    assert tracker.steps_per_second == pytest.approx(2.0)
    assert tracker.observe(StepReading(), now=5.5 + 1.6).changed
    assert tracker.steps_per_second == 0.0
    assert tracker.eta_seconds() is None
    assert not tracker.observe(StepReading(), now=9.0).changed  # said once


def test_a_run_failed_on_a_non_finite_loss_keeps_it_as_its_headline_loss() -> None:
    """Under --loss-check fail the non-finite loss the run fails on is kept (spelled as
    Python does) beside the newest finite one; under warn it is not the headline."""
    kind = _step_files.KIND_JSONL
    records = [
        _step_files.StepRecord(14, "m.jsonl", kind, loss=0.5),
        _step_files.StepRecord(15, "m.jsonl", kind, loss=-math.inf),
        _step_files.StepRecord(16, "m.jsonl", kind, loss=0.4),
    ]
    tracker = StepTracker()
    tracker.observe(StepReading(records=records), now=1.0)
    assert tracker.nonfinite_loss == "-inf"
    warned = StepTracker(loss_check="warn")
    warned.observe(StepReading(records=records), now=1.0)
    assert warned.nonfinite_loss is None


def test_the_first_non_finite_loss_names_its_step_and_value_once() -> None:
    """NaN and infinities are caught on any record, said once; loss_check=off says nothing."""
    kind = _step_files.KIND_JSONL
    records = [
        _step_files.StepRecord(29, "m.jsonl", kind, loss=0.5, where="line 30"),
        _step_files.StepRecord(30, "m.jsonl", kind, loss=math.nan, where="line 31"),
        _step_files.StepRecord(31, "m.jsonl", kind, loss=-math.inf, where="line 32"),
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
    kind = _step_files.KIND_JSONL
    losses = [2.0 - i * 0.05 for i in range(30)] + [5.0] * 10
    warnings = []
    for step, loss in enumerate(losses):
        record = _step_files.StepRecord(step, "m.jsonl", kind, loss=loss)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert len(warnings) == 1
    assert warnings[0].startswith("the loss is diverging")
    steady = StepTracker()
    for step in range(200):
        record = _step_files.StepRecord(step, "m.jsonl", kind, loss=1.0 + 0.3 * (step % 7))
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
    kind = _step_files.KIND_JSONL
    assert tracker.stepping() is False
    frozen = StepReading(records=[_step_files.StepRecord(5, "metrics.jsonl", kind)])
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
    record = _step_files.StepRecord(
        500, "checkpoint-500/trainer_state.json", _step_files.KIND_STATE
    )
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
        watch.add_progress(t, cast(events.ProgressJson, {"changed": 1, "grown_bytes": 100}))
        watch.add_sample(
            t, cast(events.SampleJson, {"points": {"tree": {"rss_bytes": 1e6}}, "processes": []})
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
    rare.observe_steps(StepReading(records=[_step_files.StepRecord(500, metrics, 1)]), now=60.0)
    broken = rare.verdict(181.0)
    assert broken is not None
    assert broken[0] == "stale_progress"
    assert "no second step yet" in broken[1]
    assert "set --stale-progress above its logging interval, or auto" in broken[1]
    steady = ProgressTracker({}, startup_timeout=600.0, stale_after=120.0, steps=StepTracker())
    for step in range(1, 30):
        steady.observe_steps(StepReading(records=[_step_files.StepRecord(step, metrics, 1)]), step)
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
    kind = _step_files.KIND_JSONL

    def reading(train: int, *, eval_first: bool = False) -> StepReading:
        records = [_step_files.StepRecord(batch, "eval.jsonl", kind) for batch in range(3)]
        train_record = _step_files.StepRecord(train, "train.jsonl", kind)
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
    kind = _step_files.KIND_JSONL
    tracker.observe(StepReading(records=[_step_files.StepRecord(4990, "train.jsonl", kind)]), 1.0)
    tracker.observe(StepReading(records=[_step_files.StepRecord(5000, "eval.jsonl", kind)]), 2.0)
    update = tracker.observe(
        StepReading(records=[_step_files.StepRecord(4001, "train.jsonl", kind)]), now=3.0
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
    kind = _step_files.KIND_JSONL
    trained = [2.3 * 0.8**i for i in range(35)]  # down to about 0.002
    wobble = [0.002, 0.009, 0.004, 0.01, 0.006] * 20
    tracker = StepTracker()
    warnings = []
    for step, loss in enumerate(trained + wobble):
        record = _step_files.StepRecord(step, "m.jsonl", kind, loss=loss)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert warnings == []
    for step in range(len(trained + wobble), len(trained + wobble) + 10):
        record = _step_files.StepRecord(step, "m.jsonl", kind, loss=0.5)
        warnings += tracker.observe(StepReading(records=[record]), now=float(step)).warnings
    assert len(warnings) == 1
    assert warnings[0].startswith("the loss is diverging")


def test_a_negative_or_zero_loss_is_no_divergence_and_not_non_finite() -> None:
    """A log-likelihood loss falling from -10 to -500, and a loss of exactly 0.0: no warning,
    no failure, the loss shown as logged."""
    kind = _step_files.KIND_JSONL
    for losses in ([-10.0 - 5 * i + (i % 3) for i in range(100)], [0.0] * 50):
        tracker = StepTracker()
        for step, loss in enumerate(losses):
            record = _step_files.StepRecord(step, "m.jsonl", kind, loss=loss)
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
        record = _step_files.StepRecord(step, "metrics.jsonl", _step_files.KIND_JSONL)
        tracker.observe_steps(StepReading(records=[record]), now=step * 0.5)
    broken = tracker.verdict(19.5 + 10.5)
    assert broken is not None
    assert broken[1] == (
        "step 39 has not advanced for 10.5 s (stale_progress_seconds=auto, 10.0 s learned from "
        "gaps of at most 0.5 s; a --startup-timeout longer than the run's first checkpoint or "
        "evaluation lets the warm-up see it)"
    )


def test_bare_nan_and_inf_tokens_are_read_as_the_non_finite_numbers_they_are(
    tmp_path: Path,
) -> None:
    """f'{{"step": {step}, "loss": {loss}}}' writes a bare nan: read as NaN, not garbage."""
    lines = [
        f'{{"step": {i}, "loss": {token}}}'
        for i, token in enumerate(
            ["nan", "NaN", "inf", "-inf", "Infinity", "-Infinity", "+inf", "0.5"]
        )
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    reader = StepReader(tmp_path)
    losses = [r.loss for r in read(reader).records]
    assert reader.garbage() == {}
    assert all(math.isnan(v or 0.0) for v in losses[:2])
    assert losses[2:] == [math.inf, -math.inf, math.inf, -math.inf, math.inf, 0.5]


def test_lightning_loss_columns_are_losses() -> None:
    """train_loss_step, *loss_step, train/loss_step and *_loss_epoch carry the loss; an
    exact loss key comes first, and --loss-key overrides them all."""
    keys = KeyChoice()
    for column in ("train_loss_step", "myloss_step", "train/loss_step", "train_loss_epoch"):
        record = keys.record({"step": "3", column: "nan", "epoch": "0"}, "m.csv", 2, "line 2")
        assert record is not None
        assert math.isnan(record.loss if record.loss is not None else 0.0), column
    record = keys.record({"step": 3, "loss": 1.5, "train_loss_step": 9.0}, "m", 1, "")
    assert record is not None
    assert record.loss == 1.5
    chosen = KeyChoice(loss_key="objective").record({"step": 3, "train_loss_step": 9.0}, "m", 1, "")
    assert chosen is not None
    assert chosen.loss is None


def test_a_file_rewritten_whole_by_tmp_and_rename_replays_nothing(tmp_path: Path) -> None:
    """A metrics file rewritten by tmp+rename at each step (its whole history, a falling
    loss): each read gives only the new steps; no "went back" note, no divergence warning,
    and the replacement is noted once."""
    reader, tracker = StepReader(tmp_path), StepTracker()
    history: list[str] = []
    notes: list[str] = []
    for step in range(60):
        history.append(json.dumps({"step": step, "loss": 10.0 / (step + 1)}))
        tmp = tmp_path / "metrics.jsonl.tmp"
        tmp.write_text("\n".join(history) + "\n")
        os.replace(tmp, tmp_path / "metrics.jsonl")
        reading = read(reader)
        assert [r.step for r in reading.records] == [step]
        update = tracker.observe(reading, now=float(step))
        assert update.warnings == []
        notes += update.notes
    assert len(notes) == 1
    assert "replaced" in notes[0]
    assert tracker.step == 59


def test_a_csv_rewritten_with_a_new_column_replays_nothing(tmp_path: Path) -> None:
    """Lightning rewrites metrics.csv whole when a column appears: the rows already read are
    not read again, and no "a resume from an earlier checkpoint?" note."""
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,train_loss_step\n0,1,2.0\n0,2,1.9\n")
    reader, tracker = StepReader(tmp_path), StepTracker()
    tracker.observe(read(reader), now=1.0)
    csv.write_text("epoch,step,train_loss_step,val_loss\n0,1,2.0,\n0,2,1.9,\n0,3,1.8,1.7\n")
    reading = read(reader)
    assert [(r.step, r.loss) for r in reading.records] == [(3, 1.8)]
    update = tracker.observe(reading, now=2.0)
    assert not any("went back" in note for note in update.notes)
    assert (tracker.step, tracker.loss) == (3, 1.8)


def test_a_truncated_file_that_restarts_lower_is_still_a_resume(tmp_path: Path) -> None:
    """A file truncated and written again from an earlier step (a resume that starts its log
    over): its records are read, and the step goes back."""
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(100, 110)))
    reader = StepReader(tmp_path)
    read(reader)
    metrics.write_text('{"step": 50}\n')
    assert [r.step for r in read(reader).records] == [50]


def test_a_gone_source_frees_its_place_and_the_newest_checkpoint_is_read(tmp_path: Path) -> None:
    """A Trainer with save_total_limit=2 saving every 2 steps for 80 steps (40 checkpoints):
    only the highest checkpoint-N is read, a deleted one is forgotten, the step reaches 80."""
    reader, tracker = StepReader(tmp_path), StepTracker()
    history: list[dict[str, object]] = []
    for step in range(2, 81, 2):
        history += [{"step": s, "loss": 1.0, "grad_norm": 1.0} for s in (step - 1, step)]
        state = tmp_path / f"checkpoint-{step}" / "trainer_state.json"
        state.parent.mkdir()
        state.write_text(json.dumps({"global_step": step, "log_history": history}))
        if step > 4:
            shutil.rmtree(tmp_path / f"checkpoint-{step - 4}")
        update = tracker.observe(read(reader), now=float(step))
        assert (update.advanced, update.notes) == (True, [])
        assert len(reader._sources) == 1
    assert (tracker.step, tracker.source) == (80, "checkpoint-80/trainer_state.json")
    assert len(tracker._last_by_source) == 1


def test_every_rank_file_is_followed_and_the_bound_is_a_warning(tmp_path: Path) -> None:
    """20 rank files, NaN on the last: read whatever their order; past MAX_SOURCES files, a
    warning (once), the newest followed; a file deleted frees its place for a waiting one."""
    for rank in range(20):
        loss = "NaN" if rank == 19 else "1.0"
        (tmp_path / f"rank{rank}.jsonl").write_text(f'{{"step": 5, "loss": {loss}}}\n')
    update = StepTracker().observe(read(StepReader(tmp_path)), now=1.0)
    assert "rank19.jsonl" in (update.nonfinite or "")
    assert _steps.MAX_SOURCES >= 256
    many = tmp_path / "many"
    many.mkdir()
    for i in range(_steps.MAX_SOURCES + 2):
        path = many / f"shard{i}.jsonl"
        path.write_text('{"step": 1}\n')
        os.utime(path, ns=(i * 10**9, i * 10**9))
    reader = StepReader(many)
    reading = read(reader)
    assert len(reading.warnings) == 1
    assert f"more than {_steps.MAX_SOURCES} step sources" in reading.warnings[0]
    assert {r.source for r in reading.records}.isdisjoint({"shard0.jsonl", "shard1.jsonl"})
    (many / "shard8.jsonl").unlink()
    (many / "shard9.jsonl").unlink()
    again = read(reader)
    assert sorted(r.source for r in again.records) == ["shard0.jsonl", "shard1.jsonl"]
    assert (again.warnings, sorted(again.gone)) == ([], ["shard8.jsonl", "shard9.jsonl"])


def test_the_step_is_the_highest_any_source_reached() -> None:
    """16 prep files that stopped at small steps, then train.jsonl: the step follows
    train.jsonl as soon as it passes them."""
    tracker = StepTracker()
    kind = _step_files.KIND_JSONL
    prep = [_step_files.StepRecord(3, f"prep/shard{i}.jsonl", kind) for i in range(16)]
    tracker.observe(StepReading(records=prep), now=1.0)
    for step in range(10):
        record = _step_files.StepRecord(step, "train.jsonl", kind, loss=1.0)
        update = tracker.observe(StepReading(records=[record]), now=2.0 + step)
        assert update.notes == []
    assert (tracker.step, tracker.source) == (9, "train.jsonl")


def grad_run(norms: list[float], loss_check: LossCheck = "fail") -> tuple[StepTracker, list[str]]:
    tracker, said = StepTracker(loss_check=loss_check), []
    for step, norm in enumerate(norms):
        record = _step_files.StepRecord(
            step, "s.json", 3, loss=0.0, grad_norm=norm, where=f"[{step}]"
        )
        update = tracker.observe(StepReading(records=[record]), now=float(step))
        said += [update.nonfinite] if update.nonfinite else []
    return tracker, said


def test_a_grad_norm_non_finite_five_logged_steps_in_a_row_is_a_nonfinite_loss() -> None:
    """A Trainer's NaN filter logs the loss as 0.0 and grad_norm as NaN: the fifth NaN in a
    row fails, naming the field; isolated ones (fp16 loss scaling) are only counted."""
    _, said = grad_run([1.0] * 5 + [math.nan] * 20)
    assert said == [
        "the grad_norm is NaN at 5 logged steps in a row, steps 5 to 9 (s.json [9]); "
        "the loss beside it is 0"
    ]
    tracker, said = grad_run(([1.0] * 4 + [math.inf]) * 6)
    assert said == []
    assert tracker.nonfinite_grad_norms == 6
    rotating, kind, said = StepTracker(), _step_files.KIND_STATE, []
    for n in range(2, 14, 2):  # checkpoint-N/, each read for its 2 new entries
        name = f"checkpoint-{n}/trainer_state.json"
        norm = 1.0 if n == 2 else math.nan
        records = [_step_files.StepRecord(s, name, kind, grad_norm=norm) for s in (n - 1, n)]
        gone = [f"checkpoint-{n - 2}/trainer_state.json"]
        update = rotating.observe(StepReading(records=records, gone=gone), now=float(n))
        said += [update.nonfinite] if update.nonfinite else []
    assert said == [
        "the grad_norm is NaN at 5 logged steps in a row, steps 3 to 7 "
        "(checkpoint-8/trainer_state.json )"
    ]


def test_non_finite_grad_norms_before_the_first_finite_one_are_the_start_up_scale_search() -> None:
    """fp16/DeepSpeed loss scaling skips overflow steps at start-up (grad_norm inf at each,
    8 in a row): counted, not failed; after a finite one, 5 in a row still fail."""
    tracker, said = grad_run([math.inf] * 8 + [1.0] * 10)
    assert (said, tracker.nonfinite_grad_norms, tracker.nonfinite_loss) == ([], 8, None)
    _, said = grad_run([math.inf] * 8 + [1.0] + [math.nan] * 5)
    assert said == [
        "the grad_norm is NaN at 5 logged steps in a row, steps 9 to 13 (s.json [13]); "
        "the loss beside it is 0"
    ]


def test_a_run_failed_on_its_grad_norm_shows_that_value_as_its_loss() -> None:
    """The loss beside a failing grad_norm is 0.0 (the NaN filter): the headline is ``loss
    nan``, not ``loss 0``; under warn the finite loss stays the headline."""
    tracker, _ = grad_run([1.0] * 5 + [math.nan] * 20)
    steps = {"nonfinite_loss": tracker.nonfinite_loss, "loss": tracker.loss}
    assert (tracker.nonfinite_loss, loss_text(steps)) == ("nan", "loss nan")
    warned, said = grad_run([1.0] * 5 + [math.inf] * 20, loss_check="warn")
    assert (len(said), warned.nonfinite_loss) == (1, None)


def test_any_source_advancing_is_progress_and_a_gone_source_holds_no_step() -> None:
    """Prep files that logged step 500 while train.jsonl counts from 0: each train step
    restarts the stale clock; once they are deleted the step is train.jsonl's; a frozen
    trainer beside them still fails stale_progress."""
    steps = StepTracker()
    tracker = ProgressTracker({}, startup_timeout=10.0, stale_after=5.0, steps=steps)
    kind = _step_files.KIND_JSONL
    prep = [_step_files.StepRecord(500, f"prep/shard{i}.jsonl", kind) for i in range(3)]
    tracker.observe_steps(StepReading(records=prep), now=1.0)
    for step in range(20):
        record = _step_files.StepRecord(step, "train.jsonl", kind, loss=1.0)
        assert tracker.observe_steps(StepReading(records=[record]), now=2.0 + step).advanced
        assert tracker.deadline() == 7.0 + step
    frozen = tracker.verdict(26.0)  # the trainer frozen at 19, the prep files beside it
    assert frozen is not None
    assert frozen[0] == "stale_progress"
    update = tracker.observe_steps(StepReading(gone=[r.source for r in prep]), now=22.0)
    assert (update.advanced, update.changed) == (False, True)
    assert (steps.step, steps.source) == (19, "train.jsonl")
    record = _step_files.StepRecord(20, "train.jsonl", kind, loss=1.0)
    assert tracker.observe_steps(StepReading(records=[record]), now=23.0).advanced
    assert steps.step == 20


def test_a_source_that_gives_steps_but_never_a_loss_is_named() -> None:
    tracker = StepTracker()
    kind = _step_files.KIND_JSONL
    records = [
        _step_files.StepRecord(1, "train.jsonl", kind, loss=1.0),
        _step_files.StepRecord(1, "eval.jsonl", kind),
        _step_files.StepRecord(1, "trainer_state.json", 3, where="global_step"),
    ]
    tracker.observe(StepReading(records=records), now=1.0)
    assert tracker.sources_without_loss() == ["eval.jsonl"]
