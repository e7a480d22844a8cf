"""The HTTP listener in front of aiohttp: a cap on open connections, a header timeout, quiet logs.

aiohttp closes a connection only once it has waited ``keepalive_timeout`` for a whole request head
(idle or trickling), and caps nothing, so ~18k slow connections used to exhaust the file
descriptors. Each accepted connection here first meets a ``_Guard`` protocol that

- refuses it at once (a bare 503 with Retry-After, then close) when ``max_connections`` are open;
- closes it when its first request head has not arrived within ``header_timeout_s``
  (``http_header_timeout_s``); later heads on a kept-alive connection fall under aiohttp's own
  ``keepalive_timeout`` (``http_idle_timeout_s``);
- and otherwise hands every byte to aiohttp's RequestHandler unchanged.

Body timeouts are read_body's (``http_body_timeout_s``). ``QuietLogs`` rate-limits repeated log
records and turns aiohttp's tracebacks for a client's malformed request into one line.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ingest.errors import port_unavailable

logger = logging.getLogger(__name__)

FD_RESERVE = 256  # descriptors kept for the database, its WAL, the log, gRPC, and the actuator
_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def connection_cap(configured: int) -> int:
    """The cap on open connections: ``configured``, or the soft file-descriptor limit less a reserve.
    A configured cap at or above that is refused (ValueError), so the limit is never reached."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = max(16, soft - FD_RESERVE) if soft != resource.RLIM_INFINITY else 1_000_000
    if configured and configured > ceiling:
        raise ValueError(f"http_max_connections: {configured} is not below the file-descriptor limit ({soft}) "
                         f"less {FD_RESERVE} kept for the server itself")
    return configured or ceiling


@dataclass
class ConnectionGuard:
    """Shared by every connection of one listener; counts what it refused."""

    max_connections: int
    header_timeout_s: float
    on_refused: Callable[[], None] = lambda: None
    on_header_timeout: Callable[[], None] = lambda: None
    open: int = 0
    protocols: set = field(default_factory=set)


class _Guard(asyncio.Protocol):
    def __init__(self, make_handler: Callable[[], asyncio.Protocol], guard: ConnectionGuard) -> None:
        self._make_handler = make_handler
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen while the first head is incomplete

    def connection_made(self, transport: asyncio.Transport) -> None:
        guard = self._guard
        if guard.open >= guard.max_connections:
            guard.on_refused()
            with suppress(Exception):
                transport.write(_REFUSAL)
            transport.close()
            return
        guard.open += 1
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(guard.header_timeout_s, self._head_too_slow)
        self._inner = self._make_handler()
        self._inner.connection_made(transport)

    def _head_too_slow(self) -> None:
        self._timer = None
        self._guard.on_header_timeout()
        if self._transport is not None:
            self._transport.close()  # connection_lost follows, for aiohttp's handler too

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if self._timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self._timer.cancel()
                self._timer = None
                self._tail = b""
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self):
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            self._guard.open -= 1
            inner, self._inner = self._inner, None
            inner.connection_lost(exc)
        self._transport = None


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, with every connection behind a ``_Guard``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, *, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self.guard = guard
        self.bound_port = port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.bound_port}"

    async def start(self) -> None:
        await super().start()
        handlers = self._runner.server
        assert handlers is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guard(handlers, self.guard), self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        self.bound_port = self._server.sockets[0].getsockname()[1]


class QuietLogs(logging.Filter):
    """At most ``burst`` records of one (logger, message) per ``window_s``; the next one let through
    says how many were held back. A client's malformed request logged by aiohttp loses its traceback."""

    def __init__(self, burst: int = 5, window_s: float = 60.0, on_suppressed: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.on_suppressed = on_suppressed
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [window start, count, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("aiohttp") and record.exc_info and isinstance(
            record.exc_info[1], (HttpProcessingError, ConnectionError)
        ):
            record.msg = f"{record.msg}: {record.exc_info[1]!r}".replace("%", "%%") if not record.args else record.msg
            record.exc_info = None
            record.exc_text = None
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        state = self._seen.get(key)
        if state is None or now - state[0] >= self.window_s:
            held = int(state[2]) if state else 0
            self._seen[key] = [now, 1, 0]
            if len(self._seen) > 1000:  # forget old keys: the filter's own memory stays bounded
                for old in [k for k, v in self._seen.items() if now - v[0] >= self.window_s]:
                    del self._seen[old]
            if held:
                record.msg = f"{record.msg} [{held} like it held back in the last {self.window_s:g} s]"
            return True
        state[1] += 1
        if state[1] <= self.burst:
            return True
        state[2] += 1
        self.on_suppressed()
        return False


async def _serve(app: web.Application, host: str, port: int, guard: ConnectionGuard, idle_timeout_s: float,
                 shutdown_timeout_s: float, started: Callable[[GuardedSite], None]) -> None:
    runner = web.AppRunner(app, handle_signals=True, access_log=None, keepalive_timeout=idle_timeout_s,
                           shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    try:
        site = GuardedSite(runner, host, port, guard)
        try:
            await site.start()
        except OSError as e:
            raise port_unavailable("HTTP", host, port, "port", e.strerror or e) from e
        started(site)
        while True:
            await asyncio.sleep(3600)
    finally:
        await runner.cleanup()


def run(app: web.Application, host: str, port: int, guard: ConnectionGuard, *, idle_timeout_s: float,
        shutdown_timeout_s: float = 10, started: Callable[[GuardedSite], None] = lambda site: None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down in order (what ``web.run_app`` does)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(_serve(app, host, port, guard, idle_timeout_s, shutdown_timeout_s, started))
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio.set_event_loop(None)
