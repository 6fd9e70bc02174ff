"""Connecting to NATS from Settings (the one place connection options are chosen)."""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from typing import Any
from urllib.parse import SplitResult, urlsplit

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.errors import NoServersError

from blackboard.protocol.errors import ConfigurationError, NotConnectedError
from blackboard.settings import NatsSettings

__all__ = ["connect_nats"]

log = logging.getLogger("blackboard.client.connection")

#: The URL schemes nats-py connects with (a URL without one is ``nats://``).
_SCHEMES = ("nats", "tls", "ws", "wss")


def _server_urls(url: str) -> list[SplitResult]:
    """The servers of a comma-separated ``nats.url`` setting, parsed and checked.

    Raises:
        ConfigurationError: no URL, an unknown scheme, no host, a bad port, or
            websocket and plain URLs mixed (nats-py takes one kind).
    """
    servers: list[SplitResult] = []
    for raw in (u.strip() for u in url.split(",")):
        if not raw:
            continue
        # nats-py reads "host" and "host:port" as nats://; anything else must name its scheme.
        try:
            parsed = urlsplit(raw if "://" in raw else f"nats://{raw}")
        except ValueError as exc:
            raise ConfigurationError(f"NATS URL {raw!r} is malformed: {exc}") from exc
        if parsed.scheme.lower() not in _SCHEMES:
            raise ConfigurationError(
                f"NATS URL {raw!r} has the scheme {parsed.scheme!r}; use one of "
                + ", ".join(f"{s}://" for s in _SCHEMES))
        try:
            parsed.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise ConfigurationError(f"NATS URL {raw!r} has an invalid port") from exc
        if not parsed.hostname:
            raise ConfigurationError(f"NATS URL {raw!r} names no host")
        servers.append(parsed)
    if not servers:
        raise ConfigurationError(f"no server in the NATS URL setting {url!r}")
    if len({s.scheme.lower() in ("ws", "wss") for s in servers}) > 1:
        raise ConfigurationError(f"NATS URLs {url!r} mix websocket (ws://, wss://) and plain servers; "
                                 "nats-py connects to one kind")
    return servers


async def _unresolvable(servers: list[SplitResult]) -> list[str]:
    """The host names of ``servers`` that do not resolve (looked up after a failed connect)."""
    loop = asyncio.get_running_loop()
    bad: list[str] = []
    for server in servers:
        host = server.hostname or ""
        try:
            await loop.getaddrinfo(host, server.port or 4222, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            bad.append(host)
    return bad


async def _not_connected(settings: NatsSettings, servers: list[SplitResult],
                         errors: collections.deque[Exception], exc: Exception) -> NotConnectedError:
    """Why the first connect failed, named: the hosts that do not resolve, or the last error."""
    unresolved = await _unresolvable(servers)
    if unresolved and len(unresolved) == len(servers):
        hosts = ", ".join(repr(h) for h in unresolved)
        return NotConnectedError(f"cannot resolve the NATS host {hosts} (of {settings.url})")
    # The last error other than a failed lookup (named below), else the connect's own.
    last = next((e for e in reversed(errors) if not isinstance(e, socket.gaierror)), exc)
    cause = str(last)
    if not cause or isinstance(last, TimeoutError):
        cause = f"no answer within {settings.connect_timeout:g}s"
    also = f"; cannot resolve {', '.join(repr(h) for h in unresolved)}" if unresolved else ""
    return NotConnectedError(f"cannot connect to NATS at {settings.url}: {cause}{also}")


async def connect_nats(settings: NatsSettings, *, name: str) -> NATS:
    """Open a NATS connection that reconnects by itself after outages.

    Raises:
        ConfigurationError: the URL setting is malformed (an unknown scheme,
            no host, a bad port), found before connecting.
        NotConnectedError: no server answered at start-up (the message names
            a host that does not resolve, or the last connection error).
    """
    servers = _server_urls(settings.url)
    #: The errors of the first connect's attempts (the last few), to say why it failed.
    errors: collections.deque[Exception] = collections.deque(maxlen=4)

    async def _disconnected() -> None:
        log.info("%s: disconnected from NATS", name)

    async def _reconnected() -> None:
        log.info("%s: reconnected to NATS", name)

    async def _error(exc: Exception) -> None:
        errors.append(exc)
        log.debug("%s: NATS error: %r", name, exc)

    options: dict[str, Any] = {
        "servers": [u.strip() for u in settings.url.split(",") if u.strip()],  # checked by _server_urls
        "name": name,
        "connect_timeout": settings.connect_timeout,
        "reconnect_time_wait": settings.reconnect_time_wait,
        # The first connect gives up after a few attempts (nats-py would retry
        # forever with -1); once connected, reconnects follow the settings.
        "max_reconnect_attempts": settings.connect_attempts,
        "allow_reconnect": True,
        "disconnected_cb": _disconnected,
        "reconnected_cb": _reconnected,
        "error_cb": _error,
        # Keep writes made during an outage in the client buffer (up to 64 MiB)
        # so they go out on reconnect; JetStream acks still decide success.
        "pending_size": 64 * 1024 * 1024,
        "ping_interval": 10,
        "max_outstanding_pings": 3,
    }
    if settings.user:
        options["user"] = settings.user
    if settings.password:
        options["password"] = settings.password.get_secret_value()
    if settings.token:
        options["token"] = settings.token.get_secret_value()
    if settings.creds_file:
        options["user_credentials"] = str(settings.creds_file)
    try:
        nc = await nats.connect(**options)
    except (NoServersError, OSError, TimeoutError) as exc:
        raise await _not_connected(settings, servers, errors, exc) from exc
    except nats.errors.Error as exc:
        raise NotConnectedError(f"cannot connect to NATS at {settings.url}: {exc}") from exc
    nc.options["max_reconnect_attempts"] = settings.max_reconnect_attempts
    return nc
