"""Training steps as progress, in real soaks: a frozen step, a NaN loss, a Hugging Face run,
asyncsoak.trainer.report, and --stale-progress auto against checkpoint pauses and a hang."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator

from asyncsoak import SoakFailureError, run_soak
from asyncsoak._export._soak_metrics import SoakMetrics
from asyncsoak._sampling._step_rules import AUTO_SAFETY_FACTOR
from asyncsoak._sampling._watchdog import HEARD_WAIT_SECONDS, JUDGE_GRACE_SECONDS
from asyncsoak._view._compare import compare
from asyncsoak._view._live_state import LiveState
from asyncsoak._view._summary import format_summary, summarize
from asyncsoak._view.report import render_report

from .conftest import assert_valid, asyncsoak_main, fast_limits, journal, py

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "hf_trainer"
INTERVAL = 0.25

FROZEN_STEP = """
    import json, os, sys, time
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
        for _ in range(300):
            f.write(json.dumps({"step": 5, "loss": 1.0}) + "\\n")
            f.flush()
            time.sleep(0.1)
"""


def events(artifact: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in artifact["events"] if e["kind"] == kind]


@pytest.mark.asyncio
async def test_a_frozen_step_fails_stale_progress_although_the_file_grows(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A trainer that appends {"step": 5} every 0.1 s fails within 6 s of its first step,
    the message naming the frozen step and how much the file grew meanwhile."""
    progress = tmp_path / "progress"
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=[*py(FROZEN_STEP), str(progress)],
            **fast_limits(
                tmp_path,
                sample_interval_seconds=INTERVAL,
                stale_progress_seconds=5.0,
                forensics=False,
            ),
        )
    artifact = info.value.artifact
    assert info.value.reason == "stale_progress"
    message = artifact["failures"][0]["message"]
    assert message.startswith("step 5 has not advanced for 5.")
    assert " s although metrics.jsonl grew " in message
    steps = journal(tmp_path / "out" / "soak.jsonl")
    first_step = next(e["t"] for e in steps if e["kind"] == "step")
    assert events(artifact, "failure")[0]["t"] - first_step <= 6.0
    assert artifact["progress"]["source"] == "steps"
    assert artifact["progress"]["steps"]["step"] == 5
    assert_valid(artifact, schema)


NAN_AT_30 = """
    import json, math, os, sys, time
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
        for step in range(200):
            loss = 2.0 / (step + 1) if step < 30 else float("nan")
            if step == 30:  # noted before the write: the monitor stops the tree once it reads it
                with open(sys.argv[2], "w") as note:
                    note.write(repr(time.monotonic()))
            f.write(json.dumps({"step": step, "loss": loss}) + "\\n")
            f.flush()
            time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0.05)
"""


@pytest.mark.asyncio
async def test_a_nan_loss_fails_nonfinite_loss_within_one_sample(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """The loss turns NaN at step 30: nonfinite_loss at the next sample, naming step and value."""
    progress, written = tmp_path / "progress", tmp_path / "written"
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=[*py(NAN_AT_30), str(progress), str(written)],
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, forensics=False),
        )
    artifact = info.value.artifact
    assert info.value.reason == "nonfinite_loss"
    assert artifact["failures"][0]["message"].startswith("the loss is NaN at step 30 ")
    failed_at = artifact["monitor"]["monotonic_start"] + events(artifact, "failure")[0]["t"]
    # One interval to the next tick's scan, and a little for the scheduler of a busy machine.
    assert failed_at - float(written.read_text()) <= INTERVAL + 0.25
    steps = artifact["progress"]["steps"]
    assert steps["loss_step"] == 29  # the newest finite loss is kept, the NaN is the failure
    assert steps["steps_per_second"] > 0
    assert artifact["series"]["steps"]["loss"]
    assert_valid(artifact, schema)


@pytest.mark.asyncio
async def test_with_samples_far_apart_a_nan_is_read_when_inotify_tells(tmp_path: Path) -> None:
    """Samples 3 s apart: the NaN line is read when inotify tells of the write, not at the
    next tick (a change within HEARD_WAIT_SECONDS of a tick waits for it)."""
    progress, written = tmp_path / "progress", tmp_path / "written"
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            # Step 30 comes about 3.3 s in: just after a tick, nearly 3 s before the next.
            command=[*py(NAN_AT_30), str(progress), str(written), "0.11"],
            **fast_limits(tmp_path, sample_interval_seconds=3.0, forensics=False),
        )
    artifact = info.value.artifact
    assert info.value.reason == "nonfinite_loss"
    failed_at = artifact["monitor"]["monotonic_start"] + events(artifact, "failure")[0]["t"]
    assert failed_at - float(written.read_text()) <= HEARD_WAIT_SECONDS + 0.5


