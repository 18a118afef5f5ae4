"""The worker with real SQLite files and real children; runs are counted on the child's side."""

from __future__ import annotations

import json
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from asyncsoak._supervisor import StopMode
from asyncsoak._supervisor._front import run_soak
from asyncsoak.queue import (
    JobStatus,
    JobStore,
    Outcome,
    QueueDatabaseLostError,
    SqliteStore,
    WorkerConfig,
    open_store,
    run_job,
    run_worker,
)

from ..conftest import REPO, ReadyFifo, alive
from .helpers import FAST_SOAK, JOB_ENV, kill_worker_and_its_reapers, write_script

#: Generous bound for any one test's waits on a loaded two-core machine.
LIMIT_S = 60.0

#: Appends one line per run to runs.txt and says which attempt started.  Later attempts exit
#: 0; the first follows its mode: "exit0", "wait-stdin" (exit 4 on stdin EOF), "wait-go" (until
#: a file exists), "escaping-helper" (starts a helper in its own session, says its pid, runs on).
TRAINER = """
from pathlib import Path
from asyncsoak import trainer
mode, runs = sys.argv[1], Path(sys.argv[2])
with open(runs, "a") as f:
    f.write(f"{trainer.job_id()} {trainer.attempt()}\\n")
tell(f"started {trainer.attempt()}")
if trainer.attempt() > 1:
    sys.exit(0)
if mode == "wait-stdin":
    trainer.stop_requested().wait(60)
    tell("eof")
    sys.exit(trainer.EXIT_INTERRUPTED)
if mode == "wait-go":
    while not Path(sys.argv[3]).exists():
        time.sleep(0.02)
if mode == "escaping-helper":
    import subprocess
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"],
        start_new_session=True,
    )
    tell(str(helper.pid))
    while True:
        time.sleep(0.1)
"""


#: What a call to ``run_worker`` says besides its ``WorkerConfig``.
PER_CALL = frozenset({"once", "stop_event", "kill_event", "name", "metrics"})


