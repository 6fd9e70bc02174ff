"""Acknowledged JetStream publishing that waits out outages without duplicates.

Every write carries a ``Nats-Msg-Id``; a publish whose ack was lost (server
restart, network blip) is re-sent with the same id until it is acknowledged
or the write timeout passes, and the server's duplicate window makes sure it
is stored once.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api

from blackboard.errors import (
    BlackboardError,
    NotConnectedError,
    OperationTimeoutError,
    PayloadTooLargeError,
    TransportError,
)
from blackboard.settings import NatsSettings

__all__ = ["RETRYABLE", "Publisher"]

#: Errors after which a publish (or a read) is retried until the write timeout.
RETRYABLE: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    asyncio.TimeoutError,
)

ApiErrorMapper = Callable[[nats.js.errors.APIError], BlackboardError]


class Publisher:
    """Publishes to JetStream and waits for the ack, retrying through outages."""

    def __init__(self, nc: NATS, js: JetStreamContext, settings: NatsSettings) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        # Msg-Ids: a random per-publisher prefix and a counter (unique, and cheap).
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)

    def msg_id(self) -> str:
        """A new unique ``Nats-Msg-Id``."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        *,
        what: str,
        map_api_error: ApiErrorMapper | None = None,
    ) -> api.PubAck:
        """Publish and wait for the JetStream ack.

        ``headers`` should carry a ``Nats-Msg-Id`` so that retries are deduplicated.

        Raises:
            NotConnectedError: not connected within ``write_timeout``.
            OperationTimeoutError: connected, but no ack within ``write_timeout``.
            PayloadTooLargeError: larger than the server's max payload.
            BlackboardError: the server refused it (via ``map_api_error``,
                ``TransportError`` by default).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.write_timeout
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            timeout = max(0.05, min(self.settings.request_timeout, remaining)) if remaining > 0 \
                else self.settings.request_timeout
            try:
                return await self.js.publish(subject, payload, timeout=timeout, headers=headers)
            except nats.js.errors.APIError as exc:
                if map_api_error is not None:
                    raise map_api_error(exc) from exc
                raise TransportError(
                    f"JetStream refused {what}: {exc.description} (code {exc.err_code})") from exc
            except nats.errors.MaxPayloadError as exc:
                raise PayloadTooLargeError(len(payload), self.nc.max_payload) from exc
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except RETRYABLE as exc:
                if loop.time() + delay >= deadline:
                    raise self.timeout_error(what) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def timeout_error(self, what: str) -> BlackboardError:
        if not self.nc.is_connected:
            return NotConnectedError(
                f"not connected to NATS: {what} not acknowledged within {self.settings.write_timeout:g}s")
        return OperationTimeoutError(f"{what} not acknowledged within {self.settings.write_timeout:g}s")
