"""The supervised process tree as /proc shows it: every descendant of the soak's reaper, from
``/proc/PID/task/TID/children`` (a scan where the kernel lacks it); a vanished process is normal."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HAS_CHILDREN_FILES = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (empty when it is gone)."""
    if not _HAS_CHILDREN_FILES:
        pids = map(int, filter(str.isdigit, os.listdir("/proc")))
        return [p for p in pids if _stat_field(p, 1) == pid]  # field 1: its ppid
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return out


def _stat_field(pid: int, index: int) -> int | None:
    """Field ``index + 3`` of ``/proc/PID/stat``, an integer (None when gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # comm (field 2) may contain spaces and parentheses: split after the last ')'.
        return int(stat.rsplit(b")", 1)[1].split()[index])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before children; ``pid`` itself excluded."""
    out: list[int] = []
    seen = {pid}
    stack = [pid]
    while stack:
        for child in children(stack.pop()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                stack.append(child)
    return out


def start_time_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``: with the pid, a process identity that survives reuse."""
    return _stat_field(pid, 19)


def describe(pid: int, *, leader_pgid: int | None = None) -> dict[str, Any] | None:
    """What the artifact says about a process of the tree; None when it is already gone."""
    import psutil  # here: the reaper imports this module and never describes a process

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            info: dict[str, Any] = {
                "pid": pid,
                "ppid": p.ppid(),
                "name": p.name(),
                "state": p.status(),
                "pgid": os.getpgid(pid),
                "sid": os.getsid(pid),
                "create_time": p.create_time(),
            }
            try:
                info["cmdline"] = p.cmdline()
            except psutil.AccessDenied:
                info["cmdline"] = None
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError):
        return None
    except psutil.AccessDenied:
        return {"pid": pid, "name": None, "state": "unknown", "cmdline": None}
    if leader_pgid is not None:
        # How it left the command's process group (the command's pid is its session's and
        # group's id), or that it did not.
        info["left_group"] = (
            "still in the command's process group"
            if info["pgid"] == leader_pgid
            else "left the command's session (setsid / daemonised)"
            if info["sid"] != leader_pgid
            else "moved to another process group (setpgid)"
        )
    return info


def find_marked(variable: str, value: str) -> list[int]:
    """Processes whose environment holds ``variable=value`` (the soak's marker): the tree's
    that left the reaper.  Reads every environ: for the stop only, never for sampling."""
    needle = f"{variable}={value}".encode()
    return [pid for pid, environ in environments() if needle in environ]


def environments(*, skip: int | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """Every readable process's pid and ``NAME=value`` entries; each read waits on the target's
    mmap lock, so callers bound the whole scan."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        yield int(entry), environ.split(b"\0")


def cmdline(pid: int) -> list[bytes] | None:
    """The raw arguments of ``pid`` (None when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def holds_open(pid: int, file_key: tuple[int, int]) -> bool:
    """Whether ``pid`` has the file (device, inode) ``file_key`` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == file_key:
            return True
    return False
