"""Goodput across attempts, jobs and a fleet: ledgers added up with the waits between them,
GPU-hours, runs a scheduler restarted joined into one job, and ``asyncsoak goodput``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._analysis import (
    JOB_KINDS,
    AttemptPart,
    artifact_gpus,
    fleet_total,
    job_ledger,
    join_runs,
    lost_by_cause,
)
from asyncsoak.cli import UsageError
from asyncsoak.cli._sweeps import parse_not_before

from .conftest import CLI_ENV

LIMIT_SECONDS = 120


def section(wall: float, productive: float, steps: int, **badput: float) -> dict[str, Any]:
    """A run's ``goodput`` section as the artifact writes it."""
    parts = dict.fromkeys(("startup", "slow_steps", "checkpoint", "stall", "wasted"), 0.0)
    parts.update(shutdown=0.0, other=0.0)
    parts.update(badput)
    return {
        "wall_seconds": wall,
        "productive_seconds": productive,
        "ratio": productive / wall,
        "ideal_step_seconds": productive / steps,
        "steps": steps,
        "badput_seconds": parts,
    }


def test_a_jobs_ledger_adds_its_attempts_and_the_waits_before_and_between() -> None:
    """Queued 10 s, a run of 100 s, 20 s to the next start, a run of 50 s: the parts add up
    to the wall time; GPU-hours weigh each attempt by its own GPUs."""
    parts = [
        AttemptPart("2", section(50.0, 40.0, 400, wasted=10.0), 220.0, 270.0, None, 4),
        AttemptPart("1", section(100.0, 90.0, 900, startup=10.0), 100.0, 200.0, 90.0, 8),
    ]
    job = job_ledger("sft", parts)
    ledger = job.ledger
    assert ledger.wall_seconds == 180.0
    assert ledger.productive_seconds == 130.0
    assert ledger.badput_seconds == dict.fromkeys(JOB_KINDS, 0.0) | {
        "queue_wait": 10.0,
        "recovery": 20.0,
        "startup": 10.0,
        "wasted": 10.0,
    }
    assert ledger.ratio == pytest.approx(130.0 / 180.0)
    assert ledger.ideal_step_seconds == pytest.approx(0.1)
    hours = job.to_json()["gpu_hours"]
    assert hours["wall"] == pytest.approx((110.0 * 8 + 70.0 * 4) / 3600, abs=1e-4)
    assert hours["lost"]["recovery"] == pytest.approx(20.0 * 4 / 3600, abs=1e-4)
    assert lost_by_cause(ledger) == [
        ("recovery", 20.0),
        ("startup", 10.0),
        ("wasted", 10.0),
        ("queue_wait", 10.0),
    ]


def test_an_attempt_without_a_ledger_is_listed_and_its_wait_still_counted() -> None:
    """An artifact from before the section (no journal): unknown, named; seconds only when
    an attempt's GPUs are unknown."""
    parts = [AttemptPart("attempt 1", None, 100.0, 160.0, 95.0, None)]
    job = job_ledger("job 3", parts)
    assert job.unknown == ["attempt 1"]
    assert job.ledger.badput_seconds["queue_wait"] == 5.0
    assert job.ledger.ratio is None  # no steps known
    assert job.gpu_seconds is None
    assert job.to_json()["gpu_hours"] is None


def test_the_fleet_total_is_shaped_like_a_runs_section() -> None:
    one = job_ledger("a", [AttemptPart("1", section(10.0, 8.0, 80, other=2.0), 5.0, 15.0, 0.0, 1)])
    two = job_ledger("b", [AttemptPart("1", section(20.0, 20.0, 100), 30.0, 50.0, 30.0, 2)])
    total = fleet_total([one, two])
    for key in section(1.0, 1.0, 1):
        assert key in total
    assert set(total["badput_seconds"]) == set(JOB_KINDS)
    assert total["wall_seconds"] == 35.0
    assert total["badput_seconds"]["queue_wait"] == 5.0
    assert total["ratio"] == pytest.approx(28.0 / 35.0, abs=1e-4)
    assert (total["jobs"], total["unknown"]) == (2, 0)
    assert total["gpu_hours"]["wall"] == pytest.approx((15.0 + 40.0) / 3600, abs=1e-4)
    assert fleet_total([])["wall_seconds"] == 0.0


