"""Sending durable messages: direct, broadcast and topic.

* ``send`` publishes one copy per recipient on ``bb.msg.agent.<to>`` (stream
  ``BB_MSG``) and returns once JetStream acknowledged every copy;
* ``broadcast`` publishes on ``bb.msg.board.<board>`` (every agent that joined
  the board), ``publish`` on ``bb.msg.topic.<topic>`` (every agent subscribed
  to a matching pattern).

Writes carry ``Nats-Msg-Id`` and are retried until ``nats.write_timeout``, so
a retry is stored once. The payload is the envelope's canonical encoding
(msgpack; JSON on request), signed for each copy's subject and Msg-Id, afresh
before each (re)send (:mod:`agents_sdk.messaging.trust`). See docs/messaging.md.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from agents_sdk._args import name_list
from agents_sdk.messaging.envelope import envelope_wire, new_envelope
from agents_sdk.messaging.trust import MessageTrust
from blackboard.client.publisher import Publisher
from blackboard.client.signing import signing_of
from blackboard.observability import tracing
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidKeyError,
    PayloadTooLargeError,
    TransportError,
)
from blackboard.protocol.schemas import MessageEnvelope
from blackboard.protocol.subjects import Header, Subjects, validate_name
from blackboard.settings import Settings

__all__ = ["Sender", "Sent"]

_MSG_TOO_BIG = 10054


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


class Sender:
    """Sends one agent's durable messages. No IO in ``__init__``; close with :meth:`close`.

    Args:
        agent_id: the sender of everything sent (validated by the caller).
        nc: a connected NATS client.
        js: a JetStream context on ``nc``.
        settings: the deployment's settings.
        trust: what sends are signed with (default: the connection's signing).
    """

    def __init__(self, agent_id: str, nc: NATS, js: JetStreamContext, settings: Settings,
                 trust: MessageTrust | None = None) -> None:
        self.agent = agent_id
        self.publisher = Publisher(nc, js, settings.nats)
        self.trust = trust if trust is not None else MessageTrust(signing_of(nc))
        self._id_prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)
        self._max = settings.board.max_value_size

    def new_id(self) -> str:
        """A new message id (random per sender, then a counter: unique and cheap)."""
        return f"{self._id_prefix}{next(self._counter):x}"

    @tracing.traced("send", attributes=lambda self, to, type, *_, **__: {
        "messaging.system": "nats", "messaging.operation.type": "send", "blackboard.message.type": type,
        "blackboard.agent": self.agent, "blackboard.to": to if isinstance(to, str) else ",".join(map(str, to))})
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
        recipients = [to] if isinstance(to, str) else list(dict.fromkeys(
            r if isinstance(r, str) else validate_name(r, "agent id") for r in name_list(to, "to")))
        if not recipients:
            raise InvalidKeyError("", "a direct message needs at least one recipient")
        env = new_envelope(id=id or self.new_id(), sender=self.agent, kind="direct", type=type, body=body,
                           recipients=recipients, board=board, correlation_id=correlation_id,
                           metadata=metadata)
        payload, record = self._encoded(env, encoding)
        if len(recipients) == 1:  # the common case, without gather's extra task
            r = recipients[0]
            return Sent(env.id, (await self._publish(Subjects.direct(r), payload, record,
                                                     self._headers(f"{env.id}:{r}", encoding)),))
        seqs = await asyncio.gather(*(
            self._publish(Subjects.direct(r), payload, record, self._headers(f"{env.id}:{r}", encoding))
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
        payload, record = self._encoded(env, encoding)
        seq = await self._publish(Subjects.broadcast(board), payload, record, self._headers(env.id, encoding))
        return Sent(env.id, (seq,))

    @tracing.traced("publish", attributes=lambda self, topic, type, *_, **__: {
        "messaging.system": "nats", "messaging.operation.type": "send", "blackboard.message.type": type,
        "blackboard.agent": self.agent, "blackboard.topic": topic})
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
        payload, record = self._encoded(env, encoding)
        seq = await self._publish(subject, payload, record, self._headers(env.id, encoding))
        return Sent(env.id, (seq,))

    def _encoded(self, env: MessageEnvelope, encoding: codec.Encoding) -> tuple[bytes, bytes]:
        """``(payload, record)``: see :func:`~agents_sdk.messaging.envelope.envelope_wire`."""
        payload, record = envelope_wire(env, encoding)
        if len(payload) > self._max:
            raise PayloadTooLargeError(len(payload), self._max)
        return payload, record

    @staticmethod
    def _headers(msg_id: str, encoding: codec.Encoding) -> dict[str, str]:
        headers = codec.headers_for(encoding)
        headers[Header.MSG_ID.value] = msg_id
        return headers

    async def _publish(self, subject: str, payload: bytes, record: bytes, headers: dict[str, str]) -> int:
        """Publish until acknowledged or ``nats.write_timeout`` (the board's publisher: retries,
        outage and timeout errors; signed before each send); returns the stream sequence."""

        def refused(exc: nats.js.errors.APIError) -> BlackboardError:
            if exc.err_code == _MSG_TOO_BIG:
                return PayloadTooLargeError(len(payload), self._max)
            return TransportError(f"JetStream refused the message on {subject}: {exc.description} "
                                  f"(code {exc.err_code})")

        ack = await self.publisher.publish(subject, payload, headers, what=f"message on {subject}",
                                           map_api_error=refused,
                                           sign=self.trust.signer_of(subject, headers, record))
        return ack.seq

    async def close(self) -> None:
        """Drop the ack subscription; pending sends fail."""
        await self.publisher.close()
