"""`asyncsoak run` and `asyncsoak demo` as a user runs them: exit statuses, stderr, artifact."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from jsonschema import Draft202012Validator

from asyncsoak.cli import COMMAND_MODULES, COMMANDS, build_parser

from .conftest import CLI_ENV, ReadyFifo, alive, assert_valid, asyncsoak_cli, asyncsoak_main, py

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


def test_a_progress_dir_that_never_exists_fails_at_the_front_door(tmp_path: Path) -> None:
    """A typo'd --progress-dir (the trainer writes elsewhere, the command exits 0): the soak
    fails no_progress, exit 1 (22 with --detailed-exit-codes), and its first line names the
    directory and says it never existed."""
    typo = tmp_path / "runs" / "24"
    args = run_args(tmp_path, "--detailed-exit-codes")
    args[args.index("--progress-dir") + 1] = str(typo)
    result = asyncsoak_cli(*args, "--", *py("print('ready')"), cwd=tmp_path)
    assert result.returncode == 22, result.stderr
    failed = next(line for line in result.stderr.splitlines() if "soak failed" in line)
    assert failed.startswith(f"asyncsoak: soak failed: no_progress: the progress directory {typo}")
    assert "never existed" in failed


def test_a_missing_progress_dir_is_said_while_waiting_and_at_the_startup_timeout(
    tmp_path: Path,
) -> None:
    """While the progress dir does not exist the live line says so, and so does the
    startup_timeout failure; two samples of a sleeping tree call it neither busy nor idle."""
    typo = tmp_path / "runs" / "24"
    args = run_args(tmp_path, "--startup-timeout", "1", "--status-interval", "0.2")
    args[args.index("--progress-dir") + 1] = str(typo)
    args[args.index("--sample-interval") + 1] = "0.5"
    result = asyncsoak_cli(*args, "--", *py("import time; time.sleep(30)"), cwd=tmp_path)
    assert result.returncode == 1
    assert f"waiting for the first progress: {typo} does not exist (yet)" in result.stderr
    failed = next(line for line in result.stderr.splitlines() if "soak failed" in line)
    assert f"the progress directory {typo} does not exist" in failed
    assert "busy" not in failed
    summary = asyncsoak_cli("summary", str(tmp_path / "soak.json"), cwd=tmp_path).stdout
    assert "The tree was busy" not in summary


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
    result = asyncsoak_main(
        *run_args(tmp_path, *bad), "--", *py(f"open({str(marker)!r}, 'w')"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "error" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "soak.json").exists()


def test_missing_command_exits_2(tmp_path: Path) -> None:
    """`asyncsoak run` without a command is bad usage."""
    result = asyncsoak_main(*run_args(tmp_path), cwd=tmp_path)
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
    journal = tmp_path / "soak.jsonl"
    try:
        child = int(ready.line_sync())
        # The journal is written by the interval: the kill comes once it holds the start
        # (what a recover needs), not between the spawn and its write.
        deadline = time.monotonic() + 30
        while b'"kind":"started"' not in journal.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        monitor.kill()
        monitor.wait(timeout=10)
        # The reaper gives the tree the grace (1 s), then SIGKILLs it.
        psutil.wait_procs([psutil.Process(child)], timeout=15)
    finally:
        monitor.kill()
        monitor.wait()
    assert not alive(child)
    kinds = [json.loads(line)["kind"] for line in journal.read_text().splitlines()]
    assert kinds[0] == "header"
    assert "started" in kinds


def test_demo_passes_and_points_at_its_artifact(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """`asyncsoak demo` trains, passes with no warning, shows the training's step, rate and
    loss as asyncsoak read them from the trainer's log, its goodput, and says where the
    artifact is."""
    result = asyncsoak_cli("demo", "--seconds", "2", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "verdict: passed\n" in result.stdout
    training = next(line for line in result.stdout.splitlines() if line.startswith("training: "))
    assert re.fullmatch(r"training: step \d+, [\d.]+ steps/s, loss [\d.]+", training), training
    assert re.search(r"^goodput [\d.]+ %: lost [\d.]+ % .*start-up", result.stdout, re.M)
    [artifact_path] = (tmp_path / "demo").glob("run-*/soak.json")
    assert (
        str(artifact_path.relative_to(tmp_path)) in result.stdout
        or str(artifact_path) in result.stdout
    )
    artifact = json.loads(artifact_path.read_text())
    assert_valid(artifact, schema)
    assert artifact["progress"]["changes"] >= 2
    assert artifact["warnings"] == []
    assert artifact["progress"]["steps"]["step"] >= 4


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
            not in (
                "asyncsoak.cli._run",
                "asyncsoak.cli._flags",
                "asyncsoak.cli._container",
            )
        )
    ]
    assert not unwanted


#: What a whole ``run --quiet`` on a machine without ``nvidia-smi`` must not import: the GPU
#: sampler's modules, the job table, the metrics, the live view, the schema.
NOT_ON_A_QUIET_RUN = (
    "asyncsoak._sampling._nvidia_smi",
    "asyncsoak._sampling._gpu_sample",  # and _gpu_sampler
    "asyncsoak._sampling._gpu_health",
    "asyncsoak._sampling._xid",
    "asyncsoak.trainer._jobs",
    "asyncsoak._export._",
    "asyncsoak._view._live",
    "asyncsoak._view._live_line",
    "asyncsoak._contract._schema",
    "asyncsoak.queue",
)


@pytest.mark.parametrize("gpu", [["--no-gpu"], []], ids=["no-gpu", "no-nvidia-smi"])
def test_a_quiet_soak_without_gpus_imports_only_what_it_uses(
    tmp_path: Path, gpu: list[str]
) -> None:
    """A whole soak (start-up cost, issue 36 item 7), its modules listed once it is written."""
    (tmp_path / "bin").mkdir()  # PATH without nvidia-smi (nor git: the snapshot says so)
    argv = ["run", "--quiet", *gpu, "--progress-dir", str(tmp_path)]
    argv += ["--output", str(tmp_path / "out.json"), "--", sys.executable, "-c", "pass"]
    code = (
        "import sys\nfrom asyncsoak.cli import main\n"
        f"status = main({argv!r})\n"
        "print(status, *sorted(m for m in sys.modules if m.startswith('asyncsoak')))\n"
    )
    status, *loaded = subprocess.run(
        [sys.executable, "-c", code],
        env={**CLI_ENV, "PATH": str(tmp_path / "bin")},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert status == "0"
    assert "asyncsoak._supervisor._soak" in loaded
    assert [name for name in loaded if name.startswith(NOT_ON_A_QUIET_RUN)] == []
    notes = json.loads((tmp_path / "out.json").read_text())["monitor"]["sampler_notes"]
    told = [note["message"] for note in notes if note["sampler"] == "gpu"]
    assert told == ([] if gpu else ["no GPU data: 'nvidia-smi' not found"])


@pytest.mark.parametrize("args", [["exit-codes"], ["run", "--help"], ["--help"]], ids=" ".join)
def test_a_reader_that_has_gone_ends_a_printing_command_quietly(
    tmp_path: Path, args: list[str]
) -> None:
    """``asyncsoak exit-codes | true``: the reader is gone before the first line; the command
    ends with status 0 and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "asyncsoak", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=CLI_ENV,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("command", ["run", "submit"])
