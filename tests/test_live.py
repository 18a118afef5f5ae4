"""The live view of `asyncsoak run`: read from a real pseudo-terminal, a pipe, and in-process."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak._supervisor._front import run_soak
from asyncsoak._view._live import JournalTail, watch_journal
from asyncsoak._view._live_line import Status, render_rich
from asyncsoak._view._live_state import LiveState

from .conftest import CLI_ENV, fast_limits, py
from .soak_runs import run_args, sample_lines

needs_rich = pytest.mark.skipif(
    importlib.util.find_spec("rich") is None,
    reason="the terminal view needs the live extra (pip install 'asyncsoak[live]')",
)
#: Makes progress for about 1.5 s, then exits 0.
STEADY = """
import pathlib, time
p = pathlib.Path("progress"); p.mkdir(exist_ok=True)
for i in range(15):
    (p / "m").open("a").write("x")
    time.sleep(0.1)
"""
#: Makes progress for about 0.5 s, then stalls.
STALLS = """
import pathlib, time
p = pathlib.Path("progress"); p.mkdir(exist_ok=True)
for i in range(5):
    (p / "m").open("a").write("x")
    time.sleep(0.1)
time.sleep(30)
"""


def run_argv(tmp_path: Path, *extra: str) -> list[str]:
    args = [a for a in run_args(tmp_path) if a != "--quiet"]
    return [sys.executable, "-m", "asyncsoak", *args, *extra]


def under_terminal(argv: list[str], cwd: Path, columns: int = 160) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal ``columns`` wide; everything drawn on it."""
    import fcntl
    import struct
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**CLI_ENV, "TERM": "xterm-256color", "COLUMNS": str(columns)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=secondary,
    )
    os.close(secondary)
    drawn = b""
    try:
        while select.select([primary], [], [], 60)[0]:
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            drawn += data
        returncode = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        os.close(primary)
    return returncode, drawn.decode(errors="replace")


@pytest.mark.slow
@needs_rich
def test_terminal_view_updates_in_place(tmp_path: Path) -> None:
    """On a terminal: one status redrawn in place, with phase, bar and limit, then the verdict."""
    returncode, drawn = under_terminal(
        [*run_argv(tmp_path, "--stale-progress", "5"), "--", *py(STEADY)], tmp_path
    )
    assert returncode == 0, drawn
    frames = drawn.split("\r\x1b[2K")
    assert len(frames) >= 3, drawn
    assert any("running" in f and "progress" in f and "━" in f for f in frames), drawn
    assert re.search(r"/5\.0s|stale limit 5\.0s", drawn)  # the wording the width allows
    assert any("CPU " in f and "RSS " in f for f in frames), drawn
    assert "finished: passed" in frames[-1]
    assert "asyncsoak: soak passed" in frames[-1]
    assert " | " not in drawn  # no plain status line


@pytest.mark.slow
def test_terminal_without_rich_gets_plain_lines(tmp_path: Path) -> None:
    """Without rich, a terminal gets the plain lines and no cursor movement."""
    args = run_argv(tmp_path, "--stale-progress", "5", "--status-interval", "0.3")[3:]
    code = (
        "import sys; sys.modules['rich'] = None; from asyncsoak.cli import main; "
        f"sys.exit(main({[*args, '--', *py(STEADY)]!r}))"
    )
    returncode, drawn = under_terminal([sys.executable, "-c", code], tmp_path)
    assert returncode == 0, drawn
    assert "\x1b[2K" not in drawn
    assert "running | last progress" in drawn
    assert "asyncsoak: 1" in drawn
    assert "finished: passed" in drawn


