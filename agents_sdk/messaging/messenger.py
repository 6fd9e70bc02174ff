"""Agent-to-agent messages: direct, broadcast and topic messages, request/reply.

``Messenger`` holds one agent's messaging state on its NATS connection
(``agent.messaging``; the ``Agent`` and ``Board`` methods delegate here):

* ``send`` publishes one copy per recipient on ``bb.msg.agent.<to>`` (stream
  ``BB_MSG``) and returns once JetStream acknowledged every copy;
  ``broadcast`` publishes on ``bb.msg.board.<board>``, ``publish`` on
  ``bb.msg.topic.<topic>``. Writes carry ``Nats-Msg-Id`` and are retried until
  ``nats.write_timeout``, so a retry is stored once.
* ``inbox`` reads the agent's durable inbox (:mod:`agents_sdk.messaging.inbox`);
  ``join``/``leave`` and ``subscribe``/``unsubscribe`` change what reaches it.
* ``request`` sends a core NATS request on ``bb.rpc.<to>`` and waits for the
  reply; ``handle`` registers the function that answers a request type.

Envelopes are ``MessageEnvelope`` maps, msgpack or JSON (``Bb-Encoding``).
See docs/messaging.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agents_sdk.messaging.inbox import (
    Inbox,
    InboxConsumer,
    Message,
    decode_envelope,
    with_grant,
    without_grant,
)
from agents_sdk.search import raise_for_error
from blackboard.client.publisher import Publisher
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidKeyError,
    InvalidPayloadError,
    MessagingError,
    NoHandlerError,
    NoResponderError,
    NotConnectedError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    SearchError,
    TransportError,
)
from blackboard.protocol.schemas import MessageEnvelope, MessageKind, validate_wire
from blackboard.protocol.schemas.message_search import (
    MessageHit,
    MessageSearchRequest,
    MessageSearchResponse,
)
from blackboard.protocol.subjects import RPC_QUEUE_GROUP, Header, Subjects, validate_name
from blackboard.settings import Settings

__all__ = [
    "Handler",
    "Messenger",
    "Sent",
    "Subscriptions",
    "encode_envelope",
    "error_body",
    "new_envelope",
    "reply_envelope",
]

log = logging.getLogger("agents_sdk.messaging.messenger")

#: A request handler: gets the request, returns the reply body (or raises).
Handler = Callable[[Message], Awaitable[Any] | Any]

_MSG_TOO_BIG = 10054
_BOARD_PREFIX = Subjects.broadcast("x")[:-1]
_TOPIC_PREFIX = Subjects.topic("x")[:-1]


@dataclass(frozen=True, slots=True)
class Sent:
    """Receipt of a message stored in ``BB_MSG``.

    Attributes:
        id: the message id (the envelope's ``id``).
        sequences: stream sequence of each stored copy (one per recipient of a
            direct message, in the order given; one for a broadcast or topic message).
    """

    id: str
    sequences: tuple[int, ...]

    @property
    def seq(self) -> int:
        """The stream sequence of the (first) stored copy."""
        return self.sequences[0]


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """What reaches an agent's inbox besides its direct messages."""

    boards: tuple[str, ...]
    topics: tuple[str, ...]


# --------------------------------------------------------------------------- pure
def new_envelope(*, id: str, sender: str, kind: MessageKind, type: str, body: Any = None,
                 recipients: Sequence[str] = (), board: str | None = None, topic: str | None = None,
                 correlation_id: str | None = None, reply_to: str | None = None,
                 metadata: Mapping[str, Any] | None = None, created_at: datetime | None = None
                 ) -> MessageEnvelope:
    """Build and validate an envelope.

    Raises:
        InvalidKeyError: an agent id, board or topic token is invalid.
        InvalidPayloadError: another field is invalid (empty type, ...).
    """
    for name in (sender, *recipients):
        validate_name(name, "agent id")
    if board is not None:
        validate_name(board, "board")
    if not isinstance(type, str) or not type:
        raise InvalidPayloadError("a message type must be a non-empty string")
    try:
        return MessageEnvelope(id=id, sender=sender, kind=kind, recipients=list(recipients), board=board,
                               topic=topic, type=type, body=body, correlation_id=correlation_id,
                               reply_to=reply_to, created_at=created_at or datetime.now(UTC),
                               metadata=dict(metadata or {}))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidPayloadError(f"invalid message: {exc}") from exc


def encode_envelope(env: MessageEnvelope, encoding: codec.Encoding = "msgpack") -> bytes:
    """The wire bytes of an envelope (fields that are None are left out).

    Raises:
        InvalidPayloadError: the body cannot be carried by the encoding (bytes in JSON...).
    """
    return codec.encode(env.model_dump(exclude_none=True), encoding)


def reply_envelope(request: MessageEnvelope, *, id: str, sender: str, body: Any) -> MessageEnvelope:
    """The reply to ``request``: a direct message back to its sender, correlated by the request id."""
    return new_envelope(id=id, sender=sender, kind="direct", recipients=[request.sender], type=request.type,
                        body=body, board=request.board, correlation_id=request.id)


def error_body(error: str, message: str) -> dict[str, str]:
    """The body of an error reply (sent with the ``Bb-Error: <error>`` header)."""
    return {"error": error, "message": message}


# --------------------------------------------------------------------------- IO
class Messenger:
    """One agent's messaging on a NATS connection. No IO in ``__init__``; close with :meth:`close`.

    Args:
        agent_id: the agent's id (the sender of everything it sends).
        nc: a connected NATS client.
        settings: the deployment's settings.
    """

    def __init__(self, agent_id: str, nc: NATS, settings: Settings) -> None:
        self.agent = validate_name(agent_id, "agent id")
        self._nc = nc
        self._settings = settings
        self._js = nc.jetstream(timeout=settings.nats.request_timeout)
        self._publisher = Publisher(nc, self._js, settings.nats)
        self.consumer = InboxConsumer(nc, self._js, settings, self.agent)
        self._id_prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)
        self._max = settings.board.max_value_size
        self._handlers: dict[str, Handler] = {}
        self._rpc_sub: Subscription | None = None
        self._reply_sub: Subscription | None = None
        self._reply_prefix = ""
        self._replies: dict[str, asyncio.Future[Msg]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._setup_lock = asyncio.Lock()
        self._closed = False

    def new_id(self) -> str:
        """A new message id (random per messenger, then a counter: unique and cheap)."""
        return f"{self._id_prefix}{next(self._counter):x}"

    # ------------------------------------------------------------ sending
    async def send(self, to: str | Sequence[str], type: str, body: Any = None, *, board: str | None = None,
                   correlation_id: str | None = None, metadata: Mapping[str, Any] | None = None,
                   encoding: codec.Encoding = "msgpack", id: str | None = None) -> Sent:
        """Send a direct message to one agent or several (one inbox copy each).

        Returns once JetStream has stored every copy.

        Raises:
            InvalidKeyError: an invalid agent id (or board).
            InvalidPayloadError, PayloadTooLargeError: the message cannot be sent.
            NotConnectedError, OperationTimeoutError: not acknowledged within ``nats.write_timeout``.
        """
        recipients = [to] if isinstance(to, str) else list(dict.fromkeys(to))
        if not recipients:
            raise InvalidKeyError("", "a direct message needs at least one recipient")
        env = new_envelope(id=id or self.new_id(), sender=self.agent, kind="direct", type=type, body=body,
                           recipients=recipients, board=board, correlation_id=correlation_id,
                           metadata=metadata)
        payload = self._checked(encode_envelope(env, encoding))
        if len(recipients) == 1:  # the common case, without gather's extra task
            r = recipients[0]
            return Sent(env.id, (await self._publish(Subjects.direct(r), payload,
                                                     self._headers(f"{env.id}:{r}", encoding)),))
        seqs = await asyncio.gather(*(
            self._publish(Subjects.direct(r), payload, self._headers(f"{env.id}:{r}", encoding))
            for r in recipients))
        return Sent(env.id, tuple(seqs))

    async def broadcast(self, board: str, type: str, body: Any = None, *, correlation_id: str | None = None,
                        metadata: Mapping[str, Any] | None = None, encoding: codec.Encoding = "msgpack",
                        id: str | None = None) -> Sent:
        """Send a message to every agent that joined ``board``.

        Raises:
            InvalidKeyError: an invalid board name.
            InvalidPayloadError, PayloadTooLargeError, NotConnectedError, OperationTimeoutError:
                as :meth:`send`.
        """
        env = new_envelope(id=id or self.new_id(), sender=self.agent, kind="broadcast", type=type, body=body,
                           board=board, correlation_id=correlation_id, metadata=metadata)
        payload = self._checked(encode_envelope(env, encoding))
        seq = await self._publish(Subjects.broadcast(board), payload, self._headers(env.id, encoding))
        return Sent(env.id, (seq,))

    async def publish(self, topic: str, type: str, body: Any = None, *, board: str | None = None,
                      correlation_id: str | None = None, metadata: Mapping[str, Any] | None = None,
                      encoding: codec.Encoding = "msgpack", id: str | None = None) -> Sent:
        """Publish a topic message (``topic`` is dot-separated tokens, no wildcards).

        It reaches the agents subscribed to a matching pattern.

        Raises:
            InvalidKeyError: an invalid topic (or board).
            InvalidPayloadError, PayloadTooLargeError, NotConnectedError, OperationTimeoutError:
                as :meth:`send`.
        """
        subject = Subjects.topic(topic, pattern=False)
        env = new_envelope(id=id or self.new_id(), sender=self.agent, kind="topic", type=type, body=body,
                           topic=topic, board=board, correlation_id=correlation_id, metadata=metadata)
        payload = self._checked(encode_envelope(env, encoding))
        seq = await self._publish(subject, payload, self._headers(env.id, encoding))
        return Sent(env.id, (seq,))

    def _checked(self, payload: bytes) -> bytes:
        if len(payload) > self._max:
            raise PayloadTooLargeError(len(payload), self._max)
        return payload

    @staticmethod
    def _headers(msg_id: str, encoding: codec.Encoding) -> dict[str, str]:
        headers = codec.headers_for(encoding)
        headers[Header.MSG_ID.value] = msg_id
        return headers

    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        """Publish until acknowledged or ``nats.write_timeout`` (the board's publisher: retries,
        outage and timeout errors); returns the stream sequence."""

        def refused(exc: nats.js.errors.APIError) -> BlackboardError:
            if exc.err_code == _MSG_TOO_BIG:
                return PayloadTooLargeError(len(payload), self._max)
            return TransportError(f"JetStream refused the message on {subject}: {exc.description} "
                                  f"(code {exc.err_code})")

        ack = await self._publisher.publish(subject, payload, headers, what=f"message on {subject}",
                                            map_api_error=refused)
        return ack.seq

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
                     include_own=include_own)

    async def join(self, board: str) -> None:
        """Receive the broadcasts of ``board`` sent from now on (idempotent, durable).

        Raises:
            InvalidKeyError: an invalid board name.
            NotConnectedError, OperationTimeoutError, TransportError: NATS trouble.
        """
        subject = Subjects.broadcast(board)
        await self.consumer.change(lambda g, last: with_grant(g, subject, last))

    async def leave(self, board: str) -> None:
        """Stop receiving ``board``'s broadcasts (undelivered ones are skipped)."""
        subject = Subjects.broadcast(board)
        await self.consumer.change(lambda g, last: without_grant(g, subject))

    async def subscribe(self, pattern: str) -> None:
        """Receive topic messages matching ``pattern`` (``*``, trailing ``>``) sent from now on.

        Durable: the subscription is part of the inbox and survives restarts.

        Raises:
            InvalidKeyError: an invalid pattern, or one that overlaps an
                existing subscription without covering it or being covered by it.
        """
        subject = Subjects.topic(pattern)
        await self.consumer.change(lambda g, last: with_grant(g, subject, last))

    async def unsubscribe(self, pattern: str) -> None:
        """Remove a topic subscription made with :meth:`subscribe` (the same pattern)."""
        subject = Subjects.topic(pattern)
        await self.consumer.change(lambda g, last: without_grant(g, subject))

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
        """Ask agent ``to`` and wait for its reply; returns the reply body.

        Raises:
            InvalidKeyError: an invalid agent id.
            NoResponderError: no agent ``to`` is listening for requests.
            NoHandlerError: ``to`` listens but has no handler for ``type``.
            RequestTimeoutError: no reply within ``timeout`` (default ``messaging.request_timeout``).
            RemoteError: the handler raised (``error`` is its exception class name).
            PayloadTooLargeError, InvalidPayloadError, NotConnectedError: the request cannot be sent.
        """
        subject = Subjects.rpc(to)
        wait = self._settings.messaging.request_timeout if timeout is None else timeout
        await self._ensure_reply_sub()
        token = f"{next(self._counter):x}"
        reply_to = Subjects.reply_inbox(self._reply_prefix, token)
        env = new_envelope(id=self.new_id(), sender=self.agent, kind="direct", type=type, body=body,
                           recipients=[to], board=board, correlation_id=None, reply_to=reply_to,
                           metadata=metadata)
        payload = encode_envelope(env, encoding)
        if len(payload) > self._nc.max_payload:
            raise PayloadTooLargeError(len(payload), self._nc.max_payload)
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._replies[token] = future
        try:
            try:
                await self._nc.publish(subject, payload, reply=reply_to, headers=codec.headers_for(encoding) or None)
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except nats.errors.MaxPayloadError as exc:
                raise PayloadTooLargeError(len(payload), self._nc.max_payload) from exc
            try:
                msg = await asyncio.wait_for(future, wait)
            except TimeoutError:
                raise RequestTimeoutError(to, wait) from None
        finally:
            self._replies.pop(token, None)
        return self._reply_body(to, type, msg)

    @staticmethod
    def _reply_body(to: str, type: str, msg: Msg) -> Any:
        headers = msg.headers or {}
        status = headers.get(Header.STATUS.value)
        if status == "503":
            raise NoResponderError(to)
        error = headers.get(Header.ERROR.value)
        if error:
            message = ""
            with contextlib.suppress(InvalidPayloadError):
                detail = decode_envelope(msg.data, headers).body
                if isinstance(detail, Mapping):
                    message = str(detail.get("message", ""))
            if error == NoHandlerError.__name__:
                raise NoHandlerError(to, type)
            raise RemoteError(to, type, error, message)
        if status and not msg.data:
            raise MessagingError(f"request to {to!r} failed with status {status}")
        return decode_envelope(msg.data, headers).body

    async def _ensure_reply_sub(self) -> None:
        if self._reply_sub is not None:
            return
        async with self._setup_lock:
            if self._reply_sub is None:
                if self._closed:
                    raise NotConnectedError("the agent is closed")
                self._reply_prefix = self._nc.new_inbox()
                self._reply_sub = await self._nc.subscribe(Subjects.reply_inbox(self._reply_prefix, "*"),
                                                           cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._replies.get(msg.subject[len(self._reply_prefix) + 1:])
        if future is not None and not future.done():
            future.set_result(msg)

    async def handle(self, type: str, fn: Handler) -> None:
        """Answer requests of ``type`` with ``fn`` (``"*"``: every type without its own handler).

        ``fn(request: Message)`` returns the reply body (it may be a coroutine
        function); an exception becomes an error reply (``Bb-Error`` header),
        raised at the caller as :class:`~blackboard.protocol.errors.RemoteError`.
        Requests are handled concurrently. Returns once the server routes
        requests to this agent.
        """
        if not isinstance(type, str) or not type:
            raise InvalidPayloadError("a request type must be a non-empty string")
        self._handlers[type] = fn
        async with self._setup_lock:
            if self._rpc_sub is None:
                if self._closed:
                    raise NotConnectedError("the agent is closed")
                self._rpc_sub = await self._nc.subscribe(Subjects.rpc(self.agent), queue=RPC_QUEUE_GROUP,
                                                         cb=self._on_request)
                await self._barrier()

    async def unhandle(self, type: str) -> None:
        """Stop answering ``type`` (requests of it then raise ``NoHandlerError`` at the caller)."""
        self._handlers.pop(type, None)

    async def _barrier(self) -> None:
        """Return once the server has processed what this connection sent (the SUB included).

        A request to a subject nobody listens on is answered "no responders"
        only after the server handled everything queued before it. (``flush``
        is not enough: nats-py writes its PING ahead of queued commands.)
        """
        with contextlib.suppress(nats.errors.NoRespondersError, nats.errors.TimeoutError):
            await self._nc.request(self._nc.new_inbox(), b"", timeout=self._settings.nats.request_timeout)

    async def _on_request(self, msg: Msg) -> None:
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Msg) -> None:
        encoding = codec.encoding_of(msg.headers)
        try:
            env = decode_envelope(msg.data, msg.headers)
        except InvalidPayloadError as exc:
            log.info("%s: undecodable request on %s: %s", self.agent, msg.subject, exc.reason)
            await self._respond(msg.reply, b"", {Header.ERROR.value: InvalidPayloadError.__name__})
            return
        fn = self._handlers.get(env.type) or self._handlers.get("*")
        if fn is None:
            await self._respond_error(msg.reply, env, NoHandlerError.__name__,
                                      f"no handler for requests of type {env.type!r}", encoding)
            return
        try:
            result = fn(Message(env, subject=msg.subject))
            if inspect.isawaitable(result):
                result = await result
            payload = encode_envelope(reply_envelope(env, id=self.new_id(), sender=self.agent, body=result),
                                      encoding)
            if len(payload) > self._nc.max_payload:
                raise PayloadTooLargeError(len(payload), self._nc.max_payload)
        except Exception as exc:  # the handler's failure is the caller's answer, not ours
            log.info("%s: handler of %r failed: %r", self.agent, env.type, exc)
            await self._respond_error(msg.reply, env, type(exc).__name__, str(exc), encoding)
            return
        await self._respond(msg.reply, payload, codec.headers_for(encoding))

    async def _respond_error(self, reply: str, env: MessageEnvelope, error: str, message: str,
                             encoding: codec.Encoding) -> None:
        body = error_body(error, message[:2000])
        payload = encode_envelope(reply_envelope(env, id=self.new_id(), sender=self.agent, body=body), encoding)
        headers = codec.headers_for(encoding)
        headers[Header.ERROR.value] = error
        await self._respond(reply, payload, headers)

    async def _respond(self, reply: str, payload: bytes, headers: dict[str, str]) -> None:
        if not reply:
            return  # a request published without a reply subject wants no answer
        try:
            await self._nc.publish(reply, payload, headers=headers or None)
        except nats.errors.Error as exc:
            log.info("%s: could not send a reply to %s: %r", self.agent, reply, exc)

    # ------------------------------------------------------------ search
    async def search(self, query: str | None = None, *, senders: Sequence[str] = (),
                     recipients: Sequence[str] = (), kinds: Sequence[MessageKind] = (),
                     types: Sequence[str] = (), boards: Sequence[str] = (), topics: Sequence[str] = (),
                     correlation_id: str | None = None, since: datetime | None = None,
                     until: datetime | None = None, top_k: int = 50,
                     order: Literal["newest", "oldest"] = "newest") -> list[MessageHit]:
        """Search the messages the workers stored in PostgreSQL (``bb.search.messages``).

        With ``query``: messages matching any of its words, best first
        (keyword search over type, topic and body text); without: the matching
        messages by time. Filters are ANDed; list filters match any element.

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
        timeout = self._settings.search.timeout
        try:
            msg = await self._nc.request(Subjects.search("messages"), codec.encode(req.model_dump(exclude_none=True)),
                                         timeout=timeout)
        except nats.errors.NoRespondersError as exc:
            raise SearchError("the search service is not running (start a worker)") from exc
        except TimeoutError as exc:
            raise SearchError(f"the search service did not answer within {timeout:g}s") from exc
        raise_for_error(msg.headers, msg.data)
        return validate_wire(MessageSearchResponse, codec.decode(msg.data, codec.encoding_of(msg.headers))).hits

    # ------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Close the inbox reader, stop answering requests and fail pending requests."""
        if self._closed:
            return
        self._closed = True
        if self.consumer.reader is not None:
            await self.consumer.reader.close()
        for sub in (self._rpc_sub, self._reply_sub):
            if sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for future in self._replies.values():
            if not future.done():
                future.set_exception(NotConnectedError("the agent was closed while waiting for a reply"))
        await self._publisher.close()
