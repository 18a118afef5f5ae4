"""The shipped Grafana dashboard against what asyncsoak exports: every metric and label its
queries name is one a scrape shows, and its soak selector shows the job name, host and start
time (the ``title`` of ``asyncsoak_soak_info``), not the opaque soak id."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from asyncsoak._export._metrics import WorkerMetrics
from asyncsoak._export._soak_metrics import SoakMetrics, program_name

from .conftest import REPO
from .metrics_support import exposition, samples

DASHBOARD = REPO / "deploy" / "grafana" / "asyncsoak-dashboard.json"
#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
#: Names in a query that are PromQL's own, not metrics or labels.
PROMQL_WORDS = {"by", "on", "group_left", "group_right", "max", "sum", "rate", "increase"}


def _exported() -> dict[str, set[str]]:
    """Every metric a soak (with a GPU, a trend, a degraded sampler) and a worker export, and
    the labels each carries: one scrape of the code's own collectors."""
    soak = SoakMetrics("4242-1", now=lambda: 30.0, host="gpu-node-3")
    for event in [
        {
            "t": 0.0,
            "kind": "header",
            "monotonic_start": 1.0,
            "started_at": "2026-12-02T00:37:33.579Z",
            "config": {"stale_progress_seconds": 60, "startup_timeout_seconds": 600},
            "command": ["python", "train.py", "--lr", "3e-4"],
            "metadata": {"job_id": 12, "job_name": "resnet50"},
        },
        {"t": 0.5, "kind": "started"},
        {"t": 1.0, "kind": "progress", "changed": 3},
        {
            "t": 1.0,
            "kind": "sample",
            "points": {
                "tree": {
                    "rss_bytes": 1.5e9,
                    "anon_bytes": 1.2e9,
                    "cpu_percent": 250,
                    "processes": 3,
                    "threads": 12,
                    "fds": 40,
                }
            },
        },
        {
            "t": 1.0,
            "kind": "gpu_sample",
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-a",
                    "utilization_gpu_percent": 97,
                    "memory_used_mib": 1,
                    "power_draw_w": 650.5,
                    "temperature_gpu_c": 61,
                    "clock_event_reasons": ["hw_slowdown"],
                }
            ],
            "processes": [{"pid": 7, "in_tree": True, "gpu_index": 0, "used_gpu_memory_mib": 2.5}],
        },
        {"t": 2.0, "kind": "sampler_degraded", "sampler": "gpu"},
    ]:
        soak.observe(event)
    soak.observe_trends(
        {
            "tree.anon_bytes": {
                "slope_per_hour": 3600.0 * 2**20,
                "projected_limit_at": "2026-12-02T02:00:00Z",
            }
        }
    )
    worker = WorkerMetrics("w1", host="gpu-node-3", heartbeat_at=1e9, current_job=12)
    worker.queue_jobs = {"queued": 2, "running": 1}
    worker.outcome("failed", "nonzero_exit")
    running = exposition(soak, worker)
    soak.observe({"t": 30.0, "kind": "finished", "status": "passed"})
    final = exposition(soak)
    exported: dict[str, set[str]] = {}
    for text in (running, final):  # while it runs, and once it finished (its status)
        for name, found in samples(text).items():
            for labels, _ in found:
                exported.setdefault(name, set()).update(labels)
    return exported


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL query in the dashboard: panel targets (rows' panels too) and variables."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield str(value["query"])
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_metric_the_dashboard_names_is_exported(dashboard: dict[str, Any]) -> None:
    """Each metric name in a panel's or a variable's query is in a scrape of the code."""
    exported = _exported()
    queries = list(_queries(dashboard))
    assert len(queries) >= 20
    named = {name for q in queries for name in re.findall(r"\basyncsoak_\w+", q)}
    assert "asyncsoak_soak_info" in named
    assert named <= set(exported), sorted(named - set(exported))


def test_every_label_the_dashboard_uses_is_exported(dashboard: dict[str, Any]) -> None:
    """Each label a query selects, groups or joins on, and each a legend shows, is a label of
    an exported metric (or one Prometheus adds: instance, job)."""
    labels = set().union(*_exported().values()) | TARGET_LABELS
    used: set[str] = set()
    for query in _queries(dashboard):
        used.update(re.findall(r"(\w+)\s*=~?\s*\"", query))
        for group in re.findall(r"\b(?:by|on|group_left|group_right)\s*\(([^)]*)\)", query):
            used.update(label.strip() for label in group.split(",") if label.strip())
    legends = json.dumps(dashboard)
    used.update(re.findall(r"\{\{\s*(\w+)\s*\}\}", legends))
    assert used - PROMQL_WORDS <= labels, sorted(used - PROMQL_WORDS - labels)


def test_the_soak_selector_shows_job_name_host_and_start(dashboard: dict[str, Any]) -> None:
    """The soak variable reads the soak id as its value and the title as its text, out of the
    text Grafana makes of ``query_result`` for the info series."""
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "soak_id"]
    assert "asyncsoak_soak_info" in variable["query"]["query"]
    # Grafana's regex is JavaScript's: named groups spelled (?<name>...).
    regex = re.compile(variable["regex"].strip("/").replace("(?<", "(?P<"))
    soak = SoakMetrics("4242-1", host="gpu-node-3")
    soak.observe(
        {
            "t": 0.0,
            "kind": "header",
            "started_at": "2026-12-02T00:37:33.579Z",
            "command": ["python", "train.py"],
            "metadata": {"job_name": 'resnet "50"'},
        }
    )
    ((labels, _),) = samples(exposition(soak))["asyncsoak_soak_info"]
    # What Grafana lists for `query_result(max by (soak_id, title) (...))`.
    listed = f'{{soak_id="{labels["soak_id"]}",title="{labels["title"]}"}} 1 1764635853000'
    match = regex.search(listed)
    assert match is not None, listed
    assert match["value"] == "4242-1"
    assert match["text"] == "resnet '50' on gpu-node-3, 2026-12-02 00:37 UTC"
    assert labels["job_name"] == "resnet '50'"
    assert labels["started_at"] == "2026-12-02T00:37:33Z"


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py", "--lr", "3e-4"], "train.py"),
        (["/usr/bin/python3", "-u", "scripts/train.py"], "train.py"),
        (["python", "-m", "mypkg.train"], "mypkg.train"),
        (["torchrun", "--nproc_per_node", "8", "train.py"], "train.py"),
        (["python", "-c", "print(1)"], "python"),
        (["./run.sh", "x"], "run.sh"),
    ],
)
def test_a_run_without_a_job_name_is_named_by_its_program(command: list[str], name: str) -> None:
    """No queue or SLURM job name: the title names the program the command runs."""
    assert program_name(command) == name


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["shred", "-u", "notes.py"], "shred"),
        (["sha256sum", "weights.py"], "sha256sum"),
        (["bash", "-e", "scripts/train.sh"], "train.sh"),
        (["python3.11", "train.py"], "train.py"),
    ],
)
def test_only_an_interpreter_is_named_by_its_script(command: list[str], name: str) -> None:
    """A program whose name merely starts like an interpreter's (shred, sha256sum) is named
    itself; a shell script run by bash is named by the script."""
    assert program_name(command) == name


def test_the_soak_info_labels_carry_no_password_and_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SLURM job name with a URL's password, or one of 500 characters: the job name and
    the title labels show neither the password nor more than 120 characters."""
    monkeypatch.setenv("SLURM_JOB_NAME", "sync https://ann:hunter2-s3cret@db.example/x")
    soak = SoakMetrics("4242-1", host="gpu-node-3")
    soak.observe({"t": 0.0, "kind": "header", "command": ["python", "train.py"]})
    text = exposition(soak)
    assert "hunter2-s3cret" not in text
    ((labels, _),) = samples(text)["asyncsoak_soak_info"]
    assert labels["job_name"].startswith("sync https://ann:")
    monkeypatch.setenv("SLURM_JOB_NAME", "x" * 500)
    long = SoakMetrics("4242-2", host="gpu-node-3")
    long.observe({"t": 0.0, "kind": "header", "command": ["python", "train.py"]})
    ((labels, _),) = samples(exposition(long))["asyncsoak_soak_info"]
    assert len(labels["job_name"]) <= 120
    assert len(labels["title"]) <= 120
    assert labels["title"].endswith(" on gpu-node-3"), labels["title"]
