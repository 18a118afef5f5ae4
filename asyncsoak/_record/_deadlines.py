"""The deadlines the training keeps (``--expect-every GLOB=SECONDS``): a GLOB's first match is
due SECONDS after the steps started, each next SECONDS after the last; one is missed once the
steps advanced past it (steps that stopped are a stall, ``stale_progress``'s to tell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .._contract import format_duration
from .._sampling import path_matches


class Deadline(NamedTuple):
    """One GLOB's next deadline: when it falls due, and its newest match (t, path), if any."""

    glob: str
    every: float
    due: float
    matched: tuple[float, str] | None


class Deadlines:
    """Each ``--expect-every`` GLOB's period and newest match, as the progress events said."""

    def __init__(self) -> None:
        self.every: dict[str, float] = {}
        self.look_seconds = 0.0
        self.matched: dict[str, tuple[float, str]] = {}

    def configure(self, config: Mapping[str, Any]) -> None:
        self.every = {str(g): float(s) for g, s in (config.get("expect_every") or {}).items()}
        interval = config.get("sample_interval_seconds")
        self.look_seconds = float(interval) if isinstance(interval, int | float) else 0.0

    def add_paths(self, t: float, paths: Sequence[str]) -> None:
        for glob in self.every:
            found = next((path for path in paths if path_matches(glob, path)), None)
            if found is not None:
                self.matched[glob] = (t, found)

    def pending(self, started: float | None) -> list[Deadline]:
        """The next deadline of each GLOB, the soonest first; none before the steps started."""
        if started is None:
            return []
        out = []
        for glob, every in self.every.items():
            matched = self.matched.get(glob)
            since = started if matched is None else matched[0]
            out.append(Deadline(glob, every, since + every, matched))
        return sorted(out, key=lambda d: d.due)

    def missed(self, started: float | None, advanced: float | None) -> Deadline | None:
        """The first deadline the steps advanced past (at ``advanced``) by more than a look at the
        files, at most half the period: a checkpoint seen a scan late is no miss."""
        if advanced is not None:
            for d in self.pending(started):
                if d.due + min(self.look_seconds, d.every / 2) < advanced:
                    return d
        return None


def overdue_message(deadline: Deadline, started: float, now: float) -> str:
    """``overdue``'s message: the GLOB, its last match and how late it is, at ``now``."""
    late = format_duration(now - deadline.due)
    if deadline.matched is None:
        last = f"no match since the steps started at {started:.1f}s"
    else:
        last = f"last match {deadline.matched[1]} at {deadline.matched[0]:.1f}s"
    return (
        f"{deadline.glob}: {last}, {late} late (--expect-every {deadline.glob}="
        f"{deadline.every:g}); the steps still advance"
    )
