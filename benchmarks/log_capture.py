"""Log capture: a trainer printing 256 MiB under ``asyncsoak run``, against ``cat > file``.

    python -m benchmarks --only log_capture      (or: python -m benchmarks.log_capture)

The trainer writes 256 MiB of 1 KiB lines to its stdout in 64 KiB writes, then exits; it
stamps (monotonic clock) when its first write started and its last one returned.  It runs in
turns:

- under ``asyncsoak run`` with its defaults (a 16 MiB log: the head, a marker, the tail),
  the reaper copying the pipe into the log;
- into ``cat > file`` (``trainer | cat > file``): the floor of copying a pipe into a file.

The target figure is the trainer's own printing time, median over the runs: what the capture
costs the trainer.  The trainer starts printing once the monitor's start-up is over (its
``snapshot`` event is in the journal: the snapshot lists installed packages through another
interpreter, a second of CPU on these 2 cores); a figure beside it prints from the first
instant, for context.  Beside it: the whole command's wall time, and the
bytes written per byte printed (``wchar`` of this process's reaped children: the trainer's
writes to the pipe, then the reaper's or cat's writes to the file, and the monitor's own).

Target: at most 2x the trainer's time into ``cat > file``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import REPO, Figure, Section, median, python_child

PRINTED_MIB = 256
TARGET_RATIO = 2.0

TRAINER = r"""
import json, os, sys, time
stamp, mib, journal = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if journal:
    # Wait (bounded) until the start-up of the monitor is over: its snapshot is in the journal.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(journal, "rb") as f:
                if b'"kind":"snapshot"' in f.read():
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
line = b"x" * 1023 + b"\n"
block = line * 64
out = os.fdopen(1, "wb", buffering=0, closefd=False)
started = time.monotonic()
for _ in range(mib * 16):
    view = memoryview(block)
    while view:
        view = view[out.write(view) :]
ended = time.monotonic()
with open(stamp, "w") as f:
    json.dump({"started": started, "ended": ended}, f)
"""


ASYNCSOAK_RUN = [sys.executable, "-m", "asyncsoak", "run", "--quiet", "--no-gpu"]


def trainer_argv(stamp: Path, journal: Path | None = None) -> list[str]:
    """The trainer; with ``journal``, it prints once the monitor's start-up is over."""
    return python_child(TRAINER, str(stamp), str(PRINTED_MIB), str(journal or ""))


def written_by_children() -> int:
    """``wchar`` of this process: its own writes plus those of every child it has reaped."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def one_run(argv: list[str], stamp: Path) -> tuple[float, float, int]:
    """The trainer's printing time, the command's wall time, the bytes written meanwhile."""
    stamp.unlink(missing_ok=True)
    before = written_by_children()
    started = time.monotonic()
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    written = written_by_children() - before
    times = json.loads(stamp.read_text())
    return times["ended"] - times["started"], wall, written


def run(quick: bool = False) -> Section:
    runs = 2 if quick else 5
    section = Section("log_capture", "10. Log capture")
    started = time.monotonic()
    printed = PRINTED_MIB * 2**20
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        work = Path(tmp)
        progress = work / "progress"
        progress.mkdir()
        stamp = progress / "stamp.json"
        journal = work / "soak.jsonl"
        cat = [
            "sh",
            "-c",
            f"{shlex.join(trainer_argv(stamp))} | cat > {shlex.quote(str(work / 'cat.log'))}",
        ]

        def soak(after_start: bool) -> list[str]:
            output = ["--output", str(work / "soak.json")]
            argv = trainer_argv(stamp, journal if after_start else None)
            return [*ASYNCSOAK_RUN, "--progress-dir", str(progress), *output, "--", *argv]

        results: dict[str, list[tuple[float, float, int]]] = {"cat": [], "soak": [], "early": []}
        one_run(cat, stamp)  # fills the page cache with the interpreter
        for _ in range(runs):
            results["cat"].append(one_run(cat, stamp))
            for key, after_start in (("soak", True), ("early", False)):
                for leftover in work.glob("soak.*"):
                    leftover.unlink()
                results[key].append(one_run(soak(after_start), stamp))
        log_size = (work / "soak.log").stat().st_size
    cat_print = median([r[0] for r in results["cat"]])
    soak_print = median([r[0] for r in results["soak"]])
    section.add(
        Figure(
            f"trainer printing {PRINTED_MIB} MiB under asyncsoak run (median)",
            soak_print,
            "s",
            reference=f"into cat > file {cat_print:.2f} s",
            ratio=soak_print / cat_print,
            target=f"<= {TARGET_RATIO:g}x cat",
            met=soak_print / cat_print <= TARGET_RATIO,
        )
    )
    early_print = median([r[0] for r in results["early"]])
    section.add(
        Figure(
            "the same, printing from the first instant (beside the monitor's start-up)",
            early_print,
            "s",
            reference=f"into cat > file {cat_print:.2f} s",
            ratio=early_print / cat_print,
        )
    )
    cat_wall = median([r[1] for r in results["cat"]])
    early_wall = median([r[1] for r in results["early"]])
    section.add(
        Figure(
            "whole command, printing from the first instant, start-up included (median)",
            early_wall,
            "s",
            reference=f"trainer | cat > file {cat_wall:.2f} s",
            ratio=early_wall / cat_wall,
        )
    )
    for key, name in (("soak", "asyncsoak run"), ("cat", "cat > file")):
        # The trainer's own writes to the pipe are one byte per byte printed: not the log's.
        extra = median([r[2] for r in results[key]]) - printed
        section.add(Figure(f"bytes written per byte printed: {name}", extra / printed, "B/B"))
    section.add(Figure("log file left by asyncsoak run", log_size / 2**20, "MiB"))
    section.note(
        f"{runs} runs of each, in turns; the trainer writes 64 KiB at a time; the log cap is "
        "asyncsoak's default (16 MiB)"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
