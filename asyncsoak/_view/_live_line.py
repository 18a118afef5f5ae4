"""The live view's line: the :class:`Status` drawn, its pieces dropped by importance to fit the
width (each in its short wording before it goes), plain or with ``rich``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._contract import format_duration, terminal_text
from ._fields import format_value

#: The line's pieces, from the one kept longest to the one dropped first when the width is
#: short: the phase (and verdict), a LEAK or projected breach, the stall countdown, the
#: training's step, rate and ETA (``Status.training``), warnings, then the figures.  A new
#: piece takes its place here and in :meth:`Status.pieces`.
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
#: What the tree's figures say before the first sample that has them (a CPU rate needs two).
NOT_SAMPLED_YET = "CPU/RSS starting"


#: The pieces a short line gives up last: each keeps room for the ones after it.
LAST_DROPPED = frozenset({"phase", "alert", "stall"})


@dataclass(frozen=True, slots=True)
class Piece:
    """One piece of the line: its name (in :data:`PIECE_IMPORTANCE`), its wording, a shorter
    wording and a shortest one for narrow terminals (empty: none shorter)."""

    name: str
    text: str
    short: str = ""
    tiny: str = ""

    @property
    def importance(self) -> int:
        return PIECE_IMPORTANCE.index(self.name)

    @property
    def forms(self) -> tuple[str, ...]:
        """Its wordings, the longest first."""
        return tuple(dict.fromkeys(f for f in (self.text, self.short, self.tiny) if f))

    def shortest(self) -> str:
        return self.forms[-1]


@dataclass(frozen=True, slots=True)
class Process:
    """A process of the tree as the full screen lists it: its memory and that memory's trend."""

    pid: int
    name: str
    memory_bytes: float | None
    trend: str | None


