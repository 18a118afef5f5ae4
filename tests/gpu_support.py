"""Test support for the GPU side: the captured nvidia-smi fixtures and a fake ``nvidia-smi``."""

from __future__ import annotations

import json
import os
import select
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fake_nvidia_smi

FAKE_SCRIPT = Path(fake_nvidia_smi.__file__)
#: The field lists the fixtures were captured with (fixtures README: F and A).
FIXTURE_GPU_FIELDS: tuple[str, ...] = tuple(fake_nvidia_smi.GPU_FIELDS)
FIXTURE_APP_FIELDS: tuple[str, ...] = tuple(fake_nvidia_smi.APP_FIELDS)
#: The pid of the process in the "load" captures.
CAPTURED_PID = int(fake_nvidia_smi.CAPTURED_PID)


def exited(pid: int, timeout: float) -> bool:
    """Whether ``pid`` has ended (a zombie counts) within ``timeout``: a pidfd, not polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def fixture(name: str) -> str:
    path = fake_nvidia_smi.fixtures() / name
    if not path.exists():
        raise FileNotFoundError(
            f"nvidia-smi fixture {path} is missing: the captures belong in "
            "tests/fixtures/nvidia-smi/h200"
        )
    return path.read_text()


@dataclass(frozen=True)
class FakeNvidiaSmi:
    """An installed fake: pass ``path`` as ``nvidia_smi``, or run a command with ``env``."""

    path: Path
    #: PATH with the fake first, plus the fake's settings.
    env: dict[str, str]
    log: Path

    def invocations(self) -> list[dict[str, Any]]:
        """Every run of the fake so far: ``{"pid", "argv"}``."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def loops(self) -> list[dict[str, Any]]:
        return [i for i in self.invocations() if "-lms" in i["argv"]]

    def calls(self) -> list[dict[str, Any]]:
        return [
            i
            for i in self.invocations()
            if "-lms" not in i["argv"] and any(a.startswith("--query") for a in i["argv"])
        ]


def install_fake_nvidia_smi(
    directory: Path,
    mode: str = "load",
    *,
    pid: int | None = None,
    pid2: int | None = None,
    gpus: int = 1,
    hang_after: int = 0,
    loop_iterations: int | None = None,
    reject: tuple[str, ...] = (),
    pid_file: Path | None = None,
    grow_mib_per_s: float | None = None,
    bus_id: str | None = None,
    utilization: float | None = None,
    power_w: float | None = None,
    fault_file: Path | None = None,
    throttle_mask: int | None = None,
    whole_seconds: bool = False,
) -> FakeNvidiaSmi:
    """Write an executable ``nvidia-smi`` into ``directory/fake-bin`` with its settings baked in.

    ``pid`` replaces the captured process's pid; see ``fake_nvidia_smi.py`` for the modes.
    """
    fixture("version.txt")  # fail here, clearly, when the fixtures cannot be found
    bindir = directory / "fake-bin"
    bindir.mkdir(parents=True, exist_ok=True)
    log = directory / "fake-nvidia-smi.log"
    settings = {
        "FAKE_SMI_MODE": mode,
        "FAKE_SMI_GPUS": str(gpus),
        "FAKE_SMI_HANG_AFTER": str(hang_after),
        "FAKE_SMI_LOG": str(log),
        "FAKE_SMI_REJECT": ",".join(reject),
    }
    if pid is not None:
        settings["FAKE_SMI_PID"] = str(pid)
    if pid2 is not None:
        settings["FAKE_SMI_PID2"] = str(pid2)
    if pid_file is not None:
        settings["FAKE_SMI_PID_FILE"] = str(pid_file)
    if loop_iterations is not None:
        settings["FAKE_SMI_LOOP_ITERATIONS"] = str(loop_iterations)
    for name, value in (
        ("FAKE_SMI_BUS_ID", bus_id),
        ("FAKE_SMI_UTIL", None if utilization is None else f"{utilization:g}"),
        ("FAKE_SMI_POWER_W", None if power_w is None else f"{power_w:.2f}"),
        ("FAKE_SMI_FAULT_FILE", None if fault_file is None else str(fault_file)),
        ("FAKE_SMI_THROTTLE", None if throttle_mask is None else hex(throttle_mask)),
        ("FAKE_SMI_WHOLE_SECONDS", "1" if whole_seconds else None),
    ):
        if value is not None:
            settings[name] = value
    if grow_mib_per_s is not None:
        settings["FAKE_SMI_GROW_MIB_PER_S"] = str(grow_mib_per_s)
        settings["FAKE_SMI_GROW_SINCE"] = str(time.time())
    path = bindir / "nvidia-smi"
    # -S: the fake needs only the standard library, and starts faster without site.
    path.write_text(
        f"#!{sys.executable} -S\n"
        "import os, runpy\n"
        f"os.environ.update({settings!r})\n"
        f"runpy.run_path({str(FAKE_SCRIPT)!r}, run_name='__main__')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = {**settings, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return FakeNvidiaSmi(path=path, env=env, log=log)
