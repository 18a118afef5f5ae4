"""Live metrics: what serving ``/metrics`` costs the monitor, and how fast a scrape answers.

    python -m benchmarks --only metrics_serving      (or: python -m benchmarks.metrics_serving)

Two monitors run side by side, each a process of its own supervising its own 100-process tree
at a 1 s sample interval, as item 2 runs it (GPU sampling on ``nvidia-smi``, or the fake one
replaying the H200 captures): one without metrics, one with a metrics port scraped every
second by this process, with the ``Accept`` header Prometheus 2.42 sends (so the page is
OpenMetrics).  Both run over the same windows, so under the same load.  Their CPU is read from
the scheduler's clock (``/proc/PID/task/*/schedstat``, nanoseconds; ``thread_cpu_seconds``),
not from ``utime``/``stime``'s ticks.  The cost of serving is the difference, as a share of the
monitor without metrics (the median over windows).

Two monitors differ by a few percent from window to window whatever they do, as much as the
cost being measured, so a second figure prices one scrape on its own: the monitor with metrics
is scraped 20 times a second for a while, and its extra CPU over the other, divided by the
scrapes, is the cost of one, which the 1 s scrape pays once a second.  Each scrape's latency
(connect to last byte) is timed here, at 1 s scrapes while the tree is sampled.

Targets: serving costs under 5 % of the monitor's CPU; a scrape answers in under 10 ms p95.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import (
    REPO,
    Figure,
    Section,
    median,
    percentile,
    python_child,
    thread_cpu_seconds,
)

TREE_SIZE = 100
INTERVAL = 1.0
TARGET_SHARE = 0.05
TARGET_P95_MS = 10.0
#: What Prometheus 2.42 asks for.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

#: The trainer: 99 sleeping children, a line of progress every second.
TRAINER = r"""
import os, signal, sys, time
progress, size = sys.argv[1], int(sys.argv[2])
for _ in range(size - 1):
    if os.fork() == 0:
        while True:
            signal.pause()
step = 0
while True:
    with open(progress, "a") as f:
        f.write('{"step": %d}\n' % step)
    step += 1
    time.sleep(1.0)
