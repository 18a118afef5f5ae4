"""Helpers of the job queue's tests: child scripts that say what they did ("ready", "saved 5")
through the test's FIFO (``tests.conftest.ReadyFifo``), so tests wait for real events."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil

from ..conftest import REPO

#: Environment for jobs whose scripts import asyncsoak from this checkout.
JOB_ENV = {"PYTHONPATH": str(REPO)}
#: Soak limits that keep a test's soak fast.
FAST_SOAK: dict[str, Any] = {"sample_interval_seconds": 0.2, "post_shutdown_grace_seconds": 0.5}

#: Prepended to child scripts: ``tell("ready")`` writes one line to the test's FIFO.
CHILD_PRELUDE = """\
import os, sys, time
def tell(message):
    fd = os.open(os.environ["TEST_SIGNALS"], os.O_WRONLY)
    os.write(fd, (message + "\\n").encode())
    os.close(fd)
"""


def write_script(directory: Path, name: str, body: str) -> list[str]:
    """A child script using ``tell``; returns the argv that runs it."""
    path = directory / name
    path.write_text(CHILD_PRELUDE + body)
    return [sys.executable, str(path)]


def kill_worker_and_its_reapers(pid: int) -> None:
    """SIGKILL the worker ``pid`` and its reapers together, as a lost host would.  The worker
    is frozen first: alive, it would see its reaper die and stop the tree itself."""
    worker = psutil.Process(pid)
    worker.suspend()
    for reaper in worker.children():
        reaper.kill()
    worker.kill()
