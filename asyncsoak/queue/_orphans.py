"""What is left of an orphaned attempt on this host (process ids mean nothing elsewhere):
finding its processes and killing them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from .._process import (
    REAPER_MODULE,
    REAPER_SCRIPT,
    cmdline,
    environments,
    holds_open,
    start_time_ticks,
)
from ._status import SLICE_S

#: In the reaper's command line; earlier releases' ``python -m`` module names too, so that a
#: worker upgraded while an older reaper outlived its worker still recognises it.
_REAPER_ARGS = frozenset({REAPER_SCRIPT.encode(), REAPER_MODULE.encode(), b"asyncsoak._reaper"})


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` still runs and is the same process (start time), not a zombie."""
    ticks = start_time_ticks(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks):
        return False
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def kill_leftovers(
    db: str, job_id: int, attempt: int, log: Path | None, timeout: float
) -> list[int]:
    """SIGKILL what is left of an orphaned attempt on this host, scanning again until a scan
    finds nothing alive (at most ``timeout``): its tree by the markers in its environment, its
    reaper by the ``train.log`` it holds open (docs/architecture.md says why)."""
    pairs = (("DB", db), ("JOB_ID", job_id), ("ATTEMPT", attempt))
    markers = {f"ASYNCSOAK_{name}={value}".encode() for name, value in pairs}
    log_file: tuple[int, int] | None = None
    with contextlib.suppress(OSError):  # never created: no reaper was started
        st = log.stat() if log is not None else None
        log_file = None if st is None else (st.st_dev, st.st_ino)
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    quiet = False
    while True:
        found = [
            (pid, start_time_ticks(pid))
            for pid, environ in environments(skip=os.getpid())
            if markers <= set(environ) or (log_file is not None and _reaper_holding(pid, log_file))
        ]
        targets = [(pid, ticks) for pid, ticks in found if process_alive(pid, ticks)]
        # After a kill, one more quiet scan: a command the killed reaper had just forked may
        # have been between closing the fds it inherited and its exec.
        if not targets and (quiet or not killed):
            return killed
        quiet = not targets
        for pid, ticks in targets:
            if process_alive(pid, ticks):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    if pid not in killed:
                        killed.append(pid)
        if time.monotonic() >= deadline:
            return killed
        time.sleep(SLICE_S)


def _reaper_holding(pid: int, log_file: tuple[int, int]) -> bool:
    args = cmdline(pid)
    return args is not None and not _REAPER_ARGS.isdisjoint(args) and holds_open(pid, log_file)
