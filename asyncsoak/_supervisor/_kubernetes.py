"""Soaks inside a Kubernetes pod: who the pod is, and how the kubelet stops it.

The kubelet's SIGTERM is taken as the scheduler's stop (``stop.cause: "scheduler"``) and the
trainer's grace kept under the pod's, so that asyncsoak, not the kubelet, kills what is left and
the artifact is written before the kubelet's SIGKILL.  The pod's identity, grace and limits are
read from the environment, the downward API and local files: no call to the API server.
Where each comes from: docs/architecture.md, "SLURM and Kubernetes"; docs/kubernetes.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._sampling import CGROUP_ROOT, cgroup_cpu_limit_cores, cgroup_memory_max_bytes

#: Set by Kubernetes in every container of a pod (the API server's address).
SERVICE_HOST_VARIABLE = "KUBERNETES_SERVICE_HOST"
#: Mounted in every pod that has a service account token (most do).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Where the shipped manifests mount the downward API volume (the pod's labels and
#: annotations); ``ASYNCSOAK_PODINFO_DIR`` says another place.
PODINFO_DIR = Path("/etc/podinfo")
PODINFO_VARIABLE = "ASYNCSOAK_PODINFO_DIR"
#: The pod annotation (exposed through the downward API volume) that carries the pod's
#: ``terminationGracePeriodSeconds``, which the downward API does not expose itself.
GRACE_ANNOTATION = "asyncsoak.dev/termination-grace-period-seconds"
#: Kubernetes' default ``terminationGracePeriodSeconds``, assumed when nothing says.
DEFAULT_TERMINATION_GRACE_SECONDS = 30.0

#: ``snapshot.scheduler`` key → (variables, then labels, that may say it; integer?).
_IDENTITY: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...] = (
    ("pod_name", ("POD_NAME",), (), False),
    ("namespace", ("POD_NAMESPACE",), (), False),
    ("node", ("NODE_NAME",), (), False),
    ("pod_uid", ("POD_UID",), (), False),
    ("pod_ip", ("POD_IP",), (), False),
    ("service_account", ("POD_SERVICE_ACCOUNT",), (), False),
    ("hostname", ("HOSTNAME",), (), False),
    ("job_name", ("JOB_NAME",), ("batch.kubernetes.io/job-name", "job-name"), False),
    (
        "completion_index",
        ("JOB_COMPLETION_INDEX",),
        ("batch.kubernetes.io/job-completion-index",),
        True,
    ),
    ("jobset_name", ("JOBSET_NAME",), ("jobset.sigs.k8s.io/jobset-name",), False),
    (
        "replicated_job_name",
        ("REPLICATED_JOB_NAME",),
        ("jobset.sigs.k8s.io/replicatedjob-name",),
        False,
    ),
    ("job_index", ("JOB_INDEX",), ("jobset.sigs.k8s.io/job-index",), True),
)


def in_pod(
    env: Mapping[str, str] | None = None, *, service_account: Path = SERVICE_ACCOUNT_DIR
) -> bool:
    """Whether this process (or one with ``env``) runs in a Kubernetes pod: the service's
    variable is set, or the service account is mounted."""
    environ = os.environ if env is None else env
    return bool(environ.get(SERVICE_HOST_VARIABLE)) or service_account.is_dir()


def podinfo_dir(env: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if env is None else env
    return Path(environ.get(PODINFO_VARIABLE) or PODINFO_DIR)


def read_podinfo(path: Path) -> dict[str, str]:
    """A downward API file of labels or annotations: ``key="value"`` lines, the value
    quoted as Go quotes strings.  Empty when the file is not there."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = _unquote(value[1:-1])
        out[key.strip()] = value
    return out


def _unquote(text: str) -> str:
    return re.sub(r'\\(["\\])', r"\1", text)


