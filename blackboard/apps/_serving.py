"""What the apps' HTTP servers (``blackboard mcp --http``, ``blackboard inspect``) share: the
listening socket, uvicorn without its signal handlers, and the wait for the app's start-up."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blackboard.protocol.errors import ConfigurationError

__all__ = ["QuietServer", "Started", "listen"]


def listen(host: str, port: int, *, options: str = "") -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port). ``options`` names the
    command's options that set them, for the error (e.g. ``"--host, --port"``).

    Raises:
        ConfigurationError: the address cannot be listened on (taken, not this machine's).
    """
    told = f" ({options})" if options else ""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot listen on {host!r}{told}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}{told}: {exc.strerror or exc}") from exc
    return sock


class QuietServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: whoever runs it decides when it stops
    (the command on SIGINT/SIGTERM, a test at the end of its block)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class Started:
    """An ASGI wrapper that tells when the app's lifespan start-up is over (``done``; the
    socket listens already: a connection made from then on is served), and why it failed
    (``failed``, the message of ``lifespan.startup.failed``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.done = asyncio.Event()
        self.failed: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watch(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                self.failed = str(message.get("message", ""))
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                self.done.set()

        await self.app(scope, receive, watch)
