"""Job queue: 4 workers, 500 jobs that exit at once: jobs per second, submit-to-start
latency, and each job run exactly once.

    python -m benchmarks --only queue_throughput      (or: python -m benchmarks.queue_throughput)

Four ``asyncsoak worker`` processes (the command line, default poll period, no GPU sampling)
share one SQLite queue in a temporary directory.  Every job is
``sh -c 'echo "$ASYNCSOAK_JOB_ID $ASYNCSOAK_ATTEMPT $(date +%s.%N)" >> runs.txt'``: it records
when it started and exits at once, so what is measured is the queue and the supervision of
each job (``run_soak``: reaper, samplers, artifact).  Jobs are submitted through
``JobStore.submit`` (the ``submit`` command's own call, without its interpreter start-up).

1. Idle workers: 20 jobs submitted one at a time, 0.5 s apart.  Submit-to-start latency
   (the job's ``created_at`` to the moment its command started) is bounded by the workers'
   poll period: an idle worker looks at the queue every ``POLL_S`` seconds, and workers
   started together poll together.
2. A backlog: 500 jobs submitted at once.  Jobs per second from the first job's start to the
   last job finished; latency here is mostly the wait in the queue.

Each job must have run exactly once: one line in ``runs.txt`` per job, every job
``succeeded`` at its first attempt.  Reference, in the same run: the same 500 commands run by
4 threads with ``subprocess.run`` and no supervision, the floor of running them at all.
"""

from __future__ import annotations

import collections
import importlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Figure, Section, median, percentile

WORKERS = 4
JOBS = 500
IDLE_JOBS = 20
IDLE_SPACING = 0.5
JOB_SCRIPT = 'echo "$ASYNCSOAK_JOB_ID $ASYNCSOAK_ATTEMPT $(date +%s.%N)" >> "$1"'


def job_argv(marker: Path) -> list[str]:
    return ["sh", "-c", JOB_SCRIPT, "job", str(marker)]


def read_marker(marker: Path) -> dict[int, list[tuple[int, float]]]:
    """Job id -> every (attempt, start time) recorded for it."""
    runs: dict[int, list[tuple[int, float]]] = collections.defaultdict(list)
    if marker.exists():
        for line in marker.read_text().splitlines():
            job, attempt, started = line.split()
            runs[int(job)].append((int(attempt), float(started)))
    return runs


def wait_finished(store: Any, ids: Sequence[int], timeout: float) -> float:
    """Wait until every job in ``ids`` has finished; the time the last one finished."""
    deadline = time.monotonic() + timeout
    wanted = set(ids)
    while time.monotonic() < deadline:
        jobs = [j for j in store.jobs() if j.id in wanted]
        if len(jobs) == len(wanted) and all(j.finished_at is not None for j in jobs):
            return float(max(j.finished_at for j in jobs))
        time.sleep(0.25)
    raise RuntimeError(f"jobs did not finish within {timeout:g} s")


def floor_jobs_per_second(marker: Path, jobs: int) -> float:
    """The same commands run by ``WORKERS`` threads without supervision."""
    work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    for n in range(jobs):
        work.put(n)
    for _ in range(WORKERS):
        work.put(None)
    env = dict(os.environ, ASYNCSOAK_ATTEMPT="1")

    def worker() -> None:
        while (n := work.get()) is not None:
            subprocess.run(job_argv(marker), env={**env, "ASYNCSOAK_JOB_ID": str(n)}, check=True)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return jobs / (time.monotonic() - started)


def run(quick: bool = False) -> Section:
    section = Section("queue_throughput", "8. Job queue")
    started = time.monotonic()
    try:
        job_queue = importlib.import_module("asyncsoak.queue")
    except ImportError:
        section.note("skipped: the job queue (asyncsoak.queue) is not in this tree")
        return section
    poll: float = job_queue.POLL_S
    jobs, idle_jobs = (40, 5) if quick else (JOBS, IDLE_JOBS)
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        work = Path(tmp)
        db = work / "queue.db"
        marker = work / "runs.txt"
        store = job_queue.open_store(db)
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu"],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for _ in range(WORKERS)
        ]
        try:
            idle_ids = []
            for _ in range(idle_jobs):
                idle_ids.append(store.submit(argv=job_argv(marker), cwd=work))
                time.sleep(IDLE_SPACING)
            wait_finished(store, idle_ids, 60 + 10 * idle_jobs)
            backlog_ids = [store.submit(argv=job_argv(marker), cwd=work) for _ in range(jobs)]
            last_finished = wait_finished(store, backlog_ids, 120 + 2 * jobs)
        finally:
            for process in workers:
                process.send_signal(signal.SIGTERM)
            for process in workers:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)
        by_id = {job.id: job for job in store.jobs()}
        runs = read_marker(marker)
        store.close()

        every = idle_ids + backlog_ids
        bad = [
            n
            for n in every
            if len(runs.get(n, [])) != 1 or by_id[n].status != "succeeded" or by_id[n].attempt != 1
        ]
        latency_idle = [runs[n][0][1] - by_id[n].created_at for n in idle_ids if n not in bad]
        latency_backlog = [runs[n][0][1] - by_id[n].created_at for n in backlog_ids if n not in bad]
        first_start = min(runs[n][0][1] for n in backlog_ids if runs.get(n))
        rate = jobs / (last_finished - first_start)
        floor = floor_jobs_per_second(work / "floor.txt", jobs)

    section.add(
        Figure(
            f"{jobs} jobs, {WORKERS} workers: jobs per second",
            rate,
            "jobs/s",
            reference=f"unsupervised floor {floor:.1f} jobs/s",
            ratio=rate / floor,
        )
    )
    section.add(
        Figure(
            "each job ran exactly once (one run, succeeded at attempt 1)",
            len(every) - len(bad),
            f"of {len(every)}",
            target="all",
            met=not bad,
        )
    )
    for label, values in (("idle workers", latency_idle), ("backlog", latency_backlog)):
        for q in (50, 95):
            section.add(
                Figure(
                    f"submit-to-start latency, {label}, p{q}",
                    percentile(values, q),
                    "s",
                    reference=f"poll period {poll:g} s" if label == "idle workers" else "",
                    ratio=percentile(values, q) / poll if label == "idle workers" else None,
                )
            )
    section.note(
        f"idle: {idle_jobs} jobs {IDLE_SPACING:g} s apart; backlog: {jobs} jobs at once; "
        f"median supervised job in the backlog: "
        f"{median([by_id[n].finished_at - by_id[n].started_at for n in backlog_ids]):.2f} s "
        "from claim to finish"
    )
    if bad:
        section.note(f"jobs not run exactly once: {bad[:20]}")
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
