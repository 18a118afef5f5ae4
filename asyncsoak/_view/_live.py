"""The live view, as one line or a full screen: of the monitor's own events inside ``run``, of
the journal as it grows in ``watch``.  It never delays or breaks the soak: reads and writes
run in worker threads under bounds, and its errors end the view only (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import anyio

from .._contract import EventKind, bounded, events, run_blocking, terminal_text
from .._record import JournalDecoder
from ._live_line import FINAL_VERDICT_ROWS, Status, render_rich, render_screen
from ._live_state import LiveState

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
    """Complete events appended to a journal since the last read (:meth:`close` at the end);
    an earlier run's journal and a segment renamed aside are handled (docs/architecture.md)."""

    def __init__(
        self, path: Path, monitor_pid: int | None = None, *, header_first: bool = True
    ) -> None:
        self.path, self.monitor_pid = path, monitor_pid
        #: False when attaching to a journal whose earlier segments were read already.
        self.header_first = header_first
        self._file: BinaryIO | None = None
        self._offset, self._ours = 0, False
        #: In the middle of a line longer than any event, dropped up to its end.
        self._skipping = False
        self._decoder = JournalDecoder()
        #: Reads begun, and the last that found nothing new at the end (all before it was read).
        self.reads_begun = self.last_read_to_end = 0
        #: Whether the last chunk read reached the end of the file.
        self._at_end = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self) -> list[events.EventJson]:
        self.reads_begun += 1
        self._at_end = True
        found = self._read()
        if not found and self._at_end:
            self.last_read_to_end = self.reads_begun
        return found

    def _read(self) -> list[events.EventJson]:
        if self._file is not None and os.fstat(self._file.fileno()).st_size < self._offset:
            # Truncated: a new soak took the path over.
            self.close()
            self._ours = False
        if self._file is None and not self._open():
            return []
        assert self._file is not None
        if not self._ours:
            self._decoder = JournalDecoder()
            self._file.seek(0)
            first = self._file.readline(bounded.MAX_LINE_BYTES + 1)
            if not first.endswith(b"\n") or (self.header_first and not self._is_our_header(first)):
                self.close()  # not ours (yet): look again at the path next time
                return []
            self._ours = True
        found = self._read_on()
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return found
        held = os.fstat(self._file.fileno())
        if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
            # The segment was closed: its writes were all done before it was renamed.
            found += self._read_on()
            self.close()
            if self._open():
                self._decoder.reset()
                found += self._read_on()
        return found

    def _open(self) -> bool:
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (held until close())
        except FileNotFoundError:
            return False
        self._offset, self._skipping = 0, False
        return True

    def _read_on(self) -> list[events.EventJson]:
        assert self._file is not None
        self._file.seek(self._offset)
        data = self._file.read(READ_CHUNK)
        # A last line without its end yet (or ever: a monitor died mid-write) is the end too.
        self._at_end = len(data) < READ_CHUNK
        if self._skipping:
            end = data.find(b"\n") + 1
            self._offset += end or len(data)
            self._skipping = not end
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete and len(data) == READ_CHUNK:
            # One line longer than a read: read on to its end, as far as a line may go.
            wanted = max(1, bounded.MAX_LINE_BYTES + 1 - len(data))
            rest = self._file.readline(wanted)
            data += rest
            self._at_end = len(rest) < wanted and not rest.endswith(b"\n")
            if data.endswith(b"\n"):
                complete = data
            elif len(data) > bounded.MAX_LINE_BYTES:
                # Longer than any event: dropped, so the view does not wait on it for ever.
                self._offset += len(data)
                self._skipping = True
                return []
        self._offset += len(complete)
        found = []
        for line in complete.splitlines():
            try:
                event = self._decoder.decode(line)
            except bounded.UnreadableFileError:
                continue  # no event of asyncsoak's: the view goes on without it
            if event is not None:
                found.append(event)
        return found

    def _is_our_header(self, line: bytes) -> bool:
        with contextlib.suppress(bounded.UnreadableFileError):
            header: Mapping[str, Any] = JournalDecoder().decode(line) or {}
            pid = header.get("monitor_pid")
            ours = self.monitor_pid is None or pid == self.monitor_pid
            return header.get("kind") == EventKind.HEADER and ours
        return False


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
            self._phase, self._last_line = status.phase, now
            self._stream.write(status.plain() + "\n")
            self._stream.flush()

    def close(self, status: Status | None) -> None:
        if status is not None and status.phase != self._phase:
            self.show(status)


