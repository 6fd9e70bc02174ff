"""Message envelopes: build, encode and decode the ``MessageEnvelope`` of every message.

Pure: no IO. Every message the SDK sends (direct, broadcast, topic, request,
reply) is built by :func:`new_envelope` and encoded by :func:`envelope_wire`
(its canonical encoding, what its signature covers, and the payload);
every message it receives is decoded by :func:`decode_envelope`. The schema is
:class:`~blackboard.protocol.schemas.MessageEnvelope` (msgpack, or JSON with
``Bb-Encoding: json``); see docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agents_sdk._args import mapping_arg, name_list
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import MessageEnvelope, MessageKind, validate_wire
from blackboard.protocol.subjects import validate_name

__all__ = ["decode_envelope", "encode_envelope", "envelope_wire", "error_body", "new_envelope", "reply_envelope"]


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
    names = name_list(recipients, "recipients")
    for name in (sender, *names):
        validate_name(name, "agent id")
    if board is not None:
        validate_name(board, "board")
    if not isinstance(type, str) or not type:
        raise InvalidPayloadError("a message type must be a non-empty string")
    try:
        return MessageEnvelope(id=id, sender=sender, kind=kind, recipients=names, board=board,
                               topic=topic, type=type, body=body, correlation_id=correlation_id,
                               reply_to=reply_to, created_at=created_at or datetime.now(UTC),
                               metadata=mapping_arg(metadata, "metadata"))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidPayloadError(f"invalid message: {exc}") from exc


def encode_envelope(env: MessageEnvelope, encoding: codec.Encoding = "msgpack") -> bytes:
    """The wire bytes of an envelope: its canonical encoding in msgpack (every field, in the
    schema's order), or JSON (fields that are None left out).

    Raises:
        InvalidPayloadError: the body has no canonical encoding, or the encoding cannot carry
            it (bytes in JSON...).
    """
    return envelope_wire(env, encoding)[0]


def envelope_wire(env: MessageEnvelope, encoding: codec.Encoding = "msgpack") -> tuple[bytes, bytes]:
    """``(payload, record)`` of an envelope: the payload to publish, and its canonical
    bytes (what a signature covers). For msgpack they are the same bytes; for ``json`` the
    payload is the JSON text (a reader re-encodes what it decodes to check the signature).

    Raises:
        InvalidPayloadError: as :func:`encode_envelope`.
    """
    record = env.canonical_bytes()
    if encoding == "msgpack":
        return record, record
    return codec.encode(env.model_dump(exclude_none=True), encoding), record


def decode_envelope(data: bytes, headers: Mapping[str, str] | None) -> MessageEnvelope:
    """Decode a message payload (msgpack, or JSON with ``Bb-Encoding: json``).

    Raises:
        InvalidPayloadError: undecodable, or not a valid ``MessageEnvelope``.
    """
    return validate_wire(MessageEnvelope, codec.decode(data, codec.encoding_of(headers)))


def reply_envelope(request: MessageEnvelope, *, id: str, sender: str, body: Any) -> MessageEnvelope:
    """The reply to ``request``: a direct message back to its sender, correlated by the request id."""
    return new_envelope(id=id, sender=sender, kind="direct", recipients=[request.sender], type=request.type,
                        body=body, board=request.board, correlation_id=request.id)


def error_body(error: str, message: str) -> dict[str, str]:
    """The body of an error reply (sent with the ``Bb-Error: <error>`` header)."""
    return {"error": error, "message": message}
