"""Soaks inside hosts whose event loop ends: asyncio.run, anyio.run and uvicorn, each in a process
of its own, with a real tree; and the front door's work on the host's loop thread."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CLI_ENV, ReadyFifo, alive

pytestmark = pytest.mark.slow

#: The soaked command of both hosts: a trainer and a worker it forked; argv: the progress dir,
#: the FIFO on which it says both pids.
FORKING_TRAINER = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).mkdir(exist_ok=True)
(Path(sys.argv[1]) / "m.txt").write_text("step")
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
with open(sys.argv[2], "w") as f:
    f.write(f"{os.getpid()} {worker}\\n")
time.sleep(60)
"""

#: A host that starts a soak as a task of its own and leaves it running: ``main`` returns,
#: raises, or is interrupted (SIGINT, as Ctrl-C).  argv: tmp dir, how main ends, the FIFO.
HOST = """
import asyncio, os, signal, sys
from pathlib import Path
import anyio
import asyncsoak

# Ctrl-C as a host started from a terminal gets it, whatever the test runner's shell
# left (a background job's SIGINT is ignored, and an ignored signal stays so across exec).
signal.signal(signal.SIGINT, signal.default_int_handler)
tmp, how = Path(sys.argv[1]), sys.argv[2]
fifo = tmp / "ready.fifo"
os.mkfifo(fifo)
TRAINER = os.environ["SOAK_TRAINER"]

def pids():
    with open(fifo) as f:
        return f.readline()

async def main():
    asyncio.get_running_loop().create_task(asyncsoak.run_soak(
        command=[sys.executable, "-c", TRAINER, str(tmp / "progress"), str(fifo)],
        progress_dir=tmp / "progress", output_path=tmp / "out" / "soak.json",
        sample_interval_seconds=0.1, post_shutdown_grace_seconds=2.0, nvidia_smi=None))
    print(await asyncio.wait_for(asyncio.to_thread(pids), 30), end="", flush=True)
    if how == "raises":
        raise RuntimeError("the host broke")
    if how == "interrupted":
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(60)

if how == "anyio":
    anyio.run(main)
else:
    asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["returns", "raises", "interrupted", "anyio"])
def test_a_soak_left_running_when_the_hosts_loop_ends_is_cancelled(
    tmp_path: Path, how: str
) -> None:
    """asyncio.run (or anyio.run) cancels every task at once when main returns, raises or is
    interrupted: the soak's own tasks too.  The tree is stopped all the same, and the artifact
    says cancelled."""
    host = subprocess.run(
        [sys.executable, "-c", HOST, str(tmp_path), how],
        env={**CLI_ENV, "SOAK_TRAINER": FORKING_TRAINER},
        capture_output=True,
        text=True,
        timeout=60,
    )
    pids = [int(pid) for pid in host.stdout.split()]
    artifact = json.loads((tmp_path / "out" / "soak.json").read_text())
    assert artifact["status"] == "cancelled", host.stderr
    assert artifact["stop"]["cause"] == "cancelled"
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


#: A host as a web app is written: asyncsoak imported at the top, the first soak started from
#: a coroutine.  It prints the modules imported on the loop's thread during the first call.
FIRST_CALL = """
import asyncio, sys, threading
from pathlib import Path
import asyncsoak

tmp = Path(sys.argv[1])
(tmp / "progress").mkdir()
run_soak = asyncsoak.run_soak
assert "anyio" not in sys.modules, "the front door imported anyio"
on_loop = []

async def main():
    loop_thread = threading.get_ident()

    def imports(event, args):
        if event == "import" and threading.get_ident() == loop_thread:
            on_loop.append(args[0])

    sys.addaudithook(imports)
    await run_soak(command=[sys.executable, "-c", "pass"], progress_dir=tmp / "progress",
                   output_path=tmp / "out" / "soak.json", nvidia_smi=None)

asyncio.run(main())
print(sorted(set(on_loop)))
"""


def test_the_first_soak_imports_nothing_on_the_hosts_loop(tmp_path: Path) -> None:
    """The supervisor (anyio, psutil and the rest: 0.2 s) is imported in a thread of its own
    at the first call: the host's loop never stalls on an import."""
    host = subprocess.run(
        [sys.executable, "-c", FIRST_CALL, str(tmp_path)],
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert host.returncode == 0, host.stderr
    assert host.stdout.strip() == "[]"
    assert json.loads((tmp_path / "out" / "soak.json").read_text())["status"] == "passed"


#: An ASGI app whose soaks live in its lifespan's task group (docs/running.md): uvicorn's
#: shutdown on SIGTERM cancels them, each stops its tree and writes a ``cancelled`` artifact.
ASGI_APP = """
import os, sys
from pathlib import Path
import anyio
import asyncsoak

TMP = Path(os.environ["SOAK_TMP"])
TRAINER = os.environ["SOAK_TRAINER"]


async def app(scope, receive, send):
    assert scope["type"] == "lifespan"
    async with anyio.create_task_group() as soaks:
        while (message := await receive())["type"] != "lifespan.shutdown":
            soaks.start_soon(lambda: asyncsoak.run_soak(
                command=[sys.executable, "-c", TRAINER, str(TMP / "progress"), os.environ["FIFO"]],
                progress_dir=TMP / "progress", output_path=TMP / "out" / "soak.json",
                sample_interval_seconds=0.1, post_shutdown_grace_seconds=2.0, nvidia_smi=None))
            await send({"type": "lifespan.startup.complete"})
        soaks.cancel_scope.cancel()
    await send({"type": "lifespan.shutdown.complete"})
"""


def test_uvicorn_stopped_by_sigterm_cancels_the_soaks_of_its_lifespan(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """uvicorn gets SIGTERM: its lifespan's shutdown cancels the soak, which stops its tree
    and writes a cancelled artifact before uvicorn exits."""
    (tmp_path / "app.py").write_text(ASGI_APP)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app:app",
            "--app-dir",
            str(tmp_path),
            "--uds",
            str(tmp_path / "server.sock"),
            "--lifespan",
            "on",
        ],
        env={
            **CLI_ENV,
            "SOAK_TMP": str(tmp_path),
            "FIFO": str(ready.path),
            "SOAK_TRAINER": FORKING_TRAINER,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(pid) for pid in ready.line_sync(timeout=30).split()]
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    finally:
        server.kill()
    # uvicorn, its shutdown done, dies of the SIGTERM it caught (as it re-raises it).
    assert server.returncode in (0, -signal.SIGTERM), stderr
    assert "Application shutdown complete" in stderr
    artifact = json.loads((tmp_path / "out" / "soak.json").read_text())
    assert (artifact["status"], artifact["stop"]["cause"]) == ("cancelled", "cancelled")
    assert not any(alive(pid) for pid in pids)
