"""Many soaks in one event loop (a sweep run by an orchestrator): every one is judged.

Each soak's sampling clock runs in a thread of its own, outside the pool of short blocking
calls, so no soak waits for a thread that another soak holds for its whole life.  The
trainers are ``sh`` and ``sleep``: light enough that 64 of them, with their reapers, fit on a
small machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

import asyncsoak

pytestmark = pytest.mark.slow

#: Write one step, then stop writing for ten times the stall limit, then exit 0: a soak that
#: cannot watch (or judge) passes it; a soak that watches fails it ``stale_progress`` and
#: stops it before it exits by itself (however slowly a loaded machine starts 64 soaks).
WRITE_THEN_STALL = 'mkdir -p "$1" && echo step > "$1/metrics" && sleep 30'
#: Write a step twice a second for about three seconds, then exit 0.
WRITE_A_FEW_STEPS = 'mkdir -p "$1" && for i in 1 2 3 4 5 6; do echo $i >> "$1/m"; sleep 0.5; done'


async def _soak(
    base: Path, index: int, script: str, results: dict[int, Mapping[str, Any]], **options: Any
) -> None:
    run = base / f"soak-{index}"
    progress = run / "progress"
    options = {
        "sample_interval_seconds": 0.5,
        "startup_timeout_seconds": 60.0,
        "stale_progress_seconds": 3.0,
        "post_shutdown_grace_seconds": 5.0,
        "nvidia_smi": None,
        "forensics": False,
        **options,
    }
    try:
        results[index] = await asyncsoak.run_soak(
            command=["sh", "-c", script, "sh", str(progress)],
            progress_dir=progress,
            output_path=run / "soak.json",
            **options,
        )
    except asyncsoak.SoakFailureError as exc:
        results[index] = exc.artifact


def _samples(artifact: Mapping[str, Any]) -> int:
    return int(artifact["monitor"]["samples"]["sample"])


def _kinds(artifact: Mapping[str, Any]) -> list[str]:
    return [event["kind"] for event in artifact["events"]]


@pytest.mark.asyncio
async def test_64_soaks_in_one_loop_each_catch_their_stall(tmp_path: Path) -> None:
    """64 trainers in one loop each write, then stall past the limit: every soak fails it
    (``stale_progress``) and stops its trainer before the trainer would have exited."""
    results: dict[int, Mapping[str, Any]] = {}
    with anyio.fail_after(110):
        async with anyio.create_task_group() as tg:
            for index in range(64):
                tg.start_soon(_soak, tmp_path, index, WRITE_THEN_STALL, results)

    assert len(results) == 64
    reasons = {index: [f["reason"] for f in a["failures"]] for index, a in results.items()}
    assert all(r == ["stale_progress"] for r in reasons.values()), reasons
    for artifact in results.values():
        # Stopped by the monitor (its SIGTERM), not ended by the trainer's own exit 0.
        assert artifact["stop"]["cause"] == "failure"
        assert artifact["exit"]["signal"] == "SIGTERM"
        assert _samples(artifact) >= 2
        assert "sampler_degraded" not in _kinds(artifact)


@pytest.mark.asyncio
async def test_24_soaks_in_one_loop_all_have_process_samples(tmp_path: Path) -> None:
    """24 trainers that run for a few seconds each pass with their tree sampled throughout,
    never blind (more soaks than the pool of blocking calls has threads)."""
    results: dict[int, Mapping[str, Any]] = {}
    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            for index in range(24):
                tg.start_soon(_soak, tmp_path, index, WRITE_A_FEW_STEPS, results)

    assert len(results) == 24
    for artifact in results.values():
        assert artifact["status"] == "passed", artifact["failures"]
        assert _samples(artifact) >= 3
        assert artifact["summary"]["tree"]["processes"]["max"] >= 2  # sh and its sleep
        assert "sampler_degraded" not in _kinds(artifact)


@pytest.mark.asyncio
async def test_cancelling_64_soaks_at_once_stops_them_all_together(tmp_path: Path) -> None:
    """A caller that cancels 64 running soaks at once: each stops its tree with one SIGTERM
    (no kill was needed), writes a ``cancelled`` artifact and lets the cancellation through;
    the stops ran side by side (every SIGTERM went out before the first soak had finished)."""
    controls = [asyncsoak.SoakControl() for _ in range(64)]
    results: dict[int, Mapping[str, Any]] = {}
    cancelled: list[int] = []

    async def soak(index: int) -> None:
        run = tmp_path / f"soak-{index}"
        try:
            await asyncsoak.run_soak(
                command=["sleep", "120"],
                progress_dir=run / "progress",
                output_path=run / "soak.json",
                sample_interval_seconds=0.5,
                startup_timeout_seconds=100.0,
                nvidia_smi=None,
                forensics=False,
                control=controls[index],
            )
        except anyio.get_cancelled_exc_class():
            cancelled.append(index)
            raise

    with anyio.fail_after(110):
        async with anyio.create_task_group() as tg:
            for index in range(64):
                tg.start_soon(soak, index)
            for control in controls:
                await control.started.wait()
            tg.cancel_scope.cancel()

    assert sorted(cancelled) == list(range(64))
    for index in range(64):
        results[index] = json.loads((tmp_path / f"soak-{index}" / "soak.json").read_text())
    for artifact in results.values():
        assert artifact["status"] == "cancelled"
        assert artifact["stop"]["cause"] == "cancelled"
        assert artifact["stop"]["killed"] is False
        assert [s["signal"] for s in artifact["stop"]["signals"]] == ["SIGTERM"]
        kinds = _kinds(artifact)
        assert kinds.index("stop") < kinds.index("tree_gone") < kinds.index("finished")
    sigterms = [_wall(a, a["stop"]["signals"][0]["t"]) for a in results.values()]
    first_finished = min(_wall(a, a["duration_seconds"]) for a in results.values())
    assert max(sigterms) < first_finished


def _wall(artifact: Mapping[str, Any], t: float) -> float:
    """A time of the soak's clock (seconds since its start) as a POSIX timestamp."""
    started = datetime.fromisoformat(artifact["started_at"].replace("Z", "+00:00"))
    return started.timestamp() + t
