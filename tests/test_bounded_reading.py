"""Hostile files given to the views (``summary``, ``report``, ``recover``, ``artifact.load``,
the live view): refused in one line with exit status 2, in bounded memory, never a traceback,
never a wait without end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import ValidationError, artifact, run_soak
from asyncsoak._record._recover import artifact_from_journal
from asyncsoak._view._live import JournalTail

from .conftest import CLI_ENV, asyncsoak_cli, asyncsoak_main, fast_limits, py

LIMIT_S = 60.0
#: The address space a view runs in: a few times what it needs for a real run, far below what
#: the hostile files below would make an unbounded reader take (24 GB for the patch bomb).
MEMORY_BOUND = 1024 * 2**20
#: ``python -m asyncsoak`` with its address space bounded.
BOUNDED_CLI = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_BOUND}, {MEMORY_BOUND}))
from asyncsoak.cli import main
sys.exit(main(sys.argv[1:]))
"""
VIEWS = ["summary", "report", "recover"]


def bounded_cli(command: str, path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A view of ``path`` in a process that cannot take more than MEMORY_BOUND."""
    extra = ["-o", str(cwd / "rebuilt.json")] if command == "recover" else []
    return subprocess.run(
        [sys.executable, "-c", BOUNDED_CLI, command, str(path), *extra],
        cwd=cwd,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )


def view(command: str, path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A view of ``path`` called in this process: for files a reader refuses before it reads
    much (the memory bound is held once per reader, by :func:`bounded_cli`)."""
    extra = ["-o", str(cwd / "rebuilt.json")] if command == "recover" else []
    return asyncsoak_main(command, str(path), *extra, cwd=cwd)


def assert_one_line_usage_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("asyncsoak: error: "), lines
    for word in words:
        assert word in lines[0]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of a real soak: its soak.json and its journal soak.jsonl."""
    base = tmp_path_factory.mktemp("run")
    progress = base / "p"
    trainer = (
        f"import os, time; os.makedirs({str(progress)!r})\n"
        f"for i in range(8):\n"
        f"    open({str(progress / 'm')!r}, 'a').write('x'); time.sleep(0.1)"
    )
    result = asyncsoak_cli(
        "run", "--quiet", "--no-gpu", "--sample-interval", "0.1", "--progress-dir", str(progress),
        "--output", str(base / "soak.json"), "--", sys.executable, "-c", trainer,
        cwd=base, timeout=LIMIT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return base


def journal_lines(real_run: Path) -> list[bytes]:
    return (real_run / "soak.jsonl").read_bytes().splitlines(keepends=True)


def with_line_after_first_sample(real_run: Path, line: bytes, into: Path) -> Path:
    """The real journal with ``line`` inserted after its first (full) sample line."""
    lines = journal_lines(real_run)
    first = next(i for i, raw in enumerate(lines) if json.loads(raw)["kind"] == "sample")
    lines.insert(first + 1, line)
    path = into / "soak.jsonl"
    path.write_bytes(b"".join(lines))
    return path


#: 70 bytes that an unbounded decoder turns into a list of three billion nulls (24 GB).
PATCH_BOMB = b'{"t":0.5,"kind":"sample","~":{"{":{"bomb":{"[":[],"n":3000000000}}}}\n'


@pytest.mark.slow
@pytest.mark.parametrize("command", VIEWS)
def test_a_journal_patch_bomb_is_refused_in_bounded_memory(
    real_run: Path, tmp_path: Path, command: str
) -> None:
    """A compact line whose list patch pads three billion nulls: exit status 2 naming the
    line, in a process bounded to 1 GiB (it used to die of MemoryError with a traceback)."""
    path = with_line_after_first_sample(real_run, PATCH_BOMB, tmp_path)
    result = bounded_cli(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), "line", "pads a list")
    assert not (tmp_path / "soak.html").exists()
    assert not (tmp_path / "rebuilt.json").exists()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.slow
@pytest.mark.parametrize("depth", [200, 100_000])
@pytest.mark.parametrize("command", VIEWS)
@pytest.mark.parametrize("where", ["artifact", "journal"])
def test_json_nested_past_the_bound_is_refused_without_a_traceback(
    real_run: Path, tmp_path: Path, command: str, where: str, depth: int
) -> None:
    """JSON nested 200 or 100,000 deep in an artifact or a journal line: one line, exit
    status 2 (it used to be a RecursionError traceback, or a document no view could walk)."""
    if where == "artifact":
        data = json.loads((real_run / "soak.json").read_text())
        text = json.dumps(data)
        path = tmp_path / "soak.json"
        path.write_text(text[:-1] + f', "deep": {nested(depth)}}}')
    else:
        line = f'{{"t":0.5,"kind":"progress","deep":{nested(depth)}}}\n'.encode()
        path = with_line_after_first_sample(real_run, line, tmp_path)
    result = view(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), "nested deeper than 64")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "soak.json"
    os.mkfifo(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("command", VIEWS)
@pytest.mark.parametrize("kind", ["character device", "named pipe"])
def test_views_refuse_what_is_not_a_regular_file(tmp_path: Path, command: str, kind: str) -> None:
    """``summary /dev/zero`` and a FIFO: refused at once, saying what the file is (they used
    to read /dev/zero until memory ran out, and to wait for ever for a FIFO's writer)."""
    if kind == "named pipe":
        path = tmp_path / "soak.json"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    result = view(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), f"not a regular file ({'a ' + kind})")


def test_artifact_load_refuses_a_fifo_and_a_device_at_once(fifo: Path) -> None:
    """``asyncsoak.artifact.load`` raises ArtifactError for them, never blocks or reads on."""
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(artifact.ArtifactError, match="not a regular file"):
            artifact.load(path)


def sparse(path: Path, prefix: bytes, size: int) -> Path:
    """A file of ``size`` bytes (NULs after ``prefix``) that takes no room on disk."""
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(size)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("command", ["summary", "report"])
def test_an_artifact_larger_than_any_is_refused_unread(tmp_path: Path, command: str) -> None:
    """A 2 GiB file at the artifact's path: refused without being read (it used to be read
    whole into memory).  ``recover`` reads it as a journal: its line bound refuses it."""
    path = sparse(tmp_path / "soak.json", b'{"schema_version": 2, "pad": "', 2 * 2**30)
    result = bounded_cli(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), "larger than 256 MiB")


