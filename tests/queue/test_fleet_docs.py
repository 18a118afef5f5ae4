"""The recipes of ``docs/fleet.md``, run as written: a worker per GPU by hand, a submission,
the systemd template unit, and the SLURM job per node (issue 25, item 8).

Each recipe is read from the page (the fenced block after ``<!-- recipe: NAME -->``), so the
page and the tests cannot drift.  What a test supplies is what a host supplies: the
database's URL in ``ASYNCSOAK_DB`` (the page's example host does not exist here), GPUs (the
fake ``nvidia-smi`` presents two), and ``asyncsoak`` and ``python`` on ``PATH`` (this
checkout's).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from asyncsoak.queue import JobStore, QueueMissingError, WorkerInfo, open_store
from asyncsoak.queue._fleet import is_postgres
from asyncsoak.queue._status import STOP_TIMEOUT_S

from ..conftest import REPO
from ..gpu_support import install_fake_nvidia_smi
from ..slurm_cluster import SlurmCluster, missing
from .pg_cluster import PgCluster
from .test_queue_worker import LIMIT_S

PAGE = REPO / "docs" / "fleet.md"
_RECIPE = re.compile(r"<!-- recipe: (?P<name>[\w-]+) -->\n```\w*\n(?P<body>.*?)\n```", re.DOTALL)
GPUS = 2


def recipes() -> dict[str, str]:
    return {m["name"]: m["body"] + "\n" for m in _RECIPE.finditer(PAGE.read_text())}


def host_environment(tmp_path: Path, db: str) -> dict[str, str]:
    """A GPU host's environment: two GPUs, asyncsoak and python on PATH, the database."""
    fake = install_fake_nvidia_smi(tmp_path, mode="idle", gpus=GPUS)
    bindir = fake.path.parent
    for name, argv in (("asyncsoak", f"{sys.executable} -m asyncsoak"), ("python", sys.executable)):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        shim.chmod(0o755)
    return {**fake.env, "ASYNCSOAK_DB": db, "PYTHONPATH": str(REPO)}


def wait_for(what: str, check: Callable[[], bool], timeout: float = LIMIT_S) -> None:
    """Until ``check()`` holds (the queue's state, read again every 0.1 s), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        time.sleep(0.1)


def workers_of(db: str) -> list[WorkerInfo]:
    try:
        with open_store(db, create=False) as store:
            return store.workers()
    except QueueMissingError:
        return []


def live(db: str, suffix: str = "") -> list[str]:
    return sorted(w.name for w in workers_of(db) if w.stopped_at is None and suffix in w.name)


def run_job(db: str, tmp_path: Path) -> int:
    """Submit a job that checks its GPU, until it succeeded; returns its id."""
    check = "import os, sys; sys.exit(0 if os.environ['CUDA_VISIBLE_DEVICES'] in '01' else 1)"
    with open_store(db) as store:
        job_id = store.submit(argv=[sys.executable, "-c", check], cwd=tmp_path, soak=FAST)
        wait_for(f"job {job_id} ends", lambda: _ended(store, job_id))
        assert store.get(job_id).status == "succeeded", store.get(job_id).error
    return job_id


def _ended(store: JobStore, job_id: int) -> bool:
    return store.get(job_id).status in ("succeeded", "failed", "cancelled")


FAST = {"sample_interval_seconds": 0.2, "post_shutdown_grace_seconds": 0.5}


@contextmanager
def session(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in a session of its own, whose every process is SIGKILLed at the end."""
    with open(cwd / f"{Path(argv[0]).name}.log", "wb") as log:
        process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=log, stderr=log, start_new_session=True
        )
        try:
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=LIMIT_S)


def test_every_recipe_of_the_page_is_run_here() -> None:
    """The page holds exactly the recipes the tests below run, and its example URL is one
    the queue takes for PostgreSQL."""
    assert sorted(recipes()) == ["slurm-job", "submit", "systemd-unit", "workers"]
    example = re.search(r"export ASYNCSOAK_DB=(\S+)", PAGE.read_text())
    assert example is not None
    assert is_postgres(example[1])


