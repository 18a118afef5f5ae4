"""Short external commands under a deadline (``nvidia-smi``, ``git``), in their own session: one
that overruns is killed; one that survives SIGKILL (``D`` state) is abandoned, reaped later."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import anyio
import anyio.lowlevel
from anyio.abc import Process

#: Seconds a process gets to exit after SIGTERM before SIGKILL.
COMMAND_TERMINATE_GRACE_SECONDS = 1.0
#: Seconds to wait for a process to be reaped after SIGKILL before abandoning it.
COMMAND_KILL_WAIT_SECONDS = 1.0
#: Output kept from one command; the rest is read and discarded.
MAX_OUTPUT = 4 * 1024 * 1024

_READ_CHUNK = 65536

_abandoned_async: list[Process] = []
_abandoned_sync: list[subprocess.Popen[bytes]] = []
#: ``run_command_sync`` runs in several of asyncsoak's threads at once.
_abandoned_sync_lock = threading.Lock()


class CommandResult(NamedTuple):
    """What one command did.  ``error`` says why it gave no normal result."""

    argv: list[str]
    returncode: int | None
    output: str
    stderr: str = ""
    error: str | None = None
    #: The executable does not exist.
    missing: bool = False
    timed_out: bool = False
    #: Pid of a process that would not die after SIGKILL.
    abandoned_pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    def describe(self) -> str:
        """One line for a human: the error, or the exit status and the first output line."""
        if self.error is not None:
            return self.error
        lines = (line.strip() for text in (self.output, self.stderr) for line in text.splitlines())
        first = next(filter(None, lines), "")
        return f"exit status {self.returncode}" + (f": {first}" if first else "")


def _not_started(argv: list[str], exc: OSError) -> CommandResult:
    error = f"could not run {argv[0]!r}: {exc.strerror or exc}"
    missing = isinstance(exc, FileNotFoundError | NotADirectoryError)
    return CommandResult(argv, None, "", error=error, missing=missing)


def _finished(
    argv: list[str],
    returncode: int | None,
    out: bytes | bytearray,
    err: bytes | bytearray,
    limit: float | None,
    abandoned: int | None,
) -> CommandResult:
    """The result of a command that started: its status, or why it has none (``limit``: it
    timed out after so many seconds; ``abandoned``: the pid that outlived SIGKILL)."""
    error = None
    if limit is not None:
        error = f"no answer within {limit:g} s; killed"
        if abandoned is not None:
            error += ", but it did not exit after SIGKILL (abandoned)"
    output, stderr = (data.decode(errors="replace") for data in (out, err))
    return CommandResult(
        argv, None if error else returncode, output, stderr, error, False, bool(error), abandoned
    )


async def stop_process(
    process: Process,
    *,
    terminate_grace_seconds: float = COMMAND_TERMINATE_GRACE_SECONDS,
    kill_wait_seconds: float = COMMAND_KILL_WAIT_SECONDS,
) -> bool:
    """SIGTERM, bounded wait, SIGKILL, bounded wait, shielded; False when abandoned.  anyio's
    ``aclose()`` waits unbounded when cancelled: only called once the process is reaped."""
    with anyio.CancelScope(shield=True):
        for reaped in [p for p in _abandoned_async if p.returncode is not None]:
            _abandoned_async.remove(reaped)
            await reaped.aclose()
        if process.returncode is None and terminate_grace_seconds > 0:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            with anyio.move_on_after(terminate_grace_seconds):
                await process.wait()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with anyio.move_on_after(kill_wait_seconds):
                await process.wait()
        gone = process.returncode is not None
        if gone:
            await process.aclose()
        else:
            _abandoned_async.append(process)
    return gone


async def open_command(argv: Sequence[str], *, stdout: int = subprocess.PIPE) -> Process:
    """Start a command in its own session, stdout and stderr on one pipe (or ``stdout``).
    Shielded once begun (bounded): a cancel mid-start would leave a process no one reaps."""
    await anyio.lowlevel.checkpoint_if_cancelled()
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process


async def run_command(argv: Sequence[str], *, time_limit: float) -> CommandResult:
    """Run a command to its end or its deadline; stdout and stderr together in ``output``."""
    argv = list(argv)
    try:
        process = await open_command(argv)
    except OSError as exc:
        return _not_started(argv, exc)
    chunks: list[bytes] = []
    kept = 0
    timed_out = False
    try:
        with anyio.fail_after(time_limit):
            if process.stdout is not None:
                async for chunk in process.stdout:
                    if kept < MAX_OUTPUT:
                        chunks.append(chunk)
                        kept += len(chunk)
            await process.wait()
    except TimeoutError:
        timed_out = True
    finally:
        # A one-shot query that overran is not asked politely: it gets SIGKILL at once.
        gone = await stop_process(process, terminate_grace_seconds=0)
    limit = time_limit if timed_out else None
    abandoned = None if gone else process.pid
    return _finished(argv, process.returncode, b"".join(chunks), b"", limit, abandoned)


def run_command_sync(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    consume: Callable[[bytes], None] | None = None,
) -> CommandResult:
    """Run a command to its end or its deadline (then its group is killed); ``consume`` gets
    stdout chunk by chunk instead of ``output`` (a large diff hashed, not held)."""
    argv = list(argv)
    deadline = time.monotonic() + timeout
    with _abandoned_sync_lock:
        for reaped in [p for p in _abandoned_sync if p.poll() is not None]:
            _abandoned_sync.remove(reaped)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        return _not_started(argv, exc)
    out, err = bytearray(), bytearray()
    timed_out = True
    try:
        # Both pipes read to their end, or to the deadline.
        with selectors.DefaultSelector() as selector:
            for pipe, buffer in ((proc.stdout, out), (proc.stderr, err)):
                if pipe is not None:
                    selector.register(pipe, selectors.EVENT_READ, buffer)
            while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif consume is not None and key.data is out:
                        consume(chunk)
                    elif len(key.data) < MAX_OUTPUT:
                        key.data.extend(chunk)
            drained = not selector.get_map()
        if drained:
            proc.wait(max(0.0, deadline - time.monotonic()))
            timed_out = False
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Also reached when ``consume`` raises: the command never outlives this call.  Its
        # group is killed; one that outlives SIGKILL is abandoned.
        gone = not timed_out
        if timed_out:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(COMMAND_KILL_WAIT_SECONDS)
                gone = True
            except subprocess.TimeoutExpired:
                with _abandoned_sync_lock:
                    _abandoned_sync.append(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    limit = timeout if timed_out else None
    return _finished(argv, proc.returncode, out, err, limit, None if gone else proc.pid)
