"""The queue's command line, run as a user runs it: ``python -m asyncsoak ...``."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak.queue import SqliteStore
from asyncsoak.queue._models import SCHEMA_VERSION

from ..conftest import REPO, ReadyFifo
from .helpers import JOB_ENV, write_script

pytestmark = pytest.mark.slow

SECRET = "hf_not_to_be_printed_42"
LIMIT_S = 60.0


def cli(db: Path | str, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ASYNCSOAK_DB"}
    env["ASYNCSOAK_DB"] = str(db)
    done = subprocess.run(
        [sys.executable, "-m", "asyncsoak", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == expect, done.stdout + done.stderr
    return done


def test_submit_list_and_show(tmp_path: Path) -> None:
    """A submitted job shows in the table and in JSON with its env names but never a value."""
    db = tmp_path / "q.db"
    out = cli(
        db, "submit", "--name", "lr-3e-4", "--priority", "2", "--env", f"HF_TOKEN={SECRET}",
        "--max-attempts", "2", "--stale-progress", "30", "--expect-every", "checkpoint-*=1800",
        "--", "python", "train.py", "--lr", "3e-4", "--hf-token", SECRET,
    )  # fmt: skip
    assert out.stdout == "1\n"
    table = cli(db, "jobs").stdout
    assert table.splitlines()[0].split() == [
        "ID", "NAME", "STATUS", "PRI", "RUNS", "SUBMITTED", "FINISHED", "WORKER", "NOTE"
    ]  # fmt: skip
    assert table.splitlines()[1].split()[:5] == ["1", "lr-3e-4", "queued", "2", "0"]
    listed = json.loads(cli(db, "jobs", "--json").stdout)
    assert [(j["id"], j["status"], j["env"]) for j in listed] == [(1, "queued", ["HF_TOKEN"])]
    shown = cli(db, "job", "1", "--json").stdout
    job = json.loads(shown)
    assert job["argv"] == ["python", "train.py", "--lr", "3e-4", "--hf-token", "[redacted]"]
    assert job["cwd"] == str(REPO)
    assert job["soak"]["stale_progress_seconds"] == 30.0
    assert job["soak"]["expect_every"] == {"checkpoint-*": 1800.0}
    assert (job["max_attempts"], job["attempts"]) == (2, [])
    text = cli(db, "job", "1").stdout
    assert "HF_TOKEN (values hidden)" in text
    assert "expect_every=checkpoint-*=1800s" in text
    assert "checkpoint_globs" not in text  # the default goes without saying
    assert SECRET not in table + shown + text + json.dumps(listed)


def test_cancel_and_requeue(tmp_path: Path) -> None:
    """Cancel ends a queued job; cancelling it again is refused; requeue queues it again."""
    db = tmp_path / "q.db"
    cli(db, "submit", "--", "true")
    assert cli(db, "cancel", "1").stdout == "job 1 cancelled\n"
    again = cli(db, "cancel", "1", expect=2)
    assert "job 1 is cancelled; only queued or running jobs can be cancelled" in again.stderr
    assert cli(db, "requeue", "1").stdout == "job 1 queued again\n"
    assert "only succeeded or failed or cancelled" in cli(db, "requeue", "1", expect=2).stderr
    assert json.loads(cli(db, "jobs", "--json", "--status", "queued").stdout)[0]["id"] == 1


def test_bad_input_exits_2_and_changes_nothing(tmp_path: Path) -> None:
    """Unknown ids, bad --env, corrupt/newer databases, unusable runs dirs: status 2."""
    db = tmp_path / "q.db"
    # A queue that does not exist yet is an empty one to a reader (issue 25), never created.
    assert cli(db, "jobs").stdout == "no jobs\n"
    assert not db.exists()
    cli(db, "submit", "--", "true")
    for args in (["job", "9"], ["cancel", "9"], ["requeue", "9"], ["logs", "9"]):
        assert "no job 9" in cli(db, *args, expect=2).stderr
    assert (
        "--env expects KEY=VALUE"
        in cli(db, "submit", "--env", "NOPE", "--", "true", expect=2).stderr
    )
    assert "give either a command" in cli(db, "submit", expect=2).stderr
    assert "has not run yet" in cli(db, "logs", "1", expect=2).stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    runs = cli(db, "worker", "--once", "--runs-dir", str(blocker / "runs"), expect=2)
    assert "runs directory" in runs.stderr
    assert "--gpus" in cli(db, "worker", "--gpus", "zero", expect=2).stderr
    with SqliteStore(db) as store:
        # This test process is alive on this host: the name is taken.
        store.register_worker(
            "taken",
            host=socket.gethostname(),
            pid=os.getpid(),
            pid_start=None,
            alive=lambda w: True,
        )
    assert "already runs" in cli(db, "worker", "--once", "--name", "taken", expect=2).stderr
    assert [j["id"] for j in json.loads(cli(db, "jobs", "--json").stdout)] == [1]

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"\x00garbage" * 512)
    assert "cannot be used as a queue database" in cli(corrupt, "jobs", expect=2).stderr
    assert corrupt.read_bytes() == b"\x00garbage" * 512

    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    assert "newer than this asyncsoak understands" in cli(db, "jobs", expect=2).stderr


def test_config_job_submission(tmp_path: Path) -> None:
    """--config stores the file's JSON object (shown with secrets redacted); malformed JSON
    is refused."""
    db = tmp_path / "q.db"
    config = tmp_path / "c.json"
    config.write_text('{"lr": 0.0003, "layers": [4, 4], "wandb_api_key": "k-123456"}')
    cli(db, "submit", "--config", str(config))
    with SqliteStore(db) as store:
        assert store.get(1).config == {"lr": 0.0003, "layers": [4, 4], "wandb_api_key": "k-123456"}
    shown = json.loads(cli(db, "jobs", "--json").stdout)[0]["config"]
    assert shown == {"lr": 0.0003, "layers": [4, 4], "wandb_api_key": "[redacted]"}
    config.write_text("{nope")
    assert "not valid JSON" in cli(db, "submit", "--config", str(config), expect=2).stderr


RESUMABLE = """
from asyncsoak import trainer
checkpoint = trainer.run_dir() / "checkpoint"
step = int(checkpoint.read_text()) if checkpoint.exists() else 0
print(f"starting at step {step}", flush=True)
tell(f"started at {step}")
if step == 0:
    trainer.stop_requested().wait(60)
    checkpoint.write_text("500")
    print("saved step 500", flush=True)
    sys.exit(4)
