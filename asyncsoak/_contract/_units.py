"""Units as people write and read them: sizes (``512MiB``, ``2GiB``, ``1.5G``, ``1048576``)
and durations (``12.3s``, ``4m05s``, ``2h03m05s``)."""

from __future__ import annotations

import math
import re

from ._errors import ValidationError, ValidationTypeError

#: Binary multiples; the SI spellings (``G``, ``GB``) are taken as binary too, as ``free -h``,
#: ``ls -h`` and Slurm's ``--mem`` do: nobody budgets memory in powers of ten.
_MULTIPLES = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
#: The longest duration any limit or period takes: a year.  More is a typo (or ``1e308``,
#: which ``float()`` takes as readily as ``inf``) and would make every bounded wait unbounded.
MAX_SECONDS = 365 * 24 * 3600.0
#: The largest size any budget or floor takes: 1 EiB (a size fits a signed 64-bit integer
#: everywhere it goes: the queue's database, the metrics).
MAX_SIZE_BYTES = 2**60
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, *, name: str = "size") -> int:
    """Bytes from ``text`` (bytes, or a number and ``B``, ``K``/``KB``/``KiB`` ... ``P``, any
    case); a :class:`ValidationError` naming ``name`` when it is not a size."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValidationError(f"{name}: {text!r} is not a size (say 512MiB, 2GiB, 1.5G or bytes)")
    number, unit = match.groups()
    key = unit.lower()
    if key.endswith("ib"):
        key = key[:-2]
    elif len(key) == 2 and key.endswith("b"):
        key = key[:-1]
    if key not in _MULTIPLES:
        raise ValidationError(
            f"{name}: unknown unit {unit!r} in {text!r} (use B, KiB, MiB, GiB, TiB)"
        )
    value = float(number) * _MULTIPLES[key]
    if not math.isfinite(value) or value > MAX_SIZE_BYTES:
        raise ValidationError(f"{name}: {text!r} is too large (at most 1 EiB)")
    return round(value)


def check_size(name: str, value: object) -> int | None:
    """A size keyword argument: None, or a non-negative int of bytes (a size string is parsed)."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_size(value, name=name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationTypeError(f"{name} must be a number of bytes, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(f"{name} must be finite, got {value!r}")
    if value < 0:
        raise ValidationError(f"{name} must be zero or more, got {value!r}")
    if value > MAX_SIZE_BYTES:
        raise ValidationError(f"{name} must be at most 1 EiB (2**60 bytes), got {value!r}")
    return int(value)


def require_positive(name: str, value: float) -> None:
    """Refuse a period or timeout a caller passed that is not above zero (NaN included): a
    programming error, so a plain :class:`ValueError`."""
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def format_duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h03m05s``, ``1d02h03m``: short, unambiguous, and the same in
    every view, table and message."""
    if seconds < 60:
        return f"{max(0.0, seconds):.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 24:
        return f"{hours // 24}d{hours % 24:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"
