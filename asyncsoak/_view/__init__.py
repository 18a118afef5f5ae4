"""What a person reads: the evidence, the summary, the live view, the HTML report,
comparisons, several artifacts of one job, and the labels of the sampled fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._compare import compare as compare
    from ._compare import format_comparison as format_comparison
    from ._hints import exit_text as exit_text
    from ._job_view import NotOneJobError as NotOneJobError
    from ._job_view import combine as combine
    from ._job_view import format_combined as format_combined
    from ._live import VIEW_CALL_TIMEOUT_SECONDS as VIEW_CALL_TIMEOUT_SECONDS
    from ._live import JournalTail as JournalTail
    from ._live import live_status as live_status
    from ._live import make_view as make_view
    from ._live import watch_journal as watch_journal
    from ._live_line import Status as Status
    from ._live_state import LiveState as LiveState
    from ._status import is_pass as is_pass
    from ._status import status_words as status_words
    from ._summary import REASON_TITLES as REASON_TITLES
    from ._summary import format_summary as format_summary
    from ._summary import summarize as summarize
    from ._training import goodput_line as goodput_line
    from ._training import training_line as training_line
    from .report._page import ReportUnavailableError as ReportUnavailableError
    from .report._page import render_job_report as render_job_report
    from .report._page import write_report as write_report

__getattr__, __dir__ = lazy_door(__name__, __file__)