@dataclass(frozen=True, slots=True)
class Status:
    """One frame of the live view."""

    elapsed: float
    phase: str
    #: Seconds without progress (since the start before the first one), as of the knowledge
    #: the view has: now in ``run``, the journal's last line in ``watch``.
    quiet_for: float | None
    #: The limit ``quiet_for`` is held against, and its name.
    limit: float | None
    limit_name: str
    changes: int
    tree_cpu_percent: float | None
    tree_rss_bytes: float | None
    #: (group, utilisation percent, memory used MiB)
    gpus: tuple[tuple[str, float | None, float | None], ...]
    finished: bool
    #: The tree's memory trend so far (``+12.0 MiB/min``), when one is known.
    memory_trend: str | None = None
    #: What the trends said during the run: a leak, a projected breach (short texts).
    alerts: tuple[str, ...] = ()
    #: Peaks over the run: tree CPU and RSS, and (group, utilisation, memory MiB) per GPU.
    peak_cpu_percent: float | None = None
    peak_rss_bytes: float | None = None
    peak_gpus: tuple[tuple[str, float | None, float | None], ...] = ()
    #: Warnings so far (a pass with warnings is not a clean pass), and the one the last
    #: frame names (:func:`named_warning`).
    warnings: int = 0
    warning: str | None = None
    #: Whether the tree has been sampled with its figures (a CPU rate) yet.
    sampled: bool = True
    #: How old the knowledge shown is (``watch``: the journal's last line), None when current.
    behind: float | None = None
    #: Progress changes a minute over the last minute.
    changes_per_minute: float | None = None
    #: The tree's processes by memory, the largest first (the full screen's table).
    processes: tuple[Process, ...] = ()
    #: The soak's log, for the full screen's last lines.
    log_path: str | None = None
    #: The artifact's status once finished (``passed``...), None before.
    status: str | None = None
    #: The training's step, rate, loss and ETA, when a step source says them (one piece).
    training: str = ""
    #: Whether the step's advances are the progress (the changes are then file growth).
    steps_count: bool = False
    #: ``--expect-every``'s next deadline (GLOB, seconds left), when nearer than the stall's.
    deadline: tuple[str, float] | None = None
    #: The last frame's goodput line (``goodput 78.6 %: lost ...``), when the run wrote steps.
    goodput: str = ""

    def pieces(self) -> list[Piece]:
        """The line's pieces in the order shown (:data:`PIECE_IMPORTANCE`); what the journal
        said has its control characters spelled out: the pieces go to a terminal."""
        pieces = [Piece("phase", f"{format_duration(self.elapsed)} {self.phase}")]
        if self.training:
            pieces.append(Piece("training", self.training))
        if self.finished:
            if self.goodput:
                pieces.append(Piece("goodput", self.goodput, self.goodput.partition(":")[0]))
            # The last line sums the run up: its peaks, not the last sample of an idle tree.
            if self.peak_cpu_percent is not None or self.peak_rss_bytes is not None:
                peak = _figures(self.peak_cpu_percent, self.peak_rss_bytes)
                pieces.append(Piece("memory", f"peak {peak}"))
            pieces.extend(_alert_piece(alert) for alert in self.alerts)
            pieces.extend(self._warnings_pieces())
            pieces.extend(
                Piece("gpu", f"{group} peak {_gpu_figures(util, memory)}")
                for group, util, memory in self.peak_gpus
            )
            return _safe(pieces)
        # A leak or a projected breach matters more than any figure: it comes first.
        pieces.extend(_alert_piece(alert) for alert in self.alerts)
        stall = self._stall_piece()
        if stall is not None:
            pieces.append(stall)
        pieces.extend(self._warnings_pieces())
        if not self.sampled:
            pieces.append(Piece("memory", NOT_SAMPLED_YET))
        elif self.tree_cpu_percent is not None or self.tree_rss_bytes is not None:
            figures = _figures(self.tree_cpu_percent, self.tree_rss_bytes)
            trend = self.memory_trend
            pieces.append(
                Piece(
                    "memory",
                    figures + (f" ({trend})" if trend else ""),
                    figures + (f" {trend}" if trend else ""),
                    f"RSS {format_value(self.tree_rss_bytes, 'bytes')}",
                )
            )
        pieces.extend(
            Piece("gpu", f"{group} {_gpu_figures(util, memory)}")
            for group, util, memory in self.gpus
            if util is not None or memory is not None  # not sampled yet: no placeholder figures
        )
        if self.changes:
            rate = self.changes_per_minute
            per_minute = f", {rate:.0f}/min" if rate is not None else ""
            what = "file" if self.steps_count else "progress"
            changes = f"change{'s' if self.changes != 1 else ''}"
            text = f"{self.changes} {what} {changes}{per_minute}"
            pieces.append(Piece("changes", text, f"{self.changes} {changes}"))
        if self.behind is not None and self.behind >= AS_OF_SHOWN_SECONDS:
            ago = f"as of {format_duration(self.behind)} ago"
            pieces.append(Piece("as_of", f"{ago} (the journal's last line)", ago))
        return _safe(pieces)

    def with_progress_age(self, age: float | None) -> Status:
        """The frame with the time since the last progress a look between the scans found
        (``SoakControl.progress_age``), when it is fresher than the events'."""
        if (
            age is None
            or self.finished
            or self.quiet_for is None
            or self.limit_name != "stale"
            or age >= self.quiet_for
        ):
            return self
        return replace(self, quiet_for=age)

    def deadline_words(self) -> tuple[str, str] | None:
        """``--expect-every``'s nearest deadline in words: ``("checkpoint-*", "due in 4m")``
        (``overdue 1m`` when late), or None when the stall limit comes first."""
        if self.deadline is None:
            return None
        glob, left = self.deadline
        return glob, ("due in " if left >= 0 else "overdue ") + format_duration(abs(left))

    def _stall_piece(self) -> Piece | None:
        if self.quiet_for is None:
            return None
        deadline = self.deadline_words()
        if deadline is not None:
            return Piece("stall", " ".join(deadline), deadline[1])
        limit = format_duration(self.limit) if self.limit else None
        quiet = format_duration(self.quiet_for)
        if self.limit_name == "stale":
            return Piece(
                "stall",
                f"last progress {quiet} ago" + (f" (stale limit {limit})" if limit else ""),
                f"no progress {quiet}" + (f"/{limit}" if limit else ""),
            )
        if not limit:
            return None
        # The phase already says it waits for the first progress, since the start.
        return Piece("stall", f"{quiet} (startup limit {limit})", f"startup limit {limit}")

    def _warnings_pieces(self) -> list[Piece]:
        if not self.warnings:
            return []
        count = f"{self.warnings} warning{'s' if self.warnings != 1 else ''}"
        if self.finished and self.warning:
            return [Piece("warnings", f"{count}: {terminal_text(self.warning)}", count)]
        return [Piece("warnings", count)]

    def parts(self) -> list[str]:
        """The pieces' wordings in order."""
        return [piece.text for piece in self.pieces()]

    def plain(self) -> str:
        return "asyncsoak: " + " | ".join(self.parts())


#: ``watch`` says how old what it shows is once the journal's last line is this old.
AS_OF_SHOWN_SECONDS = 1.0


