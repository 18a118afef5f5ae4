"""The progress tree as files: the scan of the whole tree (in a thread, never two at once)
and the stat of a few files, each file known by its device and inode."""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ._step_files import StepReading, source_kind
from ._steps import StepReader

FileKey = tuple[int, int]  # (st_dev, st_ino)


class FileState(NamedTuple):
    dev: int
    ino: int
    size: int
    mtime_ns: int


@dataclass(slots=True)
class ScanResult:
    files: dict[str, FileState]
    errors: int = 0
    steps: StepReading | None = None  # what the step sources wrote since the last scan
    missing: bool = False  # the progress directory was not there to scan


def path_matches(glob: str, path: str) -> bool:
    """Whether a part of ``path`` (relative to the progress dir) matches ``glob``:
    ``checkpoint-*`` matches ``checkpoint-60`` and ``run/checkpoint-60/model.safetensors``."""
    return any(fnmatch.fnmatchcase(part, glob) for part in path.split(os.sep))


def scan_progress_dir(
    root: Path, ignore: Collection[FileKey] = (), also: Collection[Path] = ()
) -> ScanResult:
    """Every regular file below ``root`` by relative path, plus the files in ``also``, less the
    (device, inode) keys in ``ignore``; a directory that cannot be listed counts in ``errors``."""
    result = ScanResult(files={})
    for path in also:
        try:
            st = path.stat()
        except OSError:
            continue
        result.files[str(path)] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if not root.is_dir():
        result.missing = True
        return result
    # Inodes come free with each directory entry: a directory is stat'ed only on a match.
    ignored_inodes = {ino for _dev, ino in ignore}
    stack = [(str(root), "")]
    while stack:
        directory, rel = stack.pop()
        try:
            entries = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone since its parent was listed (a rotated checkpoint): not unreadable
        except OSError:
            result.errors += 1
            continue
        with entries:
            while True:
                try:
                    entry = next(entries)
                except StopIteration:
                    break
                except OSError:
                    # Listing failed half-way (EACCES from /proc, EIO): skip the rest.
                    result.errors += 1
                    break
                name = f"{rel}{entry.name}"
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.inode() in ignored_inodes:
                            st = entry.stat(follow_symlinks=False)
                            if (st.st_dev, st.st_ino) in ignore:
                                continue
                        stack.append((entry.path, name + "/"))
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    # Vanished between listing and stat, or unreadable: not an error here.
                    continue
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in ignore:
                    continue
                result.files[name] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return result


class Scanner:
    """The watchdog's scan of the progress tree, and since when one runs: a hung scan is not
    joined by another, so a soak over a dead mount holds one thread, not one per interval."""

    def __init__(
        self,
        progress_dir: Path,
        ignore: Callable[[], Collection[FileKey]],
        also: Collection[Path],
        steps: StepReader | None = None,
        wait: float = -1,
    ) -> None:
        self.progress_dir = progress_dir
        self.ignore = ignore
        self.also = also
        self.steps = steps
        self.wait = wait  # for a read that holds the step reader (forever if < 0)
        self.running_since: float | None = None  # time.monotonic() at the running scan's start
        self.last_cost = 0.0  # the last scan's CPU time

    def __call__(self) -> ScanResult:
        self.running_since = time.monotonic()
        cpu = time.thread_time()
        try:
            result = scan_progress_dir(self.progress_dir, self.ignore(), self.also)
            if self.steps is not None:
                result.steps = self.steps.read(result.files, wait=self.wait)
            return result
        finally:
            self.last_cost = time.thread_time() - cpu
            self.running_since = None


def stat_keys(
    root: Path, keys: Collection[str], ignore: Collection[FileKey]
) -> dict[str, FileState | None]:
    """Fresh states of files named by scan keys (relative to ``root``, or absolute)."""
    out: dict[str, FileState | None] = {}
    for key in keys:
        try:
            st = os.stat(root / key, follow_symlinks=False)
        except OSError:
            out[key] = None
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in ignore:
            out[key] = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def stat_and_read(
    root: Path, keys: Collection[str], ignore: Collection[FileKey], steps: StepReader | None
) -> tuple[dict[str, FileState | None], StepReading | None]:
    """Fresh states of the files inotify told of, and what the step sources wrote when one
    of them is one (not waiting for a scan that holds the reader)."""
    updates = stat_keys(root, keys, ignore)
    if steps is None or not any(source_kind(key) is not None for key in keys):
        return updates, None
    present = {key: state for key, state in updates.items() if state is not None}
    gone = [key for key, state in updates.items() if state is None]
    return updates, steps.read(present, wait=0, whole_tree=False, gone=gone)
