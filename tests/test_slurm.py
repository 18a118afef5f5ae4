"""Soaks inside SLURM jobs, on a real single-node SLURM cluster started for this module.

The job scripts run this checkout's asyncsoak (``PYTHONPATH``, this interpreter) through
``sbatch``; the cluster's ``KillWait`` and ``cred_expire`` are short so that the scheduler's
whole stop sequence and a requeue take seconds.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from asyncsoak._supervisor import _slurm

from .conftest import REPO, ReadyFifo, alive, assert_valid, asyncsoak_cli
from .metrics_support import free_port
from .slurm_cluster import KILL_WAIT_S, SlurmCluster, missing
from .torch_trainer import HANG_LINE
from .torch_trainer import TRAINER as DISTRIBUTED_TRAINER

TRAINER = Path(__file__).with_name("slurm_trainer.py")
#: Bound on a job reaching a state: generous for a loaded 2-core CI machine.
STATE_TIMEOUT_S = 60.0

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = missing()
    if why is not None:
        # CI installs slurm-wlm (.ci/run): there these tests must run, not skip.
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def soak_line(
    out: Path, trainer_args: str, *, options: str = "", output: str = "soak-%j.json"
) -> str:
    """The batch script's line that runs the trainer under ``asyncsoak run`` (``exec``: the
    monitor is the batch shell's process, so ``--signal=B:...`` reaches it)."""
    py = shlex.quote(sys.executable)
    return (
        f"exec {py} -m asyncsoak run --quiet --no-gpu --sample-interval 0.2 "
        f"--startup-timeout 30 --stale-progress 30 "
        f"--progress-dir {shlex.quote(str(out / 'train'))} "
        f"--output {shlex.quote(str(out / output))} {options} "
        f"-- {py} {shlex.quote(str(TRAINER))} {shlex.quote(str(out / 'train'))} {trainer_args}"
    )


def batch_script(tmp_path: Path, *lines: str) -> Path:
    script = tmp_path / "job.sh"
    script.write_text(
        "\n".join(
            ["#!/bin/bash", f"export PYTHONPATH={shlex.quote(str(REPO))}", "set -u", *lines, ""]
        )
    )
    script.chmod(0o755)
    return script


def submit(cluster: SlurmCluster, tmp_path: Path, script: Path, *options: str) -> int:
    return cluster.sbatch(
        script, f"--output={tmp_path}/slurm-%j.out", f"--chdir={tmp_path}", *options
    )


def wait_file(path: Path, timeout: float = STATE_TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout:g}s")
        time.sleep(0.1)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def trainer_log(tmp_path: Path) -> list[str]:
    return (tmp_path / "train" / "trainer.log").read_text().splitlines()


def job_output(tmp_path: Path, job: int) -> str:
    path = tmp_path / f"slurm-{job}.out"
    return path.read_text() if path.exists() else ""


