"""Reading training steps and metrics from what trainers already write.

Sources, found below the progress directory by the watchdog's scan (see :class:`StepReader`),
in order of precedence (the highest that has given a step is *the* step source):

1. the file :func:`asyncsoak.trainer.report` appends to (``ASYNCSOAK_STEPS_FILE``);
2. JSON Lines files (``*.jsonl``, ``*.ndjson``) whose records carry a step key;
3. PyTorch Lightning's CSV logger (``metrics.csv``);
4. Hugging Face Trainer's ``trainer_state.json`` (and its copies in ``checkpoint-N/``).

``max_steps`` is taken from whichever source gives it (``trainer_state.json``'s, or a
record's ``max_steps``/``total_steps``).  Every read is incremental and bounded: a growing
file is read from where the last read stopped, at most :data:`MAX_READ_BYTES` a file a scan
(a backlog larger than that is skipped to its newest part, and noted), a partial last line
waits for its newline, a line longer than :data:`MAX_LINE_BYTES` is skipped, a file replaced
(another inode) or truncated is read again from its start.  ``NaN`` and ``Infinity``, as
Python's ``json`` writes them, are read as such.

Everything here runs in the watchdog's scan thread (one scan at a time), never on the loop.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Keys that carry the step, in the order they are looked for.
STEP_KEYS = ("step", "global_step", "iteration", "iter", "trainer/global_step")
#: Keys that carry the training loss, in the order they are looked for.
LOSS_KEYS = ("loss", "train_loss", "train/loss")
#: Cumulative counts of tokens and samples (their rate is computed) ...
TOKEN_KEYS = ("tokens", "num_tokens", "tokens_seen", "num_input_tokens_seen")
SAMPLE_KEYS = ("samples", "num_samples", "samples_seen")
#: ... or rates logged as such (taken as they are).
TOKEN_RATE_KEYS = ("tokens_per_second", "train_tokens_per_second")
SAMPLE_RATE_KEYS = ("samples_per_second", "train_samples_per_second")
#: The key of the epoch: a step that restarts when it advances is counted within each epoch.
EPOCH_KEY = "epoch"
#: Keys that carry the total number of steps.
MAX_STEP_KEYS = ("max_steps", "total_steps")

#: The most bytes read from one file in one scan.
MAX_READ_BYTES = 1024 * 1024
#: A line longer than this is skipped (and counted), never held.
MAX_LINE_BYTES = 64 * 1024
#: A file present before the start is read from its last this many bytes (its newest steps).
TAIL_START_BYTES = 64 * 1024
#: ``trainer_state.json`` larger than this is not read (noted once).
MAX_STATE_BYTES = 32 * 1024 * 1024
#: At most this many files are followed at once (the newest found first).
MAX_SOURCES = 16

#: Source kinds, in order of precedence (lower first).
KIND_REPORT, KIND_JSONL, KIND_CSV, KIND_STATE = 0, 1, 2, 3
KIND_NAMES = {
    KIND_REPORT: "asyncsoak.trainer.report",
    KIND_JSONL: "json_lines",
    KIND_CSV: "lightning_csv",
    KIND_STATE: "trainer_state",
}


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One record that carries a step: from a line, a CSV row, a ``log_history`` entry."""

    step: int
    source: str
    kind: int
    loss: float | None = None
    #: Where in its source (``line 31``, ``log_history[4]``).
    where: str = ""
    tokens: float | None = None
    samples: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    max_steps: int | None = None
    epoch: float | None = None
    #: Written before the soak started (an earlier run's, in a file it left): it tells where
    #: the run resumes from, but is neither this run's progress nor its loss.
    before_start: bool = False