def run(
    started: str, ended: str, step: int, scheduler: Mapping[str, Any] | None, **extra: Any
) -> dict[str, Any]:
    """What ``join_runs`` reads of an artifact."""
    return {
        "started_at": started,
        "ended_at": ended,
        "progress": {"steps": {"step": step}},
        "snapshot": {"scheduler": scheduler},
        "goodput": section(10.0, 10.0, 100),
        **extra,
    }


SLURM = {"kind": "slurm", "job_id": 41, "job_name": "sft", "cluster": "c", "restart_count": 0}
POD = {"kind": "kubernetes", "namespace": "ml", "job_name": "sft", "completion_index": 0}
OTHER_INDEX = POD | {"completion_index": 1}


def test_a_schedulers_restarts_of_one_job_join_its_ledger() -> None:
    """A SLURM job requeued (its id and name kept) and a Kubernetes Job's new pod join their
    first runs, given in any order; a later run is divided again with the earlier ones'
    highest step; another index, another job, a run of no scheduler stay apart."""
    asked: list[tuple[str, int]] = []

    def regoodput(label: str, artifact: Mapping[str, Any], earlier: int) -> dict[str, Any]:
        asked.append((label, earlier))
        return section(10.0, 9.0, 90, wasted=1.0)

    runs = [
        ("slurm-2", run("2026-01-01T00:02:00Z", "2026-01-01T00:02:10Z", 50, SLURM)),
        ("slurm-1", run("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", 30, SLURM)),
        ("pod-a", run("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", 7, POD)),
        ("pod-b", run("2026-01-01T00:00:30Z", "2026-01-01T00:00:40Z", 9, POD)),
        ("pod-other", run("2026-01-01T00:00:30Z", "2026-01-01T00:00:40Z", 9, OTHER_INDEX)),
        ("plain", run("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", 3, None)),
    ]  # fmt: skip
    jobs = {job.job: job for job in join_runs(runs, regoodput)}
    assert sorted(jobs) == [
        "kubernetes ml/sft/0",
        "kubernetes ml/sft/1",
        "plain",
        "slurm job 41 sft",
    ]
    assert sorted(asked) == [("pod-b", 7), ("slurm-2", 30)]
    slurm = jobs["slurm job 41 sft"].ledger
    assert slurm.badput_seconds["recovery"] == 110.0  # 00:00:10 -> 00:02:00
    assert slurm.badput_seconds["wasted"] == 1.0
    assert jobs["kubernetes ml/sft/0"].attempts == 2
    assert jobs["plain"].attempts == 1


def test_the_gpus_a_run_had() -> None:
    assert artifact_gpus({"metadata": {"gpus": ["0", "3"]}}) == 2
    assert artifact_gpus({"snapshot": {"scheduler": {"kind": "slurm", "gpus": "0,1,2"}}}) == 3
    assert artifact_gpus({"gpu_health": {"gpu0": {}, "gpu1": {}, "unlisted": {}}}) == 2
    assert artifact_gpus({"metadata": {}}) is None


def test_since_counts_back() -> None:
    """--since takes what --not-before takes, counting back; a bad one names --since."""
    assert parse_not_before("+2h", lambda: 10_000.0, flag="--since", ago=True) == 2800.0
    at = parse_not_before("12:00", lambda: 0.0, 1_800_000_000.0, flag="--since", ago=True)
    assert 1_800_000_000.0 - 86_400 < at <= 1_800_000_000.0
    with pytest.raises(UsageError, match="--since 'yesterday'"):
        parse_not_before("yesterday", lambda: 0.0, flag="--since", ago=True)


def cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None, expect: int = 0) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "asyncsoak", *args],
        cwd=cwd,
        env={**CLI_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=LIMIT_SECONDS,
    )
    assert done.returncode == expect, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_goodput_refuses_bad_input_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    assert str(missing) in cli("goodput", str(missing), cwd=tmp_path, expect=2)
    assert "--since 'soon'" in cli("goodput", "--since", "soon", cwd=tmp_path, expect=2)
    said = cli("goodput", str(tmp_path), "--db", str(tmp_path / "q.db"), cwd=tmp_path, expect=2)
    assert "not both" in said
    (tmp_path / "notes.json").write_text("[1]")
    assert "notes.json" in cli("goodput", str(tmp_path / "notes.json"), cwd=tmp_path, expect=2)
    # A directory's other JSON files are skipped; an empty queue has nothing to account for.
    assert "no runs" in cli("goodput", str(tmp_path), cwd=tmp_path)
    empty = {"ASYNCSOAK_DB": str(tmp_path / "none.db")}
    assert json.loads(cli("goodput", "--json", cwd=tmp_path, env=empty)) == {
        "jobs": [],
        "total": fleet_total([]),
    }


#: Steps of 0.1 s with their own time: checkpoint at 20 (a file left in its run dir: argv[1],
#: else the queue's ASYNCSOAK_RUN_DIR), crash at 30; resumed from 20 to 40.
RESUMING = """\
import json, os, pathlib, sys, time
run = pathlib.Path(sys.argv[1] if sys.argv[1:] else os.environ["ASYNCSOAK_RUN_DIR"])
checkpoint = run / "checkpoint-20"
resumed = checkpoint.exists()
with open(run / "metrics.jsonl", "a") as f:
    for step in range(21 if resumed else 1, 41 if resumed else 31):
        time.sleep(0.1)
        f.write(json.dumps({"step": step, "loss": 1.0, "time": time.time()}) + "\\n")
        f.flush()
        if step == 20 and not resumed:
            checkpoint.write_text("weights")
sys.exit(0 if resumed else 1)
"""


@pytest.mark.slow
def test_a_kubernetes_jobs_restarted_pod_joins_its_first_with_the_redone_steps_wasted(
    tmp_path: Path,
) -> None:
    """Two pods of one Job (as the pod's environment names them): given together, one job
    whose second run's redone steps 21-30 (about 1 s) are wasted, folded from its journal."""
    script, progress = tmp_path / "resuming.py", tmp_path / "progress"
    script.write_text(RESUMING)
    progress.mkdir()
    for pod, status in (("a", 1), ("b", 0)):
        pod_env = {
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "ASYNCSOAK_PODINFO_DIR": str(tmp_path / "podinfo"),
            "POD_NAMESPACE": "ml",
            "JOB_NAME": "sft",
            "HOSTNAME": f"sft-{pod}",
        }
        flags = ["--progress-dir", str(progress), "--output", f"{pod}.json"]
        flags += ["--sample-interval", "0.1", "--grace", "0.5"]
        argv = ["run", *flags, "--", sys.executable, str(script), str(progress)]
        cli(*argv, cwd=tmp_path, env=pod_env, expect=status)
    alone = json.loads(cli("goodput", "b.json", "--json", cwd=tmp_path))
    assert alone["total"]["badput_seconds"]["wasted"] == 0.0
    out = json.loads(cli("goodput", "b.json", "a.json", "--json", cwd=tmp_path))
    (job,) = out["jobs"]
    assert (job["job"], job["attempts"]) == ("kubernetes ml/sft", 2)
    assert 0.6 <= job["badput_seconds"]["wasted"] <= 1.6, job
    assert job["badput_seconds"]["recovery"] > 0
    assert job["steps"] == 40
    # An artifact from before the section: rebuilt from its journal, else unknown.
    old = json.loads((tmp_path / "a.json").read_text())
    written = old.pop("goodput")
    (tmp_path / "old.json").write_text(json.dumps(old))
    (rebuilt,) = json.loads(cli("goodput", "old.json", "--json", cwd=tmp_path))["jobs"]
    assert rebuilt["badput_seconds"] == written["badput_seconds"] | {
        "queue_wait": 0.0,
        "recovery": 0.0,
    }
    old["monitor"]["journal_path"] = str(tmp_path / "gone.jsonl")
    (tmp_path / "old.json").write_text(json.dumps(old))
    (lost,) = json.loads(cli("goodput", "old.json", "--json", cwd=tmp_path))["jobs"]
    assert lost["unknown"] == ["old.json"]
    assert "no ledger" in cli("goodput", "old.json", cwd=tmp_path)
