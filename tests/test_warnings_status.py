"""Warnings look like warnings: a real run that leaks, and passes (``--leak-check warn``), is
``PASSED WITH WARNINGS`` in ``summary``, ``passed_with_warnings`` in ``summary --json`` and in
``compare``, while its artifact's ``status`` stays ``passed``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import asyncsoak_cli, py

pytestmark = pytest.mark.slow

#: Ticks progress every 50 ms; with ``grow`` it keeps 6 MiB more each tick (a leak).
TRAINER = """
import pathlib, sys, time
progress = pathlib.Path(sys.argv[1]); progress.mkdir(parents=True, exist_ok=True)
grow = sys.argv[2] == "grow"
keep = [bytearray(100 * 2**20)] if grow else []
for i in range(60):
    if grow:
        keep.append(bytearray(6 * 2**20))
    with open(progress / "metrics.txt", "a") as f:
        f.write("step\\n")
    time.sleep(0.05)
"""


def _soak(base: Path, mode: str) -> Path:
    result = asyncsoak_cli(
        "run",
        "--progress-dir",
        str(base / "progress"),
        "--output",
        str(base / "soak.json"),
        "--sample-interval",
        "0.05",
        "--no-gpu",
        "--quiet",
        "--",
        *py(TRAINER),
        str(base / "progress"),
        mode,
        cwd=base.parent,
    )
    assert result.returncode == 0, result.stderr
    return base / "soak.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("warnings")
    return {mode: _soak(base / mode, mode) for mode in ("steady", "grow")}


def test_a_passed_run_with_a_leak_warning_says_so_first(runs: dict[str, Path]) -> None:
    """summary's first line: PASSED WITH WARNINGS; --json: passed_with_warnings, with the
    artifact's own status (still passed) beside it."""
    artifact = json.loads(runs["grow"].read_text())
    assert artifact["status"] == "passed"
    assert any(" grew " in w for w in artifact["warnings"]), artifact["warnings"]
    text = asyncsoak_cli("summary", str(runs["grow"]), cwd=runs["grow"].parent)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("PASSED WITH WARNINGS: The soak passed, with "), text.stdout
    data = asyncsoak_cli("summary", "--json", str(runs["grow"]), cwd=runs["grow"].parent)
    summary = json.loads(data.stdout)
    assert summary["status"] == "passed_with_warnings"
    assert summary["artifact_status"] == "passed"
    clean = asyncsoak_cli("summary", "--json", str(runs["steady"]), cwd=runs["steady"].parent)
    assert json.loads(clean.stdout)["status"] == "passed"


def test_compare_tells_a_pass_with_warnings_from_a_clean_one(runs: dict[str, Path]) -> None:
    """compare: the verdict row says the candidate passed with warnings, a regression from a
    clean pass; the other way round it is none."""
    result = asyncsoak_cli(
        "compare", "--json", str(runs["steady"]), str(runs["grow"]), cwd=runs["grow"].parent
    )
    comparison = json.loads(result.stdout)
    verdict = next(row for row in comparison["rows"] if row["key"] == "verdict")
    assert verdict["baseline"] == "passed"
    assert verdict["candidate"].startswith("passed with ")
    assert verdict["candidate"].endswith(("warning", "warnings"))
    assert verdict["regressed"]
    back = asyncsoak_cli(
        "compare", "--json", str(runs["grow"]), str(runs["steady"]), cwd=runs["grow"].parent
    )
    rows = json.loads(back.stdout)["rows"]
    assert not next(row for row in rows if row["key"] == "verdict")["regressed"]
