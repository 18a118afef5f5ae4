"""Property-based tests: spaces of bad inputs, and the scanner against random file operations."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncsoak import run_soak
from asyncsoak._sampling._watchdog import ProgressTracker, scan_progress_dir

DURATIONS = [
    "sample_interval_seconds",
    "startup_timeout_seconds",
    "stale_progress_seconds",
    "post_shutdown_grace_seconds",
    "min_duration_seconds",
    "max_duration_seconds",
    "kill_wait_seconds",
]

bad_numbers = st.one_of(
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    st.integers(max_value=-1),
    st.just(math.nan),
    st.just(math.inf),
    st.just(-math.inf),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DURATIONS), value=bad_numbers)
def test_any_bad_duration_is_refused_before_anything_happens(name: str, value: object) -> None:
    """Negative, NaN, infinite or non-numeric limits raise TypeError/ValueError; nothing runs."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        kwargs: dict[str, Any] = {
            "command": ["/bin/sh", "-c", f"touch {base / 'launched'}"],
            "progress_dir": base / "progress",
            "output_path": base / "out" / "soak.json",
            "nvidia_smi": None,
            name: value,
        }
        with pytest.raises((TypeError, ValueError)):
            anyio.run(lambda: run_soak(**kwargs))
        assert os.listdir(base) == []


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    command=st.one_of(
        st.text(),
        st.just([]),
        st.lists(st.one_of(st.integers(), st.none(), st.binary()), min_size=1, max_size=3),
        st.lists(st.text(), min_size=1, max_size=3).filter(
            lambda argv: not argv[0] or any("\0" in a for a in argv)
        ),
    )
)
def test_any_bad_command_is_refused(command: object) -> None:
    """Strings, empty argv, non-string items, NUL bytes: refused with TypeError/ValueError."""
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises((TypeError, ValueError)):
            anyio.run(
                lambda: run_soak(
                    command=command,  # type: ignore[arg-type]
                    progress_dir=Path(tmp) / "p",
                    output_path=Path(tmp) / "o.json",
                    nvidia_smi=None,
                )
            )
        assert os.listdir(tmp) == []


# One step of a random workload on a progress directory.
operations = st.lists(
    st.tuples(
        st.sampled_from(["create", "append", "touch", "delete", "rename", "mkdir", "own"]),
        st.integers(min_value=0, max_value=5),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(ops=operations)
def test_scanner_sees_exactly_the_changes_that_count(ops: list[tuple[str, int]]) -> None:
    """After each random operation a scan reports progress iff a regular file was written to."""
    root = Path(tempfile.mkdtemp())
    try:
        own = root / "own.jsonl"
        own.write_text("")
        own_key = (own.stat().st_dev, own.stat().st_ino)
        tracker = ProgressTracker(
            scan_progress_dir(root, {own_key}).files, startup_timeout=1e9, stale_after=1e9
        )
        for step, (op, n) in enumerate(ops, start=1):
            name = root / f"f{n}"
            expect_change = False
            if op == "create" and not name.exists():
                name.write_text("new")
                expect_change = True
            elif op == "append" and name.is_file():
                with name.open("a") as f:
                    f.write("more")
                expect_change = True
            elif op == "touch" and name.is_file():
                st_ = name.stat()
                os.utime(name, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
                expect_change = True
            elif op == "delete" and name.is_file():
                name.unlink()
            elif op == "rename" and name.is_file():
                target = root / f"renamed{step}"
                name.rename(target)
                expect_change = True  # a new name holding data is new progress
            elif op == "mkdir" and not name.exists():
                name.mkdir()
            elif op == "own":
                with own.open("a") as f:
                    f.write("journal line\n")
            changed = tracker.observe(scan_progress_dir(root, {own_key}).files, now=float(step))
            assert bool(changed) == expect_change, (op, n, changed)
            assert "own.jsonl" not in changed
    finally:
        shutil.rmtree(root)
