"""``asyncsoak report``: one self-contained HTML page that shows what happened, and when.

The page opens offline (a partial plotly.js inlined compressed, ``_assets``): the verdict, the
run's facts, one figure whose panels share a time axis, then the events, leftovers, forensics
and the log tail.
By concern: ``_detail`` reads progress and throttling over time, ``_panels`` plans the panels,
``_timeline`` decides what the figure shows, ``_figure`` draws it with plotly (an optional
extra, imported only there), ``_tables`` and ``_events`` write the HTML sections, ``_page``
assembles the page (and a job's page); ``_text`` escapes what the run wrote for plotly.
"""

from ._assets import STYLE as STYLE
from ._detail import RunDetail as RunDetail
from ._detail import detail_for as detail_for
from ._detail import read_journal_detail as read_journal_detail
from ._page import PAGE as PAGE
from ._page import ReportUnavailableError as ReportUnavailableError
from ._page import render_report as render_report
from ._page import write_report as write_report
from ._text import plot_text as plot_text

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
