"""The manifests in deploy/kubernetes/: valid against Kubernetes' own schemas (offline, with
``kubernetes-validate``), the custom resources (JobSet, PodMonitor) checked for the structure
they need, and every exit status a podFailurePolicy names one that asyncsoak documents."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from asyncsoak._contract._exit_codes import DETAILED_EXIT_CODES
from asyncsoak._supervisor._kubernetes import GRACE_ANNOTATION, PODINFO_DIR
from asyncsoak.cli import build_parser

MANIFESTS = sorted(
    (Path(__file__).resolve().parent.parent / "deploy" / "kubernetes").glob("*.yaml")
)
#: The Kubernetes release whose schemas the built-in kinds are checked against.
KUBERNETES_VERSION = "1.33.0"
BUILT_IN = {("batch/v1", "Job"), ("apps/v1", "DaemonSet")}
#: What the downward API variables of the shipped manifests must be called for asyncsoak to
#: read them (see asyncsoak/_supervisor/_kubernetes.py).
IDENTITY_VARIABLES = {
    "POD_NAME",
    "POD_NAMESPACE",
    "NODE_NAME",
    "POD_UID",
    "JOB_NAME",
    "JOBSET_NAME",
    "REPLICATED_JOB_NAME",
    "JOB_INDEX",
    "ASYNCSOAK_DB",
}


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def pod_templates(doc: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(the Job-like spec or None, the pod template) of every pod a resource makes."""
    kind = doc["kind"]
    if kind == "JobSet":
        for replicated in doc["spec"]["replicatedJobs"]:
            spec = replicated["template"]["spec"]
            yield spec, spec["template"]
    elif kind == "Job":
        yield doc["spec"], doc["spec"]["template"]
    elif kind == "DaemonSet":
        yield {}, doc["spec"]["template"]


def test_there_are_the_three_manifests() -> None:
    """An Indexed Job, a JobSet and the queue worker's DaemonSet, each with what it needs."""
    kinds = {(path.name, doc["kind"]) for path, doc in documents()}
    assert {
        ("training-job.yaml", "Job"),
        ("training-job.yaml", "PodMonitor"),
        ("training-jobset.yaml", "JobSet"),
        ("queue-worker-daemonset.yaml", "DaemonSet"),
    } <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_built_in_kinds_validate_against_the_kubernetes_schemas(path: Path) -> None:
    """Every Job and DaemonSet, and every Job a JobSet templates, is valid (strict: no
    unknown field) against the Kubernetes schemas bundled with kubernetes-validate."""
    checked = 0
    for doc in yaml.safe_load_all(path.read_text()):
        if (doc["apiVersion"], doc["kind"]) in BUILT_IN:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            checked += 1
        if doc["kind"] == "JobSet":
            for replicated in doc["spec"]["replicatedJobs"]:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": f"{doc['metadata']['name']}-{replicated['name']}"},
                    "spec": replicated["template"]["spec"],
                }
                kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
                checked += 1
    assert checked