@pytest.mark.slow
def test_plain_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """In a pipe (CI, nohup): whole lines, on each phase change and every --status-interval."""
    result = subprocess.run(
        [
            *run_argv(tmp_path, "--stale-progress", "1", "--status-interval", "0.2"),
            "--",
            *py(STALLS),
        ],
        cwd=tmp_path,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "\r" not in result.stderr
    assert "\x1b[" not in result.stderr
    lines = result.stderr.splitlines()
    status = [line for line in lines if " | " in line or "finished:" in line]
    assert any(
        "running | last progress" in line and "(stale limit 1.0s)" in line for line in status
    )
    # The last line sums the run up with its peaks.
    assert "finished: failed (stale_progress) | peak CPU " in status[-1]
    assert any(" RSS " in line for line in status)
    assert lines[-2].startswith("asyncsoak: soak failed: stale_progress")


@pytest.mark.slow
def test_quiet_turns_the_view_off(tmp_path: Path) -> None:
    """--quiet: only the verdict line and the artifact path."""
    result = subprocess.run(
        [*run_argv(tmp_path, "--quiet", "--status-interval", "0.1"), "--", *py(STEADY)],
        cwd=tmp_path,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"asyncsoak: soak passed; artifact: {tmp_path / 'soak.json'}"
    ]


def test_journal_tail_takes_complete_lines_of_our_journal_only(tmp_path: Path) -> None:
    """Half-written lines wait; another monitor's journal is ignored; truncation restarts."""
    journal = tmp_path / "soak.jsonl"
    tail = JournalTail(journal, monitor_pid=123)
    assert tail.read() == []  # not there yet
    journal.write_text(json.dumps({"t": 0, "kind": "header", "monitor_pid": 999}) + "\n")
    assert tail.read() == []  # an earlier run's journal
    header = json.dumps({"t": 0, "kind": "header", "monitor_pid": 123}) + "\n"
    journal.write_text(header + '{"t": 0.1, "kind": "sta')
    assert [e["kind"] for e in tail.read()] == ["header"]
    with journal.open("a") as f:
        f.write('rted", "pid": 5}\n')
    assert tail.read() == [{"t": 0.1, "kind": "started", "pid": 5}]
    assert tail.read() == []
    journal.write_text(header)
    assert [e["kind"] for e in tail.read()] == ["header"]
    tail.close()


def _state(*events: dict[str, Any]) -> LiveState:
    state = LiveState()
    for event in events:
        state.add(event)
    return state


def test_status_shows_tree_and_gpus() -> None:
    """The status carries the latest tree CPU/RSS and per-GPU utilisation and memory."""
    header = {
        "t": 0,
        "kind": "header",
        "started_at": "2026-01-01T00:00:00Z",
        "config": {"stale_progress_seconds": 120.0, "startup_timeout_seconds": 600.0},
    }
    samples = sample_lines(end=10.0, stall_at=None, gpus=2)
    state = _state(
        header,
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 2.0, "kind": "progress", "changed": 1},
        *samples,
    )
    assert state.started_at is not None
    status = state.status(now=state.started_at + 12.0)
    assert status.phase == "running"
    assert status.quiet_for == pytest.approx(10.0)
    line = status.plain()
    assert "12.0s running | last progress 10.0s ago (stale limit 2m00s)" in line
    assert "| CPU " in line
    assert "RSS 1.5 GiB (+" in line  # the memory trend of the sampled ramp
    assert "gpu0 " in line
    assert "gpu1 " in line


@needs_rich
def test_terminal_frame_shows_the_bar_against_the_limit() -> None:
    """The rich frame: elapsed, phase, a bar of the quiet time against the limit, figures."""
    from rich.console import Console

    state = _state(
        {
            "t": 0,
            "kind": "header",
            "started_at": "2026-01-01T00:00:00Z",
            "config": {"stale_progress_seconds": 120.0},
        },
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 2.0, "kind": "progress", "changed": 1},
        *sample_lines(end=10.0, stall_at=None, gpus=1),
    )
    assert state.started_at is not None
    console = Console(record=True, width=200, color_system=None)
    console.print(render_rich(state.status(now=state.started_at + 92.0), 200))
    text = console.export_text()
    assert "1m32s running" in text
    assert "last progress 1m30s ago (stale limit 2m00s)" in text  # 200 columns: the long wording
    assert "━" in text
    assert "RSS 1.5 GiB" in text
    assert "gpu0" in text


