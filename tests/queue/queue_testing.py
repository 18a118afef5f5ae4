"""Helpers of the job queue's tests: a FIFO through which child processes say what they did
("ready", "saved 5"), so tests wait for real events instead of sleeping, and child scripts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Environment for jobs whose scripts import asyncsoak from this checkout.
JOB_ENV = {"PYTHONPATH": str(REPO_ROOT)}
#: Soak limits that keep a test's soak fast.
FAST_SOAK = {"sample_interval_seconds": 0.2, "post_shutdown_grace_seconds": 0.5}

#: Longest wait for a child's next line: generous, for a loaded machine.
SIGNAL_TIMEOUT_S = 30.0
#: Prepended to child scripts: ``tell("ready")`` writes one line to the test's FIFO.
CHILD_PRELUDE = """\
import os, sys, time
def tell(message):
    fd = os.open(os.environ["TEST_SIGNALS"], os.O_WRONLY)
    os.write(fd, (message + "\\n").encode())
    os.close(fd)
"""


class ChildSignals:
    """Lines written by children to a FIFO, awaited without polling."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self._read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        # Holding a write end ourselves keeps the FIFO from reporting end of file (and
        # waking us in a loop) each time a child closes its end.
        self._write_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._buffer = b""

    async def next(self) -> str:
        """The next line a child wrote (within SIGNAL_TIMEOUT_S)."""
        with anyio.fail_after(SIGNAL_TIMEOUT_S):
            while b"\n" not in self._buffer:
                await anyio.wait_readable(self._read_fd)
                try:
                    self._buffer += os.read(self._read_fd, 4096)
                except BlockingIOError:
                    continue
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        os.close(self._read_fd)
        os.close(self._write_fd)


def write_script(directory: Path, name: str, body: str) -> list[str]:
    """A child script using ``tell``; returns the argv that runs it."""
    path = directory / name
    path.write_text(CHILD_PRELUDE + body)
    return [sys.executable, str(path)]
