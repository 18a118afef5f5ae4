"""Hostile input to ``run_soak`` and ``asyncsoak run``: refused with a clear error (exit status
2, nothing launched or written); everything that is not bad input is never reported as such."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import CLI_ENV, asyncsoak_cli

LIMIT_S = 60.0

#: ``asyncsoak`` with a bug planted in the monitor: its process sampler raises ValueError.
BROKEN_MONITOR = textwrap.dedent(
    """
    import sys
    import asyncsoak._soak

    async def broken_sampler(*args, **kwargs):
        raise ValueError("an internal bug of the monitor")

    asyncsoak._soak.run_proc_sampler = broken_sampler
    from asyncsoak.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_internal_value_error_is_a_monitor_error_not_a_usage_error(tmp_path: Path) -> None:
    """A ValueError from inside the monitor: exit status 1, `monitor_error` in an `error`
    artifact; exit status 2 is for bad input only."""
    import subprocess

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
    result = asyncsoak_cli(
        "run", "--no-gpu", "--progress-dir", str(tmp_path / "p"),
        "--output", str(tmp_path / "out" / "soak.json"), f"--status-interval={value}",
        "--", sys.executable, "-c", "pass", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--status-interval" in result.stderr
    assert not (tmp_path / "out").exists()


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
