"""``asyncsoak report``: one self-contained HTML page that shows what happened, and when.

The page opens offline: plotly's JavaScript is inlined and no font or script is fetched.
At the top the verdict in plain words, the run's facts and provenance; then one plotly
figure whose panels share a time axis: a lane of what happened (progress, signals, the
failure, the exit, GPU throttling), the time since the last progress against its limit, and
every series group the artifact holds, known fields with their own panels and any other
field grouped by unit.  The moments that matter are drawn across every panel.  Then the
events, leftover processes, forensics and the log tail.

By concern: ``_detail`` reads what the journal adds, ``_panels`` plans the panels,
``_timeline`` decides what the figure shows (its marks, panels and curves, as plain data),
``_figure`` draws that with plotly, ``_tables`` writes the HTML sections, ``_page``
assembles the page from them and the files in ``assets/``; ``_text`` escapes what the run
wrote for plotly, as ``html.escape`` does for the page and ``textContent`` for its scripts.

plotly is an optional extra (``pip install 'asyncsoak[report]'``), imported only by the figure.
"""

from ._assets import STYLE as STYLE
from ._detail import JournalDetail as JournalDetail
from ._detail import journal_detail_for as journal_detail_for
from ._detail import read_journal_detail as read_journal_detail
from ._page import PAGE as PAGE
from ._page import ReportUnavailableError as ReportUnavailableError
from ._page import render_report as render_report
from ._page import write_report as write_report
from ._text import plot_text as plot_text

__all__ = [
    "PAGE",
    "STYLE",
    "JournalDetail",
    "ReportUnavailableError",
    "journal_detail_for",
    "plot_text",
    "read_journal_detail",
    "render_report",
    "write_report",
]
