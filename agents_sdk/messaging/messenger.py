"""Agent-to-agent messages: one agent's messaging, assembled from its parts.

``Messenger`` holds one agent's messaging state on its NATS connection
(``agent.messaging``; the ``Agent`` and ``Board`` methods delegate here). It
puts together

* sending (:mod:`agents_sdk.messaging.send`): ``send`` (direct, one stored copy
  per recipient), ``broadcast`` (a board's members), ``publish`` (a topic);
* the durable inbox (:mod:`agents_sdk.messaging.inbox`): ``inbox`` reads it,
  ``join``/``leave`` and ``subscribe``/``unsubscribe`` change what reaches it;
* request/reply (:mod:`agents_sdk.messaging.rpc`): ``request`` asks an agent
  and waits, ``handle`` registers the function that answers a request type;
* ``search`` over the messages the workers stored.

Envelopes are ``MessageEnvelope`` maps, msgpack or JSON (``Bb-Encoding``),
built by :mod:`agents_sdk.messaging.envelope`, signed and verified through
:mod:`agents_sdk.messaging.trust`. See docs/messaging.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from nats.aio.client import Client as NATS

from agents_sdk.messaging.inbox import Inbox, InboxConsumer
from agents_sdk.messaging.rpc import Handler, Requester, Responder
from agents_sdk.messaging.send import Sender, Sent
from agents_sdk.messaging.trust import MessageTrust
from agents_sdk.search import search_request
from blackboard.client.signing import signing_of
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, NotConnectedError
from blackboard.protocol.schemas import MessageKind
from blackboard.protocol.schemas.message_search import (
    MessageHit,
    MessageSearchRequest,
    MessageSearchResponse,
)
from blackboard.protocol.subjects import Subjects, validate_name
from blackboard.settings import Settings

__all__ = ["Messenger", "Subscriptions"]

_BOARD_PREFIX = Subjects.broadcast("x")[:-1]
_TOPIC_PREFIX = Subjects.topic("x")[:-1]


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """What reaches an agent's inbox besides its direct messages."""

    boards: tuple[str, ...]
    topics: tuple[str, ...]