def test_a_soak_in_a_batch_job_passes_and_knows_its_job(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A soak through sbatch passes, and its snapshot records the job, the node and KillWait."""
    script = batch_script(tmp_path, soak_line(tmp_path, "--steps 5"))
    job = submit(cluster, tmp_path, script, "--time=2")
    fields = cluster.wait_state(job, {"COMPLETED", "FAILED"}, STATE_TIMEOUT_S)
    assert fields["JobState"] == "COMPLETED", job_output(tmp_path, job)
    artifact = wait_file(tmp_path / f"soak-{job}.json")
    assert artifact["status"] == "passed"
    scheduler = artifact["snapshot"]["scheduler"]
    assert scheduler["kind"] == "slurm"
    assert scheduler["job_id"] == job
    assert scheduler["node"] == cluster.node
    assert scheduler["node_list"] == cluster.node
    assert scheduler["rank"] == 0
    assert scheduler["restart_count"] == 0
    assert scheduler["partition"] == "debug"
    assert scheduler["cluster"] == "asyncsoak-test"
    assert scheduler["kill_wait_seconds"] == KILL_WAIT_S
    assert scheduler["time_limit"] == "00:02:00"
    assert scheduler["end_time_epoch"] > time.time()
    summary = asyncsoak_cli("summary", str(tmp_path / f"soak-{job}.json"), cwd=tmp_path)
    assert f"slurm job: {job} on {cluster.node}" in summary.stdout, summary.stdout
    assert cluster.node in summary.stdout


def test_scancel_is_a_stop_by_the_scheduler(
    cluster: SlurmCluster, tmp_path: Path, ready: ReadyFifo, schema: Draft202012Validator
) -> None:
    """scancel: cancelled with cause scheduler, the trainer saved on its graceful request within
    a grace under KillWait, the artifact written, nothing left running."""
    script = batch_script(
        tmp_path, soak_line(tmp_path, f"--ready {ready.path}", options="--grace 60")
    )
    job = submit(cluster, tmp_path, script, "--time=2")
    pid = int(ready.line_sync(timeout=STATE_TIMEOUT_S))
    seen: list[str] = []
    cluster.wait_state(job, {"RUNNING"}, STATE_TIMEOUT_S, seen=seen)
    cluster.run("scancel", str(job))
    fields = cluster.wait_state(job, {"CANCELLED"}, STATE_TIMEOUT_S, seen=seen)
    artifact = wait_file(tmp_path / f"soak-{job}.json")
    assert_valid(artifact, schema)
    assert artifact["status"] == "cancelled", artifact["failures"]
    assert artifact["failures"] == []
    assert artifact["stop"]["cause"] == "scheduler"
    # --grace 60 is capped below KillWait so asyncsoak, not SLURM's SIGKILL, ends the tree.
    assert artifact["stop"]["grace_seconds"] == _slurm.stop_grace(60, {"kill_wait_seconds": 8})
    assert artifact["stop"]["grace_seconds"] < KILL_WAIT_S
    assert any(line.startswith("saved") and "on=SIGTERM" in line for line in trainer_log(tmp_path))
    assert (tmp_path / "train" / "checkpoint.json").exists()
    assert not alive(pid)
    assert seen[0] == "RUNNING", seen
    assert seen[-1] == "CANCELLED", seen
    print(f"scancel: states seen {seen}; ExitCode={fields.get('ExitCode')}")


def test_the_soak_stops_before_the_jobs_end_time(cluster: SlurmCluster, tmp_path: Path) -> None:
    """With a grace that does not fit before the time limit, the soak stops by itself early
    enough (cause scheduler), rather than being killed mid-write at the limit."""
    script = batch_script(tmp_path, soak_line(tmp_path, "", options="--grace 45"))
    job = submit(cluster, tmp_path, script, "--time=1")
    fields = cluster.wait_state(job, {"COMPLETED", "FAILED", "TIMEOUT"}, STATE_TIMEOUT_S)
    artifact = wait_file(tmp_path / f"soak-{job}.json")
    assert artifact["status"] == "cancelled", artifact["failures"]
    assert artifact["stop"]["cause"] == "scheduler"
    assert artifact["duration_seconds"] < 30
    assert fields["JobState"] == "COMPLETED"
    assert any("on=SIGTERM" in line for line in trainer_log(tmp_path))


def test_early_warning_is_forwarded_and_the_job_requeued(
    cluster: SlurmCluster, tmp_path: Path, schema: Draft202012Validator
) -> None:
    """--signal=B:USR1@N: the trainer gets USR1 and checkpoints; --requeue-on USR1 requeues
    the job; the rerun resumes from the checkpoint and both runs' artifacts exist."""
    script = batch_script(
        tmp_path,
        # The rerun's own early warning may come at any time of its few seconds (SLURM checks
        # time limits periodically), even before the trainer has its handler: it ignores it.
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then mode="--requeue-on USR1"; '
        "else mode=; trap '' USR1; fi",
        soak_line(tmp_path, "--resume-steps 5", options="$mode"),
    )
    job = submit(cluster, tmp_path, script, "--time=1", "--signal=B:USR1@55", "--requeue")
    seen: list[str] = []
    cluster.wait_state(job, {"RUNNING"}, STATE_TIMEOUT_S, seen=seen)
    first = wait_file(tmp_path / f"soak-{job}.json")
    fields = cluster.wait_state(job, {"COMPLETED", "FAILED"}, 2 * STATE_TIMEOUT_S, seen=seen)
    second = wait_file(tmp_path / f"soak-{job}.restart1.json")
    assert_valid(first, schema)
    assert_valid(second, schema)
    assert first["status"] == "cancelled", first["failures"]
    assert first["stop"]["cause"] == "requeued"
    assert first["stop"]["requeue"]["ok"] is True, first["stop"]["requeue"]
    assert first["exit"]["returncode"] == 4
    forwarded = [e for e in first["events"] if e["kind"] == "forwarded"]
    assert [e["signal"] for e in forwarded] == ["SIGUSR1"]
    assert second["status"] == "passed", second["failures"]
    assert second["snapshot"]["scheduler"]["restart_count"] == 1
    assert fields["JobState"] == "COMPLETED"
    assert int(fields["Restarts"]) == 1
    log = trainer_log(tmp_path)
    saved = [line for line in log if "on=SIGUSR1" in line and "restart=0" in line]
    assert saved, log
    saved_step = saved[0].split()[1]
    assert f"started {saved_step} restart=1 rank=0" in log, log
    assert "PENDING" in seen, seen
    print(
        f"requeue: states seen {seen}; first run {first['status']}/{first['stop']['cause']} "
        f"(requeue {first['stop']['requeue']}), second run "
        f"{second['status']}/{second['stop']['cause']}; trainer log {log}"
    )


def test_two_tasks_of_one_job_are_summarised_as_one(cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun -n2: one soak per task, artifacts named by task rank; `summary` of both shows one
    job with each task's verdict and which failed first."""
    line = soak_line(
        tmp_path,
        "--steps 15 --fail-rank 1 --fail-at 5",
        output="soak-%j-%t.json",
    ).replace("exec ", "srun -n2 ", 1)
    line = line.replace(str(tmp_path / "train"), str(tmp_path / "train-%t"))
    script = batch_script(tmp_path, line)
    job = submit(cluster, tmp_path, script, "--time=2", "-n2")
    cluster.wait_state(job, {"COMPLETED", "FAILED"}, STATE_TIMEOUT_S)
    paths = [tmp_path / f"soak-{job}-{rank}.json" for rank in (0, 1)]
    artifacts = [wait_file(path) for path in paths]
    assert [a["snapshot"]["scheduler"]["rank"] for a in artifacts] == [0, 1]
    assert [a["status"] for a in artifacts] == ["passed", "failed"]
    summary = asyncsoak_cli("summary", *map(str, paths), cwd=tmp_path)
    print(summary.stdout)
    assert summary.returncode == 0, summary.stderr
    assert f"slurm job {job}: 2 soaks, failed" in summary.stdout
    assert "first failure: rank 1" in summary.stdout
    assert "nonzero_exit" in summary.stdout
    as_json = asyncsoak_cli("summary", "--json", *map(str, paths), cwd=tmp_path)
    combined = json.loads(as_json.stdout)
    assert combined["job_id"] == job
    assert [s["rank"] for s in combined["soaks"]] == [0, 1]
    assert combined["first_failure"]["rank"] == 1
    report = asyncsoak_cli(
        "report", *map(str, paths), "-o", str(tmp_path / "job.html"), cwd=tmp_path
    )
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "job.html").read_text()
    assert f"SLURM job {job}, 2 soaks" in page
    assert "rank 0 (" in page
    assert "rank 1 (" in page


def test_srun_ranks_the_culprit_across_the_tasks(cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun -n2, one soak per task (the rank from SLURM_PROCID): rank 1 stops in load_batch,
    rank 0 waits in all_reduce; each soak knows its rank, and `summary` of both names rank 1
    with its frame as the culprit across the tasks."""
    (tmp_path / "train.py").write_text(DISTRIBUTED_TRAINER)
    py = shlex.quote(sys.executable)
    out = shlex.quote(str(tmp_path))
    line = (
        f"srun -n2 {py} -m asyncsoak run --quiet --no-gpu --sample-interval 0.25 "
        f"--startup-timeout 60 --stale-progress 3 --progress-dir {out}/train "
        f"--output {out}/soak-%j-%t.json -- {py} {out}/train.py hang {out}/train"
    )
    script = batch_script(
        tmp_path,
        f"mkdir -p {out}/train",
        "export MASTER_ADDR=127.0.0.1",
        f"export MASTER_PORT={free_port()}",
        line,
    )
    job = submit(cluster, tmp_path, script, "--time=2", "-n2")
    cluster.wait_state(job, {"COMPLETED", "FAILED"}, STATE_TIMEOUT_S)
    paths = [tmp_path / f"soak-{job}-{rank}.json" for rank in (0, 1)]
    artifacts = [wait_file(path) for path in paths]
    assert [[r["rank"] for r in a["ranks"]["ranks"]] for a in artifacts] == [[0], [1]]
    assert {r["source"] for a in artifacts for r in a["ranks"]["ranks"]} == {"slurm"}
    # Alone, rank 0's node sees its only rank waiting in all_reduce: said so.
    assert artifacts[0]["failures"][0]["message"].startswith("every rank (0) waits in all_reduce")
    as_json = asyncsoak_cli("summary", "--json", *map(str, paths), cwd=tmp_path)
    combined = json.loads(as_json.stdout)
    rank1_pid = artifacts[1]["ranks"]["ranks"][0]["pid"]
    assert combined["culprit"]["text"] == (
        f"rank 1 (pid {rank1_pid} on {cluster.node}) stopped at train.py:{HANG_LINE} in "
        "load_batch; rank 0 waits in all_reduce"
    )
    summary = asyncsoak_cli("summary", *map(str, paths), cwd=tmp_path)
    assert "culprit across the nodes: rank 1" in summary.stdout


def test_the_queues_worker_as_a_slurm_job(
    cluster: SlurmCluster, tmp_path: Path, ready: ReadyFifo
) -> None:
    """A worker in an allocation is named after the job, leaves a job whose --max-duration
    does not fit the allocation, and on scancel interrupts its job the graceful way: the job
    saves and goes back to the queue."""
    db = tmp_path / "queue.db"
    py = sys.executable
    too_long = asyncsoak_cli(
        "submit", "--db", str(db), "--max-duration", "3600", "--", "true", cwd=tmp_path
    )
    assert too_long.returncode == 0, too_long.stderr
    fits = asyncsoak_cli(
        "submit",
        "--db",
        str(db),
        "--stop-mode",
        "group",
        "--",
        py,
        str(TRAINER),
        str(tmp_path / "train"),
        "--ready",
        str(ready.path),
        "--term-exit",
        "4",
        cwd=tmp_path,
    )
    assert fits.returncode == 0, fits.stderr
    long_id, fits_id = int(too_long.stdout.split()[-1]), int(fits.stdout.split()[-1])
    script = batch_script(
        tmp_path,
        f"exec {shlex.quote(py)} -m asyncsoak worker --db {shlex.quote(str(db))} "
        "--poll 0.5 --no-gpu --stop-timeout 60",
    )
    job = submit(cluster, tmp_path, script, "--time=2")
    ready.line_sync(timeout=STATE_TIMEOUT_S)
    workers = json.loads(asyncsoak_cli("workers", "--db", str(db), "--json", cwd=tmp_path).stdout)
    assert [w["name"] for w in workers] == [f"{cluster.node}:slurm{job}"]
    cluster.run("scancel", str(job))
    cluster.wait_state(job, {"CANCELLED"}, STATE_TIMEOUT_S)
    deadline = time.monotonic() + STATE_TIMEOUT_S
    jobs: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        listed = asyncsoak_cli("jobs", "--db", str(db), "--json", cwd=tmp_path)
        jobs = {j["id"]: j for j in json.loads(listed.stdout)}
        if jobs[fits_id]["status"] == "queued":
            break
        time.sleep(0.2)
    assert jobs[fits_id]["status"] == "queued", jobs
    assert jobs[fits_id]["attempt"] == 1
    assert jobs[long_id]["status"] == "queued"
    assert jobs[long_id]["attempt"] == 0
    detail = json.loads(
        asyncsoak_cli("job", "--db", str(db), str(fits_id), "--json", cwd=tmp_path).stdout
    )
    print(f"worker: job {fits_id} after scancel: {detail}")
    assert [a["outcome"] for a in detail["attempts"]] == ["interrupted"], detail["attempts"]
    assert any("on=SIGTERM" in line for line in trainer_log(tmp_path))
