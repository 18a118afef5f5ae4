"""The cause of a crash, read from the end of the command's output: the last Python traceback,
CUDA out-of-memory or NCCL error, or a shell's ``Killed``, so the failure message can say it
instead of "exited with status 1".  A launcher's line prefix (``[rank0]:``) is stripped.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ._exits import signal_name

_TRACEBACK = re.compile(r"^(?P<prefix>.*?)Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)')
#: ``ValueError: bad``, ``torch.OutOfMemoryError: CUDA out of memory...``, ``KeyboardInterrupt``.
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_CUDA_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
_NCCL = re.compile(
    r"NCCL (?:error|Error)|nccl(?:Internal|System|UnhandledCuda|Invalid\w*)Error"
    r"|Watchdog caught collective operation timeout"
)
#: The errors a line names without a traceback: (kind, pattern, the cause's type).
_RAW_ERRORS = (("cuda_oom", _CUDA_OOM, "CUDA out of memory"), ("nccl", _NCCL, "NCCL error"))
#: bash: ``bash: line 1: 1234 Killed  python train.py`` (a script), ``bash: 1234 Killed ...``
#: (``bash -c``); dash prints ``Killed`` alone.
_KILLED = re.compile(r"^(?:\S+: (?:line \d+: +)?\d+ +)?Killed(?:\s.*)?$")
#: Longest message kept (an exception message can be a whole tensor).
MESSAGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class CrashInLog:
    type: str
    message: str
    #: ``file.py:LINE`` of the raising frame, when a traceback shows it.
    where: str | None
    kind: str


def last_traceback(lines: Sequence[str]) -> tuple[int, int, CrashInLog] | None:
    """The last whole Python traceback in ``lines``: (its ``Traceback`` line, one past its
    exception line, the cause), or None."""
    found = [(index, end, cause) for index, _, end, cause in _tracebacks(lines)]
    return found[-1] if found else None


def _tracebacks(lines: Sequence[str]) -> Iterator[tuple[int, str, int, CrashInLog]]:
    """Each whole traceback: its ``Traceback`` line, prefix, one past its exception, cause."""
    for index, line in enumerate(lines):
        match = _TRACEBACK.match(line)
        if match is not None and (parsed := _traceback(lines, index + 1, match["prefix"])):
            yield index, match["prefix"], parsed[0] + 1, parsed[1]


def find_exception(text: str) -> CrashInLog | None:
    """The last crash cause in ``text`` (the tail of a log), or None."""
    lines = text.splitlines()
    traceback = last_traceback(lines)
    found = None if traceback is None else (traceback[1] - 1, traceback[2])
    for index in range(len(lines) - 1, found[0] if found else -1, -1):
        # Lines after the last traceback: a raw NCCL or CUDA error, or a shell's "Killed".
        line = lines[index].strip()
        if _KILLED.match(line):
            return CrashInLog("Killed", line, None, "killed")
        for kind, pattern, name in _RAW_ERRORS:
            if pattern.search(line):
                return CrashInLog(name, _clip(line), None, kind)
    return None if found is None else found[1]


def _traceback(lines: Sequence[str], start: int, prefix: str) -> tuple[int, CrashInLog] | None:
    where: str | None = None
    for index in range(start, len(lines)):
        raw = lines[index]
        if prefix and raw.startswith(prefix):
            raw = raw[len(prefix) :]
        elif prefix:
            continue  # another process's line interleaved with this traceback
        frame = _FRAME.match(raw)
        if frame is not None:
            where = f"{os.path.basename(frame['file'])}:{frame['line']}"
            continue
        if not raw.strip() or raw[:1].isspace():
            continue  # source lines, "^^^^" markers
        match = _EXCEPTION.match(raw.rstrip())
        if match is None or where is None:
            return None
        kind = next((kind for kind, pattern, _ in _RAW_ERRORS if pattern.search(raw)), "python")
        return index, CrashInLog(match["type"], _clip(match["message"] or ""), where, kind)
    return None


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def describe_crash(cause: CrashInLog) -> str:
    """``RuntimeError: injected crash at step 200 (hf_train.py:28)``."""
    head = f"{cause.type}: {cause.message}" if cause.message else cause.type
    if cause.kind == "killed":
        head = "Killed (reported by the shell; often the OOM killer)"
    return head if cause.where is None else f"{head} ({cause.where})"


#: ``[rank1]:`` (torch.distributed's own prefix on a rank's traceback) and ``[1,1]<stderr>:``
#: (``mpirun --tag-output``: the job and the rank).
_RANK_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]:|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:")
#: ``[default1]:`` (torchrun ``--tee``: its default role's name and the local rank).
_LOCAL_PREFIX = re.compile(r"\[default(?P<local>\d+)\]:")
#: torchrun's closing report: ``Root Cause (first observed failure):`` then the fields.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_ROOT_PID = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_ROOT_ERROR_FILE = re.compile(r"^\s*error_file\s*:\s*(?P<path>/\S+)\s*$")
_ROOT_TRACEBACK = re.compile(r"^(?P<indent>\s*)traceback\s*:\s(?P<first>.*)$")
#: Exceptions of a launcher reporting that a rank failed: never the cause itself.
LAUNCHER_EXCEPTIONS = frozenset(
    {
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
        "ChildFailedError",
        "subprocess.CalledProcessError",
    }
)
#: Bytes read at most of torchelastic's error file.
ERROR_FILE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class RankCrash:
    """The rank that failed first, and its own exception."""

    rank: int | None
    local_rank: int | None
    pid: int | None
    cause: CrashInLog


@dataclass(frozen=True, slots=True)
class _RootCause:
    rank: int
    local_rank: int | None
    pid: int | None
    exitcode: int | None
    error_file: str | None
    traceback: str | None


def find_rank_exception(text: str) -> RankCrash | None:
    """The rank of a distributed run that failed first (torchrun's "first observed failure",
    else the first rank's traceback) and its exception (torchelastic's error file, else the
    rank's prefixed traceback, never a launcher's), from the log's end; None if none shows."""
    lines = text.splitlines()
    root = _root_cause(lines)
    tracebacks = [t for t in _rank_tracebacks(lines) if t[2].type not in LAUNCHER_EXCEPTIONS]
    if root is None:
        first = next((t for t in tracebacks if t[0] is not None or t[1] is not None), None)
        return None if first is None else RankCrash(first[0], first[1], None, first[2])
    own = (
        c for r, loc, c in tracebacks if r == root.rank or (r is None and loc == root.local_rank)
    )
    cause = next(own, None)
    if cause is None:
        cause = _error_file_cause(root.error_file) or (
            find_exception(root.traceback) if root.traceback else None
        )
        if cause is None or cause.type in LAUNCHER_EXCEPTIONS:
            # No words from the rank (killed by a signal, or no traceback): its exit.
            cause = _exit_cause(root.exitcode)
    return None if cause is None else RankCrash(root.rank, root.local_rank, root.pid, cause)


