"""The live view's full screen (``--view screen``), drawn with ``rich`` from the line's
:class:`~._live_line.Status`: the verdict so far, training, progress and its limits, the
tree and its processes, the GPUs, and as much of the log's end as the height leaves room for."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from .._contract import format_duration, terminal_text
from .._record import read_log_tail
from ._fields import format_value
from ._live_line import AS_OF_SHOWN_SECONDS, Status, phase_style, quiet_bar

#: Processes listed at most.
PROCESS_ROWS = 5


def log_tail(path: str | None, lines: int) -> list[str]:
    """The last ``lines`` lines of the log at ``path`` (from the same tail the artifact
    keeps), safe to print; nothing when it cannot be read."""
    if not path or lines <= 0:
        return []
    text = read_log_tail(Path(path)).replace("\r", "\n")
    kept = [line for line in text.splitlines() if line.strip()]
    return [terminal_text(line) for line in kept[-lines:]]


def render_screen(status: Status, width: int, height: int) -> Any:
    """The whole frame for a terminal of ``width`` x ``height``."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    title = Text.assemble(
        ("asyncsoak  ", "dim"),
        (format_duration(status.elapsed), "bold"),
        "  ",
        (terminal_text(status.phase), phase_style(status)),
    )
    if status.warnings:
        title.append(
            f"  {status.warnings} warning{'s' if status.warnings != 1 else ''}", style="yellow"
        )
    parts.append(title)
    parts += (Text(terminal_text(alert), style="bold red") for alert in status.alerts)

    progress = Table.grid(padding=(0, 2))
    # The labels keep their width: a long row is cut at its end, not at its label.
    progress.add_column(style="dim", no_wrap=True, min_width=len("progress"))
    progress.add_column(no_wrap=True)
    if status.training:  # step, rate, loss and ETA, as the line says them
        progress.add_row("training", terminal_text(status.training))
    rate = status.changes_per_minute
    progress.add_row(
        "progress",
        f"{status.changes} change{'s' if status.changes != 1 else ''}"
        + (f", {rate:.0f}/min lately" if rate else ""),
    )
    if status.quiet_for is not None and not status.finished:
        label = "without progress" if status.limit_name == "stale" else "since the start"
        text = Text(f"{format_duration(status.quiet_for)} {label}")
        if status.limit:
            text.append(f" (limit {format_duration(status.limit)})", style="dim")
            bar = quiet_bar(status, 20)
            row = Table.grid(padding=(0, 1))
            row.add_column(no_wrap=True)
            row.add_column(no_wrap=True)
            row.add_row(bar, text)
            progress.add_row("stall", row)
        else:
            progress.add_row("stall", text)
    deadline = status.deadline_words()
    if deadline is not None and not status.finished:
        progress.add_row("deadline", f"{terminal_text(deadline[0])} {deadline[1]}")
    if status.behind is not None and status.behind >= AS_OF_SHOWN_SECONDS:
        progress.add_row("as of", f"{format_duration(status.behind)} ago (the journal's last line)")
    if status.finished:
        # A run shorter than a sample has no peaks: no placeholder figures for them.
        if status.peak_cpu_percent is not None or status.peak_rss_bytes is not None:
            progress.add_row(
                "peaks",
                f"CPU {format_value(status.peak_cpu_percent, '%')}  "
                f"RSS {format_value(status.peak_rss_bytes, 'bytes')}",
            )
    elif not status.sampled:
        progress.add_row("tree", "starting")
    else:
        trend = f"  ({status.memory_trend})" if status.memory_trend else ""
        progress.add_row(
            "tree",
            f"CPU {format_value(status.tree_cpu_percent, '%')}  "
            f"RSS {format_value(status.tree_rss_bytes, 'bytes')}{trend}",
        )
    parts.append(progress)

    if status.processes and not status.finished:
        table = Table(box=None, padding=(0, 2), show_edge=False, header_style="dim")
        table.add_column("pid", justify="right", no_wrap=True)
        table.add_column("process", no_wrap=True, max_width=max(10, width // 3))
        table.add_column("memory", justify="right", no_wrap=True)
        table.add_column("trend", no_wrap=True)
        for process in status.processes[:PROCESS_ROWS]:
            trend = process.trend or ""
            table.add_row(
                str(process.pid),
                terminal_text(process.name),
                format_value(process.memory_bytes, "bytes"),
                Text(trend, style="red" if trend.startswith("+") else ""),
            )
        parts += [Text(""), table]

    gpus = status.peak_gpus if status.finished else status.gpus
    shown = [g for g in gpus if g[1] is not None or g[2] is not None]
    if shown:
        table = Table(box=None, padding=(0, 2), show_edge=False, header_style="dim")
        table.add_column("gpu", no_wrap=True)
        table.add_column("peak util" if status.finished else "util", justify="right")
        table.add_column("peak memory" if status.finished else "memory", justify="right")
        for group, util, memory in shown:
            table.add_row(
                terminal_text(group), format_value(util, "%"), format_value(memory, "MiB")
            )
        parts += [Text(""), table]

    lines = log_tail(status.log_path, height - _rows(parts, width) - 3)
    if lines:
        parts += [Text(""), Text(f"log: {terminal_text(status.log_path or '')}", style="dim")]
        parts.extend(Text(line, no_wrap=True, overflow="ellipsis") for line in lines)
    return Group(*parts)


def _rows(parts: list[Any], width: int) -> int:
    """How many terminal rows ``parts`` take at ``width`` columns."""
    from rich.console import Console

    console = Console(width=max(20, width), color_system=None, file=io.StringIO())
    return sum(len(console.render_lines(part, pad=False)) for part in parts)