HF_TRAINER = """
    import shutil, sys, time
    fixtures, run = sys.argv[1], sys.argv[2]
    # As the Trainer saves: checkpoint-10, checkpoint-20, then save_state() at the end.
    time.sleep(0.3)
    shutil.copytree(fixtures + "/checkpoint-10", run + "/checkpoint-10")
    time.sleep(0.6)
    shutil.copytree(fixtures + "/checkpoint-20", run + "/checkpoint-20")
    time.sleep(0.3)
    shutil.copy(fixtures + "/trainer_state.json", run + "/trainer_state.json")
"""


@pytest.mark.asyncio
async def test_a_hugging_face_run_ends_with_its_global_step_and_max_steps(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """trainer_state.json files as transformers writes them: the artifact names the last
    global step, max_steps and the last logged loss (not the run's mean)."""
    run = tmp_path / "progress"
    run.mkdir()
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(HF_TRAINER), str(FIXTURES), str(run)],
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL),
        )
    assert artifact["status"] == "passed"
    steps = artifact["progress"]["steps"]
    assert steps is not None
    assert (steps["step"], steps["max_steps"]) == (20, 20)
    assert steps["source_kind"] == "trainer_state"
    assert steps["loss"] == 1.2152782678604126
    assert_valid(artifact, schema)


REPORTER = """
    import sys, time
    from asyncsoak import trainer
    for step in range(40):
        trainer.report(step, loss=1.0 / (step + 1), tokens=step * 128)
        time.sleep(0.02)
"""


@pytest.mark.asyncio
async def test_asyncsoak_trainer_report_is_a_step_source(tmp_path: Path) -> None:
    """report() writes through its throttle; the last step is written at exit."""
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=py(REPORTER),
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL),
        )
    steps = artifact["progress"]["steps"]
    assert steps is not None
    assert steps["source_kind"] == "asyncsoak.trainer.report"
    assert steps["step"] == 39
    assert steps["loss"] == pytest.approx(1 / 40)
    lines = (tmp_path / "out" / "soak.steps.jsonl").read_text().splitlines()
    assert 2 <= len(lines) < 40  # at most one line per 0.1 s


@pytest.mark.asyncio
async def test_every_view_names_the_step_rate_loss_and_eta(tmp_path: Path) -> None:
    """The summary's and report's first block, the live line, the metrics and compare all
    read the same step figures, from one real soak with a known total."""
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=py(TOTAL_KNOWN),
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL),
        )
    text = format_summary(summarize(artifact))
    said = text.split("\n")
    first_block = said[: next(i for i, line in enumerate(said) if line.startswith("ran "))]
    training = next(line for line in first_block if line.startswith("  training: "))
    assert training.startswith("  training: step 29 of 100, ")
    assert " steps/s, " in training
    assert "loss 0.03333" in training
    lines = journal(tmp_path / "out" / "soak.jsonl")
    live = LiveState()
    metrics = SoakMetrics("s")
    for line in lines[:-2]:  # before the end: the live line while it ran
        live.add(line)
        metrics.observe(line)
    piece = next(p for p in live.status(0.0).parts() if p.startswith("step "))
    assert " of 100, " in piece
    assert "ETA " in piece
    figures = {row[0]: row[3][0][2] for row in metrics.rows() if row[3]}
    assert figures["asyncsoak_step"] >= 20
    assert figures["asyncsoak_max_steps"] == 100
    assert figures["asyncsoak_steps_per_second"] > 0
    assert figures["asyncsoak_loss"] > 0
    assert figures["asyncsoak_eta_seconds"] > 0
    rows = {row.key: row for row in compare(artifact, artifact).rows}
    assert rows["steps.rate"].baseline == rows["steps.rate"].candidate
    assert rows["steps.loss.final"].text(rows["steps.loss.final"].candidate) == "0.03333"
    pytest.importorskip("plotly")
    page = render_report(artifact)
    assert "step 29 of 100" in page.split('id="evidence"')[0]
    assert "Training loss" in page
    assert "Training steps per second" in page


TOTAL_KNOWN = """
    import time
    from asyncsoak import trainer
    for step in range(30):
        trainer.report(step, loss=1.0 / (step + 1), max_steps=100)
        time.sleep(0.05)
"""


CHECKPOINTING = """
    import json, os, sys, time
    os.makedirs(sys.argv[1], exist_ok=True)
    start = time.monotonic()
    step = 0
    with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
        while True:
            f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
            f.flush()
            step += 1
            if step == 60:
                time.sleep(6.0)  # "checkpointing"
            if step == 80:
                time.sleep(3600)  # the hang
            time.sleep(0.1)
"""


