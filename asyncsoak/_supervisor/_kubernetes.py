"""Soaks inside a Kubernetes pod: who the pod is (local files, no API server), and the grace
its kubelet's SIGTERM leaves (docs/kubernetes.md)."""

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
#: Where the shipped manifests mount the downward API volume, unless the variable says.
PODINFO_DIR = Path("/etc/podinfo")
PODINFO_VARIABLE = "ASYNCSOAK_PODINFO_DIR"
#: The pod annotation that carries ``terminationGracePeriodSeconds`` (no downward API field).
GRACE_ANNOTATION = "asyncsoak.dev/termination-grace-period-seconds"
#: Kubernetes' default ``terminationGracePeriodSeconds``, assumed when nothing says.
DEFAULT_TERMINATION_GRACE_SECONDS = 30.0

#: ``snapshot.scheduler`` key → the variable, then the labels, that may say it.
_IDENTITY: dict[str, tuple[str, ...]] = {
    "pod_name": ("POD_NAME",),
    "namespace": ("POD_NAMESPACE",),
    "node": ("NODE_NAME",),
    "pod_uid": ("POD_UID",),
    "pod_ip": ("POD_IP",),
    "service_account": ("POD_SERVICE_ACCOUNT",),
    "hostname": ("HOSTNAME",),
    "job_name": ("JOB_NAME", "batch.kubernetes.io/job-name", "job-name"),
    "completion_index": ("JOB_COMPLETION_INDEX", "batch.kubernetes.io/job-completion-index"),
    "jobset_name": ("JOBSET_NAME", "jobset.sigs.k8s.io/jobset-name"),
    "replicated_job_name": ("REPLICATED_JOB_NAME", "jobset.sigs.k8s.io/replicatedjob-name"),
    "job_index": ("JOB_INDEX", "jobset.sigs.k8s.io/job-index"),
}
#: The keys whose values are integers.
_INTEGERS = frozenset({"completion_index", "job_index"})


def in_pod(
    env: Mapping[str, str] | None = None, *, service_account: Path = SERVICE_ACCOUNT_DIR
) -> bool:
    """Whether this process (or one with ``env``) runs in a Kubernetes pod."""
    environ = os.environ if env is None else env
    return bool(environ.get(SERVICE_HOST_VARIABLE)) or service_account.is_dir()


def _podinfo(environ: Mapping[str, str], name: str) -> dict[str, str]:
    """A downward API file of ``key="value"`` lines (Go-quoted); empty when not there."""
    try:
        text = (Path(environ.get(PODINFO_VARIABLE) or PODINFO_DIR) / name).read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r'\\(["\\])', r"\1", value[1:-1])
        out[key.strip()] = value
    return out


def termination_grace(given: float | None, environ: Mapping[str, str]) -> tuple[float | None, str]:
    """The pod's ``terminationGracePeriodSeconds`` and its source: ``given``, the annotation,
    else (None, "default")."""
    if given is not None:
        return given, "--scheduler-grace"
    annotations = _podinfo(environ, "annotations")
    try:
        value = float(annotations.get(GRACE_ANNOTATION, "").strip())
    except ValueError:
        value = math.nan
    return (value, "downward API") if math.isfinite(value) and value >= 0 else (None, "default")


def pod_identity(
    env: Mapping[str, str] | None = None,
    *,
    grace: float | None = None,
    service_account: Path = SERVICE_ACCOUNT_DIR,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = CGROUP_ROOT,
) -> dict[str, Any] | None:
    """``snapshot.scheduler`` in a pod (blocking: small local reads), or None outside one;
    ``kill_wait_seconds`` (SLURM's name for the deadline) is the pod's grace period."""
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
    """The pod's names and indexes, for the snapshot and the ``--output`` patterns."""
    labels = _podinfo(environ, "labels")
    out: dict[str, Any] = {}
    for key, (variable, *label_names) in _IDENTITY.items():
        value = environ.get(variable) or next(filter(None, map(labels.get, label_names)), None)
        out[key] = int(value) if key in _INTEGERS and value and value.isdigit() else value
    if out["hostname"] is None:
        out["hostname"] = socket.gethostname()
    # A pod's hostname is its name unless the pod spec sets one (a JobSet's, say).
    if out["pod_name"] is None:
        out["pod_name"] = out["hostname"]
    if out["namespace"] is None:
        with contextlib.suppress(OSError):
            out["namespace"] = (service_account / "namespace").read_text().strip() or None
    return out


#: What a pod's pattern needs when its value is not known (the host name is the pod's).
PATTERN_NEEDS = {
    "n": "POD_NAMESPACE (the downward API's metadata.namespace) or a mounted service account",
    "N": "NODE_NAME (the downward API's spec.nodeName)",
}


def pattern_values(
    env: Mapping[str, str] | None = None, *, service_account: Path = SERVICE_ACCOUNT_DIR
) -> dict[str, str | None]:
    """What the ``--output`` patterns stand for in a pod: ``%p`` pod name, ``%i`` completion
    index, ``%J`` JobSet's job index (0 outside either), ``%n`` namespace, ``%N`` node (None
    when not known), ``%%`` a percent sign."""
    names = _names(os.environ if env is None else env, service_account)
    return {
        "p": names["pod_name"],
        "i": str(names["completion_index"] or 0),
        "J": str(names["job_index"] or 0),
        "n": names["namespace"],
        "N": names["node"],
        "%": "%",
    }
