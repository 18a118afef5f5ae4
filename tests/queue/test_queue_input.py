"""Bad input to the queue, refused at the door: at submit time with ``run_soak``'s own rules,
bad flags and damaged databases with exit status 2 and nothing changed."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import ValidationError
from asyncsoak.queue import JobStore, SqliteStore, WorkerConfig, run_worker

from ..conftest import asyncsoak_cli
from .helpers import FAST_SOAK, JOB_ENV

LIMIT_S = 60.0


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: Submissions ``asyncsoak run`` refuses; ``submit`` used to queue them, to fail hours later.
REFUSED_SUBMISSIONS = [
    pytest.param(["--max-duration", "0"], ["true"], "--max-duration", id="max-duration-0"),
    pytest.param(["--sample-interval", "nan"], ["true"], "finite", id="sample-interval-nan"),
    pytest.param(["--progress-dir", "{file}"], ["true"], "not a directory", id="progress-dir-file"),
    pytest.param([], [""], r"command\[0\]", id="empty-program"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("options", "command", "message"), REFUSED_SUBMISSIONS)
def test_submit_refuses_what_run_refuses(
    tmp_path: Path, options: list[str], command: list[str], message: str
) -> None:
    """`submit` refuses what `run` refuses, with the same message; nothing is created."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    options = [o.replace("{file}", str(a_file)) for o in options]
    db = tmp_path / "queue.db"
    submitted = asyncsoak_cli("submit", "--db", str(db), *options, "--", *command, cwd=tmp_path)
    assert submitted.returncode == 2, submitted.stderr
    assert "Traceback" not in submitted.stderr
    assert not db.exists()
    run_options = ["--progress-dir", str(tmp_path / "p"), *options]
    ran = asyncsoak_cli(
        "run", "--output", str(tmp_path / "o.json"), *run_options, "--", *command, cwd=tmp_path
    )
    assert ran.returncode == 2, ran.stderr
    assert submitted.stderr.splitlines()[-1] == ran.stderr.splitlines()[-1]
    assert re.search(message, submitted.stderr)


