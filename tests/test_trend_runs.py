"""Trends and budgets on real children of known ground truth: leaks, ramps, sawtooths, steps,
shared pages, open files, a GPU whose per-process memory grows, budgets, crash causes, stalls.

Every child is short (a few seconds at a 0.05 s interval) and allocates with ``bytearray``, whose
pages are written at once, so its RSS is what it keeps.  Chunks of 40 MiB are above glibc's
largest mmap threshold, so freeing one really returns it to the kernel.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from jsonschema import Draft202012Validator

from asyncsoak import SoakFailureError, run_soak
from asyncsoak._contract import EventSink, events
from asyncsoak._record._artifact import RunState
from asyncsoak._supervisor._config import SoakConfig
from asyncsoak._supervisor._judge import RunJudge
from asyncsoak.artifact import KNOWN_SCHEMA_VERSIONS

from .conftest import assert_valid, asyncsoak_cli, asyncsoak_main, fast_limits, journal, py
from .gpu_support import install_fake_nvidia_smi

MiB = 2**20

PRELUDE = """
import os, pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
keep = []
def tick(n=1, pause=0.05):
    for _ in range(n):
        with open(progress / "metrics.txt", "a") as f:
            f.write("step\\n")
        time.sleep(pause)
def chunk(mib):
    return bytearray(mib * 2**20)
