"""Hang forensics (what every process of the tree was doing, each read bounded so a ``D``-state
process cannot hold up the stop), and the kernel log's word on OOM kills and Xid errors."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from ._ranks import read_rank, role

#: Threads listed per process.
MAX_THREADS = 64
#: Bytes kept of one py-spy dump.
MAX_DUMP_BYTES = 32 * 1024
#: Python processes dumped with py-spy at most (the first: the trainer and its nearest workers).
MAX_PY_SPY = 16
#: Bound on one py-spy call.
PY_SPY_TIMEOUT_SECONDS = 5.0
#: Records read from the kernel log at most.
MAX_KMSG_RECORDS = 100_000
#: Records a follower takes at one tick at most (a flood of kernel messages waits its turn).
MAX_KMSG_RECORDS_PER_READ = 2_000


def _read(path: str, limit: int = 64 * 1024) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError as exc:
        return None if exc.errno != 13 else "[permission denied]"


def _thread_info(pid: int) -> list[dict[str, Any]]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    threads: list[dict[str, Any]] = []
    for tid in tids[:MAX_THREADS]:
        stat = _read(f"/proc/{pid}/task/{tid}/stat") or ""
        end = stat.rfind(")")
        comm = stat[stat.find("(") + 1 : end] if "(" in stat else None
        state = stat[end + 2 : end + 3] if end >= 0 else None
        wchan = _read(f"/proc/{pid}/task/{tid}/wchan")
        threads.append({"tid": tid, "name": comm, "state": state, "wchan": wchan})
    return threads


#: How py-spy (and the kernel under it) says that ptrace was refused.
PTRACE_REFUSALS = ("operation not permitted", "permission denied", "os error 1)", "eperm")


def py_spy_dump(py_spy: str, pid: int, timeout: float = PY_SPY_TIMEOUT_SECONDS) -> dict[str, Any]:
    """``py-spy dump`` of one process, or why there is none (ptrace refused, timeout...)."""
    try:
        argv = [py_spy, "dump", "--pid", str(pid)]
        result = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy did not answer within {timeout:g}s"}
    except OSError as exc:
        return {"error": f"py-spy could not run: {exc}"}
    out = result.stdout[:MAX_DUMP_BYTES].decode("utf-8", errors="replace")
    if result.returncode != 0:
        err = result.stderr.decode("utf-8", errors="replace").strip()
        reason = err or out.strip() or f"exit status {result.returncode}"
        # Only a refusal is a permission problem (not py-spy's other ptrace errors).
        if any(refusal in reason.lower() for refusal in PTRACE_REFUSALS):
            reason += " (ptrace is not allowed: run as the same user with ptrace permitted)"
        return {"error": reason[:2000]}
    return {"stack": out}


def collect_forensics(pids: Iterable[int], *, timeout: float) -> dict[str, Any]:
    """What every process was doing, within ``timeout`` seconds in all."""
    import psutil  # here: a soak that needs no forensics starts without it

    deadline = time.monotonic() + timeout
    # py-spy on PATH, or beside this interpreter (installed in a venv not activated).
    beside = Path(sys.executable).with_name("py-spy")
    py_spy = shutil.which("py-spy") or (str(beside) if os.access(beside, os.X_OK) else None)
    processes: list[dict[str, Any]] = []
    skipped = dumped = 0
    for pid in pids:
        if time.monotonic() >= deadline:
            skipped += 1
            continue
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                name = proc.name()
                info: dict[str, Any] = {
                    "pid": pid,
                    "ppid": proc.ppid(),
                    "name": name,
                    "state": proc.status(),
                    "num_threads": proc.num_threads(),
                }
                try:
                    cmdline = proc.cmdline()
                except psutil.AccessDenied:
                    cmdline = []
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            processes.append({"pid": pid, "error": "access denied"})
            continue
        info["cmdline"] = cmdline
        info["role"] = role(name, cmdline, read_rank(f"/proc/{pid}/environ"))
        info["wchan"] = _read(f"/proc/{pid}/wchan")
        info["kernel_stack"] = _read(f"/proc/{pid}/stack")
        info["threads"] = _thread_info(pid)
        program = os.path.basename(cmdline[0]) if cmdline else ""
        if "python" in name.lower() or "python" in program.lower():
            left = deadline - time.monotonic()
            if py_spy is None:
                info["python_stack"] = {"error": "py-spy is not installed (pip install py-spy)"}
            elif dumped >= MAX_PY_SPY:
                info["python_stack"] = {"error": f"only the first {MAX_PY_SPY} are dumped"}
            elif left > 0.5:
                dumped += 1
                info["python_stack"] = py_spy_dump(py_spy, pid, min(PY_SPY_TIMEOUT_SECONDS, left))
            else:
                info["python_stack"] = {"error": "no time left in the forensics budget"}
        processes.append(info)
    return {
        "processes": processes,
        "skipped_for_time": skipped,
        "py_spy": py_spy,
        "time_budget_seconds": timeout,
    }


_KILLED = re.compile(r"Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)")
#: What every record :data:`_KILLED` matches holds: a boot's thousands of records are not decoded.
_KILLED_WORDS = b"Killed process "


def oom_kills(
    pids: Collection[int], *, since_boot_seconds: float, kmsg: Path = Path("/dev/kmsg")
) -> list[dict[str, Any]] | None:
    """OOM-killer records for ``pids`` logged after ``since_boot_seconds``; None if unreadable.
    Many soaks of one process end at once (a sweep cancelled): one read serves them all."""
    if not pids:
        return []
    records = _oom_records(kmsg, time.monotonic())
    if records is None:
        return None
    return [
        {"pid": pid, "name": name, "message": message}
        for at, pid, name, message in records
        if at >= since_boot_seconds and pid in pids
    ]


#: (seconds since boot, pid, name, first line of the message) of one OOM kill.
_OomRecord = tuple[float, int, str, str]
_OOM_LOCK = threading.Lock()


def _new_oom_lock() -> None:
    """In a forked child: the lock as no thread holds it (the parent's may have)."""
    global _OOM_LOCK
    _OOM_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_oom_lock)
