"""Fixtures of the job queue's tests: a store and a child-signal FIFO in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from queue_testing import ChildSignals

from asyncsoak.queue import JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "queue.db") as s:
        yield s


@pytest.fixture
def signals(tmp_path: Path) -> Iterator[ChildSignals]:
    s = ChildSignals(tmp_path / "signals.fifo")
    yield s
    s.close()
