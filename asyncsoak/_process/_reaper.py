"""The per-soak reaper, between the monitor and the command: the subreaper and ``waitpid(-1)`` a
library must not make its host; it copies the output into a capped log, reports JSON lines on
stdout, and stops the tree when its stdin (the lifeline) closes.  It runs as ``python -I -S``:
no package import.  docs/architecture.md, "The reaper and the cgroup"."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import selectors
import signal
import stat
import subprocess
import sys
import time

TYPE_CHECKING = False  # typing (and pathlib, for the tree's walk) would cost each start 7 ms
if TYPE_CHECKING:
    from typing import Any, NoReturn

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: The output pipe's capacity asked for (the unprivileged ceiling): no block at every 64 KiB.
_PIPE_SIZE = 1 << 20
#: The most read at once: small enough to stay in the CPU cache (a megabyte is twice as slow).
_READ_CHUNK = 128 * 1024
#: After SIGKILL, how long the reaper keeps reaping, unless the configuration says.
_LIFELINE_KILL_WAIT_SECONDS = 5.0

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class CappedLog:
    """Writes output to a file, keeping the first ``max_bytes / 2`` bytes and a recent tail: a
    full tail region is compacted to its latest quarter, behind a marker counting what was left
    out (a quarter copied for every three quarters printed)."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self._fd = fd
        #: Set when the file cannot be written: output is then read and dropped (never blocks).
        self.error: OSError | None = None
        self._head_cap = max_bytes // 2
        self._tail_cap = max_bytes - self._head_cap
        #: What a compaction keeps of the tail region.
        self._keep = self._tail_cap // 4
        self._head_written = 0
        #: After the head: the marker (once output was left out), then ``_content`` bytes.
        self._marker_size = 0
        self._content = 0
        self._omitted = 0
        #: The log opened again for reading (the descriptor handed down is write-only).
        self._reader: int | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self.error is not None:
            return
        try:
            self._write(memoryview(data))
        except OSError as exc:
            self.error = exc

    def _write(self, data: memoryview) -> None:
        while data:
            if self._head_written < self._head_cap:
                part = data[: self._head_cap - self._head_written]
                self._write_all([part])
                self._head_written += len(part)
            else:
                room = self._tail_cap - self._marker_size - self._content
                if room <= 0:
                    self._compact()
                    continue
                part = data[:room]
                self._write_all([part])
                self._content += len(part)
            data = data[len(part) :]

    def _compact(self) -> None:
        """Rewrite the tail region as the marker and its latest ``_keep`` bytes."""
        if self._reader is None:
            self._reader = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)
        region = self._head_written + self._marker_size
        kept = os.pread(self._reader, self._keep, region + self._content - self._keep)
        if len(kept) != self._keep:
            raise OSError(5, "the log file changed under the reaper (truncated?)")
        self._omitted += self._content - len(kept)
        marker = f"\n[asyncsoak: {self._omitted} bytes of output omitted]\n".encode()
        os.lseek(self._fd, self._head_written, os.SEEK_SET)
        self._write_all([memoryview(marker), memoryview(kept)])
        os.ftruncate(self._fd, self._head_written + len(marker) + len(kept))
        self._marker_size = len(marker)
        self._content = len(kept)

    def _write_all(self, parts: list[memoryview]) -> None:
        parts = [part for part in parts if part]
        while parts:
            written = os.writev(self._fd, parts)
            if written == 0:
                raise OSError(28, "short write to the log (no space left?)")
            while parts and written >= len(parts[0]):
                written -= len(parts.pop(0))
            if parts:
                parts[0] = parts[0][written:]


