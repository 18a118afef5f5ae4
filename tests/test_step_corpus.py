"""The step corpus: trainers writing their steps and losses as real ones do, each a labelled
shape run as a real soak and judged by its outcome (the status, the failure's reason, what
the artifact and the summary say)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator

from asyncsoak import SoakFailureError, run_soak
from asyncsoak._view._summary import format_summary, summarize
from asyncsoak._view._training import training_line

from .conftest import assert_valid, fast_limits, py, run_warnings

#: A Hugging Face Trainer: checkpoint-N/ every 2 steps (a model file, then trainer_state.json
#: with the whole log_history), save_total_limit=2.  argv: run dir, steps, the step the run
#: goes bad from, how ("nan": loss and grad_norm NaN; "filtered": the Trainer's NaN filter,
#: loss 0.0 beside a NaN grad_norm; "fp16": an inf grad_norm every 7th step, a healthy run),
#: the seconds between steps.
HF_CHECKPOINTS = """
    import json, os, shutil, sys, time
    run, steps, bad_from, how, pause = sys.argv[1:]
    steps, bad_from, pause = int(steps), int(bad_from), float(pause)
    history = []
    for step in range(1, steps + 1):
        bad = step >= bad_from
        loss = 0.0 if bad and how == "filtered" else float("nan") if bad else 2.0 / step
        norm = float("inf") if how == "fp16" and step % 7 == 0 else float("nan") if bad else 1.0
        history.append({"epoch": step / steps, "grad_norm": norm, "loss": loss, "step": step})
        if step % 2 == 0:
            checkpoint = os.path.join(run, f"checkpoint-{step}")
            os.makedirs(checkpoint)
            with open(os.path.join(checkpoint, "model.safetensors"), "wb") as f:
                f.write(bytes(4096))
            with open(os.path.join(checkpoint, "trainer_state.json"), "w") as f:
                state = {"global_step": step, "max_steps": steps, "log_history": history}
                json.dump(state, f, indent=2)
            saved = sorted(int(d[11:]) for d in os.listdir(run) if d.startswith("checkpoint-"))
            for old in saved[:-2]:
                shutil.rmtree(os.path.join(run, f"checkpoint-{old}"))
        time.sleep(pause)
"""

#: 20 ranks coming up one after the other, each appending to its rankN.jsonl; the last
#: rank's loss turns NaN at step 20.
RANK_FILES = """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(run)
    files = []
    for rank in range(20):
        files.append(open(os.path.join(run, f"rank{rank}.jsonl"), "a"))
        time.sleep(0.05)
    for step in range(40):
        for rank, f in enumerate(files):
            loss = float("nan") if rank == 19 and step >= 20 else 1.0
            f.write(json.dumps({"step": step, "loss": loss}) + "\\n")
            f.flush()
        time.sleep(0.05)
"""

#: 16 data-prep shards that log a few steps each and stop, then train.jsonl.
PREP_THEN_TRAIN = """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(os.path.join(run, "prep"))
    for shard in range(16):
        with open(os.path.join(run, "prep", f"shard{shard:02d}.jsonl"), "w") as f:
            for step in range(3):
                f.write(json.dumps({"step": step, "rows": 1000}) + "\\n")
        time.sleep(0.02)
    time.sleep(0.5)
    with open(os.path.join(run, "train.jsonl"), "a") as f:
        for step in range(60):
            f.write(json.dumps({"step": step, "loss": 2.0 / (step + 1)}) + "\\n")
            f.flush()
            time.sleep(0.05)
"""

#: Data prep that logged {"step": 500} in prep/*.jsonl, then train.jsonl counting from 0.
PREP_AHEAD_THEN_TRAIN = """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(os.path.join(run, "prep"))
    for shard in range(4):
        with open(os.path.join(run, "prep", f"shard{shard}.jsonl"), "w") as f:
            f.write(json.dumps({"step": 500, "rows": 1000}) + "\\n")
    with open(os.path.join(run, "train.jsonl"), "a") as f:
        for step in range(80):
            f.write(json.dumps({"step": step, "loss": 2.0 / (step + 1)}) + "\\n")
            f.flush()
            time.sleep(0.05)
