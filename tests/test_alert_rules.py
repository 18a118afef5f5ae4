"""The shipped alert rules fed series by ``promtool test rules``: each fires on the situation
it is for (a stall, a monitor dead behind a frozen textfile or a vanished endpoint, a dead
worker, a leak) with the text a person reads, and stays quiet when the soak ended well."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO
from .metrics_support import promtool

pytestmark = pytest.mark.slow

RULES = REPO / "deploy" / "prometheus" / "asyncsoak-alerts.yml"
#: Where each soak series comes from: node_exporter serving a textfile (or the soak's endpoint).
SOAK = {"soak_id": "s1", "instance": "node:9100", "job": "node"}
WORKER = {"instance": "gpu1:9400", "job": "workers"}
STALL_DESCRIPTION = (
    "No file changed in its progress directory; the soak's own stale limit stops it at "
    "asyncsoak_stale_limit_seconds."
)


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    shown = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def alert(name: str, at: str, labels: dict[str, str], **annotations: str) -> dict[str, Any]:
    expected = [{"exp_labels": labels, "exp_annotations": annotations}] if annotations else []
    return {"eval_time": at, "alertname": name, "exp_alerts": expected}


def phase(finished: str) -> dict[str, str]:
    return series("asyncsoak_soak_phase", {**SOAK, "phase": "finished"}, finished)


#: name -> (input series, expected alerts); times are minutes from 0 (the Unix epoch).
CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    # A live stall: the monitor samples every minute, the quiet time grows.
    "stall": (
        [
            series("asyncsoak_seconds_since_progress", SOAK, "0+60x30"),
            series("asyncsoak_last_sample_timestamp_seconds", SOAK, "0+60x30"),
            phase("0x30"),
        ],
        [
            alert("AsyncsoakStalled", "9m", SOAK),
            alert(
                "AsyncsoakStalled",
                "13m",
                {**SOAK, "severity": "critical"},
                summary="soak s1 made no progress for 13m 0s",
                description=STALL_DESCRIPTION,
            ),
            alert("AsyncsoakMonitorSilent", "13m", SOAK),
        ],
    ),
    # A monitor SIGKILLed at 2 minutes with --metrics-textfile: node_exporter serves its last
    # values for ever, 100 s without progress and a heartbeat of 120.
    "dead monitor, frozen textfile": (
        [
            series("asyncsoak_seconds_since_progress", SOAK, "0+60x2 100x28"),
            series("asyncsoak_last_sample_timestamp_seconds", SOAK, "0+60x2 120x28"),
            phase("0x30"),
        ],
        [
            alert(
                "AsyncsoakMonitorSilent",
                "10m",
                {**SOAK, "severity": "critical"},
                summary="soak s1: its monitor has not sampled for 8m 0s "
                "(killed, hung, or its host is down)",
            ),
            alert(
                "AsyncsoakStalled",
                "12m",
                {**SOAK, "severity": "critical"},
                summary="soak s1 made no progress for 11m 40s",
                description=STALL_DESCRIPTION,
            ),
        ],
    ),
    # A monitor SIGKILLed at 5 minutes with --metrics-port: its series vanish.
    "dead monitor, vanished endpoint": (
        [
            series("asyncsoak_last_sample_timestamp_seconds", SOAK, "0+60x5 stale"),
            phase("0x5 stale"),
        ],
        [
            alert(
                "AsyncsoakMonitorSilent",
                "15m",
                {**SOAK, "severity": "critical"},
                summary="soak s1: its monitor has not sampled for 10m 0s "
                "(killed, hung, or its host is down)",
            ),
        ],
    ),
    # A soak that ended well: its textfile's heartbeat stops, its phase says finished.
    "finished soak": (
        [
            series("asyncsoak_last_sample_timestamp_seconds", SOAK, "0+60x5 300x25"),
            phase("0x5 1x25"),
        ],
        [alert("AsyncsoakMonitorSilent", "20m", SOAK)],
    ),
    # A worker SIGKILLed at 5 minutes: its endpoint's series vanish.
    "dead worker": (
        [
            series("asyncsoak_worker_heartbeat_timestamp_seconds", WORKER, "0+60x5 stale"),
            series(
                "asyncsoak_worker_info", {**WORKER, "worker": "w1", "host": "gpu1"}, "1x5 stale"
            ),
        ],
        [
            alert(
                "AsyncsoakWorkerSilent",
                "15m",
                {**WORKER, "severity": "warning"},
                summary="worker gpu1:9400 has not heartbeated for 10m 0s",
            ),
            alert(
                "AsyncsoakNoWorker",
                "20m",
                {"severity": "warning"},
                summary="no asyncsoak worker has reported for 10 minutes: queued jobs will not run",
            ),
        ],
    ),
    # An Xid 79 at 3 minutes: the Xid counter appears and the GPU's fault gauge turns to 1.
    "gpu fault": (
        [
            series("asyncsoak_gpu_fault", {**SOAK, "gpu": "0", "UUID": "GPU-ea90"}, "0x2 1x10"),
            series(
                "asyncsoak_gpu_xid_errors_total",
                {**SOAK, "gpu": "0", "UUID": "GPU-ea90", "xid": "79"},
                "_x2 1x10",
            ),
        ],
        [
            alert("AsyncsoakGpuFault", "1m", SOAK),
            alert(
                "AsyncsoakGpuFault",
                "4m",
                {**SOAK, "gpu": "0", "UUID": "GPU-ea90", "severity": "critical"},
                summary="soak s1: GPU 0 (GPU-ea90) reported a fault: drain the node and reset "
                "the GPU",
            ),
            alert(
                "AsyncsoakGpuXid",
                "4m",
                {**SOAK, "gpu": "0", "UUID": "GPU-ea90", "xid": "79", "severity": "warning"},
                summary="soak s1: GPU 0 logged Xid 79 (1 times)",
            ),
        ],
    ),
    # A leak of 6 MiB/s for half an hour.
    "leak": (
        [series("asyncsoak_tree_memory_growth_bytes_per_second", SOAK, "6291456x30")],
        [
            alert(
                "AsyncsoakMemoryGrowing",
                "20m",
                {**SOAK, "severity": "warning"},
                summary="soak s1's memory grows 6MiB/s",
            ),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_fires_on_its_situation_with_its_text(tmp_path: Path, case: str) -> None:
    """``promtool test rules`` over the shipped rules: the alerts expected fire (after their
    ``for``) with these labels and annotations, and only those."""
    inputs, expected = CASES[case]
    test_file = tmp_path / "test.yml"
    # JSON is YAML: promtool reads it as it is.
    test_file.write_text(
        json.dumps(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": expected}],
            }
        )
    )
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_goodput_ratio_is_recorded(tmp_path: Path) -> None:
    """The recording rule divides the productive seconds by every second counted: 30 s
    productive, 10 s of start-up lost, makes 0.75."""
    test_file = tmp_path / "test.yml"
    productive = series("asyncsoak_productive_seconds_total", SOAK, "0+10x3")
    startup = series("asyncsoak_badput_seconds_total", {**SOAK, "kind": "startup"}, "10x3")
    other = series("asyncsoak_badput_seconds_total", {**SOAK, "kind": "other"}, "0x3")
    expected = {"labels": f"soak_id:asyncsoak_goodput:ratio{{{_labels(SOAK)}}}", "value": 0.75}
    test_file.write_text(
        json.dumps(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [productive, startup, other],
                        "promql_expr_test": [
                            {
                                "expr": "soak_id:asyncsoak_goodput:ratio",
                                "eval_time": "3m",
                                "exp_samples": [expected],
                            }
                        ],
                    }
                ],
            }
        )
    )
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{key}="{value}"' for key, value in labels.items())
