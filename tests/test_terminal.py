"""Text from a run reaches a terminal with its control characters spelled out, never raw."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from asyncsoak._contract._terminal import terminal_text
from asyncsoak._view._live_line import render_rich
from asyncsoak._view._live_state import LiveState

from .conftest import asyncsoak_cli, py

#: An OSC 52 clipboard write (the terminal would put "hello" in the clipboard).
CLIPBOARD = "\x1b]52;c;aGVsbG8=\x07"
#: A window title and a screen clear.
TITLE = "\x1b]0;pwned\x07\x1b[2J"
#: What a terminal acts on: C0 but tab and newline, DEL, C1.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: A trainer whose progress file is named with escapes, which then dies of an exception whose
#: message writes the clipboard.
HOSTILE_TRAINER = f"""
import pathlib
progress = pathlib.Path("progress")
progress.mkdir(exist_ok=True)
(progress / {"ckpt" + TITLE + ".pt"!r}).write_text("x")
raise RuntimeError({"copied " + CLIPBOARD + " to your clipboard"!r})
"""


@pytest.mark.slow
def test_run_and_summary_spell_out_escapes_from_the_run(tmp_path: Path) -> None:
    """An exception message with an OSC 52 clipboard write and a progress file named with a
    window title and a screen clear: `run`'s stderr and `summary` show them as ``\\x1b``, never raw;
    `summary --json` keeps them JSON-escaped."""
    artifact = tmp_path / "soak.json"
    run = asyncsoak_cli(
        "run", "--progress-dir", str(tmp_path / "progress"), "--output", str(artifact),
        "--sample-interval", "0.1", "--grace", "1", "--no-gpu", "--", *py(HOSTILE_TRAINER),
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert not RAW_CONTROL.search(run.stderr), run.stderr
    failed = next(line for line in run.stderr.splitlines() if "soak failed" in line)
    assert "copied \\x1b]52;c;aGVsbG8=\\x07 to your clipboard" in failed
    assert run.stderr.splitlines()[-1] == f"asyncsoak: artifact: {artifact}"

    summary = asyncsoak_cli("summary", str(artifact), cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    assert not RAW_CONTROL.search(summary.stdout), summary.stdout
    assert "\\x1b]52;c;aGVsbG8=\\x07" in summary.stdout
    last_progress = next(line for line in summary.stdout.splitlines() if "last progress" in line)
    assert "ckpt\\x1b]0;pwned\\x07\\x1b[2J.pt" in last_progress

    as_json = asyncsoak_cli("summary", "--json", str(artifact), cwd=tmp_path)
    assert not RAW_CONTROL.search(as_json.stdout)
    assert CLIPBOARD in json.loads(as_json.stdout)["evidence"]["cause"]


@pytest.mark.slow
def test_compare_and_errors_spell_out_escapes_in_file_names(tmp_path: Path) -> None:
    """`compare` of runs whose file names hold escapes, and an error naming such a file: both
    print them spelled out, the error on one line."""
    artifact = tmp_path / "soak.json"
    run = asyncsoak_cli(
        "run", "--progress-dir", str(tmp_path / "progress"), "--output", str(artifact),
        "--sample-interval", "0.1", "--no-gpu", "--",
        *py("import pathlib; p = pathlib.Path('progress'); p.mkdir(); (p / 'm').write_text('x')"),
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    hostile = tmp_path / f"run{TITLE}.json"
    hostile.write_bytes(artifact.read_bytes())
    compared = asyncsoak_cli("compare", str(artifact), str(hostile), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert not RAW_CONTROL.search(compared.stdout), compared.stdout
    assert "run\\x1b]0;pwned\\x07" in compared.stdout

    missing = asyncsoak_cli("summary", str(tmp_path / f"gone{CLIPBOARD}\n.json"), cwd=tmp_path)
    assert missing.returncode == 2
    assert not RAW_CONTROL.search(missing.stderr), missing.stderr
    assert missing.stderr.count("\n") == 1, missing.stderr
    assert "gone\\x1b]52;c;aGVsbG8=\\x07\\n.json" in missing.stderr


def test_live_view_spells_out_escapes_from_the_journal() -> None:
    """A journal (another asyncsoak's, or a hand-edited one) whose trend series holds escapes:
    the plain line and the rich frame spell them out; a reason or status outside
    the vocabulary is refused by the run's state, never shown."""
    from rich.console import Console

    state = LiveState()
    for event in [
        {"t": 0, "kind": "header", "started_at": "2026-01-01T00:00:00Z", "config": {}},
        {"t": 0.1, "kind": "started", "pid": 1},
        {"t": 1.0, "kind": "sample", "points": {f"gpu0{TITLE}": {"utilization_gpu_percent": 5}}},
        {"t": 1.5, "kind": "trend", "series": f"tree{CLIPBOARD}", "verdict": "leak"},
        {"t": 2.0, "kind": "failure", "reason": f"stale{CLIPBOARD}"},
        {"t": 3.0, "kind": "finished", "status": f"failed{TITLE}"},
    ]:
        state.add(event)
    status = state.status(now=0.0)
    plain = status.plain()
    assert not RAW_CONTROL.search(plain), plain
    assert "finished" not in plain, plain
    assert "stale\\x1b" not in plain, plain
    assert "LEAK tree\\x1b]52" in plain
    console = Console(record=True, width=300, color_system=None)
    console.print(render_rich(status, 300))
    frame = console.export_text()
    assert not RAW_CONTROL.search(frame.replace("\n", "")), frame
    assert "LEAK tree\\x1b]52;c;aGVsbG8=\\x07" in frame


def test_worker_log_lines_spell_out_escapes() -> None:
    """The worker's log lines (a note, an error naming a path) reach its terminal spelled out."""
    import logging

    from asyncsoak.cli._queue import _TerminalFormatter

    record = logging.LogRecord(
        "asyncsoak.queue", logging.WARNING, __file__, 1, "job %d: %s", (7, CLIPBOARD), None
    )
    line = _TerminalFormatter("%(levelname)s %(message)s").format(record)
    assert line == "WARNING job 7: \\x1b]52;c;aGVsbG8=\\x07"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, tabs\tand ünïcode", "plain text, tabs\tand ünïcode"),
        (CLIPBOARD, "\\x1b]52;c;aGVsbG8=\\x07"),
        ("a\rb\x00c\x7fd", "a\\x0db\\x00c\\x7fd"),
        ("C1 \x9b2J", "C1 \\x9b2J"),
        ("bidi \u202eevil\u202c \u2066x\u2069", "bidi \\u202eevil\\u202c \\u2066x\\u2069"),
        ("two\nlines", "two\\nlines"),
    ],
    ids=["plain", "osc52", "c0-del", "c1-csi", "bidi", "newline"],
)
def test_terminal_text_spells_out_what_a_terminal_acts_on(raw: str, shown: str) -> None:
    """Each control character as Python spells it; printable text (tabs, non-ASCII) as it is."""
    assert terminal_text(raw) == shown
