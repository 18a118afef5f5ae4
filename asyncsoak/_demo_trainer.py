"""The training loop ``asyncsoak demo`` supervises: logistic regression in pure Python on
synthetic data; each step appends ``{"step", "loss", "accuracy", "time"}`` to ``metrics.jsonl``,
every 20th writes ``checkpoint-N/trainer_state.json``."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

#: Examples per step, and steps a second at most (the demo shows a run over time).
BATCH = 2_000
STEPS_PER_SECOND = 5
CHECKPOINT_EVERY = 20


def train(out: Path, seconds: float, seed: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    points = [(rng.uniform(-1, 1), rng.uniform(-1, 1)) for _ in range(30_000)]
    data = [(x, y, int(0.8 * x - 0.5 * y + 0.1 > 0)) for x, y in points]
    w = [0.0, 0.0, 0.0]
    lr = 0.5
    started = time.monotonic()
    step = 0
    metrics = out / "metrics.jsonl"
    while time.monotonic() - started < seconds:
        step += 1
        batch = rng.sample(data, BATCH)
        loss = 0.0
        correct = 0
        for x, y, label in batch:
            z = w[0] * x + w[1] * y + w[2]
            p = 1.0 / (1.0 + math.exp(-z))
            loss -= math.log(p if label else 1.0 - p + 1e-12)
            correct += (p > 0.5) == bool(label)
            g = p - label
            w[0] -= lr * g * x
            w[1] -= lr * g * y
            w[2] -= lr * g
        time.sleep(max(0.0, step / STEPS_PER_SECOND - (time.monotonic() - started)))
        record = {
            "step": step,
            "loss": round(loss / BATCH, 5),
            "accuracy": round(correct / BATCH, 4),
            "time": round(time.time(), 3),
        }
        with metrics.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if step % CHECKPOINT_EVERY == 0:
            checkpoint = out / f"checkpoint-{step}"
            checkpoint.mkdir(exist_ok=True)
            state = {"global_step": step, "weights": w}
            (checkpoint / "trainer_state.json").write_text(json.dumps(state))
        print(f"step {step:3d}  loss {record['loss']:.4f}  accuracy {record['accuracy']:.3f}")
        sys.stdout.flush()
    print(f"done after {step} steps")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return train(args.out, args.seconds, args.seed)


if __name__ == "__main__":
    sys.exit(main())