def worker_kwargs(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """``run_worker``'s arguments: a quick ``WorkerConfig`` (``overrides`` may set any of its
    fields) and the per-call ones (``once`` by default)."""
    settings: dict[str, Any] = {"poll_seconds": 0.1, "runs_dir": tmp_path / "runs"}
    settings["nvidia_smi"] = None
    settings.update({k: v for k, v in overrides.items() if k not in PER_CALL})
    call = {"once": True, **{k: v for k, v in overrides.items() if k in PER_CALL}}
    return {"config": WorkerConfig(**settings), **call}


async def start_worker_process(
    store: JobStore, tmp_path: Path, name: str, *options: str
) -> Process:
    """``asyncsoak worker`` in its own process, to be killed by the test; ``options`` are
    more of its command-line options."""
    return await anyio.open_process(
        [sys.executable, "-m", "asyncsoak", "worker", "--db", store.location, "--no-gpu",
         "--poll", "0.1", "--name", name, "--runs-dir", str(tmp_path / "runs"), *options],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def runs_of(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


def submit_trainer(
    store: JobStore, tmp_path: Path, ready: ReadyFifo, mode: str, *extra: str, **options: Any
) -> int:
    argv = write_script(tmp_path, "trainer.py", TRAINER)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    return store.submit(
        argv=[*argv, mode, str(tmp_path / "runs.txt"), *extra],
        env=env,
        soak=FAST_SOAK,
        **options,
    )


def artifact_of(store: JobStore, job_id: int, attempt: int) -> dict[str, Any]:
    chosen = next(a for a in store.attempts(job_id) if a.attempt == attempt)
    data: dict[str, Any] = json.loads(Path(chosen.artifact).read_text())
    return data


@pytest.mark.slow
def test_four_workers_run_each_of_40_jobs_once(tmp_path: Path) -> None:
    """Four worker processes draining 40 jobs run each job exactly once (counted by the jobs)."""
    runs = tmp_path / "runs.txt"
    append = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    with SqliteStore(tmp_path / "q.db") as store:
        ids = [
            store.submit(argv=[sys.executable, "-c", append, str(runs), "{job_id}"], soak=FAST_SOAK)
            for _ in range(40)
        ]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncsoak", "worker", "--db", str(tmp_path / "q.db"),
             "--once", "--no-gpu", "--poll", "0.1", "--name", f"w{i}"],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        for i in range(4)
    ]  # fmt: skip
    try:
        for proc in workers:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(int(line) for line in runs.read_text().splitlines()) == ids
    with SqliteStore(tmp_path / "q.db") as store:
        jobs = store.jobs()
    assert {(job.status, job.attempt) for job in jobs} == {("succeeded", 1)}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_orphan_of_a_killed_worker_is_requeued_then_succeeds(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A worker SIGKILLed mid-job: the child sees stdin EOF and exits, another worker
    requeues the orphan, and its second attempt succeeds."""
    job_id = submit_trainer(store, tmp_path, ready, "wait-stdin", max_attempts=2)
    async with await start_worker_process(store, tmp_path, "doomed") as worker:
        assert await ready.line() == "started 1"
        worker.send_signal(signal.SIGKILL)
        assert await ready.line() == "eof"
        with anyio.fail_after(LIMIT_S):
            await worker.wait()
    job = store.get(job_id)
    assert (job.status, job.worker) == ("running", "doomed")
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path)) == 1
    assert await ready.line() == "started 2"
    history = store.attempts(job_id)
    assert [(a.outcome, a.reason) for a in history] == [("failed", "orphaned"), ("succeeded", None)]
    assert store.get(job_id).status == "succeeded"
    assert runs_of(tmp_path) == [f"{job_id} 1", f"{job_id} 2"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_orphan_sweep_kills_the_unsupervised_tree(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """When the worker and its reaper both die, the sweep kills what is left of the tree
    (a helper that left the trainer's session)."""
    job_id = submit_trainer(store, tmp_path, ready, "escaping-helper", max_attempts=2)
    async with await start_worker_process(store, tmp_path, "doomed") as worker:
        assert await ready.line() == "started 1"
        helper_pid = int(await ready.line())
        kill_worker_and_its_reapers(worker.pid)
        with anyio.fail_after(LIMIT_S):
            await worker.wait()
    assert alive(helper_pid)
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path)) == 1
    assert not alive(helper_pid)
    assert await ready.line() == "started 2"
    assert store.get(job_id).status == "succeeded"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_orphan_whose_attempt_finished_is_not_rerun(tmp_path: Path, store: JobStore) -> None:
    """An orphan whose soak.json says it passed takes that verdict and does not run again."""
    runs = tmp_path / "runs.txt"
    argv = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('ran\\n')"]
    job_id = store.submit(argv=argv, soak=FAST_SOAK)
    ghost = store.claim("ghost", "elsewhere", tmp_path / "runs")
    assert ghost is not None
    assert ghost.artifact is not None
    # The ghost ran the attempt to the end, then died before writing the final status.
    with anyio.fail_after(LIMIT_S):
        await run_soak(
            command=argv,
            progress_dir=tmp_path / "runs" / str(job_id),
            output_path=Path(ghost.artifact),
            nvidia_smi=None,
            **FAST_SOAK,
        )
    # Any heartbeat is older than a staleness limit of 0: the ghost's job is an orphan now.
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path, orphan_after_seconds=0)) == 0
    job = store.get(job_id)
    assert (job.status, job.attempt, job.returncode) == ("succeeded", 1, 0)
    assert [a.outcome for a in store.attempts(job_id)] == ["succeeded"]
    assert runs.read_text() == "ran\n"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_stale_orphan_from_another_host_is_requeued(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A job whose worker on another host went silent is requeued after the staleness limit."""
    job_id = submit_trainer(store, tmp_path, ready, "exit0", max_attempts=2)
    assert store.claim("ghost", "elsewhere", tmp_path / "runs") is not None
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path, orphan_after_seconds=0)) == 1
    assert await ready.line() == "started 2"
    history = store.attempts(job_id)
    assert (history[0].worker, history[0].outcome, history[0].reason) == (
        "ghost",
        "failed",
        "orphaned",
    )
    assert history[1].outcome == "succeeded"
    assert store.get(job_id).status == "succeeded"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_worker_config_sets_the_orphan_limit(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """``run_worker(store, config)``: the config's ``orphan_after_seconds`` (``--stale-after``)
    makes a silent worker's job an orphan, requeued and run again by this worker."""
    job_id = submit_trainer(store, tmp_path, ready, "exit0", max_attempts=2)
    assert store.claim("ghost", "elsewhere", tmp_path / "runs") is not None
    config = WorkerConfig(
        runs_dir=tmp_path / "runs", poll_seconds=0.1, orphan_after_seconds=0, nvidia_smi=None
    )
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, config, once=True, name="w") == 1
    assert await ready.line() == "started 2"
    assert [(a.worker, a.reason) for a in store.attempts(job_id)] == [
        ("ghost", "orphaned"),
        ("w", None),
    ]
    assert store.get(job_id).status == JobStatus.SUCCEEDED