@dataclass(slots=True)
class StepReading:
    """What one read found: records in the order written, and what was odd."""

    records: list[StepRecord] = field(default_factory=list)
    #: Lines (rows) read per source, records or not: "metrics.jsonl grew 300 lines".
    lines: dict[str, int] = field(default_factory=dict)
    #: Things worth a note (garbage, a skipped backlog, a file replaced); each said once.
    notes: list[str] = field(default_factory=list)
    #: ``max_steps`` as the newest source that gives it says.
    max_steps: int | None = None
    #: Sources whose records carry numbers but no step key (with the keys seen).
    without_step: dict[str, list[str]] = field(default_factory=dict)


def number(value: object) -> float | None:
    """A JSON or CSV value as a float (NaN and infinities kept), None when not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 64:
            return None
        try:
            return float(text)
        except ValueError:
            return None
    return None


def as_step(value: object) -> int | None:
    """A step: a whole, finite, non-negative number (``5`` or ``5.0``)."""
    figure = number(value)
    if figure is None or not math.isfinite(figure) or figure < 0 or figure != int(figure):
        return None
    return int(figure)


class KeyChoice:
    """Which keys carry the step and the loss: ``--step-key``/``--loss-key``, or the known ones."""

    def __init__(self, step_key: str | None = None, loss_key: str | None = None) -> None:
        self.step_keys = (step_key,) if step_key else STEP_KEYS
        self.loss_keys = (loss_key,) if loss_key else LOSS_KEYS

    def record(
        self,
        data: Mapping[str, Any],
        source: str,
        kind: int,
        where: str,
        *,
        before_start: bool = False,
    ) -> StepRecord | None:
        step = _first(data, self.step_keys, as_step)
        if step is None:
            return None
        return StepRecord(
            step=step,
            source=source,
            kind=kind,
            loss=_first(data, self.loss_keys, number),
            where=where,
            tokens=_first(data, TOKEN_KEYS, number),
            samples=_first(data, SAMPLE_KEYS, number),
            tokens_per_second=_first(data, TOKEN_RATE_KEYS, number),
            samples_per_second=_first(data, SAMPLE_RATE_KEYS, number),
            max_steps=_first(data, MAX_STEP_KEYS, as_step),
            epoch=_first(data, (EPOCH_KEY,), number),
            before_start=before_start,
        )


def _first(data: Mapping[str, Any], keys: Sequence[str], convert: Any) -> Any:
    for key in keys:
        if key in data:
            value = convert(data[key])
            if value is not None:
                return value
    return None


class _Tail:
    """A file read line by line as it grows: offset, inode, the partial last line."""

    def __init__(self, path: Path, name: str, *, from_start: bool, start_size: int = 0) -> None:
        self.path = path
        self.name = name
        self.ino: int | None = None
        self.offset = 0
        self.line_no = 0
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self._from_start = from_start
        #: The file's size when the soak started: lines ending within it were written before.
        self._start_size = 0 if from_start else start_size
        self.garbage = 0
        self.huge = 0

    def read(self, notes: list[str]) -> list[tuple[int, bytes, bool]]:
        """The complete lines written since the last read, numbered (bounded), each with
        whether it was written before the soak started."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            st = os.fstat(fd)
            if self.ino is None:
                self.ino = st.st_ino
                if not self._from_start and st.st_size > TAIL_START_BYTES:
                    self._restart(st.st_size - TAIL_START_BYTES, mid_line=True)
            elif st.st_ino != self.ino:
                notes.append(f"{self.name} was replaced: read again from its start")
                self.ino = st.st_ino
                self._start_size = 0
                self._restart(0)
            elif st.st_size < self.offset:
                notes.append(f"{self.name} was truncated: read again from its start")
                self._start_size = 0
                self._restart(0)
            pending = st.st_size - self.offset
            if pending <= 0:
                return []
            if pending > MAX_READ_BYTES:
                skip_to = st.st_size - MAX_READ_BYTES
                notes.append(
                    f"{self.name}: {skip_to - self.offset} bytes written faster than read "
                    "were skipped (their steps are not seen)"
                )
                self._restart(skip_to, mid_line=True)
            data = os.pread(fd, min(st.st_size - self.offset, MAX_READ_BYTES), self.offset)
        finally:
            os.close(fd)
        start = self.offset
        self.offset += len(data)
        return self._lines(data, start)

    def _restart(self, offset: int, *, mid_line: bool = False) -> None:
        self.offset = offset
        self._partial = b""
        # Mid-line: the bytes up to the next newline are the end of a line not read whole.
        self._skipping = mid_line
        if offset == 0:
            self.line_no = 0

    def _lines(self, data: bytes, offset: int) -> list[tuple[int, bytes, bool]]:
        out: list[tuple[int, bytes, bool]] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            piece = data[start:end]
            start = end + 1
            if self._skipping:
                self._skipping = False
                self._partial = b""
                continue
            line = self._partial + piece
            self._partial = b""
            self.line_no += 1
            if len(line) > MAX_LINE_BYTES:
                self.huge += 1
                continue
            out.append((self.line_no, line, offset + end < self._start_size))
        rest = data[start:]
        if not self._skipping:
            if len(self._partial) + len(rest) > MAX_LINE_BYTES:
                self.huge += 1
                self.line_no += 1
                self._partial = b""
                self._skipping = True
            else:
                self._partial += rest
        return out


