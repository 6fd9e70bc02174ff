"""The ordered follower: every message of a stream's subject filter, in order, to a callback.

One JetStream *ordered consumer* (ephemeral, flow-controlled, with idle
heartbeats) under the board's watches (:class:`blackboard.client.board_store.Watch`)
and vote following (:class:`blackboard.client.consensus.VoteFollower`).

* **start position**: ``"new"`` (only what is stored from now on),
  ``"current"`` (the last message of every subject, then live), ``"all"``
  (everything the stream keeps), or ``from_sequence`` (replay from that stream
  sequence on; it overrides ``start``).
* **readiness**: :meth:`OrderedFollower.start` returns once the consumer
  exists, or raises (and leaves nothing behind): the follower is either
  started or raised. ``ready`` is set once the messages that were stored when
  it started have all been handed to the callback (at once for ``"new"``).
* **reconnects and gaps**: the ordered consumer (nats-py) checks the consumer
  sequence of every delivery and the idle heartbeats; on a gap, a missed
  heartbeat (disconnect, server restart) or a lost consumer it recreates
  itself from the stream sequence after the last one delivered. So the
  callback sees every message once, in stream order, across outages.
* **errors**: failing to start raises our error classes (``NotConnectedError``
  when NATS does not answer, ``ConfigurationError`` when the stream does not
  exist, ``ConsumerLimitError`` at the server's consumer limit,
  ``TransportError`` when it refuses the consumer otherwise); a callback
  that raises loses only that message (logged, kept in ``error``, counted in
  ``skipped``), never the consumer.
* **stop** unsubscribes and deletes the consumer on the server at once
  (:func:`~blackboard.client.consumers.delete_consumer`): an ordered consumer
  left to its inactivity threshold counts against the consumer limit for
  seconds after its follower stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from blackboard.client.consumers import consumer_limit_error, delete_consumer, is_consumer_limit
from blackboard.protocol.errors import (
    BlackboardError,
    ConfigurationError,
    NotConnectedError,
    TransportError,
)

__all__ = ["OrderedFollower", "StartPosition", "deliver_policy", "start_error"]

log = logging.getLogger("blackboard.client.follower")

#: Where a follower starts: new messages only, the last of every subject, or all.
StartPosition = Literal["new", "current", "all"]

_POLICIES: dict[str, api.DeliverPolicy] = {
    "new": api.DeliverPolicy.NEW,
    "current": api.DeliverPolicy.LAST_PER_SUBJECT,
    "all": api.DeliverPolicy.ALL,
}

#: Seconds between the server's idle heartbeats (two missed ones reset the consumer).
_IDLE_HEARTBEAT = 1.0
#: Client-side buffer limits: a follower never drops what the server sent.
_PENDING_MSGS = 1_000_000
_PENDING_BYTES = 1024 * 1024 * 1024


def deliver_policy(start: StartPosition, from_sequence: int | None = None) -> tuple[api.DeliverPolicy, int | None]:
    """The JetStream deliver policy and start sequence of a start position (pure).

    Raises:
        ValueError: an unknown start position.
    """
    if from_sequence is not None:
        return api.DeliverPolicy.BY_START_SEQUENCE, max(1, from_sequence)
    try:
        return _POLICIES[start], None
    except KeyError:
        raise ValueError(f"unknown start position {start!r} (new, current or all)") from None


def start_error(exc: BaseException, stream: str, what: str) -> BlackboardError:
    """Our error for a failure to create an ordered consumer (pure)."""
    if isinstance(exc, nats.errors.ConnectionClosedError):
        return NotConnectedError("the NATS connection is closed")
    if isinstance(exc, nats.js.errors.NotFoundError):
        return ConfigurationError(f"cannot {what}: the stream {stream} does not exist "
                                  "(ensure_streams() creates it)")
    if isinstance(exc, nats.js.errors.APIError):
        return TransportError(f"cannot {what}: JetStream refused the consumer: {exc.description} "
                              f"(code {exc.err_code})")
    return NotConnectedError(f"cannot {what}: {exc!r}")


#: What creating the consumer may raise that :func:`start_error` maps.
_START_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.APIError,
    TimeoutError,
)


class OrderedFollower:
    """Hands every message of ``filter_subject`` on ``stream`` to ``on_message``, in stream order.

    Use as ``async with OrderedFollower(...) as f:`` or ``start()`` /
    ``stop()``. The callback runs on the connection's reader, so it must not
    block; whatever it raises is logged and kept in ``error`` (the message is
    skipped).

    Args:
        js: the JetStream context to create the consumer with.
        stream: the stream to follow.
        filter_subject: the subjects to follow (wildcards allowed).
        on_message: called with each delivered message.
        start: where to start (see :data:`StartPosition`).
        from_sequence: replay from this stream sequence on (overrides ``start``).
        headers_only: deliver headers without payloads.
        on_ready: called once, right after ``ready`` is set.
        what: how error messages name this follower ("follow <filter>").
        nc: the connection ``js`` is on: when it is down at ``stop``, the consumer is left
            to the server's inactivity threshold instead of a delete request that would
            wait for a reconnect (without it, the delete is tried, for a bounded time).
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        on_message: Callable[[Msg], None],
        *,
        start: StartPosition = "all",
        from_sequence: int | None = None,
        headers_only: bool = False,
        on_ready: Callable[[], None] | None = None,
        what: str | None = None,
        nc: NATS | None = None,
    ) -> None:
        self._js = js
        self._nc = nc
        self.stream = stream
        self.filter_subject = filter_subject
        self._on_message = on_message
        self._policy, self._start_seq = deliver_policy(start, from_sequence)
        self._headers_only = headers_only
        self._on_ready = on_ready
        self._what = what or f"follow {filter_subject}"
        self._sub: Any = None
        self._starting = asyncio.Lock()
        self._seen = 0  # deliveries through the callback, against the consumer's count
        #: Set once the messages stored when the follower started have been handled.
        self.ready = asyncio.Event()
        self._ready = False
        #: The stream sequence of the last message delivered (0 before the first).
        self.last_sequence = 0
        #: The last callback error (that message was skipped, the follower went on).
        self.error: BaseException | None = None
        #: Messages skipped because the callback raised on them.
        self.skipped = 0
        self._consumer: str | None = None  # the consumer's name (a reset renames it)

    @property
    def started(self) -> bool:
        """Whether the consumer exists (between a successful ``start`` and ``stop``)."""
        return self._sub is not None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the consumer (idempotent): on return it exists; on error nothing is left.

        Raises:
            NotConnectedError: NATS is closed or did not answer.
            ConfigurationError: the stream does not exist.
            TransportError: the server refused the consumer.
        """
        async with self._starting:
            if self._sub is None:
                await self._start()

    async def _start(self) -> None:
        config = api.ConsumerConfig(deliver_policy=self._policy, opt_start_seq=self._start_seq,
                                    headers_only=self._headers_only or None)
        sub: Any = None
        try:
            sub = await self._js.subscribe(
                self.filter_subject, stream=self.stream, cb=self._on_msg, ordered_consumer=True, config=config,
                idle_heartbeat=_IDLE_HEARTBEAT, pending_msgs_limit=_PENDING_MSGS,
                pending_bytes_limit=_PENDING_BYTES)
            info = await sub.consumer_info()
        except _START_ERRORS as exc:
            if sub is not None:  # half-started: take it down, so a retry starts afresh
                await self._unsubscribe(sub)
                await delete_consumer(self._js, self.stream, self._consumer, connected=self._connected())
            if is_consumer_limit(exc):
                raise await consumer_limit_error(self._js, self.stream, self._what) from exc
            raise start_error(exc, self.stream, self._what) from exc
        self._sub = sub
        self._consumer = info.name
        # Ready already when nothing is pending and every delivered message has
        # been through the callback (which marks ready on pending == 0 itself).
        if self._policy is api.DeliverPolicy.NEW or (
                info.num_pending == 0 and (info.delivered.consumer_seq or 0) <= self._seen):
            self._mark_ready()

    def _mark_ready(self) -> None:
        if not self._ready:
            self._ready = True
            self.ready.set()
            if self._on_ready is not None:
                self._on_ready()

    async def _on_msg(self, msg: Msg) -> None:
        self._seen += 1
        try:
            md = msg.metadata
            pending = md.num_pending
            self.last_sequence = md.sequence.stream
            self._consumer = md.consumer  # (renamed when the ordered consumer was reset)
        except (AttributeError, IndexError, ValueError):  # not a JetStream delivery
            pending = 0
        try:
            self._on_message(msg)
        except Exception as exc:  # a bad message must not stop the consumer
            self.error = exc
            self.skipped += 1
            log.warning("%s: skipping message %s: %r", self.filter_subject, msg.subject, exc)
        if pending == 0 and not self._ready:  # live messages (pending 0) skip the call
            self._mark_ready()

    async def stop(self) -> None:
        """Unsubscribe and delete the consumer on the server (idempotent; see the module
        docstring: a connection that is down leaves it to the server's inactivity threshold)."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await self._unsubscribe(sub)
            await delete_consumer(self._js, self.stream, self._consumer, connected=self._connected())

    def _connected(self) -> bool | None:
        return None if self._nc is None else self._nc.is_connected

    @staticmethod
    async def _unsubscribe(sub: Any) -> None:
        try:
            await sub.unsubscribe()
        except (TimeoutError, nats.errors.Error):  # connection gone: nothing to clean up
            pass
