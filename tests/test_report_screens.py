"""The report of every run a reader meets (pass, stall, crash, frozen step, NaN loss, GPU
fault, leak), shot at 1400x900 in a real headless Chromium offline: the verdict, the evidence
and the cause above the fold, no text of the figure drawn over another or outside its plot
area, titles for people, each axis titled with its quantity and unit, and the page small."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest

from asyncsoak._view.report import render_report
from asyncsoak._view.report._figure import Timeline

from .soak_runs import canonical_runs, trainer_soak
from .test_report import CHROMIUM, OFFLINE, needs_chromium, needs_plotly

pytestmark = pytest.mark.slow

#: What a 1400x900 window shows without scrolling.
FOLD_PX = 900

#: After the figure is drawn: the boxes of every text the figure writes (the lane's labels,
#: the panels' titles, labels, annotations and legends), the pairs that overlap, and the
#: labels not inside a plot area (the panels' titles are above theirs).
OVERLAP_DRIVER = """
<script>
(function () {
  var marker = document.getElementById("render-status");
  function box(e) { return {text: e.textContent, r: e.getBoundingClientRect()}; }
  function drawn(b) { return b.text && b.r.width > 0 && b.r.height > 0; }
  function measure() {
    var plot = document.getElementById("timeline");
    var titles = plot.layout.annotations.filter(function (a) {
      return a.xref === "paper"; }).length;
    var labels = Array.prototype.filter.call(
      plot.querySelectorAll(".textpoint text, .annotation, [class^=legend][class$=text]"),
      function (e) {
        return !e.classList.contains("annotation") || +e.dataset.index >= titles; });
    var texts = Array.prototype.slice.call(
      plot.querySelectorAll(".textpoint text, .annotation-text, [class^=legend][class$=text]"));
    var boxes = texts.map(box).filter(drawn);
    var origin = plot.getBoundingClientRect(), layout = plot._fullLayout, areas = [];
    Object.keys(layout).forEach(function (name) {
      if (!/^yaxis\\d*$/.test(name)) { return; }
      var y = layout[name], x = layout[y.anchor.replace("x", "xaxis")];
      areas.push({left: origin.left + x._offset, right: origin.left + x._offset + x._length,
                  top: origin.top + y._offset, bottom: origin.top + y._offset + y._length});
    });
    var outside = labels.map(box).filter(drawn).filter(function (b) {
      return !areas.some(function (a) {
        return b.r.left >= a.left - 1 && b.r.right <= a.right + 1 &&
          b.r.top >= a.top - 1 && b.r.bottom <= a.bottom + 1;
      });
    }).map(function (b) { return b.text; });
    var overlaps = [];
    for (var i = 0; i < boxes.length; i++) {
      for (var j = i + 1; j < boxes.length; j++) {
        var a = boxes[i].r, b = boxes[j].r;
        if (a.left < b.right - 1 && b.left < a.right - 1 &&
            a.top < b.bottom - 1 && b.top < a.bottom - 1) {
          overlaps.push(boxes[i].text + " ~ " + boxes[j].text);
        }
      }
    }
    marker.dataset.texts = String(boxes.length);
    marker.dataset.overlaps = overlaps.join("|");
    marker.dataset.outside = outside.join("|");
    marker.dataset.measured = "yes";
  }
  if (marker.dataset.state === "rendered") { measure(); return; }
  new MutationObserver(function (changes, observer) {
    if (marker.dataset.state === "rendered") { observer.disconnect(); measure(); }
  }).observe(marker, {attributes: true});
})();
</script>
"""

#: A size unit named in a panel's title.
SIZE_IN_TITLE = re.compile(r"\(((?:B|KiB|MiB|GiB|TiB)(?:/\w+)?)\)")


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return canonical_runs(tmp_path_factory.getbasetemp() / "canonical")


def shoot(page: Path, shot: Path) -> dict[str, str]:
    """The page at 1400x900: its screenshot written to ``shot``, the render marker's data."""
    assert CHROMIUM is not None
    driven = page.with_name("driven-" + page.name)
    driven.write_text(page.read_text().replace("</body>", OVERLAP_DRIVER + "</body>"))
    result = subprocess.run(
        [
            CHROMIUM,
            *OFFLINE,
            "--hide-scrollbars",
            "--window-size=1400,900",
            f"--screenshot={shot}",
            "--dump-dom",
            driven.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    marker = re.search(r'<span id="render-status"([^>]*)>', result.stdout)
    assert marker is not None, result.stdout[-2000:]
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'data-([a-z-]+)="([^"]*)"', marker.group(1))
    }


