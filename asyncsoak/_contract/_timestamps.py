"""The artifact's timestamps: ISO 8601 in UTC with milliseconds (``2026-11-29T19:50:04.120Z``);
one writer, and one parser for the ``Z`` the package writes and the offsets others write."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

#: The record fields that carry the trainer's own time of a step, first found wins.
STEP_TIME_FIELDS = ("time", "timestamp", "_timestamp", "wall_time")


def iso(dt: datetime) -> str:
    """``dt`` as the artifact writes times: UTC, milliseconds, a ``Z``."""
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """An ISO 8601 time (``Z``, an offset, or none for a naive time); else ``ValueError``."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_iso_or_none(text: object) -> datetime | None:
    """:func:`parse_iso` for a value read back from JSON: ``None`` for anything not a time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_iso(text)
    except ValueError:
        return None


def epoch(text: object) -> float | None:
    """Seconds since the epoch of an ISO 8601 time read back from JSON; ``None`` if not one."""
    moment = parse_iso_or_none(text)
    return None if moment is None else moment.timestamp()


#: A record's time below this (2001-09-09) is no epoch time; 100x above, it is ms (or finer).
EPOCH_SECONDS_MIN = 1e9


def trainer_seconds(value: Any) -> float | None:
    """A record's time field as seconds since the epoch (a number in seconds, milliseconds,
    microseconds or nanoseconds, or ISO 8601), else None (a duration is no time)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_iso(value.strip()).timestamp()
        except ValueError:
            return None
    else:
        return None
    if not math.isfinite(seconds) or seconds < EPOCH_SECONDS_MIN:
        return None
    while seconds >= 100 * EPOCH_SECONDS_MIN:  # ms, us or ns since the epoch
        seconds /= 1000
    return seconds
