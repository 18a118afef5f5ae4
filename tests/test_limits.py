"""The memory limit a run is judged against: the machine's, or its memory cgroup's.

Both cgroup versions are read from fake cgroup filesystems (a tree of files under tmp_path, and
a ``/proc/PID/cgroup`` file naming a cgroup in it); the version this machine has is also tested
for real, as root: a memory cgroup with a 256 MiB limit, a soak run inside it, a leak projected
against that limit, and a trainer the cgroup's OOM killer ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from asyncsoak._sampling._limits import memory_cgroup, memory_limit, read_limits

from .conftest import CLI_ENV, assert_valid

MiB = 2**20
GiB = 2**30
#: What cgroup v1 writes for "no limit".
V1_NO_LIMIT = "9223372036854771712"
CGROUP_ROOT = Path("/sys/fs/cgroup")
LIMIT = 256 * MiB


def cgroupfs(root: Path, files: dict[str, str]) -> Path:
    """A fake cgroup filesystem: ``files`` maps paths under ``root`` to their contents."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def proc_cgroup(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-cgroup"
    path.write_text(text)
    return path


V2_SLURM = {
    "cgroup.controllers": "cpuset cpu io memory pids\n",
    "system.slice/memory.max": "max\n",
    "slurm/uid_0/job_123/memory.max": str(512 * MiB),
    "slurm/uid_0/job_123/memory.high": "max\n",
    "slurm/uid_0/job_123/step_0/memory.max": "max\n",
    "slurm/uid_0/job_123/step_0/memory.high": str(768 * MiB),
    "slurm/uid_0/job_123/step_0/memory.current": str(100 * MiB),
    "slurm/uid_0/job_123/step_0/memory.events": (
        "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n"
    ),
}


