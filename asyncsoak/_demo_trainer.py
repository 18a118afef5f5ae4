"""The training loop ``asyncsoak demo`` supervises: pure Python, about 15 seconds.

Logistic regression by stochastic gradient descent on a synthetic, linearly separable data set.
After every epoch it appends a line to ``metrics.jsonl`` in the output directory (that file's
growth is what the soak watches) and rewrites ``checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path


def make_data(n: int, rng: random.Random) -> list[tuple[float, float, int]]:
    data = []
    for _ in range(n):
        x, y = rng.uniform(-1, 1), rng.uniform(-1, 1)
        label = 1 if 0.8 * x - 0.5 * y + 0.1 > 0 else 0
        data.append((x, y, label))
    return data


def train(out: Path, seconds: float, seed: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    data = make_data(30_000, rng)
    w = [0.0, 0.0, 0.0]
    lr = 0.5
    started = time.monotonic()
    epoch = 0
    metrics = out / "metrics.jsonl"
    while time.monotonic() - started < seconds:
        epoch += 1
        rng.shuffle(data)
        loss = 0.0
        correct = 0
        for x, y, label in data:
            z = w[0] * x + w[1] * y + w[2]
            p = 1.0 / (1.0 + math.exp(-z))
            loss -= math.log(p if label else 1.0 - p + 1e-12)
            correct += (p > 0.5) == bool(label)
            g = p - label
            w[0] -= lr * g * x
            w[1] -= lr * g * y
            w[2] -= lr * g
        # Slow the loop to about two epochs a second so the demo shows a run over time.
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started) % 0.5))
        record = {
            "epoch": epoch,
            "loss": round(loss / len(data), 5),
            "accuracy": round(correct / len(data), 4),
            "elapsed_s": round(time.monotonic() - started, 2),
        }
        with metrics.open("a") as f:
            f.write(json.dumps(record) + "\n")
        (out / "checkpoint.json").write_text(json.dumps({"epoch": epoch, "weights": w}))
        print(f"epoch {epoch:3d}  loss {record['loss']:.4f}  accuracy {record['accuracy']:.3f}")
        sys.stdout.flush()
    print(f"done after {epoch} epochs")
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
