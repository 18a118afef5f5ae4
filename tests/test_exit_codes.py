"""Exit statuses a scheduler can act on: ``--detailed-exit-codes``, ``asyncsoak exit-codes``,
the termination message, and the same status in the queue's and the metrics' views."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsoak._contract._exit_codes import DETAILED_EXIT_CODES, detailed_exit_code
from asyncsoak._contract._vocabulary import FailureReason
from asyncsoak._export._soak_metrics import SoakMetrics
from asyncsoak._supervisor._kubernetes import SERVICE_ACCOUNT_DIR
from asyncsoak.cli._container import (
    TERMINATION_MESSAGE_MAX_BYTES,
    Ending,
    termination_log_path,
    termination_message,
)
from asyncsoak.cli._queue_show import queue_exit_code

from .conftest import CLI_ENV, ReadyFifo, asyncsoak_cli, py
from .metrics_support import exposition, value
from .test_cli import TOUCH, run_args

DOCS = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"

#: The released table: a reason's status never changes (literal values on purpose).
PINNED = {
    "spawn_failed": 10,
    "nonzero_exit": 11,
    "signaled": 12,
    "too_short": 13,
    "leftover_processes": 14,
    "startup_timeout": 20,
    "stale_progress": 21,
    "no_progress": 22,
    "overdue": 23,
    "memory_budget": 30,
    "memory_leak": 31,
    "disk_low": 32,
    "gpu_fault": 40,
    "nonfinite_loss": 41,
    "monitor_error": 50,
    "monitor_lost": 51,
}


def test_the_table_is_pinned_and_clear_of_shell_statuses() -> None:
    """Every reason has its own status, the released values, all in 3..125 (never 0-2,
    126, 127 or 128+N)."""
    assert dict(DETAILED_EXIT_CODES) == PINNED
    assert set(PINNED) == {str(r) for r in FailureReason}
    assert len(set(PINNED.values())) == len(PINNED)
    assert all(3 <= code <= 125 for code in PINNED.values())


def test_exit_codes_json_lists_every_reason(tmp_path: Path) -> None:
    """`asyncsoak exit-codes --json` lists every reason with its status and meaning, and the
    fixed statuses; the text form shows the same table."""
    result = asyncsoak_cli("exit-codes", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {row["reason"]: row["exit_code"] for row in data["reasons"]} == PINNED
    assert all(row["title"] for row in data["reasons"])
    assert [row["exit_code"] for row in data["statuses"]] == [0, 1, 2, 129, 130, 143]
    text = asyncsoak_cli("exit-codes", cwd=tmp_path).stdout
    for reason, code in PINNED.items():
        assert re.search(rf"^\s+{code}\s+{reason}\s", text, re.MULTILINE), reason


def test_every_status_is_documented() -> None:
    """docs/exit-codes.md has a row for every reason with its status."""
    rows = dict(re.findall(r"^\| `?(\d+)`? \| `(\w+)` \|", DOCS.read_text(), re.MULTILINE))
    assert {reason: int(code) for code, reason in rows.items()} == PINNED


STALL = TOUCH + "\nimport time; time.sleep(30)"
CRASH = TOUCH + "\nraise SystemExit(3)"


@pytest.mark.slow
def test_a_stall_and_a_crash_exit_with_their_own_statuses_and_messages(tmp_path: Path) -> None:
    """With --detailed-exit-codes a stalled run exits 21 and a crashed one 11; each leaves its
    verdict, reason, status and artifact in the termination log."""
    codes = {}
    for name, code in (("stall", STALL), ("crash", CRASH)):
        work = tmp_path / name
        work.mkdir()
        log = work / "termination-log"
        args = run_args(work, "--stale-progress", "0.3", "--detailed-exit-codes")
        result = asyncsoak_cli(*args, "--termination-log", str(log), "--", *py(code), cwd=work)
        codes[name] = result.returncode
        message = log.read_bytes()
        assert len(message) <= TERMINATION_MESSAGE_MAX_BYTES
        first, *rest = message.decode().splitlines()
        assert first.startswith("asyncsoak: soak failed: ")
        assert f"exit_code: {result.returncode}" in rest
        assert f"artifact: {work / 'soak.json'}" in rest
        reason = next(line.split(": ")[1] for line in rest if line.startswith("reason: "))
        assert PINNED[reason] == result.returncode
    assert codes == {"stall": 21, "crash": 11}


@pytest.mark.slow
def test_without_the_flag_a_failure_exits_1_and_a_pass_leaves_its_verdict(
    tmp_path: Path,
) -> None:
    """Without the flag nothing changes (a crash exits 1); a passed soak's termination log
    says it passed, with status 0 and no reason."""
    log = tmp_path / "termination-log"
    failed = asyncsoak_cli(
        *run_args(tmp_path), "--termination-log", str(log), "--", *py(CRASH), cwd=tmp_path
    )
    assert failed.returncode == 1
    assert "exit_code: 1" in log.read_text().splitlines()
    passed = asyncsoak_cli(
        *run_args(tmp_path), "--termination-log", str(log), "--", *py(TOUCH), cwd=tmp_path
    )
    assert passed.returncode == 0, passed.stderr
    lines = log.read_text().splitlines()
    assert lines[0].startswith("asyncsoak: soak passed")
    assert lines[1:3] == ["reason: -", "exit_code: 0"]


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["--termination-log", "missing/log"], "--termination-log"),
        (["--scheduler-grace", "-1"], "--scheduler-grace"),
    ],
    ids=["termination-log-directory", "negative-grace"],
)
def test_bad_container_flags_are_refused_before_anything_runs(
    tmp_path: Path, bad: list[str], named: str
) -> None:
    """A --termination-log in a missing directory, a negative --scheduler-grace: exit 2
    naming the flag, nothing launched."""
    marker = tmp_path / "launched"
    result = asyncsoak_cli(
        *run_args(tmp_path, *bad), "--", *py(f"open({str(marker)!r}, 'w')"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert named in result.stderr
    assert not marker.exists()


def test_the_default_termination_log_is_used_only_when_writable(tmp_path: Path) -> None:
    """/dev/termination-log is the default where it exists and can be written; `none` turns
    it off."""
    present = tmp_path / "termination-log"
    assert termination_log_path(None, default=tmp_path / "absent") is None
    present.write_text("")
    assert termination_log_path(None, default=present) == present
    assert termination_log_path("none", default=present) is None


def test_a_long_verdict_is_cut_to_what_kubernetes_keeps() -> None:
    """A verdict far past 4,096 bytes (multi-byte text) is cut; the reason, status and
    artifact lines stay whole."""
    ending = Ending("asyncsoak: soak failed: x: " + "é" * 5000, 21, "stale_progress", Path("/a"))
    message = termination_message(ending)
    assert len(message) <= TERMINATION_MESSAGE_MAX_BYTES
    lines = message.decode().splitlines()
    assert lines[0].endswith("...")
    assert lines[1:] == ["reason: stale_progress", "exit_code: 21", "artifact: /a"]


def test_the_queue_and_the_metrics_carry_the_same_status() -> None:
    """A failed job's `job --json` exit_code and a soak's asyncsoak_soak_exit_code are the
    status --detailed-exit-codes gives its reason."""
    assert queue_exit_code("failed", "gpu_fault") == 40
    assert queue_exit_code("failed", "outcome_lost") == 1  # the queue's own reason
    assert detailed_exit_code("not_a_reason") == 1
    assert queue_exit_code("succeeded", None) == 0
    assert queue_exit_code("interrupted", None) is None
    metrics = SoakMetrics("s1", now=lambda: 0.0, host="h")
    at = {"message": "m", "at": "2026-01-01T00:00:01Z"}
    metrics.observe({"kind": "failure", "t": 1.0, "reason": "stale_progress", **at})
    metrics.observe({"kind": "failure", "t": 1.0, "reason": "leftover_processes", **at})
    metrics.observe({"kind": "finished", "t": 2.0, "status": "failed"})
    text = exposition(metrics)
    assert value(text, "asyncsoak_soak_exit_code") == 21


@pytest.mark.slow
def test_sigterm_outside_a_pod_leaves_a_cancelled_verdict(tmp_path: Path, ready: ReadyFifo) -> None:
    """Outside a pod (and a SLURM job) SIGTERM stays the caller's stop (cause cancelled, exit
    143), and the termination log says so."""
    if SERVICE_ACCOUNT_DIR.is_dir():
        pytest.skip("this machine is a Kubernetes pod")
    log = tmp_path / "termination-log"
    say = f"open({str(ready.path)!r}, 'w').write('ready\\n')"
    env = {k: v for k, v in CLI_ENV.items() if k not in ("KUBERNETES_SERVICE_HOST", "SLURM_JOB_ID")}
    trainer = py(f"{TOUCH}\nimport time\n{say}\ntime.sleep(60)")
    args = run_args(tmp_path, "--detailed-exit-codes", "--termination-log", str(log))
    monitor = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", *args, "--", *trainer],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        assert ready.line_sync() == "ready"
        monitor.send_signal(signal.SIGTERM)
        monitor.communicate(timeout=30)
    finally:
        monitor.kill()
        monitor.wait()
    assert monitor.returncode == 143
    assert log.read_text().splitlines()[0] == "asyncsoak: stopped by SIGTERM"
    assert "exit_code: 143" in log.read_text().splitlines()
    assert json.loads((tmp_path / "soak.json").read_text())["stop"]["cause"] == "cancelled"
