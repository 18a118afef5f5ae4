"""Text from the run as plotly draws it: plotly reads every string it draws as a small HTML,
so what a process, a file or a series names goes through :func:`plot_text` first."""

from __future__ import annotations

import html
from collections.abc import Iterable


def plot_text(text: object) -> str:
    """``text`` as plotly draws it literally: ``<``, ``>`` and ``&`` as entities (plotly
    decodes those, not ``&quot;``), and each newline as plotly's line break."""
    return html.escape(str(text), quote=False).replace("\n", "<br>")


def table_row(cells: Iterable[object], cls: str = "") -> str:
    """One HTML table row of ``cells``, each escaped; ``cls``: the row's class."""
    attr = f' class="{cls}"' if cls else ""
    return f"<tr{attr}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def head_row(*names: str) -> str:
    return "<tr>" + "".join(f"<th>{name}</th>" for name in names) + "</tr>"
