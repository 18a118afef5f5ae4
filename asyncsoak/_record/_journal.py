"""The journal's format: JSON Lines in segments, each line one event, full or a patch of the
previous event of its kind; written by the serializer, read back bounded by every reader.
The segments, the patch grammar and the bounds: docs/architecture.md, "The journal and the
serializer"."""

from __future__ import annotations

import fcntl
import glob
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

from .._contract import EventKind, bounded, events

#: An open segment larger than this is closed (and compressed) after the batch that crossed it.
SEGMENT_BYTES = 4 * 1024 * 1024
_PATCH_KEY = "~"
#: Event kinds whose last event a decoder keeps for the patches (a hostile journal has millions).
MAX_KINDS = 256
_TOO_LONG = f"a line longer than {bounded.MAX_LINE_BYTES // 2**20} MiB"


def segment_path(journal: Path, index: int, *, compressed: bool = False) -> Path:
    """The path of closed segment ``index`` (1, 2, ...) of ``journal``."""
    return journal.with_name(f"{journal.name}.{index:06d}{'.gz' if compressed else ''}")


def journal_segments(path: Path) -> list[Path]:
    """The journal's segments in order: the closed ones, then the open one (if it exists).  A
    closed one both plain and compressed is read plain (the ``.gz`` may be incomplete)."""
    path = Path(path)
    try:
        names = os.listdir(path.parent or ".")
    except OSError:
        names = []
    # ``soak.jsonl.000001`` and ``soak.jsonl.000001.gz``: the closed segments.
    segment = re.compile(re.escape(path.name) + r"\.(\d{6})(\.gz)?")
    closed: dict[int, Path] = {}
    for match in filter(None, map(segment.fullmatch, names)):
        if match[2] is None or int(match[1]) not in closed:
            closed[int(match[1])] = path.with_name(match[0])
    segments = [closed[i] for i in sorted(closed)]
    if path.exists() or not segments:
        segments.append(path)
    return segments


def make_patch(old: Any, new: Any) -> Any:
    """A patch turning ``old`` into ``new``; ``_UNCHANGED`` when they are the same."""
    if type(old) is not type(new):
        return _literal(new)
    # One comparison in C settles most of a sample.  Inside it 1 == 1.0: a field would have to
    # flip between the two while equal to lose its type, which no sampler does.
    if old == new:
        return _UNCHANGED
    if isinstance(new, dict):
        changed: dict[str, Any] = {}
        for key, value in new.items():
            if key in old:
                patch = make_patch(old[key], value)
                if patch is not _UNCHANGED:
                    changed[key] = patch
            else:
                changed[key] = _literal(value)
        removed = [key for key in old if key not in new]
        out: dict[str, Any] = {}
        if changed:
            out["{"] = changed
        if removed:
            out["-"] = removed
        return out
    if isinstance(new, list):
        items = []
        for index, value in enumerate(new):
            if index < len(old):
                patch = make_patch(old[index], value)
                if patch is not _UNCHANGED:
                    items.append([index, patch])
            else:
                items.append([index, _literal(value)])
        return {"[": items, "n": len(new)}
    return new


def _literal(value: Any) -> Any:
    return {"=": value} if isinstance(value, dict | list) else value


class _Unchanged:
    __slots__ = ()


_UNCHANGED: Any = _Unchanged()


def apply_patch(old: Any, patch: Any) -> Any:
    """``old`` patched, as a new value; a ``ValueError`` (``TypeError``, ``KeyError``) for a
    patch the encoder never writes, :class:`UnreadableFileError` for one that pads a list past
    the items it lists (a memory bomb)."""
    if not isinstance(patch, dict):
        return patch
    if "=" in patch:
        return patch["="]
    if "[" in patch:
        base = list(old) if isinstance(old, list) else []
        length, items = patch["n"], patch["["]
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"a list patch's length must be a count, not {length!r}")
        if not isinstance(items, list):
            raise TypeError("a list patch's items must be a list")
        if length - len(base) > len(items):
            raise bounded.UnreadableFileError(
                f"a list patch pads a list of {len(base)} to {length} with {len(items)} items"
            )
        if len(base) > length:
            del base[length:]
        else:
            base.extend([None] * (length - len(base)))
        for index, item in items:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < length:
                raise ValueError(f"a list patch's index {index!r} is out of range")
            base[index] = apply_patch(base[index], item)
        return base
    out = dict(old) if isinstance(old, dict) else {}
    for key, item in patch.get("{", {}).items():
        out[key] = apply_patch(out.get(key), item)
    for key in patch.get("-", ()):
        out.pop(key, None)
    return out