def termination_grace(
    given: float | None, env: Mapping[str, str] | None = None
) -> tuple[float | None, str]:
    """The pod's ``terminationGracePeriodSeconds`` and where it came from: ``given``
    (``--scheduler-grace``), else the downward API's annotation, else (None, "default")."""
    if given is not None:
        return given, "--scheduler-grace"
    annotations = read_podinfo(podinfo_dir(env) / "annotations")
    text = annotations.get(GRACE_ANNOTATION, "").strip()
    try:
        value = float(text)
    except ValueError:
        return None, "default"
    if not math.isfinite(value) or value < 0:
        return None, "default"
    return value, "downward API"


def pod_identity(
    env: Mapping[str, str] | None = None,
    *,
    grace: float | None = None,
    service_account: Path = SERVICE_ACCOUNT_DIR,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = CGROUP_ROOT,
) -> dict[str, Any] | None:
    """``snapshot.scheduler`` in a pod (blocking: small local reads), or None outside one.

    ``kill_wait_seconds`` is what the stop keeps its grace under (the name SLURM's facts use
    for the same deadline): the pod's grace period, or Kubernetes' default of 30 s.
    """
    environ = os.environ if env is None else env
    if not in_pod(environ, service_account=service_account):
        return None
    out: dict[str, Any] = {"kind": "kubernetes", **_names(environ, service_account)}
    out["cpu_limit_cores"] = cgroup_cpu_limit_cores(proc_cgroup, cgroup_root)
    out["memory_limit_bytes"] = cgroup_memory_max_bytes(proc_cgroup, cgroup_root)
    seconds, source = termination_grace(grace, environ)
    out["termination_grace_period_seconds"] = seconds
    out["termination_grace_source"] = source
    out["kill_wait_seconds"] = DEFAULT_TERMINATION_GRACE_SECONDS if seconds is None else seconds
    out["errors"] = []
    return out


def _names(environ: Mapping[str, str], service_account: Path) -> dict[str, Any]:
    """The pod's names and indexes (``_IDENTITY``'s keys): what the snapshot records and the
    ``--output`` patterns stand for, one reading for both."""
    labels = read_podinfo(podinfo_dir(environ) / "labels")
    out: dict[str, Any] = {}
    for key, variables, label_names, integer in _IDENTITY:
        value: str | None = None
        for name in variables:
            value = value or environ.get(name) or None
        for name in label_names:
            value = value or labels.get(name) or None
        out[key] = int(value) if integer and value is not None and value.isdigit() else value
    if out["hostname"] is None:
        out["hostname"] = socket.gethostname()
    # A pod's hostname is its name unless the pod spec sets one (a JobSet's, say).
    if out["pod_name"] is None:
        out["pod_name"] = out["hostname"]
    if out["namespace"] is None:
        with contextlib.suppress(OSError):
            out["namespace"] = (service_account / "namespace").read_text().strip() or None
    return out


# -- file names ----------------------------------------------------------------------------

#: What a pod's pattern needs when its value is not known (a pod's host name is the pod's,
#: not the node's: it cannot stand for ``%N``).
PATTERN_NEEDS = {
    "n": "POD_NAMESPACE (the downward API's metadata.namespace) or a mounted service account",
    "N": "NODE_NAME (the downward API's spec.nodeName)",
}


def pattern_values(
    env: Mapping[str, str] | None = None, *, service_account: Path = SERVICE_ACCOUNT_DIR
) -> dict[str, str | None]:
    """What the ``--output`` patterns stand for in a pod, as ``snapshot.scheduler`` names it:
    ``%p`` the pod's name, ``%i`` its completion index (0 outside an Indexed Job), ``%J``
    JobSet's job index (0 outside a JobSet), ``%n`` its namespace, ``%N`` its node (None
    when not known: see :data:`PATTERN_NEEDS`), ``%%`` a percent sign."""
    names = _names(os.environ if env is None else env, service_account)

    def index(value: object) -> str:
        return "0" if value is None else str(value)

    return {
        "p": names["pod_name"],
        "i": index(names["completion_index"]),
        "J": index(names["job_index"]),
        "n": names["namespace"],
        "N": names["node"],
        "%": "%",
    }
