"""What a person reads.

The evidence, the summary, the live view, the HTML report, comparisons, several artifacts of one
job, and the labels of the sampled fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._compare import compare as compare
    from ._compare import format_comparison as format_comparison
    from ._job_view import NotOneJobError as NotOneJobError
    from ._job_view import combine as combine
    from ._job_view import format_combined as format_combined
    from ._job_view import render_job_report as render_job_report
    from ._live import VIEW_CALL_TIMEOUT_SECONDS as VIEW_CALL_TIMEOUT_SECONDS
    from ._live import VIEW_MODES as VIEW_MODES
    from ._live import JournalTail as JournalTail
    from ._live import LiveState as LiveState
    from ._live import Status as Status
    from ._live import live_status as live_status
    from ._live import make_view as make_view
    from ._live import watch_journal as watch_journal
    from ._status import is_pass as is_pass
    from ._status import status_words as status_words
    from ._summary import REASON_TITLES as REASON_TITLES
    from ._summary import exit_text as exit_text
    from ._summary import format_summary as format_summary
    from ._summary import summarize as summarize
    from .report._page import ReportUnavailableError as ReportUnavailableError
    from .report._page import write_report as write_report
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "compare": "._compare",
            "format_comparison": "._compare",
            "NotOneJobError": "._job_view",
            "combine": "._job_view",
            "format_combined": "._job_view",
            "render_job_report": "._job_view",
            "JournalTail": "._live",
            "LiveState": "._live",
            "Status": "._live",
            "VIEW_CALL_TIMEOUT_SECONDS": "._live",
            "VIEW_MODES": "._live",
            "live_status": "._live",
            "make_view": "._live",
            "watch_journal": "._live",
            "is_pass": "._status",
            "status_words": "._status",
            "REASON_TITLES": "._summary",
            "exit_text": "._summary",
            "format_summary": "._summary",
            "summarize": "._summary",
            "ReportUnavailableError": ".report._page",
            "write_report": ".report._page",
        },
    )
