"""Text from a run as it may reach a terminal: control characters spelled out.

Anything a run wrote can end up on a person's terminal: a process name, a file name in the
progress directory, an exception message, a job's name.  A terminal acts on the control
characters in them: ``ESC ] 52`` writes the clipboard, ``ESC ] 0`` retitles the window,
``ESC [ 2J`` clears the screen, a carriage return overwrites the line before it, and the
Unicode bidirectional overrides reorder what is shown.  Every view that prints such text
(``run``'s lines, the live view, ``summary``, ``compare``, ``recover``, the queue's views, error
messages) passes it through :func:`terminal_text`, which spells each of them out as Python
would (``\\x1b``, ``\\u202e``), so it shows as text and does nothing.
"""

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
    """``text`` safe to print: control characters spelled out (``\\x1b``, ``\\u202e``), and
    newlines too (``\\n``) unless ``one_line`` is false and the text is shown as lines.

    Spelling out is idempotent: what it writes holds no control character.
    """
    text = _CONTROL.sub(_spelled, text)
    return text.replace("\n", "\\n") if one_line else text