class BrokenTerminal(io.StringIO):
    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_broken_view_does_not_touch_the_soak(tmp_path: Path) -> None:
    """A view whose writes fail ends quietly; the soak beside it passes."""
    kwargs = fast_limits(tmp_path)
    journal = kwargs["output_path"].with_suffix(".jsonl")
    view_ended = anyio.Event()

    async def view() -> None:
        await watch_journal(journal, stream=BrokenTerminal(), monitor_pid=os.getpid(), refresh=0.05)
        view_ended.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(view)
            artifact = await run_soak(command=py(STEADY), cwd=tmp_path, **kwargs)
            await view_ended.wait()
    assert artifact["status"] == "passed"


#: A journal header with the usual limits.
HEADER = {
    "t": 0,
    "kind": "header",
    "started_at": "2026-01-01T00:00:00Z",
    "config": {"stale_progress_seconds": 120.0, "startup_timeout_seconds": 600.0},
}
LEAK_EVENTS = [
    {"t": 9.0, "kind": "trend", "series": "process.29987.rss_bytes", "verdict": "leak"}
    | {"slope_per_hour": 54 * 2**30, "growth": 2**30, "projected_limit_at": None},
    {"t": 9.5, "kind": "trend", "series": "process.29987.rss_bytes"}
    | {"verdict": "breach_projected", "slope_per_hour": 54 * 2**30, "growth": 2**30}
    | {"projected_limit_at": "2026-01-01T00:41:00Z"},
]


def _terminal_text(status: Status, width: int) -> str:
    from rich.console import Console

    console = Console(record=True, width=width, color_system=None)
    console.print(render_rich(status, width))
    return console.export_text()


@needs_rich
@pytest.mark.parametrize(
    "events",
    [
        pytest.param([], id="waiting-for-progress"),
        pytest.param([{"t": 2.0, "kind": "progress", "changed": 1}], id="running"),
        pytest.param(
            [{"t": 2.0, "kind": "progress", "changed": 1}, *LEAK_EVENTS], id="leak-and-breach"
        ),
        pytest.param(
            [{"t": 2.0, "kind": "progress", "changed": 1}, {"t": 11, "kind": "finished"}],
            id="finished",
        ),
    ],
)
def test_terminal_line_fits_80_columns_with_whole_words(events: list[dict[str, Any]]) -> None:
    """At 80 columns: one line, no piece cut (each shown piece is whole), the bar dropped
    before any figure, and no label said twice."""
    state = _state(HEADER, {"t": 0.1, "kind": "started", "pid": 1})
    for event in [*events[:1], *sample_lines(end=10.0, stall_at=None, gpus=2), *events[1:]]:
        state.add({"status": "passed", **event} if event["kind"] == "finished" else event)
    assert state.started_at is not None
    status = state.status(now=state.started_at + 92.0)
    text = _terminal_text(status, 80)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) == 1, text
    assert len(lines[0].rstrip()) <= 80
    assert "…" not in text
    # Each piece shown whole, in one of its wordings, the phase first.
    wordings = sorted({w for p in status.pieces() for w in p.forms}, key=len, reverse=True)
    assert text.startswith(status.pieces()[0].text)
    rest = text
    for wording in wordings:
        rest = rest.replace(wording, "")
    assert set(rest.strip()) <= {" ", "━", "╸", "╺"}, rest  # only separators and the bar
    assert text.count("first progress") <= 1
    if events and events[-1].get("kind") == "trend":
        # The LEAK and the stall countdown are the last pieces a short line gives up.
        assert "LEAK pid 29987 +921.6 MiB/min" in text
        assert "no progress 1m30s/2m00s" in text
    if events and events[-1].get("kind") == "finished":
        assert "peak CPU " in text


def test_final_line_has_the_peaks_not_the_last_sample() -> None:
    """Once finished, the line gives the run's peaks: a tree idle at the end reads busy."""
    samples = sample_lines(end=10.0, stall_at=5.0, gpus=1)
    state = _state(HEADER, {"t": 0.1, "kind": "started", "pid": 1}, *samples)
    state.add({"t": 11.0, "kind": "finished", "status": "passed"})
    assert state.started_at is not None
    line = state.status(now=state.started_at + 11.0).plain()
    peak_cpu = max(s["points"]["tree"]["cpu_percent"] for s in samples if s["kind"] == "sample")
    assert f"peak CPU {peak_cpu:.0f}%" in line
    assert "CPU 0%" not in line
    assert "gpu0 peak " in line


