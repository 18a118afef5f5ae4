"""Real runs for the report, summary and live tests: soaks through the CLI, and journals with
the sample lines the proc and GPU samplers write, added the way the samplers feed them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from asyncsoak import read_journal
from asyncsoak._contract._schema import Monitor
from asyncsoak._record._recover import artifact_from_journal

from .conftest import CLI_ENV, ReadyFifo, asyncsoak_cli, py
from .gpu_support import install_fake_nvidia_smi

#: A trainer that computes (busy CPU, growing memory) and logs each step for a while, then
#: waits forever without writing (a stall: idle CPU, no progress).
STALLING_TRAINER = """
import pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(exist_ok=True)
activations = []
for step in range(12):
    until = time.monotonic() + 0.1
    while time.monotonic() < until:
        activations.append(bytearray(4096)) if len(activations) < 4000 else None
    with open(progress / "metrics.jsonl", "a") as f:
        f.write(f'{{"step": {step}, "loss": {1 / (step + 1):.3f}}}\\n')
    print(f"step {step} loss {1 / (step + 1):.3f}", flush=True)
print("waiting for the other ranks (all_reduce)...", flush=True)
time.sleep(60)
"""
PASSING_TRAINER = """
import pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(exist_ok=True)
seen = pathlib.Path(sys.argv[2])  # the fake nvidia-smi has printed its first GPU reading
deadline = time.monotonic() + 30
while not seen.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
for step in range(5):
    (progress / "metrics.jsonl").open("a").write(f"step {step}\\n")
    print(f"step {step}", flush=True)
    time.sleep(0.1)
print("done", flush=True)
"""


#: A trainer, run from a file (so tracebacks and py-spy name real lines), that logs its step
#: and loss, checkpoints every 4 steps into ``checkpoint-N/`` and then, by mode, halfway:
#: passes on, stalls waiting forever, crashes with a traceback, freezes its step while its
#: metrics file still grows, writes a NaN loss, or has its GPU fault (``$FAULT_FILE``, once the
#: fake nvidia-smi has read a healthy GPU); ``leak`` keeps 4 MiB alive per step ($LEAK_MIB in
#: any mode); $STEP_SECONDS between steps.
TRAINER = """
import json, os, pathlib, sys, time
mode, out, steps = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
leak_mib = int(os.environ.get("LEAK_MIB", "4" if mode == "leak" else "0"))
pause = float(os.environ.get("STEP_SECONDS", "0.05"))
if "GPU_PID_FILE" in os.environ:
    pathlib.Path(os.environ["GPU_PID_FILE"]).write_text(str(os.getpid()))
kept = []


def train_step(step):
    if leak_mib:
        kept.append(bytearray(b"x" * (leak_mib * 2**20)))
    if mode == "crash" and step == steps // 2:
        raise RuntimeError(f"injected crash at step {step}")


def wait_for_ranks():
    time.sleep(60)


def log(step, loss):
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": loss}) + "\\n")


def gpu_fault(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path + ".seen") and time.monotonic() < deadline:
        time.sleep(0.01)
    pathlib.Path(path).write_text("ecc")


for step in range(steps):
    train_step(step)
    half = step == steps // 2
    log(step, float("nan") if mode == "nan" and half else 2.0 / (step + 1))
    if step % 4 == 0:
        checkpoint = out / f"checkpoint-{step}"
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    print(f"step {step}", flush=True)
    time.sleep(pause)
    if half and mode == "stall":
        print("waiting for the other ranks (all_reduce)...", flush=True)
        wait_for_ranks()
    if half and mode == "frozen":
        for _ in range(1200):
            log(step, 2.0 / (step + 1))
            time.sleep(0.05)
    if half and mode == "gpu":
        gpu_fault(os.environ["FAULT_FILE"])