class JsonLinesSource:
    """A JSON Lines metrics file (or the report file)."""

    def __init__(
        self, path: Path, name: str, kind: int, *, from_start: bool, start_size: int = 0
    ) -> None:
        self.name = name
        self.kind = kind
        self._tail = _Tail(path, name, from_start=from_start, start_size=start_size)
        self._noted_garbage = False

    def read(self, keys: KeyChoice, reading: StepReading) -> None:
        lines = self._tail.read(reading.notes)
        if not lines:
            return
        reading.lines[self.name] = reading.lines.get(self.name, 0) + len(lines)
        for line_no, line, before_start in lines:
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                data = None
            if not isinstance(data, dict):
                if line.strip():
                    self._tail.garbage += 1
                    if not self._noted_garbage:
                        self._noted_garbage = True
                        reading.notes.append(
                            f"{self.name} line {line_no} is not a JSON object: skipped "
                            "(later ones too, counted)"
                        )
                continue
            record = keys.record(
                data, self.name, self.kind, f"line {line_no}", before_start=before_start
            )
            if record is None:
                if any(number(v) is not None for v in data.values()):
                    reading.without_step[self.name] = sorted(str(k) for k in data)[:20]
                continue
            reading.records.append(record)
        self._note_huge(reading)

    def _note_huge(self, reading: StepReading) -> None:
        if self._tail.huge:
            reading.notes.append(
                f"{self.name}: {self._tail.huge} line(s) longer than {MAX_LINE_BYTES} bytes skipped"
            )
            self._tail.huge = 0

    @property
    def garbage(self) -> int:
        return self._tail.garbage


class CsvSource:
    """Lightning's ``metrics.csv``: a header, then one row per logging call (empty cells
    for metrics not logged at that step).  A rewritten file (new columns) is read again."""

    def __init__(self, path: Path, name: str, *, from_start: bool, start_size: int = 0) -> None:
        self.name = name
        self.kind = KIND_CSV
        self._path = path
        self._tail = _Tail(path, name, from_start=from_start, start_size=start_size)
        self._columns: list[str] | None = None
        self.garbage = 0

    def read(self, keys: KeyChoice, reading: StepReading) -> None:
        header = _first_line(self._path)
        if header is None:
            return
        columns = _split_csv(header)
        if self._columns is not None and columns != self._columns:
            # Lightning rewrites the whole file when a new metric appears.
            self._tail = _Tail(self._path, self.name, from_start=True)
        self._columns = columns
        lines = self._tail.read(reading.notes)
        # The header is read on its own: among the lines, it is the one that matches it.
        rows = [(n, line, before) for n, line, before in lines if _split_csv(line) != columns]
        if not rows:
            return
        reading.lines[self.name] = reading.lines.get(self.name, 0) + len(rows)
        for line_no, line, before_start in rows:
            cells = _split_csv(line)
            if len(cells) != len(columns):
                self.garbage += 1
                continue
            data = dict(zip(columns, cells, strict=True))
            record = keys.record(
                data, self.name, self.kind, f"line {line_no}", before_start=before_start
            )
            if record is not None:
                reading.records.append(record)
            elif any(number(v) is not None for v in data.values()):
                reading.without_step[self.name] = columns[:20]


