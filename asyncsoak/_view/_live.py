"""The live view: how a soak is doing, while it runs.

Two sources feed one :class:`LiveState`.  Inside ``asyncsoak run`` it is the monitor's own
knowledge: the view is one more observer of the serializer (``SoakControl.observers``), fed each
event when the monitor emits it, so the time since the last progress is what the monitor knows
when the line is drawn, not what its journal (written once per sample interval) said.
``asyncsoak watch`` reads the journal as it grows (:class:`JournalTail`, bounded incremental
reads); what it shows is then as of the journal's last line, and it says how old that is.

On a terminal it keeps one compact status line in place (with ``rich``, the ``live`` extra), or
a full screen (:mod:`._screen`) when asked and the terminal is tall enough; anywhere else, or
without ``rich``, it prints a plain line when the phase changes and every ``status_interval``
seconds, so CI logs and ``nohup`` output stay readable.

The line is an ordered list of :class:`Piece`; when the width is short, pieces are dropped by
:data:`PIECE_IMPORTANCE` (the least important first), each shown in its short wording before
it is dropped, and a wide terminal gets the long wordings.

It must never delay or break the soak: file reads and terminal writes run in worker threads
under its own limiter (a terminal paused with Ctrl-S blocks the write, not the event loop),
its own errors end the view and nothing else, and its last frame is drawn under a short,
shielded bound.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Protocol, TextIO, TypedDict, cast

import anyio

from .._analysis import MAX_WINDOWS, SAMPLES_PER_WINDOW, theil_sen, windowed_minima
from .._contract import (
    MAX_LINE_BYTES,
    EventFold,
    EventJson,
    EventKind,
    ExitedJson,
    FailureJson,
    FinishedJson,
    GpuFaultJson,
    GpuSampleJson,
    HeaderJson,
    ProgressJson,
    SampleJson,
    StartedJson,
    StepJson,
    StopJson,
    TrendJson,
    UnreadableFileError,
    WarningJson,
    epoch,
    format_duration,
    run_blocking,
    terminal_text,
)
from .._record import JournalDecoder
from ._fields import format_value, gpu_index
from ._status import shown_status
from ._training import training_line

if TYPE_CHECKING:
    from .._supervisor import SoakControl

#: Seconds between two reads of the journal (and two frames on a terminal).
REFRESH_SECONDS = 0.5
#: Bytes read from the journal at most per refresh; a backlog is caught up over later ones.
READ_CHUNK = 4 * 1024 * 1024
#: Bound on drawing the last frame once the soak is over.
FINAL_FRAME_SECONDS = 1.0
#: Bound on one read of the journal or one frame drawn (a hung disk, a blocked terminal).
VIEW_CALL_TIMEOUT_SECONDS = 10.0


class JournalTail:
    """Complete events appended to a journal since the last read.

    The journal of an earlier run may still sit at the same path until the monitor truncates
    it, so lines are only taken once the first line is a header written by ``monitor_pid``.
    The open segment is held open between reads: when the serializer closes it (renames it
    aside and starts a new one at the path, see ``_journal``), its last lines are still read
    from the file held, then the tail moves on to the new segment.  Call :meth:`close` at
    the end.
    """

    def __init__(
        self, path: Path, monitor_pid: int | None = None, *, header_first: bool = True
    ) -> None:
        self.path = path
        self.monitor_pid = monitor_pid
        #: False when attaching to a journal whose earlier segments were read already: the
        #: open segment then starts with whatever event came after the last rotation.
        self.header_first = header_first
        self._file: BinaryIO | None = None
        self._offset = 0
        self._ours = False
        #: In the middle of a line longer than any event, dropped up to its end.
        self._skipping = False
        self._decoder = JournalDecoder()
        #: Reads begun so far, and the number of the last one that found nothing new, the
        #: journal read to its end: a read begun after a moment that finds nothing means that
        #: all written before that moment was read (and folded: there was nothing to fold).
        self.reads_begun = 0
        self.last_read_to_end = 0
        #: Whether the last chunk read reached the end of the file.
        self._at_end = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self) -> list[EventJson]:
        self.reads_begun += 1
        number = self.reads_begun
        self._at_end = True
        events = self._read()
        if not events and self._at_end:
            self.last_read_to_end = number
        return events

    def _read(self) -> list[EventJson]:
        events: list[EventJson] = []
        if self._file is not None and os.fstat(self._file.fileno()).st_size < self._offset:
            # Truncated: a new soak took the path over.
            self.close()
            self._ours = False
        if self._file is None and not self._open():
            return events
        assert self._file is not None
        if not self._ours:
            self._decoder = JournalDecoder()
            self._file.seek(0)
            first = self._file.readline(MAX_LINE_BYTES + 1)
            if not first.endswith(b"\n") or (self.header_first and not self._is_our_header(first)):
                self.close()  # not ours (yet): look again at the path next time
                return events
            self._ours = True
        events += self._read_on()
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return events
        held = os.fstat(self._file.fileno())
        if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
            # The segment was closed: its writes were all done before it was renamed.
            events += self._read_on()
            self.close()
            if self._open():
                self._decoder.reset()
                events += self._read_on()
        return events

    def _open(self) -> bool:
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (held until close())
        except FileNotFoundError:
            return False
        self._offset = 0
        self._skipping = False
        return True

    def _read_on(self) -> list[EventJson]:
        assert self._file is not None
        self._file.seek(self._offset)
        data = self._file.read(READ_CHUNK)
        # A last line without its end yet (or ever, from a monitor that died mid-write) is
        # the end too: nothing more can be read now.
        self._at_end = len(data) < READ_CHUNK
        if self._skipping:
            end = data.find(b"\n") + 1
            self._offset += end or len(data)
            self._skipping = not end
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete and len(data) == READ_CHUNK:
            # One line longer than a read: read on to its end, as far as a line may go.
            wanted = max(1, MAX_LINE_BYTES + 1 - len(data))
            rest = self._file.readline(wanted)
            data += rest
            self._at_end = len(rest) < wanted and not rest.endswith(b"\n")
            if data.endswith(b"\n"):
                complete = data
            elif len(data) > MAX_LINE_BYTES:
                # Longer than any event (the bound every journal reader keeps): dropped, so
                # the view goes on with the events after it instead of waiting on it for ever.
                self._offset += len(data)
                self._skipping = True
                return []
        self._offset += len(complete)
        events = []
        for line in complete.splitlines():
            try:
                event = self._decoder.decode(line)
            except UnreadableFileError:
                continue  # no event of asyncsoak's: the view goes on without it
            if event is not None:
                events.append(event)
        return events

    def _is_our_header(self, line: bytes) -> bool:
        try:
            header = JournalDecoder().decode(line)
        except UnreadableFileError:
            return False
        if header is None or header.get("kind") != EventKind.HEADER:
            return False
        return self.monitor_pid is None or header.get("monitor_pid") == self.monitor_pid


#: The line's pieces, from the one kept longest to the one dropped first when the width is
#: short: the phase (and verdict), a LEAK or projected breach, the stall countdown, the
#: training's step, rate and ETA (``Status.training``), warnings, then the figures.  A new
#: piece takes its place here and in :meth:`Status.pieces`.
PIECE_IMPORTANCE = (
    "phase",
    "alert",
    "stall",
    "training",
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
    #: Warnings so far (a pass with warnings is not a clean pass).
    warnings: int = 0
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

    def pieces(self) -> list[Piece]:
        """The line's pieces in the order they are shown (see :data:`PIECE_IMPORTANCE`).

        What the journal said (reasons, series, groups) comes with its control characters
        spelled out: the pieces go to a terminal.
        """
        pieces = [Piece("phase", f"{format_duration(self.elapsed)} {self.phase}")]
        if self.training:
            pieces.append(Piece("training", self.training))
        if self.finished:
            # The last line sums the run up: its peaks, not the last sample of an idle tree.
            if self.peak_cpu_percent is not None or self.peak_rss_bytes is not None:
                pieces.append(
                    Piece(
                        "memory",
                        f"peak CPU {format_value(self.peak_cpu_percent, '%')} "
                        f"RSS {format_value(self.peak_rss_bytes, 'bytes')}",
                    )
                )
            pieces.extend(_alert_piece(alert) for alert in self.alerts)
            pieces.extend(self._warnings_pieces())
            for group, util, memory in self.peak_gpus:
                pieces.append(
                    Piece(
                        "gpu",
                        f"{group} peak {format_value(util, '%')} {format_value(memory, 'MiB')}",
                    )
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
            figures = (
                f"CPU {format_value(self.tree_cpu_percent, '%')} "
                f"RSS {format_value(self.tree_rss_bytes, 'bytes')}"
            )
            trend = self.memory_trend
            pieces.append(
                Piece(
                    "memory",
                    figures + (f" ({trend})" if trend else ""),
                    figures + (f" {trend}" if trend else ""),
                    f"RSS {format_value(self.tree_rss_bytes, 'bytes')}",
                )
            )
        for group, util, memory in self.gpus:
            if util is None and memory is None:
                continue  # not sampled yet: no placeholder figures
            pieces.append(
                Piece("gpu", f"{group} {format_value(util, '%')} {format_value(memory, 'MiB')}")
            )
        if self.changes:
            rate = self.changes_per_minute
            per_minute = f", {rate:.0f}/min" if rate is not None else ""
            pieces.append(
                Piece(
                    "changes",
                    f"{self.changes} progress change{'s' if self.changes != 1 else ''}"
                    + per_minute,
                    f"{self.changes} change{'s' if self.changes != 1 else ''}",
                )
            )
        if self.behind is not None and self.behind >= AS_OF_SHOWN_SECONDS:
            pieces.append(
                Piece(
                    "as_of",
                    f"as of {format_duration(self.behind)} ago (the journal's last line)",
                    f"as of {format_duration(self.behind)} ago",
                )
            )
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

    def _stall_piece(self) -> Piece | None:
        if self.quiet_for is None:
            return None
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
        return [Piece("warnings", count)]

    def parts(self, *, compact: bool = False) -> list[str]:
        """The pieces' wordings in order: the short ones with ``compact``."""
        return [piece.shortest() if compact else piece.text for piece in self.pieces()]

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