def _dumps(data: Any) -> str:
    return json.dumps(data, allow_nan=False, separators=(",", ":"), default=str)


class JournalEncoder:
    """Turns events' JSON forms into journal lines: ``compact_kinds`` (the samples) patched,
    the others full, so a reader skimming for them finds them whole."""

    def __init__(self, compact_kinds: frozenset[str] = frozenset({"sample", "gpu_sample"})) -> None:
        self._compact_kinds = compact_kinds
        self._previous: dict[str, dict[str, Any]] = {}

    def reset(self) -> None:
        """A new segment starts: its first event of each kind is written full."""
        self._previous.clear()

    def encode(self, data: Mapping[str, Any]) -> str:
        """The journal line (ending in a newline) of an event's JSON form."""
        kind = data.get("kind")
        key = kind if isinstance(kind, str) else ""
        compact = key in self._compact_kinds
        if not compact and _PATCH_KEY not in data:
            return _dumps(data) + "\n"
        # ``data`` (plain JSON values, never changed once folded) is kept as the next base.
        body = {k: v for k, v in data.items() if k != "t" and k != "kind"}
        previous = self._previous.get(key) if compact else None
        patch: Any = None
        if _PATCH_KEY in data:  # a field of that name would read as a patch: patch the whole
            patch = {"=": body}
        elif previous is not None:
            patch = make_patch(previous, body)
            patch = {} if patch is _UNCHANGED else patch
        line = data if patch is None else {"t": data.get("t"), "kind": kind, _PATCH_KEY: patch}
        text = _dumps(line)
        if compact:  # only once written (a NaN makes dumps raise): the next line patches it
            self._previous[key] = body
        return text + "\n"


class JournalDecoder:
    """Turns journal lines back into events, full or compact; keeps what patches need."""

    def __init__(self) -> None:
        self._previous: dict[str, dict[str, Any]] = {}
        #: A line of this segment was lost: the patches after it may apply to an older base.
        self._damaged = False

    def reset(self) -> None:
        """A new segment starts."""
        self._previous.clear()
        self._damaged = False

    def decode(self, line: bytes | str) -> events.EventJson | None:
        """The event on ``line``; None for a line that is not one (truncated, garbage);
        :class:`UnreadableFileError` for one past the bounds (a list patch's growth only while
        no line of the segment was lost: then a patch may meet an older base)."""
        event = self._decode(line)
        if event is None:
            self._damaged = True
        return event

    def _decode(self, line: bytes | str) -> events.EventJson | None:
        if len(line) > bounded.MAX_LINE_BYTES + 1:
            raise bounded.UnreadableFileError(_TOO_LONG)
        try:
            event = bounded.loads_bounded(line)
        except bounded.UnreadableFileError:
            raise
        except ValueError:
            return None
        if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
            return None
        kind = event["kind"]
        if _PATCH_KEY in event:
            previous = self._previous.get(kind)
            patch = event[_PATCH_KEY]
            if previous is None and not (isinstance(patch, dict) and "=" in patch):
                return None  # the line it patches is lost
            try:
                body = apply_patch(previous, patch)
            except bounded.UnreadableFileError:
                if self._damaged:
                    return None
                raise
            except (KeyError, IndexError, TypeError, ValueError):
                return None
            if not isinstance(body, dict):
                return None
            event = {"t": event.get("t"), "kind": kind, **body}
        body = {k: v for k, v in event.items() if k not in ("t", "kind")}
        if kind in self._previous or len(self._previous) < MAX_KINDS:
            self._previous[kind] = body
        # Read as its kind's JSON form, unchecked: the folds ``.get`` what other versions may
        # lack, and ``recover`` refuses damaged events.
        return cast(events.EventJson, event)


