"""The worker inside a SLURM allocation, on both backends: no job that would not fit."""

from __future__ import annotations

import time

import pytest

from asyncsoak.queue import JobStore, WorkerConfig, run_worker

pytestmark = pytest.mark.slow


@pytest.mark.asyncio
async def test_a_worker_near_the_end_of_its_allocation_takes_only_jobs_that_fit(
    store: JobStore,
) -> None:
    """A job whose max_duration ends after the allocation stays queued for another worker; one
    that fits runs; with no time left the worker takes nothing and stops."""
    too_long = store.submit(argv=["true"], soak={"max_duration_seconds": 3600.0})
    fits = store.submit(argv=["true"], soak={"max_duration_seconds": 30.0})
    config = WorkerConfig(poll_seconds=0.2, until=time.time() + 120, nvidia_smi=None)
    ran = await run_worker(store, config, once=True)
    assert ran == 1
    assert store.get(fits).status == "succeeded"
    assert store.get(too_long).status == "queued"
    assert store.get(too_long).attempt == 0
    config = WorkerConfig(poll_seconds=0.2, until=time.time() + 5, nvidia_smi=None)
    assert await run_worker(store, config) == 0
    assert store.get(too_long).status == "queued"
