"""Acknowledged JetStream publishing that waits out outages without duplicates.

Every write carries a ``Nats-Msg-Id``; a publish whose ack was lost (server
restart, network blip) is re-sent with the same id until it is acknowledged
or the write timeout passes, and the server's duplicate window makes sure it
is stored once.

Acks come back on one wildcard inbox subscription per publisher (no request
object, task or ``wait_for`` per message), which keeps the SDK's write path
as fast as raw nats-py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from blackboard.protocol.errors import (
    BlackboardError,
    NotConnectedError,
    OperationTimeoutError,
    PayloadTooLargeError,
    TransportError,
)
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import NatsSettings

__all__ = ["RETRYABLE", "Ack", "Publisher"]

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

_WRONG_LAST_SEQ = 10071

ApiErrorMapper = Callable[[nats.js.errors.APIError], BlackboardError]


@dataclass(frozen=True, slots=True)
class Ack:
    """A JetStream publish acknowledgement."""

    stream: str
    seq: int
    duplicate: bool = False


def _api_error(err: dict[str, Any]) -> nats.js.errors.APIError:
    try:
        nats.js.errors.APIError.from_error(err)  # always raises the specific class
    except nats.js.errors.APIError as exc:
        return exc
    return nats.js.errors.APIError(**err)  # pragma: no cover


class Publisher:
    """Publishes to JetStream and waits for the ack, retrying through outages.

    No IO in ``__init__``; the ack subscription is made on first use.
    """

    def __init__(self, nc: NATS, js: JetStreamContext, settings: NatsSettings) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        # Msg-Ids: a random per-publisher prefix and a counter (unique, and cheap).
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)
        self._token_counter = itertools.count(1)
        self._inbox: str | None = None
        self._sub: Any = None
        self._acks: dict[str, asyncio.Future[Ack]] = {}
        self._slots: asyncio.Semaphore | None = None

    def msg_id(self) -> str:
        """A new unique ``Nats-Msg-Id``."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    # ------------------------------------------------------------ ack inbox
    async def _ensure_inbox(self) -> str:
        if self._inbox is None:
            prefix = self.nc.new_inbox()
            self._sub = await self.nc.subscribe(Subjects.reply_inbox(prefix, "*"), cb=self._on_ack)
            self._inbox = prefix + "."
            self._slots = asyncio.Semaphore(self.settings.max_pending_writes)
        return self._inbox

    async def _on_ack(self, msg: Msg) -> None:
        assert self._inbox is not None
        fut = self._acks.pop(msg.subject[len(self._inbox):], None)
        if fut is None or fut.done():
            return
        headers = msg.headers
        if headers and headers.get(Header.STATUS.value) == "503":
            fut.set_exception(nats.errors.NoRespondersError())
            return
        try:
            resp = json.loads(msg.data)
        except ValueError:
            fut.set_exception(TransportError(f"unreadable JetStream ack: {msg.data[:100]!r}"))
            return
        error = resp.get("error")
        if error:
            fut.set_exception(_api_error(error))
        else:
            fut.set_result(Ack(resp.get("stream", ""), int(resp["seq"]), bool(resp.get("duplicate"))))

    async def send(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[Ack]:
        """Send without waiting for the ack; returns a future of it.

        Waits while ``max_pending_writes`` acks are outstanding. The future
        never times out by itself: callers bound the wait.
        """
        inbox = await self._ensure_inbox()
        slots = self._slots
        assert slots is not None
        await slots.acquire()
        token = f"{next(self._token_counter):x}"
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _: slots.release())
        self._acks[token] = fut
        try:
            await self.nc.publish(subject, payload, reply=inbox + token, headers=headers)
        except BaseException:
            self._acks.pop(token, None)
            fut.cancel()
            raise
        return fut

    def forget(self, fut: asyncio.Future[Ack]) -> None:
        """Stop tracking an unanswered future (after a timeout)."""
        for token, f in list(self._acks.items()):
            if f is fut:
                del self._acks[token]
                break
        if not fut.done():
            fut.cancel()

    async def _wait(self, fut: asyncio.Future[Ack], timeout: float) -> Ack:
        loop = asyncio.get_running_loop()

        def expire() -> None:
            if not fut.done():
                self.forget(fut)

        handle = loop.call_later(timeout, expire)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise nats.errors.TimeoutError from None
            raise
        finally:
            handle.cancel()

    # ------------------------------------------------------------ publishing
    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        *,
        what: str,
        map_api_error: ApiErrorMapper | None = None,
        stream: str | None = None,
        resend: bool = False,
    ) -> Ack:
        """Publish and wait for the JetStream ack.

        ``headers`` should carry a ``Nats-Msg-Id`` so that retries are
        deduplicated. For a compare-and-set write that may already have been
        applied (a retry, or ``resend=True``), a "wrong last sequence" answer
        is checked against the stored message at that revision (which needs
        ``stream``): if it carries our Msg-Id, the write succeeded.

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
        maybe_sent = resend
        while True:
            remaining = deadline - loop.time()
            timeout = max(0.05, min(self.settings.request_timeout, remaining)) if remaining > 0 \
                else self.settings.request_timeout
            try:
                fut = await self.send(subject, payload, headers)
                maybe_sent = True
                return await self._wait(fut, timeout)
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQ and maybe_sent and stream is not None:
                    own = await self._own_revision(stream, subject, headers, exc)
                    if own is not None:
                        return Ack(stream, own, duplicate=True)
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

    async def _own_revision(self, stream: str, subject: str, headers: dict[str, str],
                            exc: nats.js.errors.APIError) -> int | None:
        """The revision of our own earlier copy of this write, if that is what the conflict is about."""
        msg_id = headers.get(Header.MSG_ID.value)
        digits = "".join(ch for ch in (exc.description or "").rsplit(":", 1)[-1] if ch.isdigit())
        if not msg_id or not digits:
            return None
        try:
            reply = await self.nc.request(Subjects.direct_get(stream), json.dumps({"seq": int(digits)}).encode(),
                                          timeout=self.settings.request_timeout)
        except (TimeoutError, nats.errors.Error):
            return None
        stored = reply.headers or {}
        if stored.get(Header.SUBJECT.value) == subject and stored.get(Header.MSG_ID.value) == msg_id:
            return int(digits)
        return None

    async def request(self, subject: str, payload: bytes, *, what: str) -> Msg:
        """A core NATS request (a JetStream API call, a direct get), retried
        through outages like a write until ``write_timeout``.

        Raises:
            NotConnectedError, OperationTimeoutError: no answer in time.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.write_timeout
        delay = 0.05
        while True:
            try:
                return await self.nc.request(subject, payload, timeout=self.settings.request_timeout)
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except RETRYABLE as exc:
                if loop.time() + delay >= deadline:
                    raise self.timeout_error(f"reading {what}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def timeout_error(self, what: str) -> BlackboardError:
        if not self.nc.is_connected:
            return NotConnectedError(
                f"not connected to NATS: {what} not acknowledged within {self.settings.write_timeout:g}s")
        return OperationTimeoutError(f"{what} not acknowledged within {self.settings.write_timeout:g}s")

    async def close(self) -> None:
        """Drop the ack subscription (pending futures are cancelled)."""
        for fut in self._acks.values():
            if not fut.done():
                fut.cancel()
        self._acks.clear()
        if self._sub is not None:
            sub, self._sub, self._inbox = self._sub, None, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass
