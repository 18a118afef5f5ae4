"""The goodput ledger as a pure function of recorded step series."""

from __future__ import annotations

import math

import pytest

from asyncsoak._analysis._goodput import (
    BADPUT_KINDS,
    NO_STEPS,
    Ledger,
    RunEnds,
    StepMark,
    ledger,
    step_times,
)
from asyncsoak._contract import trainer_seconds

EPOCH = 1_765_000_000.0


def series(durations: list[float], start: float, first_step: int = 1) -> list[StepMark]:
    """Marks of steps taking ``durations`` after a first step at ``start``, each carrying the
    trainer's own time; the monitor sees each 0.2 s late."""
    marks, t = [StepMark(first_step, start + 0.2, EPOCH + start)], start
    for i, d in enumerate(durations, first_step + 1):
        t += d
        marks.append(StepMark(i, t + 0.2, EPOCH + t))
    return marks


def assert_adds_up(out: Ledger) -> None:
    parts = out.badput_seconds
    assert set(parts) == set(BADPUT_KINDS)
    assert all(v >= 0 for v in parts.values()), parts
    assert out.productive_seconds + sum(parts.values()) == pytest.approx(out.wall_seconds)


def test_a_steady_run_is_productive_but_for_start_up_and_shutdown() -> None:
    marks = series([0.1] * 99, start=3.0)
    out = ledger(marks, RunEnds(end_t=13.2))
    assert_adds_up(out)
    assert out.ideal_step_seconds == pytest.approx(0.1, abs=1e-3)
    assert out.steps == 100
    assert out.productive_seconds == pytest.approx(10.0, abs=1e-3)
    assert out.badput_seconds["startup"] == pytest.approx(
        3.1, abs=1e-3
    )  # seen at 3.2 s, less a step
    assert out.badput_seconds["shutdown"] == pytest.approx(0.1, abs=1e-3)
    assert out.badput_seconds["other"] < 0.01
    assert out.to_json()["ratio"] == pytest.approx(10.0 / 13.2, abs=1e-3)


def test_the_issues_shape_a_slow_step_and_a_checkpoint_pause() -> None:
    """3 s of start-up, 100 steps of 0.1 s, one of 1 s, a 2 s checkpoint write after step 60."""
    durations = [0.1] * 100
    durations[30] = 1.0
    durations[59] = 2.1
    marks = series(durations, start=3.0)
    writes = [marks[59].seen_t + 0.5, marks[59].seen_t + 1.0, marks[59].seen_t + 1.5]
    end = marks[-1].seen_t + 0.3
    out = ledger(marks, RunEnds(end_t=end), checkpoint_times=writes, lag_seconds=0.5)
    assert_adds_up(out)
    parts = out.badput_seconds
    assert parts["startup"] >= 2.5
    assert parts["slow_steps"] == pytest.approx(0.9, abs=1e-3)
    assert parts["checkpoint"] == pytest.approx(2.0, abs=1e-3)
    assert parts["other"] < 0.1 * out.wall_seconds
    # The productive share by the definition, on the trainer's own times.
    assert out.productive_seconds / end == pytest.approx(0.1 * 101 / end, abs=0.03)


def test_steps_redone_after_a_restart_are_wasted() -> None:
    """The second attempt resumes at 21 after the first reached 30: 21..30 are wasted."""
    marks = series([0.1] * 29, start=1.0, first_step=21)
    out = ledger(marks, RunEnds(end_t=marks[-1].seen_t), earlier_highest_step=30)
    assert_adds_up(out)
    assert out.steps == 20  # 31..50
    assert out.badput_seconds["wasted"] == pytest.approx(1.0, abs=1e-3)


def test_a_stall_is_the_last_step_to_the_failure_then_shutdown() -> None:
    marks = series([0.1] * 9, start=1.0)
    last = marks[-1].seen_t
    out = ledger(marks, RunEnds(end_t=last + 12.0, failure_t=last + 10.0, stalled=True))
    assert_adds_up(out)
    assert out.badput_seconds["stall"] == pytest.approx(10.0, abs=1e-3)
    assert out.badput_seconds["shutdown"] == pytest.approx(2.0, abs=1e-3)


def test_a_run_without_steps_is_all_other_and_says_why() -> None:
    out = ledger([], RunEnds(end_t=5.0))
    assert_adds_up(out)
    assert out.badput_seconds["other"] == 5.0
    assert out.to_json()["ratio"] is None
    assert out.note == NO_STEPS


