"""The step files trainers write, each read incrementally and bounded.  Kinds, by precedence:
``asyncsoak.trainer.report``'s file, JSON Lines, ``metrics.csv``, ``trainer_state.json``."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .._contract import STEP_TIME_FIELDS, trainer_seconds

#: Keys that carry the step, and the loss, in the order they are looked for; else a key
#: ending in one of LOSS_SUFFIXES (Lightning's ``train_loss_step``) carries the loss.
STEP_KEYS = ("step", "global_step", "iteration", "iter", "trainer/global_step")
LOSS_KEYS = ("loss", "train_loss", "train/loss")
LOSS_SUFFIXES = ("loss_step", "_loss_epoch")

#: The most bytes read from one file in one scan.
MAX_READ_BYTES = 1024 * 1024
#: A line longer than this is skipped (and counted), never held.
MAX_LINE_BYTES = 64 * 1024
#: A file present before the start is read from its last this many bytes (its newest steps).
TAIL_START_BYTES = 64 * 1024
#: ``trainer_state.json`` larger than this is not read (noted once).
MAX_STATE_BYTES = 32 * 1024 * 1024
#: A bare non-finite token as a value (``nan``, ``-inf``, ``Infinity``), for ``json`` to read.
BARE_NONFINITE = re.compile(r"([:\[,]\s*)([-+]?)(nan|inf(?:inity)?)(?=\s*[,}\]])", re.IGNORECASE)

#: Source kinds, in order of precedence (lower first).
KIND_REPORT, KIND_JSONL, KIND_CSV, KIND_STATE = 0, 1, 2, 3
KIND_NAMES = ("asyncsoak.trainer.report", "json_lines", "lightning_csv", "trainer_state")

Lines = list[tuple[int, bytes, bool]]


class StepRecord(NamedTuple):
    """One record that carries a step: from a line, a CSV row, a ``log_history`` entry."""

    step: int
    source: str
    kind: int
    loss: float | None = None
    where: str = ""  # ``line 31``, ``log_history[4]``
    tokens: float | None = None
    samples: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    max_steps: int | None = None
    epoch: float | None = None
    grad_norm: float | None = None
    #: An earlier run's (written before the soak started): where the run resumes from only.
    before_start: bool = False
    trainer_time: float | None = None


@dataclass(slots=True)
class StepReading:
    """What one read found: records in the order written, and what was odd."""

    records: list[StepRecord] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    max_steps: int | None = None
    #: Sources whose records carry numbers but no step key (with the keys seen).
    without_step: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Sources no longer followed (their file gone, or a higher checkpoint's read instead).
    gone: list[str] = field(default_factory=list)


def number(value: object) -> float | None:
    """A JSON or CSV value as a float (NaN and infinities kept), None when not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or len(value.strip()) > 64:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def as_step(value: object) -> int | None:
    """A step: a whole, finite, non-negative number (``5`` or ``5.0``)."""
    figure = number(value)
    if figure is None or not math.isfinite(figure) or figure < 0 or figure != int(figure):
        return None
    return int(figure)


#: The figures a record carries besides its step and loss: the keys of each (the first
#: found), and how a value is read.
_FIGURES: tuple[tuple[str, Sequence[str], Callable[[object], Any]], ...] = (
    ("tokens", ("tokens", "num_tokens", "tokens_seen", "num_input_tokens_seen"), number),
    ("samples", ("samples", "num_samples", "samples_seen"), number),
    ("tokens_per_second", ("tokens_per_second", "train_tokens_per_second"), number),
    ("samples_per_second", ("samples_per_second", "train_samples_per_second"), number),
    ("max_steps", ("max_steps", "total_steps"), as_step),
    # A step that restarts when the epoch advances is counted within each epoch.
    ("epoch", ("epoch",), number),
    ("grad_norm", ("grad_norm", "train/grad_norm"), number),
    ("trainer_time", STEP_TIME_FIELDS, trainer_seconds),
)


class KeyChoice:
    """Which keys carry the step and the loss: ``--step-key``/``--loss-key``, or the known ones."""

    def __init__(self, step_key: str | None = None, loss_key: str | None = None) -> None:
        self.step_keys = (step_key,) if step_key else STEP_KEYS
        self.loss_keys = (loss_key,) if loss_key else LOSS_KEYS
        self._suffixes = () if loss_key else LOSS_SUFFIXES

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
        loss = _first(data, self.loss_keys, number)
        for suffix in self._suffixes if loss is None else ():
            loss = _first(data, [k for k in data if str(k).endswith(suffix)], number)
            if loss is not None:
                break
        figures = {name: _first(data, keys, read) for name, keys, read in _FIGURES}
        return StepRecord(step, source, kind, loss, where, before_start=before_start, **figures)


