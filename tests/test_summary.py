"""`asyncsoak summary`: the verdict and what to look at first, from real runs."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import cast

import pytest

from asyncsoak._contract._schema import Artifact
from asyncsoak._record._artifact_io import check_artifact
from asyncsoak._view._hints import exit_text
from asyncsoak._view._summary import SCREEN_LINES, evidence_lines, summarize

from .conftest import asyncsoak_cli
from .soak_runs import Runs, make_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("runs"))


def summary_text(run: Path) -> str:
    result = asyncsoak_cli("summary", str(run), cwd=run.parent)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_stalled_summary_says_what_to_look_at(runs: Runs) -> None:
    """A stalled run: verdict, reason, when progress stopped, idle CPU, GPUs, last log line."""
    text = summary_text(runs.stalled_sampled)
    assert text.startswith("FAILED: The training stopped making progress")
    assert "stale_progress at " in text
    assert re.search(r"Progress stopped \d+\.\ds into the run", text)
    assert "idle while stalled" in text
    assert "GPUs while stalled: idle (gpu0 0%, gpu1 0% utilisation)." in text
    assert "hw_slowdown" in text
    assert "tree RSS" in text
    assert text.rstrip().splitlines()[-3].strip() == "waiting for the other ranks (all_reduce)..."
    # About one screen (one line of it names the training's step, rate and loss).
    assert len(text.splitlines()) <= SCREEN_LINES


def test_summary_json_has_the_same_facts(runs: Runs) -> None:
    """--json gives reasons, peaks, one row per GPU, hints and the log's last lines."""
    result = asyncsoak_cli("summary", str(runs.stalled_sampled), "--json", cwd=runs.stalled.parent)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "failed"
    assert [r["reason"] for r in summary["reasons"]] == ["stale_progress"]
    assert [g["gpu"] for g in summary["gpus"]] == ["gpu0", "gpu1"]
    # Idle is not throttling: only the reasons that held clocks back.
    assert [g["throttle_reasons"] for g in summary["gpus"]] == [["hw_slowdown", "sw_thermal"], []]
    peaks = {(p["group"], p["field"]): p for p in summary["peaks"]}
    artifact = json.loads(runs.stalled_sampled.read_text())
    assert peaks[("tree", "rss_bytes")]["max"] == artifact["summary"]["tree"]["rss_bytes"]["max"]
    # The progress and output dirs share one filesystem: one row, the lowest free space.
    disk = peaks[("machine", "disk_free_bytes_output")]
    assert disk["worst"] == "min"
    assert disk["label"] == "disk free output, progress"
    assert ("machine", "disk_free_bytes_progress") not in peaks
    # Counters are totals, and a peak and its mean share one unit.
    assert peaks[("tree", "write_bytes")]["text"].startswith("total ")
    rss = peaks[("tree", "rss_bytes")]["text"]
    assert rss.count("MiB") == 2 or rss.count("GiB") == 2, rss
    assert summary["log"]["last_lines"][-1] == "waiting for the other ranks (all_reduce)..."
    assert summary["exit"]["text"] == "killed by SIGTERM (signal 15, sent by the monitor)"


def test_passing_summary(runs: Runs) -> None:
    """A passing run: PASSED, its progress and longest gap against the limit."""
    text = summary_text(runs.passing)
    assert text.startswith("PASSED: The soak passed")
    assert re.search(r"\b\d+ progress changes; the longest quiet gap was", text)
    assert "exit status 0" in text
    # Sampled through the fake nvidia-smi replaying an H200 held at its power cap.
    assert re.search(r"gpu1\s+NVIDIA H200\s+99%/99%.*sw_power_cap", text)


def test_killed_monitor_summary(runs: Runs) -> None:
    """A dead monitor's journal: monitor_lost, and that the figures stop there."""
    text = summary_text(runs.killed_journal)
    assert text.startswith("FAILED: The monitor died before the run finished")
    assert "rebuilt from the journal" in text


def _artifact(returncode: int | None, signal: str | None, sent: list[str]) -> Artifact:
    # Only the sections exit_text reads: not a whole artifact, so cast rather than checked.
    part = {
        "exit": {"returncode": returncode, "signal": signal, "pid": 1},
        "stop": {"signals": [{"t": 1.0, "signal": s, "target": "group"} for s in sent]},
        "failures": [],
    }
    return cast(Artifact, part)


