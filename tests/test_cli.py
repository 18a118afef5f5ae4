"""`asyncsoak run` and `asyncsoak demo` as a user runs them: exit statuses, stderr, artifact."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from jsonschema import Draft202012Validator

from asyncsoak.cli import COMMAND_MODULES, COMMANDS, build_parser

from .conftest import CLI_ENV, ReadyFifo, alive, assert_valid, asyncsoak_cli, py

pytestmark = pytest.mark.slow


def run_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--progress-dir",
        str(tmp_path / "progress"),
        "--output",
        str(tmp_path / "soak.json"),
        "--sample-interval",
        "0.1",
        "--grace",
        "1",
        "--no-gpu",
        *extra,
    ]


TOUCH = (
    "import pathlib; p = pathlib.Path('progress'); p.mkdir(exist_ok=True); "
    "(p / 'm').write_text('x')"
)


def test_passing_run_exits_0(tmp_path: Path, schema: Draft202012Validator) -> None:
    """A clean soak exits 0 and names its artifact on stderr."""
    result = asyncsoak_cli(*run_args(tmp_path), "--", *py(TOUCH), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "soak passed" in result.stderr
    assert_valid(json.loads((tmp_path / "soak.json").read_text()), schema)


def test_failed_soak_exits_1_with_reason_and_artifact(tmp_path: Path) -> None:
    """A failed soak exits 1; the primary reason and the artifact path are on stderr."""
    code = TOUCH + "\nimport time; time.sleep(30)"
    result = asyncsoak_cli(
        *run_args(tmp_path, "--stale-progress", "0.3"), "--", *py(code), cwd=tmp_path
    )
    assert result.returncode == 1
    assert "soak failed: stale_progress" in result.stderr
    assert f"artifact: {tmp_path / 'soak.json'}" in result.stderr
    assert json.loads((tmp_path / "soak.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(
    "bad",
    [
        ["--stale-progress", "-1"],
        ["--sample-interval", "0"],
        ["--env", "NO_EQUALS_SIGN"],
        ["--metadata", "=value"],
        ["--stop-mode", "nuke"],
    ],
    ids=["negative", "zero-interval", "env", "metadata", "stop-mode"],
)
def test_bad_usage_exits_2_and_launches_nothing(tmp_path: Path, bad: list[str]) -> None:
    """Bad options exit 2 with a message; no artifact is written and nothing runs."""
    marker = tmp_path / "launched"
    result = asyncsoak_cli(
        *run_args(tmp_path, *bad), "--", *py(f"open({str(marker)!r}, 'w')"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "error" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "soak.json").exists()


def test_missing_command_exits_2(tmp_path: Path) -> None:
    """`asyncsoak run` without a command is bad usage."""
    result = asyncsoak_cli(*run_args(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "no command given" in result.stderr


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_signal_to_the_monitor_stops_the_tree(
    tmp_path: Path, ready: ReadyFifo, signum: int, status: int
) -> None:
    """SIGINT/SIGTERM/SIGHUP (a closed terminal) to the monitor: tree stopped, cancelled
    artifact, exit 130/143/129."""
    say_pid = f"open({str(ready.path)!r}, 'w').write(f'{{os.getpid()}}\\n')"
    code = f"{TOUCH}\nimport os, time\n{say_pid}\ntime.sleep(60)"
    monitor = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", *run_args(tmp_path), "--", *py(code)],
        cwd=tmp_path,
        env=CLI_ENV,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(ready.line_sync())
        monitor.send_signal(signum)
        _, stderr = monitor.communicate(timeout=30)
    finally:
        monitor.kill()
        monitor.wait()
    assert monitor.returncode == status
    assert f"stopped by {signal.Signals(signum).name}" in stderr
    assert not alive(child)
    artifact = json.loads((tmp_path / "soak.json").read_text())
    assert artifact["status"] == "cancelled"
    assert artifact["stop"]["cause"] == "cancelled"


def test_a_second_signal_kills_the_tree_at_once(tmp_path: Path, ready: ReadyFifo) -> None:
    """A second Ctrl-C kills a trainer that ignores SIGTERM without waiting out --grace."""
    code = (
        TOUCH
        + "\nimport os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"
        + f"\nopen({str(ready.path)!r}, 'w').write(f'{{os.getpid()}}\\n')\ntime.sleep(60)"
    )
    monitor = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", *run_args(tmp_path, "--grace", "30"), "--", *py(code)],
        cwd=tmp_path,
        env=CLI_ENV,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(ready.line_sync())
        monitor.send_signal(signal.SIGINT)
        assert monitor.stderr is not None
        # Two signals sent together may merge into one: wait for the first to be handled.
        while "again to kill it now" not in monitor.stderr.readline():
            pass
        monitor.send_signal(signal.SIGINT)
        monitor.communicate(timeout=60)
    finally:
        monitor.kill()
        monitor.wait()
    assert monitor.returncode == 130
    assert not alive(child)
    artifact = json.loads((tmp_path / "soak.json").read_text())
    assert artifact["status"] == "cancelled"
    assert artifact["stop"]["killed"] is True
    # The soak's own record: its SIGKILL went out before the 30 s grace that began with its
    # SIGTERM could run out (the trainer ignores SIGTERM, so only the second Ctrl-C explains it).
    signals = artifact["stop"]["signals"]
    term = next(s["t"] for s in signals if s["signal"] == "SIGTERM")
    kill = next(s["t"] for s in signals if s["signal"] == "SIGKILL")
    assert term <= kill < term + 30


def test_killed_monitor_does_not_leave_the_trainer_running(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """SIGKILL of the monitor: the reaper stops a trainer that ignores SIGTERM and stdin."""
    code = (
        TOUCH
        + "\nimport os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"
        + f"\nopen({str(ready.path)!r}, 'w').write(f'{{os.getpid()}}\\n')\ntime.sleep(60)"
    )
    monitor = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", *run_args(tmp_path), "--", *py(code)],
        cwd=tmp_path,
        env=CLI_ENV,
        stderr=subprocess.DEVNULL,
    )
    try:
        child = int(ready.line_sync())
        monitor.kill()
        monitor.wait(timeout=10)
        # The reaper gives the tree the grace (1 s), then SIGKILLs it.
        psutil.wait_procs([psutil.Process(child)], timeout=15)
    finally:
        monitor.kill()
        monitor.wait()
    assert not alive(child)
    kinds = [
        json.loads(line)["kind"] for line in (tmp_path / "soak.jsonl").read_text().splitlines()
    ]
    assert kinds[0] == "header"
    assert "started" in kinds


def test_demo_passes_and_points_at_its_artifact(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """`asyncsoak demo` trains, passes, and says where the artifact is."""
    result = asyncsoak_cli("demo", "--seconds", "2", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "verdict: passed" in result.stdout
    [artifact_path] = (tmp_path / "demo").glob("run-*/soak.json")
    assert (
        str(artifact_path.relative_to(tmp_path)) in result.stdout
        or str(artifact_path) in result.stdout
    )
    artifact = json.loads(artifact_path.read_text())
    assert_valid(artifact, schema)
    assert artifact["progress"]["changes"] >= 2


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_each_subcommand_is_registered_by_the_module_the_table_names() -> None:
    """``asyncsoak COMMAND`` builds only its module's parser, so the table must be whole."""
    for module in COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        importlib.import_module(f"asyncsoak.cli.{module}").register(
            parser.add_subparsers(dest="subcommand")
        )
        named = {command for command, owner in COMMANDS.items() if owner == module}
        assert _subcommands(parser) == named, module
    assert _subcommands(build_parser()) == set(COMMANDS)


def test_a_soak_does_not_load_the_queue_the_report_or_the_other_commands() -> None:
    """What ``asyncsoak run`` imports before it starts the command (its start-up cost)."""
    code = (
        "import sys\n"
        "from asyncsoak.cli import build_parser\n"
        "build_parser('run').parse_args(\n"
        "    ['run', '--progress-dir', 'p', '--output', 'o', '--', 'true']\n"
        ")\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('asyncsoak'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert "asyncsoak.cli._run" in loaded
    unwanted = [
        name
        for name in loaded
        if name.startswith(("asyncsoak.queue", "asyncsoak._view.report", "asyncsoak.artifact"))
        or (
            name.startswith("asyncsoak.cli._")
            and name
            not in ("asyncsoak.cli._run", "asyncsoak.cli._slurm", "asyncsoak.cli._container")
        )
    ]
    assert not unwanted
