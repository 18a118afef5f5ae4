"""Helpers of the live-metrics tests: a raw HTTP client, free ports, and real Prometheus,
node_exporter and promtool processes (Debian's packages), each bounded in time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncsoak._contract._blocking import run_blocking
from asyncsoak._export._metrics import new_registry, render

#: Bound on one HTTP exchange of a test.
HTTP_TIMEOUT = 10.0
#: How long Prometheus may take to hold a first sample (about 6 s measured at a 1 s scrape).
PROMETHEUS_WAIT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


async def http_get(
    port: int, path: str = "/metrics", *, accept: str | None = None, raw: bytes | None = None
) -> Response:
    """One HTTP/1.1 request over a fresh connection (or ``raw`` bytes as the request)."""
    request = raw
    if request is None:
        extra = f"Accept: {accept}\r\n" if accept else ""
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()
    with anyio.fail_after(HTTP_TIMEOUT):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(request)
            data = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    data += await stream.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Response(int(lines[0].split(" ")[1]), headers, body)


def exposition(*collectors: Any) -> str:
    """The collectors' scrape in the text format, as the endpoint and the textfile write it."""
    return render(new_registry(*collectors))[0].decode()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A scrape's samples by name: ``{name: [(labels, value), ...]}``."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``, or None."""
    found = [v for ls, v in samples(text).get(name, []) if labels.items() <= ls.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


async def scrape_until(
    port: int, condition: Any, *, timeout: float = 30.0, accept: str | None = None
) -> str:
    """Scrape ``port`` until ``condition(text)`` holds (each scrape is a real request)."""
    with anyio.fail_after(timeout):
        while True:
            with contextlib.suppress(OSError):
                response = await http_get(port, accept=accept)
                if response.status == 200 and condition(response.text):
                    return response.text
            await anyio.sleep(0.05)


def service(name: str) -> str:
    """The path of a Debian-packaged service binary; CI installs them, so there it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(
            f"{name} is not installed (apt-get install prometheus prometheus-node-exporter)"
        )
    return path


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [service("promtool"), *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with status {process.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready within {timeout}s")
        time.sleep(0.1)


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """``/api/v1/query``'s result vector (blocking: call it from a thread)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(address, timeout=5) as answer:
            data = json.load(answer)
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    async def query_until(self, expr: str, *, timeout: float = PROMETHEUS_WAIT) -> Any:
        """Poll the query API (in a thread) until ``expr`` returns something; bounded."""
        with anyio.fail_after(timeout):
            while True:
                result = await run_blocking(
                    self.query, expr, timeout=10.0, what="a Prometheus query"
                )
                if result:
                    return result
                await anyio.sleep(0.25)


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: dict[str, int]) -> Iterator[Prometheus]:
    """A real Prometheus on a free loopback port, scraping each ``job: port`` every second."""
    binary = service("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
        for job, target in targets.items()
    )
    config.write_text(
        f"global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n{jobs}"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_ready(process, f"http://127.0.0.1:{port}/-/ready", 30)
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        _stop(process)
        log.close()


@contextlib.contextmanager
def node_exporter(textfile_dir: Path) -> Iterator[int]:
    """A real node_exporter serving ``textfile_dir`` (textfile collector only); its port."""
    binary = service("prometheus-node-exporter")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            f"--collector.textfile.directory={textfile_dir}",
            "--collector.disable-defaults",
            "--collector.textfile",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(process, f"http://127.0.0.1:{port}/metrics", 30)
        yield port
    finally:
        _stop(process)
