"""Shared test helpers: real children that say "ready", the artifact schema, fast soak limits."""

from __future__ import annotations

import contextlib
import io
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from jsonschema import Draft202012Validator

from asyncsoak import read_journal
from asyncsoak._record._artifact_io import load_schema

REPO = Path(__file__).resolve().parent.parent
#: The environment of a CLI run by a test: this checkout's asyncsoak first.
CLI_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def asyncsoak_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m asyncsoak ARGS`` as a user runs it, output captured, under a deadline."""
    return subprocess.run(
        [sys.executable, "-m", "asyncsoak", *args],
        cwd=cwd,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def asyncsoak_main(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``asyncsoak ARGS`` called in this process (``main(argv)``), output captured: for input
    the CLI refuses, the same status and lines as :func:`asyncsoak_cli` without a start-up."""
    from asyncsoak.cli import main

    out, err = io.StringIO(), io.StringIO()
    output = contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)
    with output[0], output[1], contextlib.chdir(cwd or Path.cwd()):
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's refusals
            status = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["asyncsoak", *args], status, out.getvalue(), err.getvalue())


def py(code: str) -> list[str]:
    """argv of a Python child running ``code`` (dedented)."""
    return [sys.executable, "-c", textwrap.dedent(code)]


class ReadyFifo:
    """A named pipe a child writes lines to ("ready", its pids): real synchronisation.

    The test side holds it open read-write, so a child's ``open(path, "w")`` never blocks and
    the test's read waits for data, not for a writer.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._buffer = b""

    def close(self) -> None:
        os.close(self._fd)

    def _take_line(self) -> str | None:
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            return line.decode()
        return None

    def _fill(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._buffer += os.read(self._fd, 65536)

    async def line(self, timeout: float = 20.0) -> str:
        with anyio.fail_after(timeout):
            while (line := self._take_line()) is None:
                await anyio.wait_readable(self._fd)
                self._fill()
        return line

    def line_sync(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while (line := self._take_line()) is None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                raise TimeoutError(f"no line from the child on {self.path} within {timeout}s")
            self._fill()
        return line


@pytest.fixture
def ready(tmp_path: Path) -> Iterator[ReadyFifo]:
    fifo = ReadyFifo(tmp_path / "ready.fifo")
    yield fifo
    fifo.close()


@pytest.fixture(scope="session")
def schema() -> Draft202012Validator:
    return Draft202012Validator(load_schema())


def assert_valid(artifact: Mapping[str, Any], schema: Draft202012Validator) -> None:
    errors = sorted(schema.iter_errors(artifact), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def fast_limits(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """run_soak keyword arguments with short limits and generous margins."""
    kwargs: dict[str, Any] = {
        "progress_dir": tmp_path / "progress",
        "output_path": tmp_path / "out" / "soak.json",
        "sample_interval_seconds": 0.1,
        "startup_timeout_seconds": 10.0,
        "stale_progress_seconds": 10.0,
        "post_shutdown_grace_seconds": 2.0,
        "nvidia_smi": None,
    }
    kwargs.update(overrides)
    return kwargs


def run_warnings(artifact: Mapping[str, Any]) -> list[str]:
    """The artifact's warnings less the machine's (its memory, /dev/shm): on a test machine
    the tests running beside this one move those, and they say so truly."""
    return [w for w in artifact["warnings"] if not w.startswith("the machine")]


def journal(path: Path) -> list[dict[str, Any]]:
    """Every event of a soak's journal, read as users read it (``asyncsoak.read_journal``)."""
    return list(read_journal(path))


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not alive)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree_pids(artifact: dict[str, Any]) -> set[int]:
    """Every pid the artifact saw in the tree (command, signals' targets, leftovers)."""
    pids = {artifact["exit"]["pid"]} if artifact["exit"]["pid"] else set()
    for event in artifact["events"]:
        pids.update(event.get("pids", []))
    pids.update(p["pid"] for p in artifact["leftover_processes"])
    return pids