def _alert_piece(alert: str) -> Piece:
    # ``LEAK pid 7 +921.6 MiB/min, limit in 41m00s``: the projection goes first when short,
    # then the rate; who leaks stays.
    short = alert.split(", ")[0]
    words = short.split(" ")
    who = 3 if words[:2] == ["LEAK", "pid"] else 2
    return Piece("alert", alert, short, " ".join(words[:who]) if words[0] == "LEAK" else "")


def _figures(cpu: float | None, rss: float | None) -> str:
    return f"CPU {format_value(cpu, '%')} RSS {format_value(rss, 'bytes')}"


def _gpu_figures(util: float | None, memory: float | None) -> str:
    return f"{format_value(util, '%')} {format_value(memory, 'MiB')}"


def _safe(pieces: list[Piece]) -> list[Piece]:
    return [
        Piece(p.name, *(terminal_text(form) if form else "" for form in (p.text, p.short, p.tiny)))
        for p in pieces
        if p.text
    ]


def fit_pieces(
    pieces: Sequence[Piece], width: int, separator: str = " | "
) -> list[tuple[Piece, str]]:
    """The pieces that fit in ``width`` columns, each with the wording chosen, in their order
    (the order of choice is in docs/architecture.md): a piece is left out, never cut mid-word,
    except the first, alone too wide."""
    chosen: dict[int, str] = {}

    def room_for(text: str, reserve: int = 0) -> bool:
        used = sum(map(len, chosen.values())) + len(separator) * len(chosen)
        return used + len(text) + reserve <= width

    order = sorted(range(len(pieces)), key=lambda i: pieces[i].importance)
    essential = [i for i in order if pieces[i].name in LAST_DROPPED]
    for n, i in enumerate(essential):
        reserve = sum(len(pieces[j].shortest()) + len(separator) for j in essential[n + 1 :])
        forms = pieces[i].forms[1:] or pieces[i].forms  # the long wording waits for room left
        pick = next((f for f in forms if room_for(f, reserve)), None)
        if pick is None:
            pick = next((f for f in reversed(forms) if room_for(f)), None)
        if pick is None and not chosen:
            pick = _shorten_words(pieces[i].shortest(), width)
        if pick is not None:
            chosen[i] = pick
    for i in order:
        if i not in chosen and pieces[i].name not in LAST_DROPPED:
            if room_for(pieces[i].shortest()):
                chosen[i] = pieces[i].shortest()
            elif not chosen:
                chosen[i] = _shorten_words(pieces[i].shortest(), width)
    for i in order:
        if i in chosen:
            current = chosen.pop(i)
            chosen[i] = next((f for f in pieces[i].forms if room_for(f)), current)
    return [(pieces[i], chosen[i]) for i in sorted(chosen)]


def _shorten_words(text: str, width: int) -> str:
    """``text`` cut at a word boundary to fit ``width`` with an ellipsis."""
    if len(text) <= width:
        return text
    cut = text[: max(0, width - 1)].rsplit(" ", 1)[0]
    return cut + "…"


#: Rows the full screen's last frame leaves below it for the verdict printed after it (the
#: line of ``run`` or ``watch``, wrapped on a narrow terminal) and the shell's prompt.
FINAL_VERDICT_ROWS = 4
#: Columns of the bar of the quiet time against its limit.
BAR_WIDTH = 16
#: Between two pieces of the terminal line.
SEPARATOR = "  "


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
    colour = "green" if ratio < 0.5 else "yellow" if ratio < 0.8 else "red"
    return ProgressBar(
        total=limit,
        completed=min(quiet, limit),
        width=width,
        complete_style=colour,
        finished_style=finished_style,
    )


def render_rich(status: Status, width: int = 80) -> Any:
    """One line of at most ``width`` columns: whole pieces only, the bar dropped first, then
    the pieces by :data:`PIECE_IMPORTANCE`."""
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
    cells: list[Any] = []
    for i, (piece, text) in enumerate(kept):
        if i == 0:
            elapsed, _, phase = text.partition(" ")
            cells.append(Text.assemble((elapsed, "bold"), " ", (phase, phase_style(status))))
            continue
        cells.append(Text(SEPARATOR))
        if bar is not None and piece.name == "stall":
            cells.extend([bar, Text(" " + text)])
        else:
            cells.append(Text(text, style=styles.get(piece.name, "")))
    grid = Table.grid()
    for _ in cells:
        grid.add_column(no_wrap=True)
    grid.add_row(*cells)
    return grid