def _safe(pieces: list[Piece]) -> list[Piece]:
    return [
        Piece(p.name, *(terminal_text(form) if form else "" for form in (p.text, p.short, p.tiny)))
        for p in pieces
        if p.text
    ]


def fit_pieces(
    pieces: Sequence[Piece], width: int, separator: str = " | "
) -> list[tuple[Piece, str]]:
    """The pieces that fit in ``width`` columns, each with the wording chosen, in their order.

    First the pieces given up last (:data:`LAST_DROPPED`), by importance, each in a short
    wording that leaves room for the shortest wordings of those after it; then the others by
    importance, each in its shortest wording (a piece that does not fit is left out, never cut
    mid-word; a less important, shorter one may still fit); then the room left goes to longer
    wordings, the most important pieces first.  Only the first piece, alone too wide, is
    shortened at a word.
    """
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


def fit(parts: Sequence[str], width: int, separator: str = " | ") -> list[str]:
    """The parts that fit in ``width`` columns, whole and in order (earlier ones first)."""
    pieces = [Piece(PIECE_IMPORTANCE[0], part) for part in parts]
    return [text for _, text in fit_pieces(pieces, width, separator)]


def _shorten_words(text: str, width: int) -> str:
    """``text`` cut at a word boundary to fit ``width`` with an ellipsis."""
    if len(text) <= width:
        return text
    cut = text[: max(0, width - 1)].rsplit(" ", 1)[0]
    return cut + "…"


