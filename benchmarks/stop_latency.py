"""Stop latency: from the failure to the last process of a 100-process tree reaped.

    python -m benchmarks --only stop_latency      (or: python -m benchmarks.stop_latency)

The command forks 99 children (100 processes in its process group), writes once to the
progress directory and stalls; ``stale_progress`` fires and the monitor stops the tree.  The
latency runs from the ``failure`` event to the ``tree_gone`` event (the reaper has reaped the
last process and said so).  Two trees:

- one that honours SIGTERM: SIGTERM to the group, then the reaper reaps;
- one that ignores SIGTERM: the grace passes, then SIGKILL; the figure is the time beyond the
  grace.

Reference, measured in the same run: the floor of the same job without asyncsoak.  A small
helper process (a child subreaper, as asyncsoak's reaper is) builds the same tree, sends the
same signal to its group and reaps with ``waitpid(-1)`` in a tight loop until nothing is left.

Hang forensics are off for the targets (with them on, the monitor spends up to
``FORENSICS_SECONDS`` recording what the stalled tree was doing before the first signal, by
design); one figure shows what they add.  p50 and p95 over 20 soaks each.

Targets: under 300 ms for a tree that honours SIGTERM; the grace plus under 300 ms for one
that ignores it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from benchmarks._common import (
    Figure,
    Section,
    events_of,
    percentile,
    python_child,
    stalling_tree,
)

TREE_SIZE = 100
TARGET_SECONDS = 0.300
STALE_SECONDS = 0.3
#: The grace given to the tree that ignores SIGTERM.
GRACE_SECONDS = 0.5

# The floor: build the tree below a subreaper, signal its group, reap everything.
FLOOR = r"""
import ctypes, json, os, signal, sys, time
size, rounds, ignore_term = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
out = []
for _ in range(rounds):
    r, w = os.pipe()
    root = os.fork()
    if root == 0:
        os.setsid()
        os.close(r)
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _ in range(size - 1):
            if os.fork() == 0:
                os.write(w, b".")
                while True:
                    signal.pause()
        os.write(w, b".")
        while True:
            signal.pause()
    os.close(w)
    got = 0
    while got < size:
        got += len(os.read(r, 65536))
    os.close(r)
    started = time.monotonic()
    os.killpg(root, signal.SIGKILL if ignore_term else signal.SIGTERM)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    out.append(time.monotonic() - started)
print(json.dumps(out))
"""


def floor_latencies(rounds: int, ignore_term: bool) -> list[float]:
    """Signal-to-last-reap of the bare tree: SIGTERM, or SIGKILL for the tree that ignores it."""
    result = subprocess.run(
        python_child(FLOOR, str(TREE_SIZE), str(rounds), "1" if ignore_term else "0"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    latencies: list[float] = json.loads(result.stdout)
    return latencies


async def one_stop(work: Path, *, ignore_term: bool, forensics: bool) -> dict[str, float]:
    """Times (seconds since the failure) of the stop's steps in one soak."""
    from asyncsoak import SoakFailureError, run_soak

    progress = work / "progress"
    progress.mkdir()
    try:
        await run_soak(
            command=stalling_tree(
                progress / "metrics.jsonl",
                work / "stamp.json",
                size=TREE_SIZE,
                writes=1,
                ignore_term=ignore_term,
            ),
            progress_dir=progress,
            output_path=work / "soak.json",
            sample_interval_seconds=1.0,
            startup_timeout_seconds=30.0,
            stale_progress_seconds=STALE_SECONDS,
            post_shutdown_grace_seconds=GRACE_SECONDS if ignore_term else 5.0,
            nvidia_smi=None,
            forensics=forensics,
        )
    except SoakFailureError as failure:
        artifact: dict[str, Any] = failure.artifact
    else:
        raise RuntimeError("the soak did not fail")
    failed = float(events_of(artifact, "failure")[0]["t"])
    signals = {e["signal"]: float(e["t"]) - failed for e in events_of(artifact, "signal")}
    gone = events_of(artifact, "tree_gone")
    if not gone:
        raise RuntimeError("no tree_gone event: the tree was not reaped")
    first_signal = events_of(artifact, "signal")[0]
    if len(first_signal["pids"]) < TREE_SIZE:
        raise RuntimeError(f"the stop signalled {len(first_signal['pids'])} processes")
    return {
        "gone": float(gone[0]["t"]) - failed,
        "sigterm": signals.get("SIGTERM", float("nan")),
        "sigkill": signals.get("SIGKILL", float("nan")),
    }


def stops(runs: int, *, ignore_term: bool, forensics: bool = False) -> list[dict[str, float]]:
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
            out.append(
                anyio.run(lambda: one_stop(Path(tmp), ignore_term=ignore_term, forensics=forensics))
            )
    return out


def run(quick: bool = False) -> Section:
    runs = 5 if quick else 20
    section = Section("stop_latency", "4. Stop latency")
    started = time.monotonic()

    honours = stops(runs, ignore_term=False)
    floor_term = floor_latencies(runs, ignore_term=False)
    gone = [s["gone"] for s in honours]
    to_signal = [s["sigterm"] for s in honours]
    for q in (50, 95):
        value = percentile(gone, q)
        floor = percentile(floor_term, q)
        section.add(
            Figure(
                f"honours SIGTERM: failure -> last reaped, p{q}",
                value * 1e3,
                "ms",
                reference=f"bare SIGTERM + reap p{q} {floor * 1e3:.1f} ms",
                ratio=value / floor,
                target="< 300 ms" if q == 95 else "",
                met=value < TARGET_SECONDS if q == 95 else None,
            )
        )
    section.add(
        Figure(
            "honours SIGTERM: failure -> SIGTERM sent, p50", percentile(to_signal, 50) * 1e3, "ms"
        )
    )

    ignores = stops(runs, ignore_term=True)
    floor_kill = floor_latencies(runs, ignore_term=True)
    beyond = [s["gone"] - GRACE_SECONDS for s in ignores]
    for q in (50, 95):
        value = percentile(beyond, q)
        floor = percentile(floor_kill, q)
        section.add(
            Figure(
                f"ignores SIGTERM: failure -> last reaped, beyond the {GRACE_SECONDS:g} s "
                f"grace, p{q}",
                value * 1e3,
                "ms",
                reference=f"bare SIGKILL + reap p{q} {floor * 1e3:.1f} ms",
                ratio=value / floor,
                target="grace + < 300 ms" if q == 95 else "",
                met=value < TARGET_SECONDS if q == 95 else None,
            )
        )
    kill_at = [s["sigkill"] - GRACE_SECONDS for s in ignores]
    section.add(
        Figure(
            "ignores SIGTERM: SIGKILL sent after the grace by, p50",
            percentile(kill_at, 50) * 1e3,
            "ms",
        )
    )

    if not quick:
        with_forensics = stops(3, ignore_term=False, forensics=True)
        section.add(
            Figure(
                "honours SIGTERM, default forensics on: failure -> last reaped, median of 3",
                percentile([s["gone"] for s in with_forensics], 50),
                "s",
            )
        )
    section.note(
        f"tree of {TREE_SIZE} processes (the command and {TREE_SIZE - 1} children, one group); "
        f"{runs} soaks per tree; grace for the tree that ignores SIGTERM {GRACE_SECONDS:g} s"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
