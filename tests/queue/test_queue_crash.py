"""Crash consistency of the queue: what a worker SIGKILLed at any moment leaves behind never
runs beside the job's next attempt, and no attempt goes missing.

The main test kills four worker processes at random moments (while claiming, while their job
runs and heartbeats, around the final write) over 100 jobs.  The jobs' children keep a
ledger (one shared file, O_APPEND) of when each attempt started and ended, and of which other
processes of the same job were alive when it started: that is how "two runs at the same
time" is counted, from the children's side.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from asyncsoak._process._spawn import REAPER_SCRIPT
from asyncsoak.queue import Attempt, Job, JobStore, open_store
from asyncsoak.queue._fleet import is_postgres
from asyncsoak.queue._models import TERMINAL_STATUSES
from asyncsoak.queue._status import INFRASTRUCTURE_REASONS

from ..conftest import REPO, ReadyFifo, alive
from .helpers import FAST_SOAK
from .test_queue_worker import LIMIT_S, runs_of, start_worker_process, submit_trainer

pytestmark = pytest.mark.slow

#: Default seed of the chaos (which worker dies when, under which name, job lengths);
#: ``ASYNCSOAK_CHAOS_SEED`` replays another.
DEFAULT_SEED = 20240611
JOBS = 100
WORKERS = 4
#: Jobs that exit 3 on every attempt (the failure path).
FAILING_JOBS = 8
KILLS = 40
#: The same chaos on PostgreSQL, smaller: the suite's time is shared.
PG_JOBS, PG_FAILING_JOBS, PG_KILLS = 24, 3, 12
#: What a killed worker may be doing: claimed a job whose child has not started yet, runs it
#: (heartbeats), saw it end but has not written its outcome yet, or is between jobs.
PHASES = ("claim", "running", "final", "idle")
#: How long one kill waits for a worker to be in the phase it aims at.
AIM_PATIENCE_S = 3.0
#: How often the chaos looks at the database and the ledger.
TICK_S = 0.02
#: Bound on the chaos; the jobs normally all end well before it.  What is left then is
#: drained by one worker.
CHAOS_BOUND_S = 50.0
#: A drain that changes no job's status for this long is stuck (a soak that stopped hearing
#: its child, say); a job runs 0.3 s at most.  The drain as a whole is bounded by its
#: progress, not by a fixed time: a loaded machine ends few jobs during the chaos (17 of 100
#: in one run), and a healthy drain of the rest takes 0.6 s a job, past any fixed bound.
DRAIN_STALL_S = 60.0
#: The drain's outer bound, per job the chaos left (a backstop: the stall check ends first).
DRAIN_S_PER_JOB = 5.0
#: Heartbeat age that makes a job an orphan: well above a loaded machine's heartbeat jitter,
#: since a dead worker on this host is noticed at once through its pid.
STALE_AFTER_S = 5.0
#: Orphans are retried at once here, so the drain finds them claimable (the backoff of the
#: infrastructure's retries is tested in test_queue_sweeps.py).
RETRY_BACKOFF = "0"

#: The job: ledger "start", then the live processes of the same job ("peers"), progress
#: for ``seconds``, ledger "end" and the exit status.  Every ledger line is one write on an
#: O_APPEND descriptor, so lines of concurrent children never interleave.
CHILD = """\
import os, sys, time
ledger, seconds, status = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
job, attempt = os.environ["ASYNCSOAK_JOB_ID"], os.environ["ASYNCSOAK_ATTEMPT"]
db = os.environ["ASYNCSOAK_DB"]

def record(*fields):
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (" ".join(map(str, fields)) + "\\n").encode())
    os.close(fd)

record("start", job, attempt, os.getpid(), time.monotonic())
mine = {f"ASYNCSOAK_DB={db}".encode(), f"ASYNCSOAK_JOB_ID={job}".encode()}
peers = []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        with open(f"/proc/{entry}/environ", "rb") as f:
            environ = f.read().split(b"\\0")
    except OSError:
        continue  # gone, or a zombie: not running
    if mine <= set(environ):
        other = next(v for v in environ if v.startswith(b"ASYNCSOAK_ATTEMPT="))
        peers.append(f"{entry}:{other.split(b'=', 1)[1].decode()}")
record("peers", job, attempt, os.getpid(), ",".join(peers) or "-")
progress = os.path.join(os.environ["ASYNCSOAK_RUN_DIR"], "progress")
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    with open(progress, "a") as f:
        f.write(".")
    time.sleep(0.02)