@pytest.mark.asyncio
async def test_run_job_with_a_worker_config(tmp_path: Path, store: JobStore) -> None:
    """``run_job(store, job, config)`` runs a claimed job and returns its JobStatus."""
    job_id = store.submit(argv=[sys.executable, "-c", "pass"], soak=FAST_SOAK)
    job = store.claim("w", socket.gethostname(), tmp_path / "runs")
    assert job is not None
    config = WorkerConfig(runs_dir=tmp_path / "runs", poll_seconds=0.1, nvidia_smi=None)
    with anyio.fail_after(LIMIT_S):
        status = await run_job(store, job, config)
    assert status is JobStatus.SUCCEEDED
    assert store.get(job_id).status == "succeeded"


@pytest.mark.asyncio
async def test_earlier_attempts_unreadable_in_time_still_run_the_job(
    tmp_path: Path, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the earlier attempts' artifacts (a hung filesystem) past its deadline costs only
    the ledger's ``wasted``: the attempt runs and succeeds."""
    from asyncsoak._contract import BlockingCallTimeout

    def hung(attempts: object) -> None:
        raise BlockingCallTimeout("reading the earlier attempts' artifacts", 1.0)

    monkeypatch.setattr("asyncsoak.queue._attempt.earlier_highest_step", hung)
    job_id = store.submit(argv=[sys.executable, "-c", "pass"], soak=FAST_SOAK)
    job = store.claim("w", socket.gethostname(), tmp_path / "runs")
    assert job is not None
    config = WorkerConfig(runs_dir=tmp_path / "runs", poll_seconds=0.1, nvidia_smi=None)
    with anyio.fail_after(LIMIT_S):
        status = await run_job(store, job, config)
    assert status is JobStatus.SUCCEEDED
    assert store.get(job_id).status == "succeeded"


@pytest.mark.asyncio
async def test_cancel_honoured_by_the_trainer(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A trainer that sees its cancellation stops by itself, before the worker's grace ends."""
    script = """
from asyncsoak import trainer
tell("ready")
while not trainer.cancel_requested(min_interval=0.05):
    time.sleep(0.05)
tell("saw cancel")
sys.exit(trainer.EXIT_INTERRUPTED)
"""
    argv = write_script(tmp_path, "polite.py", script)
    job_id = store.submit(
        argv=argv, env={**JOB_ENV, "TEST_SIGNALS": str(ready.path)}, soak=FAST_SOAK
    )
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_worker(store, **worker_kwargs(tmp_path, cancel_grace_seconds=600))
            )
            assert await ready.line() == "ready"
            store.cancel(job_id)
            assert await ready.line() == "saw cancel"
    job = store.get(job_id)
    assert (job.status, job.returncode) == ("cancelled", 4)
    assert artifact_of(store, job_id, 1)["stop"]["killed"] is False


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cancel_ignored_escalates_to_kill(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A trainer that ignores cancellation, stdin EOF and SIGTERM is killed after the limits."""
    script = """
import signal
import socket
signal.signal(signal.SIGTERM, signal.SIG_IGN)
tell("ready")
while True:
    time.sleep(0.1)
"""
    argv = write_script(tmp_path, "stubborn.py", script)
    job_id = store.submit(
        argv=argv, env={**JOB_ENV, "TEST_SIGNALS": str(ready.path)}, soak=FAST_SOAK
    )
    limits = {"cancel_grace_seconds": 0.2, "stop_timeout_seconds": 0.5, "kill_wait_seconds": 5.0}
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(store, **worker_kwargs(tmp_path, **limits)))
            assert await ready.line() == "ready"
            store.cancel(job_id)
    job = store.get(job_id)
    assert (job.status, job.returncode) == ("cancelled", -signal.SIGKILL)
    artifact = artifact_of(store, job_id, 1)
    assert artifact["stop"]["killed"] is True
    assert artifact["stop"]["grace_seconds"] == 0.5


@pytest.mark.slow
@pytest.mark.parametrize("stop_mode", ["stdin", "group"])
@pytest.mark.asyncio
async def test_worker_stop_interrupts_and_the_job_resumes(
    tmp_path: Path, store: JobStore, ready: ReadyFifo, stop_mode: StopMode
) -> None:
    """A worker stop closes the trainer's stdin (or sends SIGTERM); it saves a checkpoint in
    its run dir and exits 4; the job is requeued, not counted, and resumes from the checkpoint."""
    script = """
from pathlib import Path
from asyncsoak import trainer
checkpoint = trainer.run_dir() / "checkpoint"
step = int(checkpoint.read_text()) if checkpoint.exists() else 0
stop = trainer.stop_requested()  # before saying it started: the stop may come at once
tell(f"started at {step}")
if step:
    sys.exit(0)
stop.wait(60)
checkpoint.write_text("5")
tell("saved")
sys.exit(trainer.EXIT_INTERRUPTED)
"""
    argv = write_script(tmp_path, "resumable.py", script)
    job_id = store.submit(
        argv=argv,
        env={**JOB_ENV, "TEST_SIGNALS": str(ready.path)},
        soak=FAST_SOAK,
        max_attempts=1,
        stop_mode=stop_mode,
    )
    stop = anyio.Event()
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_worker(store, **worker_kwargs(tmp_path, stop_event=stop, once=False))
            )
            assert await ready.line() == "started at 0"
            stop.set()
            assert await ready.line() == "saved"
    job = store.get(job_id)
    assert (job.status, job.attempts, job.last_outcome) == ("queued", 0, "interrupted")
    assert [j.id for j in store.jobs("interrupted")] == [job_id]
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path)) == 1
    assert await ready.line() == "started at 5"
    job = store.get(job_id)
    assert (job.status, job.attempt, job.interruptions) == ("succeeded", 2, 1)
    attempts_dir = tmp_path / "runs" / str(job_id) / "attempts"
    assert sorted(p.name for p in attempts_dir.iterdir()) == ["1", "2"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_stale_worker_late_final_write_is_refused(
    tmp_path: Path, store: JobStore, ready: ReadyFifo, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose job was taken over meanwhile cannot write over the newer attempt."""
    go = tmp_path / "go"
    job_id = submit_trainer(store, tmp_path, ready, "wait-go", str(go), max_attempts=3)
    slow = worker_kwargs(tmp_path, poll_seconds=600.0)  # no heartbeat between the start and the end
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(store, name="stale", **slow))
            assert await ready.line() == "started 1"
            sweeper = open_store(store.location)
            with sweeper:
                assert sweeper.take_over(sweeper.get(job_id), "sweeper")
                assert sweeper.finish(
                    job_id, 1, "sweeper", Outcome("failed", None, "orphaned", "x")
                )
                assert sweeper.claim("newer", "elsewhere", tmp_path / "runs") is not None
            go.touch()
    job = store.get(job_id)
    assert (job.status, job.worker, job.attempt) == ("running", "newer", 2)
    assert [a.outcome for a in store.attempts(job_id)] == ["failed", None]
    assert "final status refused" in caplog.text


@pytest.mark.asyncio
async def test_final_status_written_after_the_lock_is_released(
    tmp_path: Path, sqlite_store: SqliteStore
) -> None:
    """The final write retries while another connection holds the write lock."""
    job_id = sqlite_store.submit(argv=[sys.executable, "-c", "pass"], soak=FAST_SOAK)
    job = sqlite_store.claim("w1", "host", tmp_path / "runs")
    assert job is not None
    blocker = sqlite3.connect(sqlite_store.path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")

    class ReleaseOnFinishFailure(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "final status not written" in record.getMessage() and blocker.in_transaction:
                blocker.execute("COMMIT")

    handler = ReleaseOnFinishFailure()
    logging.getLogger("asyncsoak.queue").addHandler(handler)
    impatient = SqliteStore(sqlite_store.path, busy_timeout=0.1)
    try:
        with impatient, anyio.fail_after(LIMIT_S):
            config = WorkerConfig(
                runs_dir=tmp_path / "runs", poll_seconds=0.1, finish_retry_wait_seconds=0.05,
                nvidia_smi=None,
            )  # fmt: skip
            status = await run_job(impatient, job, config, name="w1")
    finally:
        logging.getLogger("asyncsoak.queue").removeHandler(handler)
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
    assert status == "succeeded"
    assert sqlite_store.get(job_id).status == "succeeded"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_failed_job_error_holds_tail_exit_and_reason(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A failed job's error has the soak's reason, the decoded exit status and the log tail,
    with secret values masked; no write lock is held while its child runs."""
    script = """
# Heartbeats are brief writes; a write transaction held for the child's life would make
# this fail (after SQLite's timeout; at once on PostgreSQL, NOWAIT).
db = os.environ["ASYNCSOAK_DB"]
if db.startswith("postgresql:"):
    import psycopg
    with psycopg.connect(db) as conn:
        conn.execute("SELECT id FROM asyncsoak.jobs FOR UPDATE NOWAIT").fetchall()
else:
    import sqlite3
    conn = sqlite3.connect(db, timeout=5)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")
print("token is", os.environ["HF_TOKEN"])
print("loss went NaN at step 7")
sys.exit(3)
"""
    argv = write_script(tmp_path, "bad.py", script)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path), "HF_TOKEN": "hf_s3cr3t_value"}
    job_id = store.submit(argv=argv, env=env, soak=FAST_SOAK, max_attempts=1)
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path)) == 1
    job = store.get(job_id)
    assert (job.status, job.reason, job.returncode) == ("failed", "nonzero_exit", 3)
    assert job.error is not None
    assert "nonzero_exit" in job.error
    assert "exit status 3" in job.error
    assert "loss went NaN at step 7" in job.error
    assert "hf_s3cr3t_value" not in job.error


@pytest.mark.slow
@pytest.mark.asyncio
async def test_command_placeholders_environment_and_config_job(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """Placeholders are filled, the job's env and the worker's GPU and ASYNCSOAK_* variables
    reach the child, and a config job runs the trainer command with its flags."""
    script = """
import json
from asyncsoak import trainer
names = ["ASYNCSOAK_JOB_ID", "ASYNCSOAK_DB", "ASYNCSOAK_RUN_DIR", "ASYNCSOAK_ATTEMPT",
         "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MY_SETTING"]
env = {name: os.environ.get(name) for name in names}
config = trainer.load_config() if "--watch-stdin" in sys.argv else None
tell(json.dumps({"argv": sys.argv[1:], "env": env, "config": config}))
"""
    argv = write_script(tmp_path, "echo.py", script)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path), "MY_SETTING": "on"}
    command_job = store.submit(
        argv=[*argv, "{job_id}", "{run_dir}/ckpt", "{db}"], env=env, soak=FAST_SOAK
    )
    config_job = store.submit(config={"lr": 0.1}, env=env, soak=FAST_SOAK)
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path, gpus="3", cmd=argv)) == 2
    run_dir = str((tmp_path / "runs" / str(command_job)).absolute())
    seen = json.loads(await ready.line())
    assert seen["argv"] == [str(command_job), f"{run_dir}/ckpt", store.location]
    assert seen["env"] == {
        "ASYNCSOAK_JOB_ID": str(command_job),
        "ASYNCSOAK_DB": store.location,
        "ASYNCSOAK_RUN_DIR": run_dir,
        "ASYNCSOAK_ATTEMPT": "1",
        "CUDA_VISIBLE_DEVICES": "3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "MY_SETTING": "on",
    }
    seen = json.loads(await ready.line())
    assert seen["argv"] == ["--job-id", str(config_job), "--db", store.location, "--watch-stdin"]
    assert seen["config"] == {"lr": 0.1}
    assert store.get(config_job).status == "succeeded"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_restarted_worker_takes_back_its_predecessors_job(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A worker restarted under the same name requeues and reruns the job its dead
    predecessor held, without waiting for the heartbeat to go stale."""
    job_id = submit_trainer(store, tmp_path, ready, "exit0", max_attempts=2)
    with anyio.fail_after(LIMIT_S):
        gone = await anyio.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
    dead_pid = int(gone.stdout)
    store.register_worker(
        "gpu0", host=socket.gethostname(), pid=dead_pid, pid_start=None, alive=lambda w: False
    )
    assert store.claim("gpu0", socket.gethostname(), tmp_path / "runs") is not None
    with anyio.fail_after(LIMIT_S):
        assert (
            await run_worker(
                store, **worker_kwargs(tmp_path, name="gpu0", orphan_after_seconds=3600)
            )
            == 1
        )
    assert await ready.line() == "started 2"
    history = store.attempts(job_id)
    assert [(a.outcome, a.reason) for a in history] == [("failed", "orphaned"), ("succeeded", None)]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_deleted_queue_file_stops_the_worker_once_its_job_ends(
    tmp_path: Path, sqlite_store: SqliteStore, ready: ReadyFifo, caplog: pytest.LogCaptureFixture
) -> None:
    """The queue file deleted under a worker running a job: within a poll it says so, naming
    the database and the job; it claims nothing more, lets the job finish under supervision
    (its artifact in its run directory), then ends with QueueDatabaseLostError (the CLI's exit
    status 1); it used to serve the unlinked file on, claiming its jobs unseen."""
    go = tmp_path / "go"
    first = submit_trainer(sqlite_store, tmp_path, ready, "wait-go", str(go))
    second = submit_trainer(sqlite_store, tmp_path, ready, "exit0")

    class GoOnNotice(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "was deleted" in record.getMessage():
                go.touch()

    async def delete_once_started() -> None:
        assert await ready.line() == "started 1"
        sqlite_store.path.unlink()

    async def work() -> QueueDatabaseLostError:
        with pytest.raises(QueueDatabaseLostError) as raised:
            await run_worker(sqlite_store, **worker_kwargs(tmp_path, once=False))
        return raised.value

    handler = GoOnNotice()
    logging.getLogger("asyncsoak.queue").addHandler(handler)
    try:
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(delete_once_started)
                error = await work()
    finally:
        logging.getLogger("asyncsoak.queue").removeHandler(handler)
    assert str(sqlite_store.path) in str(error)
    notice = next(r.getMessage() for r in caplog.records if "was deleted" in r.getMessage())
    assert str(sqlite_store.path) in notice
    assert f"job {first}" in notice
    assert runs_of(tmp_path) == [f"{first} 1"], f"job {second} was claimed"
    artifact = tmp_path / "runs" / str(first) / "attempts" / "1" / "soak.json"
    assert json.loads(artifact.read_text())["status"] in ("passed", "passed_with_warnings")
