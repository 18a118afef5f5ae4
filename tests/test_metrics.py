"""Live metrics: real HTTP scrapes of running soaks, the textfile, promtool, bad clients."""

from __future__ import annotations

import itertools
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream

from asyncsoak import Metrics, run_soak
from asyncsoak._export._metrics import WorkerMetrics
from asyncsoak._export._soak_metrics import SoakMetrics

from .conftest import ReadyFifo, asyncsoak_cli, fast_limits, journal, py
from .gpu_support import install_fake_nvidia_smi
from .metrics_support import (
    exposition,
    free_port,
    http_get,
    promtool,
    samples,
    scrape_until,
    value,
)
from .soak_runs import trainer_soak

LIMIT_S = 60.0

#: A trainer driven by the test: progress, "ready"; on ``grow`` it holds 64 MiB more and makes
#: progress again, "grew"; on ``end`` it exits 0.
TRAINER = """
import os, sys, time
from pathlib import Path
progress, signals, control = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
def tell(message):
    fd = os.open(signals, os.O_WRONLY)
    os.write(fd, (message + "\\n").encode())
    os.close(fd)
def wait_for(name):
    while not (control / name).exists():
        time.sleep(0.02)
progress.mkdir(parents=True, exist_ok=True)
(progress / "step").write_text("1")
tell("ready")
wait_for("grow")
held = b"x" * (64 << 20)
(progress / "step").write_text("22")
tell("grew")
wait_for("end")
"""