def test_run_help_teaches_in_groups_and_every_option_says_what_it_does(command: str) -> None:
    """``run --help`` (and ``submit``'s, which shares the soak's flags): titled groups, the
    essentials first, and no option without a help line."""
    parser = build_parser(command)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    titles = [g.title for g in sub._action_groups if g._group_actions]
    own = [t for t in titles if t not in ("positional arguments", "options")]
    assert len(own) >= 4, titles
    if command == "run":
        assert own[0] == "what to run and where its progress shows"
    unexplained = [
        a.option_strings[0]
        for a in sub._actions
        if a.option_strings and (a.help is None or a.help == argparse.SUPPRESS)
    ]
    assert unexplained == []


def test_the_commands_are_listed_in_the_order_a_newcomer_meets_them() -> None:
    """``asyncsoak --help``: the demo first, then a soak and its views, then the queue."""
    listed = [
        action.dest
        for action in build_parser()._subparsers._group_actions[0]._choices_actions  # type: ignore[union-attr]
    ]
    assert listed == [
        "demo", "run", "watch", "summary", "report", "compare", "recover", "exit-codes",
        "snapshot", "submit", "worker", "jobs", "job", "goodput", "logs", "cancel", "requeue",
        "workers",
    ]  # fmt: skip


def test_the_collector_held_off_for_the_start_up_runs_again_once_the_command_runs(
    tmp_path: Path,
) -> None:
    """The program holds the garbage collector off while it starts (its imports free little);
    a soak, which may run for days, collects again once its command runs."""
    import gc

    import asyncsoak.cli

    progress = tmp_path / "p"
    progress.mkdir()
    asyncsoak.cli._collector_held = True
    gc.disable()
    try:
        result = asyncsoak_main(
            "run", "--quiet", "--no-gpu", "--progress-dir", str(progress),
            "--output", str(tmp_path / "soak.json"),
            "--", "sh", "-c", f"echo step >> {progress}/log",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert gc.isenabled()
    finally:
        asyncsoak.cli._collector_held = False
        gc.enable()
        gc.unfreeze()
