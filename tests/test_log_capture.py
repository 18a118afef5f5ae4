"""The reaper's capture of the command's output: a bounded log whose cost follows the output.

These drive the real reaper process (``python -I -S .../_reaper.py``) the way the spawner
does: the configuration line on its stdin (the lifeline), the log file's descriptor passed
down, its reports read from its stdout.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from asyncsoak._process._spawn import REAPER_SCRIPT

from .conftest import CLI_ENV

pytestmark = pytest.mark.slow

CHUNK = 64 * 1024
OMITTED = re.compile(rb"\n\[asyncsoak: (\d+) bytes of output omitted\]\n")


def printer(chunks: int) -> list[str]:
    """A command printing ``chunks`` numbered 64 KiB chunks, then ``THE END``."""
    code = f"""
        import sys
        out = sys.stdout.buffer
        for i in range({chunks}):
            line = b"%08d " % i
            out.write(line + b"x" * ({CHUNK} - len(line) - 1) + b"\\n")
        out.write(b"THE END\\n")
        out.flush()
    """
    return [sys.executable, "-c", textwrap.dedent(code)]


@contextmanager
def reaper(argv: list[str], log: Path, max_bytes: int) -> Iterator[subprocess.Popen[bytes]]:
    """The real reaper running ``argv`` into ``log``; its lifeline closed on the way out."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    config: dict[str, Any] = {
        "argv": argv,
        "cwd": str(log.parent),
        "env": dict(os.environ),
        "stdin_fd": None,
        "log_fd": fd,
        "log_max_bytes": max_bytes,
        "stop_mode": "group",
        "grace_seconds": 1.0,
    }
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", REAPER_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=CLI_ENV,
        pass_fds=[fd],
    )
    os.close(fd)
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(config).encode() + b"\n")
        proc.stdin.flush()
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_for_report(proc: subprocess.Popen[bytes], event: str, timeout: float = 60.0) -> None:
    """Read the reaper's reports until ``event`` (a real line from it, under a deadline)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if json.loads(line).get("event") == event:
                return
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"the reaper did not report {event!r} within {timeout}s")
        data = os.read(fd, 65536)
        if not data:
            raise AssertionError(f"the reaper exited before reporting {event!r}")
        buffer += data


def bytes_written(pid: int) -> int:
    """What ``pid``'s main thread has passed to write(2) so far (``wchar``: exact).

    The thread's own file, not ``/proc/PID/io``: that one adds the counts of reaped children,
    and the reaper reaps the command, whose own writes to the pipe would count.
    """
    for line in Path(f"/proc/{pid}/task/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/io has no wchar line")


def test_log_writes_follow_the_output_not_the_kept_tail(tmp_path: Path) -> None:
    """Past the cap the reaper writes at most about twice what the command prints, not per read."""
    cap = 1 << 20
    chunks = 128  # 8 MiB: 8 times the cap
    printed = chunks * CHUNK + len(b"THE END\n")
    log = tmp_path / "train.log"
    with reaper(printer(chunks), log, cap) as proc:
        wait_for_report(proc, "empty")
        # The lifeline is still open, so the reaper is alive and its counters readable.
        written = bytes_written(proc.pid)
    # Reports on stdout are a few hundred bytes; the log itself may cost twice the output
    # (less when a read is larger than the tail kept: what is left out is never written).
    assert cap // 2 <= written <= 2.5 * printed, f"{written / printed:.1f} B written per B printed"


def test_capped_log_keeps_the_head_the_latest_tail_and_counts_the_rest(tmp_path: Path) -> None:
    """The log holds the first half-cap, an exact count of what was left out, then the end."""
    cap = 1 << 20
    chunks = 40
    printed = chunks * CHUNK + len(b"THE END\n")
    log = tmp_path / "train.log"
    with reaper(printer(chunks), log, cap) as proc:
        wait_for_report(proc, "empty")
    data = log.read_bytes()
    assert len(data) <= cap + 100
    assert data.startswith(b"00000000 x")
    marker = OMITTED.search(data)
    assert marker is not None
    head, tail = data[: marker.start()], data[marker.end() :]
    assert len(head) == cap // 2
    assert len(head) + int(marker.group(1)) + len(tail) == printed
    assert tail.endswith(b"%08d " % (chunks - 1) + b"x" * (CHUNK - 10) + b"\nTHE END\n")
    # Never less than an eighth of the cap is kept after the marker.
    assert len(tail) >= cap // 8


def test_output_under_the_cap_is_kept_whole(tmp_path: Path) -> None:
    """Output that fits the cap is the log, byte for byte, with no marker."""
    chunks = 10
    log = tmp_path / "train.log"
    with reaper(printer(chunks), log, 1 << 20) as proc:
        wait_for_report(proc, "empty")
    data = log.read_bytes()
    assert len(data) == chunks * CHUNK + len(b"THE END\n")
    assert OMITTED.search(data) is None
    assert data.endswith(b"THE END\n")


#: Run alone (its ``waitpid(-1)`` must reap no other test's child): the real reaper's reap of
#: a command that printed and exited, the log as each report found it.
REAP_AFTER_OUTPUT = """
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import _reaper
log_path = sys.argv[2]
reaper = _reaper.Reaper({"log_fd": os.open(log_path, os.O_WRONLY | os.O_CREAT, 0o600),
                         "log_max_bytes": 1 << 20})
r, w = os.pipe()
os.set_blocking(r, False)
reaper.output = r
child = subprocess.Popen([sys.executable, "-c", "print('step 1')"], stdout=w)
os.close(w)
# Exited, not reaped: as when the reaper was descheduled while a short command ran to its end.
os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
child.returncode = 0  # the reaper reaps it, not the Popen
reaper.pid = child.pid
told = []
reaper.report = lambda **event: told.append([event["event"], open(log_path).read()])
reaper.reap()
print(json.dumps(told))
"""


def test_a_commands_output_is_in_the_log_before_its_exit_is_told(tmp_path: Path) -> None:
    """The reaper copies what the command wrote before it exited into the log before it reports
    the exit: the monitor's last look at a short command's output (``--output-is-progress``)
    follows the report at once, and found an empty log on a loaded machine."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", REAP_AFTER_OUTPUT, REAPER_SCRIPT, str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Then "empty": the reaper has no child left.
    assert json.loads(done.stdout) == [["exited", "step 1\n"], ["empty", "step 1\n"]]
