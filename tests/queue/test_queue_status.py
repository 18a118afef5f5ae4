"""final_status's table, its combination with the soak's verdict, and the error text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncsoak.queue import describe_exit, final_status, tail, with_soak_verdict
from asyncsoak.queue._status import TAIL_BYTES, outcome_from_artifact


@pytest.mark.parametrize(
    ("rc", "cancel_requested", "stopping", "killed", "expected"),
    [
        # 0 | any | any | any -> succeeded
        (0, False, False, False, "succeeded"),
        (0, True, True, True, "succeeded"),
        # != 0 or None | true | any | any -> cancelled
        (1, True, False, False, "cancelled"),
        (-9, True, True, True, "cancelled"),
        (None, True, False, False, "cancelled"),
        (4, True, False, False, "cancelled"),
        # 4 | false | any | false -> interrupted (saved)
        (4, False, False, False, "interrupted"),
        (4, False, True, False, "interrupted"),
        # any != 0 | false | true | true -> interrupted (killed before saving)
        (-9, False, True, True, "interrupted"),
        (4, False, True, True, "interrupted"),
        # None | false | false | any -> failed (outcome lost)
        (None, False, False, False, "failed"),
        (None, False, False, True, "failed"),
        # other | false | false | any -> failed
        (1, False, False, False, "failed"),
        (-9, False, False, True, "failed"),
        (4, False, False, True, "failed"),
    ],
)
def test_final_status_table(
    rc: int | None, cancel_requested: bool, stopping: bool, killed: bool, expected: str
) -> None:
    """Each row of the table in DESIGN.md's "Final status" gives its status."""
    assert final_status(rc, cancel_requested, stopping, killed) == expected


@pytest.mark.parametrize(
    ("status", "soak_failed", "expected"),
    [
        ("succeeded", True, "failed"),
        ("failed", True, "failed"),
        ("cancelled", True, "cancelled"),
        ("interrupted", True, "interrupted"),
        ("succeeded", False, "succeeded"),
    ],
)
def test_soak_verdict_combination(status: str, soak_failed: bool, expected: str) -> None:
    """A soak failure turns succeeded/failed into failed, never cancelled/interrupted."""
    assert with_soak_verdict(status, soak_failed) == expected


def _artifact(rc: int | None, status: str, cause: str, killed: bool = False, **extra: Any) -> Any:
    failures = extra.get("failures", [])
    return {
        "status": status,
        "exit": {"returncode": rc, "pid": 4242},
        "stop": {"cause": cause, "killed": killed},
        "failures": failures,
    }


def test_stale_soak_of_saving_trainer_fails_not_requeues() -> None:
    """A trainer that exits 4 when the monitor stops its stale run is failed, not interrupted."""
    stale = [{"reason": "stale_progress", "message": "no change for 120s", "at": 300.0}]
    outcome = outcome_from_artifact(
        _artifact(4, "failed", "failure", failures=stale),
        cancel_requested=False,
        stopping=False,
        log_tail="step 40\nstep 41",
    )
    assert (outcome.status, outcome.reason) == ("failed", "stale_progress")
    assert outcome.error is not None
    assert "stale_progress: no change for 120s" in outcome.error
    assert "step 41" in outcome.error


def test_soak_failure_overrides_clean_exit() -> None:
    """A clean exit with leftover processes is failed with the soak's primary reason."""
    leftovers = [{"reason": "leftover_processes", "message": "2 processes", "at": 5.0}]
    outcome = outcome_from_artifact(
        _artifact(0, "failed", "exited", failures=leftovers),
        cancel_requested=False,
        stopping=False,
        log_tail="",
    )
    assert outcome.status == "failed"
    assert (outcome.reason, outcome.returncode) == ("leftover_processes", 0)


def test_max_duration_reached_succeeds() -> None:
    """A job stopped by its max duration takes the soak's passing verdict."""
    outcome = outcome_from_artifact(
        _artifact(4, "passed", "max_duration"), cancel_requested=False, stopping=False, log_tail=""
    )
    assert outcome.status == "succeeded"


def test_killed_before_saving_is_noted() -> None:
    """A worker stop that had to kill the trainer is interrupted, with the reason noted."""
    outcome = outcome_from_artifact(
        _artifact(-9, "cancelled", "requested", killed=True),
        cancel_requested=False,
        stopping=True,
        log_tail="",
    )
    assert (outcome.status, outcome.reason) == ("interrupted", "killed_before_saving")


@pytest.mark.parametrize(
    ("rc", "words"),
    [
        (-9, "killed by SIGKILL (signal 9; often the kernel's out-of-memory killer)"),
        (-15, "killed by SIGTERM (signal 15)"),
        (137, "probably SIGKILL through a shell"),
        (4, "EXIT_INTERRUPTED"),
        (3, "exit status 3"),
        (None, "exit status unknown"),
    ],
)
def test_describe_exit(rc: int | None, words: str) -> None:
    """Exit statuses are decoded into words."""
    assert words in describe_exit(rc)


