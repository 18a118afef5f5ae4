"""The spawner: the monitor's side of the reaper (see ``_reaper`` for why it exists).

:class:`Spawner` starts the reaper, hands it the command over the lifeline pipe, reports the
command's start, exit and the end of its whole tree as events, and sends the signals of the
stop sequence.  Closing the lifeline tells the reaper to finish; if the monitor dies, the
kernel closes it, and the reaper stops the tree on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from .._contract import EventSink, Exited, SpawnFailed, Started, TreeGone, WarningEvent, decode
from . import _tree
from ._cgroup import TreeCgroup

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
#: The reaper runs as ``python -m REAPER_MODULE``: the job queue recognises an orphaned
#: attempt's reaper by this argument.
REAPER_MODULE = "asyncsoak._process._reaper"
_REPORT_MAX_BYTES = 64 * 1024
#: Bound on starting the command (exec from a hung network filesystem can block).
SPAWN_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    argv: Sequence[str]
    cwd: str | None
    env: Mapping[str, str]
    log_fd: int
    log_max_bytes: int
    stop_mode: str
    grace_seconds: float
    #: The soak's cgroup (``cgroup.procs`` is joined by the command before exec), if any.
    cgroup: str | None = None
    #: How long the reaper waits for the tree after its SIGKILL once the lifeline is lost
    #: (the soak's ``kill_wait_seconds``); ``None``: the reaper's default.
    kill_wait_seconds: float | None = None


class Spawner:
    """Starts the command through a reaper and tells the soak what becomes of it."""

    def __init__(self, request: SpawnRequest) -> None:
        self._request = request
        self._reaper: Process | None = None
        self._reports: BufferedByteReceiveStream | None = None
        self._stdin_w: int | None = None
        self.pid: int | None = None
        self.spawn_error: str | None = None
        self.returncode: int | None = None
        self.exit_signal: str | None = None
        self.exited = anyio.Event()
        self.tree_gone = anyio.Event()
        #: Set when the reaper's reports end before the monitor closed the lifeline: the
        #: reaper died (a trainer that killed its parent), and the tree runs unsupervised.
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

    async def start(self, sink: EventSink) -> bool:
        """Start the reaper and the command; False (after a ``spawn_failed`` event) if it failed."""
        req = self._request
        pass_fds = [req.log_fd]
        stdin_r: int | None = None
        if req.stop_mode == "stdin":
            stdin_r, self._stdin_w = os.pipe()
            pass_fds.append(stdin_r)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p
        )
        config: dict[str, Any] = {
            "argv": list(req.argv),
            "cwd": req.cwd,
            "env": dict(req.env),
            "stdin_fd": stdin_r,
            "log_fd": req.log_fd,
            "log_max_bytes": req.log_max_bytes,
            "stop_mode": req.stop_mode,
            "grace_seconds": req.grace_seconds,
            "cgroup": req.cgroup,
            "kill_wait_seconds": req.kill_wait_seconds,
        }
        try:
            self._reaper = await anyio.open_process(
                [sys.executable, "-m", REAPER_MODULE],
                stdin=PIPE,
                stdout=PIPE,
                stderr=None,
                env=env,
                pass_fds=pass_fds,
            )
        finally:
            if stdin_r is not None:
                os.close(stdin_r)
        assert self._reaper.stdin is not None
        assert self._reaper.stdout is not None
        self._reports = BufferedByteReceiveStream(self._reaper.stdout)
        await self._reaper.stdin.send(json.dumps(config).encode() + b"\n")
        first: dict[str, Any] | None = None
        with anyio.move_on_after(SPAWN_TIMEOUT_SECONDS) as waited:
            first = await self._next_report()
        if first is None or first.get("event") != "spawned":
            if waited.cancelled_caught:
                message = f"the command did not start within {SPAWN_TIMEOUT_SECONDS:g}s"
            elif first is None:
                message = "the reaper exited before starting the command"
            else:
                message = str(first.get("message", "unknown error"))
            self.spawn_error = message
            await sink.emit(SpawnFailed(t=sink.elapsed(), message=message))
            return False
        self.pid = int(first["pid"])
        await sink.emit(Started(t=sink.elapsed(), pid=self.pid, reaper_pid=self._reaper.pid))
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
                self.exit_signal = decode(self.returncode).signal_name
                await sink.emit(
                    Exited(
                        t=sink.elapsed(),
                        pid=int(report["pid"]),
                        returncode=self.returncode,
                        signal=self.exit_signal,
                    )
                )
                self.exited.set()
            elif report["event"] == "log_error":
                await sink.emit(
                    WarningEvent(
                        t=sink.elapsed(),
                        message=f"the output log could not be written: {report['message']}",
                    )
                )
            elif report["event"] == "empty":
                self.exited.set()
                await sink.emit(TreeGone(t=sink.elapsed()))
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
        status = decode(reaper.returncode)
        if status.returncode is None:
            return "its reports stopped"
        if status.signal_name is not None:
            return f"it was killed by {status.signal_name}"
        return f"it exited with status {status.returncode}"

    def tree_pids(self) -> list[int]:
        """Every live process of the tree (the reaper itself excluded): the reaper's
        descendants, and every member of the tree's cgroup (which nothing can leave)."""
        reaper = self.reaper_pid
        if self.cgroup is not None:
            # One read, whatever the tree's size or shape.
            return [pid for pid in self.cgroup.pids() if pid != reaper]
        return _tree.descendants(reaper) if reaper is not None else []

    def signal_group(self, sig: int, *, stopping: bool = True) -> bool:
        """Signal the command's group; ``stopping=False`` for a signal passed on that is not
        the monitor's stop (the command dying of it is then its own failure)."""
        if self.pid is None:
            return False
        return self._send(os.killpg, self.pid, sig, stopping)

    def signal_leader(self, sig: int, *, stopping: bool = True) -> bool:
        if self.pid is None or self.exited.is_set():
            return False
        return self._send(os.kill, self.pid, sig, stopping)

    def _send(self, kill: Callable[[int, int], None], pid: int, sig: int, stopping: bool) -> bool:
        """``kill(pid, sig)``, remembered as the monitor's stop or as passed on; False when
        the process (or group) is gone."""
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

    def kill_tree(self) -> list[int]:
        """SIGKILL the command's group and every process below the reaper."""
        if not self.exited.is_set():
            self.signals_to_leader.add(signal.SIGKILL)
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        killed = []
        for pid in self.tree_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        return killed

    async def close(self, wait_seconds: float) -> None:
        """Close the lifeline and wait (bounded, shielded) for the reaper to finish."""
        self._closing = True
        self.close_stdin()
        reaper = self._reaper
        if reaper is None:
            return
        with anyio.CancelScope(shield=True):
            if reaper.stdin is not None:
                await reaper.stdin.aclose()
            with anyio.move_on_after(wait_seconds):
                await reaper.wait()
            if reaper.returncode is None:
                reaper.kill()
                with anyio.move_on_after(1.0):
                    await reaper.wait()
            if reaper.returncode is not None:
                # The process is gone, so aclose() only closes the pipes: no unbounded wait.
                await reaper.aclose()