@pytest.mark.parametrize(
    "change",
    [
        {"soak": {"max_duration_seconds": 0}},
        {"soak": {"stale_progress_seconds": float("nan")}},
        {"argv": [""]},
        {"progress_dir": "{file}"},
        {"cwd": "{file}"},
        {"priority": 10**23},
    ],
)
def test_store_submit_refuses_what_run_soak_refuses(
    store: JobStore, tmp_path: Path, change: dict[str, Any]
) -> None:
    """JobStore.submit raises ValidationError (a ValueError) for any input run_soak refuses."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    kwargs: dict[str, Any] = {"argv": ["true"]}
    kwargs.update({k: str(a_file) if v == "{file}" else v for k, v in change.items()})
    with pytest.raises(ValidationError):
        store.submit(**kwargs)
    assert store.jobs() == []


def test_store_submit_refuses_a_misspelled_keyword(store: JobStore) -> None:
    """A keyword JobStore.submit does not take is a TypeError, as for any Python function: a
    typo'd ``max_attempt`` never queues a job with the default attempts."""
    with pytest.raises(TypeError, match="'max_attempt'"):
        store.submit(argv=["true"], max_attempt=5)  # type: ignore[call-arg]
    assert store.jobs() == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag", ["--poll=nan", "--cancel-grace=nan", "--stale-after=-1", "--stop-timeout=inf"]
)
def test_worker_bad_period_is_refused_before_a_job_is_claimed(tmp_path: Path, flag: str) -> None:
    """A NaN/negative/infinite worker period: exit status 2 and the job is still queued."""
    db = tmp_path / "queue.db"
    with SqliteStore(db) as store:
        job_id = store.submit(argv=[sys.executable, "-c", "pass"], env=JOB_ENV, soak=FAST_SOAK)
    worker = asyncsoak_cli(
        "worker", "--db", str(db), "--once", "--no-gpu", flag, cwd=tmp_path, timeout=LIMIT_S
    )
    assert worker.returncode == 2, worker.stderr
    assert "Traceback" not in worker.stderr
    assert flag.split("=")[0] in worker.stderr
    with SqliteStore(db) as store:
        assert store.get(job_id).status == "queued"
        assert store.get(job_id).attempt == 0


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--priority", "1e23", "--", "true"],
        ["submit", "--priority", str(10**23), "--", "true"],
        ["job", str(10**23)],
        ["cancel", str(10**23)],
        ["requeue", "99999999999999999999999"],
        ["logs", "99999999999999999999999"],
    ],
)
def test_out_of_range_numbers_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    """Numbers SQLite cannot hold: a one-line error, exit status 2, no traceback."""
    db = tmp_path / "queue.db"
    with SqliteStore(db) as store:
        store.submit(argv=["true"])
    before = digest(db)
    result = asyncsoak_cli(args[0], "--db", str(db), *args[1:], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert digest(db) == before


def corrupt_interior_pages(db: Path) -> int:
    """Overwrite every interior b-tree page of the jobs table; returns how many."""
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    damaged = 0
    for start in range(page_size, len(data), page_size):  # page 1 holds the header
        if data[start] == 0x05:  # an interior table b-tree page
            data[start + 12 : start + page_size] = b"\xa5" * (page_size - 12)
            damaged += 1
    db.write_bytes(bytes(data))
    return damaged


@pytest.fixture
def corrupt_db(tmp_path: Path) -> Path:
    db = tmp_path / "queue.db"
    with SqliteStore(db) as store:
        for i in range(400):
            store.submit(argv=["echo", "x" * 200, str(i)], name=f"job-{i}")
    with sqlite3.connect(db) as conn:  # the WAL back into the file before it is damaged
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert corrupt_interior_pages(db) >= 1
    return db


QUEUE_COMMANDS = [
    ["jobs"],
    ["job", "1"],
    ["workers"],
    ["cancel", "3"],
    ["submit", "--", "true"],
    ["worker", "--once", "--no-gpu", "--poll", "0.1"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", QUEUE_COMMANDS, ids=lambda a: a[0])
def test_corrupt_database_is_refused_and_left_as_it_is(corrupt_db: Path, args: list[str]) -> None:
    """Corrupt interior pages: every command says so (exit status 2) and writes nothing."""
    before = digest(corrupt_db)
    result = asyncsoak_cli(
        args[0], "--db", str(corrupt_db), *args[1:], cwd=corrupt_db.parent, timeout=LIMIT_S
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "corrupt" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert digest(corrupt_db) == before


@pytest.mark.slow
@pytest.mark.parametrize("args", QUEUE_COMMANDS, ids=lambda a: a[0])
def test_zero_byte_database_is_refused_not_given_a_schema(tmp_path: Path, args: list[str]) -> None:
    """An empty file at --db is not a queue: exit status 2, and it stays empty."""
    db = tmp_path / "queue.db"
    db.touch()
    result = asyncsoak_cli(args[0], "--db", str(db), *args[1:], cwd=tmp_path, timeout=LIMIT_S)
    assert result.returncode == 2, result.stderr
    assert "empty" in result.stderr
    assert db.stat().st_size == 0


@pytest.mark.slow
def test_a_new_database_is_never_seen_half_made(tmp_path: Path) -> None:
    """Creating the queue leaves no empty file behind for the zero-byte refusal to trip on,
    even with several processes creating it at once."""
    db = tmp_path / "queue.db"
    results = [
        asyncsoak_cli("submit", "--db", str(db), "--", "true", str(i), cwd=tmp_path)
        for i in range(3)
    ]
    assert [r.returncode for r in results] == [0, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".new")) == []
    with SqliteStore(db) as store:
        assert len(store.jobs()) == 3


@pytest.mark.slow
@pytest.mark.asyncio
async def test_internal_value_error_is_a_monitor_error_not_invalid_job(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError from a bug inside the monitor is `monitor_error`, not `invalid_job`."""
    import asyncsoak._sampling

    async def broken_sampler(*args: Any, **kwargs: Any) -> None:
        raise ValueError("an internal bug of the monitor")

    monkeypatch.setattr(asyncsoak._sampling, "run_proc_sampler", broken_sampler)
    job_id = store.submit(
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        env=JOB_ENV,
        soak=FAST_SOAK,
        max_attempts=1,
    )
    with anyio.fail_after(LIMIT_S):
        await run_worker(store, quick_config(tmp_path / "runs"), once=True)
    job = store.get(job_id)
    assert (job.status, job.reason) == ("failed", "monitor_error")
    assert "an internal bug" in (job.error or "")


@pytest.mark.asyncio
async def test_a_setting_the_worker_does_not_know_fails_the_attempt_invalid_job(
    tmp_path: Path,
) -> None:
    """A job row carrying a setting this worker does not know (a newer asyncsoak submitted
    it, on a mixed fleet): the attempt fails `invalid_job` naming the setting, no traceback,
    and nothing is started."""
    marker = tmp_path / "started"
    with SqliteStore(tmp_path / "queue.db") as store:
        job_id = store.submit(
            argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            soak=FAST_SOAK,
            max_attempts=1,
        )
    with sqlite3.connect(tmp_path / "queue.db") as conn:
        soak = json.dumps({**FAST_SOAK, "expect_every_v9": {"checkpoint-*": 60}})
        conn.execute("UPDATE jobs SET soak = ? WHERE id = ?", (soak, job_id))
    with SqliteStore(tmp_path / "queue.db") as store:
        with anyio.fail_after(LIMIT_S):
            await run_worker(store, quick_config(tmp_path / "runs"), once=True)
        job = store.get(job_id)
    assert (job.status, job.reason) == ("failed", "invalid_job")
    assert "'expect_every_v9'" in (job.error or "")
    assert "Traceback" not in (job.error or "")
    assert not marker.exists()


#: Attempt 1 fails at once; attempt 2 saves a checkpoint in the run dir, then stalls.
STALLING_TRAINER = """
import os, pathlib, sys, time
from asyncsoak import trainer
if trainer.attempt() == 1:
    sys.exit(3)
(pathlib.Path(os.environ["ASYNCSOAK_RUN_DIR"]) / "ckpt").write_text("saved")
time.sleep(60)
"""
#: Another monitor's writes into attempt 1's directory (a report refreshed, a journal grown),
#: from the moment attempt 1 has ended until it is killed.
OTHER_MONITOR = """
import pathlib, sys, time
attempt = pathlib.Path(sys.argv[1])
while not (attempt / "soak.json").exists():
    time.sleep(0.05)
while True:
    (attempt / "soak.html").write_text(str(time.time()))
    with open(attempt / "soak.jsonl", "a") as f:
        f.write('{"kind": "sample"}\\n')
    time.sleep(0.1)
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_other_attempts_files_are_not_progress(store: JobStore, tmp_path: Path) -> None:
    """Writes below the run dir's attempts/ (another attempt's report and journal) never count:
    attempt 2 stalls and is caught at stale_progress_seconds."""
    script = tmp_path / "train.py"
    script.write_text(STALLING_TRAINER)
    soak = {**FAST_SOAK, "stale_progress_seconds": 2.0, "max_duration_seconds": 20.0}
    job_id = store.submit(
        argv=[sys.executable, str(script)], env=JOB_ENV, soak=soak, max_attempts=2
    )
    runs = tmp_path / "runs"
    attempt_1 = runs / str(job_id) / "attempts" / "1"
    attempt_1.mkdir(parents=True)
    other = await anyio.open_process([sys.executable, "-c", OTHER_MONITOR, str(attempt_1)])
    try:
        with anyio.fail_after(LIMIT_S):
            await run_worker(store, quick_config(runs), once=True)
    finally:
        other.kill()
        await other.wait()
    attempt_2 = runs / str(job_id) / "attempts" / "2"
    artifact = json.loads((attempt_2 / "soak.json").read_text())
    assert artifact["failures"][0]["reason"] == "stale_progress"
    journal = [json.loads(line) for line in (attempt_2 / "soak.jsonl").read_text().splitlines()]
    progress = [e for e in journal if e["kind"] == "progress"]
    assert [p for e in progress for p in e["paths"] if p.startswith("attempts/")] == []
    assert artifact["progress"]["changes"] <= 2


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[1A\r"


@pytest.mark.slow
def test_escape_sequences_in_job_fields_are_spelled_out(tmp_path: Path) -> None:
    """A job name (and command) holding terminal escape sequences: jobs, job and workers print
    them spelled out (\\x1b), never raw; --json keeps them JSON-escaped."""
    db = tmp_path / "queue.db"
    with SqliteStore(db) as store:
        job_id = store.submit(argv=["echo", f"x{ESCAPES}"], name=f"evil{ESCAPES}")
        store.submit(argv=["echo", f"y{ESCAPES}"])
    for args in (["jobs"], ["job", str(job_id)], ["job", "2"], ["jobs", "--json"]):
        result = asyncsoak_cli(args[0], "--db", str(db), *args[1:], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", result.stdout), args
    shown = asyncsoak_cli("job", "--db", str(db), str(job_id), cwd=tmp_path).stdout
    assert "evil\\x1b]0;pwned\\x07" in shown


@pytest.mark.slow
@pytest.mark.asyncio
async def test_full_runs_filesystem_is_the_workers_problem_not_an_invalid_job(
    tmp_path: Path,
) -> None:
    """The worker's runs directory on a full filesystem: the attempt is `monitor_error` (the
    worker's environment), never `invalid_job` (the job's input)."""
    from ..test_faults import tmpfs
    from ..test_input import fill_up

    with SqliteStore(tmp_path / "queue.db") as store, tmpfs(tmp_path / "runs", "64k") as runs:
        fill_up(runs)
        job_id = store.submit(argv=[sys.executable, "-c", "pass"], soak=FAST_SOAK, max_attempts=1)
        with anyio.fail_after(LIMIT_S):
            await run_worker(store, quick_config(runs), once=True)
        job = store.get(job_id)
    assert (job.status, job.reason) == ("failed", "monitor_error")
    assert "is full" in (job.error or "")


def quick_config(runs: Path) -> WorkerConfig:
    return WorkerConfig(poll_seconds=0.1, runs_dir=runs, nvidia_smi=None)


def test_worker_settings_are_spelled_once() -> None:
    """The worker functions take a WorkerConfig and the per-call arguments only (no keyword
    repeats a setting), and WorkerConfig refuses a bad setting naming its field."""
    import dataclasses
    import inspect

    from asyncsoak.queue import run_job

    fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    # What a call says besides the settings: where, which job, when to stop, who, metrics.
    per_call = {"store", "job", "config", "once", "stop_event", "kill_event", "name", "metrics"}
    for function in (run_worker, run_job):
        parameters = set(inspect.signature(function).parameters)
        assert "config" in parameters
        assert parameters <= per_call, (function.__name__, parameters - per_call)
        assert not parameters & fields
    with pytest.raises(ValidationError, match="kill_wait_seconds must be positive"):
        WorkerConfig(kill_wait_seconds=0)
    with pytest.raises(ValidationError, match="finish_retries must be zero or more"):
        WorkerConfig(finish_retries=-1)
    with pytest.raises(TypeError, match="stale_afterr"):
        WorkerConfig(stale_afterr=1.0)  # type: ignore[call-arg]


@pytest.mark.asyncio
async def test_worker_settings_are_refused_beside_the_config(
    tmp_path: Path, store: JobStore
) -> None:
    """``run_worker(store, config)`` and ``run_job(store, job, config)`` refuse a setting
    given as a keyword, before anything runs."""
    from asyncsoak.queue import run_job

    config = WorkerConfig(runs_dir=tmp_path / "runs", nvidia_smi=None)
    with pytest.raises(TypeError, match="poll"):
        await run_worker(store, config, poll=0.1)  # type: ignore[call-arg]
    store.submit(argv=["true"])
    job = store.claim("w", "h", tmp_path / "runs")
    assert job is not None
    with pytest.raises(TypeError, match="positional"):
        await run_job(store, job, config, 0.1)  # type: ignore[arg-type,call-arg]
    assert not (tmp_path / "runs").exists()


def worker_parser() -> argparse.ArgumentParser:
    from asyncsoak.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices["worker"]
    return found


#: A value of each kind of worker flag, and the setting it gives.
FLAG_VALUES: dict[str, tuple[str, Any]] = {
    "seconds": ("3.5", 3.5),
    "count": ("3", 3),
    "path": ("some/runs", Path("some/runs").absolute()),
    "command": ("python my train.py", ["python", "my", "train.py"]),
    "text": ("0,1", "0,1"),
}


def test_every_worker_setting_is_a_flag_with_its_default() -> None:
    """Each WorkerConfig field is an ``asyncsoak worker`` flag (but the SLURM allocation's end,
    read from the job) that sets it; no flag gives WorkerConfig's defaults; and the flags of
    the reference keep their spelling and default."""
    import dataclasses

    from asyncsoak.cli._queue import worker_config
    from asyncsoak.queue import WorkerConfig

    parser = worker_parser()
    assert worker_config(parser.parse_args([])) == WorkerConfig()
    unflagged = []
    for spec in dataclasses.fields(WorkerConfig):
        flag = spec.metadata["flag"]
        if flag is None:
            unflagged.append(spec.name)
            continue
        text, expected = FLAG_VALUES[spec.metadata["kind"]]
        assert getattr(worker_config(parser.parse_args([flag, text])), spec.name) == expected
    assert unflagged == ["until"]
    assert worker_config(parser.parse_args(["--no-gpu"])).nvidia_smi is None

    defaults = {
        option: action.default for action in parser._actions for option in action.option_strings
    }
    reference = {
        "--poll": 5.0,
        "--stale-after": 60.0,
        "--cancel-grace": 60.0,
        "--stop-timeout": 60.0,
        "--retry-backoff": 10.0,
        "--nvidia-smi": "nvidia-smi",
        "--runs-dir": None,
        "--train-cmd": None,
        "--gpus": None,
        "--no-gpu": False,
        "--once": False,
        "--name": None,
    }
    assert {flag: defaults[flag] for flag in reference} == reference


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--poll", "0", "--poll must be positive"),
        ("--kill-wait", "0", "--kill-wait must be positive"),
        ("--stale-after", "nan", "--stale-after must be a finite number"),
        ("--retry-backoff", "-1", "--retry-backoff must be zero or more"),
        ("--finish-retries", "-1", "--finish-retries must be zero or more"),
        ("--train-cmd", "", "--train-cmd is empty"),
    ],
)
def test_a_bad_worker_flag_is_refused_by_its_name(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    """A bad worker setting exits 2 naming its flag, before the queue is opened."""
    db = tmp_path / "q.db"
    done = asyncsoak_cli("worker", "--db", str(db), "--once", f"{flag}={value}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not db.exists()


#: Numbers past their documented bound: (command, its flags, the flag the error names).
HUGE_NUMBERS = [
    ("run", ["--metrics-linger", "1e308"], "--metrics-linger"),
    ("run", ["--sample-interval", "1e308"], "--sample-interval"),
    ("run", ["--grace", "-1"], "--grace"),
    ("submit", ["--stale-progress", "1e308"], "--stale-progress"),
    ("submit", ["--array", f"0-{10**20}"], "--array"),
    ("submit", ["--array", f"{10**20}-{10**20}"], "--array"),
    ("submit", ["--after", str(10**20)], "--after"),
    ("submit", ["--gpus", str(10**20)], "--gpus"),
    ("submit", ["--gpus", "100000"], "--gpus"),
    ("submit", ["--not-before", f"+{10**23}d"], "--not-before"),
    ("submit", ["--max-attempts", str(10**15)], "--max-attempts"),
    ("worker", ["--gpus", str(10**20)], "--gpus"),
    ("worker", ["--finish-retries", str(10**15)], "--finish-retries"),
    ("worker", ["--wait-for-db", "1e308"], "--wait-for-db"),
]


@pytest.mark.parametrize(("command", "flags", "flag"), HUGE_NUMBERS)
def test_a_number_past_its_bound_is_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flags: list[str], flag: str
) -> None:
    """``--metrics-linger 1e308``, ``--gpus 10**20``...: exit status 2, the last line of the
    error naming the flag as typed, no traceback, nothing written (no queue, no artifact)."""
    from asyncsoak.cli import main

    db = tmp_path / "q.db"
    argv = {
        "run": ["run", "--progress-dir", str(tmp_path / "p"), "--output", str(tmp_path / "o.json"),
                "--quiet", "--no-gpu", *flags, "--", "true"],
        "submit": ["submit", "--db", str(db), *flags, "--", "true"],
        "worker": ["worker", "--db", str(db), "--once", "--no-gpu", *flags],
    }[command]  # fmt: skip
    status: int | str | None
    try:
        status = main(argv)
    except SystemExit as exc:  # refused by argparse
        status = exc.code
    assert status == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert "error" in error, error
    assert flag in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_logs_spell_out_escape_sequences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A train.log holding terminal escapes: `logs` prints them spelled out (\\x1b), as every
    other view does, never raw; the lines stay lines."""
    from asyncsoak.cli import main

    db = tmp_path / "q.db"
    with SqliteStore(db) as store:
        job_id = store.submit(argv=["true"])
        assert store.claim("w", "host", tmp_path / "runs") is not None
        attempt = store.attempts(job_id)[-1]
    attempt.directory.mkdir(parents=True, exist_ok=True)
    (attempt.directory / "train.log").write_text(f"step 1 {ESCAPES}\nstep 2\n")
    assert main(["logs", "--db", str(db), str(job_id)]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), out
    assert out == "step 1 \\x1b]0;pwned\\x07\\x1b[2J\\x1b[1A\\x0d\nstep 2\n"


@pytest.mark.parametrize(("reason", "blamed"), [("stale_progress", False), ("signaled", True)])
def test_a_kill_the_monitor_sent_is_never_blamed_on_the_oom_killer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reason: str, blamed: bool
) -> None:
    """A job the soak stopped for a stall, whose trainer ignored SIGTERM and died of the
    monitor's SIGKILL: `jobs` and `job` say the monitor sent it, never "often the kernel's
    out-of-memory killer"; a SIGKILL the monitor did not send (``signaled``) keeps the hint."""
    from asyncsoak.cli import main
    from asyncsoak.queue import Outcome

    db = tmp_path / "q.db"
    with SqliteStore(db) as store:
        job_id = store.submit(argv=["true"], max_attempts=1)
        job = store.claim("w", "host", tmp_path / "runs")
        assert job is not None
        assert store.finish(job_id, job.attempt, "w", Outcome("failed", -9, reason, "x"))
    for view in (["jobs"], ["job", str(job_id)]):
        assert main([view[0], "--db", str(db), *view[1:]]) == 0
        out = capsys.readouterr().out
        assert ("out-of-memory" in out) == blamed, out
        assert "killed by SIGKILL" in out
