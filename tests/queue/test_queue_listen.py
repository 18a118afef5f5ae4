"""SQLite's wake-up listener beside the soaks of the same event loop (a long-running worker).

The listener waits on an inotify descriptor through the event loop's selector, and each soak
hears its reaper through a pipe polled by the same selector.  A descriptor closed while still
registered leaves the selector's map holding its number: a later pipe given that number is
taken for registered and never polled, and its soak never hears its child.  These tests run
soaks while listeners start, wake and are cancelled around them, and check the selector
against the kernel's own list of what the event loop polls.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest

from asyncsoak import run_soak
from asyncsoak.queue import JobStore, SqliteStore

from ..conftest import fast_limits
from .helpers import FAST_SOAK
from .test_queue_worker import LIMIT_S

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

#: Soaks run while the listeners come and go.
SOAKS = 3
#: The child: a few writes to its progress dir, then exit 0.
CHILD = """\
import os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
for _ in range(3):
    with open(os.path.join(sys.argv[1], "step"), "a") as f:
        f.write(".")
    time.sleep(0.02)
"""


#: A line of an epoll descriptor's fdinfo: one polled descriptor, its inode in hex.
_TFD = re.compile(r"tfd:\s*(?P<fd>\d+)\s.*\bino:(?P<ino>[0-9a-f]+)")


def polled_by_kernel(loop: asyncio.AbstractEventLoop) -> dict[int, int]:
    """Descriptor -> inode of what the loop's epoll instance really polls."""
    epoll_fd = loop._selector.fileno()  # type: ignore[attr-defined]
    polled: dict[int, int] = {}
    with open(f"/proc/self/fdinfo/{epoll_fd}") as info:
        for line in info:
            if match := _TFD.match(line):
                polled[int(match["fd"])] = int(match["ino"], 16)
    return polled


def assert_selector_truthful(loop: asyncio.AbstractEventLoop) -> None:
    """Every descriptor the selector believes registered is polled by the kernel, as the
    file it is now (not a closed one whose number was given to another)."""
    registered = set(loop._selector.get_map())  # type: ignore[attr-defined]
    polled = polled_by_kernel(loop)
    assert registered == set(polled), f"selector {sorted(registered)}, epoll {sorted(polled)}"
    for fd, inode in polled.items():
        assert os.fstat(fd).st_ino == inode, f"fd {fd} is polled as another file"


def _set(event: anyio.Event, _payload: str) -> None:
    event.set()


async def churn_listeners(store: JobStore, stop: anyio.Event) -> int:
    """Start a listener, wake it with a submit, cancel it; again until ``stop``.  Returns
    how many listeners came and went."""
    cycles = 0
    while not stop.is_set():
        woken = anyio.Event()
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                await tg.start(store.listen, partial(_set, woken))
                await anyio.to_thread.run_sync(lambda: store.submit(argv=["true"], soak=FAST_SOAK))
                await woken.wait()
                tg.cancel_scope.cancel()
        cycles += 1
    return cycles


async def test_soaks_hear_their_child_while_wake_up_listeners_come_and_go(tmp_path: Path) -> None:
    """Soaks record their child's exit while SQLite wake-up listeners start, wake and are
    cancelled in the same event loop, and the selector polls exactly what it believes."""
    loop = asyncio.get_running_loop()
    stop = anyio.Event()
    cycles: list[int] = []

    async def churn(store: JobStore) -> None:
        cycles.append(await churn_listeners(store, stop))

    with SqliteStore(tmp_path / "queue.db") as store:
        async with anyio.create_task_group() as tg:
            tg.start_soon(churn, store)
            for index in range(SOAKS):
                run = tmp_path / f"soak{index}"
                with anyio.fail_after(LIMIT_S):
                    artifact = await run_soak(
                        command=[sys.executable, "-c", CHILD, str(run / "progress")],
                        **fast_limits(run, output_path=run / "out" / "soak.json"),
                    )
                assert artifact["status"] == "passed", artifact["failures"]
                assert artifact["exit"]["returncode"] == 0
                assert_selector_truthful(loop)
            stop.set()
        assert_selector_truthful(loop)
    assert cycles[0] >= SOAKS