def test_v2_the_tightest_memory_max_up_the_tree_is_the_limit_and_names_the_slurm_job(
    tmp_path: Path,
) -> None:
    """v2: a SLURM job's memory.max, set two levels up, is the limit; the job is named."""
    root = cgroupfs(tmp_path / "fs", V2_SLURM)
    named = proc_cgroup(tmp_path, "0::/slurm/uid_0/job_123/step_0\n")
    cgroup = memory_cgroup(named, root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert (cgroup.version, cgroup.path) == (2, "/slurm/uid_0/job_123/step_0")
    assert cgroup.hard is not None
    assert (cgroup.hard.bytes, cgroup.hard.file) == (512 * MiB, "memory.max")
    assert cgroup.hard.path == "/slurm/uid_0/job_123"
    assert cgroup.high_bytes == 768 * MiB
    assert cgroup.current_bytes == 100 * MiB
    assert cgroup.oom_kills == 2
    limit = memory_limit(24 * GiB, cgroup, environ={})
    assert limit == (512 * MiB, "cgroup memory.max (SLURM job 123)", "/slurm/uid_0/job_123")


def test_v2_a_lower_memory_high_is_the_limit_projected_against(tmp_path: Path) -> None:
    """v2: memory.high below memory.max is the lowest limit, and named as memory.high."""
    files = {**V2_SLURM, "slurm/uid_0/job_123/step_0/memory.high": str(300 * MiB)}
    root = cgroupfs(tmp_path / "fs", files)
    named = proc_cgroup(tmp_path, "0::/slurm/uid_0/job_123/step_0\n")
    cgroup = memory_cgroup(named, root, machine_bytes=24 * GiB)
    limit, source, where = memory_limit(24 * GiB, cgroup, environ={})
    assert (limit, source) == (300 * MiB, "cgroup memory.high (SLURM job 123)")
    assert where == "/slurm/uid_0/job_123/step_0"


def test_v2_a_group_without_the_memory_controller_reads_its_nearest_ancestor(
    tmp_path: Path,
) -> None:
    """v2: the soak's own tree group, without memory files, is answered by its parent."""
    files = {**V2_SLURM, "slurm/uid_0/job_123/step_0/asyncsoak-1-2/cgroup.procs": "42\n"}
    root = cgroupfs(tmp_path / "fs", files)
    named = proc_cgroup(tmp_path, "0::/slurm/uid_0/job_123/step_0/asyncsoak-1-2\n")
    cgroup = memory_cgroup(named, root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert cgroup.path == "/slurm/uid_0/job_123/step_0"
    assert cgroup.oom_kills == 2
    assert cgroup.hard_bytes == 512 * MiB


def test_v2_no_limit_anywhere_projects_against_the_machine(tmp_path: Path) -> None:
    """v2: "max" everywhere, or a limit above the machine's memory, is no limit."""
    files = {
        "cgroup.controllers": "memory pids\n",
        "user.slice/memory.max": str(64 * GiB),
        "user.slice/session-1.scope/memory.max": "max\n",
        "user.slice/session-1.scope/memory.high": "max\n",
        "user.slice/session-1.scope/memory.current": "1000\n",
        "user.slice/session-1.scope/memory.events": "oom_kill 0\n",
    }
    root = cgroupfs(tmp_path / "fs", files)
    named = proc_cgroup(tmp_path, "0::/user.slice/session-1.scope\n")
    cgroup = memory_cgroup(named, root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert cgroup.hard is None
    assert cgroup.high is None
    assert memory_limit(24 * GiB, cgroup, environ={}) == (24 * GiB, "machine memory", None)


def test_v2_a_kubernetes_pod_is_named(tmp_path: Path) -> None:
    """v2: a pod's cgroup (kubepods...) says so in the limit's source."""
    pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-1.scope"
    files = {
        "cgroup.controllers": "memory\n",
        f"{pod}/memory.max": str(2 * GiB),
        f"{pod}/memory.current": "1\n",
        f"{pod}/memory.events": "oom_kill 0\n",
    }
    root = cgroupfs(tmp_path / "fs", files)
    cgroup = memory_cgroup(proc_cgroup(tmp_path, f"0::/{pod}\n"), root, machine_bytes=24 * GiB)
    assert memory_limit(24 * GiB, cgroup, environ={})[1] == "cgroup memory.max (Kubernetes pod)"


def hybrid(memory_files: dict[str, str]) -> dict[str, str]:
    """A hybrid machine: v1 controllers, and an empty v2 hierarchy at ``unified``."""
    return {
        "unified/cgroup.controllers": "",
        "unified/cgroup.procs": "",
        "memory/cgroup.procs": "",
        "memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "freezer/cgroup.procs": "",
        **{f"memory/{name}": text for name, text in memory_files.items()},
    }


V1_PROC_CGROUP = "9:name=systemd:/\n6:freezer:/asyncsoak-1-2\n4:memory:/jobs/trainer\n0::/\n"


def test_v1_on_a_hybrid_machine_the_memory_controllers_line_decides(tmp_path: Path) -> None:
    """v1: the memory line's cgroup, its usage and oom_control's oom_kill; the tightest
    memory.limit_in_bytes from it up; v1's "no limit" (a huge number) is none."""
    root = cgroupfs(
        tmp_path / "fs",
        hybrid(
            {
                "jobs/memory.limit_in_bytes": str(LIMIT),
                "jobs/trainer/memory.limit_in_bytes": V1_NO_LIMIT,
                "jobs/trainer/memory.usage_in_bytes": str(50 * MiB),
                "jobs/trainer/memory.oom_control": (
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
                ),
            }
        ),
    )
    cgroup = memory_cgroup(proc_cgroup(tmp_path, V1_PROC_CGROUP), root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert (cgroup.version, cgroup.path) == (1, "/jobs/trainer")
    assert cgroup.hard is not None
    assert (cgroup.hard.bytes, cgroup.hard.path) == (LIMIT, "/jobs")
    assert cgroup.high is None
    assert (cgroup.current_bytes, cgroup.oom_kills) == (50 * MiB, 5)
    assert memory_limit(24 * GiB, cgroup, environ={"SLURM_JOB_ID": "77"}) == (
        LIMIT,
        "cgroup memory.limit_in_bytes (SLURM job 77)",
        "/jobs",
    )


def test_v1_no_limit_is_the_machines_memory(tmp_path: Path) -> None:
    """v1: only "no limit" numbers up to the root: the machine's memory is the limit."""
    files = hybrid(
        {
            "jobs/trainer/memory.limit_in_bytes": V1_NO_LIMIT,
            "jobs/trainer/memory.usage_in_bytes": "1\n",
            "jobs/trainer/memory.oom_control": "oom_kill 0\n",
        }
    )
    root = cgroupfs(tmp_path / "fs", files)
    cgroup = memory_cgroup(proc_cgroup(tmp_path, V1_PROC_CGROUP), root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert cgroup.hard is None
    assert memory_limit(24 * GiB, cgroup, environ={}) == (24 * GiB, "machine memory", None)


def test_v1_container_without_a_cgroup_namespace_reads_its_mounted_cgroup(
    tmp_path: Path,
) -> None:
    """v1 in a container: /proc names the host's path, the mount is the container's cgroup."""
    files = {
        "memory/cgroup.procs": "1\n",
        "memory/memory.limit_in_bytes": str(LIMIT),
        "memory/memory.usage_in_bytes": "1\n",
        "memory/memory.oom_control": "oom_kill 1\n",
    }
    root = cgroupfs(tmp_path / "fs", files)
    named = proc_cgroup(tmp_path, "4:memory:/docker/0123abcd\n")
    cgroup = memory_cgroup(named, root, machine_bytes=24 * GiB)
    assert cgroup is not None
    assert cgroup.path == "/docker/0123abcd"
    assert cgroup.hard is not None
    assert (cgroup.hard.bytes, cgroup.hard.path) == (LIMIT, "/docker/0123abcd")
    assert cgroup.oom_kills == 1


def test_no_cgroup_to_read_is_the_machines_memory(tmp_path: Path) -> None:
    """An unreadable /proc/PID/cgroup, or no memory controller: the machine's memory."""
    root = cgroupfs(tmp_path / "fs", {"unified/cgroup.controllers": ""})
    assert memory_cgroup(tmp_path / "missing", root) is None
    assert memory_cgroup(proc_cgroup(tmp_path, "0::/\n"), root) is None
    assert memory_limit(8 * GiB, None, environ={}) == (8 * GiB, "machine memory", None)
    assert memory_limit(None, None, environ={}) == (None, None, None)


# -- for real, as root, in a memory cgroup this machine has ---------------------------------


def own_memory_hierarchy() -> tuple[int, Path, str] | None:
    """(version, mount, this process's cgroup) of the hierarchy holding the memory controller."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return 1, CGROUP_ROOT / "memory", path
        if not controllers:
            unified = path
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        listed = mount / "cgroup.controllers"
        if unified is not None and listed.exists() and "memory" in listed.read_text().split():
            return 2, mount, unified
    return None


@contextlib.contextmanager
def limited_cgroup(limit: int) -> Iterator[tuple[Path, str]]:
    """A new memory cgroup limited to ``limit`` bytes, without swap: (directory, its name as
    /proc/PID/cgroup gives it).  On v1, a child of this process's own memory cgroup; on v2,
    of the root (the only cgroup that may hold processes and still give children controllers).
    Removed afterwards, once its members are gone."""
    hierarchy = own_memory_hierarchy() if os.geteuid() == 0 else None
    if hierarchy is None:
        pytest.skip("needs root and a memory cgroup controller (v1 or v2)")
    version, mount, own = hierarchy
    parent = mount / own.lstrip("/") if version == 1 else mount
    group = parent / f"asyncsoak-test-{uuid.uuid4().hex[:8]}"
    try:
        if version == 2:
            (mount / "cgroup.subtree_control").write_text("+memory")
        group.mkdir()
        (group / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit: {exc}")
    with contextlib.suppress(OSError):  # no swap: the limit is reached, not swapped past
        if version == 1:
            (group / "memory.swappiness").write_text("0")
        else:
            (group / "memory.swap.max").write_text("0")
    try:
        yield group, "/" + str(group.relative_to(mount))
    finally:
        for _ in range(200):
            try:
                group.rmdir()
                break
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (group / "cgroup.procs").read_text().split():
                        os.kill(int(pid), 9)
                time.sleep(0.05)  # killed members take a moment to leave the group


TRAINER = """
import pathlib, sys, time
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
keep = []
def tick():
    with open(progress / "metrics.txt", "a") as f:
        f.write("step\\n")
    time.sleep(0.05)
"""
#: 2 MiB per 50 ms tick, 120 MiB in all: well under 256 MiB with the monitor beside it.
SLOW_LEAK = TRAINER + "for _ in range(60):\n    keep.append(bytearray(2 * 2**20)); tick()\n"
#: 8 MiB per allocation until the cgroup's OOM killer ends it.
HOG = TRAINER + "tick()\nwhile True:\n    keep.append(bytearray(8 * 2**20))\n"
#: Joins the cgroup whose cgroup.procs is argv[1], then runs ``python -m asyncsoak argv[2:]``.
JOIN_THEN_SOAK = (
    "import os, sys\n"
    "with open(sys.argv[1], 'w') as f:\n    f.write(str(os.getpid()))\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'asyncsoak', *sys.argv[2:]])\n"
)
#: As in a container: the kernel log cannot be read (an empty file over /dev/kmsg).
WITHOUT_KERNEL_LOG = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind /dev/null /dev/kmsg && exec "$@"',
    "sh",
]


def soak_in_cgroup(
    tmp_path: Path, group: Path, trainer: str, *, wrapper: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``asyncsoak run`` (monitor, reaper and trainer) inside ``group``; its artifact."""
    output = tmp_path / "out" / "soak.json"
    run = [
        "run",
        "--progress-dir",
        str(tmp_path / "progress"),
        "--output",
        str(output),
        "--sample-interval",
        "0.05",
        "--stale-progress",
        "10",
        "--",
        sys.executable,
        "-c",
        trainer,
        str(tmp_path / "progress"),
    ]
    argv = [sys.executable, "-c", JOIN_THEN_SOAK, str(group / "cgroup.procs"), *run]
    done = subprocess.run(
        [*(wrapper or []), *argv], env=CLI_ENV, capture_output=True, text=True, timeout=100
    )
    assert output.exists(), done.stderr
    return done, json.loads(output.read_text())


@pytest.mark.slow
def test_the_commands_cgroup_is_read_not_the_monitors(tmp_path: Path) -> None:
    """read_limits reads the cgroup of the command's pid, not the one the monitor runs in."""
    with limited_cgroup(LIMIT) as (group, name):
        joined = (
            "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "print('ready', flush=True)\nsys.stdin.read()\n"
        )
        command = subprocess.Popen(
            [sys.executable, "-c", joined, str(group / "cgroup.procs")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert command.stdout is not None
            assert command.stdout.readline() == "ready\n"
            fields, cgroup = read_limits({}, command.pid, environ={})
            own, _ = read_limits({}, None, environ={})
        finally:
            command.communicate(timeout=10)
    assert cgroup is not None
    assert cgroup.path == name
    assert fields["cgroup_path"] == name
    assert fields["cgroup_memory_max_bytes"] == LIMIT
    assert fields["memory_limit_bytes"] == LIMIT
    assert fields["memory_limit_source"] in ("cgroup memory.limit_in_bytes", "cgroup memory.max")
    assert fields["memory_limit_cgroup"] == name
    assert own["cgroup_path"] != name
    assert own["memory_limit_bytes"] != LIMIT


@pytest.mark.slow
def test_a_leak_under_a_cgroup_limit_is_projected_against_that_limit(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A slowly leaking trainer in a 256 MiB cgroup: the trend's limit is the cgroup's, named,
    and the time to reach it is projected against 256 MiB, not the machine's memory."""
    with limited_cgroup(LIMIT) as (group, name):
        done, artifact = soak_in_cgroup(tmp_path, group, SLOW_LEAK)
    assert done.returncode == 0, done.stderr
    assert_valid(artifact, schema)
    version = artifact["limits"]["cgroup_version"]
    source = "cgroup memory.limit_in_bytes" if version == 1 else "cgroup memory.max"
    assert artifact["limits"]["cgroup_path"] == name
    assert artifact["limits"]["cgroup_memory_max_bytes"] == LIMIT
    assert artifact["limits"]["memory_limit_bytes"] == LIMIT
    assert artifact["limits"]["memory_limit_source"] == source
    assert artifact["limits"]["memory_limit_cgroup"] == name
    pid = artifact["exit"]["pid"]
    entry = artifact["trends"][f"process.{pid}.anon_bytes"]
    assert entry["verdict"] == "leak", entry
    assert (entry["limit"], entry["limit_source"]) == (LIMIT, source)
    to_limit = (LIMIT - entry["last"]) / entry["slope_per_hour"] * 3600
    assert entry["projected_seconds_to_limit"] == pytest.approx(to_limit, rel=0.01)
    assert any(f"will reach {source} (256.0 MiB)" in w for w in artifact["warnings"])


@pytest.mark.slow
@pytest.mark.parametrize("kernel_log", ["readable", "unreadable"])
def test_a_cgroup_oom_kill_is_recorded_from_the_cgroups_counter(
    tmp_path: Path, schema: Draft202012Validator, kernel_log: str
) -> None:
    """A trainer past its cgroup's 256 MiB limit, ended by the cgroup's OOM killer: the
    artifact records the kill from the cgroup's own counter, with the kernel log's record when
    it can be read, and from the counter alone when it cannot (a container)."""
    wrapper = WITHOUT_KERNEL_LOG if kernel_log == "unreadable" else None
    if wrapper is None and not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel log is not readable here")
    with limited_cgroup(LIMIT) as (group, name):
        done, artifact = soak_in_cgroup(tmp_path, group, HOG, wrapper=wrapper)
    assert done.returncode == 1, done.stderr
    assert_valid(artifact, schema)
    assert artifact["exit"]["signal"] == "SIGKILL"
    [failure] = artifact["failures"]
    assert failure["reason"] == "signaled"
    assert failure["message"].startswith(
        f"the command was killed by the cgroup's OOM killer (memory limit 256.0 MiB of cgroup "
        f"{name}), with SIGKILL"
    )
    [kill] = artifact["oom_kills"]
    assert kill["pid"] == artifact["exit"]["pid"]
    assert kill["cgroup_path"] == name
    assert kill["cgroup_memory_limit_bytes"] == LIMIT
    summary = subprocess.run(
        [sys.executable, "-m", "asyncsoak", "summary", str(tmp_path / "out" / "soak.json")],
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = " ".join(summary.stdout.split())  # the summary wraps its lines
    assert f"The OOM killer of cgroup {name} (memory limit 256.0 MiB) killed pid" in said, said
    if kernel_log == "readable":
        assert kill["detected_by"] == ["kernel_log", "cgroup_counter"]
        assert "Killed process" in kill["message"]
    else:
        assert kill["detected_by"] == ["cgroup_counter"]
        assert "oom_kill counter" in kill["message"]
