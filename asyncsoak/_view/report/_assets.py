"""The page's pieces: its stylesheet and scripts, shipped as package files in ``assets/``; the
figure's embedding (the vendored plotly.js bundle inlined compressed, each figure drawn once it
is loaded); table rows; and text as plotly draws it."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

#: The plotly.js bundle in ``assets/`` (npm's ``plotly.js-basic-dist-min``): see its README.
PLOTLY_JS_VERSION = "4.1.1"


def _asset(name: str) -> bytes:
    """A file of the page (its stylesheet, its scripts), shipped in ``assets/``."""
    return (resources.files(__package__) / "assets" / name).read_bytes()


#: The page's stylesheet.
STYLE = _asset("report.css").decode()

#: One readout for every panel at the pointer's time, a line across all panels there, and
#: y axes that follow a zoom on the shared time axis.  Plain DOM, offline, after the plot.
READOUT_SCRIPT = _asset("readout.js").decode()

#: After the figure is drawn: what it holds, where the verdict and evidence end, and when,
#: in the render marker (for the tests and the benchmark).
RENDERED_SCRIPT = _asset("rendered.js").decode()

#: The page's head script that defines ``window.asyncsoakPlotly``: plotly.js, inlined gzip'd
#: and base64'd (a third of its size) and decompressed by the browser.
_PLOTLY_GZIP_BASE64 = base64.b64encode(_asset("plotly-basic.min.js.gz")).decode()
PLOTLY_LOADER = (
    _asset("plotly-loader.js").decode().replace("__PLOTLY_GZIP_BASE64__", _PLOTLY_GZIP_BASE64)
)


def figure_html(
    figure: Any,
    div_id: str,
    height: str,
    config: Mapping[str, Any],
    post_scripts: Sequence[str] = (),
) -> str:
    """A plotly figure's div and the script that draws it once :data:`PLOTLY_LOADER` has
    loaded plotly.js, then runs ``post_scripts`` (``{plot_id}`` is the div's id)."""
    then = "".join(
        f".then(function () {{\n{script.replace('{plot_id}', div_id)}\n}})"
        for script in post_scripts
    )
    return (
        f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}; width:100%;">'
        f"</div>\n<script>\nwindow.asyncsoakPlotly.then(function (Plotly) {{\n"
        f"  var figure = {figure.to_json()};\n"
        f'  return Plotly.newPlot("{div_id}", figure.data, figure.layout, {json.dumps(config)});\n'
        f"}}){then};\n</script>"
    )


def plot_text(text: object) -> str:
    """``text`` as plotly draws it literally (plotly reads every string as a small HTML):
    ``<``, ``>`` and ``&`` as entities (plotly decodes those, not ``&quot;``), and each newline
    as plotly's line break."""
    return html.escape(str(text), quote=False).replace("\n", "<br>")


def table_row(cells: Iterable[object], cls: str = "") -> str:
    """One HTML table row of ``cells``, each escaped; ``cls``: the row's class."""
    attr = f' class="{cls}"' if cls else ""
    return f"<tr{attr}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def head_row(*names: str) -> str:
    return "<tr>" + "".join(f"<th>{name}</th>" for name in names) + "</tr>"
