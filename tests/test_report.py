"""`asyncsoak report` and `recover` on real runs; the HTML checked in a real headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from jsonschema import Draft202012Validator

from asyncsoak._contract import EventKind
from asyncsoak._record._recover import JournalError, artifact_from_journal
from asyncsoak._view.report import detail_for, read_journal_detail, render_report
from asyncsoak._view.report._figure import Timeline
from asyncsoak._view.report._panels import plan_panels
from asyncsoak._view.report._timeline import artifact_detail

from .conftest import CLI_ENV, assert_valid, asyncsoak_cli
from .soak_runs import Runs, make_runs

if TYPE_CHECKING:
    from asyncsoak._contract import Artifact

needs_plotly = pytest.mark.skipif(
    importlib.util.find_spec("plotly") is None,
    reason="the report needs the report extra (pip install 'asyncsoak[report]')",
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
)
#: Chromium with no network at all: every host fails to resolve and the proxy is a dead port.
OFFLINE = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--enable-logging=stderr",
    "--v=0",
    # The page decompresses plotly.js before it draws: wait for that, however loaded the machine.
    "--virtual-time-budget=10000",
]
#: Panels the sampled stalled run must show (the samplers' known fields that move; the flat
#: ones, such as the tree's one process and thread, fold into the "steady" line).
EXPECTED_TITLES = [
    "What happened",
    "Time since the last progress (seconds)",
    "Process tree CPU (100% = one core)",
    "Process tree memory",
    "Machine memory",
    "GPU utilisation",
    "GPU power",
    "GPU temperature",
]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("runs"))


def report(run: Path, out: Path) -> Path:
    result = asyncsoak_cli("report", str(run), "-o", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stderr
    assert out.as_uri() in result.stdout
    return out


def chromium(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *OFFLINE, *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
    )


def rendered(page: Path) -> dict[str, str]:
    """The page's render marker after its scripts ran, and the errors the page caught."""
    result = chromium(page, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Uncaught" not in result.stderr, result.stderr[-2000:]
    assert not re.search(r"CONSOLE.*(Error|error)", result.stderr), result.stderr[-2000:]
    errors = re.search(r'<pre id="page-errors"([^>]*)>(.*?)</pre>', result.stdout, re.S)
    assert errors is not None
    assert errors.group(2) == "", errors.group(2)
    marker = re.search(r'<span id="render-status"([^>]*)>', result.stdout)
    assert marker is not None
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', marker.group(1)))


@pytest.mark.slow
@needs_plotly
def test_report_is_one_offline_file(runs: Runs, tmp_path: Path) -> None:
    """The report fetches nothing: no external script, stylesheet, font or import."""
    page = report(runs.stalled_sampled, tmp_path / "stalled.html").read_text()
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert "@import" not in page
    assert not re.search(r"url\(\s*['\"]?https?:", page)
    assert "Plotly.newPlot" in page


@pytest.mark.slow
@needs_plotly
@needs_chromium
def test_stalled_soak_report_draws_every_plot(runs: Runs, tmp_path: Path) -> None:
    """Offline Chromium draws every panel of a stalled soak with samples, and the stall band."""
    page = report(runs.stalled_sampled, tmp_path / "stalled.html")
    marker = rendered(page)
    assert marker["state"] == "rendered"
    titles = marker["titles"].split("|")
    for title in EXPECTED_TITLES:
        assert title in titles, titles
    artifact = json.loads(runs.stalled_sampled.read_text())
    panels = 2 + len(Timeline(artifact, None).panels)
    assert int(marker["subplots"]) == panels
    steady = re.search(r'<p class="steady">(.*?)</p>', page.read_text())
    assert steady is not None
    # One process all along: folded into the strip, unless a sample caught the tree with
    # another (a loaded machine's slow exit), when its panel is drawn instead.
    assert "processes 1" in steady.group(1) or "Processes and threads in the tree" in titles
    # Each GPU's memory held flat: folded too, as flat GPU lines are.
    assert "GPU 0 memory used 39.1 GiB" in steady.group(1)
    assert "GPU memory used" not in titles
    assert any(t.startswith("no progress for") for t in titles), titles
    labels = marker["labels"].split("|")
    assert {"started", "stale_progress", "exit: SIGTERM"} <= set(labels)
    # The stop, the forensics and the signal fall together: one label, the signal's, with
    # the others counted (their hovers kept), so no label is drawn over another.
    assert any(re.fullmatch(r"SIGTERM( \+\d)?", label) for label in labels), labels
    screenshot = tmp_path / "stalled.png"
    shot = chromium(page, f"--screenshot={screenshot}", "--window-size=1400,2400")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@needs_plotly
@needs_chromium
def test_passing_soak_draws_the_samplers_figures(runs: Runs, tmp_path: Path) -> None:
    """A passing run sampled by the real samplers (GPUs through the fake nvidia-smi): every
    known panel is drawn, the GPUs are named, and there is no stall."""
    page = report(runs.passing, tmp_path / "passing.html")
    marker = rendered(page)
    assert marker["state"] == "rendered"
    titles = marker["titles"].split("|")
    for title in EXPECTED_TITLES:
        if title.startswith("GPU"):
            continue  # the fake's GPUs may hold flat through so short a run: see below
        assert title in titles, titles
    assert not any(t.startswith("no progress for") for t in titles)
    text = page.read_text()
    assert "NVIDIA H200" in text
    steady = re.search(r'<p class="steady">(.*?)</p>', text)
    # Every GPU figure is drawn or, flat, named in the steady strip.
    for title, label in (("GPU utilisation", "utilisation"), ("GPU power", "power")):
        assert title in titles or (steady is not None and f"GPU 1 {label}" in steady.group(1))


@pytest.mark.slow
@needs_plotly
@needs_chromium
def test_run_without_samples_draws_its_timeline(runs: Runs, tmp_path: Path) -> None:
    """An artifact without any series still gets the lane and the progress panel."""
    artifact = json.loads(runs.stalled.read_text())
    artifact["series"] = {}
    page = tmp_path / "bare.html"
    page.write_text(render_report(artifact))
    marker = rendered(page)
    assert marker["state"] == "rendered"
    assert marker["titles"].split("|")[:2] == EXPECTED_TITLES[:2]
    assert marker["subplots"] == "2"


@pytest.mark.slow
@needs_plotly
@needs_chromium
def test_killed_monitor_journal_gets_a_report(runs: Runs, tmp_path: Path) -> None:
    """A journal whose monitor died renders, marked monitor_lost where the journal ends."""
    page = report(runs.killed_journal, tmp_path / "killed.html")
    marker = rendered(page)
    assert marker["state"] == "rendered"
    assert "monitor_lost" in marker["labels"].split("|")
    assert "The monitor died before the run finished" in page.read_text()


@pytest.mark.slow
@needs_plotly
def test_missing_artifact_is_rebuilt_from_its_journal(runs: Runs, tmp_path: Path) -> None:
    """`report soak.json` when only soak.jsonl exists reads the journal and says so."""
    missing = runs.killed_journal.with_suffix(".json")
    result = asyncsoak_cli("report", str(missing), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "reading its journal" in result.stderr
    assert "monitor_lost" in (tmp_path / "r.html").read_text()


@pytest.mark.slow
@needs_plotly
def test_stalled_report_names_the_stall(runs: Runs) -> None:
    """The page's header says the reason in plain words, and when progress stopped."""
    page = render_report(json.loads(runs.stalled.read_text()))
    assert "The training stopped making progress" in page
    assert "stale_progress" in page
    assert "Progress stopped" in page
    assert "waiting for the other ranks" in page  # the log tail


@pytest.mark.slow
def test_throttle_spans_come_from_the_artifact_as_from_the_journal(runs: Runs) -> None:
    """GPU throttling becomes spans with their reasons, the artifact's within its resolution
    of the journal's; idle is not throttling."""
    journal = runs.stalled_sampled.with_suffix(".jsonl")
    detail = read_journal_detail(journal)
    assert set(detail.throttle_spans) == {"gpu0"}
    [(start, end, reasons)] = detail.throttle_spans["gpu0"]
    assert 0 < start < end
    assert reasons == ["hw_slowdown", "sw_thermal"]
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [b.last for b in detail.progress] == [e["t"] for e in lines if e["kind"] == "progress"]
    kept = artifact_detail(json.loads(runs.stalled_sampled.read_text()))
    assert kept is not None
    [(kept_start, kept_end, kept_reasons)] = kept.throttle_spans["gpu0"]
    assert kept_reasons == reasons
    assert kept_start <= start < end <= kept_end + 1.0
    assert [b.last for b in kept.progress] == pytest.approx(
        [b.last for b in detail.progress], abs=1e-3
    )


def test_unknown_series_get_their_own_panels() -> None:
    """Fields no panel knows are still drawn, one panel per group and unit; a size's unit is
    left to the axis, which chooses it from the data."""
    panels = plan_panels(
        {
            "tree": {"t": [0, 1], "cpu_percent": [1, 2], "io_wait_seconds": [0, 1]},
            "net": {"t": [0, 1], "rx_bytes": [1, 2], "tx_bytes": [1, None], "empty": [None, None]},
        }
    )
    titles = [p.title for p in panels]
    assert titles == [
        "Process tree CPU (100% = one core)",
        "Process tree: io wait (s)",
        "net: rx, tx",
    ]


@pytest.mark.slow
def test_report_without_plotly_says_how_to_get_it(runs: Runs, tmp_path: Path) -> None:
    """Without the report extra, `report` exits 2 naming the extra, and writes nothing."""
    hide_plotly = (
        "import sys; sys.modules['plotly'] = None; from asyncsoak.cli import main; "
        f"sys.exit(main(['report', {str(runs.passing)!r}, '-o', {str(tmp_path / 'r.html')!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide_plotly], env=CLI_ENV, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "asyncsoak[report]" in result.stderr
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_report_of_something_else_is_a_usage_error(tmp_path: Path) -> None:
    """A file that is neither an artifact nor a journal exits 2 with a message."""
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    result = asyncsoak_cli("report", str(other), cwd=tmp_path)
    assert result.returncode == 2
    assert "not an asyncsoak artifact or journal" in result.stderr


# -- recover ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_recover_writes_a_valid_monitor_lost_artifact(
    runs: Runs, tmp_path: Path, schema: Draft202012Validator
) -> None:
    """`recover` rebuilds a schema-valid artifact: failed, monitor_lost, the progress seen."""
    out = tmp_path / "rebuilt.json"
    result = asyncsoak_cli("recover", str(runs.killed_journal), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    artifact = json.loads(out.read_text())
    assert_valid(artifact, schema)
    assert artifact["status"] == "failed"
    assert [f["reason"] for f in artifact["failures"]] == ["monitor_lost"]
    journal = [json.loads(line) for line in runs.killed_journal.read_text().splitlines()]
    assert artifact["progress"]["changes"] == sum(
        e["changed"] for e in journal if e["kind"] == "progress"
    )
    assert artifact["progress"]["changes"] >= 1
    assert "step 2" in artifact["log"]["tail"]


@pytest.mark.slow
def test_recover_does_not_overwrite_an_artifact(runs: Runs, tmp_path: Path) -> None:
    """Without -o, `recover` refuses to replace the artifact beside the journal."""
    journal = runs.stalled.with_suffix(".jsonl")
    before = runs.stalled.read_bytes()
    result = asyncsoak_cli("recover", str(journal), cwd=tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert runs.stalled.read_bytes() == before


@pytest.mark.slow
def test_finished_journal_keeps_its_verdict(runs: Runs, schema: Draft202012Validator) -> None:
    """A journal with its `finished` line rebuilds to the monitor's own verdict."""
    artifact = artifact_from_journal(runs.stalled.with_suffix(".jsonl"))
    assert_valid(artifact, schema)
    original = json.loads(runs.stalled.read_text())
    assert artifact["status"] == original["status"] == "failed"
    assert artifact["failures"] == original["failures"]
    assert artifact["exit"] == original["exit"]


@pytest.mark.slow
def test_truncated_last_line_is_skipped(runs: Runs, tmp_path: Path) -> None:
    """A journal cut mid-line (the monitor died writing) still rebuilds; the line is counted."""
    journal = tmp_path / "soak.jsonl"
    journal.write_bytes(runs.killed_journal.read_bytes() + b'{"t": 1.0, "kind": "progr')
    artifact = artifact_from_journal(journal)
    assert artifact["monitor"]["unreadable_journal_lines"] == 1
    assert artifact["failures"][0]["reason"] == "monitor_lost"


def test_file_without_header_is_not_a_journal(tmp_path: Path) -> None:
    """A file with no header line is refused with JournalError."""
    journal = tmp_path / "soak.jsonl"
    journal.write_text('{"t": 0.1, "kind": "started", "pid": 1, "reaper_pid": 2}\n')
    with pytest.raises(JournalError, match="no header"):
        artifact_from_journal(journal)


def _before_bins(artifact: Artifact) -> Artifact:
    """The artifact as a writer before ``progress.bins`` wrote it."""
    progress = {k: v for k, v in artifact["progress"].items() if k != "bins"}
    return cast("Artifact", {**artifact, "progress": progress})


def _long_run_journal(path: Path) -> Path:
    """Five hours of progress every 6 s with one 100 s gap halfway, as journal lines."""
    lines: list[dict[str, Any]] = [
        {
            "t": 0.0,
            "kind": "header",
            "command": ["train"],
            "cwd": "/",
            "config": {
                "progress_dir": "/runs/1",
                "output_path": "/runs/1/soak.json",
                "sample_interval_seconds": 5.0,
                "startup_timeout_seconds": 600.0,
                "stale_progress_seconds": 120.0,
                "post_shutdown_grace_seconds": 5.0,
                "min_duration_seconds": 0.0,
            },
            "metadata": {},
            "started_at": "2026-01-01T00:00:00.000Z",
            "snapshot": {},
            "journal_path": str(path),
            "log_path": str(path.with_suffix(".log")),
            "output_path": str(path.with_suffix(".json")),
            "monitor_pid": 1,
        },
        {"t": 0.1, "kind": "started", "pid": 2, "reaper_pid": 3},
    ]
    t = 0.0
    for i in range(3000):
        t += 100.0 if i == 1500 else 6.0
        lines.append({"t": t, "kind": "progress", "changed": 1, "paths": ["m"], "gap_seconds": 6})
    lines.append({"t": t + 1, "kind": "exited", "pid": 2, "returncode": 0, "signal": None})
    lines.append({"t": t + 1, "kind": "finished", "status": "passed"})
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines))
    return path


@needs_plotly
def test_long_run_keeps_its_gaps_within_bounds(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A long run: minutes on the axis; the artifact's progress bins keep the 100 s gap the
    events it dropped held, as the journal does for an artifact written before them."""
    from asyncsoak._view.report._timeline import PROGRESS_CURVE_POINTS

    journal = _long_run_journal(tmp_path / "soak.jsonl")
    artifact = artifact_from_journal(journal)
    assert_valid(artifact, schema)
    assert artifact["events_dropped"] > 0
    for timeline in (
        Timeline(artifact, None),
        Timeline(_before_bins(artifact), read_journal_detail(journal)),
    ):
        assert timeline.x_unit == "minutes"
        xs, ys = timeline._progress_curve()
        assert None not in xs
        assert len(xs) <= 3 * PROGRESS_CURVE_POINTS + 2
        assert max(y for y in ys if y is not None) == pytest.approx(100.0)
    # An older artifact alone: the dropped stretch is a break in the curve, not an invented gap.
    xs, ys = Timeline(_before_bins(artifact), None)._progress_curve()
    assert None in xs
    assert max(y for y in ys if y is not None) < 100
    assert "Plotly.newPlot" in render_report(artifact, journal=journal)


def test_the_report_reads_from_the_journal_only_what_the_artifact_lacks(tmp_path: Path) -> None:
    """A day's journal is mostly samples: the report takes every progress change from the
    artifact's bins and reads no journal line; an artifact written before them has the
    others read from the journal's progress lines, and the samples' lines only when it says
    a GPU was held back; so a damaged sample line costs it nothing."""
    journal = _long_run_journal(tmp_path / "soak.jsonl")
    artifact = artifact_from_journal(journal)
    every = [b.last for b in read_journal_detail(journal).progress]
    with journal.open("a") as f:
        f.write('{"t":1.0,"kind":"gpu_sample","v":[]}\n')
        f.write('{"t":2.0,"kind":"gpu_sample","~":{"{":{"v":{"[":[],"n":3000000000}}}}\n')
    older = _before_bins(artifact)
    detail = detail_for(older, journal)
    assert detail is not None
    assert [b.last for b in detail.progress] == every
    assert detail.throttle_spans == {}
    # Every event kept: the artifact's progress times, the journal's lines not read at all.
    events = older["events"][:40]
    kept = cast("Artifact", {**older, "events_dropped": 0, "events": events})
    journal.write_text("not a journal line\n")
    short = detail_for(kept, journal)
    assert short is not None
    assert [b.last for b in short.progress] == [
        e["t"] for e in events if e["kind"] == EventKind.PROGRESS
    ]
    # The artifact's own bins: every change counted, the gap kept, no journal needed.
    binned = detail_for(artifact, None)
    assert binned is not None
    assert 500 <= len(binned.progress) <= 1000
    assert sum(b.changes for b in binned.progress) == len(every)
    assert max(b.longest_gap for b in binned.progress) == pytest.approx(100.0)


@needs_plotly
def test_a_day_long_runs_progress_strip_bins_its_changes(tmp_path: Path) -> None:
    """Five hours of changes every 6 s: the strip draws one tick per bin of the run, each
    naming how many changes it holds, the figure draws no line per change across the panels,
    and the page is at most 3 MB."""
    from asyncsoak._view.report._timeline import PROGRESS_TICKS

    journal = _long_run_journal(tmp_path / "soak.jsonl")
    artifact = artifact_from_journal(journal)
    timeline = Timeline(artifact, None)
    ticks = timeline._progress_ticks()
    assert len(ticks) <= PROGRESS_TICKS < sum(b.changes for b in timeline.progress)
    assert all(re.match(r"\d+ progress changes, ", text) for _, text in ticks)
    page = render_report(artifact, journal=journal)
    assert len(page.encode()) <= 3_000_000
    assert page.count('"type":"line"') < 5  # the start, the exit: not 3,000 changes
