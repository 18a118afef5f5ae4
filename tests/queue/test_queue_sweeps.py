"""Retries that know why, and sweeps (``--after``, ``--array``, ``--not-before``, ``--gpus``
on a worker owning several GPUs), on both backends."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
import pytest

from asyncsoak._contract._errors import ValidationError
from asyncsoak.cli import main
from asyncsoak.cli._sweeps import plan_note
from asyncsoak.queue import JobStore, Outcome, open_store, run_worker
from asyncsoak.queue._attempt import faulted_gpus
from asyncsoak.queue._status import (
    INFRASTRUCTURE,
    JOB,
    MAX_INFRASTRUCTURE_RETRIES,
    RUN,
    RetryPolicy,
    classify,
    decide,
    infrastructure_backoff,
    outcome_from_artifact,
)
from asyncsoak.queue._sweeps import GpuOffer

from ..conftest import ReadyFifo
from ..gpu_support import install_fake_nvidia_smi
from .helpers import FAST_SOAK, JOB_ENV, write_script
from .test_queue_worker import LIMIT_S, artifact_of, start_worker_process, worker_kwargs

RUNS = Path("/nonexistent/runs")

#: Says which attempt started; attempts before ``sys.argv[1]`` wait for stdin's EOF (their
#: worker's death) and exit 4, the later ones exit 0.
UNTIL_ATTEMPT = """
from asyncsoak import trainer
tell(f"started {trainer.attempt()}")
if trainer.attempt() < int(sys.argv[1]):
    trainer.stop_requested().wait(60)
    tell("eof")
    sys.exit(trainer.EXIT_INTERRUPTED)
"""

#: Raises the same ValueError at the same line on every attempt.
RAISES = """
tell("started " + os.environ["ASYNCSOAK_ATTEMPT"])
raise ValueError("bad learning rate")
"""

#: Says its job, CUDA_VISIBLE_DEVICES and array index, then waits for the file ``argv[1]``.
SAYS_GPUS = """
from pathlib import Path
tell(f"{os.environ['ASYNCSOAK_JOB_ID']} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
while not Path(sys.argv[1]).exists():
    time.sleep(0.02)
"""


def cli(*args: str) -> int:
    return main(list(args))


@pytest.mark.slow
@pytest.mark.asyncio
async def test_worker_sigkilled_twice_then_third_attempt_succeeds(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A job with max_attempts 2 whose worker is SIGKILLed twice mid-run succeeds on its
    third attempt: an orphaned attempt does not count against --max-attempts."""
    argv = write_script(tmp_path, "trainer.py", UNTIL_ATTEMPT)
    env = {**JOB_ENV, "TEST_SIGNALS": str(ready.path)}
    job_id = store.submit(argv=[*argv, "3"], env=env, soak=FAST_SOAK, max_attempts=2)
    for attempt in (1, 2):
        async with await start_worker_process(
            store, tmp_path, f"doomed{attempt}", "--retry-backoff", "0"
        ) as worker:
            assert await ready.line() == f"started {attempt}"
            worker.send_signal(signal.SIGKILL)
            assert await ready.line() == "eof"
            with anyio.fail_after(LIMIT_S):
                await worker.wait()
    with anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path, retry_backoff_seconds=0)) == 1
    assert await ready.line() == "started 3"
    job = store.get(job_id)
    assert (job.status, job.attempts, job.attempt) == ("succeeded", 0, 3)
    history = store.attempts(job_id)
    assert [(a.outcome, a.reason) for a in history] == [
        ("failed", "orphaned"),
        ("failed", "orphaned"),
        ("succeeded", None),
    ]
    assert all("not counted against --max-attempts" in (a.note or "") for a in history[:2])
    causes = store.attempt_causes(job_id)
    assert [(causes[k].failure_class, causes[k].counted) for k in (1, 2)] == [
        (INFRASTRUCTURE, False),
        (INFRASTRUCTURE, False),
    ]
    assert store.plan(job_id).infra_failures == 2


