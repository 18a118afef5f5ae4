"""The live view's frame, :class:`Status`, drawn as one line (its pieces dropped by importance
to fit the width, each in its short wording before it goes), plain or with ``rich``, or as the
full screen (``--view screen``): verdict so far, training, limits, processes, GPUs, log."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from .._contract import format_duration, terminal_text
from .._record import read_log_tail
from ._fields import format_value

#: The line's pieces, from the one kept longest to the one dropped first when the width is short.
PIECE_IMPORTANCE = (
    "phase",
    "alert",
    "stall",
    "training",
    "goodput",
    "warnings",
    "memory",
    "gpu",
    "changes",
    "as_of",
)
#: The pieces a short line gives up last: each keeps room for the ones after it.
LAST_DROPPED = frozenset({"phase", "alert", "stall"})
#: What the tree's figures say before the first sample that has them (a CPU rate needs two).
NOT_SAMPLED_YET = "CPU/RSS starting"
#: ``watch`` says how old what it shows is once the journal's last line is this old.
AS_OF_SHOWN_SECONDS = 1.0
#: Rows the full screen's last frame leaves below it for the verdict line and the prompt.
FINAL_VERDICT_ROWS = 4
#: Columns of the line's bar of the quiet time against its limit (the screen's: 20).
BAR_WIDTH = 16
SEPARATOR = "  "
#: Processes the full screen lists at most.
PROCESS_ROWS = 5


class Piece(NamedTuple):
    """One piece of the line: its name and its wordings, safe to print, the longest first."""

    name: str
    forms: tuple[str, ...]

    @property
    def text(self) -> str:
        return self.forms[0]


def _piece(name: str, text: str, *shorter: str) -> Piece:
    """A piece, its control characters spelled out; no wording at all without ``text``."""
    forms = (terminal_text(f) for f in (text, *shorter) if f) if text else ()
    return Piece(name, tuple(dict.fromkeys(forms)))


@dataclass(frozen=True, slots=True)
class Process:
    """A process of the tree as the full screen lists it: its memory and that memory's trend."""

    pid: int
    name: str
    memory_bytes: float | None
    trend: str | None


Gpus = tuple[tuple[str, float | None, float | None], ...]


