"""Crash consistency of the queue: what a worker SIGKILLed at any moment leaves behind never
runs beside the job's next attempt."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from asyncsoak.queue import JobStore

from ..conftest import REPO, ReadyFifo, alive
from .test_queue_worker import LIMIT_S, runs_of, submit_trainer

#: Heartbeat age that makes a job an orphan.
STALE_AFTER_S = 5.0


def drain_command(store: JobStore, tmp_path: Path) -> list[str]:
    """A clean worker that resolves what dead workers left, runs what is queued, and exits."""
    return [
        sys.executable, "-m", "asyncsoak", "worker", "--db", str(store.path), "--once",
        "--no-gpu", "--poll", "0.1", "--stale-after", str(STALE_AFTER_S),
        "--runs-dir", str(tmp_path / "runs"),
    ]  # fmt: skip


def test_orphan_sweep_kills_a_reaper_that_has_not_started_the_command(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A dead worker's reaper that holds the command but has not started it yet is killed
    with the orphan: the old attempt can never start beside the next one."""
    job_id = submit_trainer(store, tmp_path, ready, "exit0", max_attempts=2)
    host = socket.gethostname()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        check=True,
        timeout=LIMIT_S,
    )
    store.register_worker(
        "ghost", host=host, pid=int(gone.stdout), pid_start=None, alive=lambda w: False
    )
    ghost = store.claim("ghost", host, tmp_path / "runs")
    assert ghost is not None
    assert ghost.argv is not None
    assert ghost.artifact is not None
    # What the ghost left when it died: its reaper, started, handed the command and the
    # attempt's log, and not yet scheduled to start the command (stopped: a busy machine).
    attempt_dir = Path(ghost.artifact).parent
    attempt_dir.mkdir(parents=True)
    log_fd = os.open(attempt_dir / "train.log", os.O_WRONLY | os.O_CREAT, 0o600)
    reaper = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak._reaper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        pass_fds=[log_fd],
        cwd=REPO,
    )
    os.close(log_fd)  # the reaper has it, under the same number
    try:
        reaper.send_signal(signal.SIGSTOP)
        os.waitid(os.P_PID, reaper.pid, os.WSTOPPED)
        env = {
            **os.environ,
            **ghost.env,
            "ASYNCSOAK_JOB_ID": str(job_id),
            "ASYNCSOAK_DB": str(store.path),
            "ASYNCSOAK_ATTEMPT": "1",
        }
        config = {
            "argv": ghost.argv,
            "cwd": None,
            "env": env,
            "stdin_fd": None,
            "log_fd": log_fd,
            "log_max_bytes": 1 << 20,
            "stop_mode": "group",
            "grace_seconds": 0.5,
        }
        assert reaper.stdin is not None
        reaper.stdin.write(json.dumps(config).encode() + b"\n")
        reaper.stdin.close()  # the lifeline of a dead worker
        subprocess.run(
            drain_command(store, tmp_path),
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=LIMIT_S,
        )
        assert not alive(reaper.pid)
    finally:
        if reaper.poll() is None:
            reaper.kill()
        reaper.wait(LIMIT_S)
    assert ready.line_sync() == "started 2"
    assert runs_of(tmp_path) == [f"{job_id} 2"]
    history = store.attempts(job_id)
    assert [(a.outcome, a.reason) for a in history] == [("failed", "orphaned"), ("succeeded", None)]
