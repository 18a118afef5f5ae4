"""GPU sampling cost without a GPU: loop mode against one spawn per sample, on the fake nvidia-smi.

The fake (``tests/fake_nvidia_smi.py``) replays the H200 captures; it is a Python script, so
each spawn costs an interpreter start-up where the real nvidia-smi costs about 44 ms of CPU
(fixtures README), and a loop iteration costs a little Python where the real loop costs
about 0.25 ms per query.  The ratio is what the mechanism saves here; ``gpu_check.py``
measures the real one on a GPU machine.

    python benchmarks/gpu_sampling.py [--duration 20] [--period 0.1]

Target: loop mode at most 1/10 of the CPU per sample of spawning.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

import anyio

# Run as a script: this directory is on sys.path already; the repository root is added for the
# fake nvidia-smi that the tests use.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_check import TARGET_RATIO, compare

from tests.gpu_support import install_fake_nvidia_smi


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="loop window, seconds")
    parser.add_argument("--period", type=float, default=0.1, help="sample period, seconds")
    parser.add_argument("--spawns", type=int, default=20, help="samples taken by spawning")
    args = parser.parse_args()
    print("No GPU here: this measures the fake nvidia-smi replaying the H200 captures.")
    with tempfile.TemporaryDirectory(prefix="asyncsoak-gpu-sampling-") as tmp:
        fake = install_fake_nvidia_smi(Path(tmp), "load")
        ratio = anyio.run(partial(compare, str(fake.path), args.period, args.duration, args.spawns))
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
