"""`asyncsoak compare` and `report --compare`: two real runs of one trainer, one leaking."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from asyncsoak._contract import SoakStatus
from asyncsoak._contract._schema import Artifact
from asyncsoak._record._artifact import RunState
from asyncsoak._view._compare import compare, format_comparison
from asyncsoak._view.report import render_report

from .conftest import asyncsoak_cli
from .soak_runs import trainer_soak
from .test_report import chromium, needs_chromium, needs_plotly


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(clean, leaking): the same command, the second keeping 8 MiB alive per step (40)."""
    base = tmp_path_factory.mktemp("compare")
    script = base / "train.py"
    clean = trainer_soak(base / "clean", "pass", 40, script=script)
    leaking = trainer_soak(base / "leaking", "pass", 40, script=script, env="LEAK_MIB=8")
    return clean, leaking


@pytest.mark.slow
def test_compare_names_the_memory_regression(pair: tuple[Path, Path]) -> None:
    """Leaking against clean: peak and final tree RSS flagged, exit 0 without the flag."""
    clean, leaking = pair
    result = asyncsoak_cli("compare", str(clean), str(leaking), cwd=clean.parent)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^peak tree RSS\s+\S+ MiB\s+\S+ MiB\s+\+\d+%\s+REGRESSED$", out, re.M), out
    assert re.search(r"^final tree RSS .* REGRESSED$", out, re.M), out
    assert "peak tree RSS rose by" in out.splitlines()[-1]
    assert "the commands differ" not in out  # one trainer, one command


@pytest.mark.slow
def test_fail_on_regression_and_json(pair: tuple[Path, Path]) -> None:
    """--fail-on-regression exits 1 on a regression; --json lists it; a run against itself
    has none and exits 0."""
    clean, leaking = pair
    result = asyncsoak_cli(
        "compare", str(clean), str(leaking), "--json", "--fail-on-regression", cwd=clean.parent
    )
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert "tree.rss.peak" in data["regressions"]
    row = next(r for r in data["rows"] if r["key"] == "tree.rss.peak")
    assert row["candidate"] > row["baseline"] + 64 * 2**20
    same = asyncsoak_cli(
        "compare", str(clean), str(clean), "--fail-on-regression", cwd=clean.parent
    )
    assert same.returncode == 0, same.stderr
    assert same.stdout.rstrip().endswith("no regression")


@pytest.mark.parametrize("threshold", ["-5", "nan", "ten"])
@pytest.mark.slow
def test_bad_threshold_is_refused(pair: tuple[Path, Path], threshold: str) -> None:
    """A negative, NaN or non-numeric threshold: exit 2 and a message, nothing printed."""
    clean, leaking = pair
    result = asyncsoak_cli(
        "compare", str(clean), str(leaking), "--threshold", threshold, cwd=clean.parent
    )
    assert result.returncode == 2
    assert "--threshold" in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_a_leak_verdict_regresses_only_when_new(pair: tuple[Path, Path]) -> None:
    """A candidate whose trends say leak, against a baseline that did not: the slope row
    regresses and names the leaking process."""
    clean, leaking = pair
    baseline = json.loads(clean.read_text())
    candidate = json.loads(leaking.read_text())
    candidate["trends"] = {
        "tree.rss_bytes": {"verdict": "leak", "slope_per_hour": 7.0 * 2**30, "growth": 2**27},
        "process.7.rss_bytes": {
            "verdict": "leak",
            "label": "memory of pid 7 (python)",
            "pid": 7,
            "growth": 2**27,
            "slope_per_hour": 7.0 * 2**30,
        },
    }
    baseline["trends"] = {"tree.rss_bytes": {"verdict": "stable", "slope_per_hour": 0.0}}
    rows = {row.key: row for row in compare(baseline, candidate).rows}
    assert rows["tree.rss.slope"].regressed
    assert rows["tree.rss.slope"].note == (
        "memory leak: memory of pid 7 (python) (the baseline did not leak)"
    )
    assert not compare(candidate, candidate).regressions


