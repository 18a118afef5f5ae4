"""The step sources below a progress directory, read at each scan: of
``checkpoint-N/trainer_state.json`` the highest N's, at most :data:`MAX_SOURCES` (the newest)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ._step_files import (
    KIND_CSV,
    KIND_REPORT,
    KIND_STATE,
    CsvSource,
    JsonLinesSource,
    KeyChoice,
    Source,
    StepReading,
    TrainerStateSource,
    source_kind,
)

#: At most this many files are followed at once (the newest, past it); an unchanged one costs
#: a dictionary look-up a scan, a changed one a read.
MAX_SOURCES = 256
#: ``checkpoint-N/trainer_state.json``: of one directory's checkpoints, the highest N is read.
CHECKPOINT_STATE = re.compile(r"(?:^|/)checkpoint-(\d+)/trainer_state\.json$")


class StepReader:
    """The step sources below a progress directory, read at each scan.  ``baseline``: the
    files present at the start and their sizes (what they held then is ``before_start``)."""

    def __init__(
        self,
        root: Path,
        *,
        keys: KeyChoice | None = None,
        report_file: Path | None = None,
        baseline: Mapping[str, int] | None = None,
    ) -> None:
        self.root = root
        self.keys = keys or KeyChoice()
        self._baseline = dict(baseline or {})
        self._sources: dict[str, Source] = {}
        self._report: JsonLinesSource | None = None
        self._report_key: tuple[int, int] | None = None
        if report_file is not None:
            self._report = JsonLinesSource(report_file, report_file.name, KIND_REPORT)
            try:
                st = os.stat(report_file)
                self._report_key = (st.st_dev, st.st_ino)
            except OSError:
                pass
        #: The step sources present: name -> (mtime when found, checkpoint directory, N).
        self._present: dict[str, tuple[int, str | None, int]] = {}
        self._warned_bound = False
        #: Every name of the tree looked at once (a 100,000-file tree is not sorted per scan).
        self._examined: set[str] = set()
        #: (inode, size, mtime) of each source when last read.
        self._read_at: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def read(
        self,
        files: Mapping[str, Any],
        *,
        wait: float = -1,
        whole_tree: bool = True,
        gone: Collection[str] = (),
    ) -> StepReading | None:
        """Read every step source once; None when another (hung) read holds the reader past
        ``wait`` seconds.  ``whole_tree=False``: ``files`` are those inotify told of, ``gone``
        those it found deleted."""
        if not self._lock.acquire(timeout=wait):
            return None
        try:
            return self._read(files, whole_tree, gone)
        finally:
            self._lock.release()

    def _read(
        self, files: Mapping[str, Any], whole_tree: bool, gone: Collection[str]
    ) -> StepReading:
        reading = StepReading()
        if self._discover(files, whole_tree, gone):
            self._choose(files, reading)
        if self._report is not None:
            self._report.read(self.keys, reading)
        for name, source in self._sources.items():
            state = files.get(name)
            if state is None and not whole_tree:
                continue  # inotify did not tell of it: unchanged
            seen = None if state is None else (state.ino, state.size, state.mtime_ns)
            if seen is not None and seen == self._read_at.get(name):
                continue  # unchanged since its last read: not even opened
            source.read(self.keys, reading)
            if seen is not None:
                self._read_at[name] = seen
        return reading

    def _discover(self, files: Mapping[str, Any], whole_tree: bool, gone: Collection[str]) -> bool:
        """Note the step sources that appeared and those gone; whether any did."""
        left = set(gone) & self._present.keys()
        if whole_tree:
            left |= self._present.keys() - files.keys()
        for name in left:
            del self._present[name]
            self._examined.discard(name)  # looked at again if it comes back
        new = files.keys() - self._examined
        self._examined |= new
        if whole_tree and len(self._examined) > 2 * len(files) + 1000:
            self._examined &= files.keys()  # names long gone (checkpoints rotated away)
        found = False
        for name in new:
            if source_kind(name) is None or name.startswith("/"):
                continue
            state = files[name]
            if (getattr(state, "dev", None), getattr(state, "ino", None)) == self._report_key:
                continue
            checkpoint = CHECKPOINT_STATE.search(name)
            self._present[name] = (
                int(getattr(state, "mtime_ns", 0)),
                None if checkpoint is None else name[: checkpoint.start()],
                -1 if checkpoint is None else int(checkpoint.group(1)),
            )
            found = True
        return found or bool(left)

    def _choose(self, files: Mapping[str, Any], reading: StepReading) -> None:
        """Follow every source present (of each directory's checkpoints, the highest); past
        :data:`MAX_SOURCES`, the newest (a warning, once)."""
        wanted: list[str] = []
        highest: dict[str, tuple[int, str]] = {}
        for name, (_, group, n) in self._present.items():
            if group is None:
                wanted.append(name)
            elif n > highest.get(group, (-1, ""))[0]:
                highest[group] = (n, name)
        wanted += [name for _, name in highest.values()]
        if len(wanted) > MAX_SOURCES:

            def mtime(name: str) -> int:
                return int(getattr(files.get(name), "mtime_ns", self._present[name][0]))

            wanted.sort(key=mtime, reverse=True)
            if not self._warned_bound:
                self._warned_bound = True
                reading.warnings.append(
                    f"more than {MAX_SOURCES} step sources below {self.root}: the "
                    f"{MAX_SOURCES} newest are read, not {', '.join(wanted[MAX_SOURCES:][:3])}"
                    f"{' ...' if len(wanted) > MAX_SOURCES + 3 else ''} (a NaN there is not seen)"
                )
            del wanted[MAX_SOURCES:]
        keep = set(wanted)
        for name in [n for n in self._sources if n not in keep]:
            del self._sources[name]
            self._read_at.pop(name, None)
            reading.gone.append(name)
        for name in wanted:
            if name not in self._sources:
                self._sources[name] = self._open(name)

    def _open(self, name: str) -> Source:
        kind = source_kind(name)
        path = self.root / name
        start_size = self._baseline.get(name)
        if kind == KIND_STATE:
            return TrainerStateSource(path, name, before_start=start_size is not None)
        if kind == KIND_CSV:
            return CsvSource(path, name, start_size)
        assert kind is not None
        return JsonLinesSource(path, name, kind, start_size)

    def garbage(self) -> dict[str, int]:
        """Lines (or rows) skipped as unreadable, per source."""
        sources: list[Source] = list(self._sources.values())
        if self._report is not None:
            sources.append(self._report)
        return {s.name: s.garbage for s in sources if s.garbage}