@pytest.mark.slow
def test_a_journal_line_without_end_is_refused_in_bounded_memory(
    real_run: Path, tmp_path: Path
) -> None:
    """A journal whose header is followed by 2 GiB without a newline: exit status 2 naming
    the line (every reader used to read the whole line into memory).  One reader serves every
    view: the bound is held here once, each view's refusal below."""
    header = journal_lines(real_run)[0]
    path = sparse(tmp_path / "soak.jsonl", header + b'{"t":1,"kind":"progress","x":"', 2 * 2**30)
    result = bounded_cli("summary", path, tmp_path)
    assert_one_line_usage_error(result, str(path), "line 2", "longer than 16 MiB")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "given"),
    [
        ("summary", "journal"),
        ("report", "journal"),
        ("recover", "journal"),
        ("recover", "artifact"),
    ],
)
def test_every_view_refuses_a_line_longer_than_any_event(
    real_run: Path, tmp_path: Path, command: str, given: str
) -> None:
    """A line past the 16 MiB bound, in a journal or in the artifact ``recover`` is given:
    every view refuses it in one line naming the line."""
    if given == "artifact":
        prefix, name, line = b'{"schema_version": 2, "pad": "', "soak.json", "line 1"
    else:
        prefix, name, line = journal_lines(real_run)[0] + b'{"t":1,"x":"', "soak.jsonl", "line 2"
    path = sparse(tmp_path / name, prefix, 17 * 2**20)
    result = view(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), line, "longer than 16 MiB")


