"""Serving live metrics: a small, bounded HTTP server for ``/metrics`` on the soak's own event
loop, and the node_exporter textfile.

Prometheus asks ``GET /metrics`` and reads one short answer: the server reads one request
head (at most ``MAX_HEAD`` bytes), answers it and closes the connection.  Every connection
is bounded in time (``REQUEST_TIMEOUT``) and in number (``MAX_CONNECTIONS``; more are closed
at once), so a slow, silent or malformed client costs a few bytes and one task, never the
soak's time: the page is rendered from memory, with no I/O but the socket.

A broken server (an accept that keeps failing) ends itself and leaves the soak alone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream

from ._blocking import BlockingCallTimeout, run_blocking
from ._errors import ValidationError
from ._metrics import (
    Metrics,
    SoakMetrics,
    new_registry,
    render,
    render_text,
    textfile_path,
    write_textfile,
)

#: Bound on one connection, from accept to the last byte of the answer.
REQUEST_TIMEOUT = 5.0
#: Connections served at once; more are closed at once.
MAX_CONNECTIONS = 16
#: Largest request head read.
MAX_HEAD = 8192
#: Pause after a failed accept (out of file descriptors) before trying again.
ACCEPT_RETRY = 0.1
#: Failed accepts in a row after which the server gives up.
MAX_ACCEPT_FAILURES = 50

_log = logging.getLogger("asyncsoak.metrics")

#: ``render(accept)`` -> (body, content type).
Render = Callable[[str], tuple[bytes, str]]


@dataclass(slots=True)
class ServerStats:
    scrapes: int = 0
    bad_requests: int = 0
    timeouts: int = 0
    refused: int = 0


class MetricsServer:
    """Serve ``render``'s page at ``/metrics`` on ``listener`` until cancelled."""

    def __init__(self, listener: SocketListener, render: Render) -> None:
        self.listener = listener
        self.render = render
        self.stats = ServerStats()
        self._active = 0

    @property
    def port(self) -> int:
        return int(self.listener.extra(SocketAttribute.local_port))

    async def serve(self) -> None:
        failures = 0
        async with self.listener, anyio.create_task_group() as tg:
            while True:
                try:
                    stream = await self.listener.accept()
                except OSError as exc:
                    failures += 1
                    if failures >= MAX_ACCEPT_FAILURES:
                        _log.warning("metrics server stopped: accept failed: %s", exc)
                        return
                    await anyio.sleep(ACCEPT_RETRY)
                    continue
                failures = 0
                if self._active >= MAX_CONNECTIONS:
                    self.stats.refused += 1
                    await anyio.aclose_forcefully(stream)
                    continue
                self._active += 1
                tg.start_soon(self._connection, stream)

    async def _connection(self, stream: SocketStream) -> None:
        try:
            with anyio.move_on_after(REQUEST_TIMEOUT) as scope:
                try:
                    await self._answer(stream)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                except OSError as exc:
                    # A client that reset the connection; anything else is worth a line.
                    if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                        _log.warning("metrics request failed: %s", exc)
            if scope.cancelled_caught:
                self.stats.timeouts += 1
        except Exception as exc:  # a bug answering one request must not end the server
            _log.warning("metrics request failed: %r", exc)
        finally:
            self._active -= 1
            await anyio.aclose_forcefully(stream)

    async def _answer(self, stream: SocketStream) -> None:
        head = await _read_head(stream)
        if head is None:
            self.stats.bad_requests += 1
            await stream.send(_response(431, b"request head too large\n"))
            return
        request_line, headers = _parse_head(head)
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self.stats.bad_requests += 1
            await stream.send(_response(400, b"bad request\n"))
            return
        method, target, _version = parts
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            await stream.send(_response(405, b"only GET\n", extra=b"Allow: GET, HEAD\r\n"))
            return
        if path == "/":
            await stream.send(_response(200, b"asyncsoak metrics: /metrics\n", head_only=method))
            return
        if path != "/metrics":
            await stream.send(_response(404, b"not found; try /metrics\n"))
            return
        body, content_type = self.render(headers.get("accept", ""))
        self.stats.scrapes += 1
        await stream.send(_response(200, body, content_type=content_type, head_only=method))


async def _read_head(stream: SocketStream) -> bytes | None:
    """Bytes up to the blank line ending the head; None when it is too long."""
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > MAX_HEAD:
            return None
        data += await stream.receive(4096)
    return data


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    text = head.decode("latin-1")
    lines = text.replace("\r\n", "\n").split("\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0].strip(), headers


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS[431] = "Request Header Fields Too Large"


def _response(
    status: int,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: bytes = b"",
    head_only: str = "GET",
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
    ).encode() + extra
    return head + b"\r\n" + (b"" if head_only == "HEAD" else body)


async def open_listener(address: str, port: int) -> SocketListener:
    """Listen on ``address:port``; a clear :class:`ValidationError` when that is impossible."""
    try:
        listener = await anyio.create_tcp_listener(local_host=address, local_port=port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError(f"cannot serve metrics on {address}:{port}: {reason}") from None
    listeners = getattr(listener, "listeners", [listener])
    if len(listeners) > 1:
        # A name resolving to several addresses: serve the first, close the others.
        for extra in listeners[1:]:
            with contextlib.suppress(OSError):
                await extra.aclose()
    first: SocketListener = listeners[0]
    return first


#: Bound on one textfile write; past it (a hung filesystem) writing stops for this soak.
TEXTFILE_TIMEOUT = 5.0


class SoakMetricsRuntime:
    """Everything a soak's metrics need while it runs: the server, the textfile, the registry.

    :meth:`run` runs beside the soak; :meth:`finish` after it: the last textfile write, then
    the linger (until one scrape has read the final status, at most ``linger_seconds``).
    """

    def __init__(
        self,
        config: Metrics,
        listener: SocketListener | None,
        soak: SoakMetrics,
        limiter: anyio.CapacityLimiter,
    ) -> None:
        self.config = config
        self.soak = soak
        self._limiter = limiter
        self.registry = new_registry(soak)
        self.server = None if listener is None else MetricsServer(listener, self._render)
        self.textfile = (
            None
            if config.textfile_dir is None
            else textfile_path(config.textfile_dir, soak.soak_id)
        )
        self.textfile_error: str | None = None
        self.textfile_writes = 0
        self._dirty = anyio.Event()
        self._final_scraped = anyio.Event()
        self._write_lock = anyio.Lock()
        soak.on_change = self._changed

    def _changed(self) -> None:
        self._dirty.set()

    def _render(self, accept: str) -> tuple[bytes, str]:
        page = render(self.registry, accept)
        if self.soak.status is not None:
            self._final_scraped.set()
        return page

    async def run(self) -> None:
        if self.config.registry is not None:
            self.config.registry.register(self.soak)
        async with anyio.create_task_group() as tg:
            if self.server is not None:
                tg.start_soon(self.server.serve)
            if self.textfile is not None:
                tg.start_soon(self._write_textfiles)

    async def _write_textfiles(self) -> None:
        while self.textfile_error is None:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await self.write_textfile()

    async def write_textfile(self) -> None:
        """Write the textfile now, from what the soak said so far (bounded)."""
        path = self.textfile
        if path is None or self.textfile_error is not None:
            return
        async with self._write_lock:
            data = render_text(self.registry)
            try:
                await run_blocking(
                    write_textfile,
                    path,
                    data,
                    timeout=TEXTFILE_TIMEOUT,
                    what=f"writing the metrics textfile {path}",
                    limiter=self._limiter,
                )
                self.textfile_writes += 1
            except BlockingCallTimeout as exc:
                # A hung filesystem: one abandoned write, then no more for this soak.
                self.textfile_error = str(exc)
                _log.warning("metrics textfile: %s; writing stopped", exc)
            except OSError as exc:
                _log.warning("metrics textfile %s not written: %s", path, exc)

    async def finish(self, *, linger: bool) -> None:
        """After the soak: the final textfile, the linger, and out of the caller's registry."""
        try:
            with anyio.CancelScope(shield=True):
                await self.write_textfile()
            if linger and self.server is not None and self.config.linger_seconds > 0:
                with anyio.move_on_after(self.config.linger_seconds):
                    await self._final_scraped.wait()
        finally:
            if self.config.registry is not None:
                with contextlib.suppress(KeyError):
                    self.config.registry.unregister(self.soak)


async def open_soak_metrics(
    config: Metrics, soak_id: str, limiter: anyio.CapacityLimiter
) -> SoakMetricsRuntime:
    """Bind what the soak's metrics need before anything is launched (errors are ValueErrors)."""
    listener = None
    if config.port is not None:
        listener = await open_listener(config.address, config.port)
    return SoakMetricsRuntime(config, listener, SoakMetrics(soak_id), limiter)
