"""The worker's metrics, scraped for real while it runs jobs."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from asyncsoak import Metrics
from asyncsoak.queue import JobStore, run_worker

from ..conftest import ReadyFifo, asyncsoak_cli
from ..metrics_support import free_port, samples, scrape_until, value
from .helpers import FAST_SOAK, JOB_ENV, write_script
from .test_queue_worker import worker_kwargs

pytestmark = pytest.mark.slow

LIMIT_S = 60.0

JOB = """
from pathlib import Path
from asyncsoak import trainer
Path(os.environ["ASYNCSOAK_RUN_DIR"], "step").write_text("1")
tell(f"running {trainer.job_id()}")
while not Path(sys.argv[1]).exists():
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.asyncio
async def test_worker_metrics_follow_its_jobs(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """Jobs by status, the current job, the heartbeat, the running soak, outcome counters."""
    argv = write_script(tmp_path, "job.py", JOB)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    first = store.submit(argv=[*argv, str(tmp_path / "end1"), "0"], env=env, soak=FAST_SOAK)
    second = store.submit(
        argv=[*argv, str(tmp_path / "end2"), "3"], env=env, soak=FAST_SOAK, max_attempts=1
    )
    port = free_port()
    stop = anyio.Event()
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            kwargs = worker_kwargs(tmp_path, once=False, stop_event=stop)
            kwargs["metrics"] = Metrics(port=port)
            tg.start_soon(lambda: run_worker(store, **kwargs))
            assert await ready.line() == f"running {first}"
            running = await scrape_until(
                port,
                lambda t: (
                    value(t, "asyncsoak_queue_jobs", status="running") == 1
                    and value(t, "asyncsoak_tree_resident_memory_bytes") is not None
                    # The job's first progress reaches the soak a moment after it says so.
                    and value(t, "asyncsoak_soak_phase", phase="running") == 1
                ),
            )
            assert value(running, "asyncsoak_queue_jobs", status="queued") == 1
            assert value(running, "asyncsoak_queue_jobs", status="succeeded") == 0
            assert value(running, "asyncsoak_worker_current_job_id") == first
            assert value(running, "asyncsoak_worker_current_job_attempt") == 1
            beat = value(running, "asyncsoak_worker_heartbeat_timestamp_seconds")
            assert beat is not None
            (info,) = samples(running)["asyncsoak_soak_info"]
            assert info[0]["job_id"] == str(first)
            assert value(running, "asyncsoak_soak_phase", phase="running") == 1

            (tmp_path / "end1").touch()
            assert await ready.line() == f"running {second}"
            later = await scrape_until(
                port,
                lambda t: (
                    value(t, "asyncsoak_worker_job_outcomes_total", status="succeeded") == 1
                    and value(t, "asyncsoak_worker_current_job_id") == second
                    # The job is claimed a moment before its soak starts and shows.
                    and value(t, "asyncsoak_soak_info", job_id=str(second)) == 1
                ),
            )
            assert value(later, "asyncsoak_queue_jobs", status="succeeded") in (0, 1)
            (info,) = samples(later)["asyncsoak_soak_info"]
            assert info[0]["job_id"] == str(second)
            later_beat = value(later, "asyncsoak_worker_heartbeat_timestamp_seconds")
            assert later_beat is not None
            assert later_beat >= beat

            (tmp_path / "end2").touch()
            final = await scrape_until(
                port,
                lambda t: (
                    value(t, "asyncsoak_worker_job_outcomes_total", status="failed") == 1
                    and value(t, "asyncsoak_queue_jobs", status="failed") == 1
                    # The outcome is written a moment before the worker lets the job go.
                    and value(t, "asyncsoak_worker_current_job_id") is None
                ),
            )
            stop.set()
    assert value(final, "asyncsoak_worker_job_outcomes_total", reason="nonzero_exit") == 1
    assert value(final, "asyncsoak_queue_jobs", status="succeeded") == 1
    # Between jobs the worker shows no soak, and no current job.
    assert "asyncsoak_soak_info" not in samples(final)
    assert value(final, "asyncsoak_worker_current_job_id") is None


def test_worker_metrics_port_in_use_is_refused(tmp_path: Path, store: JobStore) -> None:
    """``asyncsoak worker --metrics-port`` on a taken port: exit 2 naming it, no job claimed."""
    job = store.submit(argv=["true"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = asyncsoak_cli(
            "worker", "--db", store.location, "--once", "--no-gpu",
            "--runs-dir", str(tmp_path / "runs"), "--metrics-port", str(port),
            cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert store.get(job).status == "queued"