@needs_plotly
@needs_chromium
@pytest.mark.parametrize("mode", ["pass", "stall", "crash", "frozen", "nan", "gpu", "leak"])
def test_first_screen_holds_the_verdict_and_no_text_overlaps(
    canonical: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    """At 1400x900, offline, the page draws: the verdict, the evidence and (on a failure) the
    cause end above the fold, no label, annotation or legend of the figure overlaps another
    or leaves its plot area, and every y axis names its quantity (none a bare "count")."""
    artifact = json.loads(canonical[mode].read_text())
    page = tmp_path / f"{mode}.html"
    page.write_text(render_report(artifact))
    shot = tmp_path / f"{mode}.png"
    marker = shoot(page, shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert marker["state"] == "rendered"
    assert marker["measured"] == "yes"
    assert int(marker["verdict-bottom"]) < FOLD_PX
    assert int(marker["evidence-bottom"]) < FOLD_PX
    if mode not in ("pass", "leak"):
        assert int(marker["cause-bottom"]) < FOLD_PX
    assert int(marker["texts"]) > 5
    assert marker["overlaps"] == "", marker["overlaps"]
    assert marker["outside"] == "", marker["outside"]
    ytitles = marker["ytitles"].split("|")
    assert "since progress (s)" in ytitles
    assert "count" not in ytitles, ytitles
    assert {"CPU (%)", "loss", "step"} <= set(ytitles), ytitles
    assert any(re.fullmatch(r"memory \((B|KiB|MiB|GiB)\)", t) for t in ytitles), ytitles
    text = page.read_text()
    if mode == "leak":
        # A pass with warnings looks like one: amber, and says so; the artifact still passed.
        assert artifact["status"] == "passed"
        assert '<header id="verdict" class="verdict passed_with_warnings">' in text
        assert '<span class="badge">PASSED WITH WARNINGS</span>' in text
        assert "<title>PASSED WITH WARNINGS: " in text
        assert '<dt>Warning</dt><dd id="cause">' in text  # a warning, not a failure's cause
    elif mode == "pass":
        assert '<span class="badge">PASSED</span>' in text
    elif mode == "crash":  # the log's end marks the traceback's exception
        assert '<span class="tb-exc">RuntimeError: injected crash at step 8</span>' in text
    elif mode == "nan":  # marked on the loss panel where it came
        assert "loss NaN at step 8" in marker["titles"].split("|")
    elif mode == "gpu":  # the fault's action is said once: as the next step
        # Above the figure, once: as the next step (the Events table keeps the record).
        story = text[: text.index('<section id="timeline-section">')]
        assert story.count("drain the node and reset the GPU") == 1


@needs_plotly
def test_titles_are_for_people_and_agree_with_their_axis(canonical: dict[str, Path]) -> None:
    """No panel title shows a raw field name, and a size named in a title is the unit its
    axis was drawn in (chosen from the data)."""
    for mode, path in canonical.items():
        timeline = Timeline(json.loads(path.read_text()), None)
        timeline.to_html()
        for panel in timeline.panels:
            assert "_" not in panel.title, (mode, panel.title)
            named = SIZE_IN_TITLE.search(panel.title)
            if named is not None:
                assert named.group(1) == timeline.panel_units[panel.key], (mode, panel.title)
        if mode == "leak":  # 40 steps: its bytes written per minute move
            titles = [panel.title for panel in timeline.panels]
            assert "Progress: bytes written to the progress directory per minute" in titles
            assert timeline.panel_units["progress_bytes"] in ("B/min", "KiB/min", "MiB/min")


@needs_plotly
def test_the_leaks_exit_marks_are_merged_into_one_label(canonical: dict[str, Path]) -> None:
    """The leak run's warning, leak and projected breach fall at its end: one label, the
    leak's, with the others counted and every one kept in its hover."""
    timeline = Timeline(json.loads(canonical["leak"].read_text()), None)
    notes = timeline.lane_marks("notes")
    assert len(notes) < len([m for m in timeline.marks if m.lane == "notes"])
    [last] = [m for m in notes if m.label.startswith("leak")]
    assert re.fullmatch(r"leak \+\d", last.label), last.label
    assert "will reach machine memory" in last.hover
    assert "grew" in last.hover


@needs_plotly
def test_events_are_fields_not_json(canonical: dict[str, Path]) -> None:
    """The Events table writes an event's facts as named fields in people's units."""
    page = render_report(json.loads(canonical["leak"].read_text()))
    events = page[page.index('<section id="events">') :]
    events = events[: events.index("</section>")]
    assert "{&quot;" not in events
    assert '{"' not in events
    row = re.search(r'<tr class="limits">(.*?)</tr>', events, re.S)
    assert row is not None
    assert re.search(r'<span class="name">memory total bytes</span> \d+\.\d GiB', row.group(1))
    assert re.search(r'<span class="name">disk total bytes progress</span> \d', row.group(1))


def test_flat_and_zero_gpu_lines_fold_into_the_steady_strip(canonical: dict[str, Path]) -> None:
    """A GPU's zero ECC counts, its steady memory and a power limit beside a flat draw are
    named in the steady strip, not drawn; its moving utilisation is drawn."""
    t = [0.0, 1.0, 2.0, 3.0]
    artifact = json.loads(canonical["pass"].read_text())
    artifact["series"] = {
        "gpu0": {
            "t": t,
            "utilization_gpu_percent": [10.0, 90.0, 40.0, 95.0],
            "memory_used_mib": [40_000.0] * 4,
            "power_draw_w": [300.0] * 4,
            "power_limit_w": [700.0] * 4,
            "ecc_uncorrected_volatile": [0, 0, 0, 0],
        }
    }
    timeline = Timeline(artifact, None)
    drawn = {f.name for panel in timeline.panels for f in panel.fields if f.group == "gpu0"}
    assert drawn == {"utilization_gpu_percent"}
    steady = timeline.steady_text()
    assert "GPU 0 memory used 39.1 GiB" in steady
    assert "GPU 0 ECC errors uncorrected 0" in steady
    assert "GPU 0 power limit 700 W" in steady


@needs_plotly
@needs_chromium
def test_a_short_runs_report_is_small_and_draws_offline(tmp_path: Path) -> None:
    """The report of an 8-second run of 80 steps is one file of at most 1.5 MB that fetches
    nothing and draws in an offline Chromium, its plotly.js decompressed by the page."""
    artifact_path = trainer_soak(tmp_path / "short", "pass", 80, env="STEP_SECONDS=0.1")
    page = tmp_path / "short.html"
    page.write_text(render_report(json.loads(artifact_path.read_text())))
    assert page.stat().st_size <= 1_500_000
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\(\s*['\"]?https?:", text)
    assert "DecompressionStream" in text
    marker = shoot(page, tmp_path / "short.png")
    assert marker["state"] == "rendered"
    assert "count" not in marker["ytitles"].split("|")