"""

#: fp16 loss scaling's start-up search: grad_norm inf at steps 0-7 (logging_steps=1), then
#: finite, the loss falling: a healthy run.
FP16_STARTUP = """
    import json, os, sys, time
    os.makedirs(sys.argv[1])
    with open(os.path.join(sys.argv[1], "train.jsonl"), "a") as f:
        for step in range(40):
            norm = float("inf") if step < 8 else 1.0
            f.write(json.dumps({"step": step, "loss": 2.0 / (step + 1), "grad_norm": norm}))
            f.write("\\n")
            f.flush()
            time.sleep(0.05)
"""

#: f'{{"step": {step}, "loss": {loss}}}': Python writes a NaN loss as a bare nan.
BARE_NAN = """
    import os, sys, time
    os.makedirs(sys.argv[1])
    with open(os.path.join(sys.argv[1], "train.jsonl"), "a") as f:
        for step in range(60):
            loss = float("nan") if step >= 20 else 2.0 / (step + 1)
            f.write(f'{{"step": {step}, "loss": {loss}}}\\n')
            f.flush()
            time.sleep(0.05)
"""

#: Lightning's CSV logger: train_loss_step (and train_loss_epoch), the file rewritten whole
#: when val_loss appears at step 10; the loss NaN from step 30.
LIGHTNING_CSV = """
    import os, sys, time
    run = os.path.join(sys.argv[1], "lightning_logs", "version_0")
    os.makedirs(run)
    rows, columns = [], ["epoch", "step", "train_loss_epoch", "train_loss_step"]
    for step in range(60):
        loss = float("nan") if step >= 30 else 2.0 / (step + 1)
        if step == 10:
            columns.append("val_loss")
        rows.append({"epoch": 0, "step": step, "train_loss_step": loss, "val_loss": 1.0})
        with open(os.path.join(run, "metrics.csv"), "w") as f:
            f.write(",".join(columns) + "\\n")
            for row in rows:
                f.write(",".join(str(row.get(c, "")) for c in columns) + "\\n")
        time.sleep(0.05)
"""

#: 258 shards that log a step each, then train.jsonl: more step sources than are followed.
MANY_SHARDS = """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(run)
    for shard in range(258):
        with open(os.path.join(run, f"shard{shard}.jsonl"), "w") as f:
            f.write(json.dumps({"step": 0}) + "\\n")
    with open(os.path.join(run, "train.jsonl"), "a") as f:
        for step in range(30):
            f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
            f.flush()
            time.sleep(0.05)
"""

#: A metrics file rewritten whole by tmp+rename at each step, the loss falling.
TMP_RENAME = """
    import json, os, sys, time
    os.makedirs(sys.argv[1])
    path, lines = os.path.join(sys.argv[1], "metrics.jsonl"), []
    for step in range(60):
        lines.append(json.dumps({"step": step, "loss": 10.0 / (step + 1)}))
        with open(path + ".tmp", "w") as f:
            f.write("\\n".join(lines) + "\\n")
        os.replace(path + ".tmp", path)
        time.sleep(0.05)