def _first_line(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(MAX_LINE_BYTES)
    except OSError:
        return None
    end = head.find(b"\n")
    if end < 0:
        return None
    return head[:end].decode("utf-8", "replace").rstrip("\r")


def _split_csv(line: bytes | str) -> list[str]:
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    # Lightning writes plain numbers and metric names: no quoting to undo.
    return [cell.strip().strip('"') for cell in text.rstrip("\r").split(",")]


class TrainerStateSource:
    """A ``trainer_state.json``, read whole (bounded) each time it changes."""

    def __init__(self, path: Path, name: str, *, before_start: bool = False) -> None:
        self.name = name
        self.kind = KIND_STATE
        #: Present at the start: what its first read finds is an earlier run's.
        self._before_start = before_start
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        #: ``log_history`` entries already read (a rewritten file holds them again).
        self._history_read = 0
        self._noted = False
        self.global_step: int | None = None
        self.garbage = 0

    def read(self, keys: KeyChoice, reading: StepReading) -> None:
        data = self._load(reading)
        if data is None:
            return
        before_start, self._before_start = self._before_start, False
        if not isinstance(data, dict):
            return
        global_step = as_step(data.get("global_step"))
        max_steps = as_step(data.get("max_steps"))
        if max_steps:
            reading.max_steps = max_steps
        history = data.get("log_history")
        if isinstance(history, list):
            self._read_history(history, keys, reading, before_start)
        if global_step is not None:
            self.global_step = global_step
            reading.records.append(
                StepRecord(
                    step=global_step,
                    source=self.name,
                    kind=self.kind,
                    where="global_step",
                    max_steps=max_steps or None,
                    before_start=before_start,
                )
            )

    def _load(self, reading: StepReading) -> object | None:
        """The file's JSON if it changed since it was last read whole (bounded); None if it
        did not, is too large (noted once), cannot be read, or is being written."""
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return None
        if st.st_size > MAX_STATE_BYTES:
            if not self._noted:
                self._noted = True
                reading.notes.append(
                    f"{self.name} is larger than {MAX_STATE_BYTES} bytes: not read"
                )
            self._seen = seen
            return None
        try:
            with open(self._path, "rb") as handle:
                data: object = json.loads(handle.read(MAX_STATE_BYTES))
        except OSError:
            return None
        except (ValueError, RecursionError):
            # Being written: read again when it changes.
            self.garbage += 1
            return None
        self._seen = seen
        return data

    def _read_history(
        self, history: list[Any], keys: KeyChoice, reading: StepReading, before_start: bool
    ) -> None:
        """The ``log_history`` entries not read before (all of them if the file was rewritten
        shorter): a record for each step's entry."""
        new = history[self._history_read :] if len(history) >= self._history_read else history
        start = self._history_read if len(history) >= self._history_read else 0
        for index, entry in enumerate(new, start):
            # The end-of-training entry holds the run's mean loss (train_loss) and its
            # runtime: a summary, not a step's loss.
            if isinstance(entry, dict) and "train_runtime" not in entry:
                record = keys.record(
                    entry, self.name, self.kind, f"log_history[{index}]", before_start=before_start
                )
                if record is not None:
                    reading.records.append(record)
        reading.lines[self.name] = reading.lines.get(self.name, 0) + len(new)
        self._history_read = len(history)


Source = JsonLinesSource | CsvSource | TrainerStateSource


def source_kind(name: str) -> int | None:
    """Which kind of step source a file is, by its name; None for none."""
    base = name.rsplit("/", 1)[-1]
    if base == "trainer_state.json":
        return KIND_STATE
    if base == "metrics.csv":
        return KIND_CSV
    if base.endswith((".jsonl", ".ndjson")):
        return KIND_JSONL
    return None


class StepReader:
    """The step sources below a progress directory, read at each scan.

    ``read(files, ...)`` takes the scan's files (relative path -> state with ``ino``), starts
    following the new step sources among them (at most :data:`MAX_SOURCES`), and reads what
    each wrote since the last read.  ``baseline`` gives the files present at the start, with
    their sizes: those are read from their newest part, not from the start of an earlier run's
    history, and what they held then is marked :attr:`StepRecord.before_start`.
    """

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
            self._report = JsonLinesSource(
                report_file, report_file.name, KIND_REPORT, from_start=True
            )
            try:
                st = os.stat(report_file)
                self._report_key = (st.st_dev, st.st_ino)
            except OSError:
                pass
        self._ignored: set[str] = set()
        #: Every name of the tree looked at once (a 100,000-file tree is not sorted per scan).
        self._examined: set[str] = set()
        #: (inode, size, mtime) of each source as the scan last saw it, when read.
        self._read_at: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def read(
        self, files: Mapping[str, Any], *, wait: float = -1, whole_tree: bool = True
    ) -> StepReading | None:
        """Read every step source once; None when another read holds the reader (a hung
        one) for longer than ``wait`` seconds (forever when negative).  ``files`` is a full
        scan's, or (``whole_tree=False``) the few files inotify told of."""
        if not self._lock.acquire(timeout=wait):
            return None
        try:
            return self._read(files, whole_tree)
        finally:
            self._lock.release()

    def _read(self, files: Mapping[str, Any], whole_tree: bool) -> StepReading:
        reading = StepReading()
        self._discover(files, reading, whole_tree)
        if self._report is not None:
            self._report.read(self.keys, reading)
        for name, source in self._sources.items():
            state = files.get(name)
            seen = None if state is None else (state.ino, state.size, state.mtime_ns)
            if seen is not None and seen == self._read_at.get(name):
                continue  # unchanged since its last read: not even opened
            source.read(self.keys, reading)
            if seen is not None:
                self._read_at[name] = seen
        return reading

    def _discover(self, files: Mapping[str, Any], reading: StepReading, whole_tree: bool) -> None:
        new = files.keys() - self._examined
        self._examined |= new
        if whole_tree and len(self._examined) > 2 * len(files) + 1000:
            self._examined &= files.keys()  # names long gone (checkpoints rotated away)
        candidates = [n for n in new if source_kind(n) is not None and not n.startswith("/")]
        for name in sorted(candidates, key=lambda n: -int(getattr(files[n], "mtime_ns", 0))):
            if name in self._sources or name in self._ignored:
                continue
            kind = source_kind(name)
            assert kind is not None
            state = files[name]
            key = (getattr(state, "dev", None), getattr(state, "ino", None))
            if key == self._report_key:
                self._ignored.add(name)
                continue
            if len(self._sources) >= MAX_SOURCES:
                self._ignored.add(name)
                reading.notes.append(
                    f"more than {MAX_SOURCES} step sources below {self.root}: {name} not read"
                )
                continue
            path = self.root / name
            from_start = name not in self._baseline
            start_size = self._baseline.get(name, 0)
            if kind == KIND_STATE:
                self._sources[name] = TrainerStateSource(path, name, before_start=not from_start)
            elif kind == KIND_CSV:
                self._sources[name] = CsvSource(
                    path, name, from_start=from_start, start_size=start_size
                )
            else:
                self._sources[name] = JsonLinesSource(
                    path, name, kind, from_start=from_start, start_size=start_size
                )

    def garbage(self) -> dict[str, int]:
        """Lines (or rows) skipped as unreadable, per source."""
        sources: list[Source] = list(self._sources.values())
        if self._report is not None:
            sources.append(self._report)
        return {s.name: s.garbage for s in sources if s.garbage}