class RichView:
    """One status line kept in place on the terminal with ``rich``, or the full screen."""

    def __init__(self, stream: TextIO, *, screen: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._screen = screen
        # No refresh thread and no redirection: frames are drawn when told, from its thread.
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
        if not self._screen:
            return render_rich(status, width)
        # The last frame leaves room for the verdict below it: its first rows stay in view.
        return render_screen(status, width, height - FINAL_VERDICT_ROWS if last else height)

    def show(self, status: Status) -> None:
        self._live.update(self._render(status), refresh=True)

    def close(self, status: Status | None) -> None:
        if status is not None:
            self._live.update(self._render(status, last=True), refresh=True)
        self._live.stop()


#: The terminal ``auto`` draws the full screen on, at least (else it keeps the line).
SCREEN_MIN_ROWS, SCREEN_MIN_COLUMNS = 20, 60


def make_view(stream: TextIO, status_interval: float, mode: str = "line") -> PlainView | RichView:
    """``rich`` on a terminal when it is installed (the full screen when ``mode`` asks for it
    and the terminal is big enough), plain lines otherwise."""
    if not stream.isatty():
        return PlainView(stream, status_interval)
    try:
        import rich  # noqa: F401
    except ImportError:
        return PlainView(stream, status_interval)
    try:
        size = os.get_terminal_size(stream.fileno()) if mode != "line" else None
    except (OSError, ValueError):
        size = None
    screen = size is not None and (
        mode == "screen" or (size.lines >= SCREEN_MIN_ROWS and size.columns >= SCREEN_MIN_COLUMNS)
    )
    return RichView(stream, screen=screen)


async def _drive(
    step: Callable[[], Awaitable[Status | None]],
    *,
    stream: TextIO,
    status_interval: float,
    mode: str,
    refresh: float = REFRESH_SECONDS,
    until_finished: bool = False,
    refine: Callable[[Status], Status] = lambda status: status,
) -> Status | None:
    """Draw ``step``'s frame every ``refresh`` seconds until cancelled (or finished, with
    ``until_finished``); the last frame.  ``refine`` (blocking) runs on the drawing thread; a
    failure of the view ends it with one line on ``stream``: only cancellation propagates."""
    limiter = anyio.CapacityLimiter(1)
    view: PlainView | RichView | None = None
    last: Status | None = None

    async def in_thread(func: Callable[[], Any]) -> Any:
        return await run_blocking(
            func, timeout=VIEW_CALL_TIMEOUT_SECONDS, what="the live view", limiter=limiter
        )

    def draw(view: PlainView | RichView, status: Status) -> Status:
        status = refine(status)
        view.show(status)
        return status

    try:
        while True:
            status = await step()
            if status is not None:
                last = status
                if view is None:
                    # Only once the soak has started: a run refused at once draws nothing.
                    view = await in_thread(partial(make_view, stream, status_interval, mode))
                last = await in_thread(partial(draw, view, status))
                if until_finished and status.finished:
                    return last
            await anyio.sleep(refresh)
    except Exception as exc:
        # A broken terminal or an unreadable journal ends the view, never the soak.
        line = terminal_text(f"asyncsoak: the live view stopped: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            await in_thread(partial(print, line + "\n", end="", file=stream, flush=True))
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
    """Show the soak whose journal is ``journal_path`` on ``stream`` as it grows, as of the
    journal's last line (the line says how old), as :func:`_drive` does."""
    own = JournalTail(journal_path, monitor_pid) if tail is None else tail
    live = LiveState() if state is None else state
    limiter = anyio.CapacityLimiter(1)

    async def step() -> Status | None:
        for event in await run_blocking(
            own.read, timeout=VIEW_CALL_TIMEOUT_SECONDS, what="the live view", limiter=limiter
        ):
            live.add(event)
        if live.started_at is None:
            return None
        return live.status(time.time(), time.monotonic(), current=False)

    try:
        return await _drive(
            step,
            stream=stream,
            status_interval=status_interval,
            mode=mode,
            refresh=refresh,
            until_finished=until_finished,
        )
    finally:
        if tail is None:
            own.close()


def live_status(
    *, stream: TextIO | None = None, status_interval: float = 60.0, mode: str = "line"
) -> Callable[[SoakControl], Callable[[], Coroutine[Any, Any, Status | None]]]:
    """The live view of a soak run by this process, as ``supervise(status=...)`` takes it: an
    observer of the soak's events (folded into the soak's own ``RunState`` by its serializer)
    that returns the task drawing them."""

    def attach(control: SoakControl) -> Callable[[], Coroutine[Any, Any, Status | None]]:
        state = LiveState(feed_run=False)
        broken: list[str] = []

        def observe(event: Mapping[str, Any]) -> None:
            if broken:
                return
            try:
                if control.state is not None:  # set as the soak starts, before any event
                    state.run = control.state
                state.add(event)
            except Exception as exc:
                # A bug of the view's must not reach the serializer (it counts it against the
                # soak's own folding): the view says so and stops.
                broken.append(f"{type(exc).__name__}: {exc}")

        control.observers.append(observe)

        async def step() -> Status | None:
            if broken:
                raise RuntimeError(broken[0])
            if state.started_at is None:
                return None
            return state.status(time.time(), time.monotonic(), current=True)

        def refine(status: Status) -> Status:
            # A stat of the files that changed last, on the draw's own thread hop.
            look = control.progress_age
            return status if look is None else status.with_progress_age(look())

        return partial(
            _drive,
            step,
            refine=refine,
            stream=stream if stream is not None else sys.stderr,
            status_interval=status_interval,
            mode=mode,
        )

    return attach
