"""The artifact's timestamps: ISO 8601 in UTC with milliseconds (``2026-11-29T19:50:04.120Z``).

One writer and one parser, so every reader (the views, the metrics exporter, the job view)
understands the same spellings: the ``Z`` the package writes and the offsets others write.
"""

from __future__ import annotations

from datetime import UTC, datetime


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