"""


@dataclass(frozen=True, slots=True)
class Shape:
    """A trainer and what a soak of it must come to."""

    code: str
    args: tuple[str, ...] = ()
    #: The failure's reason; None: the run passes, without a warning.
    reason: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: Further checks of the artifact.
    check: Callable[[dict[str, Any]], None] | None = None
    #: The one warning a passing run must have (a part of it); None: none.
    warning: str | None = None


def _no_replays(artifact: dict[str, Any]) -> None:
    notes = [e["message"] for e in artifact["events"] if e["kind"] == "sampler_note"]
    assert not any("went back" in note for note in notes), notes
    assert artifact["progress"]["steps"]["step"] == 59


def _counted(artifact: Any) -> None:
    assert artifact["progress"]["steps"]["nonfinite_grad_norms"] == 8
    assert "grad_norm was non-finite at 8 logged steps" in format_summary(summarize(artifact))


def _names_the_grad_norm(artifact: Any) -> None:
    message = artifact["failures"][0]["message"]
    assert message.startswith("the grad_norm is NaN at 5 logged steps in a row, steps 20 to 24 ")
    assert "loss nan" in training_line(artifact["progress"]["steps"])


def _names_step_50(artifact: Any) -> None:
    assert artifact["failures"][0]["message"].startswith("the loss is NaN at step 50 ")


HF_STEPS = {"progress_source": "steps", "stale_progress_seconds": 4.0}
SHAPES = {
    "hf_checkpoints_rotated": Shape(HF_CHECKPOINTS, ("60", "999", "nan", "0.2"), None, HF_STEPS),
    "hf_checkpoints_nan_from_50": Shape(
        HF_CHECKPOINTS, ("60", "50", "nan", "0.2"), "nonfinite_loss", HF_STEPS, _names_step_50
    ),
    "hf_grad_norm_nan_beside_a_zero_loss": Shape(
        HF_CHECKPOINTS, ("40", "20", "filtered", "0.05"), "nonfinite_loss", {}, _names_the_grad_norm
    ),
    "hf_fp16_isolated_inf_grad_norms": Shape(
        HF_CHECKPOINTS, ("60", "999", "fp16", "0.05"), None, HF_STEPS, _counted
    ),
    "twenty_rank_files_nan_on_the_last": Shape(RANK_FILES, reason="nonfinite_loss"),
    "sixteen_prep_files_then_train": Shape(
        PREP_THEN_TRAIN, settings={"stale_progress_seconds": 2.0}
    ),
    "prep_files_ahead_of_the_trainer": Shape(
        PREP_AHEAD_THEN_TRAIN, settings={"stale_progress_seconds": 2.0}
    ),
    "fp16_startup_inf_grad_norms": Shape(FP16_STARTUP, check=_counted),
    "bare_nan_lines": Shape(BARE_NAN, reason="nonfinite_loss"),
    "lightning_train_loss_step_nan": Shape(LIGHTNING_CSV, reason="nonfinite_loss"),
    "tmp_rename_rewriter_falling_loss": Shape(TMP_RENAME, check=_no_replays),
    "more_step_sources_than_followed": Shape(
        MANY_SHARDS, warning="more than 256 step sources below "
    ),
}
#: Shapes whose soak takes longer than 10 s.
LONG = {"hf_checkpoints_rotated", "hf_checkpoints_nan_from_50"}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in LONG else []) for n in SHAPES]
)
async def test_the_step_corpus_is_judged_right(
    tmp_path: Path, name: str, schema: Draft202012Validator
) -> None:
    shape = SHAPES[name]
    progress = tmp_path / "progress"
    settings = {"sample_interval_seconds": 0.25, "forensics": False, **shape.settings}
    artifact: Any
    with anyio.fail_after(60):
        try:
            artifact = await run_soak(
                command=[*py(shape.code), str(progress), *shape.args],
                **fast_limits(tmp_path, **settings),
            )
        except SoakFailureError as exc:
            artifact = exc.artifact
    failures = [(f["reason"], f["message"]) for f in artifact["failures"]]
    if shape.reason is None:
        warnings = run_warnings(artifact)
        warned = [w for w in warnings if shape.warning and shape.warning in w]
        assert (artifact["status"], failures) == ("passed", [])
        assert warnings == warned
        assert len(warned) == (shape.warning is not None)
    else:
        assert failures, artifact["status"]
        assert failures[0][0] == shape.reason, failures
    if shape.check is not None:
        shape.check(artifact)
    assert_valid(artifact, schema)
