"""The offline report renders what a run wrote as text, never as HTML: checked in Chromium.

Every value from the run (process names, which any process of the tree sets through
``/proc/self/comm``; file names, metadata, panel titles, a baseline's name) reaches the page
through ``textContent`` or one escaping function.  Each test drives a real headless Chromium
over a real report and asserts that the hostile text shows literally and no script of it ran.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import asyncsoak_cli
from .test_report import CHROMIUM, OFFLINE, needs_chromium, needs_plotly

pytestmark = pytest.mark.slow

#: ``<img src=x onerror=document.title=7>`` in four 15-byte pieces, one per process: the
#: readout lists the processes' lines one after another, so an ``innerHTML`` of it joins the
#: pieces (the markup between them falls in a quoted attribute and in JavaScript comments).
COMM_PIECES = ["<img src=x a='", "'onerror='/*", "*/document./*", "*/title=7;'>"]

#: The trainer: four children, each naming itself with one piece and holding memory (the
#: first the most, so the report draws them in order), and a loop making progress.
HOSTILE_TREE = """
import pathlib, subprocess, sys, time
pieces = {pieces!r}
progress = pathlib.Path("progress")
progress.mkdir(exist_ok=True)
child = '''
import sys
with open("/proc/self/comm", "w") as comm:
    comm.write(sys.argv[1])
held = b"x" * (int(sys.argv[2]) << 20)
print("ready", flush=True)
sys.stdin.read()
'''
children = [
    subprocess.Popen([sys.executable, "-c", child, piece, str(80 - 10 * i)],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for i, piece in enumerate(pieces)
]
for c in children:
    assert c.stdout.readline() == "ready\\n"
for step in range(15):
    (progress / "step").write_text(str(step))
    time.sleep(0.1)
for c in children:
    c.stdin.close()
    c.wait()
"""

#: After the figure is drawn (the render marker says so): move the mouse over the panel of
#: the processes' lines, as a reader does, and write what the readout then holds into the
#: marker.
HOVER_DRIVER = """
<script>
(function () {
  var marker = document.getElementById("render-status");
  var plot = document.getElementById("timeline");
  function hover() {
    var box = document.getElementById("readout");
    var lines = plot.data.filter(function (trace) {
      return trace.meta && String(trace.meta[1]).indexOf("pid ") === 0;
    });
    var panel = lines.length ? lines[0] : plot.data[plot.data.length - 1];
    var subplot = (panel.xaxis || "x") + (panel.yaxis || "y");
    var area = plot.querySelector(".nsewdrag[data-subplot='" + subplot + "']");
    var r = area.getBoundingClientRect();
    area.dispatchEvent(new MouseEvent("mousemove", {
      bubbles: true, clientX: r.left + r.width * 0.8, clientY: r.top + r.height / 2}));
    marker.dataset.processLines = String(lines.length);
    marker.dataset.readout = box.textContent;
    marker.dataset.readoutElements = String(box.querySelectorAll("img, script, a").length);
    marker.dataset.readoutHidden = String(box.hidden);
  }
  if (marker.dataset.state === "rendered") { hover(); return; }
  new MutationObserver(function (changes, observer) {
    if (marker.dataset.state === "rendered") { observer.disconnect(); hover(); }
  }).observe(marker, {attributes: true});
})();
</script>
"""


def drive(page: Path) -> tuple[dict[str, str], str]:
    """The page in Chromium with the hover driver: the render marker's data and the title.

    The virtual time budget lets whatever the page started (an image that fails to load, and
    its ``onerror``) finish before the DOM is dumped.
    """
    assert CHROMIUM is not None
    driven = page.with_name("driven-" + page.name)
    driven.write_text(page.read_text().replace("</body>", HOVER_DRIVER + "</body>"))
    result = subprocess.run(
        [CHROMIUM, *OFFLINE, "--dump-dom", driven.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    marker = re.search(r'<span id="render-status"([^>]*)>', result.stdout)
    assert marker is not None, result.stdout[-2000:]
    data = {
        name: html.unescape(value)
        for name, value in re.findall(r'data-([a-z-]+)="([^"]*)"', marker.group(1))
    }
    title = re.search(r"<title>(.*?)</title>", result.stdout, re.S)
    assert title is not None
    return data, html.unescape(title.group(1))


def report_of(artifact: Path, *extra: str) -> Path:
    page = artifact.with_suffix(".html")
    made = asyncsoak_cli("report", str(artifact), "-o", str(page), *extra, cwd=artifact.parent)
    assert made.returncode == 0, made.stderr
    return page


@needs_plotly
@needs_chromium
def test_hover_readout_shows_hostile_process_names_as_text(tmp_path: Path) -> None:
    """Four processes of a real soak name themselves in 15-byte pieces of an ``<img onerror>``:
    hovering the timeline lists them literally, makes no element of them, runs no script."""
    artifact = soak_of_hostile_tree(tmp_path, COMM_PIECES, tmp_path / "soak.json")
    names = [p["name"] for p in json.loads(artifact.read_text())["processes"]]
    assert names[:4] == COMM_PIECES

    data, title = drive(report_of(artifact))
    assert data["state"] == "rendered"
    assert data["process-lines"] == "4"
    assert data["readout-hidden"] == "false"
    assert data["readout-elements"] == "0"
    assert title != "7"
    assert title.startswith("PASSED")
    readout = data["readout"]
    for piece in COMM_PIECES:
        assert piece in readout, readout


def hostile_artifact(source: Path, target: Path, payload: str) -> Path:
    """A copy of a real artifact with ``payload`` wherever a run's text reaches the page: a
    series field (a panel title and a line's name), a GPU group, the failure, the metadata."""
    artifact: dict[str, Any] = json.loads(source.read_text())
    tree = artifact["series"]["tree"]
    tree[f"{payload}_bytes"] = [float(2**20 * (i % 7 + 1)) for i in range(len(tree["t"]))]
    gpu = artifact["series"].setdefault(
        f"gpu0{payload}", {"t": tree["t"], "utilization_gpu_percent": [50.0] * len(tree["t"])}
    )
    gpu["utilization_gpu_percent"] = [float(i % 9) for i in range(len(tree["t"]))]
    artifact["metadata"] = {"run": payload}
    for failure in artifact["failures"]:
        failure["message"] += payload
    for event in artifact["events"]:
        if event["kind"] == "failure":
            event["reason"] = f"{event['reason']}{payload}"
            event["message"] = f"{event['message']}{payload}"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(artifact))
    return target


#: Markup plotly would draw from its strings (a link, a styled span), and markup the page's
#: own HTML or the readout would run.
PAYLOAD = "<a href='javascript:document.title=8'>x</a><img src=x onerror=document.title=9>"


@needs_plotly
@needs_chromium
def test_panel_titles_names_and_baseline_names_show_as_text(tmp_path: Path) -> None:
    """A run whose series field, GPU group, failure and metadata hold markup, compared with a
    baseline whose file name holds markup: titles, the readout, the lane and the comparison
    show it literally; no element of it is made, no script of it runs."""
    artifact = soak_of_hostile_tree(tmp_path, ["worker"] * 4, tmp_path / "run" / "soak.json")
    hostile = hostile_artifact(artifact, tmp_path / "hostile" / "soak.json", PAYLOAD)
    # A file name holds no "/": the baseline's name carries the image alone.
    baseline = tmp_path / "base" / "base<img src=x onerror=document.title=10>.json"
    hostile_artifact(artifact, baseline, PAYLOAD)
    page = report_of(hostile, "--compare", str(baseline))

    data, title = drive(page)
    assert data["state"] == "rendered"
    assert title not in ("8", "9", "10")
    assert data["readout-elements"] == "0"
    assert PAYLOAD in data["readout"]
    assert any(PAYLOAD in t for t in data["titles"].split("|")), data["titles"]
    text = page.read_text()
    # The page's own HTML holds the payload only escaped.
    assert "<img src=x" not in text.replace("\\u003cimg", "")
    assert f"Against the baseline {html.escape(str(baseline))}" in text


def soak_of_hostile_tree(tmp_path: Path, pieces: list[str], artifact: Path) -> Path:
    """``asyncsoak run`` over HOSTILE_TREE whose processes name themselves ``pieces``."""
    script = tmp_path / "train.py"
    script.write_text(HOSTILE_TREE.format(pieces=pieces))
    run = asyncsoak_cli(
        "run", "--progress-dir", str(tmp_path / "progress"), "--output", str(artifact),
        "--sample-interval", "0.1", "--no-gpu", "--", sys.executable, str(script),
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return artifact