def _rank_tracebacks(lines: Sequence[str]) -> list[tuple[int | None, int | None, CrashInLog]]:
    """Every whole traceback in ``lines`` with the rank (or local rank) its prefix names."""
    found = []
    for _, prefix, _, cause in _tracebacks(lines):
        rank, local = _RANK_PREFIX.search(prefix), _LOCAL_PREFIX.search(prefix)
        number = int(rank["rank"] or rank["mpi"]) if rank else None
        found.append((number, int(local["local"]) if local else None, cause))
    return found


def _root_cause(lines: Sequence[str]) -> _RootCause | None:
    """torchrun's report of the first observed failure, when the log holds one."""
    start = max((i for i, line in enumerate(lines) if line.strip() == _ROOT_CAUSE), default=-1)
    if start < 0:
        return None
    rank = local = pid = exitcode = None
    error_file = traceback = None
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line.startswith("===="):
            break
        if (match := _ROOT_RANK.match(line)) is not None:
            rank = int(match["rank"])
            local = int(match["local"]) if match["local"] else None
        elif (match := _ROOT_PID.match(line)) is not None:
            pid = int(match["pid"])
            exitcode = int(match["code"])
        elif (match := _ROOT_ERROR_FILE.match(line)) is not None:
            error_file = match["path"]
        elif (match := _ROOT_TRACEBACK.match(line)) is not None:
            # The error file's traceback, each following line indented as the field is.
            indent = len(match["indent"])
            body = [match["first"]]
            for more in lines[index + 1 :]:
                if more.startswith(("====", "----")):
                    break
                body.append(more[indent:] if more[:indent].isspace() else more.strip())
            traceback = "\n".join(body)
    if rank is None:
        return None
    return _RootCause(rank, local, pid, exitcode, error_file, traceback)


def _exit_cause(exitcode: int | None) -> CrashInLog | None:
    """A rank that left no exception: how it ended, as torchrun reports its exit code."""
    if exitcode is None or exitcode == 0:
        return None
    if exitcode < 0:
        name = signal_name(-exitcode)
        oom = " (often the kernel's OOM killer)" if -exitcode == signal.SIGKILL else ""
        return CrashInLog(name, f"killed by {name}{oom}", None, "signal")
    return CrashInLog(f"exit status {exitcode}", "no traceback", None, "exit")


def _error_file_cause(path: str | None) -> CrashInLog | None:
    """The exception in torchelastic's error file (``@record``'s ``error.json``), if readable."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(ERROR_FILE_BYTES))
        message = data["message"]
        stack = message["extraInfo"]["py_callstack"] if isinstance(message, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return find_exception(stack) if isinstance(stack, str) else None


def describe_rank_crash(crash: RankCrash) -> str:
    """``rank 1 (pid 4242) failed first: ValueError: bad batch (train.py:11)``."""
    who = f"rank {crash.rank}" if crash.rank is not None else f"local rank {crash.local_rank}"
    if crash.pid is not None:
        who += f" (pid {crash.pid})"
    return f"{who} failed first: {describe_crash(crash.cause)}"
