"""Linux inotify through ctypes: the watchdog hears about a write when it happens.

The scans stay the authority: a missing or overflowing inotify costs promptness, never
correctness.  :meth:`Inotify.read` never blocks; walking and adding watches may (a hung mount),
so they run in threads, and :meth:`Inotify.close` is safe beside them.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
IN_ISDIR = 0x40000000
IN_DONT_FOLLOW = 0x02000000
IN_ONLYDIR = 0x01000000
_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
_HEADER = struct.Struct("iIII")
#: Directories watched at most; beyond that the scans alone keep watch.
MAX_WATCHES = 4096

_libc = ctypes.CDLL(None, use_errno=True)


class Inotify:
    """Watches a directory tree (and single files) for writes, creations and touches."""

    def __init__(self) -> None:
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd
        #: watch descriptor -> (key prefix for a directory, or the key of a watched file)
        self._watches: dict[int, tuple[str, bool]] = {}
        #: The watch on the parent of a progress dir that does not exist yet.
        self._parent_wd: int | None = None
        self.overflowed = False
        self.full = False
        #: New directories seen by :meth:`read`, to watch with :meth:`watch_pending`.
        self.pending: list[tuple[Path, str]] = []
        self._lock = threading.Lock()
        self._adding = 0
        self._closing = False
        #: (device, inode) of directories never watched (the queue's ``attempts/``).
        self.skip: frozenset[tuple[int, int]] = frozenset()

    def close(self) -> None:
        """Close now, or as soon as the watch being added in a thread is in place."""
        with self._lock:
            self._closing = True
            if self._adding:
                return
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def _add(self, path: str, key: str, is_dir: bool) -> int | None:
        with self._lock:
            if self._closing:
                return None
            if len(self._watches) >= MAX_WATCHES:
                self.full = True
                return None
            self._adding += 1
        flags = _MASK | IN_DONT_FOLLOW | (IN_ONLYDIR if is_dir else 0)
        try:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), flags)
            errno = ctypes.get_errno()
        finally:
            with self._lock:
                self._adding -= 1
                close_now = self._closing and not self._adding and self.fd >= 0
                if close_now:
                    fd, self.fd = self.fd, -1
            if close_now:
                os.close(fd)
        if wd < 0:
            if errno == 28:  # ENOSPC: the user's watch limit
                self.full = True
            return None
        with self._lock:
            self._watches[wd] = (key, is_dir)
        return int(wd)

    def watch_for_creation(self, root: Path) -> None:
        """Watch the parent of a progress dir the trainer has not created yet."""
        self._parent_wd = self._add(str(root.parent), "", is_dir=True)

    def watch_file(self, path: Path) -> bool:
        """Watch one file; its events are reported under ``str(path)``.  False when it
        cannot be watched (missing, the watch limit reached)."""
        return self._add(str(path), str(path), is_dir=False) is not None

    def watch_tree(self, root: Path, prefix: str = "") -> list[str]:
        """Watch ``root`` and its subdirectories (symlinks not followed); the keys of the files
        found below, which may have been written before their watch was in place."""
        found: list[str] = []
        stack = [(str(root), prefix)]
        while stack and not self.full and not self._closing:
            directory, rel = stack.pop()
            if self._add(directory, rel, is_dir=True) is None:
                continue
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not self._skipped(entry):
                            stack.append((entry.path, f"{rel}{entry.name}/"))
                    else:
                        found.append(f"{rel}{entry.name}")
                except OSError:
                    continue
        return found

    def watch_pending(self) -> list[str]:
        """Watch the directories :meth:`read` saw created; the keys of the files inside."""
        found: list[str] = []
        while self.pending:
            found.extend(self.watch_tree(*self.pending.pop()))
        return found

    def _skipped(self, entry: os.DirEntry[str]) -> bool:
        if not self.skip or all(entry.inode() != ino for _dev, ino in self.skip):
            return False
        st = entry.stat(follow_symlinks=False)
        return (st.st_dev, st.st_ino) in self.skip

    def read(self, root: Path) -> set[str]:
        """Keys of the files touched since the last read; new directories are queued in
        :attr:`pending`, to be watched by :meth:`watch_pending` in a thread."""
        touched: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return touched
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset : offset + length].rstrip(b"\0").decode(errors="surrogateescape")
                offset += length
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                    continue
                if wd == self._parent_wd:
                    if mask & IN_ISDIR and name == root.name:
                        self.pending.append((root, ""))
                    continue
                with self._lock:
                    watch = self._watches.get(wd)
                if watch is None:
                    continue
                key, is_dir = watch
                if not is_dir:
                    touched.add(key)
                elif mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        self.pending.append((root / f"{key}{name}", f"{key}{name}/"))
                else:
                    touched.add(f"{key}{name}")