def test_trainer_times_on_another_clock_fall_back_to_the_monitors() -> None:
    good = series([0.1] * 5, start=1.0)
    assert step_times(good) == pytest.approx([m.seen_t for m in good])
    milliseconds = [StepMark(m.step, m.seen_t, (m.trainer_time or 0) * 1000) for m in good]
    assert step_times(milliseconds) == [m.seen_t for m in good]
    backwards = [StepMark(m.step, m.seen_t, EPOCH - i) for i, m in enumerate(good)]
    assert step_times(backwards) == [m.seen_t for m in good]
    some = [*good[:3], StepMark(9, 9.0)]
    assert step_times(some) == [m.seen_t for m in some]


def batched(count: int, step_seconds: float, start: float, scan_seconds: float) -> list[StepMark]:
    """A trainer without timestamps, its records read in batches by scans ``scan_seconds``
    apart: every record a scan reads is seen at the scan's time."""
    return [
        StepMark(i, start + math.ceil((i - 1) * step_seconds / scan_seconds) * scan_seconds)
        for i in range(1, count + 1)
    ]


def test_records_read_in_batches_give_one_gap_each_not_steps_of_no_time() -> None:
    """600 steps of 0.1 s read by scans a second apart: the ideal is 0.1 s, not 0 (all the
    time was slow steps before)."""
    out = ledger(batched(600, 0.1, 3.0, 1.0), RunEnds(end_t=63.5))
    assert_adds_up(out)
    assert out.ideal_step_seconds == pytest.approx(0.1, abs=1e-3)
    assert out.to_json()["ratio"] == pytest.approx(60 / 63.5, abs=0.02)


def test_trainer_times_to_the_second_are_batches_too() -> None:
    marks = [StepMark(i, 3.0 + i * 0.1, EPOCH + math.floor(3.0 + i * 0.1)) for i in range(600)]
    out = ledger(marks, RunEnds(end_t=63.0))
    assert out.ideal_step_seconds == pytest.approx(0.1, abs=1e-3)
    assert out.to_json()["ratio"] == pytest.approx(60 / 63.0, abs=0.02)


def test_a_late_first_scan_shifts_no_step() -> None:
    """Steps stamped 0.1 s apart, the first eight seen together 0.8 s late: the trainer's
    times are anchored by the smallest delay, so the ideal stays 0.1 s."""
    marks = series([0.1] * 199, start=3.0)
    late = [StepMark(m.step, 3.8, m.trainer_time) for m in marks[:8]]
    out = ledger([*late, *marks[8:]], RunEnds(end_t=marks[-1].seen_t))
    assert out.ideal_step_seconds == pytest.approx(0.1, abs=1e-3)
    assert out.to_json()["ratio"] == pytest.approx(20.0 / marks[-1].seen_t, abs=0.01)


def test_an_epochs_step_counter_starting_again_is_new_steps() -> None:
    marks = [
        StepMark(i, 3.0 + (epoch * 100 + i) * 0.1) for epoch in range(3) for i in range(1, 101)
    ]
    out = ledger(marks, RunEnds(end_t=marks[-1].seen_t))
    assert_adds_up(out)
    assert out.steps == 300
    assert out.badput_seconds["wasted"] == 0


def test_a_restart_within_the_run_redoes_its_steps() -> None:
    """Steps 1-30, a 5 s restart, then 21-60 again: 21-30 and the restart are wasted."""
    first = [StepMark(i, 3.0 + i * 0.1) for i in range(1, 31)]
    again = [StepMark(i, 11.0 + (i - 21) * 0.1) for i in range(21, 61)]
    out = ledger([*first, *again], RunEnds(end_t=again[-1].seen_t))
    assert_adds_up(out)
    assert out.steps == 60
    assert out.badput_seconds["wasted"] == pytest.approx(5.0 + 0.9, abs=0.15)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (EPOCH, EPOCH),
        (int(EPOCH), EPOCH),
        ("2025-12-06T05:46:40Z", EPOCH),
        ("2025-12-06T05:46:40+00:00", EPOCH),
        ("nan", None),
        (float("nan"), None),
        (True, None),
        ("yesterday", None),
        (None, None),
        (-5, None),
        (0.1, None),  # a step's duration, not a time
        (EPOCH * 1000, EPOCH),  # milliseconds
        (EPOCH * 1e9, EPOCH),  # nanoseconds
    ],
)
def test_a_records_time_field(value: object, seconds: float | None) -> None:
    assert trainer_seconds(value) == seconds
