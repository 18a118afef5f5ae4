"""The run's rules as pure functions: feed a state events, assert the events the rules return."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from asyncsoak._contract import events
from asyncsoak._record import RunState
from asyncsoak._supervisor._config import SoakConfig
from asyncsoak._supervisor._judge import (
    Finding,
    RunJudge,
    broken_rule,
    gpu_fault_rule,
    trend_due,
    trend_events,
)

MiB = 1024 * 1024


def as_json(event: events.Event) -> dict[str, Any]:
    """An event's JSON form, read as a plain mapping."""
    return dict(events.event_to_json(event))


def state_of(*events: dict[str, Any], config: dict[str, Any] | None = None) -> RunState:
    state = RunState()
    header = {"t": 0.0, "kind": "header", "started_at": "2026-01-01T00:00:00Z"}
    state.add({**header, "config": config or {}})
    for event in events:
        state.add(event)
    return state


def fault(**fields: Any) -> events.EventJson:
    base = {"t": 3.0, "kind": "gpu_fault", "fault": "xid", "gpu": 0, "uuid": "GPU-a"}
    return {**base, "bus_id": "0:1", "message": "Xid 79 on GPU 0", **fields}  # type: ignore[return-value]


def test_a_failing_fault_on_a_used_gpu_is_the_gpu_fault_failure() -> None:
    found = gpu_fault_rule(state_of(), fault(fails=True, used=True))
    assert [type(e) for e in found] == [events.FailureEvent]
    failure = as_json(found[0])
    assert failure["reason"] == "gpu_fault"
    assert failure["message"] == "Xid 79 on GPU 0"
    assert failure["gpu"] == {"index": 0, "uuid": "GPU-a", "bus_id": "0:1"}
    assert failure["at"] == "2026-01-01T00:00:03.000Z"


def test_a_fault_that_fails_is_the_failure_even_when_the_run_has_exited() -> None:
    """The trainer the fault killed exits before the kernel log is read."""
    exited = {"t": 2.0, "kind": "exited", "returncode": 1, "signal": None, "pid": 9}
    found = gpu_fault_rule(state_of(exited), fault(fails=True, used=True))
    assert [as_json(e)["reason"] for e in found] == ["gpu_fault"]


def test_other_faults_are_warnings() -> None:
    unused = gpu_fault_rule(state_of(), fault(fails=True, used=False))
    assert unused == [
        events.WarningEvent(t=3.0, message="Xid 79 on GPU 0 (on a GPU this run does not use)")
    ]
    mild = gpu_fault_rule(state_of(), fault(fails=False, used=True, message="Xid 13"))
    assert mild == [events.WarningEvent(t=3.0, message="Xid 13")]
    assert (
        gpu_fault_rule(state_of(), events.event_to_json(events.WarningEvent(t=1.0, message="x")))
        == []
    )


def test_the_budget_rule_fails_the_first_sample_over_max_rss(tmp_path: Path) -> None:
    cfg = SoakConfig(
        command=("python",),
        progress_dir=tmp_path,
        output_path=tmp_path / "soak.json",
        max_rss_bytes=100 * MiB,
    )
    state = state_of(config=cfg.effective())
    judge = RunJudge(cfg, state, ended=lambda: False)

    def sample(t: float, anon: int) -> list[Any]:
        tree = {"processes": 1, "anon_bytes": anon, "rss_bytes": anon, "fds": 5}
        event = {"t": t, "kind": "sample", "root_pid": 7, "tree": tree, "processes": []}
        state.add(event)
        found = judge.budget_rule(state, event)
        for e in found:
            state.add(as_json(e))
        return found

    assert sample(1.0, 50 * MiB) == []
    (failure,) = sample(2.0, 150 * MiB)
    assert failure.reason == "memory_budget"
    assert "above max_rss_bytes (100.0 MiB)" in failure.message
    assert sample(3.0, 200 * MiB) == []  # the first failure is the run's end