@dataclass(frozen=True, slots=True)
class Status:
    """One frame of the live view."""

    elapsed: float
    phase: str
    #: Seconds without progress (since the start before the first), held against ``limit``.
    quiet_for: float | None
    limit: float | None
    limit_name: str
    changes: int
    tree_cpu_percent: float | None
    tree_rss_bytes: float | None
    gpus: Gpus
    finished: bool
    memory_trend: str | None = None
    #: What the trends said during the run: a leak, a projected breach (short texts).
    alerts: tuple[str, ...] = ()
    peak_cpu_percent: float | None = None
    peak_rss_bytes: float | None = None
    peak_gpus: Gpus = ()
    #: Warnings so far, and the one the last frame names.
    warnings: int = 0
    warning: str | None = None
    #: Whether the tree has been sampled with its figures (a CPU rate) yet.
    sampled: bool = True
    #: How old the knowledge shown is (``watch``: the journal's last line), None when current.
    behind: float | None = None
    changes_per_minute: float | None = None
    processes: tuple[Process, ...] = ()
    log_path: str | None = None
    training: str = ""
    #: Whether the step's advances are the progress (the changes are then file growth).
    steps_count: bool = False
    #: ``--expect-every``'s next deadline (GLOB, seconds left), when nearer than the stall's.
    deadline: tuple[str, float] | None = None
    goodput: str = ""

    def pieces(self) -> list[Piece]:
        pieces = [
            _piece("phase", f"{format_duration(self.elapsed)} {self.phase}"),
            _piece("training", self.training),
        ]
        if self.finished:
            pieces.append(_piece("goodput", self.goodput, self.goodput.partition(":")[0]))
            # The last line sums the run up: its peaks, not the last sample of an idle tree.
            if self.peak_cpu_percent is not None or self.peak_rss_bytes is not None:
                peak = _figures(self.peak_cpu_percent, self.peak_rss_bytes)
                pieces.append(_piece("memory", f"peak {peak}"))
            pieces += map(_alert_piece, self.alerts)
            pieces += self._warnings_pieces()
            pieces += (
                _piece("gpu", f"{group} peak {_gpu_figures(util, memory)}")
                for group, util, memory in self.peak_gpus
            )
            return [piece for piece in pieces if piece.forms]
        # A leak or a projected breach matters more than any figure: it comes first.
        pieces += map(_alert_piece, self.alerts)
        pieces.append(self._stall_piece())
        pieces += self._warnings_pieces()
        if not self.sampled:
            pieces.append(_piece("memory", NOT_SAMPLED_YET))
        elif self.tree_cpu_percent is not None or self.tree_rss_bytes is not None:
            figures, trend = _figures(self.tree_cpu_percent, self.tree_rss_bytes), self.memory_trend
            pieces.append(
                _piece(
                    "memory",
                    figures + (f" ({trend})" if trend else ""),
                    figures + (f" {trend}" if trend else ""),
                    f"RSS {format_value(self.tree_rss_bytes, 'bytes')}",
                )
            )
        pieces += (
            _piece("gpu", f"{group} {_gpu_figures(util, memory)}")
            for group, util, memory in self.gpus
            if util is not None or memory is not None  # not sampled yet: no placeholder figures
        )
        if self.changes:
            rate = self.changes_per_minute
            per_minute = f", {rate:.0f}/min" if rate is not None else ""
            what = "file" if self.steps_count else "progress"
            word = f"change{'s' if self.changes != 1 else ''}"
            text = f"{self.changes} {what} {word}{per_minute}"
            pieces.append(_piece("changes", text, f"{self.changes} {word}"))
        if self.behind is not None and self.behind >= AS_OF_SHOWN_SECONDS:
            ago = f"as of {format_duration(self.behind)} ago"
            pieces.append(_piece("as_of", f"{ago} (the journal's last line)", ago))
        return [piece for piece in pieces if piece.forms]

    def with_progress_age(self, age: float | None) -> Status:
        """The frame with the time since the last progress a look between the scans found
        (``SoakControl.progress_age``), when it is fresher than the events'."""
        if age is None or self.finished or self.quiet_for is None:
            return self
        fresher = self.limit_name == "stale" and age < self.quiet_for
        return replace(self, quiet_for=age) if fresher else self

    def deadline_words(self) -> tuple[str, str] | None:
        """``--expect-every``'s nearest deadline in words: ``("checkpoint-*", "due in 4m")``
        (``overdue 1m`` when late), or None when the stall limit comes first."""
        if self.deadline is None:
            return None
        glob, left = self.deadline
        return glob, ("due in " if left >= 0 else "overdue ") + format_duration(abs(left))

    def _stall_piece(self) -> Piece:
        deadline = self.deadline_words()
        if self.quiet_for is None:
            return _piece("stall", "")
        if deadline is not None:
            return _piece("stall", " ".join(deadline), deadline[1])
        limit = format_duration(self.limit) if self.limit else None
        quiet = format_duration(self.quiet_for)
        if self.limit_name == "stale":
            return _piece(
                "stall",
                f"last progress {quiet} ago" + (f" (stale limit {limit})" if limit else ""),
                f"no progress {quiet}" + (f"/{limit}" if limit else ""),
            )
        # The phase already says it waits for the first progress, since the start.
        text = f"{quiet} (startup limit {limit})" if limit else ""
        return _piece("stall", text, f"startup limit {limit}")

    def _warnings_pieces(self) -> list[Piece]:
        if not self.warnings:
            return []
        count = f"{self.warnings} warning{'s' if self.warnings != 1 else ''}"
        if self.finished and self.warning:
            return [_piece("warnings", f"{count}: {self.warning}", count)]
        return [_piece("warnings", count)]

    def parts(self) -> list[str]:
        return [piece.text for piece in self.pieces()]

    def plain(self) -> str:
        return "asyncsoak: " + " | ".join(self.parts())


def _alert_piece(alert: str) -> Piece:
    # ``LEAK pid 7 +921.6 MiB/min, limit in 41m00s``: the projection goes first when short,
    # then the rate; who leaks stays.
    short = alert.split(", ")[0]
    words = short.split(" ")
    who = 3 if words[:2] == ["LEAK", "pid"] else 2
    return _piece("alert", alert, short, " ".join(words[:who]) if words[0] == "LEAK" else "")


def _figures(cpu: float | None, rss: float | None, gap: str = " ") -> str:
    return f"CPU {format_value(cpu, '%')}{gap}RSS {format_value(rss, 'bytes')}"


def _gpu_figures(util: float | None, memory: float | None) -> str:
    return f"{format_value(util, '%')} {format_value(memory, 'MiB')}"


