"""Reading files anyone may have put there (a FIFO, gigabytes, a line without end, JSON nested
thousands deep): bounded in kind, size, line length and nesting, refused with one
:class:`UnreadableFileError` naming the file.  The bounds are far above anything asyncsoak writes.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from typing import IO, Any

from ._errors import ValidationError

#: A journal line (one event) longer than this is not one asyncsoak wrote: it is skipped.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: An artifact larger than this is not one (they hold summaries and bounded series).
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
#: Bytes of journal text (decompressed) a reader goes through at most: years of a busy soak.
MAX_JOURNAL_BYTES = 64 * 1024 * 1024 * 1024
#: Containers inside containers a document read back may have (an event, an artifact).
MAX_NESTING_DEPTH = 64
#: How deep ``run_soak``'s ``metadata`` may nest (held two levels down, within the above).
MAX_METADATA_DEPTH = 32


#: What a file is, by the letter ``stat.filemode`` gives its type.
_KINDS = {
    "d": "a directory",
    "c": "a character device",
    "b": "a block device",
    "p": "a named pipe",
    "s": "a socket",
}


class UnreadableFileError(ValidationError):
    """A file no reader takes, never one asyncsoak writes nor a crash leaves: not regular, too
    large, a line too long, JSON nested too deep, a journal patch that inflates."""


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading in binary; :class:`UnreadableFileError` unless it is a
    regular file.  Opening never blocks: a FIFO is opened non-blocking, then refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.filemode(mode)[0], "not a plain file")
            raise UnreadableFileError(f"{os.fspath(path)} is not a regular file ({kind})")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def nested_too_deep(value: Any, limit: int = MAX_NESTING_DEPTH) -> bool:
    """Whether ``value`` (decoded JSON) holds containers more than ``limit`` deep (walked with
    a stack, so any depth is measured)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list) and child:
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def loads_bounded(text: bytes | str) -> Any:
    """``json.loads(text)``; :class:`UnreadableFileError` for JSON nested deeper than
    :data:`MAX_NESTING_DEPTH` (never a ``RecursionError``)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise UnreadableFileError(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels") from None
    # Fewer brackets than the bound cannot nest past it: most lines skip the walk.
    if isinstance(text, bytes):
        opened = text.count(b"[") + text.count(b"{")
    else:
        opened = text.count("[") + text.count("{")
    if opened > MAX_NESTING_DEPTH and nested_too_deep(value):
        raise UnreadableFileError(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
    return value


def read_json_file(path: str | os.PathLike[str], max_bytes: int = MAX_ARTIFACT_BYTES) -> Any:
    """The JSON document in the regular file at ``path``, at most ``max_bytes`` long;
    :class:`UnreadableFileError` naming the file when not, ``ValueError`` when not JSON."""
    name = os.fspath(path)
    with open_regular(path) as f:
        # A huge file is refused unread; the read is bounded all the same (it may grow).
        too_large = os.fstat(f.fileno()).st_size > max_bytes
        data = b"" if too_large else f.read(max_bytes + 1)
    if too_large or len(data) > max_bytes:
        raise UnreadableFileError(
            f"{name} is larger than {max_bytes // 2**20} MiB: not an asyncsoak artifact"
        )
    try:
        return loads_bounded(data)
    except UnreadableFileError as exc:
        raise UnreadableFileError(f"{name}: {exc}: not an asyncsoak artifact") from None


def bounded_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Each line of ``stream`` (with its newline, the last one maybe without), or None for a
    line longer than ``limit`` bytes, whose rest is skipped unread into memory."""
    while line := stream.readline(limit + 1):
        if line.endswith(b"\n") or len(line) <= limit:
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = stream.readline(limit + 1)
        yield None
