"""The page's stylesheet and scripts, shipped as package files in ``assets/``."""

from __future__ import annotations

from importlib import resources


def _asset(name: str) -> str:
    """A file of the page (its stylesheet, its scripts), shipped in ``assets/``."""
    assets = resources.files(__package__) / "assets"
    return (assets / name).read_text(encoding="utf-8")


#: The page's stylesheet.
STYLE = _asset("report.css")

#: One readout for every panel at the pointer's time, a line across all panels there, and
#: y axes that follow a zoom on the shared time axis.  Plain DOM, offline, after the plot.
READOUT_SCRIPT = _asset("readout.js")

#: After the figure is drawn: what it holds, where the verdict and evidence end, and when,
#: in the render marker (for the tests and the benchmark).
RENDERED_SCRIPT = _asset("rendered.js")