@pytest.mark.slow
@pytest.mark.asyncio
async def test_same_exception_twice_is_not_tried_a_third_time(
    tmp_path: Path, db: str, ready: ReadyFifo, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job raising the same ValueError at the same line twice is failed after its second
    attempt although attempts remain, and ``job N`` says why."""
    argv = write_script(tmp_path, "train.py", RAISES)
    with open_store(db) as store:
        job_id = store.submit(
            argv=argv, env={"TEST_SIGNALS": str(ready.path)}, soak=FAST_SOAK, max_attempts=5
        )
        with anyio.fail_after(LIMIT_S):
            assert await run_worker(store, **worker_kwargs(tmp_path)) == 2
        job = store.get(job_id)
        assert (job.status, job.attempt, job.attempts) == ("failed", 2, 2)
        causes = store.attempt_causes(job_id)
    assert causes[1].cause == causes[2].cause == "ValueError at train.py:8"
    assert causes[1].failure_class == JOB
    capsys.readouterr()
    assert cli("job", str(job_id), "--db", db) == 0
    shown = capsys.readouterr().out
    assert (
        "why           not retried: the same cause (ValueError at train.py:8) as attempt 1" in shown
    )
    assert "ValueError at train.py:8" in shown


def test_no_retry_on_fails_at_once_and_retry_on_forces_a_retry(store: JobStore) -> None:
    """--no-retry-on nonzero_exit fails the job on its first failure; --retry-on keeps
    retrying a cause that repeats."""
    failure = Outcome("failed", 1, "nonzero_exit", "boom", "ValueError at t.py:1")
    refused = store.submit(argv=["x"], max_attempts=3, no_retry_on=["nonzero_exit"])
    forced = store.submit(argv=["x"], max_attempts=3, retry_on=["nonzero_exit"])
    for job_id in (refused, forced):
        job = store.claim("w", "h", RUNS)
        assert job is not None
        assert job.id == job_id
        assert store.finish(job_id, job.attempt, "w", failure)
    assert store.get(refused).status == "failed"
    assert "--no-retry-on nonzero_exit" in (store.attempts(refused)[0].note or "")
    again = store.claim("w", "h", RUNS)
    assert again is not None
    assert again.id == forced
    assert store.finish(forced, again.attempt, "w", failure)
    assert store.get(forced).status == "queued"
    assert "retrying (--retry-on nonzero_exit)" in (store.attempts(forced)[1].note or "")


def test_unknown_retry_reason_is_refused(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --retry-on name is a usage error, and nothing is queued."""
    assert cli("submit", "--db", db, "--retry-on", "stale", "--", "true") == 2
    assert "unknown reason 'stale'" in capsys.readouterr().err
    with open_store(db) as store:
        assert store.jobs() == []


def test_decisions_by_class() -> None:
    """Each class decides as documented: infrastructure not counted (until its limit), the
    run's counted and retried, the same job cause twice stops."""
    policy = RetryPolicy()

    def run(outcome: Outcome, **kw: object) -> tuple[str, int, bool]:
        args: dict[str, object] = {
            "attempts": 0,
            "max_attempts": 3,
            "cancel_requested": False,
            "infrastructure_failures": 0,
            "previous_causes": {},
            "policy": policy,
        }
        args.update(kw)
        d = decide(outcome, **args)  # type: ignore[arg-type]
        return d.status, d.attempts, d.counted

    orphan = Outcome("failed", None, "orphaned", "lost")
    assert run(orphan) == ("queued", 0, False)
    assert run(orphan, infrastructure_failures=MAX_INFRASTRUCTURE_RETRIES) == ("failed", 0, False)
    stall = Outcome("failed", -15, "stale_progress", "stalled")
    assert run(stall, attempts=1) == ("queued", 2, True)
    assert run(stall, attempts=2) == ("failed", 3, True)
    raised = Outcome("failed", 1, "nonzero_exit", "x", "ValueError at t.py:3")
    assert run(raised) == ("queued", 1, True)
    assert run(raised, attempts=1, previous_causes={"ValueError at t.py:3": 1}) == (
        "failed",
        2,
        True,
    )
    assert run(Outcome("interrupted", 4, None, None)) == ("queued", 0, False)
    assert [infrastructure_backoff(n, 10.0) for n in (1, 2, 3, 4)] == [0.0, 10.0, 20.0, 40.0]


def test_a_progress_dir_that_never_existed_is_the_jobs_failure_like_a_bad_input() -> None:
    """no_progress (a typo'd --progress-dir) is classed as the job's, like invalid_job: the
    same cause twice is not retried."""
    for reason in ("no_progress", "invalid_job"):
        assert classify(Outcome("failed", 1, reason, "typo", reason)) == JOB


def test_causes_read_from_the_artifact() -> None:
    """The artifact names the cause: a GPU fault and a scheduler's stop are the
    infrastructure's, an OOM in CUDA the run's, a Python exception the job's."""
    from asyncsoak.queue._status import classify

    def outcome(**artifact: object) -> Outcome:
        base: dict[str, object] = {"status": "failed", "exit": {"returncode": 1, "pid": 9}}
        base.update(artifact)
        return outcome_from_artifact(base, cancel_requested=False, stopping=False, log_tail="")

    fault = outcome(
        failures=[
            {"reason": "nonzero_exit", "message": "exit 1"},
            {"reason": "gpu_fault", "message": "Xid 79", "gpu": {"index": 2, "uuid": "GPU-x"}},
        ]
    )
    assert (fault.cause, classify(fault)) == ("gpu_fault", INFRASTRUCTURE)
    oom = outcome(
        exit={
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "OutOfMemoryError", "message": "", "where": "t.py:9",
                          "kind": "cuda_oom"},
        }
    )  # fmt: skip
    assert classify(oom) == RUN
    raised = outcome(
        exit={
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "KeyError", "message": "", "where": "t.py:9", "kind": "python"},
        }
    )
    assert (raised.cause, classify(raised)) == ("KeyError at t.py:9", JOB)
    stopped = outcome(stop={"cause": "scheduler", "killed": False})
    assert (stopped.cause, classify(stopped)) == ("scheduler", INFRASTRUCTURE)
    usage = outcome_from_artifact(
        {"status": "failed", "exit": {"returncode": 2, "pid": 9}},
        cancel_requested=False,
        stopping=False,
        log_tail="usage: train.py [-h] --lr LR\ntrain.py: error: the following arguments...",
    )
    assert (usage.cause, classify(usage)) == ("usage_error", JOB)
    artifact = {"failures": fault_failures()}
    assert faulted_gpus(artifact, ["1", "2", "3"]) == ["2"]
    assert faulted_gpus({"failures": [{"reason": "gpu_fault"}]}, ["1", "2"]) == ["1", "2"]
    health = {
        "failures": [{"reason": "gpu_fault"}],
        "gpu_health": {
            "gpu1": {"index": 1, "uuid": "GPU-a", "faults": [{"fails": True, "used": True}]},
            "gpu3": {"index": 3, "uuid": "GPU-b", "faults": [{"fails": True, "used": False}]},
        },
    }
    assert faulted_gpus(health, ["GPU-a", "GPU-b"]) == ["GPU-a"]


