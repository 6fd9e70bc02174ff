"""Connecting to NATS from Settings (the one place connection options are chosen)."""

from __future__ import annotations

import logging
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.errors import NoServersError

from blackboard.protocol.errors import NotConnectedError
from blackboard.settings import NatsSettings

__all__ = ["connect_nats"]

log = logging.getLogger("blackboard.client.connection")


async def connect_nats(settings: NatsSettings, *, name: str) -> NATS:
    """Open a NATS connection that reconnects by itself after outages.

    Raises:
        NotConnectedError: no server answered at start-up.
    """

    async def _disconnected() -> None:
        log.info("%s: disconnected from NATS", name)

    async def _reconnected() -> None:
        log.info("%s: reconnected to NATS", name)

    async def _error(exc: Exception) -> None:
        log.debug("%s: NATS error: %r", name, exc)

    options: dict[str, Any] = {
        "servers": [u.strip() for u in settings.url.split(",") if u.strip()],
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
        raise NotConnectedError(f"cannot connect to NATS at {settings.url}: {exc}") from exc
    nc.options["max_reconnect_attempts"] = settings.max_reconnect_attempts
    return nc
