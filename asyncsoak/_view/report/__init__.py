"""``asyncsoak report``: one self-contained HTML page (plotly.js inlined, ``_assets``) of what
happened, and when; ``_page`` lists its sections in order, ``_figure`` draws its one figure
(plotly, an optional extra, imported only there)."""

from ._assets import STYLE as STYLE
from ._assets import plot_text as plot_text
from ._page import PAGE as PAGE
from ._page import ReportUnavailableError as ReportUnavailableError
from ._page import render_report as render_report
from ._page import write_report as write_report
from ._timeline import RunDetail as RunDetail
from ._timeline import detail_for as detail_for
from ._timeline import read_journal_detail as read_journal_detail

__all__ = [
    "PAGE",
    "STYLE",
    "ReportUnavailableError",
    "RunDetail",
    "detail_for",
    "plot_text",
    "read_journal_detail",
    "render_report",
    "write_report",
]
