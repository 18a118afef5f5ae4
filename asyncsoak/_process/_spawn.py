"""The spawner: the monitor's side of the reaper (``_reaper``).  It hands the reaper the command
over the lifeline, reports the command's start, exit and tree's end as events, and signals it;
a closed lifeline (the monitor done, or dead) tells the reaper to stop the tree and finish."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from subprocess import PIPE
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from .._contract import EventSink, events, exits
from . import _tree
from ._cgroup import TreeCgroup

#: The reaper runs as ``python -I -S -c REAPER_START REAPER_SCRIPT`` (no site, no package
#: import); the queue recognises an orphaned reaper by it, or by ``REAPER_MODULE`` (older ones).
REAPER_SCRIPT = str(Path(__file__).resolve().with_name("_reaper.py"))
#: Imported from its directory, so its byte code is cached (6 ms a start otherwise).
REAPER_START = (
    "import sys; sys.path.insert(0, sys.argv[1].rpartition('/')[0]); import _reaper; _reaper.run()"
)
REAPER_MODULE = "asyncsoak._process._reaper"
_REPORT_MAX_BYTES = 64 * 1024
#: Bound on waiting for the reaper to finish once the tree is gone.
REAPER_CLOSE_TIMEOUT_SECONDS = 5.0
#: Bound on starting the command (exec from a hung network filesystem can block).
SPAWN_TIMEOUT_SECONDS = 60.0


class SpawnRequest:
    """What the reaper is told to start (a plain slotted class: a dataclass would cost every
    start 0.7 ms to make); all but ``log_fd`` goes in the lifeline's configuration line."""

    __slots__ = (
        "argv",
        "cgroup",
        "cwd",
        "env",
        "grace_seconds",
        "kill_wait_seconds",
        "log_fd",
        "log_max_bytes",
        "stop_mode",
    )

    def __init__(
        self,
        *,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str],
        log_fd: int,
        log_max_bytes: int,
        stop_mode: str,
        grace_seconds: float,
        cgroup: str | None = None,
        kill_wait_seconds: float | None = None,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.log_fd = log_fd
        self.log_max_bytes = log_max_bytes
        self.stop_mode = stop_mode
        self.grace_seconds = grace_seconds
        #: The soak's cgroup (``cgroup.procs`` is joined by the command before exec), if any.
        self.cgroup = cgroup
        #: The reaper's wait after its SIGKILL once the lifeline is lost (None: its default).
        self.kill_wait_seconds = kill_wait_seconds

    def config(self) -> dict[str, Any]:
        """The reaper's configuration: every field but ``log_fd`` (it goes beside the line)."""
        config = {name: getattr(self, name) for name in self.__slots__ if name != "log_fd"}
        return {**config, "argv": list(self.argv), "env": dict(self.env)}


