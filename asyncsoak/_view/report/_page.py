"""The page: every section in order, in one self-contained HTML document, and writing it."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..._contract import (
    VERSION,
    Artifact,
    AsyncsoakError,
    format_duration,
    parse_iso_or_none,
    schema,
)
from ..._record import FILE_MODE
from .._job_view import job_word, offset_text, soak_label
from .._sections import column, series_group
from .._status import status_words
from .._summary import summarize
from ._assets import PLOTLY_LOADER, STYLE, figure_html, head_row, plot_text, table_row
from ._events import events_html, forensics_html, leftovers_html, log_html
from ._figure import Timeline
from ._tables import (
    compare_html,
    evidence_html,
    facts_html,
    gpu_html,
    look_first_html,
    processes_html,
    steady_html,
    verdict_html,
)
from ._timeline import detail_for


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
    """The report of one run as a self-contained HTML page; ``journal`` (by default the one the
    artifact names) fills what an older artifact lacks; ``baseline``, an earlier run of the
    same training, is drawn beneath the panels and compared figure by figure."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ReportUnavailableError() from None
    detail = detail_for(artifact, journal)
    summary = summarize(artifact)
    timeline = Timeline(artifact, detail, baseline)
    figure_html = timeline.to_html()
    made_from = f" from {html.escape(source)}" if source else ""
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
        f"<footer>asyncsoak {VERSION} report{made_from}; "
        f"journal {html.escape(str(artifact['monitor']['journal_path']))}.</footer>",
    ]
    title = f"{status_words(summary['status'])}: {summary['headline']}"
    return PAGE.format(
        title=html.escape(title),
        style=STYLE,
        loader=PLOTLY_LOADER,
        body="\n".join(part for part in body if part),
    )


def write_report(artifact: Artifact, path: Path, **options: Any) -> None:
    """Render the report (``options``: :func:`render_report`'s) and write it, readable by
    its owner only (like the artifact)."""
    text = render_report(artifact, **options)
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
window.addEventListener("unhandledrejection", function (e) {{
  var box = document.getElementById("page-errors");
  if (box) {{ box.hidden = false; box.textContent += String(e.reason) + "\\n"; }}
}});
</script>
<script>{loader}</script>
</head><body>
<pre id="page-errors" hidden></pre>
{body}
</body></html>
"""


def render_job_report(
    combined: Mapping[str, Any], artifacts: Sequence[tuple[str, Artifact]]
) -> str:
    """One HTML page for the job: the verdicts, and each soak's tree CPU and memory on one
    wall-clock axis with its first failure marked (needs plotly, as every report does)."""
    try:
        from plotly.subplots import make_subplots
    except ImportError:
        raise ReportUnavailableError() from None
    figure = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        subplot_titles=("tree RSS (MiB)", "tree CPU (% of one core)"),
    )
    by_path = dict(artifacts)
    for soak in combined["soaks"]:
        artifact = by_path[soak["path"]]
        start = parse_iso_or_none(artifact["started_at"])
        tree = series_group(artifact, "tree")
        if start is None or tree is None:
            continue
        xs = [start + timedelta(seconds=float(t)) for t in schema.series_times(tree)]
        label = plot_text(f"{soak_label(soak)} ({soak['node']})")
        rss = [None if v is None else v / 2**20 for v in column(tree, "rss_bytes")]
        trace = {"x": xs, "name": label, "legendgroup": label, "col": 1}
        figure.add_scatter(y=rss, row=1, **trace)
        figure.add_scatter(y=column(tree, "cpu_percent"), showlegend=False, row=2, **trace)
        failure = soak["first_failure"]
        moment = None if failure is None else parse_iso_or_none(failure["at"])
        if moment is not None:
            figure.add_vline(x=moment.timestamp() * 1000, line_dash="dot", line_color="#d62728")
    figure.update_layout(height=560, margin={"t": 40, "l": 60, "r": 20, "b": 40})
    rows = "".join(
        table_row(
            (
                soak_label(soak),
                soak["node"],
                soak["status"],
                ", ".join(soak["reasons"]) or soak["stop_cause"],
                offset_text(soak["start_offset_seconds"]),
                format_duration(float(soak["duration_seconds"] or 0)),
                soak["path"],
            )
        )
        for soak in combined["soaks"]
    )
    first = combined["first_failure"]
    first_html = (
        ""
        if first is None
        else f"<p>First failure: <b>{html.escape(soak_label(first))}</b> on "
        f"{html.escape(str(first['node']))} at {html.escape(str(first['at']))}: "
        f"<code>{html.escape(first['reason'])}</code> {html.escape(first['message'])}</p>"
    )
    status = str(combined["status"])
    body = (
        f'<div class="verdict {html.escape(status)}"><h1>{html.escape(status.upper())}: '
        f"{job_word(combined)} {html.escape(str(combined['job_id']))}, "
        f"{len(combined['soaks'])} soaks</h1>"
        f"{first_html}</div>"
        "<h2>Soaks</h2><table>"
        + head_row("soak", "node", "status", "why", "started", "ran", "artifact")
        + f"{rows}</table>"
        "<h2>Timeline (wall clock)</h2>"
        + figure_html(figure, "job-timeline", "560px", {"displaylogo": False, "responsive": True})
    )
    return PAGE.format(
        title=html.escape(f"{status.upper()}: {job_word(combined)} {combined['job_id']}"),
        style=STYLE,
        loader=PLOTLY_LOADER,
        body=body,
    )
