"""asyncsoak in a Kubernetes pod: the pod's identity and limits, its ``--output`` patterns,
``/healthz``, and, for real, asyncsoak as PID 1 of its own PID namespace under a memory
cgroup, stopped by the kubelet's SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import anyio
import psutil
import pytest

from asyncsoak import Metrics, run_soak
from asyncsoak._contract._schema import Artifact
from asyncsoak._export._metrics_server import MetricsServer, open_listener
from asyncsoak._export._soak_metrics import SoakMetrics
from asyncsoak._sampling._limits import cgroup_cpu_limit_cores
from asyncsoak._supervisor._kubernetes import GRACE_ANNOTATION, pattern_values, pod_identity
from asyncsoak._supervisor._slurm import PatternError, expand_path, stop_grace
from asyncsoak._view._job_view import pod_line

from .conftest import CLI_ENV, ReadyFifo, fast_limits, py, tree_pids
from .metrics_support import free_port, http_get
from .test_limits import CGROUP_ROOT, cgroupfs, limited_cgroup, proc_cgroup

MiB = 2**20

#: What a pod's container sees: the variables the shipped manifests set through the downward
#: API, and what Kubernetes sets itself.
POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "POD_NAME": "train-2-x7k2p",
    "POD_NAMESPACE": "ml",
    "NODE_NAME": "gpu-node-7",
    "HOSTNAME": "train-2-x7k2p",
    "JOB_COMPLETION_INDEX": "2",
}


def podinfo(tmp_path: Path, grace: str = "6") -> Path:
    """A downward API volume: the pod's labels and annotations as Kubernetes writes them."""
    directory = tmp_path / "podinfo"
    directory.mkdir()
    (directory / "labels").write_text(
        'batch.kubernetes.io/job-name="train"\n'
        'batch.kubernetes.io/job-completion-index="2"\n'
        'jobset.sigs.k8s.io/replicatedjob-name="node"\n'
        'jobset.sigs.k8s.io/job-index="1"\n'
    )
    (directory / "annotations").write_text(f'{GRACE_ANNOTATION}="{grace}"\nother="x"\n')
    return directory


def test_the_pods_identity_and_limits(tmp_path: Path) -> None:
    """In a pod: name, namespace, node, Job, completion index, JobSet's replicated job and
    index (from the labels), the cgroup's CPU and memory limits, and the grace period from
    the downward API; outside a pod, nothing."""
    root = cgroupfs(
        tmp_path / "fs",
        {
            "cgroup.controllers": "cpu memory pids\n",
            "cgroup.procs": "",
            "kubepods/pod1/memory.max": str(512 * MiB),
            "kubepods/pod1/memory.current": "1\n",
            "kubepods/pod1/cpu.max": "max 100000\n",
            "kubepods/pod1/c1/memory.max": "max\n",
            "kubepods/pod1/c1/memory.current": "1\n",
            "kubepods/pod1/c1/cpu.max": "250000 100000\n",
        },
    )
    env = {**POD_ENV, "ASYNCSOAK_PODINFO_DIR": str(podinfo(tmp_path))}
    identity = pod_identity(
        env,
        service_account=tmp_path / "no-sa",
        proc_cgroup=proc_cgroup(tmp_path, "0::/kubepods/pod1/c1\n"),
        cgroup_root=root,
    )
    assert identity is not None
    assert {k: identity[k] for k in ("kind", "pod_name", "namespace", "node", "hostname")} == {
        "kind": "kubernetes",
        "pod_name": "train-2-x7k2p",
        "namespace": "ml",
        "node": "gpu-node-7",
        "hostname": "train-2-x7k2p",
    }
    assert (identity["job_name"], identity["completion_index"]) == ("train", 2)
    assert (identity["replicated_job_name"], identity["job_index"]) == ("node", 1)
    assert (identity["cpu_limit_cores"], identity["memory_limit_bytes"]) == (2.5, 512 * MiB)
    assert identity["termination_grace_period_seconds"] == 6.0
    assert identity["termination_grace_source"] == "downward API"
    shown = pod_line(cast("Artifact", {"snapshot": {"scheduler": identity}}))
    assert shown == "ml/train-2-x7k2p on gpu-node-7 (job train, index 2)"
    assert pod_identity({}, service_account=tmp_path / "no-sa") is None