def test_out_of_memory_or_a_stop_twice_at_the_same_line_keeps_its_attempts() -> None:
    """An OOM-killed run (a DataLoader worker the OOM killer took raises the same
    RuntimeError at the same line each time), a MemoryError, a trainer dying of a stop
    the worker asked for, or a wrapper's CalledProcessError is the run's: retried while
    --max-attempts allows, never stopped by the same-cause rule."""
    killed_loader = {
        "status": "failed",
        "failures": [{"reason": "nonzero_exit", "message": "exit 1"}],
        "exit": {
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "RuntimeError", "message": "DataLoader worker (pid 12) is "
                          "killed by signal: Killed.", "where": "signal_handling.py:66",
                          "kind": "python"},
        },
        "oom_kills": [{"pid": 12, "name": "pt_data_worker", "message": "Killed process 12"}],
    }  # fmt: skip
    memory_error = {
        "status": "failed",
        "exit": {
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "MemoryError", "message": "", "where": "load.py:8",
                          "kind": "python"},
        },
    }  # fmt: skip
    no_traceback = {"status": "failed", "exit": {"returncode": -9, "pid": 9},
                    "oom_kills": killed_loader["oom_kills"]}  # fmt: skip
    # A worker's Ctrl-C, twice: the trainer dies of the stop with the same traceback.
    interrupted = {
        "status": "failed",
        "stop": {"cause": "requested", "killed": False},
        "exit": {
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "KeyboardInterrupt", "message": "", "where": "train.py:40",
                          "kind": "python"},
        },
    }  # fmt: skip
    # A wrapper script's check_call: whatever its command died of, the same line.
    wrapped = {
        "status": "failed",
        "exit": {
            "returncode": 1,
            "pid": 9,
            "exception": {"type": "subprocess.CalledProcessError", "message": "",
                          "where": "subprocess.py:413", "kind": "python"},
        },
    }  # fmt: skip
    for artifact in (killed_loader, memory_error, no_traceback, interrupted, wrapped):
        first, second = (
            outcome_from_artifact(artifact, cancel_requested=False, stopping=False, log_tail="")
            for _ in range(2)
        )
        previous: dict[str, int] = {}
        judged = {"max_attempts": 3, "cancel_requested": False, "infrastructure_failures": 0}
        one = decide(first, attempts=0, previous_causes=previous, policy=RetryPolicy(), **judged)  # type: ignore[arg-type]
        if one.failure_class == JOB and one.cause is not None:
            previous[one.cause] = 1
        two = decide(second, attempts=1, previous_causes=previous, policy=RetryPolicy(), **judged)  # type: ignore[arg-type]
        assert (one.failure_class, two.status, two.attempts) == (RUN, "queued", 2), artifact


