"""The edges of what a soak accepts: the event loop it runs on, the bounds of every duration
and size, and the words for a signal the monitor itself passed on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import anyio
import pytest

from asyncsoak import AsyncsoakError, ValidationError, run_soak
from asyncsoak._supervisor._config import SoakLimits

from .conftest import CLI_ENV, ReadyFifo, asyncsoak_cli, asyncsoak_main, fast_limits, py

LIMIT_S = 60.0


def test_run_soak_under_trio_is_a_clear_error_naming_asyncio(tmp_path: Path) -> None:
    """Under ``anyio.run(..., backend="trio")`` run_soak raises AsyncsoakError saying it
    needs asyncio, nothing launched or written (it died in trio's internal TypeError)."""
    pytest.importorskip("trio", reason="trio is not installed (it is in the test extra)")
    kwargs = fast_limits(tmp_path)
    kwargs["command"] = py(f"open({str(tmp_path / 'launched')!r}, 'w').close()")

    async def main() -> None:
        await run_soak(**kwargs)

    with pytest.raises(AsyncsoakError, match=r"run_soak needs the asyncio event loop"):
        anyio.run(main, backend="trio")
    assert os.listdir(tmp_path) == []


def test_run_soak_under_trio_once_the_supervisor_is_imported_is_still_a_clear_error(
    tmp_path: Path,
) -> None:
    """The asyncio check holds for a later soak of the same process too, once an earlier one
    has imported the supervisor (it was skipped then, and trio's own error came out)."""
    pytest.importorskip("trio", reason="trio is not installed (it is in the test extra)")
    from asyncsoak._supervisor._front import _import_supervisor

    anyio.run(_import_supervisor)  # on asyncio, as an earlier soak does
    kwargs = fast_limits(tmp_path)
    kwargs["command"] = py(f"open({str(tmp_path / 'launched')!r}, 'w').close()")

    async def main() -> None:
        await run_soak(**kwargs)

    with pytest.raises(AsyncsoakError, match=r"run_soak needs the asyncio event loop"):
        anyio.run(main, backend="trio")
    assert os.listdir(tmp_path) == []


#: Every duration flag of ``run`` (the soak limits, and the status lines' period).
DURATION_FLAGS = [
    *(spec.metadata["flag"] for spec in fields(SoakLimits) if spec.metadata["kind"] == "seconds"),
    "--status-interval",
]


def refused_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return asyncsoak_main(
        "run", "--quiet", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", str(tmp_path / "out" / "soak.json"), *flags,
        "--", sys.executable, "-c", f"open({str(tmp_path / 'launched')!r}, 'w').close()",
        cwd=tmp_path,
    )  # fmt: skip


def assert_refused(result: subprocess.CompletedProcess[str], tmp_path: Path, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "launched").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["1e308", "31536001"])
@pytest.mark.parametrize("flag", DURATION_FLAGS)
def test_a_duration_past_a_year_is_refused_like_inf(tmp_path: Path, flag: str, value: str) -> None:
    """``--grace 1e308`` (or a second more than a year) is refused as ``inf`` is: exit status 2
    naming the bound, nothing launched (it was accepted, and a lingering child then made the
    soak wait for ever)."""
    result = refused_run(tmp_path, flag, value)
    assert_refused(result, tmp_path, "at most 3.1536e+07 seconds (a year)")


def test_a_sample_interval_below_the_floor_is_refused(tmp_path: Path) -> None:
    """``--sample-interval 1e-9`` (a sampler that burns a core) is refused, on the command
    line (naming the flag as typed) and by run_soak; 0.05 s, the floor, is accepted."""
    result = refused_run(tmp_path, "--sample-interval", "1e-9")
    assert_refused(result, tmp_path, "--sample-interval must be at least 0.05 seconds")
    with pytest.raises(ValidationError, match=r"at least 0\.05"):
        SoakLimits(sample_interval_seconds=0.049)
    assert SoakLimits(sample_interval_seconds=0.05).sample_interval_seconds == 0.05


@pytest.mark.parametrize("flag", ["--max-rss", "--max-gpu-memory", "--min-disk-free"])
def test_a_size_past_an_exbibyte_is_refused(tmp_path: Path, flag: str) -> None:
    """``--max-rss 1e30`` (an int no database or metric holds) is refused in one line; so is
    ``max_rss_bytes=2**70`` given to run_soak."""
    result = refused_run(tmp_path, flag, "1e30")
    assert_refused(result, tmp_path, "too large (at most 1 EiB)")
    name = {"--max-rss": "max_rss_bytes", "--max-gpu-memory": "max_gpu_memory_bytes"}.get(
        flag, "min_disk_free_bytes"
    )
    with pytest.raises(ValidationError, match="at most 1 EiB"):
        SoakLimits(**{name: 2**70})  # type: ignore[arg-type]  # checked in __post_init__


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--poll", "1e308"],
        ["worker", "--stale-after", "4e7"],
        ["demo", "--seconds", "inf"],
        ["demo", "--seconds", "1e308"],
    ],
)
def test_other_periods_past_a_year_are_refused(tmp_path: Path, args: list[str]) -> None:
    """The worker's periods and the demo's length have the same bounds as a soak's."""
    result = asyncsoak_main(*args, "--db" if args[0] == "worker" else "--dir", str(tmp_path / "x"),
                            cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    bounds = ("must be a finite number", "at most 3.1536e+07 seconds (a year)")
    assert any(bound in lines[0] for bound in bounds), lines
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_trainer_killed_by_a_forwarded_signal_is_named_as_forwarded(tmp_path: Path) -> None:
    """The monitor passes SIGUSR1 on (``--forward-signal``) and the trainer dies of it: the
    failure and every view say it was forwarded by the monitor (they said "not sent by the
    monitor", blaming someone else)."""
    ready = ReadyFifo(tmp_path / "ready.fifo")
    output = tmp_path / "soak.json"
    trainer = f"import time; open({str(ready.path)!r}, 'w').write('ready\\n'); time.sleep(60)"
    monitor = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", "run", "--quiet", "--no-gpu",
         "--progress-dir", str(tmp_path / "p"), "--output", str(output),
         "--forward-signal", "SIGUSR1", "--", sys.executable, "-c", trainer],
        cwd=tmp_path, env=CLI_ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert ready.line_sync(timeout=LIMIT_S) == "ready"
        monitor.send_signal(signal.SIGUSR1)
        _, stderr = monitor.communicate(timeout=LIMIT_S)
    finally:
        ready.close()
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
    assert monitor.returncode == 1, stderr
    assert "signaled: the command was killed by SIGUSR1, forwarded by the monitor" in stderr
    data = json.loads(output.read_text())
    assert data["failures"][0]["reason"] == "signaled"
    summary = asyncsoak_cli("summary", str(output), cwd=tmp_path, timeout=LIMIT_S)
    assert summary.returncode == 0, summary.stderr
    assert "killed by SIGUSR1 (signal 10, forwarded by the monitor" in summary.stdout
    assert "not sent by the monitor" not in summary.stdout
