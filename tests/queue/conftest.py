"""Fixtures of the job queue's tests: a store in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsoak.queue import JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "queue.db") as s:
        yield s
