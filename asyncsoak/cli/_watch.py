"""``asyncsoak watch``: the live view of a soak already running on this host, read from its
journal as it grows, to its verdict; a journal whose monitor no longer holds its lock
(``flock``) and that never said ``finished`` belongs to a monitor that died."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .._contract import exits, terminal_text
from . import UsageError, refused
from ._flags import seconds_arg
from ._queue_db import _guarded, _job_id, db_parser

if TYPE_CHECKING:
    from .._view import JournalTail, LiveState, Status

#: How long ``watch`` waits, once the journal said ``finished``, for the artifact the monitor
#: writes next.
ARTIFACT_WAIT_SECONDS = 30.0
#: Seconds between two looks at whether the monitor still holds its journal.
MONITOR_CHECK_SECONDS = 2.0
#: Reads of the open segment (of ``READ_CHUNK`` bytes each) ``--once`` makes at most to
#: catch up: the frame of a journal of any size comes after a bounded read.
ONCE_READS = 256
#: Bound on catching up with what the journal holds when ``watch`` attaches (the closed
#: segments of a long soak, compressed, are decoded whole).
CATCH_UP_SECONDS = 300.0


def register(subparsers: Any) -> None:
    from . import VIEW_MODES

    watch = subparsers.add_parser(
        "watch",
        parents=[db_parser()],
        help="the live view of a soak already running on this host, until its verdict",
        description="Attach to a running soak (started by `asyncsoak run`, sbatch, nohup or a "
        "queue worker) and show its live view, read from its journal as it grows; ends with "
        "the verdict when the soak ends.  The exit status is 0 when the soak passed (with or "
        "without warnings), 1 otherwise (failed, error, cancelled, or its monitor died); "
        "--once always exits 0 once it printed a frame.",
    )
    watch.add_argument(
        "target",
        type=Path,
        nargs="?",
        metavar="TARGET",
        help="the soak's artifact (soak.json), journal (soak.jsonl) or run directory "
        "(a queue job's run directory: its latest attempt)",
    )
    watch.add_argument(
        "--job",
        type=_job_id,
        metavar="ID",
        help="a queue job's id (its latest attempt), in the queue --db names",
    )
    watch.add_argument("--once", action="store_true", help="print one frame and exit 0")
    watch.add_argument(
        "--view",
        choices=VIEW_MODES,
        default="auto",
        help="on a terminal: the full screen when it is tall enough (auto, the default), "
        "always the one-line view (line), or the full screen (screen)",
    )
    watch.add_argument(
        "--status-interval",
        type=seconds_arg,
        default=10.0,
        metavar="S",
        help="seconds between status lines when stdout is not a terminal (default 10)",
    )
    watch.set_defaults(handler=_guarded(watch_command))


def watch_command(args: argparse.Namespace) -> int:
    from .._contract import BlockingCallTimeout
    from .._supervisor import seconds

    with refused():
        interval = seconds("--status-interval", args.status_interval, allow_zero=False)
    if (args.target is None) == (args.job is None):
        raise UsageError("watch needs one TARGET (an artifact, journal or run directory) or --job")
    for flag, value in (("--db", args.db), ("--wait-for-db", args.wait_for_db)):
        if value is not None and args.job is None:
            raise UsageError(f"{flag} goes with --job")
    journal = job_journal(args) if args.job is not None else find_journal(args.target)
    try:
        return anyio.run(_watch, journal, args.once, args.view, interval)
    except KeyboardInterrupt:  # as shells report SIGINT
        return exits.SHELL_SIGNAL_BASE + signal.SIGINT
    except BlockingCallTimeout as exc:  # catching up with (or reading) the journal
        print(terminal_text(f"asyncsoak: {exc}"), file=sys.stderr)
        return exits.EXIT_FAILED


def job_journal(args: argparse.Namespace) -> Path:
    """The journal of a queue job's latest attempt; refused when it runs on another host."""
    from ._queue_db import _open, _queue_call

    with _open(args) as store:
        job = _queue_call(lambda: store.get(args.job))
        attempts = _queue_call(lambda: store.attempts(job.id))
    if not attempts:
        raise UsageError(f"job {job.id} has not started yet ({job.status}): nothing to watch")
    attempt = attempts[-1]
    if attempt.host != socket.gethostname():
        raise UsageError(
            f"job {job.id} attempt {attempt.attempt} runs on {attempt.host}: "
            "watch it there (its journal is on that host)"
        )
    return Path(attempt.artifact).with_suffix(".jsonl")


def find_journal(target: Path) -> Path:
    """The journal a TARGET names: itself, its artifact's, or the one in a run directory
    (a queue job's run directory: its latest attempt's)."""
    from .._record import is_journal

    if target.is_dir():
        attempts = target / "attempts"
        if attempts.is_dir() and (numbered := [p for p in attempts.iterdir() if p.name.isdigit()]):
            return find_journal(max(numbered, key=lambda p: int(p.name)))
        journals = [p for p in target.glob("*.jsonl") if p.is_file() and is_journal(p)]
        if not journals:
            raise UsageError(f"{target}: no soak journal (*.jsonl) in it")
        # Several soaks wrote there: the one written last is the one running.
        return max(journals, key=lambda p: p.stat().st_mtime)
    journal = target if target.suffix == ".jsonl" else target.with_suffix(".jsonl")
    if not journal.exists():
        if target.exists():
            raise UsageError(f"{target}: its journal {journal} is not there")
        raise UsageError(f"{target}: no such file")
    if not is_journal(journal):
        raise UsageError(f"{journal}: not a soak journal")
    return journal


