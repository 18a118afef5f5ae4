"""Job queue backends: claims per second with 8 workers, and how soon an idle worker starts a
new job, on PostgreSQL and on SQLite side by side.

    python -m benchmarks --only queue_backends      (or: python -m benchmarks.queue_backends)

PostgreSQL is a throwaway cluster in a temporary directory (the tests' ``PgCluster``:
``fsync=off``, the client on its unix socket); SQLite is a file in a temporary directory.

1. Claims: 2,000 trivial jobs, 8 processes each claiming and finishing jobs as fast as the
   store allows (``claim`` then ``finish``, no soak: what is measured is the queue itself).
   Jobs per second from the first claim to the last finish; every job must be claimed
   exactly once (one claim per id, attempt 1, ``succeeded``).
2. Idle pickup: one ``asyncsoak worker`` process (the command line, default poll period),
   idle; 20 jobs submitted one at a time.  Submit-to-claim latency is the job's
   ``started_at`` minus its ``created_at``, both written by the store with the same clock
   (the database's on PostgreSQL).  On PostgreSQL NOTIFY wakes the worker; on SQLite the
   submit touches the wake-up file beside the database (``queue.db-wake``), which the idle
   worker watches with inotify.  Either way the poll (5 s) is only the fallback: a job found
   by it would wait 2.5 s on average.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Figure, Section, percentile

WORKERS = 8
JOBS = 2000
IDLE_JOBS = 20
#: Between two submissions to the idle worker (seconds, drawn uniformly, seeded): it is idle
#: again before the next one.
IDLE_SPACING = {"postgres": (0.3, 0.8), "sqlite": (0.3, 0.8)}
SEED = 14
CLAIM_TARGET = 100.0
PICKUP_TARGET_S = 0.1


def _claimer(db: str, index: int, start: Any, out: Any) -> None:
    from asyncsoak.queue import Outcome, open_store

    done = Outcome("succeeded", 0, None, None)
    claimed: list[tuple[int, int]] = []
    runs = Path(tempfile.gettempdir()) / "unused-runs"
    with open_store(db, busy_timeout=60.0) as store:
        start.wait()
        while (job := store.claim(f"bench{index}", "bench", runs)) is not None:
            store.finish(job.id, job.attempt, f"bench{index}", done)
            claimed.append((job.id, job.attempt))
    out.put(claimed)


def claims(db: str, jobs: int, open_store: Callable[..., Any]) -> tuple[float, list[int]]:
    """Jobs per second over ``jobs`` jobs with ``WORKERS`` claiming processes, and the ids not
    claimed exactly once."""
    with open_store(db) as store:
        ids = [store.submit(argv=["true"]) for _ in range(jobs)]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WORKERS + 1)
    out = ctx.Queue()
    processes = [ctx.Process(target=_claimer, args=(db, i, start, out)) for i in range(WORKERS)]
    for p in processes:
        p.start()
    start.wait()
    began = time.monotonic()
    results = [out.get(timeout=600) for _ in processes]
    elapsed = time.monotonic() - began
    for p in processes:
        p.join(timeout=60)
    counts: dict[int, int] = {}
    for claimed in results:
        for job_id, attempt in claimed:
            counts[job_id] = counts.get(job_id, 0) + (1 if attempt == 1 else 100)
    with open_store(db) as store:
        statuses = {job.id: job.status for job in store.jobs()}
    bad = [n for n in ids if counts.get(n) != 1 or statuses.get(n) != "succeeded"]
    return jobs / elapsed, bad


def idle_pickup(
    db: str, jobs: int, spacing: tuple[float, float], open_store: Callable[..., Any]
) -> list[float]:
    """Submit-to-claim latencies (s) of ``jobs`` jobs given one at a time to an idle worker."""
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-runs-") as runs:
        worker = subprocess.Popen(
            [sys.executable, "-m", "asyncsoak", "worker", "--db", db, "--no-gpu",
             "--runs-dir", runs],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        latencies = []
        rng = random.Random(SEED)
        try:
            with open_store(db) as store:
                deadline = time.monotonic() + 60
                while not store.workers() and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(spacing[1])  # past its first claim: idle, waiting
                for _ in range(jobs):
                    job_id = store.submit(argv=["true"])
                    deadline = time.monotonic() + 30
                    while (job := store.get(job_id)).started_at is None:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"job {job_id} was not claimed within 30 s")
                        time.sleep(0.005)
                    latencies.append(job.started_at - job.created_at)
                    time.sleep(rng.uniform(*spacing))
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
    return latencies


def run(quick: bool = False) -> Section:
    section = Section("queue_backends", "12. Queue backends")
    started = time.monotonic()
    try:
        job_queue = importlib.import_module("asyncsoak.queue")
        pg_cluster = importlib.import_module("tests.queue.pg_cluster")
    except ImportError as exc:
        section.note(f"skipped: {exc}")
        return section
    bindir = pg_cluster.find_bindir()
    if bindir is None:
        section.note("skipped: PostgreSQL's initdb and pg_ctl are not installed")
        return section
    jobs, idle_jobs = (200, 5) if quick else (JOBS, IDLE_JOBS)
    cluster = pg_cluster.PgCluster(bindir)
    try:
        with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
            files = (str(Path(tmp) / f"queue{n}.db") for n in range(2))
            for backend in ("postgres", "sqlite"):
                fresh: Callable[[], str] = (
                    cluster.create_database if backend == "postgres" else lambda: next(files)
                )
                rate, bad = claims(fresh(), jobs, job_queue.open_store)
                section.add(
                    Figure(
                        f"{backend}: {jobs} jobs, {WORKERS} workers: jobs claimed per second",
                        rate,
                        "jobs/s",
                        target=f">= {CLAIM_TARGET:g} jobs/s" if backend == "postgres" else "",
                        met=rate >= CLAIM_TARGET if backend == "postgres" else None,
                    )
                )
                section.add(
                    Figure(
                        f"{backend}: each job claimed exactly once",
                        jobs - len(bad),
                        f"of {jobs}",
                        target="all",
                        met=not bad,
                    )
                )
                latencies = idle_pickup(
                    fresh(), idle_jobs, IDLE_SPACING[backend], job_queue.open_store
                )
                p50 = percentile(latencies, 50)
                section.add(
                    Figure(
                        f"{backend}: idle worker, submit-to-claim latency, p50",
                        p50,
                        "s",
                        reference=f"poll period {job_queue.POLL_S:g} s",
                        ratio=p50 / job_queue.POLL_S,
                        target=f"<= {PICKUP_TARGET_S:g} s",
                        met=p50 <= PICKUP_TARGET_S,
                    )
                )
                section.add(
                    Figure(
                        f"{backend}: idle worker, submit-to-claim latency, p95",
                        percentile(latencies, 95),
                        "s",
                    )
                )
    finally:
        cluster.destroy()
    section.note(
        f"claims: {jobs} jobs, {WORKERS} processes claiming and finishing without a soak; "
        f"idle pickup: {idle_jobs} jobs, one at a time, to one idle worker (default poll)"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