def trainer(tmp_path: Path, ready: ReadyFifo) -> list[str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    control = tmp_path / "control"
    control.mkdir()
    return [sys.executable, str(script), str(tmp_path / "progress"), str(ready.path), str(control)]


def soak_id(text: str) -> str:
    return samples(text)["asyncsoak_soak_info"][0][0]["soak_id"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_scrapes_follow_the_child_and_end_with_its_status(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """The values move as the child works; after it exits the scrape shows the verdict."""
    port = free_port()
    result: dict[str, Any] = {}
    command = trainer(tmp_path, ready)

    async def soak() -> None:
        result["artifact"] = await run_soak(
            command=command,
            metrics=Metrics(port=port, linger_seconds=30),
            **fast_limits(tmp_path),
        )

    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(soak)
            assert await ready.line() == "ready"
            first = await scrape_until(
                port,
                lambda t: (
                    (value(t, "asyncsoak_progress_changes_total") or 0) >= 1
                    and value(t, "asyncsoak_tree_resident_memory_bytes") is not None
                ),
            )
            assert value(first, "asyncsoak_soak_phase", phase="running") == 1
            assert value(first, "asyncsoak_soak_phase", phase="starting") == 0
            assert value(first, "asyncsoak_soak_status", status="passed") is None
            assert value(first, "asyncsoak_stale_limit_seconds") == 10.0
            assert value(first, "asyncsoak_tree_processes") == 1
            assert (value(first, "asyncsoak_tree_threads") or 0) >= 1
            assert (value(first, "asyncsoak_tree_open_fds") or 0) >= 3
            since = value(first, "asyncsoak_seconds_since_progress")
            assert since is not None
            assert 0 <= since < 10
            rss_before = value(first, "asyncsoak_tree_resident_memory_bytes")
            changes_before = value(first, "asyncsoak_progress_changes_total")
            assert rss_before is not None
            assert changes_before is not None
            info = samples(first)["asyncsoak_soak_info"][0][0]
            assert info["command"].startswith(sys.executable)
            assert info["job_id"] == ""

            (tmp_path / "control" / "grow").touch()
            assert await ready.line() == "grew"
            # The memory comes with the tick's sample, the write with a scan (the tick's, or
            # the next one's when the write came just after it): a scrape shows both in time.
            grown = await scrape_until(
                port,
                lambda t: (
                    (value(t, "asyncsoak_tree_resident_memory_bytes") or 0)
                    > rss_before + 60 * 2**20
                    and (value(t, "asyncsoak_progress_changes_total") or 0) > changes_before
                ),
            )
            last = value(grown, "asyncsoak_progress_last_change_timestamp_seconds")
            assert last is not None
            assert abs(last - time.time()) < 30

            (tmp_path / "control" / "end").touch()
            final = await scrape_until(
                port, lambda t: value(t, "asyncsoak_soak_status", status="passed") == 1
            )
    assert result["artifact"]["status"] == "passed"
    assert value(final, "asyncsoak_soak_phase", phase="finished") == 1
    assert value(final, "asyncsoak_soak_status", status="failed") == 0
    # A finished soak is not stalled: its seconds since progress are gone.
    assert value(final, "asyncsoak_seconds_since_progress") is None
    assert soak_id(final) == soak_id(first)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_failed_soak_ends_failed_in_the_textfile(tmp_path: Path) -> None:
    """The textfile is written while the soak runs and says ``failed`` at the end."""
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    command = py("import sys, time; time.sleep(0.5); sys.exit(3)")
    with anyio.fail_after(LIMIT_S):
        with pytest.raises(Exception, match="nonzero_exit"):
            await run_soak(
                command=command, metrics=Metrics(textfile_dir=textfiles), **fast_limits(tmp_path)
            )
    (prom,) = textfiles.glob("asyncsoak_*.prom")
    assert not list(textfiles.glob(".*.tmp"))
    text = prom.read_text()
    assert value(text, "asyncsoak_soak_status", status="failed") == 1
    assert value(text, "asyncsoak_soak_phase", phase="finished") == 1
    assert prom.name == f"asyncsoak_{soak_id(text)}.prom"
    checked = promtool("check", "metrics", stdin=text.encode())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Written at every sample while it ran, not only at the end.
    samples_seen = sum(e["kind"] == "sample" for e in journal(tmp_path / "out" / "soak.jsonl"))
    assert samples_seen >= 2


@pytest.mark.slow
@pytest.mark.asyncio
async def test_promtool_accepts_the_text_and_openmetrics_is_served_when_asked(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """``promtool check metrics`` passes the text format; Accept picks OpenMetrics."""
    port = free_port()
    command = trainer(tmp_path, ready)
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_soak(
                    command=command, metrics=Metrics(port=port), **fast_limits(tmp_path)
                )
            )
            assert await ready.line() == "ready"
            text = await scrape_until(
                port, lambda t: value(t, "asyncsoak_tree_resident_memory_bytes") is not None
            )
            checked = promtool("check", "metrics", stdin=text.encode())
            assert checked.returncode == 0, checked.stdout + checked.stderr
            plain = await http_get(port)
            assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
            om = await http_get(port, accept="application/openmetrics-text; version=1.0.0")
            assert om.headers["content-type"].startswith("application/openmetrics-text")
            assert om.text.endswith("# EOF\n")
            assert "asyncsoak_progress_changes_total" in om.text
            (tmp_path / "control" / "grow").touch()
            (tmp_path / "control" / "end").touch()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_bad_and_slow_clients_never_delay_the_soak(tmp_path: Path, ready: ReadyFifo) -> None:
    """Silent clients, a byte-a-time client and malformed requests get bounded answers while
    samples keep their pace and a good scrape is answered."""
    port = free_port()
    command = trainer(tmp_path, ready)
    limits = fast_limits(tmp_path)
    clients: list[SocketStream] = []
    try:
        with anyio.fail_after(LIMIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_soak(command=command, metrics=Metrics(port=port), **limits)
                )
                assert await ready.line() == "ready"
                # Once the first sample is served (a loaded machine takes its time to it).
                await scrape_until(port, lambda t: "asyncsoak_tree_processes" in t)
                clients += [await anyio.connect_tcp("127.0.0.1", port) for _ in range(9)]
                dribbler = clients[-1]  # the others stay silent
                await dribbler.send(b"GE")
                started = anyio.current_time()
                assert (await http_get(port, raw=b"garbage\r\n\r\n")).status == 400
                assert (await http_get(port, raw=b"POST /metrics HTTP/1.1\r\n\r\n")).status == 405
                assert (await http_get(port, "/nope")).status == 404
                assert (await http_get(port, raw=b"GET /" + b"x" * 8995)).status == 431
                good = await http_get(port)
                assert good.status == 200
                assert "asyncsoak_tree_processes" in good.text
                for _ in range(20):
                    await dribbler.send(b"T")
                    await anyio.sleep(0.05)
                held_for = anyio.current_time() - started
                (tmp_path / "control" / "grow").touch()
                (tmp_path / "control" / "end").touch()
    finally:
        # The soak ended with the silent clients still connected.
        for stream in clients:
            await stream.aclose()
    sample_t = [e["t"] for e in journal(tmp_path / "out" / "soak.jsonl") if e["kind"] == "sample"]
    gaps = [b - a for a, b in itertools.pairwise(sample_t)]
    assert held_for > 1.0
    assert len(sample_t) >= 10
    # 0.1 s sampling; a loaded two-core machine may stretch one gap, never to a second.
    assert max(gaps) < 1.0, gaps


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gpu_metrics_from_the_sampler(tmp_path: Path, ready: ReadyFifo) -> None:
    """GPU readings (captured on an H200) and the tree's share of GPU memory become metrics."""
    pid_file = tmp_path / "gpu.pid"
    (tmp_path / "progress").mkdir()  # an empty one: a pass with no progress
    fake = install_fake_nvidia_smi(tmp_path, "load", pid_file=pid_file)
    port = free_port()
    command = py(
        f"""
        import os, time
        from pathlib import Path
        Path({str(pid_file)!r}).write_text(str(os.getpid()))
        fd = os.open({str(ready.path)!r}, os.O_WRONLY); os.write(fd, b"ready\\n"); os.close(fd)
        while not Path({str(tmp_path / "end")!r}).exists():
            time.sleep(0.02)
        """
    )
    limits = fast_limits(tmp_path, nvidia_smi=str(fake.path), sample_interval_seconds=0.2)
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_soak(command=command, metrics=Metrics(port=port), **limits))
            assert await ready.line() == "ready"
            text = await scrape_until(
                port, lambda t: (value(t, "asyncsoak_tree_gpu_memory_bytes", gpu="0") or 0) > 0
            )
            (tmp_path / "end").touch()
    uuid = samples(text)["asyncsoak_gpu_utilization_ratio"][0][0]["uuid"]
    assert uuid.startswith("GPU-")
    utilization = value(text, "asyncsoak_gpu_utilization_ratio", gpu="0")
    assert utilization is not None
    assert 0 <= utilization <= 1
    used = value(text, "asyncsoak_gpu_memory_used_bytes", gpu="0")
    tree = value(text, "asyncsoak_tree_gpu_memory_bytes", gpu="0")
    assert used is not None
    assert tree is not None
    assert 0 < tree <= used
    assert (value(text, "asyncsoak_gpu_power_watts", gpu="0") or 0) > 0
    assert (value(text, "asyncsoak_gpu_temperature_celsius", gpu="0") or 0) > 0
    throttle = samples(text)["asyncsoak_gpu_throttle"]
    assert {ls["reason"] for ls, _ in throttle} >= {"hw_slowdown", "sw_thermal_slowdown"}
    assert all(v in (0.0, 1.0) for _, v in throttle)
    assert value(text, "asyncsoak_sampler_degraded", sampler="gpu") == 0
    assert "pid" not in {
        k for ls, _ in samples(text)["asyncsoak_tree_gpu_memory_bytes"] for k in ls
    }


@pytest.mark.slow
def test_a_leak_shows_as_memory_growth_and_a_projected_exhaustion(tmp_path: Path) -> None:
    """A trainer keeping 4 MiB a step: the final textfile holds the tree's growth per second
    and when memory runs out, as the artifact's trend estimate has them."""
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    artifact_path = trainer_soak(
        tmp_path / "leak", "leak", steps=60, extra=("--metrics-textfile", str(textfiles))
    )
    (prom,) = textfiles.glob("*.prom")
    text = prom.read_text()
    trend = json.loads(artifact_path.read_text())["trends"]["tree.anon_bytes"]
    growth = value(text, "asyncsoak_tree_memory_growth_bytes_per_second")
    assert growth is not None
    assert growth > 1 * 2**20  # 4 MiB a step of about 0.05 s
    assert growth == pytest.approx(trend["slope_per_hour"] / 3600, rel=0.25)
    # Projected only when the estimate calls it a leak, which a loaded machine's uneven
    # steps may deny: then the metric is absent, as the artifact's projection is.
    projected = value(text, "asyncsoak_memory_projected_exhaustion_timestamp_seconds")
    if trend["projected_limit_at"] is None:
        assert projected is None
    else:
        expected = datetime.fromisoformat(trend["projected_limit_at"]).timestamp()
        assert projected is not None
        assert projected == pytest.approx(expected, abs=60)
        assert projected > time.time()


def test_the_trend_estimate_becomes_growth_and_projected_exhaustion() -> None:
    """An evaluation of the tree's memory trend: its slope per second and its projection."""
    metrics = SoakMetrics("1-2", host="h")
    metrics.observe_trends(
        {
            "tree.anon_bytes": {
                "verdict": "leak",
                "slope_per_hour": 3600.0 * 2**20,
                "projected_limit_at": "2026-01-01T02:00:00Z",
            },
            "process.7.anon_bytes": {"slope_per_hour": 1.0, "projected_limit_at": None},
        }
    )
    text = exposition(metrics)
    assert value(text, "asyncsoak_tree_memory_growth_bytes_per_second") == 2**20
    projected = value(text, "asyncsoak_memory_projected_exhaustion_timestamp_seconds")
    assert projected == 1767232800.0
    metrics.observe_trends(
        {"tree.anon_bytes": {"slope_per_hour": None, "projected_limit_at": None}}
    )
    text = exposition(metrics)
    assert value(text, "asyncsoak_tree_memory_growth_bytes_per_second") is None
    assert value(text, "asyncsoak_memory_projected_exhaustion_timestamp_seconds") is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-port", "0"], "between 1 and 65535"),
        (["--metrics-port", "70000"], "between 1 and 65535"),
        (["--metrics-address", "0.0.0.0"], "--metrics-address needs --metrics-port"),
        (["--metrics-textfile", "/nonexistent/dir"], "not a directory"),
    ],
)
def test_bad_metrics_flags_are_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    """Bad metrics flags: exit 2, a clear message, nothing launched."""
    marker = tmp_path / "launched"
    result = asyncsoak_cli(
        "run", "--progress-dir", str(tmp_path / "p"), "--output", str(tmp_path / "soak.json"),
        "--no-gpu", "--quiet", *flags, "--", sys.executable, "-c",
        f"open({str(marker)!r}, 'w')",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "soak.json").exists()