class JournalReader:
    """Every event of a journal (of ``kinds``: others passed over undecoded), in order, across
    its segments.  Unreadable lines are skipped and counted in :attr:`unreadable`; a segment
    not a regular file, a line past the bounds or more than ``MAX_JOURNAL_BYTES`` in all is an
    :class:`UnreadableFileError` naming the file."""

    def __init__(self, path: Path | str, kinds: Collection[str] | None = None) -> None:
        self.path = Path(path)
        self.unreadable = 0
        self._kinds = None if kinds is None else {kind.encode() for kind in kinds}

    def __iter__(self) -> Iterator[events.EventJson]:
        decoder = JournalDecoder()
        read = 0
        for segment in journal_segments(self.path):
            decoder.reset()
            try:
                stream = _open_segment(segment)
            except FileNotFoundError:
                continue  # compressed and removed meanwhile: the .gz is listed next time
            with stream:
                try:
                    for number, line in enumerate(bounded.bounded_lines(stream), 1):
                        try:
                            if line is None:
                                raise bounded.UnreadableFileError(_TOO_LONG)
                            read += len(line)
                            if read > bounded.MAX_JOURNAL_BYTES:
                                raise bounded.UnreadableFileError(
                                    f"more than {bounded.MAX_JOURNAL_BYTES // 2**30} GiB of journal"
                                )
                            if self._kinds is not None and _skipped(line, self._kinds):
                                continue
                            event = decoder.decode(line)
                        except bounded.UnreadableFileError as exc:
                            raise bounded.UnreadableFileError(
                                f"{segment}, line {number}: {exc}: not a journal asyncsoak wrote"
                            ) from None
                        if event is None:
                            self.unreadable += 1
                        elif self._kinds is None or event["kind"].encode() in self._kinds:
                            yield event
                except (EOFError, OSError, zlib.error):
                    # A compressed segment cut short (the disk filled while it was written).
                    self.unreadable += 1


def _skipped(line: bytes, kinds: set[bytes]) -> bool:
    """Whether ``line``'s head names a kind not in ``kinds`` (patches chain within a kind)."""
    start = line.find(b',"kind":"', 0, 64) + 9
    end = line.find(b'"', start, start + 64) if start > 8 and line.startswith(b'{"t":') else -1
    return end > 0 and line[start:end] not in kinds


def _open_segment(path: Path) -> IO[bytes]:
    """A segment opened for reading (decompressed), refused unless it is a regular file."""
    raw = bounded.open_regular(path)
    if path.name.endswith(".gz"):
        # GzipFile is a BufferedIOBase: every IO[bytes] method the readers use.
        return cast(IO[bytes], _Decompressed(raw))
    return raw


class _Decompressed(gzip.GzipFile):
    """A compressed segment read from a file already open, closed with it."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def read_journal(path: Path | str) -> Iterator[dict[str, Any]]:
    """Every event of the soak journal at ``path``, as plain dicts, in order (every form
    asyncsoak has written; unreadable lines skipped)."""
    return cast("Iterator[dict[str, Any]]", iter(JournalReader(path)))


def first_line(path: Path | str) -> bytes:
    """The first line of the journal's first segment (empty if there is none)."""
    segments = journal_segments(Path(path))
    with _open_segment(segments[0]) as stream:
        return stream.readline(bounded.MAX_LINE_BYTES + 1)


def monitor_holds(journal: Path, wait: bool = False) -> bool:
    """Whether a monitor still holds ``journal``: a soak locks it for as long as it runs;
    ``wait``: block until none does (run it in a thread, under a deadline)."""
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def is_journal(path: Path | str) -> bool:
    """Whether ``path`` is a soak journal: its first segment starts with a header line."""
    try:
        event = JournalDecoder().decode(first_line(path))
    except (OSError, EOFError, zlib.error, bounded.UnreadableFileError):
        return False
    return event is not None and event.get("kind") == EventKind.HEADER


def remove_closed_segments(path: Path) -> None:
    """Remove the closed segments an earlier soak left at this journal path (a rerun)."""
    for segment in journal_segments(path)[:-1]:
        if segment != path:
            segment.unlink(missing_ok=True)
    for leftover in path.parent.glob(f"{glob.escape(path.name)}.*.gz.tmp"):
        leftover.unlink(missing_ok=True)


def compress_segment(plain: Path, created: Callable[[tuple[int, int]], None] | None = None) -> Path:
    """Compress a closed segment beside itself (under a temporary name until complete), then
    remove the plain file (blocking).  ``created`` is told its (device, inode) at once: a
    file asyncsoak writes is never progress."""
    target = plain.with_name(plain.name + ".gz")
    partial = plain.with_name(plain.name + ".gz.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    if created is not None:
        st = os.fstat(fd)
        created((st.st_dev, st.st_ino))
    with open(plain, "rb") as source, open(fd, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as out:
            while chunk := source.read(64 * 1024):
                out.write(chunk)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(partial, target)
    os.unlink(plain)
    return target