"""


#: Scrapes a second while one scrape is priced, and for how long.
BURST_RATE = 20.0
BURST_SECONDS = 10.0


def child_main(args: argparse.Namespace) -> None:
    """One monitor: a soak of a 100-process tree; "ready" on stdout once the tree is whole."""
    import anyio

    from asyncsoak import Metrics, SoakControl, run_soak
    from asyncsoak._process._tree import descendants
    from benchmarks._common import parent_pid

    async def main(work: Path) -> None:
        progress = work / "progress"
        progress.mkdir()
        control = SoakControl()

        async def announce() -> None:
            with anyio.fail_after(60):
                await control.started.wait()
                assert control.pid is not None
                reaper = parent_pid(control.pid)
                for _ in range(1200):  # the trainer forks its children: wait for them all
                    if len(descendants(reaper)) >= TREE_SIZE:
                        break
                    await anyio.sleep(0.05)
            print("ready", flush=True)
            # Stopped by the parent closing our stdin (end of file makes it readable).
            await anyio.wait_readable(sys.stdin.fileno())
            control.request_stop()

        metrics = None if args.port is None else Metrics(port=args.port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(announce)
            await run_soak(
                command=python_child(TRAINER, str(progress / "train.jsonl"), str(TREE_SIZE)),
                progress_dir=progress,
                output_path=work / "soak.json",
                sample_interval_seconds=INTERVAL,
                startup_timeout_seconds=60.0,
                stale_progress_seconds=60.0,
                post_shutdown_grace_seconds=2.0,
                nvidia_smi=args.nvidia_smi,
                control=control,
                metrics=metrics,
            )

    with tempfile.TemporaryDirectory(prefix="asyncsoak-bench-") as tmp:
        anyio.run(main, Path(tmp))


def scrape(port: int) -> tuple[float, int]:
    """One scrape as Prometheus does it: (seconds from connect to the last byte, bytes)."""
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {PROMETHEUS_ACCEPT}\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    elapsed = time.perf_counter() - started
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"scrape failed: {data[:80]!r}")
    return elapsed, len(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_monitor(port: int | None, nvidia_smi: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "benchmarks.metrics_serving", "--child"]
    command += ["--nvidia-smi", nvidia_smi]
    if port is not None:
        command += ["--port", str(port)]
    process = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise RuntimeError(f"the monitor did not start: {line!r}")
    return process


def stop_monitor(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def run(quick: bool = False) -> Section:
    started = time.monotonic()
    section = Section("metrics_serving", "11. Live metrics")
    windows = 2 if quick else 4
    window = 5.0 if quick else 10.0
    port = free_port()
    fake_dir = None
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        from tests.gpu_support import install_fake_nvidia_smi

        fake_dir = tempfile.TemporaryDirectory(prefix="asyncsoak-bench-")
        nvidia_smi = str(install_fake_nvidia_smi(Path(fake_dir.name)).path)
    plain = start_monitor(None, nvidia_smi)
    served = start_monitor(port, nvidia_smi)
    latencies: list[float] = []
    shares: list[float] = []
    plain_cpu = served_cpu = 0.0
    size = 0
    try:
        time.sleep(3.0)  # warm-up: both monitors sampling, the page served a few times
        for _ in range(3):
            scrape(port)
        for _ in range(windows):
            a0, b0 = thread_cpu_seconds(plain.pid), thread_cpu_seconds(served.pid)
            tick = time.monotonic()
            end = tick + window
            while tick < end:
                latency, size = scrape(port)
                latencies.append(latency)
                tick += INTERVAL
                time.sleep(max(0.0, tick - time.monotonic()))
            a = thread_cpu_seconds(plain.pid) - a0
            b = thread_cpu_seconds(served.pid) - b0
            plain_cpu += a
            served_cpu += b
            shares.append((b - a) / a)
        burst = BURST_SECONDS / (3 if quick else 1)
        a0, b0 = thread_cpu_seconds(plain.pid), thread_cpu_seconds(served.pid)
        tick = time.monotonic()
        end = tick + burst
        scrapes = 0
        while tick < end:
            scrape(port)
            scrapes += 1
            tick += 1 / BURST_RATE
            time.sleep(max(0.0, tick - time.monotonic()))
        per_scrape = (
            (thread_cpu_seconds(served.pid) - b0) - (thread_cpu_seconds(plain.pid) - a0)
        ) / scrapes
    finally:
        stop_monitor(plain)
        stop_monitor(served)
        if fake_dir is not None:
            fake_dir.cleanup()
    total = windows * window
    share = median(shares)
    section.add(
        Figure(
            "serving metrics (1 s scrape, 1 s samples): extra CPU, share of the monitor's",
            100 * share,
            "%",
            reference="monitor without metrics",
            ratio=share,
            target="< 5% of the monitor's CPU",
            met=share < TARGET_SHARE,
        )
    )
    per_second = per_scrape / (plain_cpu / total)
    section.add(
        Figure(
            "one scrape's CPU (priced at 20 scrapes/s) once a second: share of the monitor's",
            100 * per_second,
            "%",
            reference=f"{1000 * per_scrape:.3f} ms a scrape",
            ratio=per_second,
            target="< 5% of the monitor's CPU",
            met=per_second < TARGET_SHARE,
        )
    )
    section.add(Figure("monitor without metrics, share of one core", 100 * plain_cpu / total, "%"))
    section.add(Figure("monitor with metrics, share of one core", 100 * served_cpu / total, "%"))
    p95 = 1000 * percentile(latencies, 95)
    section.add(
        Figure(
            "scrape latency while a 100-process tree is sampled: p95",
            p95,
            "ms",
            reference=f"p50 {1000 * percentile(latencies, 50):.2f} ms, {len(latencies)} scrapes",
            ratio=p95 / TARGET_P95_MS,
            target="p95 < 10 ms",
            met=p95 < TARGET_P95_MS,
        )
    )
    section.note(
        f"{windows} windows of {window:g} s, the two monitors side by side; the extra CPU is "
        f"the median over windows of (with - without) / without, from "
        f"{100 * min(shares):.1f}% to {100 * max(shares):.1f}%; page {size} bytes (OpenMetrics"
        f"{', fake nvidia-smi' if fake_dir is not None else ''})"
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--nvidia-smi", default=None)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.child:
        child_main(options)
    else:
        from benchmarks.run import print_sections

        print_sections([run(options.quick)])
