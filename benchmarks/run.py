"""Run every benchmark, print one table, and write ``benchmarks/RESULTS.md``.

    python -m benchmarks                  # the full run (about 10 minutes on 2 cores)
    python -m benchmarks --quick          # a smoke run: fewer repetitions, nothing written
    python -m benchmarks --only stop_latency --only progress_scan
    python benchmarks/run.py [...]        # the same

Items 2, 5 and 6 use the H200 ``nvidia-smi`` captures (the fake ``nvidia-smi`` where there is
no GPU), kept in ``tests/fixtures/nvidia-smi/h200``.  psrecord (the ``bench`` extra) must be
installed beside the interpreter (items 1, 2).

Every figure is measured in this one run, next to its reference; ratios are of medians and
latencies are p50 and p95.  A full run (no ``--quick``, no ``--only``) writes RESULTS.md with
the machine it ran on and its load average, which matters: timings on a shared machine are
noisy.  ``--output`` writes the file for other runs too.

The whole-monitor overhead (item 2) needs a minute of sampling in a process of its own; it
runs in the background beside the GPU sampling cost (item 6), which also needs a minute and
is as light.  Nothing heavy runs beside them: on a virtual machine the CPU a sleeping process
pays to wake up grows with the machine's load, and an idle monitor's CPU is mostly that.
Everything else runs alone, one after the other.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

if __package__ in (None, ""):
    # Run as a script (python benchmarks/run.py): make the repository importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, Figure, Section

RESULTS = REPO / "benchmarks" / "RESULTS.md"
#: Hand-written record of what was changed in the code to reach the targets (before/after).
CHANGES = REPO / "benchmarks" / "CHANGES.md"

#: Benchmark modules in the order of the issue's items; each has ``run(quick) -> Section``.
BENCHMARKS: dict[str, str] = {
    "proc_sampling": "1. Process-tree sampling",
    "monitor_overhead": "2. Whole-monitor overhead",
    "stall_detection": "3. Stall detection latency",
    "stop_latency": "4. Stop latency",
    "day_of_samples": "5. A day of samples",
    "gpu_sampling": "6. GPU sampling cost",
    "startup_overhead": "7. Start-up overhead",
    "queue_throughput": "8. Job queue",
    "progress_scan": "9. Progress scan",
    "log_capture": "10. Log capture",
    "metrics_serving": "11. Live metrics",
    "queue_backends": "12. Queue backends",
    "trends": "13. Trends",
    "report_render": "14. Report load and draw",
    "leak_corpus": "15. Leak corpus",
    "many_soaks": "16. Many soaks per process",
    "host_loop": "17. A soak's start on the host's loop",
}
#: Run beside the background item: light, and as long.
ALONGSIDE_BACKGROUND = ("gpu_sampling",)
BACKGROUND = "monitor_overhead"


class Background(Protocol):
    def finish(self) -> Section: ...


def machine_info() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    except OSError:
        pass
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    try:
        flags = next(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
        virtual = "yes (hypervisor CPU flag)" if " hypervisor" in flags else "no"
    except (OSError, StopIteration):
        virtual = "unknown"
    gpu = shutil.which("nvidia-smi")
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "CPU": model,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "virtual machine": virtual,
        "kernel": f"{platform.system()} {platform.release()}",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "GPU": "nvidia-smi at " + gpu if gpu else "none (no nvidia-smi on PATH)",
        "load average at start (1, 5, 15 min)": load,
        "commit": commit or "unknown",
    }


def fmt(value: float | None) -> str:
    if value is None:
        return ""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def verdict(figure: Figure) -> str:
    if figure.met is None:
        return ""
    return "met" if figure.met else "MISSED"


def rows(sections: Sequence[Section]) -> list[list[str]]:
    out = []
    for section in sections:
        for figure in section.figures:
            out.append(
                [
                    section.title.split(".", 1)[0],
                    figure.name,
                    f"{fmt(figure.value)} {figure.unit}",
                    figure.reference,
                    "" if figure.ratio is None else fmt(figure.ratio),
                    figure.target,
                    verdict(figure),
                ]
            )
    return out


HEADER = ["item", "figure", "value", "reference", "ratio", "target", ""]


def run_alone(run: Callable[[bool], Section], doc: str | None) -> None:
    """``python -m benchmarks.NAME [--quick]``: one benchmark on its own, its table printed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true")
    print_sections([run(parser.parse_args().quick)])


def print_sections(sections: Sequence[Section]) -> None:
    table = [HEADER, *rows(sections)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    for section in sections:
        if section.notes:
            print(f"\n{section.title}:")
            for note in section.notes:
                print(f"  - {note}")


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), line(["---"] * len(header)), *(line(r) for r in body)]


