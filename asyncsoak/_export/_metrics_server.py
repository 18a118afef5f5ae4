"""Serving live metrics: a small HTTP server for ``/metrics`` and ``/healthz`` on the soak's
own event loop, bounded in time, connections and request size (docs/architecture.md), and the
node_exporter textfile."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import anyio

from .._contract import BlockingCallTimeout, ValidationError, run_blocking
from ._metrics import Metrics, new_registry, render, write_textfile
from ._soak_metrics import SoakMetrics

if TYPE_CHECKING:
    from .._record import RunState

#: Bound on one connection, from accept to the last byte of the answer.
REQUEST_TIMEOUT_SECONDS = 5.0
#: Connections served at once; past it a new one closes the oldest idle one (or itself).
MAX_CONNECTIONS = 16
#: Largest request head read.
MAX_HEAD = 8192
#: Pause after a failed accept (out of file descriptors) before accepting again.
ACCEPT_RETRY_SECONDS = 0.1
#: Failed accepts in a row after which the server gives up (5 s of them).
MAX_ACCEPT_FAILURES = 50
#: Connections waiting to be accepted.
BACKLOG = 64

_log = logging.getLogger("asyncsoak.metrics")

#: ``render(accept)`` -> (body, content type).
Render = Callable[[str], tuple[bytes, str]]
#: ``health()`` -> (alive, what to say): ``/healthz``'s 200 or 503.
Health = Callable[[], tuple[bool, str]]


@dataclass(slots=True)
class ServerStats:
    refused: int = 0  # new connections closed at once: every slot was answering
    evicted: int = 0  # idle connections closed to make room for a new one


@dataclass(slots=True, eq=False)
class _Waiting:
    """A connection whose task waits for its request head: it may be evicted."""

    scope: anyio.CancelScope
    evicted: bool = False


class _NotYet(Exception):
    """The request head has not all arrived."""


# Not prometheus_client's start_http_server: a thread per connection, unbounded in number and
# time, 64 KiB heads, and no /healthz.
class MetricsServer:
    """Serve ``render``'s page at ``/metrics`` on the listening socket until cancelled, and
    ``/healthz`` (200 while ``health`` says alive, 503 when not; 200 without ``health``: an
    answer at all means the event loop runs)."""

    def __init__(
        self, listener: socket.socket, render: Render, health: Health | None = None
    ) -> None:
        self.listener = listener
        self.render = render
        self.health = health
        self.stats = ServerStats()
        self._active = 0
        self._waiting: dict[_Waiting, None] = {}
        self._failures = 0
        self._handoff: asyncio.Queue[
            tuple[Callable[..., Coroutine[Any, Any, None]], tuple[Any, ...]]
        ]
        self._tg: anyio.abc.TaskGroup
        self._stopped: anyio.Event
        self._loop: asyncio.AbstractEventLoop

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    async def serve(self) -> None:
        """Answer until cancelled; the listening socket is closed at the end."""
        # A reader callback, not a task waiting on the socket: a scrape costs one wake-up.
        self._loop = asyncio.get_running_loop()
        with self.listener:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._stopped = anyio.Event()
                self._handoff = asyncio.Queue()
                tg.start_soon(self._start_handed_off)
                self._loop.add_reader(self.listener, self._on_readable)
                try:
                    await self._stopped.wait()
                finally:
                    self._stopped.set()
                    self._loop.remove_reader(self.listener)
                    tg.cancel_scope.cancel()

    def _on_readable(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                # Out of descriptors, say: accepting pauses (the socket stays readable), and a
                # server that keeps failing gives up and leaves the soak alone.
                self._failures += 1
                if self._failures >= MAX_ACCEPT_FAILURES:
                    _log.warning("metrics server stopped: accept failed: %s", exc)
                    self._stopped.set()
                    return
                self._loop.remove_reader(self.listener)
                self._loop.call_later(ACCEPT_RETRY_SECONDS, self._resume)
                return
            self._failures = 0
            self._accepted(conn)

    def _spawn(self, func: Callable[..., Coroutine[Any, Any, None]], *args: object) -> None:
        """Start ``func(*args)`` in a task, from the reader callback: outside any task anyio
        cannot start one (with trio's ``sniffio`` it cannot even tell the loop), so a task of
        the server does, woken through a plain asyncio queue."""
        self._handoff.put_nowait((func, args))

    async def _start_handed_off(self) -> None:
        while True:
            func, args = await self._handoff.get()
            self._tg.start_soon(func, *args)

    def _resume(self) -> None:
        if not self._stopped.is_set():
            self._loop.add_reader(self.listener, self._on_readable)

    def _accepted(self, conn: socket.socket) -> None:
        """Answer at once if the request is there; else hand the connection to a task."""
        conn.setblocking(False)
        if self._active >= MAX_CONNECTIONS and not self._evict_oldest_idle():
            self.stats.refused += 1
            conn.close()
            return
        rest = b""
        try:
            head = _read_head(conn, b"")
            response = self._answer(head)
            rest = response[conn.send(response) :]
        except _NotYet as partial:  # a slow client: its own task, under the deadline
            self._active += 1
            self._spawn(self._connection, conn, partial.args[0])
            return
        except OSError:
            pass  # the client went away
        except Exception as exc:  # a bug answering one request must not end the server
            _log.warning("metrics request failed: %r", exc)
        if rest:  # the kernel took less than the page: the rest in a task
            self._active += 1
            self._spawn(self._send_rest, conn, rest)
            return
        conn.close()

    def _evict_oldest_idle(self) -> bool:
        """Close the connection that has waited longest for its request, to make room; False
        when none is waiting (every slot is sending an answer)."""
        for waiting in self._waiting:
            del self._waiting[waiting]
            # Its task closes the socket (it may be waiting on it); the slot is free now.
            waiting.evicted = True
            waiting.scope.cancel()
            self._active -= 1
            self.stats.evicted += 1
            return True
        return False

    async def _connection(self, conn: socket.socket, data: bytes) -> None:
        waiting = _Waiting(
            anyio.CancelScope(deadline=anyio.current_time() + REQUEST_TIMEOUT_SECONDS)
        )
        self._waiting[waiting] = None
        try:
            with waiting.scope:
                try:
                    while True:
                        await anyio.wait_readable(conn)
                        try:
                            head = _read_head(conn, data)
                            break
                        except _NotYet as partial:
                            data = partial.args[0]
                    self._waiting.pop(waiting, None)
                    await _send_all(conn, self._answer(head))
                except OSError:
                    pass  # the client went away
        except Exception as exc:  # a bug answering one request must not end the server
            _log.warning("metrics request failed: %r", exc)
        finally:
            self._waiting.pop(waiting, None)
            if not waiting.evicted:
                self._active -= 1
            conn.close()

    async def _send_rest(self, conn: socket.socket, data: bytes) -> None:
        try:
            with anyio.move_on_after(REQUEST_TIMEOUT_SECONDS), contextlib.suppress(OSError):
                await _send_all(conn, data)
        finally:
            self._active -= 1
            conn.close()

    def _answer(self, head: bytes | None) -> bytes:
        if head is None:
            return _response(431, b"request head too large\n")
        request_line, headers = _parse_head(head)
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, b"bad request\n")
        method, target, _version = parts
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
        if path == "/":
            return _response(200, b"asyncsoak metrics: /metrics, /healthz\n", head_only=method)
        if path == "/healthz":
            alive, text = (True, "ok") if self.health is None else self.health()
            return _response(200 if alive else 503, f"{text}\n".encode(), head_only=method)
        if path != "/metrics":
            return _response(404, b"not found; try /metrics\n")
        body, content_type = self.render(headers.get("accept", ""))
        return _response(200, body, content_type=content_type, head_only=method)


def _read_head(conn: socket.socket, data: bytes) -> bytes | None:
    """The request head up to its blank line, with what was read before; None when too long;
    :class:`_NotYet` (with the bytes so far) before it all arrived, ``ConnectionError`` when
    the client closed first."""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > MAX_HEAD:
            return None
        try:
            chunk = conn.recv(4096)
        except BlockingIOError:
            raise _NotYet(data) from None
        if not chunk:
            raise ConnectionResetError("the client closed before its request")
        data += chunk
    return data


async def _send_all(conn: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[conn.send(view) :]
        except BlockingIOError:
            await anyio.wait_writable(conn)


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    request_line, *lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    fields = (line.partition(":") for line in lines)
    return request_line.strip(), {k.strip().lower(): v.strip() for k, sep, v in fields if sep}


def _response(
    status: int,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: bytes = b"",
    head_only: str = "GET",
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
    ).encode() + extra
    return head + b"\r\n" + (b"" if head_only == "HEAD" else body)


async def open_listener(address: str, port: int) -> socket.socket:
    """A non-blocking socket listening on ``address:port``; :class:`ValidationError` if not."""
    try:
        infos = await anyio.getaddrinfo(address, port, type=socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        listener = socket.create_server(sockaddr[:2], family=family, backlog=BACKLOG)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError(f"cannot serve metrics on {address}:{port}: {reason}") from None
    listener.setblocking(False)
    return listener


#: Bound on one textfile write; past it (a hung filesystem) writing stops for this soak.
TEXTFILE_TIMEOUT_SECONDS = 5.0


class SoakMetricsRuntime:
    """A soak's metrics while it runs (:meth:`run`, beside it): the server, the textfile, the
    registry; :meth:`finish` writes the last textfile and lingers for a scrape of the end."""

    def __init__(
        self,
        config: Metrics,
        listener: socket.socket | None,
        soak: SoakMetrics,
        limiter: anyio.CapacityLimiter,
    ) -> None:
        self.config = config
        self.soak = soak
        self.registry = new_registry(soak)
        self._limiter = limiter
        self.server = (
            None if listener is None else MetricsServer(listener, self._render, soak.health)
        )
        folder = config.textfile_dir
        self.textfile = None if folder is None else folder / f"asyncsoak_{soak.soak_id}.prom"
        self.textfile_error: str | None = None
        self._dirty = anyio.Event()
        self._final_scraped = anyio.Event()
        self._write_lock = anyio.Lock()
        soak.on_change = lambda: self._dirty.set()

    def _render(self, accept: str) -> tuple[bytes, str]:
        page = render(self.registry, accept)
        if self.soak.run.status is not None:
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
            data = render(self.registry)[0]
            try:
                await run_blocking(
                    write_textfile,
                    path,
                    data,
                    timeout=TEXTFILE_TIMEOUT_SECONDS,
                    what=f"writing the metrics textfile {path}",
                    limiter=self._limiter,
                )
            except BlockingCallTimeout as exc:  # a hung filesystem: no more writes
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
    config: Metrics, soak_id: str, limiter: anyio.CapacityLimiter, run: RunState | None
) -> SoakMetricsRuntime:
    """Bind what the soak's metrics (read from ``run``) need before anything is launched."""
    port = config.port
    listener = None if port is None else await open_listener(config.address, port)
    return SoakMetricsRuntime(config, listener, SoakMetrics(soak_id, run=run), limiter)
