"""``asyncsoak watch``: attach to a soak already running (another process's), show its live
state from its journal, end with its verdict; ``--once`` prints one frame."""

from __future__ import annotations

import importlib.util
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsoak._view._live_line import FINAL_VERDICT_ROWS

from .conftest import CLI_ENV, ReadyFifo, asyncsoak_cli, py
from .soak_runs import killed_monitor_journal, run_args, stalled_soak

LEAK_TREND = {"verdict": "leak", "slope_per_hour": 54 * 2**30, "growth": 2**30}
#: Makes progress, says "ready", goes on making progress until the ``end`` file exists.
HOLD = """
import os, pathlib, sys, time
progress, end, signals = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
progress.mkdir(exist_ok=True)
told = False
while not end.exists():
    with open(progress / "metrics.jsonl", "a") as f:
        f.write("{}\\n")
    if not told:
        fd = os.open(signals, os.O_WRONLY); os.write(fd, b"ready\\n"); os.close(fd)
        told = True
    time.sleep(0.05)
"""


def _readline(stream: subprocess.Popen[str], deadline: float) -> str:
    assert stream.stdout is not None
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([stream.stdout], [], [], left)[0]:
        raise TimeoutError("no line from asyncsoak watch in time")
    return stream.stdout.readline()


@pytest.mark.slow
def test_watch_shows_a_running_soak_then_ends_with_its_verdict(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A soak run by another process: --once prints one frame of its live state and exits 0;
    watch follows it (running, its progress) and ends with the verdict, exit status 0."""
    args = [a for a in run_args(tmp_path) if a != "--sample-interval"]
    args[args.index("0.1")] = "--sample-interval=0.2"
    end = tmp_path / "end"
    # Made before the soak starts: the watchdog's first word is then that it exists (made by
    # the child, a frame at the first flush may still say "does not exist (yet)").
    (tmp_path / "progress").mkdir()
    soak = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncsoak",
            *args,
            "--",
            *py(HOLD),
            str(tmp_path / "progress"),
            str(end),
            str(ready.path),
        ],
        cwd=tmp_path,
        env=CLI_ENV,
        stderr=subprocess.DEVNULL,
    )
    watch: subprocess.Popen[str] | None = None
    try:
        assert ready.line_sync() == "ready"
        once = asyncsoak_cli("watch", "--once", str(tmp_path / "soak.json"), cwd=tmp_path)
        assert once.returncode == 0, once.stderr
        (frame,) = once.stdout.splitlines()
        assert frame.startswith("asyncsoak: "), frame
        assert " running | " in frame or " waiting for the first progress | " in frame, frame
        assert "finished" not in frame

        watch = subprocess.Popen(
            [sys.executable, "-m", "asyncsoak", "watch", str(tmp_path), "--status-interval", "0.2"],
            cwd=tmp_path,
            env=CLI_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        # Live: the soak runs and the view follows its progress.
        while " running | last progress " not in (line := _readline(watch, deadline)):
            assert "finished" not in line, line
        end.touch()
        rest, errors = watch.communicate(timeout=30)
        out = [line.rstrip("\n"), *rest.splitlines()]
        assert watch.returncode == 0, [*out, errors]
        assert any("finished: passed" in line for line in out), out
        assert out[-1] == f"asyncsoak: PASSED: The soak passed; artifact: {tmp_path / 'soak.json'}"
    finally:
        end.touch()
        if watch is not None and watch.returncode is None:
            watch.kill()
            watch.communicate()
        soak.wait(timeout=30)
    assert soak.returncode == 0


@pytest.mark.slow
def test_watch_of_a_dead_monitor_says_so_and_fails(tmp_path: Path) -> None:
    """A journal whose monitor was killed: no verdict will come; watch says how to recover."""
    journal = killed_monitor_journal(tmp_path / "killed")
    result = asyncsoak_cli("watch", str(journal), cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "is gone and never gave a verdict" in result.stdout
    assert f"asyncsoak recover {journal}" in result.stdout
    once = asyncsoak_cli("watch", "--once", str(journal), cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    assert "as of " in once.stdout  # the journal's last line is old: the frame says so


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "watch needs one TARGET"),
        (["nowhere.json"], "nowhere.json: no such file"),
        (["--db", "x.db", "a.json"], "--db goes with --job"),
        (["--once", "--status-interval", "0", "a.json"], "--status-interval"),
    ],
)
def test_watch_refuses_bad_targets_clearly(tmp_path: Path, args: list[str], message: str) -> None:
    """No target, a missing one, --db without --job, a bad interval: exit 2 and one line."""
    result = asyncsoak_cli("watch", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="needs the live extra")
def test_the_full_screen_fits_the_terminal_and_shows_what_matters(tmp_path: Path) -> None:
    """The full screen at 100x30: verdict so far, LEAK, progress, processes by memory with
    their trends, GPUs, and the log's last lines (as many as fit), never taller than 30."""
    from rich.console import Console

    from asyncsoak._view._live_line import render_screen
    from asyncsoak._view._live_state import LiveState

    from .soak_runs import sample_lines

    log = tmp_path / "soak.log"
    log.write_text("".join(f"step {i} loss {1 / (i + 1):.3f}\n" for i in range(200)))
    state = LiveState()
    state.add(
        {
            "t": 0,
            "kind": "header",
            "started_at": "2026-01-01T00:00:00Z",
            "config": {"stale_progress_seconds": 120.0},
            "log_path": str(log),
        }
    )
    state.add({"t": 0.1, "kind": "started", "pid": 1})
    for i, event in enumerate(sample_lines(end=10.0, stall_at=None, gpus=2)):
        if event["kind"] == "sample":
            grown = {"pid": 29987, "name": "python", "anon_bytes": 2**30 + i * 2**24}
            steady = {"pid": 30001, "name": "pt_data_worker", "anon_bytes": 2**28}
            event = {**event, "processes": [steady, grown]}
        state.add(event)
    state.add({"t": 2.0, "kind": "progress", "changed": 1})
    state.add({"t": 9.0, "kind": "trend", "series": "process.29987.anon_bytes"} | LEAK_TREND)
    state.add({"t": 9.5, "kind": "warning", "message": "memory of pid 29987 grew"})
    assert state.started_at is not None
    status = state.status(state.started_at + 12.0)
    console = Console(record=True, width=100, height=30, color_system=None)
    console.print(render_screen(status, 100, 30))
    lines = console.export_text().rstrip("\n").splitlines()
    text = "\n".join(lines)
    assert len(lines) <= 30, text
    assert "running" in lines[0]
    assert "1 warning" in lines[0]
    assert "LEAK pid 29987 +921.6 MiB/min" in text
    assert "without progress (limit 2m00s)" in text
    # The largest process first, with its trend; then the GPUs; then the log's end.
    assert text.index("29987") < text.index("30001")
    assert "/min" in next(line for line in lines if "29987" in line and "python" in line)
    assert "gpu1" in text
    assert "step 199 loss 0.005" in lines[-1]


@pytest.mark.slow
def test_watch_reads_a_rotated_journal_from_its_first_segment(tmp_path: Path) -> None:
    """A long soak's journal is rotated: watch folds the closed (compressed) segments, where
    the header is, then the open one; no monitor holds it and there is no artifact: the
    verdict comes from the journal and says the artifact is missing."""
    import gzip

    from asyncsoak._record._journal import JournalEncoder, segment_path

    from .soak_runs import sample_lines

    header = {
        "t": 0.0,
        "kind": "header",
        "started_at": "2026-01-01T00:00:00Z",
        "config": {"stale_progress_seconds": 120.0},
    }
    samples = sample_lines(end=10.0, stall_at=None, gpus=1)
    first = [header, {"t": 0.1, "kind": "started", "pid": 1}, *samples[:40]]
    first += [{"t": 1.0 + i, "kind": "progress", "changed": 1} for i in range(3)]
    second = [*samples[40:], {"t": 9.0, "kind": "progress", "changed": 2}]
    second += [{"t": 9.5, "kind": "warning", "message": "a warning"}]
    second += [{"t": 10.5, "kind": "finished", "status": "passed"}]
    encoder = JournalEncoder()
    journal = tmp_path / "soak.jsonl"
    closed = segment_path(journal, 1, compressed=True)
    closed.write_bytes(gzip.compress("".join(map(encoder.encode, first)).encode()))
    encoder.reset()
    journal.write_text("".join(map(encoder.encode, second)))
    once = asyncsoak_cli("watch", "--once", str(journal), cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    assert once.stdout.startswith("asyncsoak: 10.5s finished: passed with warnings | peak CPU ")
    followed = asyncsoak_cli("watch", str(journal), cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    last = followed.stdout.splitlines()[-1]
    assert last == f"asyncsoak: PASSED WITH WARNINGS; no artifact at {tmp_path / 'soak.json'}"


@pytest.mark.slow
def test_watch_behind_the_journal_reads_to_its_end_before_calling_the_monitor_gone(
    tmp_path: Path,
) -> None:
    """The monitor wrote a long backlog, its verdict, and let go of its journal while the
    view was seconds behind (a loaded machine): watch reads to the end and gives the
    verdict; it does not call the monitor gone."""
    import fcntl
    import os

    from asyncsoak._record._journal import JournalEncoder

    encoder = JournalEncoder()
    journal = tmp_path / "soak.jsonl"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    header = {"t": 0.0, "kind": "header", "started_at": now, "config": {}}
    journal.write_text(encoder.encode(header) + encoder.encode({"t": 0.1, "kind": "started"}))
    lock = os.open(journal, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as the monitor holds it
    watch = subprocess.Popen(
        [sys.executable, "-m", "asyncsoak", "watch", str(journal), "--status-interval", "60"],
        cwd=tmp_path,
        env=CLI_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "starting" in _readline(watch, time.monotonic() + 30)
        # 48 MiB of progress (the view reads 4 MiB a refresh: six seconds of reading).
        line = encoder.encode({"t": 1.0, "kind": "progress", "changed": 1, "paths": ["x" * 2**16]})
        with journal.open("a") as f:
            for _ in range(48 * 2**20 // len(line)):
                f.write(line)
            f.write(encoder.encode({"t": 2.0, "kind": "finished", "status": "passed"}))
        os.close(lock)  # the monitor is done
        out, errors = watch.communicate(timeout=60)
    finally:
        if watch.returncode is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, out + errors
    assert "is gone" not in out
    assert out.splitlines()[-1] == f"asyncsoak: PASSED; no artifact at {tmp_path / 'soak.json'}"


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="needs the live extra")
def test_the_full_screens_last_frame_leaves_room_for_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last frame of the full screen, on a 100x30 terminal, is shorter than the terminal
    by the verdict's lines printed after it: its first row (the verdict so far) stays on
    screen instead of being scrolled off."""
    import io

    from asyncsoak._view._live import RichView
    from asyncsoak._view._live_state import LiveState

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "30")
    log = tmp_path / "soak.log"
    log.write_text("".join(f"step {i}\n" for i in range(200)))
    state = LiveState()
    header = {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z", "config": {}}
    for event in [
        header | {"log_path": str(log)},
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 2.0, "kind": "progress", "changed": 1},
        {"t": 9.0, "kind": "finished", "status": "passed"},
    ]:
        state.add(event)
    stream = io.StringIO()
    view = RichView(stream, screen=True)
    view.close(state.status(0.0))
    frame = stream.getvalue().rstrip("\n").splitlines()
    assert "finished: passed" in frame[0], frame
    assert len(frame) <= 30 - FINAL_VERDICT_ROWS, frame
    assert frame[-1].startswith("step 199"), frame
    assert "n/a" not in "\n".join(frame)  # never sampled: no placeholder peaks


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="needs the live extra")
def test_the_full_screen_shows_the_trainings_step_loss_and_rate() -> None:
    """A run whose trainer writes steps: the full screen says its step, rate and loss, as
    the line does, running and in its last frame (a NaN as ``loss nan``)."""
    from rich.console import Console

    from asyncsoak._view._live_line import render_screen
    from asyncsoak._view._live_state import LiveState

    state = LiveState()
    header = {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z", "config": {}}
    step = {"kind": "step", "source": "m.jsonl", "source_kind": "jsonl", "gap_seconds": 0.1}
    for event in [
        header,
        {"t": 0.1, "kind": "started", "pid": 1},
        *({"t": 1.0 + i, **step, "step": 10 * i, "loss": 2.5 - i / 10} for i in range(5)),
    ]:
        state.add(event)
    started = state.started_at
    assert started is not None

    def screen() -> str:
        console = Console(record=True, width=100, height=30, color_system=None)
        console.print(render_screen(state.status(started + 5.0), 100, 30))
        return console.export_text()

    running = screen()
    assert "step 40" in running, running
    assert "loss 2.1" in running, running
    state.add({"t": 5.5, **step, "step": 50, "loss": None, "nonfinite_loss": "nan"})
    state.add({"t": 6.0, "kind": "finished", "status": "failed"})
    assert "loss nan" in screen(), screen()


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="needs the live extra")
def test_the_full_screen_counts_down_to_the_nearest_deadline_then_ends_with_the_reason() -> None:
    """With ``--expect-every`` due before the stale limit, the full screen says the deadline
    as the line does; its last frame starts with the verdict and the failure's reason."""
    from rich.console import Console

    from asyncsoak._view._live_line import render_screen
    from asyncsoak._view._live_state import LiveState

    state = LiveState()
    config = {"stale_progress_seconds": 120.0, "expect_every": {"checkpoint-*": 62.0}}
    step = {"kind": "step", "source": "m.jsonl", "source_kind": "jsonl", "gap_seconds": 0.1}
    for event in [
        {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z", "config": config},
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 1.0, **step, "step": 1, "loss": 2.0},
    ]:
        state.add(event)
    started = state.started_at
    assert started is not None

    def screen() -> list[str]:
        console = Console(record=True, width=100, height=30, color_system=None)
        console.print(render_screen(state.status(started + 1.0), 100, 30))
        return [row.rstrip() for row in console.export_text().splitlines()]

    assert "deadline  checkpoint-* due in 1m02s" in screen(), screen()
    at = "2026-01-01T00:01:04Z"
    state.add({"t": 64.0, "kind": "failure", "reason": "overdue", "message": "late", "at": at})
    state.add({"t": 65.0, "kind": "finished", "status": "failed"})
    last = screen()
    assert "finished: failed (overdue)" in last[0], last
    assert not any(row.startswith("deadline") for row in last), last


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="needs the live extra")
def test_the_full_screen_at_its_narrowest_keeps_its_row_labels_whole() -> None:
    """At 60 columns (the narrowest the full screen takes), a long stall row is cut at its
    end, never the row's label (``prog…``)."""
    from rich.console import Console

    from asyncsoak._view._live import SCREEN_MIN_COLUMNS
    from asyncsoak._view._live_line import render_screen
    from asyncsoak._view._live_state import LiveState

    state = LiveState()
    header = {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z"}
    for event in [
        header | {"config": {"stale_progress_seconds": 7200.0}},
        {"t": 0.1, "kind": "started", "pid": 1},
        *({"t": 1.0 + i, "kind": "progress", "changed": 1} for i in range(40)),
    ]:
        state.add(event)
    assert state.started_at is not None
    width = SCREEN_MIN_COLUMNS
    console = Console(record=True, width=width, height=20, color_system=None)
    console.print(render_screen(state.status(state.started_at + 3000.0), width, 20))
    rows = console.export_text().splitlines()
    assert any(row.startswith("progress  40 changes") for row in rows), rows
    assert any(row.startswith("stall ") for row in rows), rows


@pytest.mark.slow
def test_watchs_last_line_of_a_failed_run_names_its_reason(tmp_path: Path) -> None:
    """The verdict ``watch`` ends with says why the run failed, not only that it did."""
    artifact = stalled_soak(tmp_path / "stalled")
    followed = asyncsoak_cli("watch", str(artifact.with_suffix(".jsonl")), cwd=tmp_path)
    assert followed.returncode == 1, followed.stderr
    last = followed.stdout.splitlines()[-1]
    assert last == (
        "asyncsoak: FAILED: The training stopped making progress (stale_progress); "
        f"artifact: {artifact}"
    )