@pytest.mark.parametrize(
    ("returncode", "signal", "sent", "text"),
    [
        (0, None, [], "exit status 0"),
        (3, None, [], "exit status 3"),
        (-15, "SIGTERM", ["SIGTERM"], "killed by SIGTERM (signal 15, sent by the monitor)"),
        (
            -9,
            "SIGKILL",
            [],
            "killed by SIGKILL (signal 9, not sent by the monitor; "
            "often the kernel's out-of-memory killer)",
        ),
        (
            137,
            None,
            [],
            "exit status 137 (128+9: probably SIGKILL through a shell; "
            "often the kernel's out-of-memory killer)",
        ),
        (None, None, [], "exit status unknown (no exit was recorded)"),
    ],
)
def test_exit_statuses_are_decoded(
    returncode: int | None, signal: str | None, sent: list[str], text: str
) -> None:
    """Exit statuses read as people say them: who sent the signal, 128+N from a shell."""
    assert exit_text(_artifact(returncode, signal, sent)) == text


def test_startup_timeout_points_at_the_progress_dir(runs: Runs) -> None:
    """No progress at all: the hint names the progress dir and --output-is-progress."""
    # A whole artifact (summarize reads what the schema requires), made a startup timeout.
    base = json.loads(runs.stalled_sampled.read_text())
    artifact = {
        **base,
        "status": "failed",
        "failures": [{"reason": "startup_timeout", "message": "no progress", "at": None}],
        "progress": {
            "dir": "/runs/7",
            "first_change_at": None,
            "last_change_at": None,
            "changes": 0,
            "longest_gap_seconds": 600.0,
        },
        "config": {**base["config"], "startup_timeout_seconds": 600.0},
        "duration_seconds": 600.0,
        "events": [],
    }
    [hint, *_] = summarize(check_artifact(artifact))["look_first"]
    assert "/runs/7" in hint
    assert "10m00s" in hint
    assert "--output-is-progress" in hint


def test_provenance_says_what_each_probe_found_or_why_not(runs: Runs) -> None:
    """The snapshot's probes as the summary names them: a real run's host and Python; a probe
    that failed by its error; a snapshot never taken (rebuilt from a journal that lacks it)
    by nothing, or by why it was not taken."""
    artifact = check_artifact(json.loads(runs.passing.read_text()))
    shown = summarize(artifact)["provenance"]
    assert shown["host"] == socket.gethostname()  # the runs ran here
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", shown["Python"])

    failed = dict(artifact)
    failed["snapshot"] = {
        "source": {"repository": None, "error": "not a git repository"},
        "gpus": {"available": False, "error": "'nvidia-smi' not found: no GPU data"},
        "software": {"error": "OSError: boom"},
        "host": {"error": "OSError: boom"},
        "scheduler": None,
    }
    assert summarize(cast(Artifact, failed))["provenance"] == {
        "revision": "unknown: not a git repository",
        "GPU": "none recorded: 'nvidia-smi' not found: no GPU data",
    }
    failed["snapshot"] = {}
    assert summarize(cast(Artifact, failed))["provenance"] == {}
    failed["snapshot"] = {"error": "the soak ended before the snapshot was taken"}
    assert summarize(cast(Artifact, failed))["provenance"] == {
        "snapshot": "the soak ended before the snapshot was taken"
    }


def test_a_path_longer_than_the_line_is_never_broken() -> None:
    """A checkpoint path wider than the terminal stays whole (a user copies it), on its own
    line, rather than cut where the width falls."""
    path = "/tmp/pytest-of-root/pytest-417/popen-gw3/canonical/crash/progress/checkpoint-4"
    summary = {
        "status": "failed",
        "reasons": [{"reason": "nonzero_exit"}],
        "evidence": {
            "cause": None,
            "where": None,
            "source_line": None,
            "last_progress": None,
            "next_steps": [f"Fix the error at train.py:13, then resume from {path}."],
        },
    }

    lines = evidence_lines(summary, width=60)

    assert any(line.strip() == f"{path}." for line in lines), lines