def test_the_grace_is_kept_under_the_pods_and_given_beats_the_downward_api(
    tmp_path: Path,
) -> None:
    """--scheduler-grace wins over the annotation; without either, Kubernetes' 30 s; the
    trainer's grace is cut so asyncsoak kills first and writes before the SIGKILL."""
    env = {**POD_ENV, "ASYNCSOAK_PODINFO_DIR": str(podinfo(tmp_path, grace="120"))}
    given = pod_identity(env, grace=20.0, service_account=tmp_path / "no-sa")
    assert given is not None
    assert (given["kill_wait_seconds"], given["termination_grace_source"]) == (
        20.0,
        "--scheduler-grace",
    )
    bare = pod_identity(POD_ENV, service_account=tmp_path / "no-sa")
    assert bare is not None
    assert (bare["termination_grace_period_seconds"], bare["kill_wait_seconds"]) == (None, 30.0)
    assert stop_grace(60.0, given) == pytest.approx(15.0)  # 20 - (3 + 20/10)
    assert stop_grace(5.0, given) == 5.0


def test_cpu_limits_of_both_cgroup_versions(tmp_path: Path) -> None:
    """v1's cfs quota over period, v2's cpu.max; the tightest up the tree; none is None."""
    v1 = cgroupfs(
        tmp_path / "v1",
        {
            "cpu,cpuacct/cgroup.procs": "",
            "cpu,cpuacct/kubepods/cpu.cfs_quota_us": "400000\n",
            "cpu,cpuacct/kubepods/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/kubepods/c1/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/kubepods/c1/cpu.cfs_period_us": "100000\n",
        },
    )
    named = proc_cgroup(tmp_path, "3:cpu,cpuacct:/kubepods/c1\n0::/\n")
    assert cgroup_cpu_limit_cores(named, v1) == 4.0
    v2 = cgroupfs(tmp_path / "v2", {"cgroup.controllers": "cpu\n", "a/cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit_cores(proc_cgroup(tmp_path, "0::/a\n"), v2) is None


def test_output_patterns_name_the_pod_and_its_index(tmp_path: Path) -> None:
    """In a pod, %p is the pod's name and %i its completion index (%J, %n, %N too); an
    unknown pattern is refused; outside a pod the path is taken as written."""
    env = {**POD_ENV, "ASYNCSOAK_PODINFO_DIR": str(tmp_path / "none")}
    path = Path("/results/%n/soak-%p-%i-%J.json")
    assert expand_path(path, env) == Path("/results/ml/soak-train-2-x7k2p-2-0.json")
    with pytest.raises(PatternError, match="%x"):
        expand_path(Path("/results/%x.json"), env)
    assert expand_path(path, {}) == path


def test_output_patterns_agree_with_the_snapshot_or_are_refused(tmp_path: Path) -> None:
    """Without POD_NAMESPACE, %n is the namespace the snapshot records (the service
    account's file), not "default"; without NODE_NAME, %N is refused (a pod's host name is
    the pod's, not the node's) with the variable to set."""
    service_account = tmp_path / "serviceaccount"
    service_account.mkdir()
    (service_account / "namespace").write_text("ml")
    env = {k: v for k, v in POD_ENV.items() if k not in ("POD_NAMESPACE", "NODE_NAME", "POD_NAME")}
    env["ASYNCSOAK_PODINFO_DIR"] = str(tmp_path / "none")
    identity = pod_identity(env, service_account=service_account)
    assert identity is not None
    values = pattern_values(env, service_account=service_account)
    assert (
        (values["n"], values["p"])
        == (identity["namespace"], identity["pod_name"])
        == (
            "ml",
            "train-2-x7k2p",
        )
    )
    with pytest.raises(PatternError, match="%N needs NODE_NAME"):
        expand_path(Path("/results/%N.json"), env)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_healthz_answers_200_while_samples_come_and_503_when_they_stop(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A live soak's /healthz is 200; a soak whose samples stopped coming is 503."""
    port = free_port()
    say = f"open({str(ready.path)!r}, 'w').write('ready\\n')"
    # The trainer outlives the check (the task group is cancelled after it): the answer is a
    # live soak's, never a finished one's.
    code = f"import time\n{say}\ntime.sleep(60)"
    limits = fast_limits(tmp_path, startup_timeout_seconds=60.0)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_soak(command=py(code), metrics=Metrics(port=port), **limits))
            assert await ready.line() == "ready"
            alive = await http_get(port, "/healthz")
            tg.cancel_scope.cancel()
    assert alive.status == 200, alive.text
    assert alive.text.startswith(("ok: last sample", "ok: start, no sample yet")), alive.text
    clock = [1000.0]
    stuck = SoakMetrics("s", now=lambda: clock[0], host="h")
    config = {"sample_interval_seconds": 1.0}
    header = {"kind": "header", "t": 0.0, "config": config, "monotonic_start": 1000.0}
    stuck.observe({**header, "started_at": None})
    stuck.observe({"kind": "sample", "t": 1.0, "points": {}})
    clock[0] += 62.0
    listener = await open_listener("127.0.0.1", 0)
    server = MetricsServer(listener, lambda accept: (b"", "text/plain"), stuck.health)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            dead = await http_get(server.port, "/healthz")
            tg.cancel_scope.cancel()
    assert dead.status == 503
    assert dead.text.startswith("unhealthy: last sample 61s ago (limit 60s)")


def test_healthz_keeps_to_the_monitors_clock_when_the_wall_clock_steps() -> None:
    """A wall clock stepped an hour forward (NTP, a resumed VM) while samples keep coming
    leaves /healthz at 200 (a 503 would have the liveness probe kill a healthy training);
    samples that stop give 503 on the monitor's own clock."""
    mono, wall = [500.0], [1_000_000.0]
    metrics = SoakMetrics("s", now=lambda: mono[0], host="h")
    metrics.observe(
        {
            "kind": "header",
            "t": 0.0,
            "monotonic_start": 500.0,
            "started_at": "1970-01-12T13:46:40+00:00",
            "config": {"sample_interval_seconds": 1.0},
        }
    )
    for second in range(1, 4):
        mono[0] += 1.0
        metrics.observe({"kind": "sample", "t": float(second), "points": {}})
        if second == 2:
            wall[0] += 3600.0
        wall[0] += 1.0
        alive, text = metrics.health()
        assert alive, text
    mono[0] += 61.0
    alive, text = metrics.health()
    assert not alive
    assert text.startswith("unhealthy: last sample 61s ago (limit 60s)"), text


# -- for real: PID 1 of a PID namespace, in a memory cgroup ------------------------------

#: A trainer that makes progress, starts a grandchild that leaves it (double fork and
#: setsid: an orphan), says both pids, and ignores SIGTERM (as one busy in a collective).
ORPHANING_TRAINER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
(progress / "step").write_text("1")
reading, writing = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(writing, str(os.getpid()).encode())
        os.close(writing)
        time.sleep(300)
    os._exit(0)
os.close(writing)
os.wait()
orphan = int(os.read(reading, 32))
with open(sys.argv[2], "w") as ready:
    ready.write(f"{os.getpid()} {orphan}\\n")
while True:
    (progress / "step").write_text(str(time.time()))
    time.sleep(0.1)
"""


@contextlib.contextmanager
def cpu_quota(memory_group: Path, cores: float) -> Iterator[Path]:
    """A CPU quota of ``cores`` (a container's ``limits.cpu``): on cgroup v2 set on the
    memory cgroup itself (a process has one v2 cgroup), on v1 a cgroup of the cpu
    controller's own, removed afterwards."""
    period = 100_000
    quota = int(cores * period)
    v2 = (memory_group / "memory.max").exists()
    try:
        if v2:
            (memory_group.parent / "cgroup.subtree_control").write_text("+cpu")
            (memory_group / "cpu.max").write_text(f"{quota} {period}")
        else:
            mount = next(
                CGROUP_ROOT / name
                for name in ("cpu,cpuacct", "cpu")
                if (CGROUP_ROOT / name / "cpu.cfs_quota_us").exists()
            )
            group = mount / f"asyncsoak-test-{uuid.uuid4().hex[:8]}"
            group.mkdir()
    except (OSError, StopIteration) as exc:
        pytest.skip(f"cannot set a CPU quota: {exc!r}")
    if v2:
        yield memory_group
        return
    try:
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            group.rmdir()


@pytest.mark.slow
def test_pid1_in_a_pid_namespace_stops_as_the_schedulers_stop_within_the_grace(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """asyncsoak as PID 1 (unshare --pid), in a 512 MiB memory cgroup, in a pod's
    environment, its trainer orphaning a child and ignoring SIGTERM: the kubelet's SIGTERM
    is the scheduler's stop, the grace is cut to fit the pod's 6 s, the tree (orphan
    included) is killed, and the artifact (with the pod's identity) and the termination
    message are written before the pod's grace runs out."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare")
    trainer = tmp_path / "trainer.py"
    trainer.write_text(ORPHANING_TRAINER)
    output, log = tmp_path / "out" / "soak-%p-%i.json", tmp_path / "termination-log"
    env = {**CLI_ENV, **POD_ENV, "ASYNCSOAK_PODINFO_DIR": str(podinfo(tmp_path, grace="6"))}
    with limited_cgroup(512 * MiB) as (group, _name), cpu_quota(group, 1.5) as cpu_group:
        joined = " && ".join(f"echo $$ > {g / 'cgroup.procs'}" for g in {group, cpu_group})
        join = f'{joined} && exec "$@"'
        monitor = subprocess.Popen(
            [
                *("sh", "-c", join, "sh", "unshare", "--pid", "--fork", "--mount-proc"),
                *(sys.executable, "-m", "asyncsoak", "run", "--quiet", "--no-gpu"),
                *("--progress-dir", str(tmp_path / "progress"), "--output", str(output)),
                *("--sample-interval", "0.1", "--grace", "30", "--stale-progress", "30"),
                *("--detailed-exit-codes", "--termination-log", str(log)),
                *("--", sys.executable, str(trainer), str(tmp_path / "progress"), str(ready.path)),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            trainer_pid, orphan_pid = map(int, ready.line_sync(timeout=30).split())
            pid1 = psutil.Process(monitor.pid).children()[0]
            assert f"NSpid:\t{pid1.pid}\t1" in Path(f"/proc/{pid1.pid}/status").read_text()
            pid1.send_signal(signal.SIGTERM)
            _, stderr = monitor.communicate(timeout=30)
        finally:
            monitor.kill()
            monitor.wait()
    assert monitor.returncode == 128 + signal.SIGTERM, stderr
    artifact = json.loads((tmp_path / "out" / "soak-train-2-x7k2p-2.json").read_text())
    assert artifact["status"] == "cancelled"
    assert artifact["stop"]["cause"] == "scheduler"
    assert artifact["stop"]["grace_seconds"] == pytest.approx(6 - (3 + 0.6))
    assert artifact["stop"]["killed"] is True
    assert artifact["exit"]["pid"] == trainer_pid
    assert orphan_pid in tree_pids(artifact)
    scheduler = artifact["snapshot"]["scheduler"]
    assert scheduler["kind"] == "kubernetes"
    assert (scheduler["pod_name"], scheduler["namespace"], scheduler["node"]) == (
        "train-2-x7k2p",
        "ml",
        "gpu-node-7",
    )
    assert (scheduler["job_name"], scheduler["completion_index"]) == ("train", 2)
    assert (scheduler["memory_limit_bytes"], scheduler["cpu_limit_cores"]) == (512 * MiB, 1.5)
    assert scheduler["termination_grace_period_seconds"] == 6.0
    message = log.read_text().splitlines()
    assert message[0] == "asyncsoak: stopped by the scheduler (SIGTERM)"
    assert message[2:] == [
        "exit_code: 143",
        f"artifact: {tmp_path / 'out' / 'soak-train-2-x7k2p-2.json'}",
    ]


#: A trainer that ignores SIGTERM (busy in a collective), with a child the test freezes: in
#: the kernel's refrigerator it outlives SIGKILL, as a process stuck in a GPU driver does.
STUCK_CHILD_TRAINER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
progress = pathlib.Path(sys.argv[1])
progress.mkdir(parents=True, exist_ok=True)
(progress / "step").write_text("1")
child = os.fork()
if child == 0:
    time.sleep(300)
    os._exit(0)
with open(sys.argv[2], "w") as ready:
    ready.write(f"{child}\\n")
while True:
    (progress / "step").write_text(str(time.time()))
    time.sleep(0.1)
"""


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """``pid`` frozen in a cgroup v1 freezer (where SIGKILL waits for the thaw: the process
    sits in uninterruptible sleep), thawed and the cgroup removed afterwards."""
    mount = CGROUP_ROOT / "freezer"
    if os.geteuid() != 0 or not (mount / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 freezer")
    group = mount / f"asyncsoak-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline, "the freezer never froze"
            time.sleep(0.01)
        yield
    finally:
        (group / "freezer.state").write_text("THAWED")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


@pytest.mark.slow
def test_a_process_that_outlives_sigkill_does_not_cost_the_artifact(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """In a pod with a 6 s grace, a child that SIGKILL cannot end at once (uninterruptible
    sleep, as in a wedged GPU driver) does not hold the stop past the pod's grace: asyncsoak
    gives up on it in time to write the artifact and the termination message before the
    kubelet's SIGKILL."""
    trainer = tmp_path / "trainer.py"
    trainer.write_text(STUCK_CHILD_TRAINER)
    output, log = tmp_path / "soak.json", tmp_path / "termination-log"
    env = {**CLI_ENV, **POD_ENV, "ASYNCSOAK_PODINFO_DIR": str(podinfo(tmp_path, grace="6"))}
    monitor = subprocess.Popen(
        [
            *(sys.executable, "-m", "asyncsoak", "run", "--quiet", "--no-gpu"),
            *("--progress-dir", str(tmp_path / "progress"), "--output", str(output)),
            *("--sample-interval", "0.1", "--grace", "30", "--stale-progress", "30"),
            *("--termination-log", str(log)),
            *("--", sys.executable, str(trainer), str(tmp_path / "progress"), str(ready.path)),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(ready.line_sync(timeout=30))
        with frozen(child):
            monitor.send_signal(signal.SIGTERM)
            _, stderr = monitor.communicate(timeout=30)
    finally:
        monitor.kill()
        monitor.wait()
    assert monitor.returncode == 128 + signal.SIGTERM, stderr
    artifact = json.loads(output.read_text())
    assert artifact["stop"]["cause"] == "scheduler"
    assert child in {p["pid"] for p in artifact["abandoned_processes"]}
    assert log.read_text().splitlines()[0] == "asyncsoak: stopped by the scheduler (SIGTERM)"