def results_markdown(
    sections: Sequence[Section], machine: dict[str, str], meta: dict[str, Any]
) -> str:
    out = [
        "# Benchmark results",
        "",
        f"Written by `python -m benchmarks` on {meta['date']} in {meta['minutes']:.1f} minutes. "
        "Every ratio divides a figure by its reference measured in the same run, in the same "
        "process where both are ours; comparisons are ratios of medians over several runs, "
        "latencies are p50 and p95 over at least 20 runs. The machine is shared (see the load "
        "average): read medians, not single runs. How each figure is measured is in the "
        "docstring of its module in `benchmarks/`. The notes after the tables explain the "
        "targets missed here (on this virtual machine a wake-up costs milliseconds of CPU) and "
        "record the changes made in the code for the targets, with figures before and after.",
        "",
        "## Machine",
        "",
        *markdown_table(["", ""], [[k, v] for k, v in machine.items()]),
        f"| load average at the end | {meta['load_end']} |",
        "",
        "## Targets",
        "",
    ]
    targets = [
        [s.title, f.name, f"{fmt(f.value)} {f.unit}", fmt(f.ratio), f.target, verdict(f)]
        for s in sections
        for f in s.figures
        if f.met is not None
    ]
    out += markdown_table(["item", "figure", "value", "ratio", "target", ""], targets)
    for section in sections:
        out += ["", f"## {section.title}", ""]
        body = [
            [
                f.name,
                f"{fmt(f.value)} {f.unit}",
                f.reference,
                "" if f.ratio is None else fmt(f.ratio),
                f.target,
                verdict(f),
            ]
            for f in section.figures
        ]
        out += markdown_table(["figure", "value", "reference", "ratio", "target", ""], body)
        if section.notes:
            out.append("")
            out += [f"- {note}" for note in section.notes]
        out.append(f"- took {section.seconds:.0f} s")
    if CHANGES.exists():
        out += ["", CHANGES.read_text().strip()]
    return "\n".join(out) + "\n"


def run_one(key: str, quick: bool) -> Section:
    started = time.monotonic()
    module = importlib.import_module(f"benchmarks.{key}")
    runner: Callable[[bool], Section] = module.run
    try:
        section = runner(quick)
    except Exception as exc:
        section = Section(key, BENCHMARKS[key])
        section.note(f"FAILED: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    section.seconds = time.monotonic() - started
    print(f"[{time.strftime('%H:%M:%S')}] {section.title}: {section.seconds:.0f} s", flush=True)
    return section


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    parser.add_argument(
        "--only", action="append", choices=sorted(BENCHMARKS), default=None, metavar="NAME"
    )
    parser.add_argument("--output", type=Path, default=None, help="where to write the results")
    args = parser.parse_args(argv)
    selected = [k for k in BENCHMARKS if args.only is None or k in args.only]
    output: Path | None = args.output
    if output is None and not args.quick and args.only is None:
        output = RESULTS

    machine = machine_info()
    started = time.monotonic()
    print(f"benchmarks: {', '.join(selected)}{' (quick)' if args.quick else ''}", flush=True)
    for key, value in machine.items():
        print(f"  {key}: {value}")
    sections: dict[str, Section] = {}
    background: Background | None = None
    background_started = 0.0
    if BACKGROUND in selected:
        background_started = time.monotonic()
        background = importlib.import_module(f"benchmarks.{BACKGROUND}").start(args.quick)
    for key in ALONGSIDE_BACKGROUND:
        if key in selected:
            sections[key] = run_one(key, args.quick)
    if background is not None:
        try:
            sections[BACKGROUND] = background.finish()
        except Exception as exc:
            sections[BACKGROUND] = Section(BACKGROUND, BENCHMARKS[BACKGROUND])
            sections[BACKGROUND].note(f"FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        sections[BACKGROUND].seconds = time.monotonic() - background_started
        print(
            f"[{time.strftime('%H:%M:%S')}] {BENCHMARKS[BACKGROUND]}: "
            f"{sections[BACKGROUND].seconds:.0f} s",
            flush=True,
        )
    for key in selected:
        if key not in sections:
            sections[key] = run_one(key, args.quick)
    ordered = [sections[k] for k in BENCHMARKS if k in sections]
    print()
    print_sections(ordered)
    if output is not None:
        meta = {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "minutes": (time.monotonic() - started) / 60,
            "load_end": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        }
        output.write_text(results_markdown(ordered, machine, meta))
        print(f"\nwrote {output}")
    failed = any(n.startswith("FAILED") for s in ordered for n in s.notes)
    missed = any(f.met is False for s in ordered for f in s.figures)
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