record("end", job, attempt, os.getpid(), time.monotonic(), status)
sys.exit(status)
"""


@dataclass(slots=True)
class Run:
    """One attempt as its child saw it."""

    job: int
    attempt: int
    pid: int
    start: float
    end: float | None = None
    status: int | None = None
    #: (pid, attempt) of the job's other processes alive when this one started.
    peers: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Kill:
    name: str
    since: float  # when the worker process started; wall clock, like the store's timestamps
    at: float
    monotonic: float  # when it was killed, on the ledger's clock


def read_ledger(path: Path) -> list[Run]:
    runs: dict[int, Run] = {}
    if not path.exists():
        return []
    # The last line may be a child's write still in progress.
    for line in path.read_text().split("\n")[:-1]:
        kind, job, attempt, pid, *rest = line.split()
        if kind == "start":
            runs[int(pid)] = Run(int(job), int(attempt), int(pid), float(rest[0]))
        elif kind == "peers" and rest[0] != "-":
            runs[int(pid)].peers = [
                (int(p), int(a)) for p, a in (peer.split(":") for peer in rest[0].split(","))
            ]
        elif kind == "end":
            runs[int(pid)].end, runs[int(pid)].status = float(rest[0]), int(rest[1])
    return list(runs.values())


def phase(store: JobStore, ledger: list[Run], kill: Kill) -> str:
    """What the killed worker was doing, from the attempts history and the ledger:
    ``claim`` (attempt claimed, child not started), ``running`` (child running, heartbeats),
    ``final`` (child ended, outcome not yet written) or ``idle`` (between jobs)."""
    for job in store.jobs():
        for attempt in store.attempts(job.id):
            # A replacement may have its predecessor's name: only claims since it started count.
            if (
                attempt.worker == kill.name
                and kill.since <= attempt.started_at <= kill.at
                and (attempt.finished_at is None or attempt.finished_at >= kill.at)
            ):
                runs = [r for r in ledger if (r.job, r.attempt) == (job.id, attempt.attempt)]
                if not runs or runs[0].start > kill.monotonic:
                    return "claim"
                end = runs[0].end
                return "running" if end is None or end > kill.monotonic else "final"
    return "idle"


@dataclass(frozen=True, slots=True)
class Step:
    """One kill of the plan."""

    pause: float  # seconds after the previous kill
    aim: str  # the phase to catch a worker in
    pick: float  # which of the workers in that phase, as a fraction
    rename: bool  # whether the replacement gets a new name (else it takes over by name)


def kill_plan(rng: random.Random, kills: int = KILLS) -> list[Step]:
    """The chaos's choices, all drawn from the seed up front: only the moments they land on
    depend on the machine."""
    aims = [aim for _ in range(kills // 4) for aim in rng.sample(PHASES, len(PHASES))]
    return [Step(rng.uniform(0.05, 0.3), aim, rng.random(), rng.random() < 0.5) for aim in aims]


class Chaos:
    """The worker processes, and the kills: each aimed at a phase, at a random moment."""

    def __init__(self, store: JobStore, tmp_path: Path) -> None:
        self.store = store
        self.tmp_path = tmp_path
        self.workers: dict[int, tuple[str, float, Process]] = {}
        self.kills: list[Kill] = []
        self.missed = 0
        self.generation = 0

    async def run(self, plan: list[Step], ledger: Path, deadline: float) -> None:
        """Follow the plan, then wait for the jobs to end, until ``deadline`` (monotonic)."""
        for step in plan:
            await anyio.sleep(step.pause)
            aim_until = time.monotonic() + AIM_PATIENCE_S
            while not self.done() and time.monotonic() < min(aim_until, deadline):
                slots = self.in_phase(step.aim, read_ledger(ledger))
                if slots:
                    await self.kill(slots[int(step.pick * len(slots))], step)
                    break
                await anyio.sleep(TICK_S)
            else:
                if self.done() or time.monotonic() >= deadline:
                    return
                self.missed += 1
        # Other processes change the database: there is no event to wait on, only its state.
        while True:
            if self.done() or time.monotonic() >= deadline:
                return
            await anyio.sleep(TICK_S)

    def done(self) -> bool:
        return not self.store.jobs("queued") and not self.store.jobs("running")

    async def start(self, slot: int, name: str) -> None:
        since = time.time()
        process = await start_worker_process(
            self.store, self.tmp_path, name, "--stale-after", str(STALE_AFTER_S),
            "--retry-backoff", RETRY_BACKOFF,
        )  # fmt: skip
        self.workers[slot] = (name, since, process)

    def in_phase(self, wanted: str, ledger: list[Run]) -> list[int]:
        """Slots whose worker is in ``wanted`` now, as far as the database and ledger say."""
        registered = {w.pid: w for w in self.store.workers()}
        started = {(r.job, r.attempt): r for r in ledger}
        slots = []
        for slot, (name, _, process) in self.workers.items():
            if process.pid not in registered:
                continue  # starting: the row under its name may still be its predecessor's
            job_id = registered[process.pid].job_id
            if job_id is None:
                now = "idle"
            else:
                job = self.store.get(job_id)
                run = started.get((job.id, job.attempt))
                if job.status != "running" or job.worker != name:
                    continue
                now = "claim" if run is None else ("running" if run.end is None else "final")
            if now == wanted:
                slots.append(slot)
        return slots

    async def kill(self, slot: int, step: Step) -> None:
        name, since, process = self.workers.pop(slot)
        self.kills.append(Kill(name, since, time.time(), time.monotonic()))
        process.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            await process.wait()
        await process.aclose()
        # Replacements that keep the name take back their predecessor's job by name.
        if step.rename:
            self.generation += 1
            name = f"w{slot}.{self.generation}"
        await self.start(slot, name)

    async def stop_all(self) -> None:
        for _, _, process in self.workers.values():
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
            with anyio.move_on_after(10, shield=True):
                await process.wait()
                await process.aclose()
        self.workers.clear()


def submit_jobs(
    store: JobStore,
    tmp_path: Path,
    rng: random.Random,
    jobs: int = JOBS,
    failing_jobs: int = FAILING_JOBS,
) -> dict[int, bool]:
    """The jobs; returns whether each is meant to succeed."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ledger = tmp_path / "ledger.txt"
    failing = set(rng.sample(range(jobs), failing_jobs))
    meant: dict[int, bool] = {}
    for index in range(jobs):
        status = 3 if index in failing else 0
        seconds = f"{rng.uniform(0.02, 0.3):.3f}"
        job_id = store.submit(
            argv=[sys.executable, str(script), str(ledger), seconds, str(status)],
            soak=FAST_SOAK,
            max_attempts=2 if status else 8,
        )
        meant[job_id] = not status
    return meant


