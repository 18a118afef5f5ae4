"""The soak's own files (artifact, journal, log): never someone else's, never two soaks' at once.

A file at one of those paths is overwritten only when an earlier soak wrote it (an asyncsoak
journal or artifact names it); a soak holds an exclusive ``flock`` on its journal for its life.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._contract import EventKind, ValidationError, bounded
from .._record import (
    FILE_MODE,
    JournalDecoder,
    create_private_file,
    first_line,
    monitor_holds,
    remove_closed_segments,
)
from ._config import SoakConfig

#: Bound on reading what is already at the output paths (a dead mount must not hang the start).
CHECK_TIMEOUT_SECONDS = 10.0
#: Free space below which the output filesystem counts as full (the first events, an artifact).
MIN_FREE_BYTES = 64 * 1024


def _journal_header(path: Path) -> Mapping[str, Any] | None:
    """The header of the asyncsoak journal at ``path`` (its first segment's), or None."""
    if not os.path.lexists(path):
        return None
    try:
        header = JournalDecoder().decode(first_line(path))
    except (OSError, EOFError, IndexError, ValueError, zlib.error):
        return None
    if header is not None and header["kind"] == EventKind.HEADER:
        return header
    return None


def _artifact(path: Path) -> dict[str, Any] | None:
    """The asyncsoak artifact at ``path``, or None when it is not one."""
    try:
        data = bounded.read_json_file(path)
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and "schema_version" in data and "status" in data:
        return data
    return None


def _named(record: Mapping[str, Any], *sections: str) -> set[Path]:
    """The paths of the soak's files that a journal header or an artifact names."""
    found: set[Path] = set()
    for section in (record, *(record.get(s) for s in sections)):
        if not isinstance(section, dict):
            continue
        for key in ("output_path", "journal_path", "log_path", "steps_path", "path"):
            value = section.get(key)
            if isinstance(value, str) and value:
                found.add(Path(value))
    return found


class OutputLocationError(ValidationError):
    """The output location cannot take the soak's files (read-only, not writable, full): bad
    input for ``asyncsoak run`` (exit status 2), the worker's problem (not the job's)."""


def _check_writable(path: Path) -> None:
    """Refuse a file that cannot be created in its directory (or the first existing one above)."""
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        fs = os.statvfs(directory)
    except OSError as exc:
        raise OutputLocationError(f"cannot write {path}: {directory}: {exc.strerror}") from None
    if fs.f_flag & os.ST_RDONLY:
        raise OutputLocationError(
            f"cannot write {path}: {directory} is unwritable (a read-only filesystem)"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputLocationError(f"cannot write {path}: {directory} is unwritable")
    if not fs.f_blocks:  # /proc, /sys: writable to root, yet no file can be made there
        raise OutputLocationError(
            f"cannot write {path}: {directory} is unwritable (a filesystem that holds no files)"
        )
    free = fs.f_bavail * fs.f_frsize
    if free < MIN_FREE_BYTES or (fs.f_files and not fs.f_favail):
        raise OutputLocationError(
            f"cannot write {path}: the filesystem of {directory} is full "
            f"({free} bytes{'' if fs.f_favail else ' and no inodes'} free)"
        )


def check_outputs(cfg: SoakConfig) -> None:
    """Refuse (blocking, reading only) output paths the soak cannot or must not write: a file
    there that no earlier soak wrote, a read-only or full filesystem."""
    for path in (cfg.output_path, cfg.log_path):
        _check_writable(path)
    # An empty journal holds nothing to lose: another soak's, the instant after its start.
    owned = {cfg.journal_path} if _empty(cfg.journal_path) else set()
    header = _journal_header(cfg.journal_path)
    if header is not None:
        owned |= {cfg.journal_path, *_named(header, "config")}
    artifact = _artifact(cfg.output_path)
    if artifact is not None:
        owned |= {cfg.output_path, *_named(artifact, "config", "log")}
    for path, role in (
        (cfg.journal_path, "journal"),
        (cfg.log_path, "captured output"),
        (cfg.output_path, "artifact"),
        (cfg.steps_path, "asyncsoak.trainer.report file"),
    ):
        if path not in owned and os.path.lexists(path):
            if monitor_holds(cfg.journal_path):
                # Another soak is writing them (its journal's header not written yet).
                raise _another_soak(cfg.journal_path)
            raise ValidationError(
                f"{path} already exists and was not written by an earlier soak; the soak's "
                f"{role} goes there and would overwrite it: choose another output path "
                "(or remove the file)"
            )


#: Tries at the journal's exclusive lock, and the wait between them.
LOCK_TRIES = 3
LOCK_RETRY_SECONDS = 0.005


def lock_journal(path: Path) -> int:
    """Take the soak's exclusive lock on its journal; returns the lock's fd (close to release).
    Raises :class:`ValidationError` when another soak holds it (the same output path)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        for _ in range(LOCK_TRIES):
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            # Another soak's or recover's probe (monitor_holds) holds a shared lock for
            # microseconds: the soak that created the journal must not lose to it.
            time.sleep(LOCK_RETRY_SECONDS)
        raise _another_soak(path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


@dataclass
class SoakFiles:
    """The soak's own open files, held until it ends: the journal's lock, the journal (until the
    serializer takes it), the log, the locks on the journal's later segments."""

    lock_fd: int
    journal_fd: int
    log_fd: int
    segment_locks: list[int] = field(default_factory=list)

    @classmethod
    def open(cls, cfg: SoakConfig) -> SoakFiles:
        cfg.output_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as undo:  # closes what was opened if a later step fails
            lock_fd = lock_journal(cfg.journal_path)
            undo.callback(os.close, lock_fd)
            journal_fd = create_private_file(cfg.journal_path)
            undo.callback(os.close, journal_fd)
            # An earlier soak's closed segments would read as the start of this journal.
            remove_closed_segments(cfg.journal_path)
            log_fd = create_private_file(cfg.log_path)
            undo.pop_all()
        return cls(lock_fd=lock_fd, journal_fd=journal_fd, log_fd=log_fd)

    def take_journal(self) -> int:
        """The journal's descriptor, now the serializer's to write and close."""
        fd, self.journal_fd = self.journal_fd, -1
        return fd

    def close(self) -> None:
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
        os.close(self.log_fd)
        for fd in self.segment_locks:
            os.close(fd)
        os.close(self.lock_fd)


def _another_soak(journal: Path) -> ValidationError:
    return ValidationError(
        f"another soak is running with the journal {journal} (the same output path); "
        "refusing to start a second one over it"
    )


def _empty(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0
