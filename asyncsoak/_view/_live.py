"""The live view of ``asyncsoak run``: how the soak is doing, while it runs.

It reads the soak's journal as it grows (the serializer flushes it on every event), so it
needs no hook inside ``run_soak``: it is one more task beside it.  On a terminal it keeps one
compact status in place (with ``rich``, the ``live`` extra); anywhere else, or without
``rich``, it prints a plain line when the phase changes and every ``status_interval`` seconds,
so CI logs and ``nohup`` output stay readable.

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
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO, TypedDict, cast

import anyio

from .._analysis._trends import MAX_WINDOWS, SAMPLES_PER_WINDOW, theil_sen, windowed_minima
from .._blocking import run_blocking
from .._record._bounded import MAX_LINE_BYTES, UnreadableFileError
from .._record._journal import JournalDecoder
from .._record._vocabulary import EventKind
from .._sampling._fields import format_value, gpu_index
from .._terminal import terminal_text
from .._timestamps import epoch
from .._units import format_duration

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

    def __init__(self, path: Path, monitor_pid: int | None = None) -> None:
        self.path = path
        self.monitor_pid = monitor_pid
        self._file: BinaryIO | None = None
        self._offset = 0
        self._ours = False
        #: In the middle of a line longer than any event, dropped up to its end.
        self._skipping = False
        self._decoder = JournalDecoder()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
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
            if not first.endswith(b"\n") or not self._is_our_header(first):
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

    def _read_on(self) -> list[dict[str, Any]]:
        assert self._file is not None
        self._file.seek(self._offset)
        data = self._file.read(READ_CHUNK)
        if self._skipping:
            end = data.find(b"\n") + 1
            self._offset += end or len(data)
            self._skipping = not end
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete and len(data) == READ_CHUNK:
            # One line longer than a read: read on to its end, as far as a line may go.
            data += self._file.readline(max(1, MAX_LINE_BYTES + 1 - len(data)))
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


@dataclass(frozen=True, slots=True)
class Status:
    """One frame of the live view."""

    elapsed: float
    phase: str
    #: Seconds since the last progress (since the start before the first one).
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

    def parts(self, *, compact: bool = False) -> list[str]:
        """The line's pieces, most important first: the verdict, then the figures.

        ``compact`` (the terminal line, which must fit its width): shorter wording, and the
        progress piece holds the quiet time only while it is not the elapsed time already.
        What the journal said (reasons, series, groups) comes with its control characters
        spelled out: the pieces go to a terminal.
        """
        parts = [f"{format_duration(self.elapsed)} {self.phase}"]
        if self.finished:
            # The last line sums the run up: its peaks, not the last sample of an idle tree.
            if self.peak_cpu_percent is not None or self.peak_rss_bytes is not None:
                parts.append(
                    f"peak CPU {format_value(self.peak_cpu_percent, '%')} "
                    f"RSS {format_value(self.peak_rss_bytes, 'bytes')}"
                )
            parts.extend(self.alerts)
            for group, util, memory in self.peak_gpus:
                parts.append(
                    f"{group} peak {format_value(util, '%')} {format_value(memory, 'MiB')}"
                )
            return [terminal_text(part) for part in parts]
        # A leak or a projected breach matters more than any figure: it comes first.
        parts.extend(self.alerts)
        if self.quiet_for is not None:
            limit = format_duration(self.limit) if self.limit else None
            quiet = format_duration(self.quiet_for)
            if compact and self.limit_name == "stale":
                parts.append(f"no progress {quiet}" + (f"/{limit}" if limit else ""))
            elif compact:
                # The phase already says it waits for the first progress, since the start.
                parts.append(f"startup limit {limit}" if limit else "")
            elif self.limit_name == "stale":
                parts.append(
                    f"last progress {quiet} ago" + (f" (stale limit {limit})" if limit else "")
                )
            else:
                parts.append(quiet + (f" (startup limit {limit})" if limit else ""))
        if self.tree_cpu_percent is not None or self.tree_rss_bytes is not None:
            trend = self.memory_trend
            parts.append(
                f"CPU {format_value(self.tree_cpu_percent, '%')} "
                f"RSS {format_value(self.tree_rss_bytes, 'bytes')}"
                + ((f" {trend}" if compact else f" ({trend})") if trend else "")
            )
        for group, util, memory in self.gpus:
            parts.append(f"{group} {format_value(util, '%')} {format_value(memory, 'MiB')}")
        return [terminal_text(part) for part in parts if part]

    def plain(self) -> str:
        return "asyncsoak: " + " | ".join(self.parts())


def fit(parts: Sequence[str], width: int, separator: str = " | ") -> list[str]:
    """The parts that fit in ``width`` columns, whole and in order: a part that does not fit
    is left out rather than cut mid-word (a shorter one after it may still fit); the first is
    shortened at a word only if it alone is too wide."""
    kept: list[str] = []
    used = 0
    for part in parts:
        extra = len(part) + (len(separator) if kept else 0)
        if not kept and extra > width:
            part = _shorten_words(part, width)
            extra = len(part)
        if used + extra <= width:
            kept.append(part)
            used += extra
    return kept


def _shorten_words(text: str, width: int) -> str:
    """``text`` cut at a word boundary to fit ``width`` with an ellipsis."""
    if len(text) <= width:
        return text
    cut = text[: max(0, width - 1)].rsplit(" ", 1)[0]
    return cut + "…"


# The journal lines the live view reads, as the events write them (``_record/_events.py``).
# Every key may be missing: a journal is not checked against a schema as an artifact is, and
# it may come from another asyncsoak, so each field is read with ``.get``.


class _HeaderLine(TypedDict, total=False):
    started_at: str
    config: dict[str, Any]
    monitor_pid: int


class _ProgressLine(TypedDict, total=False):
    changed: int


class _SampleLine(TypedDict, total=False):
    #: Group (``tree``, ``machine``, ``gpu0``...) to field to value.
    points: dict[str, dict[str, float | None]]


class _TrendLine(TypedDict, total=False):
    series: str
    verdict: str  # "leak" or "breach_projected"
    slope_per_hour: float | None
    projected_limit_at: str | None


class _FailureLine(TypedDict, total=False):
    reason: str


class _StopLine(TypedDict, total=False):
    cause: str


class _FinishedLine(TypedDict, total=False):
    status: str


#: Samples of the tree's memory kept for its live trend (the last ones; about 10 minutes at 1 s).
TREND_POINTS = 600
#: GPU faults the live line names at most.
MAX_GPU_FAULT_ALERTS = 2
#: Samples needed before a trend is shown.
TREND_MIN_POINTS = 10


@dataclass(slots=True)
class LiveState:
    """What the journal said so far, folded."""

    started_at: float | None = None
    stale_limit: float | None = None
    startup_limit: float | None = None
    started: bool = False
    exited: bool = False
    stopping: str | None = None
    failures: list[str] = field(default_factory=list)
    #: Short texts of the GPU faults that fail a run (``GPU FAULT gpu0 Xid 79``), first ones.
    gpu_faults: list[str] = field(default_factory=list)
    finished: str | None = None
    last_progress: float | None = None
    changes: int = 0
    last_t: float = 0.0
    points: dict[str, Mapping[str, float | None]] = field(default_factory=dict)
    #: Peak of each (group, field) shown at the end.
    peaks: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (t, tree RSS) of the last samples, for the memory trend.
    rss: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=TREND_POINTS))
    #: (series key, verdict) -> the ``trend`` event that said it.
    trends: dict[tuple[str, str], _TrendLine] = field(default_factory=dict)

    def add(self, event: Mapping[str, Any]) -> None:
        """Fold one journal line (as ``JournalDecoder`` gives it) in."""
        kind = event.get("kind")
        t = float(event.get("t", 0.0))
        self.last_t = max(self.last_t, t)
        # Each case reads the line as the event of its kind (the casts only name its fields).
        match kind:
            case EventKind.HEADER:
                header = cast(_HeaderLine, event)
                self.started_at = epoch(header.get("started_at"))
                config = header.get("config") or {}
                self.stale_limit = config.get("stale_progress_seconds")
                self.startup_limit = config.get("startup_timeout_seconds")
            case EventKind.STARTED:
                self.started = True
            case EventKind.PROGRESS:
                self.last_progress = t
                self.changes += int(cast(_ProgressLine, event).get("changed", 1))
            case EventKind.SAMPLE | EventKind.GPU_SAMPLE:
                points = cast(_SampleLine, event).get("points") or {}
                self.points.update(points)
                self._fold_peaks(t, points)
            case EventKind.TREND:
                trend = cast(_TrendLine, event)
                series, verdict = str(trend.get("series")), str(trend.get("verdict"))
                if verdict == "withdrawn":
                    # The soak's judgement no longer calls it a leak: neither does the view.
                    self.trends.pop((series, "leak"), None)
                    self.trends.pop((series, "breach_projected"), None)
                else:
                    self.trends[(series, verdict)] = trend
            case EventKind.FAILURE:
                self.failures.append(str(cast(_FailureLine, event).get("reason")))
            case EventKind.GPU_FAULT:
                if event.get("fails") and len(self.gpu_faults) < MAX_GPU_FAULT_ALERTS:
                    what = f"Xid {event['xid']}" if event.get("xid") is not None else event["fault"]
                    self.gpu_faults.append(f"GPU FAULT gpu{event.get('gpu')} {what}")
            case EventKind.STOP:
                self.stopping = str(cast(_StopLine, event).get("cause"))
            case EventKind.EXITED:
                self.exited = True
            case EventKind.FINISHED:
                self.finished = str(cast(_FinishedLine, event).get("status"))

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

    def memory_trend(self) -> str | None:
        """The tree's RSS per minute over the recent samples: the trends' estimator (the
        Theil-Sen slope of windowed minima), so a cache filling and emptying reads flat."""
        if len(self.rss) < TREND_MIN_POINTS:
            return None
        t = [t for t, _ in self.rss]
        windows = min(MAX_WINDOWS, len(t) // SAMPLES_PER_WINDOW)
        wt, wv = windowed_minima(t, [v for _, v in self.rss], windows=windows)
        if len(wt) < 2 or wt[-1] <= wt[0]:
            return None
        per_minute = theil_sen(wt, wv)[0] * 60.0
        if abs(per_minute) < 2**20:
            return "steady"
        sign = "+" if per_minute > 0 else "-"
        return f"{sign}{format_value(abs(per_minute), 'bytes')}/min"

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

    def phase(self) -> str:
        if self.finished is not None:
            reasons = f" ({', '.join(self.failures)})" if self.failures else ""
            return f"finished: {self.finished}{reasons}"
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

    def status(self, now: float) -> Status:
        finished = self.finished is not None
        elapsed = self.last_t
        if self.started_at is not None and not finished:
            elapsed = max(self.last_t, now - self.started_at)
        if self.last_progress is None:
            quiet_for, limit, name = elapsed, self.startup_limit, "startup"
        else:
            quiet_for, limit, name = elapsed - self.last_progress, self.stale_limit, "stale"
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
        )


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
    """One status kept in place on the terminal with ``rich``."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        # No refresh thread of its own and no redirection of sys.stdout/sys.stderr: frames are
        # drawn only when this view is told to, from its worker thread.
        self._live = Live(
            console=self._console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,
        )
        self._live.start()

    def show(self, status: Status) -> None:
        self._live.update(render_rich(status, self._console.width), refresh=True)

    def close(self, status: Status | None) -> None:
        if status is not None:
            self._live.update(render_rich(status, self._console.width), refresh=True)
        self._live.stop()


