"""The evidence first: the cause, the last progress, the next step and the log's end, at the
top of the summary and of the report, from real runs of a trainer that passes, stalls,
crashes or leaks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._contract._schema import Artifact
from asyncsoak._record._artifact_io import check_artifact
from asyncsoak._view._evidence import gather, log_end, trend_text
from asyncsoak._view._summary import format_summary, summarize
from asyncsoak._view.report import render_report

from .conftest import asyncsoak_cli
from .soak_runs import TRAINER, canonical_runs
from .test_report import needs_plotly


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return canonical_runs(tmp_path_factory.getbasetemp() / "canonical")


def _line_of(text: str) -> int:
    """The line of the trainer script that holds ``text``."""
    return next(i for i, line in enumerate(TRAINER.splitlines(), 1) if text in line)


def _assert_resumes_from_a_checkpoint(text: str, artifact: Path, before_step: int) -> None:
    """The next step names a checkpoint directory the trainer wrote before ``before_step``."""
    progress = artifact.parent / "progress"
    found = re.search(rf"[Rr]esume from {re.escape(str(progress))}/checkpoint-(\d+)\.", text)
    assert found is not None, text
    assert int(found.group(1)) < before_step
    assert (progress / f"checkpoint-{found.group(1)}" / "trainer_state.json").is_file()


def first_lines(artifact: Path, count: int = 6) -> list[str]:
    result = asyncsoak_cli("summary", str(artifact), cwd=artifact.parent)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[:count]


@pytest.mark.slow
def test_crash_summary_leads_with_the_exception(trainer_runs: dict[str, Path]) -> None:
    """A crash: the exception, its frame and source line, and (next) where to resume from."""
    lines = first_lines(trainer_runs["crash"], 8)
    text = "\n".join(lines)
    assert lines[0] == "FAILED: The command failed (non-zero exit status)"
    raising = _line_of("raise RuntimeError")
    assert re.search(rf"cause: RuntimeError: injected crash at step 8 \(train.py:{raising}\b", text)
    assert '> raise RuntimeError(f"injected crash at step {step}")' in text
    # Step 8 raised before its checkpoint was written: resume from the newest one seen.
    _assert_resumes_from_a_checkpoint(
        text.replace("\n    ", " "), trainer_runs["crash"], before_step=8
    )


@pytest.mark.slow
def test_stall_summary_names_the_stalled_frame(trainer_runs: dict[str, Path]) -> None:
    """A stall: the frame py-spy saw with its source line, the checkpoint, the next steps."""
    lines = first_lines(trainer_runs["stall"], 10)
    text = "\n".join(lines).replace("\n    ", " ")
    assert lines[0] == "FAILED: The training stopped making progress"
    forensics = json.loads(trainer_runs["stall"].read_text())["forensics"]
    if forensics["py_spy"] is not None:  # py-spy installed: the Python frame is known
        assert re.search(
            rf"cause: pid \d+ \(python\S*\) idle at train.py:{_line_of('time.sleep(60)')} "
            "in wait_for_ranks",
            text,
        )
        assert "> time.sleep(60)" in text
    assert "last progress:" in text
    assert re.search(r"checkpoint-\d+/trainer_state.json", text)
    _assert_resumes_from_a_checkpoint(text, trainer_runs["stall"], before_step=9)
    assert "--dump-signal SIGUSR1" in text


@pytest.mark.slow
def test_passed_summary_has_no_cause(trainer_runs: dict[str, Path]) -> None:
    """A clean pass: no cause, no next step; the last progress is there."""
    lines = first_lines(trainer_runs["pass"])
    assert lines[0] == "PASSED: The soak passed"
    assert not any("cause:" in line or "next:" in line for line in lines)
    assert lines[1].startswith("  last progress: ")


def test_traceback_before_the_last_lines_is_kept() -> None:
    """A traceback followed by shutdown chatter is still shown whole, and marked."""
    tail = "\n".join(
        ["step 1", "Traceback (most recent call last):", '  File "t.py", line 3, in f']
        + ["    g()", "ValueError: bad"]
        + [f"cleanup {i}" for i in range(20)]
    )
    lines, span = log_end(tail, lines=10)
    assert span is not None
    assert lines[span[0]] == "Traceback (most recent call last):"
    assert lines[span[1] - 1] == "ValueError: bad"
    assert len(lines) <= 25


def _leaking_artifact(base: dict[str, Any]) -> Artifact:
    """A real passing artifact with the trends and processes a leaking trainer gives."""
    artifact = {**base, "warnings": ["memory of pid 4242 (python) grew 1.0 GiB in 1m10s"]}
    entry = {
        "verdict": "leak",
        "unit": "bytes",
        "label": "RSS of pid 4242",
        "pid": 4242,
        "name": "python",
        "slope_per_hour": 54 * 2**30,
        "slope_interval_per_hour": [50 * 2**30, 58 * 2**30],
        "growth": 2**30,
        "span_seconds": 70.0,
        "first": 886 * 2**20,
        "last": 1882 * 2**20,
        "limit": 24 * 2**30,
        "limit_source": "machine memory",
        "projected_limit_at": "2026-12-01T08:30:00Z",
        "projected_seconds_to_limit": 1500.0,
    }
    artifact["trends"] = {
        "process.4242.rss_bytes": entry,
        "process.4243.rss_bytes": {**entry, "verdict": "stable", "pid": 4243, "growth": 0},
    }
    artifact["processes"] = [
        {
            "pid": 4242,
            "name": "python",
            "first_rss_bytes": 886 * 2**20,
            "peak_rss_bytes": 1882 * 2**20,
            "last_rss_bytes": 1880 * 2**20,
            "mean_cpu_percent": 97.0,
            "peak_gpu_memory_bytes": None,
            "peak_threads": 12,
            "series": {"t": [0, 35, 70], "rss_bytes": [886 * 2**20, 1400 * 2**20, 1882 * 2**20]},
        },
        {
            "pid": 4243,
            "name": "pt_data_worker",
            "first_rss_bytes": 419 * 2**20,
            "peak_rss_bytes": 419 * 2**20,
            "last_rss_bytes": 419 * 2**20,
            "mean_cpu_percent": 20.0,
            "peak_gpu_memory_bytes": None,
            "peak_threads": 3,
            "series": {"t": [0, 70], "rss_bytes": [419 * 2**20, 419 * 2**20]},
        },
    ]
    return check_artifact(artifact)


@pytest.mark.slow
def test_leak_leads_the_summary(trainer_runs: dict[str, Path]) -> None:
    """A leak: the headline counts the warning, the leaking pid, slope, growth and time to
    the limit come second, and first under Look first."""
    artifact = _leaking_artifact(json.loads(trainer_runs["pass"].read_text()))
    summary = summarize(artifact)
    lines = format_summary(summary, width=100).splitlines()
    assert lines[0] == "PASSED WITH WARNINGS: The soak passed, with 1 warning"
    assert lines[1].startswith("  warning: memory of pid 4242 (python) grew 1.0 GiB in 1m10s")
    assert "+0.9 GiB/min" in lines[1] + lines[2]
    assert summary["look_first"][0].startswith("Memory leak: memory of pid 4242 (python)")
    assert "reaches machine memory in 25m00s" in summary["look_first"][0]
    assert trend_text(gather(artifact).leaks[0]) in summary["look_first"][0]


@pytest.mark.slow
@needs_plotly
def test_report_shows_who_grew(trainer_runs: dict[str, Path]) -> None:
    """The report's process table: RSS first → peak → last, the leaking row marked, and the
    note that summed RSS counts shared pages more than once."""
    page = render_report(_leaking_artifact(json.loads(trainer_runs["pass"].read_text())))
    row = re.search(r'<tr class="leak">(.*?)</tr>|<tr class="leak">(.*?)<tr', page, re.S)
    assert row is not None
    assert "4242" in row.group(0)
    assert "0.9 GiB → 1.8 GiB → 1.8 GiB" in row.group(0)
    assert "+0.9 GiB/min (leak)" in row.group(0)
    assert "pages that forked workers share are counted once per process" in page


# The verdict, the evidence and the cause above a 1400x900 fold, for these runs and a leak:
# tests/test_report_screens.py.
