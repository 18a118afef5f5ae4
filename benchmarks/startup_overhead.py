"""Start-up overhead: a short ``asyncsoak run`` of a command that writes one progress line.

    python -m benchmarks --only startup_overhead      (or: python -m benchmarks.startup_overhead)

Wall time from ``exec`` to exit, medians over runs taken in turns, as a user at a shell sees
it: the bare command (``sh`` appending one line to the progress dir), the same under
``asyncsoak run --quiet``, ``python -c pass`` and ``python -c 'import asyncio, anyio, psutil,
aiofiles'`` (the dependencies' import floor).  asyncsoak's own cost is its wall time less the
bare command's, less the floor against ``pass``: the interpreter's start counts as its own.
``python -P -m asyncsoak`` stands for the installed script (``-P``: no current directory on the
path, so each checkout times its own package); byte code is written and used, as after ``pip
install``.  ``ASYNCSOAK_BASELINE=DIR`` also times the package in DIR (another
checkout) in the same turns, for a before/after.

Target: at most 100 ms of asyncsoak's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks._common import REPO, Figure, Section, median, percentile

TARGET_OWN_SECONDS = 0.1
DEPENDENCIES = ("asyncio", "anyio", "psutil", "aiofiles")


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(root)}


def wall(argv: Sequence[str], env: Mapping[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(
        argv, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.monotonic() - started


def run(quick: bool = False) -> Section:
    runs = 5 if quick else 30
    section = Section("startup_overhead", "7. Start-up overhead")
    started = time.monotonic()
    roots = {"new": REPO}
    if os.environ.get("ASYNCSOAK_BASELINE"):
        roots["old"] = Path(os.environ["ASYNCSOAK_BASELINE"]).resolve()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        progress = Path(tmp) / "progress"
        progress.mkdir()
        bare = ["sh", "-c", f"echo 'step 1' >> {progress}/train.log"]
        argv = {
            "bare": bare,
            "pass": [sys.executable, "-c", "pass"],
            "floor": [sys.executable, "-c", f"import {', '.join(DEPENDENCIES)}"],
        }
        for name in roots:
            # -P: the package from PYTHONPATH (ROOT), not the current directory's (this checkout)
            argv[name] = [sys.executable, "-P", "-m", "asyncsoak", "run", "--quiet"]
            argv[name] += ["--progress-dir", str(progress), "--output", f"{tmp}/{name}.json"]
            argv[name] += ["--", *bare]
        for turn in range(runs + 1):
            for name, command in argv.items():
                took = wall(command, _env(roots.get(name, REPO)))
                if turn:  # the first turn fills the page cache and writes the byte code
                    times.setdefault(name, []).append(took)
    floor = median(times["floor"]) - median(times["pass"])
    for name in roots:
        own = [t - median(times["bare"]) - floor for t in times[name]]
        section.add(
            Figure(
                f"{name}: asyncsoak run of one progress line, its own wall time (median)",
                median(own) * 1e3,
                "ms",
                reference=f"python -c pass {median(times['pass']) * 1e3:.1f} ms",
                ratio=median(times[name]) / median(times["pass"]),
                target="<= 100 ms",
                met=median(own) <= TARGET_OWN_SECONDS,
            )
        )
        section.add(Figure(f"{name}: the same, p95", percentile(own, 95) * 1e3, "ms"))
    section.add(Figure(f"import {', '.join(DEPENDENCIES)}: over pass", floor * 1e3, "ms"))
    section.add(Figure("the bare command", median(times["bare"]) * 1e3, "ms"))
    section.note(
        f"{runs} runs of each, in turns; own = run - bare command - (floor - pass); "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