"""


def child(tmp_path: Path, body: str) -> list[str]:
    return [*py(PRELUDE + body), str(tmp_path / "progress")]


def limits(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    return fast_limits(tmp_path, sample_interval_seconds=0.05, **overrides)


async def soak(**kwargs: Any) -> Mapping[str, Any]:
    with anyio.fail_after(60):
        return await run_soak(**kwargs)


async def soak_failure(**kwargs: Any) -> SoakFailureError:
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(**kwargs)
    return info.value


def memory_warnings(artifact: Mapping[str, Any]) -> list[str]:
    return [w for w in artifact["warnings"] if "memory" in w]


LEAKER = "keep.append(chunk(100))\nfor i in range(60):\n    keep.append(chunk(6)); tick()\n"
#: 120 MiB/s paced by the clock, not by the ticks: a straight leak however loaded the machine
#: (LEAKER's ticks, slowed by a busy machine late in the run, read as a ramp that levels off).
CLOCKED_LEAKER = """keep.append(chunk(100))
start, held = time.monotonic(), 0
for i in range(60):
    due = int((time.monotonic() - start) * 120)
    keep.append(chunk(due - held))
    held = due
    tick()
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_leaking_process_is_named_with_its_slope(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """6 MiB per 50 ms tick: a warning naming the child's pid, a trend event, a leak verdict."""
    artifact = await soak(command=child(tmp_path, LEAKER), **limits(tmp_path))
    assert_valid(artifact, schema)
    assert artifact["status"] == "passed"
    pid = artifact["exit"]["pid"]
    entry = artifact["trends"][f"process.{pid}.anon_bytes"]
    assert entry["verdict"] == "leak", entry
    assert entry["pid"] == pid
    assert entry["name"].startswith("python")
    # At most 6 MiB per 50 ms (the ticks take longer than their sleep), and clearly rising.
    lo, hi = entry["slope_interval_per_hour"]
    assert 10 * MiB * 3600 < lo <= entry["slope_per_hour"] <= hi
    assert entry["slope_per_hour"] < 120 * MiB * 3600
    assert entry["growth"] > 64 * MiB
    # The machine's, or the limit of the memory cgroup the tests run in (tests/test_limits.py).
    assert entry["limit_source"].startswith(("machine memory", "cgroup memory."))
    assert entry["projected_seconds_to_limit"] > 0
    grew = [w for w in artifact["warnings"] if " grew " in w]
    assert len(grew) == 1
    assert grew[0].startswith(f"memory of pid {pid} (python")
    assert any(w.startswith(f"memory of pid {pid} (python") and " will reach " in w for w in
               artifact["warnings"])  # fmt: skip
    # The process explains the tree's growth: no second warning for the tree itself.
    assert not any(w.startswith("tree memory grew") for w in artifact["warnings"])
    events = [e for e in journal(tmp_path / "out" / "soak.jsonl") if e["kind"] == "trend"]
    assert events[0]["series"] == f"process.{pid}.anon_bytes"
    assert events[0]["verdict"] == "leak"
    assert events[0]["t"] < artifact["duration_seconds"]
    top = artifact["processes"][0]
    assert top["pid"] == pid
    assert top["first_rss_bytes"] < top["peak_rss_bytes"]
    assert top["peak_rss_bytes"] > 300 * MiB
    # The trends are a fold of the journal: a dead monitor's journal gives the same verdicts.
    builder = RunState()
    for event in journal(tmp_path / "out" / "soak.jsonl"):
        builder.add(event)
    rebuilt = builder.build(
        status="passed", ended_t=artifact["duration_seconds"], log_tail="", monitor={}
    )
    assert {k: v["verdict"] for k, v in rebuilt["trends"].items()} == {
        k: v["verdict"] for k, v in artifact["trends"].items()
    }


@pytest.mark.slow
@pytest.mark.asyncio
async def test_leak_check_fail_stops_the_tree_as_soon_as_it_is_confident(tmp_path: Path) -> None:
    """The leaker would run 15 s; leak_check="fail" stops it within seconds: memory_leak."""
    body = "keep.append(chunk(100))\nfor i in range(300):\n    keep.append(chunk(6)); tick()\n"
    error = await soak_failure(command=child(tmp_path, body), leak_check="fail", **limits(tmp_path))
    assert error.reason == "memory_leak"
    assert "(leak_check=fail)" in error.failures[0]["message"]
    assert error.artifact["stop"]["cause"] == "failure"
    assert error.artifact["duration_seconds"] < 12


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_sawtooth_that_frees_what_it_allocates_raises_no_leak(tmp_path: Path) -> None:
    """Training that frees what it allocates (40 MiB chunks, returned to the kernel for real)
    gives no leak warning and no leak verdict.  (The warm-up ramp and the one-time allocation
    are judged on their series: ``test_stable_shapes_replayed_raise_no_leak``.)"""
    body = (
        "for cycle in range(6):\n"
        "    for i in range(4):\n        keep.append(chunk(40)); tick()\n"
        "    keep.clear(); tick(4)\n"
    )
    artifact = await soak(command=child(tmp_path, body), **limits(tmp_path))
    assert memory_warnings(artifact) == []
    pid = artifact["exit"]["pid"]
    verdicts = {k: v["verdict"] for k, v in artifact["trends"].items() if "anon" in k}
    assert verdicts[f"process.{pid}.anon_bytes"] != "leak", artifact["trends"]
    assert "leak" not in verdicts.values()


# -- the judge on recorded series: the rules are pure, no process needed ----------------------

#: The interval of the replays, and how long a child's ``tick()`` takes in the real runs.
INTERVAL = 0.05
TICK = 0.055
PID = 4242


class Replay:
    """A run's samples replayed through the judge as the soak runs it: each event folded in
    order, the trend rule run on each sample and what it returns folded back, and the trends
    judged once more at the end (the sink's clock is the replayed event's)."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.cfg = SoakConfig(
            command=("python",),
            progress_dir=tmp_path / "progress",
            output_path=tmp_path / "soak.json",
            sample_interval_seconds=INTERVAL,
            **settings,
        )
        self.builder = RunState()
        config = self.cfg.effective()
        self.builder.add(
            {"t": 0.0, "kind": "header", "config": config, "started_at": "2026-01-01T00:00:00Z"}
        )
        self.t = 0.0
        self.emitted: list[dict[str, Any]] = []
        self.judge = RunJudge(self.cfg, self.builder, ended=lambda: False)

    def elapsed(self) -> float:
        return self.t

    async def emit(self, event: events.Event) -> None:
        data = dict(events.event_to_json(event))
        self.emitted.append(data)
        self.builder.add(data)

    async def sample(self, t: float, anon: int) -> None:
        """One sample of a tree of one process whose anonymous memory is ``anon``."""
        self.t = t
        process = {"pid": PID, "name": "python", "state": "sleeping", "anon_bytes": anon}
        process["rss_bytes"] = anon + 10 * MiB
        tree = {"processes": 1, "anon_bytes": anon, "rss_bytes": anon + 10 * MiB, "fds": 5}
        sample = {"t": t, "kind": "sample", "root_pid": PID, "tree": tree, "processes": [process]}
        self.builder.add(sample)
        for event in self.judge.trend_rule(self.builder, cast(events.EventJson, sample)):
            await self.emit(event)

    async def run(self, memory: list[int]) -> dict[str, Any]:
        """Replay ``memory`` (MiB of the process, one figure per tick); the artifact."""
        for i, mib in enumerate(memory):
            # A little noise, as a real process's pages give.
            await self.sample(round(i * TICK, 3), mib * MiB + (i % 7) * 64 * 1024)
        await self.judge.judge_final(cast(EventSink, self))
        return self.builder.build(status="passed", ended_t=self.t, log_tail="", monitor={})


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("shape", "memory"),
    [
        # The real runs' ticks: 8 chunks of 40 MiB then 60 ticks; 40 ticks, 400 MiB, 40 ticks.
        ("warm-up ramp that plateaus", [30 + 40 * min(i, 8) for i in range(68)]),
        ("one-time large allocation", [30 + (400 if i >= 40 else 0) for i in range(80)]),
    ],
)
async def test_stable_shapes_replayed_raise_no_leak(
    tmp_path: Path, shape: str, memory: list[int]
) -> None:
    """What training does without leaking gives no leak warning, no leak call and no leak
    verdict (the sawtooth, which needs memory really given back, runs for real above)."""
    replay = Replay(tmp_path)
    artifact = await replay.run(memory)
    assert memory_warnings(artifact) == [], shape
    assert [e for e in replay.emitted if e["kind"] == "trend"] == [], shape
    verdicts = {k: v["verdict"] for k, v in artifact["trends"].items() if "anon" in k}
    assert f"process.{PID}.anon_bytes" in verdicts, shape
    assert "leak" not in verdicts.values(), (shape, artifact["trends"])


FORKED = """
keep.append(chunk(300))
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        time.sleep(3.0)
        os._exit(0)
    pids.append(pid)
tick(50)
for pid in pids:
    os.waitpid(pid, 0)
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_forked_workers_sharing_pages_count_once_with_detailed_memory(
    tmp_path: Path,
) -> None:
    """Four processes share 300 MiB: summed RSS is ~1.2 GiB, PSS ~300 MiB.  A 700 MiB budget
    fails on RSS and passes on PSS (--detailed-memory); the per-process table lists all four."""
    error = await soak_failure(
        command=child(tmp_path, FORKED), max_rss_bytes="700MiB", **limits(tmp_path)
    )
    assert error.reason == "memory_budget"
    assert error.failures[0]["message"].startswith("tree memory (anonymous + shared) ")
    assert "above max_rss_bytes (700.0 MiB)" in error.failures[0]["message"]

    other = tmp_path / "pss"
    artifact = await soak(
        command=child(other, FORKED),
        max_rss_bytes="700MiB",
        detailed_memory=True,
        **limits(other),
    )
    assert artifact["status"] == "passed"
    assert "tree.anon_pss_bytes" in artifact["trends"]
    tree = artifact["series"]["tree"]
    assert max(v for v in tree["pss_bytes"] if v) < 0.6 * max(v for v in tree["rss_bytes"] if v)
    big = [p for p in artifact["processes"] if p["peak_rss_bytes"] > 250 * MiB]
    assert len(big) == 4


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_growing_number_of_open_files_is_a_leak(tmp_path: Path) -> None:
    body = (
        "files = []\n"
        "for i in range(70):\n    files += [open(os.devnull) for _ in range(4)]\n    tick()\n"
    )
    artifact = await soak(command=child(tmp_path, body), **limits(tmp_path))
    assert artifact["trends"]["tree.fds"]["verdict"] == "leak"
    assert any(w.startswith("open files of the tree grew ") for w in artifact["warnings"])


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_gpu_process_whose_memory_grows_is_named(tmp_path: Path) -> None:
    """The fake nvidia-smi's process memory grows 2 GiB/s: the child's GPU memory leaks."""
    pid_file = tmp_path / "gpu.pid"
    fake = install_fake_nvidia_smi(tmp_path, pid_file=pid_file, grow_mib_per_s=2048)
    body = f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\ntick(70)\n"
    artifact = await soak(
        command=child(tmp_path, body), **limits(tmp_path, nvidia_smi=str(fake.path))
    )
    pid = artifact["exit"]["pid"]
    entry = artifact["trends"][f"process.{pid}.gpu_memory_bytes"]
    assert entry["verdict"] == "leak", entry
    assert entry["limit_source"] == "GPU memory"
    assert artifact["trends"]["gpu0.memory_used_bytes"]["verdict"] == "leak"
    assert any(w.startswith(f"GPU memory of pid {pid} (") for w in artifact["warnings"])
    assert artifact["processes"][0]["peak_gpu_memory_bytes"] > 21000 * MiB


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("given_back", [True, False])
async def test_gpu_memory_the_tree_did_not_give_back_is_a_warning(
    tmp_path: Path, given_back: bool
) -> None:
    """The child holds GPU memory, then exits.  When nvidia-smi still lists it holding memory
    once the tree is gone (a context nobody freed), the artifact warns; when the GPU lists no
    process of the tree any more, it does not."""
    pid_file = tmp_path / "gpu.pid"
    fake = install_fake_nvidia_smi(tmp_path, pid_file=pid_file)
    body = f"pid_file = pathlib.Path({str(pid_file)!r})\npid_file.write_text(str(os.getpid()))\n"
    body += "tick(40)\n" + ("pid_file.unlink()\n" if given_back else "")
    artifact = await soak(
        command=child(tmp_path, body), **limits(tmp_path, nvidia_smi=str(fake.path))
    )
    pid = artifact["exit"]["pid"]
    assert artifact["status"] == "passed"
    kept = [w for w in artifact["warnings"] if "GPU memory not given back" in w]
    if given_back:
        assert kept == []
    else:
        assert len(kept) == 1, artifact["warnings"]
        assert kept[0].startswith(f"GPU 0 still lists pid {pid} (")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gpu_readings_stamped_in_whole_seconds_leave_every_soak_judged(
    tmp_path: Path,
) -> None:
    """nvidia-smi stamping its lines in whole seconds, sampled every 0.1 s, the trainer on the
    GPU: ten iterations share a stamp.  Three 12 s soaks at once all end judged (``passed``),
    none ``error`` (an estimator's exception at the first evaluation after the warm-up), and
    the trainer's GPU memory is counted once, not once per iteration sharing a stamp."""
    results: dict[int, Mapping[str, Any]] = {}

    async def one(n: int) -> None:
        base = tmp_path / str(n)
        pid_file = base / "gpu.pid"
        fake = install_fake_nvidia_smi(base, pid_file=pid_file, whole_seconds=True)
        body = f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        body += "end = time.monotonic() + 12\nwhile time.monotonic() < end:\n    tick(pause=0.1)\n"
        kwargs = fast_limits(base, nvidia_smi=str(fake.path))
        try:
            results[n] = await run_soak(command=child(base, body), **kwargs)
        except SoakFailureError as error:  # the status is asserted below, for all three
            results[n] = error.artifact

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(one, n)
    for artifact in results.values():
        assert artifact["status"] == "passed", artifact["failures"]
        gpu = artifact["summary"]["gpu_tree"]["tree_gpu_memory_mib"]
        assert gpu["max"] == 21354
        assert not any(e["sampler"] == "judge" for e in artifact["events"] if "sampler" in e)


#: A trainer writing its step and loss, 40 steps 0.05 s apart.
STEPS = """
for step in range(40):
    with open(progress / "train.jsonl", "a") as f:
        f.write(f'{{"step": {step}, "loss": 1.0}}\\n')
    time.sleep(0.05)
"""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("broken", "body", "reason", "sampler"),
    [
        ("asyncsoak._analysis._trendwatch.estimate_trend", "tick(40)", None, "judge"),
        (
            "asyncsoak._supervisor._judge.budget_breach",
            "tick(30)\ntime.sleep(30)",
            "stale_progress",
            "judge",
        ),
        (
            "asyncsoak._analysis._trendwatch.TrendWatch.activity",
            "tick(30)\ntime.sleep(30)",
            "stale_progress",
            "judge",
        ),
        ("asyncsoak._sampling._step_rules.StepTracker._check_loss", STEPS, None, "steps"),
        ("asyncsoak._sampling._gpu_health.GpuHealthWatch.readings", "tick(40)", None, "gpu"),
    ],
)
async def test_a_rule_or_estimator_that_raises_is_a_note_and_the_run_is_judged(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
    body: str,
    reason: str | None,
    sampler: str,
) -> None:
    """An unexpected exception in the trend estimator, the budget rule, a stall's activity, a
    step rule or the GPU health rules: a sampler note naming it, and the soak judged by
    everything else (a healthy run passes, a stall still fails)."""

    def raises(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(broken, raises)
    smi = install_fake_nvidia_smi(tmp_path)
    kwargs = limits(tmp_path, stale_progress_seconds=1.0, nvidia_smi=str(smi.path))
    if reason is None:
        artifact = await soak(command=child(tmp_path, body), **kwargs)
        assert artifact["status"] == "passed"
    else:
        error = await soak_failure(command=child(tmp_path, body), **kwargs)
        assert error.reason == reason
        artifact = error.artifact
    told = artifact["monitor"]["sampler_notes"]
    notes = [n for n in told if n["sampler"] == sampler and " raised " in n["message"]]
    assert notes, told
    assert all("raised RuntimeError: injected" in n["message"] for n in notes)
    assert len({n["message"] for n in notes}) == len(notes)  # each told once


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_gpu_memory_budget_stops_the_tree(tmp_path: Path) -> None:
    """The captured process holds 21354 MiB; a 20 GiB budget fails the soak: memory_budget."""
    pid_file = tmp_path / "gpu.pid"
    fake = install_fake_nvidia_smi(tmp_path, pid_file=pid_file)
    body = f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\ntick(400)\n"
    error = await soak_failure(
        command=child(tmp_path, body),
        max_gpu_memory_bytes="20GiB",
        **limits(tmp_path, nvidia_smi=str(fake.path)),
    )
    assert error.reason == "memory_budget"
    assert "GPU memory 20.9 GiB is above max_gpu_memory_bytes (20.0 GiB)" in str(error)
    assert error.artifact["duration_seconds"] < 15


@pytest.mark.slow
@pytest.mark.asyncio
async def test_too_little_free_disk_fails_disk_low(tmp_path: Path) -> None:
    error = await soak_failure(
        command=child(tmp_path, "tick(400)\n"), min_disk_free_bytes="1000TiB", **limits(tmp_path)
    )
    assert error.reason == "disk_low"
    assert "below min_disk_free_bytes (1000.0 TiB)" in error.failures[0]["message"]
    assert error.artifact["duration_seconds"] < 15


CRASHER = """\
import pathlib, sys
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)

def on_step_end(step):
    (progress / "metrics.txt").write_text(str(step))
    if step == 200:
        raise RuntimeError(f"injected crash at step {step}")

for step in range(1000):
    on_step_end(step)
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_crash_names_its_exception_and_raising_frame(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    script = tmp_path / "hf_train.py"
    script.write_text(CRASHER)
    error = await soak_failure(
        command=[py("")[0], str(script), str(tmp_path / "progress")], **limits(tmp_path)
    )
    assert error.reason == "nonzero_exit"
    assert error.failures[0]["message"] == (
        "the command exited with status 1: RuntimeError: injected crash at step 200 (hf_train.py:8)"
    )
    assert error.artifact["exit"]["exception"] == {
        "type": "RuntimeError",
        "message": "injected crash at step 200",
        "where": "hf_train.py:8",
        "kind": "python",
    }
    assert_valid(error.artifact, schema)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_shells_killed_is_the_cause(tmp_path: Path) -> None:
    """A wrapper script whose trainer was SIGKILLed (the OOM killer's signal) says Killed."""
    inner = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    command = ["sh", "-c", f'{py("")[0]} -c "{inner}"; exit 137']
    error = await soak_failure(command=command, **limits(tmp_path))
    assert error.reason == "nonzero_exit"
    assert error.artifact["exit"]["exception"]["kind"] == "killed"
    assert "status 137: Killed" in error.failures[0]["message"]


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "activity"),
    [
        ("tick()\ntime.sleep(30)\n", "idle ("),
        (
            "tick()\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n",
            "busy (",
        ),
    ],
)
async def test_a_stall_says_whether_the_tree_was_busy_or_idle(
    tmp_path: Path, body: str, activity: str
) -> None:
    error = await soak_failure(
        command=child(tmp_path, body),
        **limits(tmp_path, stale_progress_seconds=1.5, forensics=False),
    )
    assert error.reason == "stale_progress"
    assert f"; the tree was {activity}" in error.failures[0]["message"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_progress_that_slows_down_is_a_warning(tmp_path: Path) -> None:
    """Fast for 1.5 s, then an eighth of the pace for 3 s: "progress slowing", with figures."""
    body = "tick(30)\ntick(8, pause=0.4)\n"
    artifact = await soak(command=child(tmp_path, body), **limits(tmp_path))
    assert artifact["trends"]["progress.changes_per_minute"]["verdict"] == "slowing"
    assert any(w.startswith("progress slowing: ") for w in artifact["warnings"])
    rate = artifact["series"]["progress_rate"]
    assert max(rate["changes_per_minute"]) > 5 * min(rate["changes_per_minute"])
    assert max(rate["bytes_per_minute"]) > 0


def test_version_1_artifacts_still_validate(schema: Draft202012Validator) -> None:
    """Schema 2 requires trends and processes; an artifact written as version 1 needs neither."""
    assert KNOWN_SCHEMA_VERSIONS == (1, 2)
    v1 = {
        "schema_version": 1,
        "status": "passed",
        "failures": [],
        "warnings": [],
        "command": ["x"],
        "cwd": "/",
        "config": {
            "progress_dir": "/p",
            "output_path": "/o.json",
            "sample_interval_seconds": 1,
            "startup_timeout_seconds": 1,
            "stale_progress_seconds": 1,
            "post_shutdown_grace_seconds": 1,
            "min_duration_seconds": 0,
        },
        "metadata": {},
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:00:01Z",
        "duration_seconds": 1,
        "exit": {"returncode": 0, "signal": None, "pid": 1},
        "snapshot": {},
        "progress": {
            "dir": "/p",
            "first_change_at": None,
            "last_change_at": None,
            "changes": 0,
            "longest_gap_seconds": 0,
        },
        "series": {},
        "summary": {},
        "events": [],
        "leftover_processes": [],
        "log": {"path": None, "tail": ""},
        "monitor": {"journal_path": None},
    }
    assert_valid(v1, schema)
    assert list(schema.iter_errors({**v1, "schema_version": 2}))


# -- the command line -----------------------------------------------------------------------


def run_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--progress-dir",
        str(tmp_path / "progress"),
        "--output",
        str(tmp_path / "soak.json"),
        "--sample-interval",
        "0.05",
        "--no-gpu",
        "--quiet",
        *extra,
    ]


