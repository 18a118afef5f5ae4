"""Text from the run as plotly draws it: the one escaping function of the figures' strings.

plotly reads the strings it draws (subplot titles, legend names, hover texts, axis tick
labels, annotations) as a small HTML: tags (``<a href>``, ``<span style>``, ``<br>``) and
entities.  A process names itself, a file is named by whoever wrote it, a series field comes
from the artifact: each goes through :func:`plot_text` before plotly sees it, so it is drawn
as written.  The page's own HTML escapes with :func:`html.escape`, and the readout script
writes with ``textContent``.
"""

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
