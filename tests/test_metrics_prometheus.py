"""A real Prometheus scraping a soak, a worker and node_exporter's textfile collector; and the
shipped alert rules and dashboard, checked by promtool against what asyncsoak exports."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsoak import Metrics, run_soak
from asyncsoak._export._soak_metrics import METRIC_NAMES
from asyncsoak.queue import SqliteStore

from .conftest import CLI_ENV, REPO, ReadyFifo, fast_limits
from .metrics_support import free_port, node_exporter, prometheus, promtool, scrape_until, value
from .queue.helpers import FAST_SOAK, JOB_ENV, write_script

pytestmark = pytest.mark.slow

LIMIT_S = 90.0
RULES = REPO / "deploy" / "prometheus" / "asyncsoak-alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "asyncsoak-dashboard.json"

#: Progress, "ready", then a step every half second until the ``end`` file exists: the run
#: lives as long as the queries take, never stalled however loaded the machine.
HOLD = """
from pathlib import Path
step, written = 1, time.monotonic()
Path(sys.argv[1], "step").write_text("1")
tell("ready")
while not Path(sys.argv[2]).exists():
    time.sleep(0.02)
    if time.monotonic() - written >= 0.5:
        step, written = step + 1, time.monotonic()
        Path(sys.argv[1], "step").write_text(str(step))
"""


@contextlib.contextmanager
def background(argv: list[str]) -> Iterator[None]:
    """A CLI process for the length of a block, stopped by SIGTERM (as a user stops it)."""
    process = subprocess.Popen(argv, cwd=REPO, env=CLI_ENV, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def shown(result: list[dict[str, Any]]) -> str:
    """A query result as the report quotes it: ``{labels} value`` per series."""
    return "; ".join(f"{r['metric']} {r['value'][1]}" for r in result)


@pytest.mark.asyncio
async def test_prometheus_scrapes_a_soak_a_worker_and_the_textfile(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """Prometheus' query API returns the soak's progress and memory from its endpoint and its
    textfile (through node_exporter), and the worker's queue, heartbeat and outcomes."""
    soak_port, worker_port = free_port(), free_port()
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    end = tmp_path / "end"
    hold = write_script(tmp_path, "hold.py", HOLD)
    env = {"TEST_SIGNALS": str(ready.path)}
    db = tmp_path / "queue.db"
    with SqliteStore(db) as store:
        job = store.submit(
            argv=[*hold, str(tmp_path), str(end)], env={**JOB_ENV, **env}, soak=FAST_SOAK
        )
    (tmp_path / "progress").mkdir()
    command = [*hold, str(tmp_path / "progress"), str(end)]
    limits = fast_limits(tmp_path, sample_interval_seconds=0.5, env={**CLI_ENV, **env})
    metrics = Metrics(port=soak_port, textfile_dir=textfiles)
    report: list[str] = []
    worker = [
        *(sys.executable, "-m", "asyncsoak", "worker", "--db", str(db), "--no-gpu"),
        *("--poll", "0.2", "--runs-dir", str(tmp_path / "runs")),
        *("--metrics-port", str(worker_port)),
    ]
    try:
        with (
            anyio.fail_after(LIMIT_S),
            background(worker),
            node_exporter(textfiles) as node_port,
        ):
            targets = {"soak": soak_port, "worker": worker_port, "node": node_port}
            with prometheus(tmp_path, targets) as server:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: run_soak(command=command, metrics=metrics, **limits))
                    assert {await ready.line(), await ready.line()} == {"ready"}
                    for expr in (
                        'asyncsoak_seconds_since_progress{job="soak"}',
                        'asyncsoak_tree_resident_memory_bytes{job="soak"}',
                        'asyncsoak_tree_resident_memory_bytes{job="node"}',
                        'asyncsoak_queue_jobs{job="worker",status="running"}',
                        'asyncsoak_worker_heartbeat_timestamp_seconds{job="worker"}',
                        'asyncsoak_seconds_since_progress{job="worker"}',
                        'asyncsoak_soak_info{job="worker"}',
                    ):
                        result = await server.query_until(expr)
                        report.append(f"{expr} => {shown(result)}")
                        assert len(result) == 1, result
                        if "job_id" in result[0]["metric"]:
                            assert result[0]["metric"]["job_id"] == str(job)
                        if "queue_jobs" in expr:
                            assert result[0]["value"][1] == "1"
                        if "seconds_since_progress" in expr:
                            assert 0 <= float(result[0]["value"][1]) < 30
                        if "resident_memory" in expr:
                            assert float(result[0]["value"][1]) > 1e6
                    end.touch()
                done = 'asyncsoak_worker_job_outcomes_total{job="worker",status="succeeded"}'
                result = await server.query_until(done)
                report.append(f"{done} => {shown(result)}")
                assert result[0]["value"][1] == "1"
                final = 'asyncsoak_soak_status{job="node",status="passed"}'
                result = await server.query_until(final + " == 1")
                report.append(f"{final} => {shown(result)}")
    finally:
        # Quoted by the closing note: run with -s to see them.
        print("\n".join(report))