# The live view reads journal lines as their kinds' JSON forms (``_contract._events``), every
# key with ``.get``: a journal is not checked against a schema as an artifact is, and it may
# come from another asyncsoak.


class _ProcessEntry(TypedDict, total=False):
    """A process of a sample (``SampleJson.processes``), as far as the view reads it."""

    pid: int
    name: str
    rss_bytes: float | None
    anon_bytes: float | None


#: Samples of the tree's memory kept for its live trend (the last ones; about 10 minutes at 1 s).
TREND_POINTS = 600
#: GPU faults the live line names at most.
MAX_GPU_FAULT_ALERTS = 2
#: Samples needed before a trend is shown.
TREND_MIN_POINTS = 10
#: Processes whose memory is followed for the full screen's trends (the largest ones).
PROCESSES_FOLLOWED = 8
#: Progress events kept for the rate of changes (the last minute's at most).
RATE_WINDOW_SECONDS = 60.0
RATE_EVENTS = 4096
#: The monitor's monotonic clock lines ``t`` up with this process's when both agree with the
#: wall clock within this (same host, same boot); else the wall clock is used.
SAME_CLOCK_TOLERANCE_SECONDS = 30.0


@dataclass(slots=True)
class LiveState:
    """What the soak's events said so far, folded (from the monitor or its journal)."""

    started_at: float | None = None
    #: The monitor's ``time.monotonic()`` at the start (CLOCK_MONOTONIC is system-wide).
    monotonic_start: float | None = None
    stale_limit: float | None = None
    startup_limit: float | None = None
    log_path: str | None = None
    started: bool = False
    exited: bool = False
    stopping: str | None = None
    failures: list[str] = field(default_factory=list)
    #: Short texts of the GPU faults that fail a run (``GPU FAULT gpu0 Xid 79``), first ones.
    gpu_faults: list[str] = field(default_factory=list)
    warnings: int = 0
    finished: str | None = None
    last_progress: float | None = None
    changes: int = 0
    last_t: float = 0.0
    points: dict[str, Mapping[str, float | None]] = field(default_factory=dict)
    #: Peak of each (group, field) shown at the end.
    peaks: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (t, tree memory) of the last samples, for the memory trend.
    rss: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=TREND_POINTS))
    #: (series key, verdict) -> the ``trend`` event that said it.
    trends: dict[tuple[str, str], TrendJson] = field(default_factory=dict)
    #: The newest ``step`` line, and whether the step's advances are the progress.
    step: StepJson | None = None
    steps_count: bool = False
    #: The last sample's processes: (pid, name, memory).
    processes: list[tuple[int, str, float | None]] = field(default_factory=list)
    #: pid -> (t, memory) of its last samples, for the largest processes only.
    process_memory: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)
    #: (t, changes) of the recent progress events.
    progress_times: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=RATE_EVENTS)
    )
    #: Series (``tree``, or a pid) -> (its last sample's t, its trend text): a frame is drawn
    #: twice a second on the event loop, a trend changes only with a new sample.
    _trends_shown: dict[object, tuple[float, str | None]] = field(
        default_factory=dict, init=False, repr=False
    )

    _fold: ClassVar[EventFold[LiveState]] = EventFold()

    def add(self, event: Mapping[str, Any]) -> None:
        """Fold one event in its JSON form (as the serializer and ``JournalDecoder`` give it)."""
        self.last_t = max(self.last_t, float(event.get("t", 0.0)))
        self._fold.dispatch(self, event)

    @_fold.on(EventKind.HEADER)
    def _on_header(self, t: float, header: HeaderJson) -> None:
        self.started_at = epoch(header.get("started_at"))
        start = header.get("monotonic_start")
        self.monotonic_start = float(start) if isinstance(start, int | float) else None
        config = header.get("config") or {}
        stale = config.get("stale_progress_seconds")
        # "auto": the limit comes with the progress and step lines, as it is learned.
        self.stale_limit = stale if isinstance(stale, int | float) else None
        self.startup_limit = config.get("startup_timeout_seconds")
        log_path = header.get("log_path")
        self.log_path = log_path if isinstance(log_path, str) else None

    @_fold.on(EventKind.STARTED)
    def _on_started(self, t: float, event: StartedJson) -> None:
        self.started = True

    @_fold.on(EventKind.PROGRESS)
    def _on_progress(self, t: float, event: ProgressJson) -> None:
        if not self.steps_count:
            self.last_progress = t if self.last_progress is None else max(t, self.last_progress)
        changed = int(event.get("changed", 1))
        self.changes += changed
        self.progress_times.append((t, changed))
        self._fold_stale_limit(event)

    @_fold.on(EventKind.STEP)
    def _on_step(self, t: float, event: StepJson) -> None:
        self.steps_count = self.steps_count or bool(event.get("counts", True))
        moved = self.step is None or self.step.get("step") != event.get("step")
        if moved and self.steps_count:
            self.last_progress = t
        self.step = event
        self._fold_stale_limit(event)

    @_fold.on(EventKind.SAMPLE)
    def _on_sample(self, t: float, sample: SampleJson) -> None:
        self._fold_points(t, sample)
        self._fold_processes(t, sample.get("processes"))

    @_fold.on(EventKind.GPU_SAMPLE)
    def _fold_points(self, t: float, sample: SampleJson | GpuSampleJson) -> None:
        points = sample.get("points") or {}
        self.points.update(points)
        self._fold_peaks(t, points)

    @_fold.on(EventKind.TREND)
    def _on_trend(self, t: float, trend: TrendJson) -> None:
        series, verdict = str(trend.get("series")), str(trend.get("verdict"))
        if verdict == "withdrawn":
            # The soak's judgement no longer calls it a leak: neither does the view.
            self.trends.pop((series, "leak"), None)
            self.trends.pop((series, "breach_projected"), None)
        else:
            self.trends[(series, verdict)] = trend

    @_fold.on(EventKind.WARNING)
    def _on_warning(self, t: float, event: WarningJson) -> None:
        self.warnings += 1

    @_fold.on(EventKind.FAILURE)
    def _on_failure(self, t: float, event: FailureJson) -> None:
        self.failures.append(str(event.get("reason")))

    @_fold.on(EventKind.GPU_FAULT)
    def _on_gpu_fault(self, t: float, event: GpuFaultJson) -> None:
        if event.get("fails") and len(self.gpu_faults) < MAX_GPU_FAULT_ALERTS:
            xid = event.get("xid")
            what = f"Xid {xid}" if xid is not None else event.get("fault")
            self.gpu_faults.append(f"GPU FAULT gpu{event.get('gpu')} {what}")

    @_fold.on(EventKind.STOP)
    def _on_stop(self, t: float, event: StopJson) -> None:
        self.stopping = str(event.get("cause"))

    @_fold.on(EventKind.EXITED)
    def _on_exited(self, t: float, event: ExitedJson) -> None:
        self.exited = True

    @_fold.on(EventKind.FINISHED)
    def _on_finished(self, t: float, event: FinishedJson) -> None:
        self.finished = str(event.get("status"))

    def _fold_stale_limit(self, event: ProgressJson | StepJson) -> None:
        """``--stale-progress auto``: the limit in force, as the watchdog learned it."""
        limit = event.get("stale_limit_seconds")
        if isinstance(limit, int | float):
            self.stale_limit = limit

    def _fold_peaks(self, t: float, points: Mapping[str, Mapping[str, float | None]]) -> None:
        for group, values in points.items():
            for name in ("cpu_percent", "rss_bytes", "utilization_gpu_percent", "memory_used_mib"):
                value = (values or {}).get(name)
                if isinstance(value, int | float):
                    key = (group, name)
                    self.peaks[key] = max(self.peaks.get(key, value), value)
        # The memory that is judged (anonymous + shared), RSS in older journals.
        tree = points.get("tree") or {}
        memory = tree.get("anon_bytes", tree.get("rss_bytes"))
        if isinstance(memory, int | float):
            self.rss.append((t, float(memory)))

    def _fold_processes(self, t: float, entries: object) -> None:
        if not isinstance(entries, list):
            return
        processes: list[tuple[int, str, float | None]] = []
        for entry in cast(list[_ProcessEntry], entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
                continue
            memory = entry.get("anon_bytes", entry.get("rss_bytes"))
            processes.append(
                (
                    int(entry["pid"]),
                    str(entry.get("name") or "?"),
                    float(memory) if isinstance(memory, int | float) else None,
                )
            )
        processes.sort(key=lambda p: -(p[2] or 0.0))
        self.processes = processes
        followed = {pid: memory for pid, _, memory in processes[:PROCESSES_FOLLOWED]}
        for pid in list(self.process_memory):
            if pid not in followed:
                del self.process_memory[pid]
                self._trends_shown.pop(pid, None)
        for pid, memory in followed.items():
            if memory is not None:
                history = self.process_memory.setdefault(pid, deque(maxlen=TREND_POINTS))
                history.append((t, memory))

    def memory_trend(self) -> str | None:
        """The tree's memory per minute over the recent samples: the trends' estimator (the
        Theil-Sen slope of windowed minima), so a cache filling and emptying reads flat."""
        return self._trend("tree", self.rss)

    def _trend(self, series: object, points: deque[tuple[float, float]] | tuple[()]) -> str | None:
        last = points[-1][0] if points else -1.0
        shown = self._trends_shown.get(series)
        if shown is None or shown[0] != last:
            shown = (last, _trend_text(points))
            self._trends_shown[series] = shown
        return shown[1]

    def alerts(self, now_epoch: float | None) -> tuple[str, ...]:
        """Short texts for the leaks and projected breaches the trends reported, one per
        series: ``LEAK pid 29987 +921.6 MiB/min, limit in 41m00s``."""
        out = list(self.gpu_faults)
        for series in dict.fromkeys(key for key, _ in self.trends):
            leak = self.trends.get((series, "leak"))
            breach = self.trends.get((series, "breach_projected"))
            if leak is None and breach is None:
                continue
            who = f"pid {series.split('.')[1]}" if series.startswith("process.") else series
            text = f"LEAK {who}" if leak is not None else f"{who}:"
            slope = None if leak is None else leak.get("slope_per_hour")
            if isinstance(slope, int | float) and series.endswith("_bytes"):
                text += f" +{format_value(slope / 60.0, 'bytes')}/min"
            if breach is not None:
                at = epoch(breach.get("projected_limit_at"))
                when = (
                    f"limit in {format_duration(max(0.0, at - now_epoch))}"
                    if at is not None and now_epoch is not None
                    else "limit breach projected"
                )
                text += f", {when}" if leak is not None else f" {when}"
            out.append(text)
        return tuple(out)

    def verdict(self) -> str | None:
        """The status as the views show it once finished (``passed_with_warnings``...)."""
        if self.finished is None:
            return None
        return shown_status(self.finished, self.warnings)

    def phase(self) -> str:
        verdict = self.verdict()
        if verdict is not None:
            reasons = f" ({', '.join(self.failures)})" if self.failures else ""
            return f"finished: {verdict.replace('_', ' ')}{reasons}"
        if self.failures:
            return f"stopping: {self.failures[0]}"
        if self.stopping is not None:
            return f"stopping: {self.stopping}"
        if self.exited:
            return "command exited, waiting for its tree"
        if not self.started:
            return "starting"
        if self.last_progress is None:
            return "waiting for the first progress"
        return "running"

    def elapsed(self, now: float, monotonic_now: float | None = None) -> float:
        """Seconds since the start at ``now`` (Unix time): on the monitor's own monotonic
        clock when ``monotonic_now`` is given and agrees (same host), else the wall clock."""
        if self.finished is not None:
            return self.last_t
        if self.started_at is None:
            return self.last_t
        by_wall = now - self.started_at
        if monotonic_now is not None and self.monotonic_start is not None:
            by_monotonic = monotonic_now - self.monotonic_start
            if abs(by_monotonic - by_wall) <= SAME_CLOCK_TOLERANCE_SECONDS:
                return max(self.last_t, by_monotonic)
        return max(self.last_t, by_wall)

    def status(
        self, now: float, monotonic_now: float | None = None, *, current: bool = True
    ) -> Status:
        """The frame at ``now`` (Unix time).

        ``current``: the events folded are the monitor's knowledge up to now (``run``'s view,
        an observer of the monitor); else they stop at the journal's last line (``watch``),
        and the quiet time is as of that line, with how old it is.
        """
        finished = self.finished is not None
        elapsed = self.elapsed(now, monotonic_now)
        known_until = elapsed if current or finished else self.last_t
        if self.last_progress is None:
            quiet_for, limit, name = known_until, self.startup_limit, "startup"
        else:
            quiet_for = max(0.0, known_until - self.last_progress)
            limit, name = self.stale_limit, "stale"
        tree = self.points.get("tree") or {}
        gpu_groups = sorted(
            (group for group in self.points if gpu_index(group) is not None),
            key=lambda group: gpu_index(group) or 0,
        )
        gpus = tuple(
            (
                group,
                self.points[group].get("utilization_gpu_percent"),
                self.points[group].get("memory_used_mib"),
            )
            for group in gpu_groups
        )
        recent = [c for t, c in self.progress_times if t >= known_until - RATE_WINDOW_SECONDS]
        span = min(RATE_WINDOW_SECONDS, known_until)
        return Status(
            elapsed=elapsed,
            phase=self.phase(),
            quiet_for=quiet_for if self.started else None,
            limit=limit,
            limit_name=name,
            changes=self.changes,
            tree_cpu_percent=tree.get("cpu_percent"),
            tree_rss_bytes=tree.get("rss_bytes"),
            gpus=gpus,
            finished=finished,
            memory_trend=self.memory_trend(),
            alerts=self.alerts(now),
            peak_cpu_percent=self.peaks.get(("tree", "cpu_percent")),
            peak_rss_bytes=self.peaks.get(("tree", "rss_bytes")),
            peak_gpus=tuple(
                (
                    group,
                    self.peaks.get((group, "utilization_gpu_percent")),
                    self.peaks.get((group, "memory_used_mib")),
                )
                for group in gpu_groups
            ),
            warnings=self.warnings,
            # A tree's first sample has no CPU rate, and its memory is the command's before it
            # loaded anything: no figure is shown until one with a rate.
            sampled=tree.get("cpu_percent") is not None
            or self.peaks.get(("tree", "cpu_percent")) is not None,
            behind=None if current or finished else max(0.0, elapsed - self.last_t),
            changes_per_minute=sum(recent) * 60.0 / span if span >= 1.0 else None,
            processes=tuple(
                Process(pid, name, memory, self._trend(pid, self.process_memory.get(pid, ())))
                for pid, name, memory in self.processes[:PROCESSES_FOLLOWED]
            ),
            log_path=self.log_path,
            status=self.finished,
            training=training_line(self.step),
        )


def _trend_text(points: Sequence[tuple[float, float]] | deque[tuple[float, float]]) -> str | None:
    """Memory per minute over ``points`` (t, bytes): the Theil-Sen slope of their windowed
    minima, the trends' estimator; ``steady`` under 1 MiB a minute."""
    if len(points) < TREND_MIN_POINTS:
        return None
    t = [t for t, _ in points]
    windows = min(MAX_WINDOWS, len(t) // SAMPLES_PER_WINDOW)
    wt, wv = windowed_minima(t, [v for _, v in points], windows=windows)
    if len(wt) < 2 or wt[-1] <= wt[0]:
        return None
    per_minute = theil_sen(wt, wv)[0] * 60.0
    if abs(per_minute) < 2**20:
        return "steady"
    sign = "+" if per_minute > 0 else "-"
    return f"{sign}{format_value(abs(per_minute), 'bytes')}/min"


class _View(Protocol):
    def show(self, status: Status) -> None: ...

    def close(self, status: Status | None) -> None: ...


class PlainView:
    """A line when the phase changes, and every ``interval`` seconds."""

    def __init__(self, stream: TextIO, interval: float) -> None:
        self._stream = stream
        self._interval = interval
        self._phase: str | None = None
        self._last_line = 0.0

    def show(self, status: Status) -> None:
        now = time.monotonic()
        if status.phase != self._phase or now - self._last_line >= self._interval:
            self._phase = status.phase
            self._last_line = now
            self._stream.write(status.plain() + "\n")
            self._stream.flush()

    def close(self, status: Status | None) -> None:
        if status is not None and status.phase != self._phase:
            self.show(status)


class RichView:
    """One status line kept in place on the terminal with ``rich``; with ``screen``, the full
    screen of :mod:`._screen` instead (the terminal must be tall enough)."""

    def __init__(self, stream: TextIO, *, screen: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._screen = screen
        # No refresh thread of its own and no redirection of sys.stdout/sys.stderr: frames are
        # drawn only when this view is told to, from its worker thread.
        self._live = Live(
            console=self._console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,
            vertical_overflow="crop",
        )
        self._live.start()

    def _render(self, status: Status, *, last: bool = False) -> Any:
        width, height = self._console.size
        if self._screen:
            from ._screen import render_screen

            # The last frame stays on the terminal with the verdict printed below it: it
            # leaves that room, so its first rows (the verdict so far) are not scrolled off.
            return render_screen(status, width, height - FINAL_VERDICT_ROWS if last else height)
        return render_rich(status, width)

    def show(self, status: Status) -> None:
        self._live.update(self._render(status), refresh=True)

    def close(self, status: Status | None) -> None:
        if status is not None:
            self._live.update(self._render(status, last=True), refresh=True)
        self._live.stop()


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


def render_rich(status: Status, width: int = 80) -> Any:
    """One line of at most ``width`` columns: whole pieces only, the bar dropped first, then
    the pieces by :data:`PIECE_IMPORTANCE`."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    pieces = status.pieces()
    quiet, limit = status.quiet_for, status.limit
    bar: ProgressBar | None = None
    if not status.finished and quiet is not None and limit:
        ratio = min(1.0, quiet / limit)
        bar = ProgressBar(
            total=limit,
            completed=min(quiet, limit),
            width=BAR_WIDTH,
            complete_style="green" if ratio < 0.5 else "yellow" if ratio < 0.8 else "red",
            finished_style="red",
        )
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


def rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


#: ``--view``: ``auto`` (the full screen on a terminal tall enough, else the line), or one.
VIEW_MODES = ("auto", "line", "screen")
#: The full screen needs at least this many rows (else ``auto`` keeps the line).
SCREEN_MIN_ROWS = 20
#: ... and this many columns.
SCREEN_MIN_COLUMNS = 60


def make_view(stream: TextIO, status_interval: float, mode: str = "line") -> _View:
    """``rich`` on a terminal when it is installed (the full screen when ``mode`` asks for it
    and the terminal is big enough), plain lines otherwise."""
    if not (stream.isatty() and rich_available()):
        return PlainView(stream, status_interval)
    screen = False
    if mode != "line":
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            size = None
        screen = size is not None and (
            mode == "screen"
            or (size.lines >= SCREEN_MIN_ROWS and size.columns >= SCREEN_MIN_COLUMNS)
        )
    return RichView(stream, screen=screen)


async def _drive(
    step: Callable[[], Awaitable[Status | None]],
    *,
    stream: TextIO,
    status_interval: float,
    refresh: float,
    mode: str = "line",
    until_finished: bool = False,
    refine: Callable[[Status], Status] | None = None,
) -> Status | None:
    """Draw what ``step`` gives every ``refresh`` seconds until cancelled (or, with
    ``until_finished``, until a finished frame was drawn); returns the last frame.

    ``refine`` (blocking) completes a frame on the thread hop that draws it, just before.

    Returns early if the view itself fails, after one line on ``stream`` saying why; only
    cancellation propagates.
    """
    limiter = anyio.CapacityLimiter(1)
    view: _View | None = None
    last: Status | None = None

    async def in_thread(func: Callable[[], Any]) -> Any:
        return await run_blocking(
            func, timeout=VIEW_CALL_TIMEOUT_SECONDS, what="the live view", limiter=limiter
        )

    try:
        while True:
            status = await step()
            if status is not None:
                last = status
                if view is None:
                    # Only once the soak has started: a run refused at once draws nothing.
                    view = await in_thread(partial(make_view, stream, status_interval, mode))
                last = await in_thread(partial(_show, view, status, refine))
                if until_finished and status.finished:
                    return last
            await anyio.sleep(refresh)
    except Exception as exc:
        # The view is a convenience: a broken terminal or an unreadable journal ends it, and
        # the soak goes on untouched; the user is told why the view went away.
        line = (
            terminal_text(f"asyncsoak: the live view stopped: {type(exc).__name__}: {exc}") + "\n"
        )
        with contextlib.suppress(Exception):
            await in_thread(partial(_say, stream, line))
        view = None  # nothing more is drawn on it
        return last
    finally:
        with anyio.move_on_after(FINAL_FRAME_SECONDS, shield=True):
            with contextlib.suppress(Exception):
                final = await step()
                last = final if final is not None else last
                if view is None and final is not None and not until_finished:
                    view = await in_thread(partial(make_view, stream, status_interval, mode))
                if view is not None:
                    await in_thread(partial(view.close, final))


async def watch_journal(
    journal_path: Path,
    *,
    stream: TextIO,
    status_interval: float = 60.0,
    monitor_pid: int | None = None,
    refresh: float = REFRESH_SECONDS,
    mode: str = "line",
    until_finished: bool = False,
    tail: JournalTail | None = None,
    state: LiveState | None = None,
) -> Status | None:
    """Show the soak whose journal is ``journal_path`` on ``stream``, read as it grows, until
    cancelled (or until it finished, with ``until_finished``); returns the last frame.

    What it shows is as of the journal's last line (the monitor writes it once per sample
    interval); the line says how old that is.  Returns early if the view itself fails, after
    one line on ``stream`` saying why; only cancellation propagates.
    """
    own_tail = tail is None
    tail = tail if tail is not None else JournalTail(journal_path, monitor_pid)
    state = state if state is not None else LiveState()
    limiter = anyio.CapacityLimiter(1)

    async def step() -> Status | None:
        events = await run_blocking(
            tail.read, timeout=VIEW_CALL_TIMEOUT_SECONDS, what="the live view", limiter=limiter
        )
        for event in events:
            state.add(event)
        if state.started_at is None:
            return None
        return state.status(time.time(), time.monotonic(), current=False)

    try:
        return await _drive(
            step,
            stream=stream,
            status_interval=status_interval,
            refresh=refresh,
            mode=mode,
            until_finished=until_finished,
        )
    finally:
        if own_tail:
            tail.close()


def _show(view: _View, status: Status, refine: Callable[[Status], Status] | None) -> Status:
    if refine is not None:
        status = refine(status)
    view.show(status)
    return status


def _say(stream: TextIO, line: str) -> None:
    stream.write(line)
    stream.flush()


class _Feed:
    """The monitor's own events, folded as the serializer passes them on (an observer)."""

    def __init__(self) -> None:
        self.state = LiveState()
        self.broken: str | None = None

    def observe(self, event: Mapping[str, Any]) -> None:
        if self.broken is not None:
            return
        try:
            self.state.add(event)
        except Exception as exc:
            # A bug of the view's must not reach the serializer (it would count it against
            # the soak's own folding): the view says so and stops.
            self.broken = f"{type(exc).__name__}: {exc}"


def live_status(
    *, stream: TextIO | None = None, status_interval: float = 60.0, mode: str = "line"
) -> Callable[[SoakControl], Callable[[], Coroutine[Any, Any, Status | None]]]:
    """The live view of a soak run by this process, as ``supervise(status=...)`` takes it:
    given the soak's control, it becomes an observer of the soak's events (before the soak
    starts) and returns the task that draws them."""

    def attach(control: SoakControl) -> Callable[[], Coroutine[Any, Any, Status | None]]:
        feed = _Feed()
        control.observers.append(feed.observe)

        async def step() -> Status | None:
            if feed.broken is not None:
                raise RuntimeError(feed.broken)
            if feed.state.started_at is None:
                return None
            return feed.state.status(time.time(), time.monotonic(), current=True)

        def refine(status: Status) -> Status:
            # A stat of the files that changed last, on the draw's own thread hop: the
            # changes of the last scan interval are known when the line is drawn.
            look = control.progress_age
            return status if look is None else status.with_progress_age(look())

        return partial(
            _drive,
            step,
            refine=refine,
            stream=stream if stream is not None else sys.stderr,
            status_interval=status_interval,
            refresh=REFRESH_SECONDS,
            mode=mode,
        )

    return attach