@pytest.mark.slow
def test_a_line_lost_in_a_crash_is_still_only_skipped(real_run: Path, tmp_path: Path) -> None:
    """The bounds refuse only what no writer nor crash makes: a garbled line is skipped and
    counted, and a patch after it (which met an older base) is skipped too, not refused."""
    garbled = b'{"t":0.4,"kind":"sample","~":{"{":{"tree"\n'
    inflating = PATCH_BOMB.replace(b"3000000000", b"100000")
    path = with_line_after_first_sample(real_run, garbled + inflating, tmp_path)
    rebuilt = artifact_from_journal(path)
    assert rebuilt["monitor"]["unreadable_journal_lines"] == 2
    assert rebuilt["status"] == "passed"


@pytest.mark.slow
def test_the_live_view_reads_on_past_a_line_longer_than_any_event(
    real_run: Path, tmp_path: Path
) -> None:
    """A line longer than 16 MiB in the journal the live view follows: it is dropped and the
    events after it are shown (the view used to stop at it for good)."""
    lines = journal_lines(real_run)
    path = tmp_path / "soak.jsonl"
    with open(path, "wb") as f:
        f.write(lines[0])
        f.write(b'{"t":0.1,"kind":"progress","x":"')
        f.truncate(f.tell() + 20 * 2**20)
        f.seek(0, os.SEEK_END)
        f.write(b'"}\n')
        f.write(b"".join(lines[1:]))
    tail = JournalTail(path)
    kinds: list[str] = []
    try:
        # Each read takes at most a chunk or one line's bound; the file is about 21 MiB.
        for _ in range(20):
            kinds += [event["kind"] for event in tail.read()]
    finally:
        tail.close()
    assert "finished" in kinds
    assert kinds.count("progress") == sum(b'"kind":"progress"' in line for line in lines)


def deep_mapping(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [40, 5000])
def test_metadata_nested_past_the_bound_is_refused_before_the_start(
    tmp_path: Path, depth: int
) -> None:
    """run_soak refuses metadata no reader would take back (nested deeper than 32): a
    ValidationError, nothing launched or written (depth 40 used to run, 5000 to raise
    RecursionError)."""
    kwargs = fast_limits(tmp_path, metadata=deep_mapping(depth))
    kwargs["command"] = py(f"open({str(tmp_path / 'launched')!r}, 'w').close()")
    with pytest.raises(ValidationError, match="metadata must not nest more than 32"):
        anyio.run(lambda: run_soak(**kwargs))
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_metadata_within_the_bound_reads_back(real_run: Path, tmp_path: Path) -> None:
    """Metadata nested 30 deep is kept and every view reads it back."""
    data = json.loads((real_run / "soak.json").read_text())
    data["metadata"] = deep_mapping(30)
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(data))
    assert artifact.load(path)["metadata"] == deep_mapping(30)
    shutil.copy(path, tmp_path / "copy.json")
    result = bounded_cli("summary", tmp_path / "copy.json", tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", VIEWS)
def test_a_journal_whose_events_are_damaged_is_refused_in_one_line(
    real_run: Path, tmp_path: Path, command: str
) -> None:
    """A line that is JSON but no event asyncsoak wrote (a ``started`` without its pid):
    exit status 2 naming the event (it used to be a KeyError traceback)."""
    path = with_line_after_first_sample(real_run, b'{"t":0.2,"kind":"started"}\n', tmp_path)
    result = view(command, path, tmp_path)
    assert_one_line_usage_error(result, str(path), "('started') is damaged")


@pytest.mark.slow
def test_a_journal_naming_a_fifo_as_its_log_is_rebuilt_without_waiting(
    real_run: Path, tmp_path: Path
) -> None:
    """A journal whose header names a FIFO (or a device) as its log: ``recover`` rebuilds it
    with an empty log tail instead of waiting for ever for a writer."""
    lines = journal_lines(real_run)
    header = json.loads(lines[0])
    header["log_path"] = str(tmp_path / "log.fifo")
    os.mkfifo(header["log_path"])
    path = tmp_path / "soak.jsonl"
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"".join(lines[1:]))
    result = bounded_cli("recover", path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "rebuilt.json").read_text())["log"]["tail"] == ""