def test_a_failed_jobs_error_says_who_sent_the_signal() -> None:
    """A SIGKILL nobody on the monitor's side sent reads as the OOM killer's; one the stop
    sequence (or the worker) sent reads as the monitor's."""
    signaled = [{"reason": "signaled", "message": "the command was killed by SIGKILL"}]
    oom = _artifact(-9, "failed", "exited", failures=signaled)
    oom["stop"]["signals"] = []
    error = outcome_from_artifact(oom, cancel_requested=False, stopping=False, log_tail="").error
    assert error is not None
    assert "killed by SIGKILL (signal 9, not sent by the monitor; often the kernel's" in error
    stale = [{"reason": "stale_progress", "message": "no change for 120s"}]
    killed = _artifact(-9, "failed", "failure", killed=True, failures=stale)
    killed["stop"]["signals"] = [{"signal": "SIGTERM"}, {"signal": "SIGKILL"}]
    error = outcome_from_artifact(killed, cancel_requested=False, stopping=False, log_tail="").error
    assert error is not None
    assert "killed by SIGKILL (signal 9, sent by the monitor)" in error


def test_tail_reads_last_lines_of_a_big_file(tmp_path: Path) -> None:
    """tail returns whole last lines from the file's last TAIL_BYTES, and "" when absent."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"line {i} " + "x" * 50 + "\n" for i in range(5000)))
    assert log.stat().st_size > TAIL_BYTES
    lines = tail(log, 3).splitlines()
    assert [line.split()[1] for line in lines] == ["4997", "4998", "4999"]
    assert tail(tmp_path / "missing.log") == ""


def test_stop_before_start_is_not_a_failure() -> None:
    """A worker stop that lands before the command started requeues without counting."""
    never_started = {"status": "cancelled", "exit": {"returncode": None, "pid": None}}
    outcome = outcome_from_artifact(
        never_started, cancel_requested=False, stopping=True, log_tail=""
    )
    assert (outcome.status, outcome.reason) == ("interrupted", "stopped_before_start")


def test_public_names_resolve() -> None:
    """Every name in asyncsoak.queue.__all__ and asyncsoak.trainer.__all__ exists."""
    import asyncsoak.queue
    import asyncsoak.trainer

    for module in (asyncsoak.queue, asyncsoak.trainer):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_job_statuses_are_the_stored_strings() -> None:
    """JobStatus's values are the strings the databases hold and ``jobs --json`` prints, and
    each member is its string."""
    import json

    from asyncsoak.queue import JobStatus
    from asyncsoak.queue._models import JOB_STATUSES, TERMINAL_STATUSES

    assert [s.value for s in JobStatus] == [
        "queued", "running", "succeeded", "failed", "cancelled", "interrupted"
    ]  # fmt: skip
    assert JobStatus("failed") is JobStatus.FAILED
    assert final_status(1, False, False, False) == JobStatus.FAILED
    assert f"{JobStatus.SUCCEEDED}" == str(JobStatus.SUCCEEDED) == "succeeded"
    assert json.dumps([JobStatus.CANCELLED]) == '["cancelled"]'
    assert JOB_STATUSES == ("queued", "running", "succeeded", "failed", "cancelled")
    assert TERMINAL_STATUSES == ("succeeded", "failed", "cancelled")


def test_the_worker_defaults_are_importable_off_all() -> None:
    """The worker's reference constants resolve from asyncsoak.queue with their values, are
    WorkerConfig's defaults, and are no names of their own in __all__."""
    import asyncsoak.queue as queue

    reference = {
        "POLL_S": ("poll_seconds", 5.0),
        "STALE_AFTER_S": ("orphan_after_seconds", 60.0),
        "CANCEL_GRACE_S": ("cancel_grace_seconds", 60.0),
        "STOP_TIMEOUT_S": ("stop_timeout_seconds", 60.0),
        "KILL_WAIT_S": ("kill_wait_seconds", 10.0),
        "FINISH_RETRIES": ("finish_retries", 5),
        "FINISH_RETRY_WAIT_S": ("finish_retry_wait_seconds", 2.0),
        "TRAIN_CMD": ("cmd", queue.TRAIN_CMD),
    }
    config = queue.WorkerConfig()
    for name, (field, value) in reference.items():
        assert getattr(queue, name) == value == getattr(config, field), name
        assert name not in queue.__all__
    for name, value in {"SLICE_S": 0.25, "ERROR_TAIL_LINES": 20, "TAIL_BYTES": 65536}.items():
        assert getattr(queue, name) == value
        assert name not in queue.__all__


def test_only_the_entry_point_of_the_queue_imports_the_command_line() -> None:
    """The queue sits below the command line: of its modules only ``__main__`` (the entry
    point) imports ``asyncsoak.cli``; ``asyncsoak.queue.main`` still resolves to it."""
    import ast

    import asyncsoak.queue

    package = Path(asyncsoak.queue.__file__).parent
    importers = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                if target in ("..cli", "asyncsoak.cli") or target.startswith(
                    ("..cli.", "asyncsoak.cli.")
                ):
                    importers.add(path.name)
            elif isinstance(node, ast.Import) and any(
                alias.name.startswith("asyncsoak.cli") for alias in node.names
            ):
                importers.add(path.name)
    assert importers == {"__main__.py"}
    assert asyncsoak.queue.main.__module__ == "asyncsoak.queue.__main__"


def test_python_m_asyncsoak_queue_is_the_worker(tmp_path: Path) -> None:
    """``python -m asyncsoak.queue`` runs ``asyncsoak worker`` with its arguments."""
    import subprocess
    import sys

    db = tmp_path / "q.db"
    done = subprocess.run(
        [sys.executable, "-m", "asyncsoak.queue", "--db", str(db), "--once", "--poll", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--poll must be positive" in done.stderr
