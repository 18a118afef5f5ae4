"""Text from a run as it may reach a terminal: what a terminal acts on (``ESC ] 52`` writes the
clipboard, bidi overrides reorder text) spelled out as Python would (``\\x1b``)."""

from __future__ import annotations

import re

#: What a terminal acts on: C0 controls but tab and newline, DEL, the C1 controls, and the
#: Unicode marks that reorder or hide text (the bidi embeddings, overrides and isolates, the
#: Arabic letter mark).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u202a-\u202e\u2066-\u2069]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_text(text: str, *, one_line: bool = True) -> str:
    """``text`` safe to print: control characters spelled out (``\\x1b``, ``\\u202e``), newlines
    too unless not ``one_line``.  Idempotent: what it writes holds no control character."""
    text = _CONTROL.sub(_spelled, text)
    return text.replace("\n", "\\n") if one_line else text
