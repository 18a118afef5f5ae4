"""The page: every section in order, in one self-contained HTML document, and writing it."""

from __future__ import annotations

import html
from pathlib import Path

from ..._contract import VERSION, Artifact, AsyncsoakError
from ..._record import FILE_MODE
from .._status import status_words
from .._summary import summarize
from ._assets import STYLE
from ._detail import journal_detail_for
from ._figure import Timeline
from ._tables import (
    compare_html,
    events_html,
    evidence_html,
    facts_html,
    forensics_html,
    gpu_html,
    leftovers_html,
    log_html,
    look_first_html,
    processes_html,
    steady_html,
    verdict_html,
)


class ReportUnavailableError(AsyncsoakError):
    """plotly, which draws the report, is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "the HTML report needs plotly: pip install 'asyncsoak[report]' (or pip install plotly)"
        )


def render_report(
    artifact: Artifact,
    *,
    journal: Path | None = None,
    source: str | None = None,
    baseline: Artifact | None = None,
    baseline_source: str | None = None,
) -> str:
    """The report of one run as a self-contained HTML page.

    ``journal`` adds what only the journal holds (throttle spans, progress events the
    artifact did not keep); by default the journal the artifact names is used if it is there.
    ``source`` names the file the report was made from.  ``baseline``: an earlier run of the
    same training, drawn beneath this one's panels and compared figure by figure.
    """
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ReportUnavailableError() from None
    detail = journal_detail_for(artifact, journal)
    summary = summarize(artifact)
    timeline = Timeline(artifact, detail, baseline)
    figure_html = timeline.to_html()
    body = [
        verdict_html(summary),
        evidence_html(artifact, summary),
        compare_html(artifact, baseline, baseline_source),
        facts_html(artifact, summary),
        look_first_html(summary),
        processes_html(artifact),
        '<section id="timeline-section"><h2>Timeline</h2>',
        f'<p class="help">{timeline.help_text()}</p>',
        steady_html(timeline),
        # Before the figure: its post-render script runs before the parser gets further.
        '<span id="render-status" hidden data-state="pending"></span>',
        "<noscript><p>The plots need JavaScript.</p></noscript>",
        '<div id="readout" class="readout" hidden></div>',
        figure_html,
        "</section>",
        gpu_html(summary, timeline),
        events_html(artifact),
        leftovers_html(artifact),
        forensics_html(artifact),
        log_html(artifact),
        _footer_html(artifact, source),
    ]
    title = f"{status_words(summary['status'])}: {summary['headline']}"
    return PAGE.format(
        title=html.escape(title),
        style=STYLE,
        body="\n".join(part for part in body if part),
    )


def write_report(
    artifact: Artifact,
    path: Path,
    *,
    journal: Path | None = None,
    source: str | None = None,
    baseline: Artifact | None = None,
    baseline_source: str | None = None,
) -> None:
    """Render and write the report, readable by its owner only (like the artifact)."""
    text = render_report(
        artifact,
        journal=journal,
        source=source,
        baseline=baseline,
        baseline_source=baseline_source,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=FILE_MODE)
    path.write_text(text, encoding="utf-8")


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script>
window.addEventListener("error", function (e) {{
  var box = document.getElementById("page-errors");
  if (box) {{ box.hidden = false; box.textContent += (e.message || String(e)) + "\\n"; }}
}});
</script>
</head><body>
<pre id="page-errors" hidden></pre>
{body}
</body></html>
"""


def _footer_html(artifact: Artifact, source: str | None) -> str:
    made_from = f" from {html.escape(source)}" if source else ""
    journal = artifact["monitor"]["journal_path"]
    return (
        f"<footer>asyncsoak {VERSION} report{made_from}; journal "
        f"{html.escape(str(journal))}.</footer>"
    )
