"""The SLURM logic that needs no cluster: file name patterns, the grace under KillWait, the
end-time stop, scontrol's output, bad flags, and combining one job's artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._supervisor import _slurm
from asyncsoak._view._job_view import NotOneJobError, combine, format_combined

from .conftest import asyncsoak_cli

JOB = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu7", "SLURM_PROCID": "3"}


def test_patterns_are_filled_from_the_jobs_environment() -> None:
    """%j %A %a %N %t %r and %% take the job's values; outside an array %A is the job id."""
    env = {**JOB, "SLURM_RESTART_COUNT": "2"}
    path = Path("/runs/%j/%A_%a/%N-%t-r%r-100%%.json")
    assert _slurm.expand_path(path, env) == Path("/runs/42/42_0/gpu7-3-r2-100%.json")
    array = {**JOB, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2"}
    assert _slurm.expand_path(Path("/r/%A_%a.json"), array) == Path("/r/40_2.json")


def test_a_requeued_run_gets_its_restart_count_in_the_artifact_name() -> None:
    """Without %r, restart 1 writes soak.restart1.json beside the first run's soak.json."""
    first = _slurm.expand_path(Path("/o/soak-%j.json"), JOB, restart_suffix=True)
    again = {**JOB, "SLURM_RESTART_COUNT": "1"}
    second = _slurm.expand_path(Path("/o/soak-%j.json"), again, restart_suffix=True)
    assert first == Path("/o/soak-42.json")
    assert second == Path("/o/soak-42.restart1.json")
    # The progress dir (checkpoints) stays the same, so the rerun resumes.
    assert _slurm.expand_path(Path("/o/train-%j"), again) == Path("/o/train-42")
    # With %r the caller chose the name: no suffix on top.
    assert _slurm.expand_path(Path("/o/s-%r.json"), again, restart_suffix=True) == Path(
        "/o/s-1.json"
    )


def test_outside_a_job_paths_are_taken_as_written() -> None:
    assert _slurm.expand_path(Path("/o/100%j.json"), {}) == Path("/o/100%j.json")


def test_an_unknown_pattern_is_an_error() -> None:
    with pytest.raises(_slurm.PatternError, match="%q"):
        _slurm.expand_path(Path("/o/%q.json"), JOB)


def test_the_grace_after_the_schedulers_sigterm_stays_under_kill_wait() -> None:
    """The tree is killed by asyncsoak, with time for the artifact, before SLURM's SIGKILL."""
    assert _slurm.stop_grace(5.0, {"kill_wait_seconds": 30}) == 5.0
    assert _slurm.stop_grace(60.0, {"kill_wait_seconds": 30}) == 24.0
    assert _slurm.stop_grace(60.0, {"kill_wait_seconds": 2}) == 0.0
    # KillWait unknown: SLURM's default, 30 s.
    assert _slurm.stop_grace(60.0, None) == 24.0


def test_the_end_time_stop_leaves_the_grace_and_a_margin() -> None:
    scheduler = {"end_time_epoch": 1000.0}
    margin = _slurm.END_TIME_MARGIN_SECONDS
    assert _slurm.seconds_until_end_stop(scheduler, 5.0, now=900.0) == 100.0 - 5.0 - margin
    assert _slurm.seconds_until_end_stop(scheduler, 500.0, now=900.0) == 0.0
    assert _slurm.seconds_until_end_stop({"end_time_epoch": None}, 5.0, now=900.0) is None


def test_scontrol_output_is_read() -> None:
    config = "Configuration data as of ...\nJobRequeue = 1\nKillWait                = 8 sec\n"
    assert _slurm.parse_kill_wait(config) == 8.0
    assert _slurm.parse_kill_wait("nothing") is None
    fields = _slurm.parse_fields("JobId=7 JobName=a Restarts=1 EndTime=2026-12-01T07:43:56")
    assert fields["Restarts"] == "1"
    end = _slurm.parse_time(fields["EndTime"])
    assert end is not None
    assert end.tzinfo is not None
    assert _slurm.parse_time("Unknown") is None


def test_the_identity_comes_from_the_environment() -> None:
    identity = _slurm.job_identity({**JOB, "SLURM_JOB_PARTITION": "gpu", "SLURM_LOCALID": "1"})
    assert identity is not None
    assert identity["kind"] == "slurm"
    assert identity["job_id"] == 42
    assert identity["rank"] == 3
    assert identity["local_rank"] == 1
    assert identity["restart_count"] == 0
    assert identity["partition"] == "gpu"
    assert _slurm.job_identity({}) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [["--requeue-on", "TERM"], ["--forward-signal", "NOPE"], ["--forward-signal", "SIGKILL"]],
)
def test_bad_signal_flags_are_usage_errors(tmp_path: Path, flags: list[str]) -> None:
    """Exit status 2, nothing launched or written."""
    result = asyncsoak_cli(
        "run",
        "--progress-dir",
        str(tmp_path / "p"),
        "--output",
        str(tmp_path / "o" / "soak.json"),
        *flags,
        "--",
        "true",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "o").exists()


