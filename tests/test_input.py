"""Hostile input to ``run_soak`` and ``asyncsoak run``: refused with a clear error (exit status
2, nothing launched or written); everything that is not bad input is never reported as such."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from .conftest import CLI_ENV, ReadyFifo, asyncsoak_cli, asyncsoak_main, fast_limits, py
from .test_faults import tmpfs

LIMIT_S = 60.0

#: ``asyncsoak`` with a bug planted in the monitor: its process sampler raises ValueError.
BROKEN_MONITOR = textwrap.dedent(
    """
    import sys
    import asyncsoak._sampling

    async def broken_sampler(*args, **kwargs):
        raise ValueError("an internal bug of the monitor")

    asyncsoak._sampling.run_proc_sampler = broken_sampler
    from asyncsoak.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_internal_value_error_is_a_monitor_error_not_a_usage_error(tmp_path: Path) -> None:
    """A ValueError from inside the monitor: exit status 1, `monitor_error` in an `error`
    artifact; exit status 2 is for bad input only."""
    output = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, "-c", BROKEN_MONITOR, "run", "--quiet", "--no-gpu",
         "--progress-dir", str(tmp_path / "p"), "--output", str(output),
         "--", sys.executable, "-c", "import time; time.sleep(60)"],
        env=CLI_ENV, capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "asyncsoak: error:" not in result.stderr
    assert "monitor error: ValueError: an internal bug" in result.stderr
    artifact = json.loads(output.read_text())
    assert artifact["status"] == "error"
    assert artifact["failures"][0]["reason"] == "monitor_error"


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_bad_status_interval_is_refused_before_the_run(tmp_path: Path, value: str) -> None:
    """`--status-interval` is checked like every other period: exit status 2, nothing written."""
    result = asyncsoak_main(
        "run", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", str(tmp_path / "out" / "soak.json"), f"--status-interval={value}",
        "--", sys.executable, "-c", "pass", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--status-interval" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_dump_signal_is_accepted_by_number(tmp_path: Path) -> None:
    """`--dump-signal 10` is SIGUSR1, as `run_soak(dump_signal=10)` takes it."""
    progress = tmp_path / "p"
    trainer = f"import pathlib; p = pathlib.Path({str(progress)!r}); p.mkdir(); (p / 'm').touch()"
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(progress),
        "--output", str(tmp_path / "soak.json"), "--dump-signal", "10",
        "--", sys.executable, "-c", trainer, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "soak.json").read_text())["config"]["dump_signal"] == 10


# --- item: existing files are never overwritten --------------------------------------------

#: A trainer that writes its own metrics.jsonl at once, then every 0.1 s.
METRICS_TRAINER = """
import pathlib, sys, time
out = pathlib.Path(sys.argv[1])
with open(out / "metrics.jsonl", "a") as f:
    for step in range(30):
        f.write('{"step": %d}\\n' % step)
        f.flush()
        time.sleep(0.1)
"""


@pytest.mark.slow
def test_trainers_own_file_at_the_journal_path_is_refused(tmp_path: Path) -> None:
    """`--progress-dir runs/42 --output runs/42/metrics.json` beside the trainer's own
    metrics.jsonl: exit status 2 naming it, the file untouched, nothing started."""
    run = tmp_path / "runs" / "42"
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": -1, "from": "an earlier run"}\n')
    before = metrics.read_bytes()
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(run),
        "--output", str(run / "metrics.json"), "--startup-timeout", "3",
        "--", sys.executable, "-c", METRICS_TRAINER, str(run), cwd=tmp_path, timeout=LIMIT_S,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert str(metrics) in result.stderr
    assert metrics.read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


@pytest.mark.asyncio
async def test_foreign_file_at_the_log_path_is_refused(tmp_path: Path) -> None:
    """A file at the log path that no soak wrote: ValidationError naming it, left as it was."""
    from asyncsoak import ValidationError, run_soak

    (tmp_path / "out").mkdir()
    log = tmp_path / "out" / "soak.log"
    log.write_text("the trainer's own notes\n")
    with pytest.raises(ValidationError, match=r"soak\.log"):
        await run_soak(command=[sys.executable, "-c", "pass"], **fast_limits(tmp_path))
    assert log.read_text() == "the trainer's own notes\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["soak.log"]


