"""Agent messages: direct, broadcast and topic sends, durable inboxes, request/reply.

Modules, one concept each: :mod:`~agents_sdk.messaging.envelope` (build,
encode, decode), :mod:`~agents_sdk.messaging.send` (stored sends),
:mod:`~agents_sdk.messaging.inbox` (the durable inbox and its grants),
:mod:`~agents_sdk.messaging.rpc` (request/reply),
:mod:`~agents_sdk.messaging.trust` (signing what is sent, verifying what is
received) and :mod:`~agents_sdk.messaging.messenger` (one agent's messaging,
put together).
"""

from agents_sdk.messaging.envelope import (
    decode_envelope,
    encode_envelope,
    envelope_wire,
    error_body,
    new_envelope,
    reply_envelope,
)
from agents_sdk.messaging.inbox import Inbox, InboxConsumer, Message
from agents_sdk.messaging.messenger import Messenger, Subscriptions
from agents_sdk.messaging.rpc import Handler, Requester, Responder
from agents_sdk.messaging.send import Sender, Sent
from agents_sdk.messaging.trust import MessageTrust

__all__ = [
    "Handler",
    "Inbox",
    "InboxConsumer",
    "Message",
    "MessageTrust",
    "Messenger",
    "Requester",
    "Responder",
    "Sender",
    "Sent",
    "Subscriptions",
    "decode_envelope",
    "encode_envelope",
    "envelope_wire",
    "error_body",
    "new_envelope",
    "reply_envelope",
]