def drain_command(store: JobStore, tmp_path: Path) -> list[str]:
    """A clean worker that resolves what dead workers left, runs what is queued, and exits."""
    return [
        sys.executable, "-m", "asyncsoak", "worker", "--db", store.location, "--once",
        "--no-gpu", "--poll", "0.1", "--stale-after", str(STALE_AFTER_S),
        "--retry-backoff", RETRY_BACKOFF, "--runs-dir", str(tmp_path / "runs"),
    ]  # fmt: skip


async def drain(store: JobStore, tmp_path: Path) -> None:
    """Run the draining worker to its end, failing (with its log) once no job's status has
    changed for ``DRAIN_STALL_S``: a hang is told from a long queue."""
    log_path = tmp_path / "drain.log"
    counts = store.count_by_status()
    left = sum(n for status, n in counts.items() if status not in TERMINAL_STATUSES)
    with (
        anyio.fail_after(LIMIT_S + DRAIN_S_PER_JOB * left),
        log_path.open("wb") as log,
    ):
        async with await anyio.open_process(
            drain_command(store, tmp_path), cwd=REPO, stdout=log, stderr=log
        ) as process:
            changed_at = time.monotonic()
            while process.returncode is None:
                with anyio.move_on_after(TICK_S * 10):
                    await process.wait()
                now = store.count_by_status()
                if now != counts:
                    counts, changed_at = now, time.monotonic()
                elif time.monotonic() - changed_at > DRAIN_STALL_S:
                    process.kill()
                    running = [job.id for job in store.jobs("running")]
                    tail = log_path.read_text(errors="replace")[-4000:]
                    pytest.fail(
                        f"the drain changed no job for {DRAIN_STALL_S:g}s (running: {running}); "
                        f"its log ends:\n{tail}"
                    )
    assert process.returncode == 0, log_path.read_text(errors="replace")[-4000:]