@needs_plotly
@pytest.mark.slow
def test_report_overlays_the_baseline(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """`report --compare`: the comparison under the evidence, the baseline's lines dashed."""
    clean, leaking = pair
    out = tmp_path / "r.html"
    result = asyncsoak_cli(
        "report", str(leaking), "--compare", str(clean), "-o", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert '<section id="compare">' in page
    assert re.search(r'<tr class="regressed"><td>peak tree RSS</td>', page)
    assert '"name":"RSS (baseline)"' in page
    assert page.index('id="evidence"') < page.index('id="compare"') < page.index('id="timeline"')


#: Run in the page once it is drawn: move the pointer over the tree's memory, then zoom the time
#: axis to the first third, and record what the readout said and the RSS axis's new range.
INTERACT = """
<script>
var poll = setInterval(function () {
  var marker = document.getElementById("render-status");
  if (marker.dataset.state !== "rendered") { return; }
  clearInterval(poll);
  var plot = document.getElementById("timeline");
  var k = plot.data.findIndex(function (t) { return t.meta && t.meta[1] === "RSS"; });
  var trace = plot.data[k], axis = "yaxis" + trace.yaxis.slice(1);
  // A real pointer move over the memory panel, a third of the way along.
  var drag = plot.querySelector('.nsewdrag[data-subplot="' + trace.xaxis + trace.yaxis + '"]');
  var box = drag.getBoundingClientRect();
  drag.dispatchEvent(new MouseEvent("mousemove", {
    clientX: box.left + box.width / 3, clientY: box.top + box.height / 2, bubbles: true}));
  setTimeout(function () {
    marker.dataset.readout = document.getElementById("readout").textContent;
  }, 100);
  marker.dataset.peak = String(Math.max.apply(null, trace.y.filter(function (v) {
    return v !== null; })));
  var end = trace.x[trace.x.length - 1];
  setTimeout(function () { Plotly.relayout(plot, {"xaxis.range": [0, end / 3]}).then(function () {
    setTimeout(function () {
      marker.dataset.zoomed = JSON.stringify(plot._fullLayout[axis].range);
      marker.dataset.interacted = "yes";
    }, 200);
  }); }, 300);
}, 50);
</script>
"""


@needs_plotly
@needs_chromium
@pytest.mark.slow
def test_one_readout_for_every_panel_and_y_follows_the_zoom(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Hovering one panel reads every panel at that time (relative and UTC); zooming the
    time axis rescales the y axes to what is in view."""
    _, leaking = pair
    page = tmp_path / "r.html"
    html = render_report(json.loads(leaking.read_text()))
    page.write_text(html.replace("</body>", INTERACT + "</body>"))
    result = chromium(page, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    marker = re.search(r'<span id="render-status"([^>]*)>', result.stdout)
    assert marker is not None
    data = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', marker.group(1)))
    assert data.get("interacted") == "yes", data
    readout = data["readout"]
    assert re.search(r"since the start · \d\d:\d\d:\d\d UTC", readout), readout
    for panel in ("Process tree CPU", "Process tree memory", "Machine memory"):
        assert panel in readout, readout
    _, high = json.loads(data["zoomed"])
    # The leaking trainer's memory grows all along: its first third tops out well below.
    assert high < float(data["peak"]) * 0.9


def _stepped_run(interval: float, steps_per_second: float) -> Artifact:
    """A 20 s run whose step advanced at ``steps_per_second``, each scan (every ``interval``)
    finding its metrics file changed."""
    builder = RunState()
    config = {"sample_interval_seconds": interval, "progress_dir": "runs"}
    header = {"t": 0.0, "kind": "header", "started_at": "2026-01-01T00:00:00Z"}
    builder.add(header | {"command": ["train"], "config": config})
    for i in range(1, int(20 / interval) + 1):
        t = i * interval
        builder.add({"t": t, "kind": "progress", "changed": 1, "paths": ["m.jsonl"]})
        step = {"t": t, "kind": "step", "step": int(t * steps_per_second), "source": "m.jsonl"}
        builder.add(
            step
            | {"source_kind": "json_lines", "gap_seconds": interval}
            | {"steps_per_second": steps_per_second, "loss": 1.0}
        )
    return builder.build_typed(status=SoakStatus.PASSED, ended_t=20.0, log_tail="", monitor={})


def test_compare_of_runs_with_steps_compares_their_step_rates() -> None:
    """Steps/s doubled, scanned at a longer sample interval (fewer file changes counted): the
    step rate rose and nothing regressed; file changes are never compared across intervals."""
    baseline, candidate = _stepped_run(0.25, 10.0), _stepped_run(1.0, 20.0)
    comparison = compare(baseline, candidate)
    rows = {row.key: row for row in comparison.rows}
    assert rows["steps.rate"].change == pytest.approx(1.0)
    assert "progress.rate" not in rows
    assert not comparison.regressions
    assert format_comparison(comparison).endswith("no regression")
    for artifact in (baseline, candidate):
        artifact["progress"]["steps"] = None
        artifact["series"].pop("steps")
    unstepped = compare(baseline, candidate)
    assert "progress.rate" not in {row.key for row in unstepped.rows}  # other intervals
    assert not unstepped.regressions
    same = compare(_stepped_run(1.0, 10.0), _stepped_run(1.0, 10.0))
    assert "progress.rate" not in {row.key for row in same.rows}  # steps: their rate
    baseline["config"]["sample_interval_seconds"] = 1.0
    rows = {row.key: row for row in compare(baseline, candidate).rows}
    assert rows["progress.rate"].label == "file changes"