@pytest.mark.slow
def test_a_passed_soak_with_a_leak_ends_with_the_warning(tmp_path: Path) -> None:
    result = asyncsoak_cli(
        *run_args(tmp_path), "--", *child(tmp_path, CLOCKED_LEAKER), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    last = result.stderr.splitlines()[-1]
    artifact = json.loads((tmp_path / "soak.json").read_text())
    pid = artifact["exit"]["pid"]
    count = len(artifact["warnings"])
    plural = "s" if count != 1 else ""
    assert last.startswith(
        f"asyncsoak: soak passed with {count} warning{plural}: memory of pid {pid} (python"
    )
    assert " grew " in last.split(";")[0]  # the leak first, then the projected breach
    assert last.endswith(f"; artifact: {tmp_path / 'soak.json'}")


@pytest.mark.slow
def test_a_crash_shows_on_stderr(tmp_path: Path) -> None:
    script = tmp_path / "hf_train.py"
    script.write_text(CRASHER)
    result = asyncsoak_cli(
        *run_args(tmp_path), "--", py("")[0], str(script), str(tmp_path / "progress"), cwd=tmp_path
    )
    assert result.returncode == 1
    assert (
        "asyncsoak: soak failed: nonzero_exit: the command exited with status 1: "
        "RuntimeError: injected crash at step 200 (hf_train.py:8)"
    ) in result.stderr.splitlines()


@pytest.mark.parametrize(
    "bad",
    [
        ["--max-rss", "-1G"],
        ["--max-rss", "nan"],
        ["--max-rss", "5XB"],
        ["--max-gpu-memory", "lots"],
        ["--min-disk-free", "-5"],
        ["--warm-up", "-1"],
        ["--warm-up", "nan"],
        ["--leak-check", "maybe"],
    ],
)
def test_bad_trend_flags_exit_2_and_launch_nothing(tmp_path: Path, bad: list[str]) -> None:
    marker = tmp_path / "launched"
    argv = py(f"open({str(marker)!r}, 'w')")
    result = asyncsoak_main(*run_args(tmp_path, *bad), "--", *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert bad[0].lstrip("-").split("-")[0] in result.stderr.lower().replace("_", "-")
    assert not marker.exists()
    assert not (tmp_path / "soak.json").exists()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "bad",
    [
        {"max_rss_bytes": -1},
        {"max_rss_bytes": float("nan")},
        {"max_rss_bytes": "2 furlongs"},
        {"max_gpu_memory_bytes": "-3GiB"},
        {"min_disk_free_bytes": True},
        {"warm_up_seconds": -5},
        {"warm_up_seconds": float("nan")},
        {"leak_check": "maybe"},
    ],
)
async def test_bad_trend_keywords_raise_before_anything_starts(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    from asyncsoak._contract._errors import ValidationError

    marker = tmp_path / "launched"
    with pytest.raises(ValidationError):
        await run_soak(command=py(f"open({str(marker)!r}, 'w')"), **limits(tmp_path), **bad)
    assert not marker.exists()
    assert not (tmp_path / "out" / "soak.json").exists()
    assert not os.path.exists(tmp_path / "out" / "soak.jsonl")


#: Flat for 80 ticks (4 s), a leak of 6 MiB per tick for 100 ticks (5 s), then flat for 200
#: ticks (10 s): a leak the live judgement calls while it runs, and which has stopped by the end.
LEAK_THAT_STOPS = [30 + 6 * min(max(i - 80, 0), 100) for i in range(380)]


@pytest.mark.asyncio
async def test_a_live_leak_call_that_stopped_is_withdrawn_and_kept_as_a_warning(
    tmp_path: Path,
) -> None:
    """One verdict: the live judgement called the leak (the live view said LEAK), then the
    rise stopped and the call was withdrawn (a ``trend`` event, and the series' ``live``
    entry); it was held longer than the transient, so the artifact keeps it as a warning."""
    replay = Replay(tmp_path)
    artifact = await replay.run(LEAK_THAT_STOPS)
    assert artifact["status"] == "passed"
    assert replay.builder.failures == []
    series = f"process.{PID}.anon_bytes"
    calls = [e for e in artifact["events"] if e["kind"] == "trend" and e["series"] == series]
    assert [e["verdict"] for e in calls][:1] == ["leak"]
    assert "withdrawn" in [e["verdict"] for e in calls]
    entry = artifact["trends"][series]
    assert entry["verdict"] != "leak", entry
    live = entry["live"]
    assert live is not None
    assert 80 * TICK < live["first_seen"] < live["withdrawn"]
    withdrawn = [w for w in artifact["warnings"] if "the rise called a leak" in w]
    assert len(withdrawn) == 1, artifact["warnings"]
    assert withdrawn[0].startswith(f"memory of pid {PID} (")
    assert "longer than a transient" in withdrawn[0]


@pytest.mark.asyncio
async def test_the_ends_leak_failure_is_handed_to_the_soaks_status(tmp_path: Path) -> None:
    """Under leak_check="fail", a leak the live judgement never saw (its samples folded
    without the rule, as when the run ended first) is the end's failure, and judge_final
    hands its reason back: the soak's status counts it even if its fold comes late."""
    replay = Replay(tmp_path, leak_check="fail")
    for i in range(120):
        replay.t = round(i * TICK, 3)
        anon = (30 + 4 * i) * MiB
        process = {"pid": PID, "name": "python", "state": "sleeping", "anon_bytes": anon}
        tree = {"processes": 1, "anon_bytes": anon, "rss_bytes": anon, "fds": 5}
        replay.builder.add(
            {"t": replay.t, "kind": "sample", "root_pid": PID, "tree": tree, "processes": [process]}
        )
    assert await replay.judge.judge_final(cast(EventSink, replay)) == ["memory_leak"]
    assert [f["reason"] for f in replay.builder.failures] == ["memory_leak"]


def test_the_budget_rule_fails_the_run_once_on_the_sample_over_budget(tmp_path: Path) -> None:
    """The budget rule, fed a recorded stream through the run's state: silent within the
    budget, one ``memory_budget`` failure for the first sample over it, and nothing after
    (the failure, folded, is the run's end)."""
    replay = Replay(tmp_path, max_rss_bytes=100 * MiB)
    found: list[list[dict[str, Any]]] = []
    for t, anon in ((0.05, 50 * MiB), (0.10, 120 * MiB), (0.15, 130 * MiB)):
        tree = {"processes": 1, "anon_bytes": anon, "rss_bytes": anon, "fds": 5}
        sample = {"t": t, "kind": "sample", "root_pid": PID, "tree": tree, "processes": []}
        replay.builder.add(sample)
        judged = [
            dict(events.event_to_json(e)) for e in replay.judge.budget_rule(replay.builder, sample)
        ]
        for event in judged:
            replay.builder.add(event)
        found.append(judged)
    assert [len(judged) for judged in found] == [0, 1, 0]
    [failure] = found[1]
    assert failure["reason"] == "memory_budget"
    assert failure["t"] == 0.10
    assert "above max_rss_bytes" in failure["message"]
    assert replay.builder.failures[0]["reason"] == "memory_budget"