def fit_pieces(
    pieces: Sequence[Piece], width: int, separator: str = " | "
) -> list[tuple[Piece, str]]:
    """The pieces that fit in ``width`` columns with the wording chosen (docs/architecture.md):
    a piece is left out, never cut mid-word, except the first, alone too wide."""
    chosen: dict[int, str] = {}

    def room_for(text: str, reserve: int = 0) -> bool:
        used = sum(map(len, chosen.values())) + len(separator) * len(chosen)
        return used + len(text) + reserve <= width

    order = sorted(range(len(pieces)), key=lambda i: PIECE_IMPORTANCE.index(pieces[i].name))
    essential = [i for i in order if pieces[i].name in LAST_DROPPED]
    for n, i in enumerate(essential):
        reserve = sum(len(pieces[j].forms[-1]) + len(separator) for j in essential[n + 1 :])
        forms = pieces[i].forms[1:] or pieces[i].forms  # the long wording waits for room left
        pick = next((f for f in forms if room_for(f, reserve)), None)
        if pick is None:
            pick = next((f for f in reversed(forms) if room_for(f)), None)
        if pick is None and not chosen:
            pick = _shorten_words(pieces[i].forms[-1], width)
        if pick is not None:
            chosen[i] = pick
    for i in order:
        if i not in chosen and pieces[i].name not in LAST_DROPPED:
            if room_for(pieces[i].forms[-1]):
                chosen[i] = pieces[i].forms[-1]
            elif not chosen:
                chosen[i] = _shorten_words(pieces[i].forms[-1], width)
    for i in order:
        if i in chosen:
            current = chosen.pop(i)
            chosen[i] = next((f for f in pieces[i].forms if room_for(f)), current)
    return [(pieces[i], chosen[i]) for i in sorted(chosen)]


def _shorten_words(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)].rsplit(" ", 1)[0] + "…"


def phase_style(status: Status) -> str:
    """The phase's colour: red for a failure, amber for warnings, green while all is well."""
    if status.phase.startswith(("stopping", "finished: failed", "finished: error")):
        return "bold red"
    if status.warnings or status.alerts:
        return "bold yellow"
    if status.phase.startswith(("finished", "command exited")):
        return "bold"
    return "bold green"


def quiet_bar(status: Status, width: int, finished_style: str = "bar.finished") -> Any:
    """The quiet time against its limit as a bar, green to red; None without a limit."""
    from rich.progress_bar import ProgressBar

    quiet, limit = status.quiet_for, status.limit
    if quiet is None or not limit:
        return None
    ratio = min(1.0, quiet / limit)
    return ProgressBar(
        total=limit,
        completed=min(quiet, limit),
        width=width,
        complete_style="green" if ratio < 0.5 else "yellow" if ratio < 0.8 else "red",
        finished_style=finished_style,
    )


def render_rich(status: Status, width: int = 80) -> Any:
    """One line of at most ``width`` columns: the bar dropped first, then whole pieces."""
    from rich.table import Table
    from rich.text import Text

    pieces = status.pieces()
    bar = quiet_bar(status, BAR_WIDTH, finished_style="red") if not status.finished else None
    kept = fit_pieces(pieces, width - BAR_WIDTH - 1, SEPARATOR) if bar is not None else []
    if len(kept) < len(pieces):
        # The line does not fit with the bar: the bar goes before any piece does.
        bar = None
        kept = fit_pieces(pieces, width, SEPARATOR)
    styles = {"alert": "bold red", "warnings": "yellow", "as_of": "dim"}
    elapsed, _, phase = kept[0][1].partition(" ")
    cells: list[Any] = [Text.assemble((elapsed, "bold"), " ", (phase, phase_style(status)))]
    for piece, text in kept[1:]:
        cells.append(Text(SEPARATOR))
        if bar is not None and piece.name == "stall":
            cells += [bar, Text(" " + text)]
        else:
            cells.append(Text(text, style=styles.get(piece.name, "")))
    grid = Table.grid()
    for _ in cells:
        grid.add_column(no_wrap=True)
    grid.add_row(*cells)
    return grid


def log_tail(path: str | None, lines: int) -> list[str]:
    """The last ``lines`` lines of the log (the artifact's tail), safe to print."""
    if not path or lines <= 0:
        return []
    text = read_log_tail(Path(path)).replace("\r", "\n")
    kept = [line for line in text.splitlines() if line.strip()]
    return [terminal_text(line) for line in kept[-lines:]]