def fault_failures() -> list[dict[str, object]]:
    return [{"reason": "gpu_fault", "message": "Xid 79", "gpu": {"index": 2, "uuid": "GPU-y"}}]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_after_runs_when_dependencies_succeeded_and_cancels_when_one_failed(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--after: a dependent waits for its jobs (even at a higher priority), runs once they
    succeeded, and is cancelled, with its dependents, when one failed (shown in ``jobs``)."""
    log = tmp_path / "ran.txt"
    append = (
        "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); sys.exit(int(sys.argv[3]))"
    )

    def job(name: str, status: int) -> list[str]:
        return [sys.executable, "-c", append, str(log), name, str(status)]

    with open_store(db) as store:
        first = store.submit(argv=job("first", 0), soak=FAST_SOAK)
        broken = store.submit(argv=job("broken", 1), soak=FAST_SOAK, max_attempts=1)
        then = store.submit(argv=job("then", 0), soak=FAST_SOAK, after=[first], priority=9)
        never = store.submit(argv=job("never", 0), soak=FAST_SOAK, after=[first, broken])
        nor = store.submit(argv=job("nor", 0), soak=FAST_SOAK, after=[never])
        claimed = store.claim("peek", "h", RUNS)
        assert claimed is not None
        assert claimed.id == first
        store.finish(first, claimed.attempt, "peek", Outcome("interrupted", 4, None, None))
        with anyio.fail_after(LIMIT_S):
            await run_worker(store, **worker_kwargs(tmp_path))
        statuses = {j.id: (j.status, j.reason) for j in store.jobs()}
    assert log.read_text().splitlines() == ["first", "then", "broken"]
    assert statuses[then] == ("succeeded", None)
    assert statuses[never] == statuses[nor] == ("cancelled", "dependency_failed")
    capsys.readouterr()
    assert cli("jobs", "--db", db) == 0
    listing = capsys.readouterr().out
    assert f"dependency_failed: job {broken} failed: this job ran --after it" in listing
    assert f"dependency_failed: job {never} cancelled" in listing
    assert cli("submit", "--db", db, "--after", str(broken), "--", "true") == 2
    assert f"job {broken} is failed" in capsys.readouterr().err
    assert cli("submit", "--db", db, "--after", "999", "--", "true") == 2
    assert "no job 999" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.asyncio
async def test_array_0_3_runs_one_job_per_index(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--array 0-3: four jobs, each with its index as %a in its command and as
    ASYNCSOAK_ARRAY_INDEX; one id lists them, and cancels a whole array."""
    out = tmp_path / "indices.txt"
    write = (
        "import os, sys; open(sys.argv[1], 'a')"
        ".write(sys.argv[2] + ' ' + os.environ['ASYNCSOAK_ARRAY_INDEX'] + '\\n')"
    )
    assert cli("submit", "--db", db, "--array", "0-3", "--sample-interval", "0.2",
               "--", sys.executable, "-c", write, str(out), "%a") == 0  # fmt: skip
    ids = [int(line) for line in capsys.readouterr().out.split()]
    assert len(ids) == 4
    assert cli("jobs", "--db", db, "--array", str(ids[0]), "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(j["id"], j["array_index"]) for j in listed] == list(zip(ids, range(4), strict=True))
    with open_store(db) as store, anyio.fail_after(LIMIT_S):
        assert await run_worker(store, **worker_kwargs(tmp_path)) == 4
    assert sorted(out.read_text().splitlines()) == ["0 0", "1 1", "2 2", "3 3"]
    assert cli("submit", "--db", db, "--array", "0-10:5", "--", "true") == 0
    second = [int(line) for line in capsys.readouterr().out.split()]
    assert len(second) == 3
    assert cli("cancel", "--db", db, "--array", str(second[0])) == 0
    with open_store(db) as store:
        assert {store.get(i).status for i in second} == {"cancelled"}
    assert cli("submit", "--db", db, "--array", "3-1", "--", "true") == 2
    assert "START <= END" in capsys.readouterr().err


def test_after_an_array_waits_for_every_job_of_it(store: JobStore) -> None:
    """--after an array's id (what submit prints first) waits for every job of the array,
    not only its first, and is cancelled when any of them fails."""
    array = store.submit(argv=["x", "%a"], array="0-2", max_attempts=1)
    members = store.array_members(array)
    dependent = store.submit(argv=["y"], after=[array], priority=9)
    assert store.plan(dependent).after == tuple(members)
    big = store.submit(argv=["x"], array="0-99")
    assert plan_note(store.plan(store.submit(argv=["y"], after=[big])), {}, 0.0) == (
        f"waits: after {','.join(str(big + i) for i in range(8))} and 92 more"
    )
    for expected, outcome in zip(
        members[:2],
        (Outcome("succeeded", 0, None, None), Outcome("failed", 1, "nonzero_exit", "exit 1")),
        strict=True,
    ):
        claimed = store.claim("w", "h", RUNS)
        assert claimed is not None
        assert claimed.id == expected
        store.finish(claimed.id, claimed.attempt, "w", outcome)
    ended = store.get(dependent)
    assert (ended.status, ended.reason) == ("cancelled", "dependency_failed")
    assert f"job {members[1]} failed" in (ended.error or "")
    with pytest.raises(ValidationError, match=f"job {members[1]} is failed"):
        store.submit(argv=["z"], after=[array])


def test_not_before_holds_a_job_until_its_time(db: str) -> None:
    """A job submitted --not-before a later time is not claimed before it; one whose time
    passed is."""
    with open_store(db) as store:
        now = store.now()
        later = store.submit(argv=["x"], not_before=now + 3600)
        due = store.submit(argv=["x"], not_before=now - 1)
        claimed = store.claim("w", "h", RUNS)
        assert claimed is not None
        assert claimed.id == due
        assert store.claim("w", "h", RUNS) is None
        assert store.get(later).status == "queued"


def test_not_before_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    """+DURATION counts from the queue's clock; a bad time is a usage error."""
    from asyncsoak.cli import UsageError
    from asyncsoak.cli._sweeps import parse_not_before

    assert parse_not_before("+30m", lambda: 1000.0) == 1000.0 + 1800
    assert parse_not_before("+2h", lambda: 0.0) == 7200
    with pytest.raises(UsageError, match="expected an ISO 8601 time"):
        parse_not_before("tomorrow", lambda: 0.0)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gpus_2_on_a_4_gpu_worker_run_side_by_side(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """On a worker owning GPUs 0-3 (the fake nvidia-smi presents four), two --gpus 2 jobs run
    at once, each with its own two GPUs; a third waits for a pair to free up; no GPU is ever
    shared."""
    fake = install_fake_nvidia_smi(tmp_path, "idle", gpus=4)
    go = tmp_path / "go"
    argv = write_script(tmp_path, "gpus.py", SAYS_GPUS)
    env = {"TEST_SIGNALS": str(ready.path)}
    ids = [store.submit(argv=[*argv, str(go)], env=env, soak=FAST_SOAK, gpus=2) for _ in range(3)]
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            kwargs = worker_kwargs(tmp_path, nvidia_smi=str(fake.path), gpus="0,1,2,3")
            tg.start_soon(lambda: run_worker(store, **kwargs))
            lines = [await ready.line(), await ready.line()]
            started = dict(line.split() for line in lines)
            assert set(started) == {str(ids[0]), str(ids[1])}
            pairs = [set(v.split(",")) for v in started.values()]
            assert all(len(p) == 2 for p in pairs)
            assert pairs[0].isdisjoint(pairs[1])
            assert store.get(ids[2]).status == "queued"
            go.touch()
            job, gpus = (await ready.line()).split()
            assert job == str(ids[2])
            assert len(gpus.split(",")) == 2
    assert [store.get(i).status for i in ids] == ["succeeded"] * 3
    assert {artifact_of(store, i, 1)["status"] for i in ids} == {"passed"}
    assert fake.invocations(), "the soaks sampled the four GPUs through the fake"
    assert sorted(store.worker_gpus().values()) == [["0", "1", "2", "3"]]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_faulted_gpu_is_not_claimed_until_cleared(
    tmp_path: Path, db: str, ready: ReadyFifo, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU with a fault stays out of service (``workers`` says so) until
    ``worker --clear-fault``: a worker owning GPUs 0,1 runs its jobs on GPU 1 only."""
    import socket

    go = tmp_path / "go"
    go.touch()
    argv = write_script(tmp_path, "gpus.py", SAYS_GPUS)
    host = socket.gethostname()
    with open_store(db) as store:
        store.record_gpu_fault(host, ["0"], worker="w", job_id=None, attempt=None, detail="Xid 79")
        job_id = store.submit(
            argv=[*argv, str(go)], env={"TEST_SIGNALS": str(ready.path)}, soak=FAST_SOAK
        )
        with anyio.fail_after(LIMIT_S):
            assert await run_worker(store, **worker_kwargs(tmp_path, gpus="0,1", name="w01")) == 1
        assert await ready.line() == f"{job_id} 1"
    capsys.readouterr()
    assert cli("workers", "--db", db) == 0
    assert "0,1 (0 faulted)" in capsys.readouterr().out
    assert cli("worker", "--db", db, "--clear-fault", "0") == 0
    assert "GPU 0 of" in capsys.readouterr().out
    with open_store(db) as store:
        assert store.gpu_faults() == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cleared_gpu_is_used_while_the_other_gpus_are_busy(
    tmp_path: Path, store: JobStore, ready: ReadyFifo
) -> None:
    """A GPU cleared while the worker's other GPUs are all busy takes a job at once, not only
    after a running job ends (which can be days of training)."""
    import socket

    host = socket.gethostname()
    go = tmp_path / "go"
    argv = write_script(tmp_path, "gpus.py", SAYS_GPUS)
    env = {"TEST_SIGNALS": str(ready.path)}
    store.record_gpu_fault(host, ["1"], worker="w", job_id=None, attempt=None, detail="Xid 79")
    first = store.submit(argv=[*argv, str(go)], env=env, soak=FAST_SOAK, gpus=1)
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(store, **worker_kwargs(tmp_path, gpus="0,1")))
            assert await ready.line() == f"{first} 0"
            second = store.submit(argv=[*argv, str(go)], env=env, soak=FAST_SOAK, gpus=1)
            store.clear_gpu_faults(host, ["1"])
            with anyio.fail_after(10):
                assert await ready.line() == f"{second} 1"
            assert store.get(first).status == "running"
            go.touch()
    assert [store.get(i).status for i in (first, second)] == ["succeeded"] * 2


def test_infrastructure_retry_prefers_another_gpu(store: JobStore) -> None:
    """A job whose worker died on GPU 0 is left a while for a worker with another GPU free,
    and gets the GPUs it did not fail on first."""
    from asyncsoak.queue._sweeps import GpuOffer, pick_gpus

    job_id = store.submit(argv=["x"], gpus=1)
    first = store.claim("w0", "h", RUNS, offer=GpuOffer(free=1, all_free=True, names=("h:0",)))
    assert first is not None
    store.record_attempt_gpus(job_id, first.attempt, ["0"])
    assert store.take_over(store.get(job_id), "sweeper")
    assert store.finish(job_id, first.attempt, "sweeper", Outcome("failed", None, "orphaned", "x"))
    assert store.plan(job_id).avoid == ("h:0",)
    same = GpuOffer(free=1, all_free=True, names=("h:0",))
    assert store.claim("w0", "h", RUNS, offer=same) is None
    other = GpuOffer(free=2, all_free=True, names=("h:0", "h:1"))
    second = store.claim("w01", "h", RUNS, offer=other)
    assert second is not None
    assert second.id == job_id
    assert pick_gpus(1, ["0", "1"], store.plan(job_id).avoid, "h") == ["1"]


def test_requeue_refused_while_a_dependency_failed(store: JobStore) -> None:
    """A job cancelled because its --after job failed cannot be requeued before that job:
    it would wait for ever."""
    from asyncsoak.queue import QueueError

    first = store.submit(argv=["x"], max_attempts=1)
    then = store.submit(argv=["x"], after=[first])
    job = store.claim("w", "h", RUNS)
    assert job is not None
    assert store.finish(first, job.attempt, "w", Outcome("failed", 1, "nonzero_exit", "x"))
    assert store.get(then).status == "cancelled"
    with pytest.raises(QueueError, match=f"requeue job {first} first"):
        store.requeue(then)
    assert store.get(then).status == "cancelled"
    store.requeue(first)
    assert store.requeue(then).status == "queued"


@pytest.mark.asyncio
async def test_gpu_fault_takes_the_named_gpu_out_and_does_not_count(
    tmp_path: Path, store: JobStore
) -> None:
    """An attempt that failed gpu_fault on GPU 2 (as the soak's failure names it) takes GPU 2
    of the host out of service, says so in the attempt's note, and is not counted."""
    import socket

    from asyncsoak.queue import WorkerConfig
    from asyncsoak.queue._worker import _Worker

    job_id = store.submit(argv=["x"], max_attempts=1, gpus=2)
    offer = GpuOffer(free=4, all_free=True, names=("h:0", "h:1", "h:2", "h:3"))
    job = store.claim("w", socket.gethostname(), RUNS, offer=offer)
    assert job is not None
    artifact = {
        "status": "failed",
        "exit": {"returncode": 1, "pid": 9},
        "failures": [
            {"reason": "nonzero_exit", "message": "exit 1"},
            {"reason": "gpu_fault", "message": "Xid 79 on GPU 2", "gpu": {"index": 2}},
        ],
    }
    worker = _Worker(
        store,
        WorkerConfig(runs_dir=tmp_path / "runs", cmd=["x"], gpus="0,1,2,3"),
        anyio.Event(),
        anyio.Event(),
        "w",
    )
    note = await worker._take_out_faulted(job, artifact, ["2", "3"])
    assert note is not None
    assert "--clear-fault 2" in note
    assert [(f.gpu, f.job_id) for f in store.gpu_faults()] == [("2", job_id)]
    outcome = outcome_from_artifact(artifact, cancel_requested=False, stopping=False, log_tail="")
    assert store.finish(job_id, job.attempt, "w", outcome, note=note)
    job = store.get(job_id)
    assert (job.status, job.attempts) == ("queued", 0)
    assert "not counted" in (store.attempts(job_id)[0].note or "")
    offer_now = await worker._offer()
    assert offer_now is not None
    assert offer_now.free == 3
