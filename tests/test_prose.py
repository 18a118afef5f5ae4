"""Docstrings say what and why in a few lines; the mechanism goes to docs/architecture.md.

Read from the source with ``ast``: every module, class and function of the package, a
docstring's length counted from its opening quotes to its closing ones.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "asyncsoak"

#: The most lines a docstring may span (issue 36, item 6).
MAX_DOCSTRING_LINES = 10


def long_docstrings(
    source: str, limit: int = MAX_DOCSTRING_LINES
) -> Iterator[tuple[int, str, int]]:
    """(line, name, lines) of each docstring in ``source`` that spans more than ``limit`` lines."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            continue
        lines = (first.end_lineno or first.lineno) - first.lineno + 1
        if lines > limit:
            yield first.lineno, getattr(node, "name", "module"), lines


def test_a_docstring_past_the_limit_is_named() -> None:
    source = '"""Short."""\n\n\ndef f() -> None:\n    """One.\n\n    Two.\n    """\n'
    assert list(long_docstrings(source)) == []
    assert list(long_docstrings(source, limit=3)) == [(5, "f", 4)]


def test_every_docstring_is_at_most_ten_lines() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {name}: {lines} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name, lines in long_docstrings(path.read_text())
    ]
    assert not found, (
        f"docstrings over {MAX_DOCSTRING_LINES} lines (say what and why; move the mechanism to "
        "docs/architecture.md):\n" + "\n".join(found)
    )