@pytest.mark.asyncio
async def test_auto_stale_limit_passes_checkpoints_and_catches_a_hang(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """--stale-progress auto: steps every 0.1 s, a 6 s checkpoint pause, 20 steps more, then a
    hang.  The pause passes and the limit is learned from it; the hang fails within 3 x the
    longest normal gap (and one interval and the judge's grace) of the last step.  (The rule
    over longer runs, pure: test_steps.py's test_auto_limit_learns_checkpoint_pauses_...)"""
    with anyio.fail_after(90), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=[*py(CHECKPOINTING), str(tmp_path / "progress")],
            **fast_limits(
                tmp_path,
                sample_interval_seconds=INTERVAL,
                startup_timeout_seconds=5.0,
                stale_progress_seconds="auto",
                forensics=False,
            ),
        )
    hanging = info.value.artifact
    assert hanging["failures"][0]["reason"] == "stale_progress"
    assert "stale_progress_seconds=auto" in hanging["failures"][0]["message"]
    assert hanging["progress"]["steps"]["step"] == 79  # the steps after the pause were seen
    learned = hanging["progress"]["stale_limit_seconds"]
    # The 6 s pause as the scans saw it (a tick either side), times the safety factor.
    assert 5.5 * AUTO_SAFETY_FACTOR <= learned <= 7.0 * AUTO_SAFETY_FACTOR
    assert hanging["series"]["stale_limit"]["seconds"][-1] == learned
    last_step = max(e["t"] for e in hanging["events"] if e["kind"] == "progress")
    failed = events(hanging, "failure")[0]["t"]
    longest = hanging["progress"]["steps"]["longest_gap_seconds"]
    assert (
        failed - last_step <= AUTO_SAFETY_FACTOR * longest * 1.05 + INTERVAL + JUDGE_GRACE_SECONDS
    )
    assert_valid(hanging, schema)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--step-key", ""], "--step-key must be printable text"),
        (["--loss-key", "a\nb"], "--loss-key must be printable text"),
        (["--loss-check", "maybe"], "invalid choice"),
        (["--progress-source", "gpu"], "invalid choice"),
        (["--stale-progress", "soon"], "expected seconds or 'auto'"),
    ],
)
def test_bad_progress_flags_are_refused_before_anything_starts(
    tmp_path: Path, flags: list[str], complaint: str
) -> None:
    """A bad step key, loss check, source or limit: exit status 2 naming the flag as typed,
    nothing written."""
    result = asyncsoak_main(
        "run",
        "--progress-dir",
        "run",
        "--output",
        "out/soak.json",
        *flags,
        "--",
        sys.executable,
        "-c",
        "pass",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert complaint in result.stderr
    assert not (tmp_path / "out").exists()


RESUMED = """
    import json, os, sys, time
    # Loading the model and the checkpoint: longer than the stall limit, within startup's.
    time.sleep(float(sys.argv[2]))
    with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
        for step in range(4001, 4021):
            f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
            f.flush()
            time.sleep(0.05)
"""


def _earlier_run(progress: Path, last_loss: float) -> None:
    """metrics.jsonl as an earlier run left it: steps 4000-5000, the last loss ``last_loss``."""
    progress.mkdir()
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(4000, 5000)]
    lines.append(json.dumps({"step": 5000, "loss": last_loss}))
    (progress / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.asyncio
async def test_an_earlier_runs_steps_do_not_end_the_startup(tmp_path: Path) -> None:
    """A run resumed into the directory of an earlier one: the steps already in its
    metrics.jsonl are not this run's first step, so its model load has the startup limit."""
    progress = tmp_path / "progress"
    _earlier_run(progress, 1.0)
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(RESUMED), str(progress), "2.5"],
            **fast_limits(
                tmp_path,
                sample_interval_seconds=INTERVAL,
                stale_progress_seconds=1.5,
                forensics=False,
            ),
        )
    assert artifact["status"] == "passed"
    steps = artifact["progress"]["steps"]
    assert steps is not None
    assert steps["step"] == 4020
    notes = [e["message"] for e in events(artifact, "sampler_note")]
    assert any("went back from 5000 to 4001" in note for note in notes)


@pytest.mark.asyncio
async def test_an_earlier_runs_nan_loss_does_not_fail_the_resumed_run(tmp_path: Path) -> None:
    """The earlier run ended on a NaN loss (why it is resumed): the new run is not failed
    for it; only this run's losses are checked."""
    progress = tmp_path / "progress"
    _earlier_run(progress, float("nan"))
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(RESUMED), str(progress), "0"],
            **fast_limits(tmp_path, sample_interval_seconds=INTERVAL, forensics=False),
        )
    assert artifact["status"] == "passed"
    steps = artifact["progress"]["steps"]
    assert steps is not None
    assert steps["step"] == 4020


@pytest.mark.asyncio
@pytest.mark.parametrize("check", ["warn", "off"])
async def test_a_nan_loss_under_warn_is_a_warning_and_under_off_nothing(
    tmp_path: Path, check: str
) -> None:
    """--loss-check warn: the run passes with one warning naming step 30 and NaN; off: no word."""
    progress, written = tmp_path / "progress", tmp_path / "written"
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=[*py(NAN_AT_30), str(progress), str(written), "0.005"],
            **fast_limits(
                tmp_path, sample_interval_seconds=INTERVAL, forensics=False, loss_check=check
            ),
        )
    assert artifact["status"] == "passed"
    assert not artifact["failures"]
    warned = [e["message"] for e in events(artifact, "warning") if "loss" in e["message"]]
    if check == "warn":
        assert warned == ["the loss is NaN at step 30 (metrics.jsonl line 31)"]
    else:
        assert warned == []