@pytest.mark.slow
def test_workers_first_by_hand_then_submit(tmp_path: Path, pg_cluster: PgCluster) -> None:
    """The by-hand recipe on a fresh database: one worker per GPU waits for work; the
    submit recipe's job runs; a SIGTERM to the session stops every worker cleanly."""
    db = pg_cluster.create_database()
    env = host_environment(tmp_path, db)
    (tmp_path / "train.py").write_text("import sys\nprint('training', sys.argv[1:])\n")
    with session(["bash", "-c", recipes()["workers"]], env, tmp_path) as shell:
        wait_for("a worker per GPU", lambda: len(live(db)) == GPUS)
        assert live(db) == [f"{os.uname().nodename}:gpu{n}" for n in range(GPUS)]
        submitted = subprocess.run(
            ["bash", "-e", "-c", recipes()["submit"]],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LIMIT_S,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        print(submitted.stdout)
        assert "first-run" in submitted.stdout
        assert "alive" in submitted.stdout
        with open_store(db) as store:
            wait_for("the job ends", lambda: _ended(store, 1))
            job = store.get(1)
            assert job.status == "succeeded", job.error
            assert job.argv == ["python", "train.py", "--epochs", "3"]
        os.killpg(shell.pid, signal.SIGTERM)
        wait_for("every worker stopped", lambda: live(db) == [])
        shell.wait(timeout=LIMIT_S)


def _unit(text: str) -> dict[str, list[str]]:
    """``Section.Key`` -> its values, in order (a key may repeat, as Environment= does)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(f"{section}.{key}", []).append(value)
    return out


@pytest.mark.slow
def test_systemd_unit_recipe(tmp_path: Path, pg_cluster: PgCluster) -> None:
    """The template unit is valid (systemd-analyze verify, where present), gives the worker
    longer than its stop timeout to stop, and its ExecStart (instance 1) runs a worker that
    creates the queue, runs a job on GPU 1, and exits 0 on its KillSignal."""
    text = recipes()["systemd-unit"]
    unit = _unit(text)
    if shutil.which("systemd-analyze"):
        path = tmp_path / "asyncsoak-worker@1.service"
        path.write_text(text)
        verified = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        assert path.name not in verified.stderr, verified.stderr
    [timeout] = unit["Service.TimeoutStopSec"]
    assert float(timeout) > STOP_TIMEOUT_S
    [kill_signal] = unit["Service.KillSignal"]
    db = pg_cluster.create_database()
    env = host_environment(tmp_path, db)
    for assignment in unit["Service.Environment"]:
        name, _, value = assignment.partition("=")
        # The page's example database does not exist here: the test's stands in for it.
        env[name] = db if name == "ASYNCSOAK_DB" else value
    [exec_start] = unit["Service.ExecStart"]
    argv = shlex.split(exec_start.replace("%i", "1"))
    with session(argv, env, tmp_path) as worker:
        wait_for("the unit's worker", lambda: live(db) == [f"{os.uname().nodename}:gpu1"])
        job_id = run_job(db, tmp_path)
        with open_store(db) as store:
            assert store.attempts(job_id)[0].worker.endswith(":gpu1")
        worker.send_signal(getattr(signal, kill_signal))
        assert worker.wait(timeout=float(timeout)) == 0


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_slurm_job_recipe(tmp_path: Path, pg_cluster: PgCluster) -> None:
    """The batch script, submitted with sbatch as written: a worker per GPU of the node under
    distinct names, a job runs, and scancel stops every worker cleanly."""
    db = pg_cluster.create_database()
    env = host_environment(tmp_path, db)
    script = tmp_path / "asyncsoak-workers.sh"
    script.write_text(recipes()["slurm-job"])
    with SlurmCluster(tmp_path / "slurm") as cluster:
        submitted = subprocess.run(
            ["sbatch", "--parsable", str(script)],
            env={**cluster.env, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        slurm_job = int(submitted.stdout.strip().split(";")[0])
        try:
            wait_for("a worker per GPU", lambda: len(live(db, f":slurm{slurm_job}:")) == GPUS)
            run_job(db, tmp_path)
        finally:
            cluster.run("scancel", str(slurm_job), check=False)
        wait_for("every worker stopped", lambda: live(db) == [])
        assert {w.name for w in workers_of(db)} == {
            f"{cluster.node}:slurm{slurm_job}:gpu{n}" for n in range(GPUS)
        }
