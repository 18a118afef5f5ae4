"""The page's stylesheet and scripts, shipped as package files in ``assets/``, and the figure's
embedding: the vendored plotly.js bundle inlined compressed, each figure drawn once it is loaded."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

#: The plotly.js bundle in ``assets/`` (npm's ``plotly.js-basic-dist-min``): see its README.
PLOTLY_JS_VERSION = "4.1.1"


def _asset_bytes(name: str) -> bytes:
    return (resources.files(__package__) / "assets" / name).read_bytes()


def _asset(name: str) -> str:
    """A file of the page (its stylesheet, its scripts), shipped in ``assets/``."""
    return _asset_bytes(name).decode("utf-8")


#: The page's stylesheet.
STYLE = _asset("report.css")

#: One readout for every panel at the pointer's time, a line across all panels there, and
#: y axes that follow a zoom on the shared time axis.  Plain DOM, offline, after the plot.
READOUT_SCRIPT = _asset("readout.js")

#: After the figure is drawn: what it holds, where the verdict and evidence end, and when,
#: in the render marker (for the tests and the benchmark).
RENDERED_SCRIPT = _asset("rendered.js")

#: The page's head script that defines ``window.asyncsoakPlotly``: plotly.js, inlined gzip'd
#: and base64'd (a third of its size) and decompressed by the browser.
PLOTLY_LOADER = _asset("plotly-loader.js").replace(
    "__PLOTLY_GZIP_BASE64__", base64.b64encode(_asset_bytes("plotly-basic.min.js.gz")).decode()
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
