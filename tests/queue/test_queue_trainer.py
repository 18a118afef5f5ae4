"""asyncsoak.trainer in real child processes: stop requests, cancellation, config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from asyncsoak import trainer
from asyncsoak.queue import JobStore

from ..conftest import ReadyFifo
from .helpers import JOB_ENV, write_script

pytestmark = pytest.mark.slow

RUNS = Path("/nonexistent/runs")

STOPPING_TRAINER = """
from asyncsoak import trainer
stop = trainer.stop_requested()
tell("ready")
if stop.wait(20):
    tell("stopped")
    sys.exit(trainer.EXIT_INTERRUPTED)
tell("timed out")
"""


def test_trainer_imports_neither_anyio_nor_psutil() -> None:
    """Importing asyncsoak.trainer pulls in neither anyio nor psutil."""
    code = "import sys, asyncsoak.trainer; print(sorted({'anyio', 'psutil'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.asyncio
async def test_stop_requested_when_stdin_closes(tmp_path: Path, ready: ReadyFifo) -> None:
    """Under the stdin protocol, closing the child's stdin sets stop_requested()."""
    argv = write_script(tmp_path, "t.py", STOPPING_TRAINER)
    env = {**os.environ, **JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    env["ASYNCSOAK_STOP_MODE"] = "stdin"
    async with await anyio.open_process(argv, stdin=subprocess.PIPE, env=env) as proc:
        assert await ready.line() == "ready"
        assert proc.stdin is not None
        await proc.stdin.aclose()
        assert await ready.line() == "stopped"
        with anyio.fail_after(20):
            assert await proc.wait() == trainer.EXIT_INTERRUPTED


@pytest.mark.asyncio
async def test_stop_requested_on_sigterm(tmp_path: Path, ready: ReadyFifo) -> None:
    """With a signal stop mode, SIGTERM sets stop_requested() instead of killing the child."""
    argv = write_script(tmp_path, "t.py", STOPPING_TRAINER)
    env = {**os.environ, **JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    env["ASYNCSOAK_STOP_MODE"] = "group"
    async with await anyio.open_process(argv, env=env) as proc:
        assert await ready.line() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert await ready.line() == "stopped"
        with anyio.fail_after(20):
            assert await proc.wait() == trainer.EXIT_INTERRUPTED


@pytest.mark.asyncio
async def test_cancel_requested_and_load_config(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A child reads its config and sees its cancellation through the queue database."""
    job_id = store.submit(config={"lr": 3e-4, "steps": 10})
    assert store.claim("w1", "h", RUNS) is not None
    argv = write_script(
        tmp_path,
        "t.py",
        """
import json
from asyncsoak import trainer
tell(json.dumps(trainer.load_config()))
tell(str(trainer.cancel_requested(min_interval=0)))
sys.stdin.readline()
tell(str(trainer.cancel_requested(min_interval=0)))
""",
    )
    env = {**os.environ, **JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    env.update(ASYNCSOAK_DB=store.location, ASYNCSOAK_JOB_ID=str(job_id))
    async with await anyio.open_process(argv, stdin=subprocess.PIPE, env=env) as proc:
        assert json.loads(await ready.line()) == {"lr": 3e-4, "steps": 10}
        assert await ready.line() == "False"
        store.cancel(job_id)
        assert proc.stdin is not None
        await proc.stdin.send(b"go\n")
        assert await ready.line() == "True"
        with anyio.fail_after(20):
            assert await proc.wait() == 0


def test_load_config_outside_the_queue(monkeypatch: pytest.MonkeyPatch, store: JobStore) -> None:
    """load_config explains itself outside the queue and for a command job."""
    monkeypatch.delenv("ASYNCSOAK_JOB_ID", raising=False)
    monkeypatch.delenv("ASYNCSOAK_DB", raising=False)
    with pytest.raises(RuntimeError, match="not started by an asyncsoak worker"):
        trainer.load_config()
    job_id = store.submit(argv=["python", "train.py"])
    with pytest.raises(RuntimeError, match="submitted with a command"):
        trainer.load_config(job_id, store.location)
    assert trainer.cancel_requested(min_interval=0) is False