def _artifact(job: int, rank: int, status: str, started: str, failure_at: str | None) -> Any:
    failures = (
        []
        if failure_at is None
        else [{"reason": "stale_progress", "message": "no progress for 60s", "at": failure_at}]
    )
    return {
        "status": status,
        "failures": failures,
        "started_at": started,
        "ended_at": failure_at or started,
        "duration_seconds": 1.0,
        "exit": {"returncode": None},
        "stop": {"cause": "failure" if failures else "exited"},
        "progress": {
            "dir": None,
            "first_change_at": None,
            "last_change_at": None,
            "changes": 0,
            "longest_gap_seconds": 0.0,
        },
        "snapshot": {
            "scheduler": {"kind": "slurm", "job_id": job, "rank": rank, "node": f"n{rank}"}
        },
    }


def test_combine_finds_the_first_failure_on_the_wall_clock() -> None:
    """Rank 2 started later but failed first: the wall clock, not each soak's own t, decides."""
    artifacts = [
        (
            "a.json",
            _artifact(9, 0, "failed", "2026-01-01T00:00:00+00:00", "2026-01-01T00:10:00+00:00"),
        ),
        ("b.json", _artifact(9, 1, "passed", "2026-01-01T00:00:01+00:00", None)),
        (
            "c.json",
            _artifact(9, 2, "failed", "2026-01-01T00:05:00+00:00", "2026-01-01T00:06:00+00:00"),
        ),
    ]
    combined = combine(artifacts)
    assert combined["status"] == "failed"
    assert combined["first_failure"]["rank"] == 2
    assert combined["first_failure"]["offset_seconds"] == 360.0
    assert [s["start_offset_seconds"] for s in combined["soaks"]] == [0.0, 1.0, 300.0]
    text = format_combined(combined)
    assert "first failure: rank 2 on n2" in text
    json.dumps(combined, allow_nan=False)


def test_combined_view_spells_durations_like_the_other_views() -> None:
    """Offsets and run times in the combined view read like the summary's: 6m00s, 1h00m00s."""
    failing = _artifact(9, 0, "failed", "2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00")
    failing["duration_seconds"] = 3600.0
    late = _artifact(9, 1, "passed", "2026-01-01T00:06:00+00:00", None)
    combined = combine([("a.json", failing), ("b.json", late)])
    text = format_combined(combined)
    assert "started +6m00s, ran 1.0s" in text
    assert "ran 1h00m00s," in text
    assert "(+1h00m00s): stale_progress" in text
    assert "1h00m00s across" in text


@pytest.mark.slow
def test_artifacts_of_different_jobs_are_refused(tmp_path: Path) -> None:
    """summary of several artifacts: of two jobs, or one that ran outside SLURM, is exit 2."""
    a = _artifact(1, 0, "passed", "2026-01-01T00:00:00+00:00", None)
    b = _artifact(2, 0, "passed", "2026-01-01T00:00:00+00:00", None)
    with pytest.raises(NotOneJobError, match="different jobs"):
        combine([("a", a), ("b", b)])
    (tmp_path / "p").mkdir()  # a progress directory that never existed fails no_progress
    run = asyncsoak_cli(
        "run",
        "--quiet",
        "--no-gpu",
        "--progress-dir",
        str(tmp_path / "p"),
        "--output",
        str(tmp_path / "plain.json"),
        "--",
        "true",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert plain["snapshot"]["scheduler"] is None
    paths = [str(tmp_path / "plain.json")]
    for job in (1, 2):
        path = tmp_path / f"job{job}.json"
        path.write_text(
            json.dumps({**plain, "snapshot": a["snapshot"] if job == 1 else b["snapshot"]})
        )
        paths.append(str(path))
    result = asyncsoak_cli("summary", *paths[1:], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "different jobs" in result.stderr
    result = asyncsoak_cli("summary", *paths[:2], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "did not run inside a SLURM job" in result.stderr


def test_a_worker_in_an_allocation_takes_its_gpus_and_name_from_it() -> None:
    assert _slurm.allocation_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "6,7"}) == "2,3"
    assert _slurm.allocation_gpus({"SLURM_JOB_GPUS": "6,7"}) == "6,7"
    assert _slurm.allocation_gpus({}) is None
    assert _slurm.worker_name({"job_id": 12, "num_tasks": 1}, "n1") == "n1:slurm12"
    assert _slurm.worker_name({"job_id": 12, "num_tasks": 4, "rank": 2}, "n1") == "n1:slurm12.2"
    # No job that would not end, stop timeout and margin included, before the allocation.
    left = _slurm.seconds_left_for_jobs(1000.0, 20.0, now=900.0)
    assert left == 100.0 - 20.0 - _slurm.END_TIME_MARGIN_SECONDS
    assert _slurm.seconds_left_for_jobs(None, 20.0) is None