def broken(reason: str, message: str = "no progress for 2s", t: float = 5.0) -> dict[str, Any]:
    return {"t": t, "kind": "rule_broken", "reason": reason, "message": message}


def test_a_blind_sampler_is_a_monitor_error_unless_the_run_has_ended() -> None:
    """A soak that cannot sample fails closed: it never passes blind."""
    event = broken("monitor_error", "the proc sampler had no sample")
    state = state_of(event)
    [failure] = broken_rule(state, event, ended=False, forensics=True)  # type: ignore[arg-type]
    assert as_json(failure)["reason"] == "monitor_error"
    assert as_json(failure)["message"] == "the proc sampler had no sample"
    assert broken_rule(state, event, ended=True, forensics=True) == []  # type: ignore[arg-type]


def test_a_stall_fails_once_its_forensics_are_folded_culprit_first_label_agreeing() -> None:
    """The rank the others wait for leads the message; a busy label the dump (every process
    asleep) contradicts is withdrawn, so the cause line never says busy beside idle."""
    event = broken("stale_progress")
    state = state_of(event)
    assert broken_rule(state, event, ended=False, forensics=True) == []  # type: ignore[arg-type]
    state.broken_activity = {"tree": "busy", "cpu_percent": 99.0, "running_share": 1.0}
    data = {"processes": [{"pid": 7, "state": "sleeping"}], "ranks": {"text": "rank 1 is late"}}
    forensics = {"t": 8.0, "kind": "forensics", "reason": "stale_progress", "data": data}
    state.add(forensics)
    [failure] = broken_rule(state, forensics, ended=True, forensics=True)  # type: ignore[arg-type]
    told = as_json(failure)
    assert told["reason"] == "stale_progress"
    # Dated when the stall was found, not when its forensics (3 s of dumps) were folded.
    assert told["t"] == 5.0
    assert told["message"] == "rank 1 is late; no progress for 2s"
    assert told["activity"]["tree"] == "unknown"
    state.add(told)
    assert broken_rule(state, forensics, ended=True, forensics=True) == []  # type: ignore[arg-type]


def test_a_stall_without_forensics_fails_at_once_and_says_what_the_tree_did() -> None:
    event = broken("startup_timeout", "no progress within 1s")
    state = state_of(event)
    state.broken_activity = {"tree": "idle", "cpu_percent": 0.0, "running_share": 0.0}
    [failure] = broken_rule(state, event, ended=False, forensics=False)  # type: ignore[arg-type]
    told = as_json(failure)
    assert told["message"].startswith("no progress within 1s; the tree was ")
    assert told["activity"]["tree"] == "idle"


def config(tmp_path: Path, **settings: Any) -> SoakConfig:
    return SoakConfig(
        command=("python",),
        progress_dir=tmp_path,
        output_path=tmp_path / "soak.json",
        **{"sample_interval_seconds": 1.0, **settings},
    )


SERIES = "process.7.anon_bytes"
LEAK = {"label": "memory of pid 7", "slope_per_hour": 36.0, "growth": 9.0, "verdict": "leak"}
LEAK.update(projected_limit_at=None)


def told(
    cfg: SoakConfig, state: RunState, t: float, findings: list[Finding], *, final: bool = False
) -> list[events.Event]:
    """What the trend rule says at ``t`` given ``findings``, folded back into ``state``."""
    trends = {SERIES: {**LEAK, "verdict": "leak" if findings else "stable"}}
    found = trend_events(cfg, state, trends, findings, t, final=final)
    for event in found:
        state.add(as_json(event))
    return found


