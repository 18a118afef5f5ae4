"""The goodput ledger of real runs: the issue's trainer (start-up, a slow step, a checkpoint
pause), its line in the views, a journal rebuilt to the same ledger, and the live counters."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import Metrics, artifact, run_soak
from asyncsoak._analysis._goodput import slow_threshold
from asyncsoak._contract import trainer_seconds
from asyncsoak._record import artifact_from_journal
from asyncsoak._view.report import render_report

from .conftest import ReadyFifo, asyncsoak_main, fast_limits, py
from .metrics_support import free_port, scrape_until, value

pytestmark = pytest.mark.slow

#: 3 s of start-up, 100 steps of 0.1 s, one of 1 s (step 31) and a 2 s checkpoint write after
#: step 60, each record with its own time; argv: the progress directory.
TRAINER = """
    import json, os, sys, time
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    time.sleep(3.0)
    with open(os.path.join(root, "metrics.jsonl"), "a") as log:
        for step in range(1, 102):
            if step == 31:
                time.sleep(0.9)
            if step == 61:
                os.makedirs(os.path.join(root, "checkpoint-60"), exist_ok=True)
                with open(os.path.join(root, "checkpoint-60", "model.safetensors"), "wb") as ck:
                    for _ in range(20):
                        ck.write(b"x" * 4096)
                        ck.flush()
                        time.sleep(0.1)
            time.sleep(0.1)
            log.write(json.dumps({"step": step, "loss": 1.0 / step, "time": time.time()}) + "\\n")
            log.flush()
"""


def defined_ratio(progress: Path, wall: float) -> float:
    """The productive share by the definition, on the trainer's own timestamps."""
    lines = (progress / "metrics.jsonl").read_text().splitlines()
    times = [trainer_seconds(json.loads(line)["time"]) or 0.0 for line in lines]
    durations = [b - a for a, b in itertools.pairwise(times)]
    threshold = slow_threshold(durations)
    normal = [d for d in durations if d <= threshold]
    return sum(normal) / len(normal) * len(times) / wall


@pytest.mark.asyncio
async def test_the_issues_trainer_has_its_time_divided(tmp_path: Path) -> None:
    """Start-up, the slow step and the checkpoint pause are each their part; the parts add up
    to the wall time; the summary says it; the journal rebuilds the same section."""
    progress = tmp_path / "progress"
    with anyio.fail_after(90):
        result = await run_soak(
            command=[*py(TRAINER), str(progress)],
            **fast_limits(tmp_path, sample_interval_seconds=0.2),
        )
    goodput: dict[str, Any] = dict(result["goodput"])
    parts: dict[str, float] = goodput["badput_seconds"]
    wall = goodput["wall_seconds"]
    assert goodput["productive_seconds"] + sum(parts.values()) == pytest.approx(wall, rel=0.02)
    assert parts["other"] < 0.1 * wall, goodput
    assert goodput["ratio"] == pytest.approx(defined_ratio(progress, wall), abs=0.03)
    assert parts["startup"] >= 2.5, goodput
    assert parts["slow_steps"] >= 0.6, goodput
    assert parts["checkpoint"] >= 1.5, goodput
    assert goodput["steps"] == 101

    out = tmp_path / "out"
    summary = asyncsoak_main("summary", str(out / "soak.json"))
    line = next(x.strip() for x in summary.stdout.splitlines() if "goodput " in x)
    assert "lost" in line
    assert "start-up" in line
    assert "checkpoints" in line
    as_json = json.loads(asyncsoak_main("summary", "--json", str(out / "soak.json")).stdout)
    assert as_json["goodput"]["text"] == line

    report = render_report(result)
    assert f'<p class="goodput">{line}</p>' in report
    assert 'class="goodput-strip"' in report

    rebuilt = artifact_from_journal(out / "soak.jsonl")
    assert rebuilt["goodput"] == goodput
    assert artifact.load(out / "soak.jsonl")["goodput"] == goodput


#: Steps of 0.1 s after 1 s of start-up; after step 5 it says ready (a FIFO) and steps on until
#: the test's go file appears (at most 60 s). argv: progress dir, ready file, go file.
STEPPER = """
    import json, os, sys, time
    root, ready, go = sys.argv[1:4]
    os.makedirs(root, exist_ok=True)
    time.sleep(1.0)
    deadline = time.monotonic() + 60
    with open(os.path.join(root, "metrics.jsonl"), "a") as log:
        for step in range(1, 100000):
            log.write(json.dumps({"step": step, "time": time.time()}) + "\\n")
            log.flush()
            if step == 5:
                with open(ready, "w") as fifo:
                    fifo.write("ready\\n")
            if os.path.exists(go) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
"""


@pytest.mark.asyncio
async def test_a_soak_serving_metrics_counts_productive_and_lost_time(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """While the trainer steps, a scrape shows both counters, the start-up counted."""
    port = free_port()
    go = tmp_path / "go"
    command = [*py(STEPPER), str(tmp_path / "progress"), str(ready.path), str(go)]
    result: dict[str, Any] = {}

    async def soak() -> None:
        result["artifact"] = await run_soak(
            command=command, metrics=Metrics(port=port), **fast_limits(tmp_path)
        )

    def counted(text: str) -> bool:
        return (value(text, "asyncsoak_badput_seconds_total", kind="startup") or 0) > 0.5

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(soak)
            assert await ready.line() == "ready"
            text = await scrape_until(port, counted)
            go.touch()
    assert (value(text, "asyncsoak_productive_seconds_total") or 0) > 0
    assert value(text, "asyncsoak_badput_seconds_total", kind="checkpoint") == 0
    assert result["artifact"]["status"] == "passed"