def _first(data: Mapping[str, Any], keys: Sequence[str], convert: Any) -> Any:
    for key in keys:
        if key in data:
            value = convert(data[key])
            if value is not None:
                return value
    return None


class JsonLinesSource:
    """A JSON Lines metrics file (or the report file), read as it grows; lines within
    ``start_size`` (its size at the start) were written before the soak started."""

    def __init__(self, path: Path, name: str, kind: int, start_size: int | None = None) -> None:
        self.name = name
        self.kind = kind
        self._path = path
        self._high: int | None = None
        self.garbage = 0  # lines (rows) skipped as unreadable
        self._begin(start_size)

    def _begin(self, start_size: int | None) -> None:
        self._ino: int | None = None
        self._offset = 0
        self._line_no = 0
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self._from_start = start_size is None
        self._start_size = start_size or 0
        self._huge = 0
        #: Read again from its start, and no line read since: the lines may be a replay.
        self._restarted = False
        self._noted: set[str] = set()

    def read(self, keys: KeyChoice, reading: StepReading) -> None:
        lines = self._new_lines(reading)
        if not lines:
            return
        reading.lines[self.name] = reading.lines.get(self.name, 0) + len(lines)
        records: list[StepRecord] = []
        for line_no, line, before_start in lines:
            data = self._parse(line, line_no, reading)
            if data is None:
                continue
            where = f"line {line_no}"
            record = keys.record(data, self.name, self.kind, where, before_start=before_start)
            if record is not None:
                records.append(record)
            elif any(number(v) is not None for v in data.values()):
                named = [str(k) for k in data]  # a CSV's in its header's order
                reading.without_step[self.name] = (
                    named if self.kind == KIND_CSV else sorted(named)
                )[:20]
        reading.records += self._fresh(records)
        if self._huge and self.kind != KIND_CSV:  # a CSV's long rows: counted, no note
            reading.notes.append(
                f"{self.name}: {self._huge} line(s) longer than {MAX_LINE_BYTES} bytes skipped"
            )
        self._huge = 0

    def _tail(self, notes: list[str]) -> Lines:
        """The complete lines written since the last read (bounded): (number, line, before
        the start)."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            st = os.fstat(fd)
            if self._ino is None:
                self._ino = st.st_ino
                if not self._from_start and st.st_size > TAIL_START_BYTES:
                    self._restart(st.st_size - TAIL_START_BYTES, mid_line=True)
            elif st.st_ino != self._ino or st.st_size < self._offset:
                how = "replaced" if st.st_ino != self._ino else "truncated"
                if how not in self._noted:
                    self._noted.add(how)
                    notes.append(
                        f"{self.name} was {how}: read again from its start, past the steps "
                        "already read (said once)"
                    )
                self._ino = st.st_ino
                self._start_size = 0
                self._restart(0)
                self._restarted = True
            if st.st_size - self._offset > MAX_READ_BYTES:
                skip_to = st.st_size - MAX_READ_BYTES
                notes.append(
                    f"{self.name}: {skip_to - self._offset} bytes written faster than read "
                    "were skipped (their steps are not seen)"
                )
                self._restart(skip_to, mid_line=True)
            if st.st_size <= self._offset:
                return []
            data = os.pread(fd, st.st_size - self._offset, self._offset)
        finally:
            os.close(fd)
        start = self._offset
        self._offset += len(data)
        return self._lines(data, start)

    def _restart(self, offset: int, *, mid_line: bool = False) -> None:
        self._offset = offset
        self._partial = b""
        # Mid-line: the bytes up to the next newline are the end of a line not read whole.
        self._skipping = mid_line
        if offset == 0:
            self._line_no = 0

    def _lines(self, data: bytes, offset: int) -> Lines:
        out: Lines = []
        *pieces, rest = data.split(b"\n")
        end = offset - 1  # where each piece's newline is in the file
        for piece in pieces:
            end += len(piece) + 1
            line, self._partial = self._partial + piece, b""
            if self._skipping:
                self._skipping = False
                continue
            self._line_no += 1
            if len(line) > MAX_LINE_BYTES:
                self._huge += 1
            else:
                out.append((self._line_no, line, end < self._start_size))
        if not self._skipping:
            if len(self._partial) + len(rest) > MAX_LINE_BYTES:
                self._huge += 1
                self._line_no += 1
                self._partial = b""
                self._skipping = True
            else:
                self._partial += rest
        return out

    def _fresh(self, records: list[StepRecord]) -> list[StepRecord]:
        """A file read again from its start gives only its records past its highest step,
        unless all are below it (a resume)."""
        restarted, self._restarted = self._restarted, False
        if not records:
            return records
        newest = max(r.step for r in records)
        if restarted and self._high is not None:
            if newest >= self._high:
                records = [r for r in records if r.step > self._high]
            else:
                self._high = None
        self._high = newest if self._high is None else max(self._high, newest)
        return records

    def _new_lines(self, reading: StepReading) -> Lines:
        return self._tail(reading.notes)

    def _parse(self, line: bytes, line_no: int, reading: StepReading) -> dict[str, Any] | None:
        data = _json_object(line)
        if data is None and line.strip():
            self.garbage += 1
            if self.garbage == 1:
                reading.notes.append(
                    f"{self.name} line {line_no} is not a JSON object: skipped "
                    "(later ones too, counted)"
                )
        return data


def _json_object(line: bytes) -> dict[str, Any] | None:
    """A line's JSON object, bare ``nan``/``inf`` tokens (an f-string's) read; else None."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        try:
            text, found = BARE_NONFINITE.subn(_spelled, line.decode())
            data = json.loads(text) if found else None
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            data = None
    return data if isinstance(data, dict) else None


