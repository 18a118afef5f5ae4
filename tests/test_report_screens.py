"""The report of the four runs a reader meets first (pass, stall, crash, leak), shot at
1400x900 in a real headless Chromium: the verdict, the evidence and the cause above the fold,
no text of the figure drawn over another, titles for people, and each axis in one unit."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest

from asyncsoak._view.report import render_report
from asyncsoak._view.report._figure import Timeline

from .soak_runs import canonical_runs
from .test_report import CHROMIUM, OFFLINE, needs_chromium, needs_plotly

pytestmark = pytest.mark.slow

#: What a 1400x900 window shows without scrolling.
FOLD_PX = 900

#: After the figure is drawn: the boxes of every text the figure writes on its plots (the
#: lane's labels, the panels' labels and annotations), and the pairs that overlap.
OVERLAP_DRIVER = """
<script>
(function () {
  var marker = document.getElementById("render-status");
  function measure() {
    var plot = document.getElementById("timeline");
    var texts = Array.prototype.slice.call(
      plot.querySelectorAll(".textpoint text, .annotation-text"));
    var boxes = texts.map(function (e) {
      return {text: e.textContent, r: e.getBoundingClientRect()};
    }).filter(function (b) { return b.text && b.r.width > 0 && b.r.height > 0; });
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
@pytest.mark.parametrize("mode", ["pass", "stall", "crash", "leak"])
def test_first_screen_holds_the_verdict_and_no_text_overlaps(
    canonical: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    """At 1400x900 the verdict, the evidence and (on a failure) the cause end above the
    fold, and no label or annotation of the figure overlaps another."""
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
    if mode in ("stall", "crash"):
        assert int(marker["cause-bottom"]) < FOLD_PX
    assert int(marker["texts"]) > 5
    assert marker["overlaps"] == "", marker["overlaps"]
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