def test_a_broken_manifest_is_caught() -> None:
    """The validation can fail: a podFailurePolicy rule with a misspelt field is refused."""
    _, job = next((p, d) for p, d in documents() if d["kind"] == "Job")
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["podFailurePolicy"]["rules"][1]["onExitCode"] = {"values": [1]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_custom_resources_have_their_structure() -> None:
    """JobSet (jobset.x-k8s.io/v1alpha2): named replicated jobs with replicas and a Job
    template, a failure policy; PodMonitor (monitoring.coreos.com/v1): a selector matching a
    pod template of its file and endpoints on a port that pod names."""
    for path, doc in documents():
        if doc["kind"] == "JobSet":
            assert doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
            assert isinstance(doc["spec"]["failurePolicy"]["maxRestarts"], int)
            for replicated in doc["spec"]["replicatedJobs"]:
                assert replicated["name"]
                assert isinstance(replicated["replicas"], int)
                assert replicated["template"]["spec"]["template"]["spec"]["containers"]
        if doc["kind"] == "PodMonitor":
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            wanted = doc["spec"]["selector"]["matchLabels"]
            pods = [
                pod
                for _, other in documents()
                if other is not doc
                for _, pod in pod_templates(other)
                if wanted.items() <= pod["metadata"]["labels"].items()
            ]
            assert pods, f"{path.name}: the PodMonitor selects no pod of the manifests"
            ports = {
                port["name"]
                for pod in pods
                for container in pod["spec"]["containers"]
                for port in container.get("ports", [])
            }
            for endpoint in doc["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in ports
                assert endpoint["path"] == "/metrics"


def test_every_exit_code_a_pod_failure_policy_names_is_documented() -> None:
    """The podFailurePolicy rules name only asyncsoak's documented detailed statuses, on the
    container that runs asyncsoak; the Indexed Job classes every reason."""
    documented = set(DETAILED_EXIT_CODES.values())
    for path, doc in documents():
        for spec, pod in pod_templates(doc):
            named: set[int] = set()
            containers = {c["name"] for c in pod["spec"]["containers"]}
            for rule in (spec.get("podFailurePolicy") or {}).get("rules", []):
                on = rule.get("onExitCodes")
                if on is None:
                    continue
                assert on["operator"] == "In"
                assert on["containerName"] in containers
                named |= set(on["values"])
            assert named <= documented, f"{path.name}: undocumented {named - documented}"
            if doc["kind"] == "Job":
                assert named == documented, f"{path.name}: unclassed {documented - named}"


def test_the_pods_run_asyncsoak_as_asyncsoak_reads_them() -> None:
    """Each container's command parses with asyncsoak's own parser; run uses detailed exit
    codes, the termination message, metrics reachable by Prometheus and /healthz as its
    liveness probe; the grace annotation repeats terminationGracePeriodSeconds; the
    downward API volume sits where asyncsoak looks; the variables have the names asyncsoak
    reads."""
    parser = build_parser()
    for _, doc in documents():
        for _, pod in pod_templates(doc):
            spec = pod["spec"]
            for container in spec["containers"]:
                command = container["command"]
                assert command[0] == "asyncsoak", shlex.join(command)
                args = parser.parse_args(command[1:])
                assert args.metrics_address == "0.0.0.0"
                assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
                assert container["terminationMessagePolicy"] == "File"
                names = {v["name"] for v in container.get("env", [])}
                assert names <= IDENTITY_VARIABLES, names - IDENTITY_VARIABLES
                if args.subcommand != "run":
                    continue
                assert args.detailed_exit_codes
                annotations = pod["metadata"]["annotations"]
                assert float(annotations[GRACE_ANNOTATION]) == spec["terminationGracePeriodSeconds"]
                assert args.grace < spec["terminationGracePeriodSeconds"]
                assert container["resources"]["limits"]["nvidia.com/gpu"] > 0
                mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
                assert mounts["podinfo"] == str(PODINFO_DIR)
                assert "%p" in str(args.output)


def test_a_jobset_fails_at_once_on_the_trainings_own_failures() -> None:
    """A JobSet whose Jobs FailJob on the training's statuses fails the whole set on them (a
    failurePolicy rule FailJobSet on the reason PodFailurePolicy): without one, JobSet
    restarts the set on every failed Job, the training's own included."""
    for path, doc in documents():
        if doc["kind"] != "JobSet":
            continue
        fails_job = any(
            rule["action"] == "FailJob"
            for replicated in doc["spec"]["replicatedJobs"]
            for rule in replicated["template"]["spec"].get("podFailurePolicy", {}).get("rules", [])
        )
        if not fails_job:
            continue
        rules = doc["spec"]["failurePolicy"].get("rules", [])
        # The rules apply in order; one without reasons matches every failed Job.
        first = next(
            (
                r
                for r in rules
                if "PodFailurePolicy" in (r.get("onJobFailureReasons") or [])
                or not r.get("onJobFailureReasons")
            ),
            None,
        )
        assert first is not None, f"{path.name}: no rule for a Job failed by its policy"
        assert first["action"] == "FailJobSet", f"{path.name}: {first}"
