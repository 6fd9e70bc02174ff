"""Request/reply between agents over core NATS (not stored).

* :class:`Requester` sends a request on ``bb.rpc.<to>`` with a reply subject
  under one wildcard inbox subscription of its own, and waits for the reply.
* :class:`Responder` subscribes to ``bb.rpc.<me>`` (queue group, so several
  processes of one agent share the load) and answers each request with the
  handler registered for its type; requests are served concurrently, each in
  a task of the responder's task group.

A handler's exception becomes an error reply (``Bb-Error: <class name>``),
raised at the caller as :class:`~blackboard.protocol.errors.RemoteError`.

Requests and replies are signed (the envelope's canonical bytes, for the
subject they are published on and a ``Nats-Msg-Id`` that is the envelope's
id) and verified on arrival (:mod:`agents_sdk.messaging.trust`): a request
that does not verify is answered with the error ``UnverifiedRecordError``
(the handler never sees it) and a reply that does not verify, or that is not
from the agent asked, is ignored, so the caller raises
:class:`~blackboard.protocol.errors.UnverifiedRecordError` when no reply that
verifies came in time; with ``security.unverified = "flag"`` both are passed
on (a request to the handler with its ``verdict``). See docs/messaging.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agents_sdk._args import seconds
from agents_sdk.lifecycle import TaskHost
from agents_sdk.messaging.envelope import (
    decode_envelope,
    envelope_wire,
    error_body,
    new_envelope,
    reply_envelope,
)
from agents_sdk.messaging.inbox import Message
from agents_sdk.messaging.trust import MessageTrust
from blackboard.client.signing import signing_of
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    InvalidPayloadError,
    MessagingError,
    NoHandlerError,
    NoResponderError,
    NotConnectedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RemoteError,
    RequestTimeoutError,
    UnverifiedRecordError,
)
from blackboard.protocol.schemas import MessageEnvelope
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import RPC_QUEUE_GROUP, Header, Subjects
from blackboard.settings import Settings

__all__ = ["Handler", "Requester", "Responder", "reply_body"]

log = logging.getLogger("agents_sdk.messaging.rpc")

#: A request handler: gets the request, returns the reply body (or raises).
Handler = Callable[[Message], Awaitable[Any] | Any]


class Requester:
    """The asking side of one agent. No IO in ``__init__``; close with :meth:`close`.

    Args:
        agent_id: the sender of the requests.
        nc: a connected NATS client.
        settings: for the default request timeout.
        new_id: gives each request envelope its id.
        trust: what requests are signed and replies verified with (default: the connection's).
    """

    def __init__(self, agent_id: str, nc: NATS, settings: Settings, new_id: Callable[[], str],
                 trust: MessageTrust | None = None) -> None:
        self.agent = agent_id
        self._nc = nc
        self._settings = settings
        self._new_id = new_id
        self._trust = trust if trust is not None else MessageTrust(signing_of(nc))
        self._tokens = itertools.count(1)
        self._reply_sub: Subscription | None = None
        self._reply_prefix = ""
        #: The replies of each pending request, by token (None: the requester was closed).
        self._replies: dict[str, asyncio.Queue[Msg | None]] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def request(self, to: str, type: str, body: Any = None, *, timeout: float | None = None,
                      board: str | None = None, metadata: Mapping[str, Any] | None = None,
                      encoding: codec.Encoding = "msgpack") -> Any:
        """Ask agent ``to`` and wait for its reply; returns the reply body.

        Raises:
            InvalidKeyError: an invalid agent id.
            NoResponderError: no agent ``to`` is listening for requests.
            NoHandlerError: ``to`` listens but has no handler for ``type``.
            RequestTimeoutError: no reply within ``timeout`` (default ``messaging.request_timeout``).
            UnverifiedRecordError: no reply that verifies came within ``timeout``, but one that
                does not (signed by another agent than ``to``, tampered, unsigned...).
            RemoteError: the handler raised (``error`` is its exception class name).
            PayloadTooLargeError, InvalidPayloadError, NotConnectedError: the request cannot be sent.
        """
        subject = Subjects.rpc(to)
        wait = self._settings.messaging.request_timeout if timeout is None else seconds(timeout, "timeout")
        await self._ensure_reply_sub()
        token = f"{next(self._tokens):x}"
        reply_to = Subjects.reply_inbox(self._reply_prefix, token)
        env = new_envelope(id=self._new_id(), sender=self.agent, kind="direct", type=type, body=body,
                           recipients=[to], board=board, correlation_id=None, reply_to=reply_to,
                           metadata=metadata)
        payload, record = envelope_wire(env, encoding)
        if len(payload) > self._nc.max_payload:
            raise PayloadTooLargeError(len(payload), self._nc.max_payload)
        headers = codec.headers_for(encoding)
        headers[Header.MSG_ID.value] = env.id
        replies: asyncio.Queue[Msg | None] = asyncio.Queue()
        self._replies[token] = replies
        try:
            try:
                self._trust.sign_now(subject, headers, record)
                await self._nc.publish(subject, payload, reply=reply_to, headers=headers)
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except nats.errors.MaxPayloadError as exc:
                raise PayloadTooLargeError(len(payload), self._nc.max_payload) from exc
            return await self._reply(to, type, replies, wait)
        finally:
            self._replies.pop(token, None)

    async def _reply(self, to: str, type: str, replies: asyncio.Queue[Msg | None], wait: float) -> Any:
        """The body of the first reply that verifies (or of a server status), within ``wait``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        hidden: UnverifiedRecordError | None = None
        while True:
            try:
                msg = await asyncio.wait_for(replies.get(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                if hidden is not None:
                    raise hidden from None
                raise RequestTimeoutError(to, wait) from None
            if msg is None:
                raise NotConnectedError("the agent was closed while waiting for a reply")
            unverified = await self._unverified(to, msg)
            if unverified is None:
                return reply_body(to, type, msg)
            hidden = hidden or unverified

    async def _unverified(self, to: str, msg: Msg) -> UnverifiedRecordError | None:
        """Why a reply is hidden (it does not verify, or is not from ``to``), or None to take it.

        A server status (no responders) carries no record; a reply that does not decode is
        left to :func:`reply_body` (an error either way).
        """
        headers = msg.headers or {}
        if headers.get(Header.STATUS.value) and not msg.data:
            return None
        try:
            env = decode_envelope(msg.data, headers)
        except InvalidPayloadError:
            return None
        verdict = await self._trust.verdict(msg.subject, headers, msg.data, env)
        if verdict is Verdict.VERIFIED and env.sender != to:
            verdict = Verdict.WRONG_AUTHOR  # signed by its sender, who is not the agent asked
        if self._trust.shows(verdict):
            return None
        log.warning("%s: hiding a reply from %r (sender %r): signature %s", self.agent, to, env.sender,
                    verdict.value)
        return UnverifiedRecordError(verdict.value, msg.subject, signer=self._trust.signer_principal(headers),
                                     record=env)

    async def _ensure_reply_sub(self) -> None:
        if self._reply_sub is not None:
            return
        async with self._lock:
            if self._reply_sub is None:
                if self._closed:
                    raise NotConnectedError("the agent is closed")
                self._reply_prefix = self._nc.new_inbox()
                self._reply_sub = await self._nc.subscribe(Subjects.reply_inbox(self._reply_prefix, "*"),
                                                           cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        replies = self._replies.get(msg.subject[len(self._reply_prefix) + 1:])
        if replies is not None:
            replies.put_nowait(msg)

    async def close(self) -> None:
        """Drop the reply subscription; pending requests fail with ``NotConnectedError``."""
        self._closed = True
        sub, self._reply_sub = self._reply_sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        for replies in self._replies.values():
            replies.put_nowait(None)


def reply_body(to: str, type: str, msg: Msg) -> Any:
    """The body of the reply ``msg`` to a request of ``type`` sent to ``to``.

    Raises:
        NoResponderError: the server answered "no responders" (status 503).
        NoHandlerError, RemoteError: an error reply (``Bb-Error``).
        MessagingError: another status without a body.
        InvalidPayloadError: the reply does not decode.
    """
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


class Responder:
    """The answering side of one agent. No IO in ``__init__``; close with :meth:`close`.

    The subscription and the task group that serves requests are made by the
    first :meth:`handle`.

    Args:
        agent_id: the agent requests are addressed to.
        nc: a connected NATS client.
        settings: for the barrier's timeout.
        new_id: gives each reply envelope its id.
        trust: what requests are verified and replies signed with (default: the connection's).
    """

    def __init__(self, agent_id: str, nc: NATS, settings: Settings, new_id: Callable[[], str],
                 trust: MessageTrust | None = None) -> None:
        self.agent = agent_id
        self._nc = nc
        self._settings = settings
        self._new_id = new_id
        self._trust = trust if trust is not None else MessageTrust(signing_of(nc))
        self._handlers: dict[str, Handler] = {}
        self._sub: Subscription | None = None
        self._tasks = TaskHost(f"rpc {agent_id}")
        self._lock = asyncio.Lock()
        self._closed = False

    async def handle(self, type: str, fn: Handler) -> None:
        """Answer requests of ``type`` with ``fn`` (``"*"``: every type without its own handler).

        ``fn(request: Message)`` returns the reply body (it may be a coroutine
        function); an exception becomes an error reply (``Bb-Error`` header),
        raised at the caller as :class:`~blackboard.protocol.errors.RemoteError`.
        Requests are handled concurrently. Returns once the server routes
        requests to this agent.

        Raises:
            InvalidPayloadError: an empty type.
            NotConnectedError: the agent is closed.
        """
        if not isinstance(type, str) or not type:
            raise InvalidPayloadError("a request type must be a non-empty string")
        self._handlers[type] = fn
        async with self._lock:
            if self._sub is None:
                if self._closed:
                    raise NotConnectedError("the agent is closed")
                await self._tasks.open()
                self._sub = await self._nc.subscribe(Subjects.rpc(self.agent), queue=RPC_QUEUE_GROUP,
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
        # With a credential the server refuses the publish to our own inbox: its refusal
        # comes back just as fast, after the SUB too, so it is the barrier as well.
        with contextlib.suppress(nats.errors.NoRespondersError, nats.errors.TimeoutError, PermissionDeniedError):
            await self._nc.request(self._nc.new_inbox(), b"", timeout=self._settings.nats.request_timeout)

    async def _on_request(self, msg: Msg) -> None:
        if self._tasks.running:  # a request arriving while closing gets no answer (the caller times out)
            self._tasks.spawn(self._serve(msg), name=f"rpc {self.agent} request")

    async def _serve(self, msg: Msg) -> None:
        try:
            await self._answer(msg)
        except Exception:  # one request's failure must not end the responder (and its siblings)
            log.exception("%s: serving a request on %s failed", self.agent, msg.subject)

    async def _answer(self, msg: Msg) -> None:
        encoding = codec.encoding_of(msg.headers)
        try:
            env = decode_envelope(msg.data, msg.headers)
        except InvalidPayloadError as exc:
            log.info("%s: undecodable request on %s: %s", self.agent, msg.subject, exc.reason)
            await self._respond(msg.reply, None, b"", b"", {Header.ERROR.value: InvalidPayloadError.__name__})
            return
        verdict = await self._trust.verdict(msg.subject, msg.headers, msg.data, env)
        if not self._trust.shows(verdict):
            log.warning("%s: refusing a request on %s (sender %r): signature %s", self.agent, msg.subject,
                        env.sender, verdict.value)
            await self._respond_error(msg.reply, env, UnverifiedRecordError.__name__,
                                      f"the request does not verify: {verdict.value}", encoding)
            return
        fn = self._handlers.get(env.type) or self._handlers.get("*")
        if fn is None:
            await self._respond_error(msg.reply, env, NoHandlerError.__name__,
                                      f"no handler for requests of type {env.type!r}", encoding)
            return
        try:
            result = fn(Message(env, subject=msg.subject, verdict=verdict))
            if inspect.isawaitable(result):
                result = await result
            answer = reply_envelope(env, id=self._new_id(), sender=self.agent, body=result)
            payload, record = envelope_wire(answer, encoding)
            if len(payload) > self._nc.max_payload:
                raise PayloadTooLargeError(len(payload), self._nc.max_payload)
        except Exception as exc:  # the handler's failure is the caller's answer, not ours
            log.info("%s: handler of %r failed: %r", self.agent, env.type, exc)
            await self._respond_error(msg.reply, env, type(exc).__name__, str(exc), encoding)
            return
        await self._respond(msg.reply, answer, payload, record, codec.headers_for(encoding))

    async def _respond_error(self, reply: str, env: MessageEnvelope, error: str, message: str,
                             encoding: codec.Encoding) -> None:
        body = error_body(error, message[:2000])
        answer = reply_envelope(env, id=self._new_id(), sender=self.agent, body=body)
        payload, record = envelope_wire(answer, encoding)
        headers = codec.headers_for(encoding)
        headers[Header.ERROR.value] = error
        await self._respond(reply, answer, payload, record, headers)

    async def _respond(self, reply: str, answer: MessageEnvelope | None, payload: bytes, record: bytes,
                       headers: dict[str, str]) -> None:
        """Publish a reply on ``reply``, signed for it (an envelope's: ``answer`` is its envelope)."""
        if not reply:
            return  # a request published without a reply subject wants no answer
        try:
            if answer is not None:
                headers[Header.MSG_ID.value] = answer.id
                self._trust.sign_now(reply, headers, record)
            await self._nc.publish(reply, payload, headers=headers or None)
        except nats.errors.Error as exc:
            log.info("%s: could not send a reply to %s: %r", self.agent, reply, exc)
        except InvalidPayloadError as exc:  # a reply subject holding a line break: nothing to sign for
            log.info("%s: could not sign a reply to %r: %s", self.agent, reply, exc.reason)

    async def close(self) -> None:
        """Stop answering: unsubscribe, then cancel and await the requests being served."""
        self._closed = True
        sub, self._sub = self._sub, None
        try:
            if sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        finally:
            await self._tasks.aclose()