@pytest.mark.asyncio
@pytest.mark.parametrize("target", ["soak.json", "soak.jsonl"])
async def test_log_path_equal_to_the_artifact_or_journal_is_refused(
    tmp_path: Path, target: str
) -> None:
    """`run_soak(log_path=...)` naming the artifact or the journal is refused, nothing written."""
    from asyncsoak import ValidationError, run_soak

    kwargs = fast_limits(tmp_path)
    with pytest.raises(ValidationError, match="log_path"):
        await run_soak(
            command=[sys.executable, "-c", "pass"], log_path=tmp_path / "out" / target, **kwargs
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_rerun_over_an_earlier_soaks_files_is_allowed(tmp_path: Path) -> None:
    """The same output again: the earlier soak's artifact, journal and log are replaced."""
    from asyncsoak import run_soak

    kwargs = fast_limits(tmp_path)
    progress = kwargs["progress_dir"]
    argv = [sys.executable, "-c", f"import os; os.makedirs({str(progress)!r}, exist_ok=True); "
            f"open(os.path.join({str(progress)!r}, 'm'), 'a').write('x')"]  # fmt: skip
    with anyio.fail_after(LIMIT_S):
        first = await run_soak(command=argv, **kwargs)
        second = await run_soak(command=argv, **kwargs)
    assert (first["status"], second["status"]) == ("passed", "passed")
    assert second["started_at"] != first["started_at"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_second_soak_over_the_same_output_is_refused(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """While a soak runs, another given the same output is refused; the first one's files and
    run are untouched."""
    from asyncsoak import SoakControl, ValidationError, run_soak

    kwargs = fast_limits(tmp_path)
    progress = kwargs["progress_dir"]
    body = f"""
        import os, sys, time
        os.makedirs({str(progress)!r}, exist_ok=True)
        open(os.path.join({str(progress)!r}, "m"), "a").write("x")
        fd = os.open({str(ready.path)!r}, os.O_WRONLY); os.write(fd, b"ready\\n"); os.close(fd)
        time.sleep(60)
    """
    control = SoakControl()
    journal = tmp_path / "out" / "soak.jsonl"
    async with anyio.create_task_group() as tg:
        results: list[Mapping[str, object]] = []

        async def first() -> None:
            results.append(await run_soak(command=py(body), control=control, **kwargs))

        tg.start_soon(first)
        assert await ready.line(LIMIT_S) == "ready"
        held = journal.read_bytes()
        with anyio.fail_after(LIMIT_S), pytest.raises(ValidationError, match="another soak"):
            await run_soak(command=[sys.executable, "-c", "pass"], **kwargs)
        assert journal.read_bytes()[: len(held)] == held
        control.request_stop(reason="test done")
    assert results[0]["status"] == "cancelled"
    assert journal.read_bytes()[: len(held)] == held


def test_files_another_soak_is_creating_are_refused_as_another_soaks(tmp_path: Path) -> None:
    """The instant after another soak took the output's lock: its journal empty, its log
    there.  The output is refused because another soak holds it."""
    from asyncsoak import SoakConfig, ValidationError
    from asyncsoak._supervisor._outputs import check_outputs, lock_journal

    cfg = SoakConfig(**fast_limits(tmp_path, command=["true"]))
    cfg.output_path.parent.mkdir()
    fd = lock_journal(cfg.journal_path)
    try:
        cfg.log_path.write_text("")
        with pytest.raises(ValidationError, match="another soak is running"):
            check_outputs(cfg)
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_soaks_racing_for_one_output_are_told_another_soak_holds_it(
    tmp_path: Path,
) -> None:
    """16 soaks started at once over one output: one runs, and every other one is told that
    another soak holds it, never that the files were not written by an earlier soak."""
    from asyncsoak import SoakControl, ValidationError, run_soak

    controls = [SoakControl() for _ in range(16)]
    refusals: list[str] = []
    statuses: list[str] = []

    async def race(control: SoakControl, start: float) -> None:
        # Spread over the first one's start (not a wait for anything): some start while it
        # creates its files, before its journal has a header.
        await anyio.sleep(start)
        try:
            artifact = await run_soak(
                command=py("import time; time.sleep(60)"), control=control, **fast_limits(tmp_path)
            )
        except ValidationError as exc:
            refusals.append(str(exc))
            if len(refusals) == len(controls) - 1:
                for each in controls:
                    each.request_stop(reason="the race is over")
        else:
            statuses.append(artifact["status"])

    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            for i, control in enumerate(controls):
                tg.start_soon(race, control, i * 0.003)
    assert statuses == ["cancelled"]
    assert [r for r in refusals if "another soak is running" not in r] == []


# --- item: directories that cannot be read, progress in the first seconds ------------------


def iteration_fault_dir() -> Path | None:
    """A directory that opens but fails while it is listed (``/proc/1/map_files`` for whoever
    lacks CAP_SYS_ADMIN), or None where this kernel and user give no such fault."""
    candidate = Path("/proc/1/map_files")
    try:
        entries = os.scandir(candidate)
    except OSError:
        return None
    with entries:
        try:
            for _ in entries:
                pass
        except PermissionError:
            return candidate
    return None


@pytest.mark.slow
def test_progress_dir_holding_an_unlistable_directory_is_skipped_and_counted(
    tmp_path: Path,
) -> None:
    """`--progress-dir /proc/1` (its map_files cannot be listed): no traceback, the artifact
    is written, the skipped directory is named in a warning."""
    if iteration_fault_dir() is None:
        pytest.skip("this kernel lets this user list /proc/1/map_files: no fault to produce")
    output = tmp_path / "soak.json"
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--progress-dir", "/proc/1", "--output", str(output),
        "--", sys.executable, "-c", "pass", cwd=tmp_path, timeout=LIMIT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    artifact = json.loads(output.read_text())
    assert any("could not be read and were skipped" in w for w in artifact["warnings"])


@pytest.mark.slow
@pytest.mark.asyncio
async def test_progress_written_at_once_by_a_short_run_is_seen(tmp_path: Path) -> None:
    """A trainer that writes at once and exits before the first scan (default 5 s interval):
    its progress counts, no "without any progress" warning."""
    from asyncsoak import run_soak

    progress = tmp_path / "progress"
    progress.mkdir()
    argv = ["sh", "-c", f"echo step > {progress}/metrics.txt; sleep 1.5"]
    kwargs = fast_limits(tmp_path, sample_interval_seconds=5.0)
    with anyio.fail_after(LIMIT_S):
        artifact = await run_soak(command=argv, **kwargs)
    assert artifact["progress"]["changes"] >= 1
    assert not any("without any progress" in w for w in artifact["warnings"])


# --- item: an output location that cannot be written ---------------------------------------


def fill_up(directory: Path) -> None:
    """Fill the filesystem of ``directory`` to the last block, for real."""
    with open(directory / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 4096)


def run_into(output: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", str(output), "--", sys.executable, "-c",
        f"open({str(tmp_path / 'started')!r}, 'w').close()", cwd=tmp_path, timeout=LIMIT_S,
    )  # fmt: skip


@pytest.mark.slow
def test_read_only_output_directory_is_a_one_line_usage_error(tmp_path: Path) -> None:
    """Output on a read-only filesystem: one line naming it, exit status 2, nothing started."""
    with tmpfs(tmp_path / "ro", "64k") as ro:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        result = run_into(ro / "soak.json", tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"asyncsoak: error: cannot write {ro / 'soak.json'}: {ro} is unwritable (a read-only "
        "filesystem)"
    ]
    assert not (tmp_path / "started").exists()


@pytest.mark.slow
def test_full_output_filesystem_before_the_start_is_a_one_line_usage_error(
    tmp_path: Path,
) -> None:
    """Output on a filesystem that is already full: one line, exit status 2, nothing started."""
    with tmpfs(tmp_path / "full", "64k") as full:
        fill_up(full)
        result = run_into(full / "out" / "soak.json", tmp_path)
        left = sorted(p.name for p in full.iterdir())
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "is full" in result.stderr
    assert left == ["filler"]
    assert not (tmp_path / "started").exists()


def test_output_under_proc_is_unwritable_not_full(tmp_path: Path) -> None:
    """/proc (a filesystem of no blocks, writable to root) holds no files: the refusal says
    the path is unwritable, not that a disk is full."""
    result = asyncsoak_main(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", "/proc/soak.json", "--", "true", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "asyncsoak: error: cannot write /proc/soak.json: /proc is unwritable "
        "(a filesystem that holds no files)"
    ]


# --- item: files that are not a whole artifact of a known schema version -------------------


@pytest.fixture(scope="module")
def real_artifact(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("artifact")
    progress = base / "p"
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(progress),
        "--output", str(base / "soak.json"), "--", sys.executable, "-c",
        f"import os; os.makedirs({str(progress)!r}); open({str(progress / 'm')!r}, 'w').close()",
        cwd=base, timeout=LIMIT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads((base / "soak.json").read_text())
    return data


def damaged(artifact: dict[str, Any], damage: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(artifact))
    if damage == "schema_version 99":
        data["schema_version"] = 99
    elif damage == "no progress":
        del data["progress"]
    elif damage == "no exit status":
        del data["exit"]["returncode"]
    elif damage == "changes is text":
        data["progress"]["changes"] = "many"
    return data


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report", "summary"])
@pytest.mark.parametrize(
    "damage", ["schema_version 99", "no progress", "no exit status", "changes is text"]
)
def test_view_of_a_file_that_is_not_a_whole_known_artifact_is_refused(
    tmp_path: Path, real_artifact: dict[str, Any], command: str, damage: str
) -> None:
    """report and summary on an incomplete artifact or an unknown schema version: exit
    status 2 with a message saying what is wrong, no traceback, no report written."""
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(damaged(real_artifact, damage)))
    result = asyncsoak_main(command, str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr
    assert not (tmp_path / "soak.html").exists()


@pytest.mark.slow
def test_view_of_a_whole_artifact_still_works(
    tmp_path: Path, real_artifact: dict[str, Any]
) -> None:
    """The check refuses nothing a soak wrote."""
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(real_artifact))
    result = asyncsoak_cli("summary", str(path), cwd=tmp_path, timeout=LIMIT_S)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_rerun_over_a_crashed_soaks_rotated_journal_is_allowed(tmp_path: Path) -> None:
    """A long soak that died left a rotated journal (its header in the first closed segment)
    and no artifact: the journal is still recognised as a soak's, and a rerun replaces it."""
    from asyncsoak import run_soak

    kwargs = fast_limits(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    header = {"t": 0.0, "kind": "header", "config": {"log_path": str(out / "soak.log")}}
    (out / "soak.jsonl.000001").write_text(json.dumps(header) + "\n")
    (out / "soak.jsonl").write_text('{"t": 9.0, "kind": "sample"}\n')
    (out / "soak.log").write_text("the earlier run's output\n")
    progress = kwargs["progress_dir"]
    argv = [sys.executable, "-c", f"import os; os.makedirs({str(progress)!r})"]
    with anyio.fail_after(LIMIT_S):
        artifact = await run_soak(command=argv, **kwargs)
    assert artifact["status"] == "passed"
    assert "the earlier run's output" not in (out / "soak.log").read_text()


def test_soak_limits_are_spelled_once() -> None:
    """The job-settable limits have run_soak's defaults, and `run` and `submit` offer one
    flag per limit with that default: the CLI, the queue and run_soak cannot drift apart."""
    import argparse
    import inspect
    from dataclasses import fields

    from asyncsoak import SoakConfig, run_soak
    from asyncsoak._supervisor._config import SoakLimits
    from asyncsoak.cli._flags import add_soak_limits, help_groups, soak_limits

    signature = inspect.signature(run_soak).parameters
    # The reference's keywords have SoakConfig's defaults; the others take them from it.
    for spec in fields(SoakConfig):
        if spec.name in signature and spec.name not in ("command", "progress_dir", "output_path"):
            assert spec.default == signature[spec.name].default, spec.name
    parser = argparse.ArgumentParser()
    add_soak_limits(help_groups(parser))
    assert soak_limits(parser.parse_args([])) == {
        spec.name: spec.default for spec in fields(SoakLimits)
    }
    given = parser.parse_args(["--grace", "2", "--max-duration", "9", "--output-is-progress"])
    assert soak_limits(given) == {
        **{spec.name: spec.default for spec in fields(SoakLimits)},
        "post_shutdown_grace_seconds": 2.0,
        "max_duration_seconds": 9.0,
        "output_is_progress": True,
    }


def test_soak_config_checks_itself_when_made(tmp_path: Path) -> None:
    """The public SoakConfig refuses what run_soak refuses, with the same message, and holds
    the normalised values (absolute paths, the derived journal and log)."""
    import dataclasses

    from asyncsoak import SoakConfig, ValidationError

    given: dict[str, Any] = {
        "command": ["true"],
        "progress_dir": tmp_path / "p",
        "output_path": tmp_path / "soak.json",
        "log_path": None,
        "cwd": None,
        "env": None,
        "metadata": None,
        "stop_mode": "group",
        "snapshot_root": None,
        "nvidia_smi": None,
        "kill_wait_seconds": 5,
        "log_max_bytes": 1 << 20,
        "dump_signal": None,
        "forensics": True,
        "detailed_memory": False,
    }
    cfg = SoakConfig(**given)
    assert cfg.command == ("true",)
    assert cfg.journal_path == tmp_path / "soak.jsonl"
    assert cfg.log_path == tmp_path / "soak.log"
    assert cfg.kill_wait_seconds == 5.0
    assert cfg.sample_interval_seconds == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.stop_mode = "leader"  # type: ignore[misc]
    with pytest.raises(
        ValidationError, match=r"stale_progress_seconds must be zero or more, got -1$"
    ):
        SoakConfig(**given, stale_progress_seconds=-1)
    with pytest.raises(ValidationError, match="command must not be empty"):
        SoakConfig(**{**given, "command": []})


def test_a_probe_of_the_journal_never_makes_its_soak_lose_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared lock held for an instant by a probe (another soak's check, or ``recover``)
    when the soak locks its journal is waited out; a lock that stays is another soak's."""
    import fcntl

    from asyncsoak._contract import ValidationError
    from asyncsoak._supervisor import _outputs

    journal = tmp_path / "soak.journal.jsonl"
    probe = os.open(journal, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(probe, fcntl.LOCK_SH)
    # The probe lets go while the soak waits for it.
    monkeypatch.setattr(
        "asyncsoak._supervisor._outputs.time.sleep", lambda seconds: os.close(probe)
    )
    os.close(_outputs.lock_journal(journal))
    holder = os.open(journal, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_SH)
    monkeypatch.setattr("asyncsoak._supervisor._outputs.time.sleep", lambda seconds: None)
    with pytest.raises(ValidationError, match="another soak is running"):
        _outputs.lock_journal(journal)
    os.close(holder)


@pytest.mark.parametrize(
    ("command", "source"), [("report", "soak.json"), ("recover", "soak.jsonl")]
)
def test_an_unwritable_output_of_a_view_says_unwritable_naming_the_flag(
    real_artifact: dict[str, Any], tmp_path: Path, command: str, source: str
) -> None:
    """`report`/`recover -o` under a file: exit status 2, one line naming --output, the path
    and that it is unwritable."""
    run = Path(real_artifact["monitor"]["journal_path"]).with_name(source)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    output = blocker / "out"
    result = asyncsoak_main(command, str(run), "-o", str(output), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"asyncsoak: error: --output {output}: unwritable ("), line


#: Bad input to each command, and what its one-line refusal must hold: the flag as typed, the
#: value given, and what is accepted.  ``{tmp}`` is the test's directory.
_RUN = ("run", "--no-gpu", "--progress-dir", "{tmp}/p", "--output", "{tmp}/out/soak.json")
_SUBMIT = ("submit", "--db", "{tmp}/q.db")
_WORKER = ("worker", "--db", "{tmp}/q.db")
REFUSALS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    ((*_RUN, "--stale-progress", "-1"), ("--stale-progress must be zero or more, got -1",)),
    ((*_RUN, "--grace", "x"), ("--grace", "'x'", "expected seconds, e.g. 30 or 1.5")),
    ((*_RUN, "--stale-progress", "x"), ("--stale-progress", "'x'", "seconds or 'auto'")),
    ((*_RUN, "--status-interval", "x"), ("--status-interval", "'x'", "expected seconds")),
    ((*_RUN, "--scheduler-grace", "x"), ("--scheduler-grace", "'x'", "expected seconds")),
    ((*_RUN, "--dump-signal", "FOO"), ("--dump-signal", "'FOO'", "e.g. USR1, SIGUSR1 or 10")),
    ((*_RUN, "--dump-signal", "99"), ("--dump-signal", "99", "e.g. USR1, SIGUSR1 or 10")),
    ((*_RUN, "--forward-signal", "FOO"), ("--forward-signal:", "'FOO'", "SIGUSR1")),
    ((*_RUN, "--requeue-on", "TERM"), ("--requeue-on cannot be SIGTERM",)),
    ((*_RUN, "--metrics-port", "x"), ("--metrics-port", "'x'", "port number from 1 to 65535")),
    ((*_RUN, "--metrics-port", "99999"), ("--metrics-port", "99999", "1 and 65535")),
    ((*_RUN, "--max-rss", "2XB"), ("--max-rss", "'2XB'", "GiB")),
    ((*_RUN, "--cwd", "{tmp}/none"), ("--cwd is not a directory: {tmp}/none",)),
    (("run", "--progress-dir", "{tmp}/p", "--output", "{tmp}"), ("--output is a directory",)),
    (("demo", "--seconds", "x"), ("--seconds", "'x'", "expected seconds")),
    (("demo", "--dir", "/proc/none"), ("--dir /proc/none: unwritable",)),
    (("watch", "--status-interval", "x", "s.json"), ("--status-interval", "expected seconds")),
    ((*_SUBMIT, "--max-attempts", "0"), ("--max-attempts", "between 1 and", "got 0")),
    ((*_SUBMIT, "--gpus", "0"), ("--gpus", "at least 1 GPU, got '0'")),
    ((*_SUBMIT, "--no-retry-on", "bogus"), ("--no-retry-on: unknown reason 'bogus'", "known:")),
    ((*_SUBMIT, "--dump-signal", "FOO"), ("--dump-signal", "'FOO'", "SIGUSR1")),
    (("jobs", "--db", "mysql://u:secret@h/q"), ("--db", "mysql://", "a postgresql:// URL")),
    ((*_WORKER, "--poll", "x"), ("--poll", "'x'", "expected seconds")),
    ((*_WORKER, "--stop-timeout", "-3"), ("--stop-timeout must be zero or more, got -3",)),
    (
        (*_RUN, "--stall-timeout", "2"),
        (
            "asyncsoak run: error: unrecognized arguments: --stall-timeout",
            "(did you mean --startup-timeout?)",
        ),
    ),
    (
        (*_RUN, "--leak-chek=fail"),
        ("arguments: --leak-chek=fail", "(did you mean --leak-check?)"),
    ),
    (("jobs", "--bogus"), ("asyncsoak jobs: error: unrecognized arguments: --bogus",)),
    ((*_WORKER, "--bogus"), ("asyncsoak worker: error: unrecognized arguments: --bogus",)),
]


@pytest.mark.parametrize(("argv", "expected"), REFUSALS, ids=lambda v: " ".join(v)[-40:])
def test_input_errors_are_in_the_users_words(
    tmp_path: Path, argv: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    """Every refusal names the flag as typed and the value given, and says what is accepted,
    never a field's name: exit status 2, one line, nothing written."""
    args = [a.format(tmp=tmp_path) for a in argv]
    if args[0] in ("run", "submit"):
        args += ["--", "true"]
    result = asyncsoak_main(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()[-1:]
    for fragment in expected:
        assert fragment.format(tmp=tmp_path) in line, line
    assert not any(name in line for name in ("_seconds", "_path", "_dir", "invalid float")), line
    assert "secret" not in line
    if not any("did you mean" in fragment for fragment in expected):
        assert "did you mean" not in line, line  # no suggestion for a word nothing is near
    assert sorted(p.name for p in tmp_path.iterdir()) == []