@pytest.mark.slow
@needs_rich
def test_real_terminal_80_columns_never_cuts_a_word(tmp_path: Path) -> None:
    """A real soak on an 80-column pseudo-terminal: every frame fits, nothing is cut."""
    returncode, drawn = under_terminal(
        [*run_argv(tmp_path, "--stale-progress", "5"), "--", *py(STEADY)], tmp_path, columns=80
    )
    assert returncode == 0, drawn
    frames = [f for f in drawn.split("\r\x1b[2K") if "running" in f or "finished" in f]
    assert frames, drawn
    for frame in frames:
        visible = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame).splitlines()[0]
        assert len(visible.rstrip()) <= 80, visible
        assert "…" not in visible


@pytest.mark.asyncio
async def test_a_view_that_fails_says_why(tmp_path: Path) -> None:
    """A view that cannot go on (its journal is a directory here) says so in one line."""
    journal = tmp_path / "soak.jsonl"
    journal.mkdir()
    stream = io.StringIO()
    with anyio.fail_after(30):
        await watch_journal(journal, stream=stream, monitor_pid=os.getpid(), refresh=0.05)
    assert stream.getvalue().startswith("asyncsoak: the live view stopped: IsADirectoryError")


@pytest.mark.parametrize(
    ("rise_per_minute", "expected"),
    [(0.0, "steady"), (10 * 2**20, "+10.0 MiB/min"), (-10 * 2**20, "-10.0 MiB/min")],
)
def test_memory_trend_follows_the_floor_of_the_tree_rss(
    rise_per_minute: float, expected: str
) -> None:
    """A cache filling and emptying every 10 s reads steady; the floor under it moving
    10 MiB a minute reads as that rate."""
    state = LiveState()
    for i in range(300):
        rss = 2**30 + (i % 10) * 10 * 2**20 + rise_per_minute / 60 * i
        state.add({"t": float(i), "kind": "sample", "points": {"tree": {"rss_bytes": rss}}})
    assert state.memory_trend() == expected


def test_a_withdrawn_leak_leaves_the_live_line() -> None:
    """The soak's judgement withdrew its leak call (a ramp that plateaued, a leak that
    stopped): the live line no longer says LEAK, as the verdict will not."""
    state = _state(HEADER, {"t": 0.1, "kind": "started", "pid": 1}, *LEAK_EVENTS)
    assert state.started_at is not None
    assert any(a.startswith("LEAK pid 29987") for a in state.alerts(state.started_at + 10.0))
    state.add(
        {"t": 30.0, "kind": "trend", "series": "process.29987.rss_bytes", "verdict": "withdrawn"}
        | {"slope_per_hour": None, "growth": None, "projected_limit_at": None}
    )
    assert state.alerts(state.started_at + 31.0) == ()


def test_the_last_frame_names_the_primary_reason_first_as_the_artifact_does() -> None:
    """A trainer killed by its GPU's fault exits non-zero first: the last frame leads with
    gpu_fault, the artifact's primary reason, folded from the same events."""
    from asyncsoak._record import RunState

    at = "2026-01-01T00:00:01Z"
    events = [
        {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z", "config": {}},
        {"t": 1.0, "kind": "failure", "reason": "nonzero_exit", "message": "exited", "at": at},
        {"t": 1.1, "kind": "failure", "reason": "gpu_fault", "message": "Xid 79", "at": at},
        {"t": 1.2, "kind": "finished", "status": "failed"},
    ]
    run = RunState()
    for event in events:
        run.add(event)
    failures = run.build(status="failed", ended_t=1.2, log_tail="", monitor={})["failures"]
    assert [f["reason"] for f in failures] == ["gpu_fault", "nonzero_exit"]
    assert _state(*events).phase() == "finished: failed (gpu_fault, nonzero_exit)"
