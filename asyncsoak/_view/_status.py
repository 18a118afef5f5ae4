"""The status a person reads: the artifact's (a contract), except that every view says
``passed_with_warnings`` for a pass with a warning, so a run that leaks, or whose monitor could
not see everything, never looks like a clean one."""

from __future__ import annotations

from collections.abc import Sequence

from .._analysis import MEMORY_NOT_JUDGED
from .._contract import SoakStatus

#: A pass that carries warnings, as the views name it (never an artifact's ``status``).
PASSED_WITH_WARNINGS = "passed_with_warnings"


def shown_status(status: str, warnings: int) -> str:
    """``status`` as the views show it, given how many warnings the run carries."""
    return PASSED_WITH_WARNINGS if status == SoakStatus.PASSED and warnings > 0 else str(status)


def status_words(status: str) -> str:
    """A shown status in capitals and words: ``PASSED WITH WARNINGS``."""
    return status.replace("_", " ").upper()


def is_pass(status: str) -> bool:
    return status in (SoakStatus.PASSED, PASSED_WITH_WARNINGS)


def named_warning(warnings: Sequence[str]) -> str | None:
    """The warning a view names beside ``passed with warnings``: the leak check's that could
    not judge (a check asked to fail the run that judged nothing), else the first."""
    unjudged = (w for w in warnings if w.startswith(MEMORY_NOT_JUDGED))
    return next(unjudged, None) or (warnings[0] if warnings else None)
