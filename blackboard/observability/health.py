"""The worker's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

A small HTTP/1.1 server on asyncio (GET and HEAD, one request a connection), bound to
``observability.http_host:http_port`` (port 0: a free port, :attr:`ObservabilityServer.port`).

- ``/healthz``: 200 while the process runs (its event loop answers).
- ``/readyz``: 200 when the readiness check says ready (the worker: connected to NATS and
  PostgreSQL, and every stream's pending messages at most ``observability.ready_max_lag``),
  503 otherwise; the body is JSON ``{"ready": bool, "checks": {...}}`` either way.
- ``/metrics``: the metrics, refreshed first (the gauges read at scrape time).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from blackboard.observability.metrics import METRICS_CONTENT_TYPE, WorkerMetrics
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import ObservabilitySettings

__all__ = ["ObservabilityServer", "Readiness"]

log = logging.getLogger("blackboard.observability")

#: Seconds a client may take to send its request, and a check or a refresh may take.
_REQUEST_TIMEOUT = 5.0
_CHECK_TIMEOUT = 10.0
_MAX_REQUEST = 8192
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Readiness:
    """The answer of a readiness check: ``ready``, and what each check found."""

    ready: bool
    checks: dict[str, Any] = field(default_factory=dict)


class ObservabilityServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` (an async context manager).

    Args:
        settings: the ``observability`` section (``http_host``, ``http_port``).
        readiness: answers ``/readyz`` (default: always ready).
        metrics: served on ``/metrics`` (None: 404).
        refresh: run before each ``/metrics`` answer (sets the gauges read at scrape time).
    """

    def __init__(self, settings: ObservabilitySettings, *,
                 readiness: Callable[[], Awaitable[Readiness]] | None = None,
                 metrics: WorkerMetrics | None = None,
                 refresh: Callable[[], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self._readiness = readiness
        self._metrics = metrics
        self._refresh = refresh
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host = self.settings.http_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve (idempotent).

        Raises:
            ConfigurationError: the address cannot be bound (the port is taken, or the host
                is not this machine's), naming the setting.
        """
        if self._server is not None:
            return
        host, port = self.settings.http_host, self.settings.http_port
        try:
            self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        except OSError as exc:
            what = ("is already in use" if exc.errno == errno.EADDRINUSE
                    else f"cannot be bound ({exc.strerror or exc})")
            raise ConfigurationError(
                f"observability.http_port: {host}:{port} {what}; choose another port "
                "(BLACKBOARD_OBSERVABILITY__HTTP_PORT; 0 picks a free one) or turn the endpoints off "
                "(observability.http_enabled = false)") from exc
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_REQUEST_TIMEOUT):
                    await server.wait_closed()

    async def __aenter__(self) -> ObservabilityServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def readiness(self) -> Readiness:
        """The readiness check's answer (a check that fails or hangs: not ready)."""
        if self._readiness is None:
            return Readiness(True)
        try:
            async with asyncio.timeout(_CHECK_TIMEOUT):
                return await self._readiness()
        except Exception as exc:
            return Readiness(False, {"error": f"{type(exc).__name__}: {exc}"})

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(_REQUEST_TIMEOUT):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            if len(head) > _MAX_REQUEST:
                await self._send(writer, 400, b"request too large\n", "text/plain")
                return
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3:
                await self._send(writer, 400, b"bad request\n", "text/plain")
                return
            method, target = parts[0], parts[1].split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                await self._send(writer, 405, b"GET or HEAD\n", "text/plain", head_only=False)
                return
            status, body, ctype = await self._route(target)
            await self._send(writer, status, body, ctype, head_only=method == "HEAD")
        except Exception as exc:  # one bad request never stops the server
            log.debug("observability endpoint: %r", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, target: str) -> tuple[int, bytes, str]:
        if target == "/healthz":
            return 200, b'{"status": "ok"}\n', "application/json"
        if target == "/readyz":
            ready = await self.readiness()
            if self._metrics is not None:
                self._metrics.ready.set(1 if ready.ready else 0)
            body = json.dumps({"ready": ready.ready, "checks": ready.checks}, default=str).encode() + b"\n"
            return (200 if ready.ready else 503), body, "application/json"
        if target == "/metrics" and self._metrics is not None:
            if self._refresh is not None:
                try:
                    async with asyncio.timeout(_CHECK_TIMEOUT):
                        await self._refresh()
                except Exception as exc:  # serve what is known; the gauges keep their last values
                    log.warning("metrics: cannot read the worker's state: %r", exc)
            return 200, self._metrics.render(), METRICS_CONTENT_TYPE
        return 404, b"not found: /metrics, /healthz, /readyz\n", "text/plain"

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, *,
                    head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n")
        writer.write(head.encode("latin-1") + (b"" if head_only else body))
        await writer.drain()