@pytest.mark.slow
def test_port_in_use_is_refused_before_launch(tmp_path: Path) -> None:
    """A metrics port already taken: exit 2 naming it, the command never started."""
    import socket

    marker = tmp_path / "launched"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = asyncsoak_cli(
            "run", "--progress-dir", str(tmp_path / "p"), "--output", str(tmp_path / "soak.json"),
            "--no-gpu", "--quiet", "--metrics-port", str(port), "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'w')",
            cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_cli_serves_metrics_and_writes_the_textfile(tmp_path: Path) -> None:
    """``asyncsoak run --metrics-port --metrics-textfile``: the final textfile says passed."""
    textfiles = tmp_path / "tf"
    textfiles.mkdir()
    (tmp_path / "p").mkdir()
    result = asyncsoak_cli(
        "run", "--progress-dir", str(tmp_path / "p"), "--output", str(tmp_path / "soak.json"),
        "--no-gpu", "--quiet", "--sample-interval", "0.1", "--metrics-port", str(free_port()),
        "--metrics-textfile", str(textfiles), "--", sys.executable, "-c",
        f"import time; open({str(tmp_path / 'p' / 'x')!r}, 'w'); time.sleep(0.5)",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (prom,) = textfiles.glob("*.prom")
    text = prom.read_text()
    assert value(text, "asyncsoak_soak_status", status="passed") == 1
    artifact = json.loads((tmp_path / "soak.json").read_text())
    assert artifact["status"] == "passed"


def test_both_formats_parse_back_with_escaped_labels() -> None:
    """The soak's and the worker's page, as text and as OpenMetrics (when asked), parse back to
    the same samples with a label's quotes and backslashes intact; promtool accepts the text."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families

    from asyncsoak._export._metrics import new_registry, render

    soak = SoakMetrics("1-2", now=lambda: 5.0, host='a "quoted" host')
    for event in [
        {
            "t": 0.0,
            "kind": "header",
            "monotonic_start": 1.0,
            "started_at": "2026-01-01T00:00:00Z",
            "config": {"stale_progress_seconds": 60, "startup_timeout_seconds": 600},
            "command": ["train", "back\\slash", "new\nline"],
        },
        {"t": 0.5, "kind": "started"},
        {"t": 1.0, "kind": "progress", "changed": 3},
        {"t": 1.0, "kind": "sample", "points": {"tree": {"rss_bytes": 1.5e9, "cpu_percent": 250}}},
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
                    "clock_event_reasons": ["x"],
                },
            ],
            "processes": [{"in_tree": True, "gpu_index": 0, "used_gpu_memory_mib": 2.5}],
        },
        {"t": 2.0, "kind": "sampler_degraded", "sampler": "gpu"},
    ]:
        soak.observe(event)
    worker = WorkerMetrics("w", host="h", heartbeat_at=1e9, current_job=4, current_attempt=2)
    worker.queue_jobs = {"queued": 2, "running": 1}
    worker.outcome("failed", "nonzero_exit")
    registry = new_registry(soak, worker)
    text, text_type = render(registry)
    om, om_type = render(registry, "application/openmetrics-text; version=1.0.0")
    assert text_type.startswith("text/plain; version=0.0.4")
    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    assert om.endswith(b"# EOF\n")

    def parsed(families: Any) -> list[tuple[str, list[tuple[str, str]], float]]:
        return sorted(
            (s.name, sorted(s.labels.items()), s.value) for f in families for s in f.samples
        )

    openmetrics = om_parse(om.decode())  # type: ignore[no-untyped-call]
    assert parsed(text_string_to_metric_families(text.decode())) == parsed(openmetrics)
    info = samples(text.decode())["asyncsoak_soak_info"][0][0]
    assert info["host"] == 'a "quoted" host'
    assert info["command"] == "train back\\slash new line"
    assert value(text.decode(), "asyncsoak_worker_job_outcomes_total", reason="nonzero_exit") == 1
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
@pytest.mark.asyncio
async def test_silent_clients_are_cut_off_and_their_number_bounded(
    tmp_path: Path, ready: ReadyFifo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that never sends is closed at the request deadline; past the connection bound
    a new one closes the oldest idle one at once; afterwards scrapes are answered again."""
    from asyncsoak._export import _metrics_server

    monkeypatch.setattr(_metrics_server, "REQUEST_TIMEOUT_SECONDS", 0.5)
    port = free_port()
    command = trainer(tmp_path, ready)
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_soak(
                    command=command, metrics=Metrics(port=port), **fast_limits(tmp_path)
                )
            )
            assert await ready.line() == "ready"
            await scrape_until(port, lambda t: "asyncsoak_soak_phase" in t)
            silent = [
                await anyio.connect_tcp("127.0.0.1", port)
                for _ in range(_metrics_server.MAX_CONNECTIONS)
            ]
            # Accepted in order: by the time this one is, the silent ones all hold a slot, and
            # it takes the oldest one's.
            extra = await anyio.connect_tcp("127.0.0.1", port)
            with anyio.fail_after(0.4):  # closed at once, well before the request deadline
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                    await silent[0].receive()
            for stream in [*silent[1:], extra]:
                with anyio.fail_after(5):  # each is closed at the deadline, never held
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                        await stream.receive()
                await stream.aclose()
            await silent[0].aclose()
            assert (await http_get(port)).status == 200
            (tmp_path / "control" / "grow").touch()
            (tmp_path / "control" / "end").touch()


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("run", ["--metrics-port", "9464"]),
        ("run", ["--metrics-textfile", "."]),
        ("worker", ["--metrics-port", "9464"]),
    ],
)
def test_metrics_flags_without_the_extra_name_the_flag(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    flags: list[str],
) -> None:
    """Without ``prometheus_client`` (the ``metrics`` extra) a metrics flag is refused: exit 2,
    one line naming the flag and the extra to install, nothing launched or created."""
    from asyncsoak.cli import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    monkeypatch.chdir(tmp_path)
    if command == "run":
        marker = tmp_path / "launched"
        argv = ["run", "--progress-dir", "p", "--output", "soak.json", "--no-gpu", "--quiet"]
        argv += [*flags, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    else:
        argv = ["worker", "--db", "queue.db", "--no-gpu", *flags]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"asyncsoak: error: {flags[0]}: prometheus_client is not installed: "
        "pip install 'asyncsoak[metrics]'"
    ]
    assert list(tmp_path.iterdir()) == []
