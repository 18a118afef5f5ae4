"""A small trainer for the SLURM tests: steps, a checkpoint, and what a real one does on signals.

``python slurm_trainer.py DIR --steps N [--resume-steps N] [--usr1-exit CODE]
[--fail-at STEP [--fail-rank RANK]] [--ready FIFO]``.
Every step appends to ``DIR/metrics.jsonl`` (progress); ``DIR/checkpoint.json`` holds the last
saved step, and a run resumes from it.  SIGTERM saves and exits ``--term-exit`` (0 by default, as
Lightning does); SIGUSR1 saves and exits ``--usr1-exit`` (4 by default, the reference protocol's
"saved, requeue me").
``DIR/trainer.log`` records what happened, one line per fact, for the test to read.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

STEP_SECONDS = 0.2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--usr1-exit", type=int, default=4)
    parser.add_argument("--term-exit", type=int, default=0)
    parser.add_argument("--resume-steps", type=int, default=None)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--fail-rank", default=None)
    parser.add_argument("--ready", type=Path, default=None)
    args = parser.parse_args()
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    rank = os.environ.get("SLURM_PROCID", "0")
    # One directory per task of an srun step: %t is the task's rank, as in SLURM's patterns.
    out = Path(str(args.dir).replace("%t", rank))
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint.json"
    step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
    steps = args.steps
    if checkpoint.exists() and args.resume_steps is not None:
        steps = step + args.resume_steps
    fail_at = args.fail_at if args.fail_rank in (None, rank) else None

    def note(line: str) -> None:
        with open(out / "trainer.log", "a") as f:
            f.write(f"{line} restart={restarts} rank={rank}\n")

    def save(why: str) -> None:
        tmp = checkpoint.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, checkpoint)
        note(f"saved step={step} on={why}")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # SLURM with proctrack/linuxproc signals every process and the monitor passes its
        # stop on too: the second SIGTERM must not kill the exit the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        name = signal.Signals(signum).name
        save(name)
        sys.exit(args.term_exit if signum == signal.SIGTERM else args.usr1_exit)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    note(f"started step={step}")
    if args.ready is not None:
        with open(args.ready, "w") as f:
            f.write(f"{os.getpid()}\n")
    while step < steps:
        if fail_at is not None and step >= fail_at:
            note(f"failed step={step}")
            print("RuntimeError: the loss went NaN", file=sys.stderr)
            return 3
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        step += 1
        time.sleep(STEP_SECONDS)
    save("done")
    note(f"finished step={step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