def _catch_up(journal: Path) -> tuple[LiveState, JournalTail]:
    """The state after the journal's closed segments (a long soak rotates its journal), and
    a tail of its open segment."""
    from .._record import JournalReader, journal_segments
    from .._view import JournalTail, LiveState

    state = LiveState()
    closed = journal_segments(journal)[:-1]
    for segment in closed:
        # A closed segment is read as a journal of its own (bounded, compressed or not).
        with contextlib.suppress(FileNotFoundError):
            for event in JournalReader(segment):
                state.add(event)
    return state, JournalTail(journal, header_first=not closed)


async def _watch(journal: Path, once: bool, mode: str, interval: float) -> int:
    from .._contract import run_blocking
    from .._record import monitor_holds
    from .._view import VIEW_CALL_TIMEOUT_SECONDS, make_view, watch_journal

    state, tail = await run_blocking(
        _catch_up, journal, timeout=CATCH_UP_SECONDS, what="reading the journal's segments"
    )
    try:
        if once:
            status = await run_blocking(
                _read_all, tail, state, timeout=CATCH_UP_SECONDS, what="reading the journal"
            )
            if status is None:
                raise UsageError(f"{journal}: no soak has started there yet")
            frame = make_view(sys.stdout, 0.0, mode)
            frame.show(status)
            frame.close(None)
            return exits.EXIT_PASSED
        monitor_gone = False
        async with anyio.create_task_group() as tg:

            async def view() -> None:
                await watch_journal(
                    journal,
                    stream=sys.stdout,
                    status_interval=interval,
                    mode=mode,
                    until_finished=True,
                    tail=tail,
                    state=state,
                )
                tg.cancel_scope.cancel()

            async def check_monitor() -> None:
                nonlocal monitor_gone
                #: The view's reads begun when the monitor was first seen gone.
                released: int | None = None
                while True:
                    await anyio.sleep(MONITOR_CHECK_SECONDS)
                    look = "a look at the journal's lock"
                    timeout = VIEW_CALL_TIMEOUT_SECONDS
                    if await run_blocking(monitor_holds, journal, timeout=timeout, what=look):
                        released = None
                        continue
                    if released is None:
                        # A second look first (a segment's rotation without hard links leaves
                        # the path missing for a moment).
                        released = tail.reads_begun
                        continue
                    # Gone, once the view read to the journal's end after it let go: the view
                    # may be seconds behind (a loaded machine, a backlog), and the verdict is
                    # there if the monitor gave one (the view then ends with it).
                    if state.finished is None and tail.last_read_to_end > released:
                        monitor_gone = True
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(view)
            tg.start_soon(check_monitor)
        if state.finished is None:
            if monitor_gone:
                gone = f"asyncsoak: the monitor of {journal} is gone and never gave a verdict; "
                gone += f"rebuild its artifact with: asyncsoak recover {journal}"
                print(terminal_text(gone), flush=True)
            return exits.EXIT_FAILED
        return await _verdict(journal, state)
    finally:
        tail.close()


def _read_all(tail: JournalTail, state: LiveState) -> Status | None:
    for _ in range(ONCE_READS):
        events = tail.read()
        if not events:
            break
        for event in events:
            state.add(event)
    if state.started_at is None:
        return None
    return state.status(time.time(), time.monotonic(), current=False)


async def _verdict(journal: Path, state: LiveState) -> int:
    """The soak's verdict, from its artifact once the monitor wrote it (else the journal's)."""
    from .._contract import BlockingCallTimeout, run_blocking
    from .._record import monitor_holds
    from .._view import is_pass, status_words

    artifact_path = journal.with_suffix(".json")
    # The monitor lets go of its journal once the artifact is written.
    with contextlib.suppress(BlockingCallTimeout):
        await run_blocking(
            monitor_holds,
            journal,
            True,
            timeout=ARTIFACT_WAIT_SECONDS,
            what="waiting for the monitor to write the artifact",
        )
    found = _artifact_line(artifact_path)
    if found is None:
        shown = state.verdict() or "error"
        reasons = f" ({', '.join(state.failures)})" if state.failures else ""
        line = f"{status_words(shown)}{reasons}; no artifact at {artifact_path}"
    else:
        line, shown = found
    print(terminal_text(f"asyncsoak: {line}"), flush=True)
    return exits.EXIT_PASSED if is_pass(shown) else exits.EXIT_FAILED


def _artifact_line(path: Path) -> tuple[str, str] | None:
    """The summary's first line of the artifact at ``path``, and its shown status."""
    from .._view import format_summary, summarize
    from ..artifact import ArtifactError, load

    try:
        artifact = load(path)
    except (ArtifactError, OSError):
        return None
    summary = summarize(artifact)
    first = format_summary(summary).splitlines()[0]
    reasons = ", ".join(dict.fromkeys(r["reason"] for r in summary["reasons"]))
    why = f" ({reasons})" if reasons else ""
    return f"{first}{why}; artifact: {path}", str(summary["status"])
