"""A real single-node SLURM cluster in a temp dir, for the tests that run soaks through sbatch.

Debian's ``slurm-wlm`` daemons run in the foreground (``-D``), backgrounded, on loopback only,
with ``auth/none`` (no munge), ``proctrack/linuxproc`` (scancel signals every process of the
job, as on many clusters), a short ``KillWait`` and ``cred_expire`` so that a requeued job
comes back in seconds.  They are stopped by pid: ``slurmd`` never writes its pid file when
it cannot reach the controller.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: SIGTERM to SIGKILL in the cluster's jobs: short, so the tests see the whole sequence.
KILL_WAIT_S = 8
#: How long a requeued job waits before it may start again (SLURM's default is 120 s).
CRED_EXPIRE_S = 10
#: Bound on the daemons coming up (about 0.3 s here) and on every client command.
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 15.0

DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun")


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None]
    if absent:
        return f"slurm-wlm is not installed (missing: {', '.join(absent)})"
    if os.geteuid() != 0:
        return "a throwaway SLURM cluster runs its daemons as root (SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memory_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return max(256, int(line.split()[1]) // 1024 // 2)
    return 1024


class SlurmCluster:
    """``with SlurmCluster(tmp) as cluster:`` one controller and one node, on loopback."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.node = socket.gethostname().split(".")[0]
        self.conf = base / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in list(self.env):
            # A test run from inside a SLURM job must not hand that job's identity on.
            if name.startswith("SLURM_") and name != "SLURM_CONF":
                del self.env[name]
        self._procs: list[subprocess.Popen[bytes]] = []

    def _write_conf(self) -> None:
        for sub in ("state", "spool", "log", "run"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        b = self.base
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=asyncsoak-test",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/none",
                    "CredType=cred/none",
                    f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "ReturnToService=2",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={b}/log/jobcomp.txt",
                    f"KillWait={KILL_WAIT_S}",
                    "MinJobAge=300",
                    "SchedulerParameters=defer_batch=0",
                    f"StateSaveLocation={b}/state",
                    f"SlurmdSpoolDir={b}/spool",
                    f"SlurmctldPidFile={b}/run/slurmctld.pid",
                    f"SlurmdPidFile={b}/run/slurmd.pid",
                    f"SlurmctldLogFile={b}/log/slurmctld.log",
                    f"SlurmdLogFile={b}/log/slurmd.log",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} "
                    f"CPUs={os.cpu_count() or 1} RealMemory={_memory_mib()} State=UNKNOWN",
                    f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE "
                    "State=UP OverSubscribe=YES",
                    "",
                ]
            )
        )

    def __enter__(self) -> SlurmCluster:
        self._write_conf()
        try:
            for argv in (
                ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                ["slurmd", "-D", "-f", str(self.conf), "-N", self.node],
            ):
                with open(self.base / "log" / f"{argv[0]}.stderr", "wb") as log:
                    self._procs.append(
                        subprocess.Popen(
                            argv,
                            env=self.env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a SLURM daemon exited: {self.logs()}")
            result = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = result.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.1)
        raise RuntimeError(f"the node is not idle after {START_TIMEOUT_S:g}s ({state!r})")

    def logs(self) -> str:
        out = []
        for path in sorted((self.base / "log").glob("*")):
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A SLURM client command against this cluster, under a deadline."""
        result = subprocess.run(
            argv,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, script: Path, *options: str) -> int:
        out = self.run("sbatch", "--parsable", *options, str(script)).stdout.strip()
        return int(out.split(";")[0])

    def job_state(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, RestartCnt, ExitCode...), or {} when gone."""
        result = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        fields: dict[str, str] = {}
        for item in result.stdout.split():
            key, sep, value = item.partition("=")
            if sep:
                fields[key] = value
        return fields

    def wait_state(
        self, job_id: int, states: set[str], timeout: float, *, seen: list[str] | None = None
    ) -> dict[str, str]:
        """Poll until the job's state is in ``states``; each state met is appended to ``seen``."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job_state(job_id)
            state = fields.get("JobState", "")
            if seen is not None and state and (not seen or seen[-1] != state):
                seen.append(state)
            if state in states:
                return fields
            time.sleep(0.2)
        raise TimeoutError(
            f"job {job_id} not in {sorted(states)} after {timeout:g}s: {fields}\n{self.logs()}"
        )

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scontrol", "shutdown", check=False)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._procs.clear()
