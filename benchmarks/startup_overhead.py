"""Start-up overhead: ``asyncsoak run`` of a command that exits at once, against the
interpreter alone.

    python -m benchmarks --only startup_overhead      (or: python -m benchmarks.startup_overhead)

Wall time from ``exec`` to exit, median over runs taken in turns (the command alone, then
under ``asyncsoak run``, and so on), as a user at a shell sees it.  The command is ``true``;
the reference is ``python -c pass``, the price every Python tool pays before its first line.
``asyncsoak run`` is run the way a user runs it, with its defaults (GPU sampling on: without
an ``nvidia-smi`` the sampler notes it and stops), ``python -m asyncsoak`` standing for the
installed ``asyncsoak`` script.  Byte code is written and used, as after ``pip install``
(``PYTHONDONTWRITEBYTECODE`` is dropped from the environment: without it every run would compile
the package again).  For context: ``true`` alone, and importing the soak core.

Target: at most 200 ms more than ``python -c pass``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks._common import REPO, Figure, Section, median, percentile

TARGET_EXTRA_SECONDS = 0.2

#: The event loop and the core dependencies every soak imports before asyncsoak's own modules.
DEPENDENCIES = ("asyncio", "anyio.streams.memory", "psutil", "aiofiles")

#: As a user's installed package runs: with its byte code.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: Sequence[str]) -> float:
    started = time.monotonic()
    subprocess.run(
        argv, cwd=REPO, env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.monotonic() - started


def run(quick: bool = False) -> Section:
    runs = 5 if quick else 20
    section = Section("startup_overhead", "7. Start-up overhead")
    started = time.monotonic()
    true = shutil.which("true") or "/bin/true"
    times: dict[str, list[float]] = {
        "alone": [],
        "run": [],
        "python": [],
        "import": [],
        "floor": [],
    }
    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        work = Path(tmp)
        soak = [
            sys.executable,
            "-m",
            "asyncsoak",
            "run",
            "--progress-dir",
            str(work / "progress"),
            "--output",
            str(work / "soak.json"),
            "--",
            true,
        ]
        python = [sys.executable, "-c", "pass"]
        imports = [sys.executable, "-c", "import asyncsoak._supervisor._soak, asyncsoak.cli"]
        # What any asyncsoak run pays before its own code: its event loop and dependencies.
        floor = [sys.executable, "-c", f"import {', '.join(DEPENDENCIES)}"]
        wall(soak)  # the first run fills the page cache with the interpreter and the package
        for _ in range(runs):
            times["alone"].append(wall([true]))
            times["run"].append(wall(soak))
            times["python"].append(wall(python))
            times["import"].append(wall(imports))
            times["floor"].append(wall(floor))
    interpreter = median(times["python"])
    under = median(times["run"])
    extra = under - interpreter
    section.add(
        Figure(
            "asyncsoak run -- true: wall time over python -c pass (median)",
            extra * 1e3,
            "ms",
            reference=f"python -c pass {interpreter * 1e3:.1f} ms",
            ratio=under / interpreter,
            target="<= 200 ms more",
            met=extra <= TARGET_EXTRA_SECONDS,
        )
    )
    section.add(
        Figure(
            "asyncsoak run -- true: wall time over python -c pass (p95)",
            (percentile(times["run"], 95) - interpreter) * 1e3,
            "ms",
        )
    )
    section.add(
        Figure(
            f"python -c 'import {', '.join(DEPENDENCIES)}': over python -c pass",
            (median(times["floor"]) - interpreter) * 1e3,
            "ms",
        )
    )
    section.add(Figure("true alone", median(times["alone"]) * 1e3, "ms"))
    section.add(
        Figure(
            "python -c 'import asyncsoak._supervisor._soak, asyncsoak.cli'",
            median(times["import"]) * 1e3,
            "ms",
        )
    )
    section.note(f"{runs} runs of each, in turns; the ratio is (asyncsoak run) / (python -c pass)")
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    from benchmarks.run import run_alone

    run_alone(run, __doc__)