def render_screen(status: Status, width: int, height: int) -> Any:
    """The whole frame for a terminal of ``width`` x ``height``."""
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    finished, plural = status.finished, "s" if status.warnings != 1 else ""
    title = Text.assemble(
        ("asyncsoak  ", "dim"),
        (format_duration(status.elapsed), "bold"),
        "  ",
        (terminal_text(status.phase), phase_style(status)),
    )
    if status.warnings:
        title.append(f"  {status.warnings} warning{plural}", style="yellow")
    parts: list[Any] = [title, *(Text(terminal_text(a), style="bold red") for a in status.alerts)]

    progress = Table.grid(padding=(0, 2))
    # The labels keep their width: a long row is cut at its end, not at its label.
    progress.add_column(style="dim", no_wrap=True, min_width=len("progress"))
    progress.add_column(no_wrap=True)
    if status.training:
        progress.add_row("training", terminal_text(status.training))
    rate = status.changes_per_minute
    progress.add_row(
        "progress",
        f"{status.changes} change{'s' if status.changes != 1 else ''}"
        + (f", {rate:.0f}/min lately" if rate else ""),
    )
    if status.quiet_for is not None and not finished:
        label = "without progress" if status.limit_name == "stale" else "since the start"
        text = Text(f"{format_duration(status.quiet_for)} {label}")
        if status.limit:
            text.append(f" (limit {format_duration(status.limit)})", style="dim")
            row = Table.grid(padding=(0, 1))
            row.add_column(no_wrap=True)
            row.add_column(no_wrap=True)
            row.add_row(quiet_bar(status, 20), text)
            progress.add_row("stall", row)
        else:
            progress.add_row("stall", text)
    deadline = status.deadline_words()
    if deadline is not None and not finished:
        progress.add_row("deadline", f"{terminal_text(deadline[0])} {deadline[1]}")
    if status.behind is not None and status.behind >= AS_OF_SHOWN_SECONDS:
        progress.add_row("as of", f"{format_duration(status.behind)} ago (the journal's last line)")
    if finished:
        # A run shorter than a sample has no peaks: no placeholder figures for them.
        if status.peak_cpu_percent is not None or status.peak_rss_bytes is not None:
            peaks = _figures(status.peak_cpu_percent, status.peak_rss_bytes, "  ")
            progress.add_row("peaks", peaks)
    elif not status.sampled:
        progress.add_row("tree", "starting")
    else:
        trend = f"  ({status.memory_trend})" if status.memory_trend else ""
        figures = _figures(status.tree_cpu_percent, status.tree_rss_bytes, "  ")
        progress.add_row("tree", figures + trend)
    parts.append(progress)

    def table(*columns: tuple[str, dict[str, Any]]) -> Any:
        grid = Table(box=None, padding=(0, 2), show_edge=False, header_style="dim")
        for name, options in columns:
            grid.add_column(name, **options)
        parts.extend([Text(""), grid])
        return grid

    if status.processes and not finished:
        rows = table(
            ("pid", {"justify": "right", "no_wrap": True}),
            ("process", {"no_wrap": True, "max_width": max(10, width // 3)}),
            ("memory", {"justify": "right", "no_wrap": True}),
            ("trend", {"no_wrap": True}),
        )
        for process in status.processes[:PROCESS_ROWS]:
            trend = process.trend or ""
            rows.add_row(
                str(process.pid),
                terminal_text(process.name),
                format_value(process.memory_bytes, "bytes"),
                Text(trend, style="red" if trend.startswith("+") else ""),
            )
    shown = [g for g in (status.peak_gpus if finished else status.gpus) if g[1:] != (None, None)]
    if shown:
        peak = "peak " if finished else ""
        rows = table(
            ("gpu", {"no_wrap": True}),
            (f"{peak}util", {"justify": "right"}),
            (f"{peak}memory", {"justify": "right"}),
        )
        for group, util, memory in shown:
            rows.add_row(terminal_text(group), format_value(util, "%"), format_value(memory, "MiB"))

    # As much of the log's end as the rows left leave room for.
    console = Console(width=max(20, width), color_system=None, file=io.StringIO())
    used = sum(len(console.render_lines(part, pad=False)) for part in parts)
    lines = log_tail(status.log_path, height - used - 3)
    if lines:
        parts += [Text(""), Text(f"log: {terminal_text(status.log_path or '')}", style="dim")]
        parts.extend(Text(line, no_wrap=True, overflow="ellipsis") for line in lines)
    return Group(*parts)
