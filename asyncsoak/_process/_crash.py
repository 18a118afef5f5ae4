"""The cause of a crash, read from the end of the command's output.

A failed training run says why in its last lines: a Python traceback (its exception line and
the frame that raised), a CUDA out-of-memory error, an NCCL error, or a shell's ``Killed``
(the OOM killer, seen from a wrapper script).  :func:`find_exception` finds the last of these,
so the failure message and the CLI's last line can say it instead of "exited with status 1".

Launchers prefix each line (torchrun's ``[rank0]:``, ``[default0]:``): the prefix of the
``Traceback`` line is stripped from the lines that follow it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

_TRACEBACK = re.compile(r"^(?P<prefix>.*?)Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)')
#: ``ValueError: bad``, ``torch.OutOfMemoryError: CUDA out of memory...``, ``KeyboardInterrupt``.
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_CUDA_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
_NCCL = re.compile(
    r"NCCL (?:error|Error)|nccl(?:Internal|System|UnhandledCuda|Invalid\w*)Error"
    r"|Watchdog caught collective operation timeout"
)
#: bash: ``bash: line 1: 1234 Killed  python train.py`` (a script), ``bash: 1234 Killed ...``
#: (``bash -c``); dash prints ``Killed`` alone.
_KILLED = re.compile(r"^(?:\S+: (?:line \d+: +)?\d+ +)?Killed(?:\s.*)?$")
#: Longest message kept (an exception message can be a whole tensor).
MESSAGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class CrashCause:
    type: str
    message: str
    #: ``file.py:LINE`` of the raising frame, when a traceback shows it.
    where: str | None
    kind: str


def last_traceback(lines: Sequence[str]) -> tuple[int, int, CrashCause] | None:
    """The last whole Python traceback in ``lines``: (its ``Traceback`` line, one past its
    exception line, the cause), or None."""
    found: tuple[int, int, CrashCause] | None = None
    for index, line in enumerate(lines):
        match = _TRACEBACK.match(line)
        if match is not None:
            parsed = _traceback(lines, index + 1, match["prefix"])
            if parsed is not None:
                found = (index, parsed[0] + 1, parsed[1])
    return found


def find_exception(text: str) -> CrashCause | None:
    """The last crash cause in ``text`` (the tail of a log), or None."""
    lines = text.splitlines()
    traceback = last_traceback(lines)
    found = None if traceback is None else (traceback[1] - 1, traceback[2])
    for index in range(len(lines) - 1, found[0] if found else -1, -1):
        # Lines after the last traceback: a raw NCCL or CUDA error, or a shell's "Killed".
        line = lines[index].strip()
        if _KILLED.match(line):
            return CrashCause("Killed", line, None, "killed")
        if _CUDA_OOM.search(line):
            return CrashCause("CUDA out of memory", _clip(line), None, "cuda_oom")
        if _NCCL.search(line):
            return CrashCause("NCCL error", _clip(line), None, "nccl")
    return None if found is None else found[1]


def _traceback(lines: Sequence[str], start: int, prefix: str) -> tuple[int, CrashCause] | None:
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
        message = match["message"] or ""
        kind = "python"
        if _CUDA_OOM.search(raw):
            kind = "cuda_oom"
        elif _NCCL.search(raw):
            kind = "nccl"
        return index, CrashCause(match["type"], _clip(message), where, kind)
    return None


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def describe(cause: CrashCause) -> str:
    """``RuntimeError: injected crash at step 200 (hf_train.py:28)``."""
    if cause.kind == "killed":
        head = "Killed (reported by the shell; often the OOM killer)"
    elif cause.message:
        head = f"{cause.type}: {cause.message}"
    else:
        head = cause.type
    return head if cause.where is None else f"{head} ({cause.where})"