print("finished", flush=True)
"""


@pytest.mark.asyncio
async def test_overnight_queue_end_to_end(tmp_path: Path, ready: ReadyFifo) -> None:
    """One job succeeds, one fails (error tail and reason), one is cancelled, and one is
    interrupted by SIGTERM to its worker and resumed by the next worker."""
    db = tmp_path / "q.db"
    env = ["--env", f"PYTHONPATH={JOB_ENV['PYTHONPATH']}", "--env", f"TEST_SIGNALS={ready.path}"]
    fast = ["--sample-interval", "0.2", "--grace", "0.5"]
    resumable = write_script(tmp_path, "resumable.py", RESUMABLE)
    cli(db, "submit", "--name", "resumable", "--priority", "1", *env, *fast, "--", *resumable)
    cli(db, "submit", "--name", "baseline", *fast, "--", sys.executable, "-c", "print('ok')")
    nan = "print('step 7: loss nan'); raise SystemExit(3)"
    cli(db, "submit", "--name", "lr-1e-2", "--max-attempts", "1", *fast, "--",
        sys.executable, "-c", nan)  # fmt: skip
    cli(db, "submit", "--name", "ablation", "--", sys.executable, "-c", "pass")
    cli(db, "cancel", "4")

    worker_argv = [sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu",
                   "--poll", "0.1", "--name", "gpu0"]  # fmt: skip
    with anyio.fail_after(LIMIT_S):
        quiet = subprocess.DEVNULL
        async with await anyio.open_process(
            worker_argv, cwd=REPO, stdout=quiet, stderr=quiet
        ) as worker:
            assert await ready.line() == "started at 0"
            worker.send_signal(signal.SIGTERM)
            assert await worker.wait() == 0
        interrupted = json.loads(cli(db, "jobs", "--json", "--status", "interrupted").stdout)
        assert [j["id"] for j in interrupted] == [1]
        async with await anyio.open_process(
            [*worker_argv, "--once"], cwd=REPO, stdout=quiet, stderr=quiet
        ) as worker:
            assert await ready.line() == "started at 500"
            assert await worker.wait() == 0

    jobs: dict[str, Any] = {j["name"]: j for j in json.loads(cli(db, "jobs", "--json").stdout)}
    assert {name: j["status"] for name, j in jobs.items()} == {
        "resumable": "succeeded",
        "baseline": "succeeded",
        "lr-1e-2": "failed",
        "ablation": "cancelled",
    }
    assert (jobs["resumable"]["attempt"], jobs["resumable"]["interruptions"]) == (2, 1)
    assert jobs["lr-1e-2"]["reason"] == "nonzero_exit"
    assert "step 7: loss nan" in jobs["lr-1e-2"]["error"]
    table = cli(db, "jobs").stdout
    assert "resumed after 1 interruption" in table
    assert "nonzero_exit: exit status 3" in table
    assert "cancelled before it ran" in table
    assert cli(db, "logs", "1", "--attempt", "1").stdout.splitlines()[-1] == "saved step 500"
    assert cli(db, "logs", "1", "--lines", "1").stdout == "finished\n"
    assert cli(db, "logs", "1", "--follow").stdout.endswith("finished\n")
    assert "no attempt 5" in cli(db, "logs", "1", "--attempt", "5", expect=2).stderr
    workers = cli(db, "workers").stdout.splitlines()
    assert workers[1].split()[0] == "gpu0"
    assert "stopped" in workers[1]
    history = json.loads(cli(db, "job", "1", "--json").stdout)["attempts"]
    assert [a["outcome"] for a in history] == ["interrupted", "succeeded"]


@pytest.mark.asyncio
async def test_second_signal_kills_the_running_job(tmp_path: Path, ready: ReadyFifo) -> None:
    """A second SIGTERM kills a job that does not save, without waiting out --stop-timeout."""
    db = tmp_path / "q.db"
    stuck = write_script(tmp_path, "stuck.py", 'tell("ready")\nwhile True:\n    time.sleep(0.1)\n')
    env = ["--env", f"TEST_SIGNALS={ready.path}"]
    cli(db, "submit", *env, "--sample-interval", "0.2", "--", *stuck)
    worker_argv = [sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu",
                   "--poll", "0.1", "--stop-timeout", "600"]  # fmt: skip
    with anyio.fail_after(LIMIT_S):
        async with await anyio.open_process(
            worker_argv, cwd=REPO, stdout=subprocess.DEVNULL
        ) as worker:
            assert await ready.line() == "ready"
            worker.send_signal(signal.SIGTERM)
            # Two signals sent together may merge into one: wait for the first to be handled.
            assert worker.stderr is not None
            said = b""
            while b"again to kill it now" not in said:
                said += await worker.stderr.receive()
            worker.send_signal(signal.SIGTERM)
            assert await worker.wait() == 0
    job = json.loads(cli(db, "job", "1", "--json").stdout)
    assert (job["status"], job["reason"], job["last_outcome"]) == (
        "queued",
        "killed_before_saving",
        "interrupted",
    )
    assert job["attempts"][0]["returncode"] == -signal.SIGKILL


@pytest.mark.asyncio
async def test_sighup_to_the_worker_requeues_its_job(tmp_path: Path, ready: ReadyFifo) -> None:
    """SIGHUP (the worker's terminal closed) stops the running job the graceful way: it is
    requeued as interrupted, not left running to be found orphaned later."""
    db = tmp_path / "q.db"
    saver = write_script(
        tmp_path,
        "saver.py",
        'tell("ready")\nsys.stdin.read()\nsys.exit(4)\n',
    )
    env = ["--env", f"TEST_SIGNALS={ready.path}", "--env", f"PYTHONPATH={JOB_ENV['PYTHONPATH']}"]
    cli(db, "submit", *env, "--sample-interval", "0.2", "--", *saver)
    worker_argv = [sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu",
                   "--poll", "0.1"]  # fmt: skip
    with anyio.fail_after(LIMIT_S):
        async with await anyio.open_process(
            worker_argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as worker:
            assert await ready.line() == "ready"
            worker.send_signal(signal.SIGHUP)
            assert await worker.wait() == 0
    job = json.loads(cli(db, "job", "1", "--json").stdout)
    assert (job["status"], job["last_outcome"]) == ("queued", "interrupted")


def test_a_deleted_queue_file_stops_the_worker_with_status_1(tmp_path: Path) -> None:
    """An idle worker whose SQLite file is deleted exits 1 (not 75, "try again") within 20 s,
    its message naming the database."""
    db = tmp_path / "q.db"
    SqliteStore(db).close()
    with subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu", "--poll", "1"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stderr is not None
            for line in worker.stderr:  # the worker's log, until it says it started
                if "started on" in line:
                    break
            db.unlink()
            assert worker.wait(timeout=20) == 1
            error = worker.stderr.read().splitlines()[-1]
        finally:
            if worker.poll() is None:
                worker.kill()
    assert error.startswith("asyncsoak: error: ")
    assert str(db) in error
    assert "deleted" in error
