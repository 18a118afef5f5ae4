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


def _first_lines(artifact: Path, count: int = 3) -> str:
    result = asyncsoak_cli("summary", str(artifact), cwd=artifact.parent)
    assert result.returncode == 0, result.stderr
    return "\n".join(result.stdout.splitlines()[:count])


def test_a_pass_with_warnings_names_its_warning(tmp_path: Path) -> None:
    """A progress dir that exists but stays empty while the command exits 0: a pass with a
    warning, and the live line's last frame, summary's first lines and the report's banner
    say what the warning is, not only that there is one."""
    (tmp_path / "progress").mkdir()
    args = ["--progress-dir", str(tmp_path / "progress"), "--output", str(tmp_path / "soak.json")]
    run = asyncsoak_cli("run", *args, "--no-gpu", "--", *py("pass"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    final = next(line for line in run.stderr.splitlines() if "finished:" in line)
    assert "1 warning: the command exited cleanly without any progress" in final
    assert "without any progress in" in _first_lines(tmp_path / "soak.json")
    report = asyncsoak_cli("report", str(tmp_path / "soak.json"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "soak.html").read_text()
    banner = page[page.index('<header id="verdict"') : page.index("</header>")]
    assert "the command exited cleanly without any progress" in banner


def test_a_leak_check_that_cannot_judge_is_a_warning_under_fail(tmp_path: Path) -> None:
    """Under --leak-check fail a run too short for the check to judge its memory passes with
    a warning (its artifact's status stays passed) that summary's first lines and the live
    line's last frame give, with how much the memory grew and what to change; under the
    default warn, the summary's memory line says it, and the status stays passed."""
    for mode in ("fail", "warn"):
        base = tmp_path / mode
        base.mkdir()
        result = asyncsoak_cli(
            "run",
            *("--progress-dir", str(base / "progress"), "--output", str(base / "soak.json")),
            *("--sample-interval", "0.5", "--no-gpu", "--leak-check", mode),
            "--",
            *py(TRAINER),
            str(base / "progress"),
            "steady",
            cwd=base,
        )
        assert result.returncode == 0, result.stderr
        data = asyncsoak_cli("summary", "--json", str(base / "soak.json"), cwd=base)
        summary = json.loads(data.stdout)
        assert summary["artifact_status"] == "passed"
        text = asyncsoak_cli("summary", str(base / "soak.json"), cwd=base).stdout
        if mode == "warn":
            assert summary["status"] == "passed"
            memory = next(line for line in text.splitlines() if "(judged)" in line)
            assert "the leak check could not judge it" in memory
            continue
        assert summary["status"] == "passed_with_warnings"
        first = _first_lines(base / "soak.json")
        assert "the leak check could not judge: memory grew" in first, first
        assert "--sample-interval" in first
        final = next(line for line in result.stderr.splitlines() if "finished:" in line)
        assert "the leak check could not judge" in final