#: Columns of the bar of the quiet time against its limit.
BAR_WIDTH = 16
#: Between two pieces of the terminal line.
SEPARATOR = "  "


def render_rich(status: Status, width: int = 80) -> Any:
    """One line of at most ``width`` columns: whole pieces only, the bar dropped first."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    phase_style = "bold green"
    if status.phase.startswith(("stopping", "finished: failed", "finished: error")):
        phase_style = "bold red"
    elif status.phase.startswith(("finished", "command exited")):
        phase_style = "bold"
    parts = status.parts(compact=True)
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
    kept = fit(parts, width - BAR_WIDTH - 1, separator=SEPARATOR) if bar is not None else []
    if len(kept) < len(parts):
        # The line does not fit with the bar: the bar goes before any figure does.
        bar = None
        kept = fit(parts, width, separator=SEPARATOR)
    cells: list[Any] = []
    for i, part in enumerate(kept):
        if i == 0:
            elapsed, _, phase = part.partition(" ")
            cells.append(Text.assemble((elapsed, "bold"), " ", (phase, phase_style)))
            continue
        cells.append(Text(SEPARATOR))
        if bar is not None and part.startswith(("no progress", "startup limit")):
            cells.extend([bar, Text(" " + part)])
        else:
            cells.append(Text(part, style="bold red" if part in status.alerts else ""))
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


def make_view(stream: TextIO, status_interval: float) -> _View:
    """``rich`` on a terminal when it is installed, plain lines otherwise."""
    if stream.isatty() and rich_available():
        return RichView(stream)
    return PlainView(stream, status_interval)


async def watch_journal(
    journal_path: Path,
    *,
    stream: TextIO,
    status_interval: float = 60.0,
    monitor_pid: int | None = None,
    refresh: float = REFRESH_SECONDS,
) -> None:
    """Show the soak whose journal is ``journal_path`` on ``stream`` until cancelled.

    Returns early if the view itself fails, after one line on ``stream`` saying why; only
    cancellation propagates.
    """
    limiter = anyio.CapacityLimiter(1)
    tail = JournalTail(journal_path, monitor_pid)
    state = LiveState()
    view: _View | None = None

    async def in_thread(func: Callable[[], Any]) -> Any:
        return await run_blocking(
            func, timeout=VIEW_CALL_TIMEOUT_SECONDS, what="the live view", limiter=limiter
        )

    async def step() -> Status | None:
        for event in await in_thread(tail.read):
            state.add(event)
        if state.started_at is None:
            return None
        return state.status(time.time())

    try:
        while True:
            status = await step()
            if status is not None:
                if view is None:
                    # Only once the soak has started: a run refused at once draws nothing.
                    view = await in_thread(partial(make_view, stream, status_interval))
                await in_thread(partial(view.show, status))
            await anyio.sleep(refresh)
    except Exception as exc:
        # The view is a convenience: a broken terminal or an unreadable journal ends it, and
        # the soak goes on untouched; the user is told why the view went away.
        line = (
            terminal_text(f"asyncsoak: the live view stopped: {type(exc).__name__}: {exc}") + "\n"
        )
        with contextlib.suppress(Exception):
            await in_thread(partial(_say, stream, line))
        return
    finally:
        with anyio.move_on_after(FINAL_FRAME_SECONDS, shield=True):
            with contextlib.suppress(Exception):
                last = await step()
                if view is None and last is not None:
                    view = await in_thread(partial(make_view, stream, status_interval))
                if view is not None:
                    await in_thread(partial(view.close, last))
            tail.close()


def _say(stream: TextIO, line: str) -> None:
    stream.write(line)
    stream.flush()


def live_status(
    *, stream: TextIO | None = None, status_interval: float = 60.0
) -> Callable[[Path], Coroutine[Any, Any, None]]:
    """The live view for a soak run by this process, as ``supervise(status=...)`` takes it."""
    return partial(
        watch_journal,
        stream=stream if stream is not None else sys.stderr,
        status_interval=status_interval,
        monitor_pid=os.getpid(),
    )