def _spelled(match: re.Match[str]) -> str:
    before, sign, token = match.groups()
    return before + ("NaN" if token.lower() == "nan" else sign.lstrip("+") + "Infinity")


class CsvSource(JsonLinesSource):
    """Lightning's ``metrics.csv``: a header, then a row per logging call; a rewritten file
    (new columns) is read again."""

    def __init__(self, path: Path, name: str, start_size: int | None = None) -> None:
        super().__init__(path, name, KIND_CSV, start_size)
        self._columns: list[str] = []

    def _new_lines(self, reading: StepReading) -> Lines:
        try:
            with open(self._path, "rb") as handle:
                head = handle.read(MAX_LINE_BYTES)
        except OSError:
            return []
        if b"\n" not in head:
            return []
        columns = _split_csv(head.split(b"\n", 1)[0])
        if self._columns and columns != self._columns:
            # Lightning rewrites the whole file when a new metric appears.
            self._begin(None)
            self._restarted = True
        self._columns = columns
        # The header is read on its own: among the lines, it is the one that matches it.
        lines = self._tail(reading.notes)
        return [(n, line, before) for n, line, before in lines if _split_csv(line) != columns]

    def _parse(self, line: bytes, line_no: int, reading: StepReading) -> dict[str, Any] | None:
        cells = _split_csv(line)
        if len(cells) != len(self._columns):
            self.garbage += 1
            return None
        return dict(zip(self._columns, cells, strict=True))


def _split_csv(line: bytes) -> list[str]:
    # Lightning writes plain numbers and metric names: no quoting to undo.
    text = line.decode("utf-8", "replace").rstrip("\r")
    return [cell.strip().strip('"') for cell in text.split(",")]


class TrainerStateSource:
    """A ``trainer_state.json``, read whole (bounded) each time it changes.  ``before_start``:
    its first read is an earlier run's."""

    def __init__(self, path: Path, name: str, *, before_start: bool = False) -> None:
        self.name = name
        self.kind = KIND_STATE
        self._before_start = before_start
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._history_read = 0
        self._noted = False
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
            # Entries not read before (all of them if the file was rewritten shorter).
            start = self._history_read if len(history) >= self._history_read else 0
            for index, entry in enumerate(history[start:], start):
                # The end-of-training entry holds the run's mean loss (train_loss) and its
                # runtime: a summary, not a step's loss.
                if isinstance(entry, dict) and "train_runtime" not in entry:
                    where = f"log_history[{index}]"
                    record = keys.record(
                        entry, self.name, KIND_STATE, where, before_start=before_start
                    )
                    if record is not None:
                        reading.records.append(record)
            reading.lines[self.name] = reading.lines.get(self.name, 0) + len(history) - start
            self._history_read = len(history)
        if global_step is not None:
            reading.records.append(
                StepRecord(
                    global_step,
                    self.name,
                    KIND_STATE,
                    where="global_step",
                    max_steps=max_steps or None,
                    before_start=before_start,
                )
            )

    def _load(self, reading: StepReading) -> object | None:
        """The file's JSON if it changed since read whole; None if not, too large, unreadable,
        or being written."""
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


Source = JsonLinesSource | CsvSource | TrainerStateSource


def source_kind(name: str) -> int | None:
    """Which kind of step source a file is, by its name; None for none."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith((".jsonl", ".ndjson")):
        return KIND_JSONL
    return {"trainer_state.json": KIND_STATE, "metrics.csv": KIND_CSV}.get(base)
