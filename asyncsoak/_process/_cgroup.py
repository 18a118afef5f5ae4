"""A cgroup for the soak's tree where the kernel allows one: it holds every descendant whatever
it does (``setsid``, a scrubbed environment).  A child of our own v2 cgroup, else as root a v1
``freezer`` group, else None; blocking cgroupfs work, for ``run_blocking``."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

#: Where cgroup filesystems are looked for.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Bound on waiting for a v1 freezer to report the group frozen.
FREEZE_WAIT_SECONDS = 1.0
#: Bound on waiting for the killed members to be reaped before the group can be removed.
REMOVE_WAIT_SECONDS = 0.5


class TreeCgroup:
    """One soak's cgroup (``version`` 2, or 1 for the v1 freezer)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        """Every process in the group now (empty once the group is gone)."""
        try:
            with open(self.procs_file) as f:
                return [int(line) for line in f.read().split()]
        except OSError:
            return []

    def holds(self, pid: int) -> bool:
        return pid in self.pids()

    def kill(self) -> None:
        """SIGKILL every member at once, so that a forking tree cannot outrun the kill."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
                return
        state = self.path / "freezer.state"
        frozen = False
        with contextlib.suppress(OSError):
            state.write_text("FROZEN")
            deadline = time.monotonic() + FREEZE_WAIT_SECONDS
            while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)  # the kernel freezes the members asynchronously
            frozen = True
        try:
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            if frozen:  # killed frozen tasks die once thawed
                with contextlib.suppress(OSError):
                    state.write_text("THAWED")

    def remove(self) -> bool:
        """Remove the group once empty; False if still there after a bound (a member in D)."""
        deadline = time.monotonic() + REMOVE_WAIT_SECONDS
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)  # the last members are being reaped


def create(name: str, root: Path = CGROUP_ROOT) -> TreeCgroup | None:
    """A new empty cgroup called ``name`` for a soak's tree, or None where none can be made."""
    for version, parent in _candidates(root):
        _sweep(parent)
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            continue
        # A v2 group must offer cgroup.kill (Linux 5.14+); the root group never has one.
        if (path / ("cgroup.kill" if version == 2 else "cgroup.procs")).exists():
            return TreeCgroup(path, version)
        with contextlib.suppress(OSError):
            path.rmdir()
    return None


def _sweep(parent: Path) -> None:
    """Remove the empty groups of soaks whose monitor is gone (rmdir refuses a populated one)."""
    try:
        entries = list(parent.glob("asyncsoak-*-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name.split("-")[1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            entry.rmdir()


def _candidates(root: Path) -> list[tuple[int, Path]]:
    """Where a child group may go: this process's own v2 cgroup (under the v2 mount: ``root``
    itself, or its ``unified``), then the v1 freezer's root."""
    parents: list[tuple[int, Path]] = []
    own = None
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for left, _, right in (line.partition(" - ") for line in f):
            mount = Path(left.split()[4])
            if right.split(" ", 1)[0] == "cgroup2" and (mount == root or root in mount.parents):
                if own is not None:
                    parents.append((2, mount / own.lstrip("/")))
                break
    parents.append((1, root / "freezer"))
    return [
        (version, parent)
        for version, parent in parents
        if (parent / "cgroup.procs").exists() and os.access(parent, os.W_OK)
    ]