print("done", flush=True)
"""


def trainer_soak(
    base: Path,
    mode: str,
    steps: int = 16,
    extra: tuple[str, ...] = (),
    *,
    script: Path | None = None,
    env: str = "",
) -> Path:
    """A soak of :data:`TRAINER` in ``mode`` (pass, stall, crash, frozen, nan, gpu, leak); the
    artifact path.  ``gpu`` runs under the fake nvidia-smi, its GPU 0's ECC count rising.

    ``extra``: more options of ``asyncsoak run``; ``script``: where the trainer is (two runs
    of one script have the same command); ``env``: ``KEY=VALUE`` for the trainer.
    """
    base.mkdir(parents=True, exist_ok=True)
    script = script or base / "train.py"
    script.write_text(TRAINER)
    envs = [f"--env={pair}" for pair in (env,) if pair]
    args = run_args(base, "--stale-progress", "1.5", *extra)
    if mode == "gpu":
        fault, pid_file = base / "fault", base / "gpu.pid"
        fake = install_fake_nvidia_smi(base, pid_file=pid_file, fault_file=fault)
        args = [a for a in args if a != "--no-gpu"] + ["--nvidia-smi", str(fake.path)]
        envs += [f"--env=FAULT_FILE={fault}", f"--env=GPU_PID_FILE={pid_file}"]
    result = asyncsoak_cli(
        *args,
        *envs,
        "--",
        sys.executable,
        str(script),
        mode,
        "progress",
        str(steps),
        cwd=base,
    )
    assert result.returncode == (0 if mode in ("pass", "leak") else 1), result.stderr
    return base / "soak.json"


def run_args(base: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--progress-dir",
        str(base / "progress"),
        "--output",
        str(base / "soak.json"),
        "--sample-interval",
        "0.1",
        "--grace",
        "1",
        "--no-gpu",
        "--quiet",
        *extra,
    ]


def passing_soak(base: Path) -> Path:
    """A soak that passes, its two GPUs sampled through the fake nvidia-smi; the artifact path."""
    base.mkdir(parents=True, exist_ok=True)
    # The fault file is never written: its ".seen" says the GPUs were read, and the trainer
    # waits for it (a loaded machine can start the fake after a short trainer has ended).
    fault = base / "no-fault"
    fake = install_fake_nvidia_smi(base, mode="load", gpus=2, fault_file=fault)
    args = [a for a in run_args(base) if a != "--no-gpu"]
    result = asyncsoak_cli(
        *args,
        "--nvidia-smi",
        str(fake.path),
        "--",
        *py(PASSING_TRAINER),
        str(base / "progress"),
        f"{fault}.seen",
        cwd=base,
    )
    assert result.returncode == 0, result.stderr
    return base / "soak.json"


def stalled_soak(base: Path) -> Path:
    """A soak whose trainer stops making progress: stale_progress; returns its artifact path."""
    base.mkdir(parents=True, exist_ok=True)
    result = asyncsoak_cli(
        *run_args(base, "--stale-progress", "1"),
        "--",
        *py(STALLING_TRAINER),
        str(base / "progress"),
        cwd=base,
    )
    assert result.returncode == 1, result.stderr
    return base / "soak.json"


def killed_monitor_journal(base: Path) -> Path:
    """The journal of a soak whose monitor was SIGKILLed mid-run; returns the journal path."""
    base.mkdir(parents=True, exist_ok=True)
    fifo = ReadyFifo(base / "ready.fifo")
    code = (
        "import pathlib, sys, time\n"
        "p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True)\n"
        "for i in range(3):\n"
        "    (p / 'm').open('a').write('x')\n"
        "    print('step', i, flush=True)\n"
        "    time.sleep(0.1)\n"
        f"open({str(fifo.path)!r}, 'w').write('ready\\n')\n"
        "time.sleep(60)\n"
    )
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncsoak",
            *run_args(base),
            "--",
            *py(code),
            str(base / "progress"),
        ],
        cwd=base,
        env=CLI_ENV,
        stderr=subprocess.DEVNULL,
    )
    journal = base / "soak.jsonl"
    try:
        assert fifo.line_sync() == "ready"
        # The journal is written by the interval: the kill comes once it holds the progress
        # the trainer made (what a recover rebuilds), however far a loaded machine lags.
        deadline = time.monotonic() + 30
        while b'"kind":"progress"' not in journal.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.02)
        monitor.kill()
        monitor.wait(timeout=10)
    finally:
        monitor.kill()
        monitor.wait()
        fifo.close()
    assert not (base / "soak.json").exists()
    return journal


def sample_lines(end: float, stall_at: float | None, gpus: int = 2) -> list[dict[str, Any]]:
    """``sample`` and ``gpu_sample`` journal lines from 0 to ``end`` as the samplers write them.

    Busy until ``stall_at``, idle after it (a stalled trainer); GPU 0's clocks are held back
    (``hw_slowdown``) in the middle of the run.
    """
    lines: list[dict[str, Any]] = []
    steps = 60
    for i in range(steps + 1):
        t = round(end * i / steps, 3)
        busy = stall_at is None or t < stall_at
        wave = math.sin(i / 3)
        lines.append(
            {
                "t": t,
                "kind": "sample",
                "points": {
                    "tree": {
                        "cpu_percent": (96 + 4 * wave) if busy else 0.5,
                        "rss_bytes": 2**30 * min(1.5, 0.4 + 0.05 * i),
                        "processes": 3,
                        "threads": 14 if busy else 12,
                        "fds": 40,
                    },
                    "machine": {
                        "cpu_percent": 30 + 10 * wave if busy else 4,
                        "memory_used_bytes": 2**30 * (18 + 0.02 * i),
                        "load1": 2.0,
                        "disk_free_bytes_progress": 2**30 * (120 - 0.01 * i),
                        "disk_free_bytes_output": 2**30 * 480,
                    },
                },
            }
        )
        points = {}
        labels = {}
        readings = []
        for g in range(gpus):
            points[f"gpu{g}"] = {
                "utilization_gpu_percent": (88 + 8 * wave - 5 * g) if busy else 0.0,
                "memory_used_mib": 40_000.0 + 2_000 * g,
                "memory_free_mib": 100_000.0 - 2_000 * g,
                "power_draw_w": (610 + 30 * wave) if busy else 118,
                "power_limit_w": 700.0,
                "temperature_gpu_c": (66 + 2 * wave) if busy else 47,
                "clocks_sm_mhz": 1980.0 if busy else 345.0,
            }
            throttled = g == 0 and steps * 0.3 <= i <= steps * 0.4
            reasons = ["hw_slowdown", "sw_thermal"] if throttled else ([] if busy else ["gpu_idle"])
            labels[f"gpu{g}"] = {"throttle_reasons": reasons}
            readings.append({"index": g, "clock_event_reasons": reasons})
        lines.append(
            {"t": t, "kind": "gpu_sample", "points": points, "labels": labels, "gpus": readings}
        )
    return lines


def with_samples(artifact_path: Path, out: Path, gpus: int = 2) -> Path:
    """A copy of a real soak's journal and artifact with sampler lines added; the artifact path.

    The lines go in time order before the ``finished`` line, and the artifact is rebuilt from
    that journal with the real run's monitor record, as the serializer would have built it.
    """
    original = json.loads(artifact_path.read_text())
    events = list(read_journal(artifact_path.with_suffix(".jsonl")))
    finished = [e for e in events if e["kind"] == "finished"]
    rest = [e for e in events if e["kind"] != "finished"]
    end = max(e["t"] for e in rest)
    last_progress = max((e["t"] for e in rest if e["kind"] == "progress"), default=None)
    stall = last_progress if original["failures"] else None
    # The proc sampler's real lines are kept; only what no sampler wrote here is added.
    has_samples = any(e["kind"] == "sample" for e in rest)
    added = [
        e for e in sample_lines(end, stall, gpus) if not (has_samples and e["kind"] == "sample")
    ]
    merged = sorted(rest[1:] + added, key=lambda e: (e["t"], e["kind"] == "sample"))
    out.parent.mkdir(parents=True, exist_ok=True)
    journal = out.with_suffix(".jsonl")
    journal.write_text(
        "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in [rest[0], *merged, *finished])
    )
    artifact = artifact_from_journal(journal)
    # The written run's own monitor figures, in place of the rebuilt ones.
    artifact["monitor"] = cast(Monitor, {**original["monitor"], "journal_path": str(journal)})
    artifact["duration_seconds"] = original["duration_seconds"]
    artifact["ended_at"] = original["ended_at"]
    out.write_text(json.dumps(artifact, indent=1))
    return out


@dataclass(frozen=True)
class Runs:
    """One of each run the report, summary and live tests look at."""

    passing: Path
    stalled: Path
    #: The stalled run with sampler lines added to its journal (tree, machine, two GPUs).
    stalled_sampled: Path
    #: The journal of a run whose monitor was killed (no artifact).
    killed_journal: Path


_RUNS: dict[str, Runs] = {}


def make_runs(base: Path) -> Runs:
    """The runs, made once per test session however many test modules ask."""
    if "runs" not in _RUNS:
        stalled = stalled_soak(base / "stalled")
        _RUNS["runs"] = Runs(
            passing=passing_soak(base / "passing"),
            stalled=stalled,
            stalled_sampled=with_samples(stalled, base / "stalled-sampled" / "soak.json"),
            killed_journal=killed_monitor_journal(base / "killed"),
        )
    return _RUNS["runs"]


def canonical_runs(base: Path) -> dict[str, Path]:
    """The runs a reader meets, by name: ``pass``, ``stall``, ``crash``, ``frozen``, ``nan``,
    ``gpu`` (the trainer's modes) and ``leak`` (a pass keeping 4 MiB alive per step for 80
    steps: a leak warning, however long a loaded machine pauses it, up to 0.6 s); made once per
    test session however many test modules ask."""
    if "canonical" not in _CANONICAL:
        _CANONICAL["canonical"] = {
            **{
                mode: trainer_soak(base / mode, mode)
                for mode in ("pass", "stall", "crash", "frozen", "nan", "gpu")
            },
            "leak": trainer_soak(base / "leak", "pass", 80, env="LEAK_MIB=4"),
        }
    return _CANONICAL["canonical"]


_CANONICAL: dict[str, dict[str, Path]] = {}
