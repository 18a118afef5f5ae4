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
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class CommandResult:
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
    duration: float = field(default=0.0, compare=False)

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


def _start_error(argv: Sequence[str], exc: OSError) -> str:
    return f"could not run {argv[0]!r}: {exc.strerror or exc}"


def _finished(
    argv: list[str],
    returncode: int | None,
    output: str,
    *,
    limit: float,
    timed_out: bool,
    abandoned_pid: int | None,
    duration: float,
    stderr: str = "",
) -> CommandResult:
    """The result of a command that started: its status, or why it has none."""
    error = None
    if timed_out:
        error = f"no answer within {limit:g} s; killed"
        if abandoned_pid is not None:
            error += ", but it did not exit after SIGKILL (abandoned)"
    return CommandResult(
        argv,
        None if timed_out else returncode,
        output,
        stderr=stderr,
        error=error,
        timed_out=timed_out,
        abandoned_pid=abandoned_pid,
        duration=duration,
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
        await _close_reaped_abandoned()
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


async def _close_reaped_abandoned() -> None:
    for process in [p for p in _abandoned_async if p.returncode is not None]:
        _abandoned_async.remove(process)
        await process.aclose()


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
    started = anyio.current_time()
    try:
        process = await open_command(argv)
    except OSError as exc:
        return CommandResult(
            argv, None, "", error=_start_error(argv, exc), missing=_is_missing(exc)
        )
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
    return _finished(
        argv,
        process.returncode,
        b"".join(chunks).decode(errors="replace"),
        limit=time_limit,
        timed_out=timed_out,
        abandoned_pid=None if gone else process.pid,
        duration=anyio.current_time() - started,
    )


def _is_missing(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError | NotADirectoryError)


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
    started = time.monotonic()
    deadline = started + timeout
    _reap_abandoned_sync()
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
        return CommandResult(
            argv, None, "", error=_start_error(argv, exc), missing=_is_missing(exc)
        )
    out = bytearray()
    err = bytearray()
    timed_out = True
    try:
        if not _read_until(proc, deadline, out, err, consume):
            proc.wait(max(0.0, deadline - time.monotonic()))
            timed_out = False
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Also reached when ``consume`` raises: the command never outlives this call.
        gone = not timed_out or _kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return _finished(
        argv,
        proc.returncode,
        out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        limit=timeout,
        timed_out=timed_out,
        abandoned_pid=None if gone else proc.pid,
        duration=time.monotonic() - started,
    )


def _read_until(
    proc: subprocess.Popen[bytes],
    deadline: float,
    out: bytearray,
    err: bytearray,
    consume: Callable[[bytes], None] | None,
) -> bool:
    """Read both pipes to EOF; True when the deadline came first."""
    with selectors.DefaultSelector() as selector:
        for pipe, buffer in ((proc.stdout, out), (proc.stderr, err)):
            if pipe is not None:
                selector.register(pipe, selectors.EVENT_READ, buffer)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif consume is not None and key.data is out:
                    consume(chunk)
                elif len(key.data) < MAX_OUTPUT:
                    key.data.extend(chunk)
    return False


def _kill_group(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the command's process group; False when the command had to be abandoned."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(COMMAND_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        with _abandoned_sync_lock:
            _abandoned_sync.append(proc)
        return False
    return True


def _reap_abandoned_sync() -> None:
    with _abandoned_sync_lock:
        for proc in [p for p in _abandoned_sync if p.poll() is not None]:
            _abandoned_sync.remove(proc)
