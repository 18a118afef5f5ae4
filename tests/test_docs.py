"""The documentation's commands run: every fenced block that shows an asyncsoak command is run
here, or says why it cannot be (see docs/development.md, "The documentation").

A block preceded by ``<!-- runnable -->`` runs in one sandbox per page (a ``console`` or
``text`` block's ``$`` lines, an ``sh`` block whole, a ``python`` block with Python), with a
real soak's files at the paths the pages name and a queue of the page's own; each must exit 0.
``<!-- file: NAME -->`` writes the block into the sandbox as ``NAME``; ``<!-- not runnable:
WHY -->`` says why a block is not run; ``<!-- recipe: NAME -->`` marks a block that the
page's own test runs as written (``docs/fleet.md``'s, in ``tests/queue/test_fleet_docs.py``,
against real PostgreSQL and SLURM).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .soak_runs import trainer_soak

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: A fenced block, indented too (inside a list item): its indent, language and body.
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```$", re.M | re.S)
MARK = re.compile(r"^<!-- (runnable|not runnable: .+|file: [\w.-]+|recipe: [\w-]+) -->$")
#: An asyncsoak command in a shell block: at a line's start (``$ asyncsoak``, ``exec
#: asyncsoak``, ``srun asyncsoak``), after a shell operator, or as a path
#: (``.venv/bin/asyncsoak``); not a message that names one mid-line.
COMMAND = re.compile(r"(?:^\s*(?:\$ |exec |srun |nohup )?|[;&|(]\s*|/)asyncsoak [a-z]", re.M)

#: Where the pages' commands find a run: a real soak's artifact and journal, copied.
RUN_FILES = {
    "runs/7/soak.json": "soak.json",
    "runs/7/soak.jsonl": "soak.jsonl",
    "runs/8/soak.jsonl": "soak.jsonl",
    "runs/42/soak.jsonl": "soak.jsonl",
    "nightly-0412/soak.json": "soak.json",
    "nightly-0413/soak.json": "soak.json",
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    mark: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def shows_a_command(self) -> bool:
        if self.lang == "python":
            return "asyncsoak" in self.body
        return self.lang in ("", "sh", "bash", "console", "text", "shell") and bool(
            COMMAND.search(self.body)
        )

    def script(self) -> str:
        """What runs: a console block's ``$`` lines, or the block whole."""
        lines = self.body.splitlines()
        if self.lang in ("console", "text", ""):
            return "\n".join(line[2:] for line in lines if line.startswith("$ "))
        return self.body


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        indent, lang, body = match.groups()
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.match(before.strip())
        found.append(
            Block(
                page,
                text[: match.start()].count("\n") + 1,
                lang,
                "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True)),
                mark.group(1) if mark else None,
            )
        )
    return found


def test_every_command_shown_is_run_or_says_why() -> None:
    """Each block that shows an asyncsoak command is marked runnable, or not runnable with
    the reason; a mark is never left on a block without a command or a file."""
    unmarked = [b.where() for p in PAGES for b in blocks(p) if b.shows_a_command() and not b.mark]
    assert not unmarked, (
        "mark these blocks <!-- runnable --> or <!-- not runnable: WHY --> (docs/development.md)",
        unmarked,
    )
    assert RUNNABLE_PAGES


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real soak (a crash) whose files the pages' commands read."""
    return trainer_soak(tmp_path_factory.mktemp("docs-soak"), "crash")


def sandbox(base: Path, soak: Path) -> dict[str, str]:
    """The run files at the pages' paths, ``python`` on PATH, a queue of the sandbox's own;
    the environment the blocks run in."""
    for target, name in RUN_FILES.items():
        (base / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(soak.with_name(name), base / target)
    shims = base / ".bin"
    shims.mkdir()
    # A script, not a link: a virtual environment's python finds its packages by its path.
    (shims / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shims / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCSOAK_")}
    path = f"{shims}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "XDG_DATA_HOME": str(base / ".data"), "HOME": str(base)}


RUNNABLE_PAGES = [p for p in PAGES if any(b.mark == "runnable" for b in blocks(p))]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=[p.name for p in RUNNABLE_PAGES])
def test_runnable_blocks_run(page: Path, soak: Path, tmp_path: Path) -> None:
    """The page's runnable blocks, in order, in its sandbox: each exits 0."""
    runnable = [b for b in blocks(page) if b.mark == "runnable"]
    env = sandbox(tmp_path, soak)
    # The files the pages show (the queue's trainer, train.py), in every page's sandbox.
    for block in (b for p in PAGES for b in blocks(p)):
        if block.mark and block.mark.startswith("file: "):
            (tmp_path / block.mark.removeprefix("file: ")).write_text(block.body)
    for block in runnable:
        if block.lang == "python":
            command = [sys.executable, "-c", block.body]
        else:
            command = ["bash", "-euo", "pipefail", "-c", block.script()]
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, (block.where(), result.stdout[-3000:], result.stderr[-3000:])


def test_reference_pages_cover_the_code() -> None:
    """The generated reference names every subcommand and option, reason code, status,
    exported metric, top-level artifact key and public name, read from the code itself."""
    import importlib.util

    import asyncsoak
    from asyncsoak._contract._vocabulary import FailureReason, SoakStatus
    from asyncsoak._export._soak_metrics import METRIC_NAMES
    from asyncsoak.artifact import schema
    from asyncsoak.cli import build_parser

    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs/gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    cli = reference.cli_reference()
    subcommands = dict(reference._subcommands(build_parser()))
    assert {"run", "submit", "worker", "report", "summary"} <= set(subcommands)
    for name, sub in subcommands.items():
        assert f"## `asyncsoak {name}`" in cli
        for action in sub._actions:
            for option in action.option_strings:
                assert option in cli, (name, option)
    reasons = reference.reasons_reference()
    for word in [*FailureReason, *SoakStatus]:
        assert f"| `{word}` |" in reasons
    metrics = reference.metrics_reference()
    for metric in METRIC_NAMES:
        assert re.search(rf"^\| `{metric}` \|", metrics, re.M), metric
    # The scrape the page is made from exports them all (their type and help from the code).
    assert not re.search(r"^\| `\w+` \|  \|", metrics, re.M), metrics
    artifact = reference.schema_reference()
    for key in schema()["properties"]:
        assert f"| `{key}` |" in artifact
    api = reference.api_reference()
    for name in asyncsoak.__all__:
        assert f"::: asyncsoak.{name}\n" in api