#: Per kernel log and process (a forked child reads on its own): when its last read began,
#: its descriptor (read on from there: opened at its end before a soak's command starts) and the
#: OOM-kill records found so far (None: unreadable).
_OOM_READS: dict[tuple[Path, int], tuple[float, int | None, list[_OomRecord] | None]] = {}


def prefetch_oom_records(kmsg: Path = Path("/dev/kmsg")) -> None:
    """Open the kernel log at its end just before a soak's command starts: every OOM record of
    its tree comes after, so :func:`oom_kills` reads only those (a boot's log is never read)."""
    key = (kmsg, os.getpid())
    with _OOM_LOCK:
        if key in _OOM_READS:
            return  # read on from where the previous soak's read stopped
        fd = None
        with contextlib.suppress(OSError):
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(fd, 0, os.SEEK_END)
        _OOM_READS[key] = (time.monotonic(), fd, None if fd is None else [])


def _oom_records(kmsg: Path, asked_at: float) -> list[_OomRecord] | None:
    """The kernel log's OOM-kill records, read once for every caller that asked before the read
    began (a kill is logged before its victim's parent sees it die)."""
    key = (kmsg, os.getpid())
    with _OOM_LOCK:
        began, fd, records = _OOM_READS.get(key, (-math.inf, None, None))
        if began < asked_at:
            began = time.monotonic()
            if fd is None:
                with contextlib.suppress(OSError):
                    fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                records = None if fd is None else []
            if fd is not None and records is not None:
                # Read on from where the previous read stopped.
                new = kernel_log_records(fd, MAX_KMSG_RECORDS, containing=_KILLED_WORDS)
                found = [
                    (at, int(m["pid"]), m["name"], message.strip().splitlines()[0][:500])
                    for at, message in new
                    if (m := _KILLED.search(message))
                ]
                records = [*records, *found][-MAX_KMSG_RECORDS:]
            _OOM_READS[key] = (began, fd, records)
        return records


def kernel_log_records(
    fd: int, limit: int, *, containing: bytes | None = None
) -> Iterator[tuple[float, str]]:
    """``(seconds since boot, message)`` of each record readable now from a non-blocking
    ``/dev/kmsg``, ``limit`` at most (an overwritten or too large record is passed over);
    ``containing``: only the records with those bytes (the others are not decoded)."""
    for _ in range(limit):
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            return
        except OSError:
            continue
        if not record:
            return
        if containing is not None and containing not in record:
            continue
        head, _, message = record.decode("utf-8", errors="replace").partition(";")
        fields = head.split(",")
        if len(fields) >= 3 and fields[2].isdigit():
            yield int(fields[2]) / 1e6, message


class KernelLogFollower:
    """The kernel log's records logged after :meth:`open` (None: not readable here); reads
    never block (called on the event loop)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, kmsg: Path = Path("/dev/kmsg")) -> KernelLogFollower | None:
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            # /dev/kmsg opens at its oldest record: follow only what is logged from now on.
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            return None
        return cls(fd)

    def new_records(self) -> list[tuple[float, str]]:
        """The records logged since the previous call (a bounded number; the rest wait)."""
        return (
            list(kernel_log_records(self._fd, MAX_KMSG_RECORDS_PER_READ)) if self._fd >= 0 else []
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def seconds_since_boot() -> float:
    """The clock the kernel log stamps its records with."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)