class Spawner:
    """Starts the command through a reaper and tells the soak what becomes of it."""

    def __init__(self) -> None:
        self._reaper: Process | None = None
        self._reports: BufferedByteReceiveStream | None = None
        self._stdin_r: int | None = None
        self._stdin_w: int | None = None
        self._lifeline: socket.socket | None = None
        #: The stop mode the reaper was launched for (``"stdin"`` gives it the command's stdin).
        self.stop_mode: str | None = None
        #: Set once the reaper has the command: its first report is due.
        self.starting = False
        self.pid: int | None = None
        self.spawn_error: str | None = None
        self.returncode: int | None = None
        self.exit_signal: str | None = None
        self.exited = anyio.Event()
        self.tree_gone = anyio.Event()
        #: Set when the reaper's reports end before the lifeline closed: the reaper died.
        self.reaper_lost = anyio.Event()
        #: The tree's cgroup once the command is known to be in it (membership decides).
        self.cgroup: TreeCgroup | None = None
        self._closing = False
        #: Signals sent to the command's leader (directly or through its group).
        self.signals_to_leader: set[int] = set()
        #: Signals passed on to the command that are not the monitor's stop (``stopping=False``).
        self.signals_forwarded: set[int] = set()

    @property
    def reaper_pid(self) -> int | None:
        return self._reaper.pid if self._reaper is not None else None

    async def launch(self, stop_mode: str) -> None:
        """Start the reaper, early (its interpreter's start overlaps the soak's), to wait on its
        lifeline (a socket: the log's descriptor follows with the command)."""
        mine, theirs = socket.socketpair()
        pass_fds = []
        if stop_mode == "stdin":
            self._stdin_r, self._stdin_w = os.pipe()
            pass_fds.append(self._stdin_r)
        try:
            with anyio.CancelScope(shield=True):  # as open_command: the caller closes it
                reaper = await anyio.open_process(
                    [sys.executable, "-I", "-S", "-c", REAPER_START, REAPER_SCRIPT],
                    stdin=theirs.fileno(),
                    stdout=PIPE,
                    stderr=None,
                    pass_fds=pass_fds,
                )
        except BaseException:
            mine.close()
            self.close_stdin()
            raise
        finally:
            theirs.close()
            if self._stdin_r is not None:
                os.close(self._stdin_r)  # the reaper's own now: its number goes in the config
        self._reaper = reaper
        self._lifeline = mine
        self.stop_mode = stop_mode
        assert reaper.stdout is not None
        self._reports = BufferedByteReceiveStream(reaper.stdout)

    async def start(self, sink: EventSink, req: SpawnRequest) -> bool:
        """Start the command (and the reaper, unless launched); False (after a ``spawn_failed``
        event) if it failed."""
        if self._lifeline is None:
            await self.launch(req.stop_mode)
        assert self._lifeline is not None
        # The log's descriptor goes beside the line (SCM_RIGHTS), not in it.
        line = json.dumps({**req.config(), "stdin_fd": self._stdin_r}).encode() + b"\n"
        self._lifeline.setblocking(False)
        sent = 0
        while sent < len(line):  # a large environment: the reaper reads as it starts
            try:
                if sent:
                    sent += self._lifeline.send(line[sent:])
                else:  # nothing taken yet: the descriptor goes with this try
                    sent = socket.send_fds(self._lifeline, [line], [req.log_fd])
            except BlockingIOError:
                await anyio.wait_writable(self._lifeline)
        self.starting = True
        return await self.take_first_report(sink)

    async def take_first_report(
        self, sink: EventSink, wait_seconds: float = SPAWN_TIMEOUT_SECONDS
    ) -> bool:
        """The reaper's first report (bounded): the command's pid, or why it did not start."""
        first: dict[str, Any] | None = None
        with anyio.move_on_after(wait_seconds) as waited:
            first = await self._next_report()
        if first is None or first.get("event") != "spawned":
            if waited.cancelled_caught:
                message = f"the command did not start within {wait_seconds:g}s"
            elif first is None:
                message = "the reaper exited before starting the command"
            else:
                message = str(first.get("message", "unknown error"))
            self.spawn_error = message
            await sink.emit(events.SpawnFailed(t=sink.elapsed(), message=message))
            return False
        self.pid = int(first["pid"])
        assert self._reaper is not None
        await sink.emit(events.Started(t=sink.elapsed(), pid=self.pid, reaper_pid=self._reaper.pid))
        return True

    async def _next_report(self) -> dict[str, Any] | None:
        assert self._reports is not None
        try:
            line = await self._reports.receive_until(b"\n", _REPORT_MAX_BYTES)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            return None
        report: dict[str, Any] = json.loads(line)
        return report

    async def watch(self, sink: EventSink) -> None:
        """Report the command's exit and the end of its tree until the reaper goes quiet."""
        while (report := await self._next_report()) is not None:
            if report["event"] == "exited":
                self.returncode = os.waitstatus_to_exitcode(int(report["status"]))
                self.exit_signal = exits.decode(self.returncode).signal_name
                await sink.emit(
                    events.Exited(
                        t=sink.elapsed(),
                        pid=int(report["pid"]),
                        returncode=self.returncode,
                        signal=self.exit_signal,
                    )
                )
                self.exited.set()
            elif report["event"] == "log_error":
                await sink.emit(
                    events.WarningEvent(
                        t=sink.elapsed(),
                        message=f"the output log could not be written: {report['message']}",
                    )
                )
            elif report["event"] == "empty":
                self.exited.set()
                await sink.emit(events.TreeGone(t=sink.elapsed()))
                self.tree_gone.set()
        if not self._closing and not self.tree_gone.is_set():
            self.reaper_lost.set()

    async def reaper_exit(self, wait_seconds: float) -> str:
        """How the reaper ended, in words (waited for at most ``wait_seconds``)."""
        reaper = self._reaper
        if reaper is None:
            return "it never started"
        with anyio.move_on_after(wait_seconds):
            await reaper.wait()
        status = exits.decode(reaper.returncode)
        if status.returncode is None:
            return "its reports stopped"
        if status.signal_name is not None:
            return f"it was killed by {status.signal_name}"
        return f"it exited with status {status.returncode}"

    def tree_pids(self) -> list[int]:
        """Every live process of the tree but the reaper: its cgroup's members (one read, and
        none can leave), else the reaper's descendants."""
        reaper = self.reaper_pid
        if self.cgroup is not None:
            return [pid for pid in self.cgroup.pids() if pid != reaper]
        return _tree.descendants(reaper) if reaper is not None else []

    def signal_group(self, sig: int, *, stopping: bool = True) -> bool:
        """Signal the command's group; ``stopping=False``: passed on, not the monitor's stop."""
        if self.pid is None:
            return False
        return self._send(os.killpg, self.pid, sig, stopping)

    def signal_leader(self, sig: int, *, stopping: bool = True) -> bool:
        if self.pid is None or self.exited.is_set():
            return False
        return self._send(os.kill, self.pid, sig, stopping)

    def _send(self, kill: Callable[[int, int], None], pid: int, sig: int, stopping: bool) -> bool:
        """``kill(pid, sig)``, remembered as a stop or as passed on; False when it is gone."""
        try:
            kill(pid, sig)
        except OSError:
            return False
        (self.signals_to_leader if stopping else self.signals_forwarded).add(sig)
        return True

    def close_stdin(self) -> bool:
        if self._stdin_w is None:
            return False
        os.close(self._stdin_w)
        self._stdin_w = None
        return True

    def kill_tree(self) -> None:
        """SIGKILL the command's group and every process below the reaper."""
        if not self.exited.is_set():
            self.signals_to_leader.add(signal.SIGKILL)
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        for pid in self.tree_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    async def close(self, wait_seconds: float = REAPER_CLOSE_TIMEOUT_SECONDS) -> None:
        """Close the lifeline and wait (bounded, shielded) for the reaper to finish; once."""
        if self._closing:
            return
        self._closing = True
        self.close_stdin()
        reaper = self._reaper
        if reaper is None:
            return
        with anyio.CancelScope(shield=True):
            if self._lifeline is not None:
                self._lifeline.close()
            with anyio.move_on_after(wait_seconds):
                await reaper.wait()
            if reaper.returncode is None:
                reaper.kill()
                with anyio.move_on_after(1.0):
                    await reaper.wait()
            if reaper.returncode is not None:
                # The process is gone, so aclose() only closes the pipes: no unbounded wait.
                await reaper.aclose()
