"""Watching the watcher: the monitor's heartbeat in every place its metrics go, and a metrics
endpoint that idle connections cannot close to a scraper."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import anyio
import pytest

from asyncsoak import Metrics, run_soak
from asyncsoak._export import _metrics_server
from asyncsoak._export._metrics import new_registry, render
from asyncsoak._export._metrics_server import MetricsServer, open_listener

from .conftest import fast_limits, journal, py
from .metrics_support import free_port, http_get, value

LIMIT_S = 60.0
HEARTBEAT = "asyncsoak_last_sample_timestamp_seconds"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_heartbeat_is_the_time_of_the_last_sample_everywhere(tmp_path: Path) -> None:
    """``asyncsoak_last_sample_timestamp_seconds`` is the Unix time of the monitor's last
    sample, the same in the textfile and in a registry (the worker's endpoint)."""
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    registry = new_registry()
    scraped: list[float | None] = []
    command = py("import time; time.sleep(1.5)")
    (tmp_path / "progress").mkdir()  # an empty one: a pass with no progress
    metrics = Metrics(textfile_dir=textfiles, registry=registry)
    ended = anyio.Event()

    async def soak() -> None:
        await run_soak(command=command, metrics=metrics, **fast_limits(tmp_path))
        ended.set()

    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(soak)
            # Scrapes the registry (all there is to see) until the heartbeat shows, or the
            # soak is over.
            while not ended.is_set() and (not scraped or scraped[-1] is None):
                await anyio.sleep(0.05)
                scraped.append(value(render(registry)[0].decode(), HEARTBEAT))
    (prom,) = textfiles.glob("asyncsoak_*.prom")
    written = value(prom.read_text(), HEARTBEAT)
    events = journal(tmp_path / "out" / "soak.jsonl")
    started = datetime.fromisoformat(events[0]["started_at"]).timestamp()
    last_sample = max(e["t"] for e in events if e["kind"] == "sample")
    assert written is not None
    assert written == pytest.approx(started + last_sample, abs=1e-3)
    assert scraped[-1] is not None
    assert started <= scraped[-1] <= written


@pytest.mark.asyncio
async def test_idle_connections_never_shut_a_scraper_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every slot held by connections that never send a byte (and one that reconnects
    whenever it is closed), each scrape is still answered: the oldest idle connection makes
    room (the scraper used to be closed at once until the idle ones timed out)."""
    # Far longer than the test: only eviction can let the scraper in.
    monkeypatch.setattr(_metrics_server, "REQUEST_TIMEOUT_SECONDS", 300.0)
    registry = new_registry()
    listener = await open_listener("127.0.0.1", free_port())
    server = MetricsServer(listener, lambda accept: render(registry, accept))
    port = server.port
    with anyio.fail_after(LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            idle = [
                await anyio.connect_tcp("127.0.0.1", port)
                for _ in range(_metrics_server.MAX_CONNECTIONS)
            ]
            for _ in range(3):
                assert (await http_get(port)).status == 200
                # The idle client whose connection was closed comes back at once.
                idle.append(await anyio.connect_tcp("127.0.0.1", port))
            assert server.stats.refused == 0
            assert server.stats.evicted >= 3
            tg.cancel_scope.cancel()
    for stream in idle:
        await stream.aclose()