class Reaper:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.out = sys.stdout
        self.pid: int | None = None
        self.exited = False
        self.empty_reported = False
        self.stop_deadline: float | None = None
        #: Set once the lifeline is lost: the reaper ends by then at the latest.
        self.kill_deadline: float | None = None
        self.log = CappedLog(config["log_fd"], config["log_max_bytes"])
        #: The output pipe's read end (non-blocking), once the command is spawned.
        self.output: int | None = None
        # One buffer for every read: a fresh megabyte per read would be fresh pages each time.
        self._buffer = bytearray(_READ_CHUNK)

    def report(self, **event: Any) -> None:
        try:
            self.out.write(json.dumps(event) + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):
            pass  # the monitor is gone: the lifeline will close too

    def spawn(self, output_w: int) -> None:
        cfg = self.config
        stdin_fd = cfg.get("stdin_fd")

        cgroup_procs = None if cfg.get("cgroup") is None else f"{cfg['cgroup']}/cgroup.procs"

        def in_child() -> None:
            # Joined before exec: every descendant is born in the cgroup, the reaper stays out.
            # A refused join only costs the monitor its membership check.
            if cgroup_procs is not None:
                with contextlib.suppress(OSError), open(cgroup_procs, "wb", buffering=0) as f:
                    f.write(b"0")  # "0": the writing process itself
            # If the reaper is SIGKILLed, the command's leader goes with it; the rest of the
            # tree is in its process group and is reached by the monitor's group kill.
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)

        try:
            proc = subprocess.Popen(
                cfg["argv"],
                stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
                stdout=output_w,
                stderr=output_w,
                cwd=cfg.get("cwd"),
                env=cfg["env"],
                start_new_session=True,
                close_fds=True,
                preexec_fn=in_child,
            )
        except OSError as exc:
            self.report(event="spawn_failed", message=f"{type(exc).__name__}: {exc}")
            self.exited = True
            return
        finally:
            if stdin_fd is not None:
                os.close(stdin_fd)
        # The Popen object never waits: this process reaps with waitpid(-1).
        proc.returncode = 0
        self.pid = proc.pid
        self.report(event="spawned", pid=proc.pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                if self.exited and not self.empty_reported:
                    self.empty_reported = True
                    self.report(event="empty")
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.exited = True
                # What the command wrote before it exited is in the log before its exit is told:
                # the monitor's last look at a short command's output comes right after.
                self.copy_output()
                self.report(event="exited", pid=pid, status=status)

    def copy_output(self) -> bool:
        """Copy what the output pipe holds now into the log (a pipe's worth at most: its writers
        may go on); False once every writer has closed it."""
        if self.output is None:
            return False
        view = memoryview(self._buffer)
        for _ in range(_PIPE_SIZE // _READ_CHUNK):
            try:
                got = os.readv(self.output, [self._buffer])
            except BlockingIOError:
                return True
            if not got:
                return False
            self.log.write(view[:got])
        return True

    def has_children(self) -> bool:
        """Whether any process is left to reap (a subreaper's descendants become its children)."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return True

    def lifeline_lost(self) -> None:
        """The monitor closed our stdin (done, or dead): stop what is left of the tree."""
        now = time.monotonic()
        if not self.has_children():
            self.kill_deadline = now
            return
        mode = self.config["stop_mode"]
        if not self.exited and self.pid is not None:
            with contextlib.suppress(OSError):
                if mode == "group":
                    os.killpg(self.pid, signal.SIGTERM)
                elif mode == "leader":
                    os.kill(self.pid, signal.SIGTERM)
                # "stdin": the kernel closed the command's stdin with the monitor's end.
        self.stop_deadline = now + float(self.config["grace_seconds"])
        kill_wait = self.config.get("kill_wait_seconds")
        kill_wait = _LIFELINE_KILL_WAIT_SECONDS if kill_wait is None else float(kill_wait)
        self.kill_deadline = self.stop_deadline + kill_wait

    def kill_everything(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
        if __package__:
            from . import _tree
        else:  # run by path (-I -S): its neighbour by path, not through the package
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import _tree  # type: ignore[import-not-found,no-redef]
        for pid in _tree.descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def run(self, lifeline: Any) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

        output_r, output_w = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            # EPERM past the user's pipe quota: the default size only costs more wake-ups.
            fcntl.fcntl(output_r, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        os.set_blocking(output_r, False)
        self.output = output_r
        self.spawn(output_w)
        os.close(output_w)

        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        sel.register(output_r, selectors.EVENT_READ, "output")
        sel.register(lifeline, selectors.EVENT_READ, "lifeline")
        self.reap()
        output_open = True
        log_error_reported = False

        while True:
            now = time.monotonic()
            if self.kill_deadline is not None:
                if self.stop_deadline is not None and now >= self.stop_deadline:
                    self.kill_everything()
                if not self.has_children() or now >= self.kill_deadline:
                    break
            # Every wake-up has a cause (output, SIGCHLD, the lifeline, a deadline): until the
            # lifeline closes the reaper sleeps without a timer.
            timeout: float | None = None
            if self.kill_deadline is not None:
                timeout = 0.05
                if self.stop_deadline is not None and now < self.stop_deadline:
                    timeout = max(timeout, self.stop_deadline - now)
            for key, _ in sel.select(timeout):
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    self.reap()
                elif key.data == "output" and not self.copy_output():
                    sel.unregister(output_r)
                    output_open = False
                elif key.data == "lifeline" and not os.read(lifeline, 4096):
                    sel.unregister(lifeline)
                    self.lifeline_lost()
            self.reap()
            if self.log.error is not None and not log_error_reported:
                log_error_reported = True
                self.report(event="log_error", message=str(self.log.error))

        # Whatever is still readable from processes that just died belongs in the log.
        if output_open:
            self.copy_output()
        self.reap()
        return 0


def main() -> int:
    # Ctrl-C reaches the monitor's whole group: the monitor decides how the tree stops, and
    # this process must outlive it to do so.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    lifeline = sys.stdin.fileno()
    # The monitor writes the configuration line and then nothing until it closes the lifeline.
    line, fds = _first_read(lifeline)
    while line and not line.endswith(b"\n"):
        chunk = os.read(lifeline, 65536)
        if not chunk:
            return 2
        line += chunk
    if not line:
        return 2
    config = json.loads(line)
    if fds:
        config["log_fd"] = fds[0]  # the log, opened after this process started
    if _closed(lifeline):
        # The monitor died after sending the command, before this process (launched early)
        # read it: never start a command nobody watches (a queue may have handed its job on).
        return 2
    status = Reaper(config).run(lifeline)
    if config.get("cgroup"):
        # The monitor removes the tree's cgroup too, but it may be the one that died.
        _remove_cgroup(config["cgroup"])
    return status


def _closed(lifeline: int) -> bool:
    """Whether the monitor's end of the lifeline is closed (nothing follows the configuration)."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN | select.POLLRDHUP)
    return any(events & (select.POLLHUP | select.POLLRDHUP) for _, events in poller.poll(0))


def _first_read(lifeline: int) -> tuple[bytes, list[int]]:
    """The lifeline's first bytes and, from a socket, the log's descriptor they carry."""
    if not stat.S_ISSOCK(os.fstat(lifeline).st_mode):
        return os.read(lifeline, 65536), []
    import socket  # here: a pipe's reaper does without it

    with socket.socket(fileno=os.dup(lifeline)) as sock:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    return data, fds


def _remove_cgroup(path: str, timeout: float = 1.0) -> None:
    """Remove the (now empty) cgroup of the tree; the last members may still be exiting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def run() -> NoReturn:
    """The reaper's life, then out without the interpreter's teardown (25 ms of CPU: 64 soaks
    stopped together waited 0.7 to 1.1 s, 0.1 to 0.2 s so); every report is flushed already."""
    exit_status = main()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(exit_status)


if __name__ == "__main__":
    run()