class Messenger:
    """One agent's messaging on a NATS connection. No IO in ``__init__``; close with :meth:`close`
    (or use it as ``async with Messenger(...) as messenger``).

    Args:
        agent_id: the agent's id (the sender of everything it sends).
        nc: a connected NATS client.
        settings: the deployment's settings.
    """

    def __init__(self, agent_id: str, nc: NATS, settings: Settings) -> None:
        self.agent = validate_name(agent_id, "agent id")
        self._nc = nc
        self._settings = settings
        js = nc.jetstream(timeout=settings.nats.request_timeout)
        #: What every message sent is signed with and every message received verified with.
        self.trust = MessageTrust(signing_of(nc))
        #: Direct, broadcast and topic sends.
        self.sender = Sender(self.agent, nc, js, settings, self.trust)
        #: The agent's durable inbox consumer (its grants: boards joined, topics subscribed).
        self.consumer = InboxConsumer(nc, js, settings, self.agent)
        #: Request/reply: the asking side and the answering side.
        self.requester = Requester(self.agent, nc, settings, self.new_id, self.trust)
        self.responder = Responder(self.agent, nc, settings, self.new_id, self.trust)
        self._closed = False

    @property
    def hidden(self) -> int:
        """Messages hidden because they did not verify (inbox deliveries, requests, replies)."""
        return self.trust.hidden

    def new_id(self) -> str:
        """A new message id (random per messenger, then a counter: unique and cheap)."""
        return self.sender.new_id()

    # ------------------------------------------------------------ sending
    async def send(self, to: str | Sequence[str], type: str, body: Any = None, *, board: str | None = None,
                   correlation_id: str | None = None, metadata: Mapping[str, Any] | None = None,
                   encoding: codec.Encoding = "msgpack", id: str | None = None) -> Sent:
        """Send a direct message to one agent or several; see :meth:`Sender.send`."""
        return await self.sender.send(to, type, body, board=board, correlation_id=correlation_id,
                                      metadata=metadata, encoding=encoding, id=id)

    async def broadcast(self, board: str, type: str, body: Any = None, *, correlation_id: str | None = None,
                        metadata: Mapping[str, Any] | None = None, encoding: codec.Encoding = "msgpack",
                        id: str | None = None) -> Sent:
        """Send a message to every agent that joined ``board``; see :meth:`Sender.broadcast`."""
        return await self.sender.broadcast(board, type, body, correlation_id=correlation_id, metadata=metadata,
                                           encoding=encoding, id=id)

    async def publish(self, topic: str, type: str, body: Any = None, *, board: str | None = None,
                      correlation_id: str | None = None, metadata: Mapping[str, Any] | None = None,
                      encoding: codec.Encoding = "msgpack", id: str | None = None) -> Sent:
        """Publish a topic message; see :meth:`Sender.publish`."""
        return await self.sender.publish(topic, type, body, board=board, correlation_id=correlation_id,
                                         metadata=metadata, encoding=encoding, id=id)

    # ------------------------------------------------------------ inbox
    def inbox(self, *, types: Collection[str] | None = None, batch: int | None = None,
              timeout: float | None = None, limit: int | None = None, include_own: bool = False) -> Inbox:
        """A reader of this agent's durable inbox (see :class:`~agents_sdk.messaging.inbox.Inbox`).

        ``async for msg in messenger.inbox(timeout=5): ...; await msg.ack()``.
        One reader per agent at a time: opening a new one closes the previous
        reader (its unacknowledged messages come to the new one first).
        """
        if self._closed:
            raise NotConnectedError("the agent is closed")
        return Inbox(self.consumer, self._settings, types=types, batch=batch, timeout=timeout, limit=limit,
                     include_own=include_own, trust=self.trust)

    async def join(self, board: str) -> None:
        """Receive the broadcasts of ``board`` sent from now on (idempotent, durable).

        Raises:
            InvalidKeyError: an invalid board name.
            PermissionDeniedError: the agent may not read the board.
            NoResponderError: no worker runs to change the inbox (its system service does,
                unless ``nats.insecure_open_bus``).
            NotConnectedError, OperationTimeoutError, TransportError: NATS trouble.
        """
        subject = Subjects.broadcast(board)
        await self.consumer.add(subject)

    async def leave(self, board: str) -> None:
        """Stop receiving ``board``'s broadcasts (undelivered ones are skipped)."""
        subject = Subjects.broadcast(board)
        await self.consumer.remove(subject)

    async def subscribe(self, pattern: str) -> None:
        """Receive topic messages matching ``pattern`` (``*``, trailing ``>``) sent from now on.

        Durable: the subscription is part of the inbox and survives restarts.

        Raises:
            InvalidKeyError: an invalid pattern, or one that overlaps an
                existing subscription without covering it or being covered by it.
            PermissionDeniedError: the pattern is not within the agent's topic patterns.
            NoResponderError: no worker runs to change the inbox (its system service does,
                unless ``nats.insecure_open_bus``).
        """
        subject = Subjects.topic(pattern)
        await self.consumer.add(subject)

    async def unsubscribe(self, pattern: str) -> None:
        """Remove a topic subscription made with :meth:`subscribe` (the same pattern)."""
        subject = Subjects.topic(pattern)
        await self.consumer.remove(subject)

    async def subscriptions(self) -> Subscriptions:
        """The boards joined and topic patterns subscribed to, as the server has them."""
        await self.consumer.ensure()
        grants = sorted(self.consumer.grants)
        return Subscriptions(
            boards=tuple(p[len(_BOARD_PREFIX):] for p in grants if p.startswith(_BOARD_PREFIX)),
            topics=tuple(p[len(_TOPIC_PREFIX):] for p in grants if p.startswith(_TOPIC_PREFIX)),
        )

    # ------------------------------------------------------------ request / reply
    async def request(self, to: str, type: str, body: Any = None, *, timeout: float | None = None,
                      board: str | None = None, metadata: Mapping[str, Any] | None = None,
                      encoding: codec.Encoding = "msgpack") -> Any:
        """Ask agent ``to`` and wait for its reply; returns the reply body; see :meth:`Requester.request`."""
        return await self.requester.request(to, type, body, timeout=timeout, board=board, metadata=metadata,
                                            encoding=encoding)

    async def handle(self, type: str, fn: Handler) -> None:
        """Answer requests of ``type`` with ``fn`` (``"*"``: every type without its own handler);
        see :meth:`Responder.handle`."""
        await self.responder.handle(type, fn)

    async def unhandle(self, type: str) -> None:
        """Stop answering ``type`` (requests of it then raise ``NoHandlerError`` at the caller)."""
        await self.responder.unhandle(type)

    # ------------------------------------------------------------ search
    async def search(self, query: str | None = None, *, senders: Sequence[str] = (),
                     recipients: Sequence[str] = (), kinds: Sequence[MessageKind] = (),
                     types: Sequence[str] = (), boards: Sequence[str] = (), topics: Sequence[str] = (),
                     correlation_id: str | None = None, since: datetime | None = None,
                     until: datetime | None = None, top_k: int = 50,
                     order: Literal["newest", "oldest"] = "newest") -> list[MessageHit]:
        """Search the messages the workers stored in PostgreSQL (``bb.search.<agent>.messages``).

        With ``query``: messages matching any of its words, best first
        (keyword search over type, topic and body text); without: the matching
        messages by time. Filters are ANDed; list filters match any element.
        Only messages this agent may read are searched: the copies of direct
        messages stored under its own direct subject, broadcasts of boards it
        may read and topic messages within its topic patterns (not the direct
        messages it sent to others: see docs/search.md).

        Raises:
            InvalidPayloadError: the service refused the request.
            SearchError: the search service is not running, timed out or failed.
        """
        try:
            req = MessageSearchRequest(query=query, senders=list(senders), recipients=list(recipients),
                                       kinds=list(kinds), types=list(types), boards=list(boards),
                                       topics=list(topics), correlation_id=correlation_id, since=since,
                                       until=until, top_k=top_k, order=order)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid message search: {exc}") from exc
        reply = await search_request(self._nc, "messages", req, MessageSearchResponse, principal=self.agent,
                                     timeout=self._settings.search.timeout)
        return reply.hits

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Messenger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the inbox reader, stop answering requests and fail pending requests (idempotent)."""
        if self._closed:
            return
        self._closed = True
        reader = self.consumer.reader
        try:
            if reader is not None:
                await reader.close()
        finally:
            try:
                await self.responder.close()
            finally:
                await self.requester.close()
                await self.sender.close()