def test_alert_rules_pass_promtool_and_name_only_exported_metrics(tmp_path: Path) -> None:
    """``promtool check rules`` accepts the shipped rules; they name only asyncsoak's metrics."""
    checked = promtool("check", "rules", str(RULES))
    print(checked.stdout)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    text = RULES.read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)", text, re.MULTILINE))
    assert {
        "AsyncsoakStalled",
        "AsyncsoakMemoryExhaustionProjected",
        "AsyncsoakGpuSamplerDegraded",
        "AsyncsoakJobsFailing",
    } <= alerts
    # A recorded series (``soak_id:asyncsoak_goodput:ratio``) is the rules' own, not exported.
    names = set(re.findall(r"(?<![\w:])asyncsoak_\w+", text))
    assert names
    assert names <= METRIC_NAMES, names - METRIC_NAMES
    assert "soak_id:asyncsoak_goodput:ratio" in re.findall(r"^\s*- record: (\S+)", text, re.M)


def test_dashboard_queries_parse_and_name_only_exported_metrics(tmp_path: Path) -> None:
    """Every Grafana panel query parses in promtool and names only asyncsoak's metrics."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert len(exprs) >= 8
    names = {name for expr in exprs for name in re.findall(r"\basyncsoak_\w+", expr)}
    assert names <= METRIC_NAMES, names - METRIC_NAMES
    # Grafana's variables and interval, as Prometheus would see them once Grafana filled them.
    rules = tmp_path / "dashboard-rules.yml"
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(exprs):
        filled = expr.replace("$__rate_interval", "1m").replace("$soak_id", "x")
        filled = filled.replace("$instance", "x")
        lines += [f"      - record: dashboard:query{i}", f"        expr: {json.dumps(filled)}"]
    rules.write_text("\n".join(lines) + "\n")
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.asyncio
async def test_every_exported_name_is_listed(tmp_path: Path, ready: ReadyFifo) -> None:
    """A live scrape's names are all in METRIC_NAMES, the list the rules are checked against."""
    port = free_port()
    hold = write_script(tmp_path, "hold.py", HOLD)
    (tmp_path / "progress").mkdir()
    command = [*hold, str(tmp_path / "progress"), str(tmp_path / "end")]
    limits = fast_limits(tmp_path, env={**CLI_ENV, "TEST_SIGNALS": str(ready.path)})
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_soak(command=command, metrics=Metrics(port=port), **limits))
            assert await ready.line() == "ready"
            text = await scrape_until(
                port, lambda t: value(t, "asyncsoak_tree_processes") is not None
            )
            (tmp_path / "end").touch()
    names = set(re.findall(r"^(asyncsoak_\w+)", text, re.MULTILINE))
    assert names <= METRIC_NAMES, names - METRIC_NAMES