def test_a_leak_called_live_then_withdrawn_is_told_once_each_from_the_state(
    tmp_path: Path,
) -> None:
    """What was said before is the state's (the ``trend`` events folded): the leak is called
    once, withdrawn once when no longer found, and called for longer than a transient, the
    withdrawal is a warning too."""
    cfg = config(tmp_path)
    state = state_of(config=cfg.effective())
    leak = [Finding(SERIES, "leak", LEAK, "memory of pid 7 grew 9 B")]
    [called] = told(cfg, state, 10.0, leak)
    assert called == events.TrendFound(
        t=10.0,
        series=SERIES,
        verdict="leak",
        slope_per_hour=36.0,
        growth=9.0,
        projected_limit_at=None,
        message="memory of pid 7 grew 9 B",
    )
    assert told(cfg, state, 15.0, leak) == []
    withdrawn, warning = told(cfg, state, 100.0, [])
    assert as_json(withdrawn)["verdict"] == "withdrawn"
    message = "memory of pid 7: the rise called a leak 10.0s into the run stopped; called for 1m30s"
    assert as_json(withdrawn)["message"] == message
    assert warning == events.WarningEvent(
        t=100.0,
        message=f"{message}, longer than a transient: a leak that stopped, or a long warm-up",
    )
    assert told(cfg, state, 105.0, []) == []
    [again] = told(cfg, state, 110.0, leak)  # a leak again: called again
    assert as_json(again)["verdict"] == "leak"
    [final] = told(cfg, state, 120.0, leak, final=True)
    assert final == events.WarningEvent(
        t=120.0, message="memory of pid 7 grew 9 B (first seen 1m50s into the run)"
    )


def test_leak_check_fail_makes_the_first_leak_call_the_memory_leak_failure(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, leak_check="fail")
    state = state_of(config=cfg.effective())
    leak = [Finding(SERIES, "leak", LEAK, "memory of pid 7 grew 9 B")]
    called, failure = told(cfg, state, 10.0, leak)
    assert as_json(called)["verdict"] == "leak"
    assert as_json(failure)["reason"] == "memory_leak"
    assert as_json(failure)["message"] == "memory of pid 7 grew 9 B (leak_check=fail)"
    assert as_json(failure)["at"] == "2026-01-01T00:00:10.000Z"
    assert told(cfg, state, 15.0, leak) == []
    assert [f["reason"] for f in state.failures] == ["memory_leak"]


def test_a_rank_falling_behind_is_told_once(tmp_path: Path) -> None:
    """Three ranks write progress; rank 2 stops: after a whole straggler window (20 intervals)
    behind, one warning, and none after."""
    cfg = config(tmp_path, sample_interval_seconds=0.1)
    state = state_of(config=cfg.effective())
    judge = RunJudge(cfg, state, ended=lambda: False)
    warnings: list[str] = []
    for i in range(1, 80):
        t = round(i * 0.1, 3)
        grown = {"0": 100, "1": 100, "2": 100 if i < 10 else 0}
        state.add({"t": t, "kind": "progress", "changed": 3, "rank_grown_bytes": grown})
        tree = {"processes": 1, "anon_bytes": MiB, "rss_bytes": MiB, "fds": 5}
        sample = {"t": t, "kind": "sample", "root_pid": 7, "tree": tree, "processes": []}
        state.add(sample)
        for event in judge.trend_rule(state, sample):  # type: ignore[arg-type]
            state.add(as_json(event))
            warnings += (
                [as_json(event)["message"]] if isinstance(event, events.WarningEvent) else []
            )
    [warning] = warnings
    assert warning.startswith("rank 2 is a straggler: its progress files grew ")


def test_the_trends_are_judged_every_period_then_every_fiftieth_of_the_run(
    tmp_path: Path,
) -> None:
    """Every five intervals early on; past 250 s at 1 s, 2 % of the run's age apart."""
    cfg = config(tmp_path)
    due = [t for t in range(1, 601) if trend_due(cfg, t - 1.0, float(t))]
    assert due[:3] == [5, 10, 15]
    late = [b - a for a, b in itertools.pairwise(due) if a > 500]
    assert late
    assert all(10 <= gap <= 13 for gap in late), late