def trainers_alive(store: JobStore) -> list[int]:
    """Processes of this host that carry this queue's job markers."""
    marker = f"ASYNCSOAK_DB={store.location}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def check_history(job: Job, history: list[Attempt], runs: list[Run], meant_ok: bool) -> None:
    assert job.status in TERMINAL_STATUSES, f"job {job.id} ended {job.status}"
    assert [a.attempt for a in history] == list(range(1, job.attempt + 1)), (
        f"job {job.id}: attempts {[a.attempt for a in history]}, counter {job.attempt}"
    )
    assert all(a.outcome is not None for a in history), f"job {job.id}: an attempt left open"
    assert history[-1].outcome == job.status, f"job {job.id}: {job.status} but {history[-1]}"
    assert [a.outcome for a in history[:-1]] == ["failed"] * (len(history) - 1), (
        f"job {job.id}: an attempt before the last ended other than failed: {history}"
    )
    # An orphan (its worker died) is the infrastructure's and does not count.
    assert job.attempts == sum(
        a.outcome == "failed" and a.reason not in INFRASTRUCTURE_REASONS for a in history
    )
    recorded = {a.attempt for a in history}
    for run in runs:
        assert run.attempt in recorded, f"job {job.id}: attempt {run.attempt} ran, unrecorded"
    by_attempt = collections.Counter(run.attempt for run in runs)
    assert max(by_attempt.values(), default=1) == 1, f"job {job.id}: one attempt ran twice"
    ledger = {run.attempt: run for run in runs}
    for attempt in history:
        if attempt.outcome == "succeeded":
            succeeded = ledger.get(attempt.attempt)
            assert succeeded is not None, f"job {job.id}: succeeded without running"
            assert succeeded.status == 0, f"job {job.id}: succeeded, its child said otherwise"
    if not meant_ok:
        assert job.status == "failed", f"job {job.id} exits 3 but ended {job.status}"


def check_no_overlap(job_id: int, runs: list[Run]) -> None:
    """Attempts start in order, each after the previous child ended or died."""
    ordered = sorted(runs, key=lambda r: r.start)
    assert [r.attempt for r in ordered] == sorted(r.attempt for r in ordered), (
        f"job {job_id}: a stale attempt started after a newer one: {ordered}"
    )
    for run in ordered:
        assert not run.peers, f"job {job_id}: attempt {run.attempt} started beside {run.peers}"
    for earlier, later in itertools.pairwise(ordered):
        if earlier.end is not None:
            assert earlier.end < later.start, f"job {job_id}: {earlier} overlaps {later}"


@pytest.mark.asyncio
async def test_random_worker_kills_leave_every_job_consistent(tmp_path: Path, db: str) -> None:
    """Dozens of SIGKILLs of four workers over 100 jobs (40 on PostgreSQL): afterwards every
    job is terminal, no two runs of a job overlapped, and every attempt that ran is in the
    history."""
    seed = int(os.environ.get("ASYNCSOAK_CHAOS_SEED", DEFAULT_SEED))
    print(f"chaos seed {seed}")
    rng = random.Random(seed)
    ledger_path = tmp_path / "ledger.txt"
    postgres = is_postgres(db)
    kills = PG_KILLS if postgres else KILLS
    with open_store(db) as store:
        if postgres:
            meant = submit_jobs(store, tmp_path, rng, PG_JOBS, PG_FAILING_JOBS)
        else:
            meant = submit_jobs(store, tmp_path, rng)
        chaos = Chaos(store, tmp_path)
        started = time.monotonic()
        try:
            with anyio.fail_after(CHAOS_BOUND_S + 10):
                for slot in range(WORKERS):
                    await chaos.start(slot, f"w{slot}")
                await chaos.run(kill_plan(rng, kills), ledger_path, started + CHAOS_BOUND_S)
        finally:
            await chaos.stop_all()
        chaos_s = time.monotonic() - started
        await drain(store, tmp_path)
        ledger = read_ledger(ledger_path)
        phases = collections.Counter(phase(store, ledger, kill) for kill in chaos.kills)
        print(
            f"{len(chaos.kills)} kills in {chaos_s:.1f}s, by phase: {dict(phases)}, "
            f"{chaos.missed} aims missed"
        )
        runs_by_job: dict[int, list[Run]] = collections.defaultdict(list)
        for run in ledger:
            runs_by_job[run.job].append(run)
        for job in store.jobs():
            check_no_overlap(job.id, runs_by_job[job.id])
            check_history(job, store.attempts(job.id), runs_by_job[job.id], meant[job.id])
        assert trainers_alive(store) == []
        assert len(chaos.kills) >= kills * 3 // 4, f"only {len(chaos.kills)} kills (seed {seed})"
        assert {"claim", "running", "final"} <= set(phases), f"{phases} (seed {seed})"


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
        [sys.executable, "-I", "-S", REAPER_SCRIPT],  # as the spawner starts it
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
            "ASYNCSOAK_DB": store.location,
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
        drained = subprocess.run(
            drain_command(store, tmp_path),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
        assert drained.returncode == 0, drained.stderr
        assert not alive(reaper.pid)
    finally:
        if reaper.poll() is None:
            reaper.kill()
        reaper.wait(LIMIT_S)
    assert ready.line_sync() == "started 2"
    assert runs_of(tmp_path) == [f"{job_id} 2"]
    history = store.attempts(job_id)
    assert [(a.outcome, a.reason) for a in history] == [("failed", "orphaned"), ("succeeded", None)]
