"""Persistence of agent messages (stream ``BB_MSG``).

:func:`message_handler` is the worker's :class:`StreamHandler` for the stream:
:func:`decode_message` (pure) validates the envelope and binds it to its
subject, :func:`write_messages` stores a batch idempotently (one row per
stream message: a direct message to three agents is three rows with one id).
Message search (``bb.search.<principal>.messages``) is :mod:`blackboard.search.messages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from blackboard.db import messages_sql as q
from blackboard.protocol import codec
from blackboard.protocol.codec import is_json_safe
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import MessageEnvelope, validate_wire
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.decode import RawMessage, entry_search_text
from blackboard.worker.stream_handler import Conn, StreamHandler

__all__ = [
    "MessageRow",
    "decode_message",
    "message_handler",
    "message_search_text",
    "message_signed",
    "write_messages",
]


@dataclass(slots=True)  # not frozen: the ingest loop sets the verdict
class MessageRow:
    """One stored message (one stream message of ``BB_MSG``)."""

    stream: str
    seq: int
    id: str
    sender: str
    recipients: list[str]
    kind: str
    board: str | None
    topic: str | None
    type: str
    body: Any  # JSON-safe body (jsonb) or None
    body_raw: bytes | None  # msgpack of a body jsonb cannot hold
    correlation_id: str | None
    reply_to: str | None
    metadata: dict[str, Any]
    subject: str
    created_at: datetime
    stored_at: datetime
    search_text: str
    #: The signature's verdict (``blackboard.protocol.signing.Verdict``), set by the ingest loop.
    verdict: str = "unsigned"


def message_search_text(env: MessageEnvelope, limit: int) -> str:
    """What keyword search sees of a message: the strings of its body, then its type and topic."""
    return entry_search_text(env.body, None, [env.type, *([env.topic] if env.topic else [])], limit)


def _check_subject(env: MessageEnvelope, subject: str) -> None:
    """The envelope must be addressed where it was published (subject permissions bind senders)."""
    try:
        if env.kind == "direct":
            ok = any(subject == Subjects.direct(r) for r in env.recipients)
        elif env.kind == "broadcast":
            ok = env.board is not None and subject == Subjects.broadcast(env.board)
        else:
            ok = env.topic is not None and subject == Subjects.topic(env.topic, pattern=False)
    except InvalidKeyError as exc:
        raise InvalidPayloadError(f"message fields do not form a subject: {exc.reason}") from exc
    if not ok:
        raise InvalidPayloadError(f"a {env.kind} message does not belong on {subject!r}")


def decode_message(msg: RawMessage, *, max_bytes: int, index_chars: int) -> MessageRow:
    """Decode one ``BB_MSG`` message into a row.

    Raises:
        InvalidPayloadError: oversized, undecodable, invalid envelope, text
            PostgreSQL cannot store, or an envelope that does not match its subject.
    """
    if len(msg.data) > max_bytes:
        raise InvalidPayloadError(f"oversized: {len(msg.data)} bytes > limit {max_bytes}")
    env = validate_wire(MessageEnvelope, codec.decode(msg.data, codec.encoding_of(msg.headers)))
    _check_subject(env, msg.subject)
    texts = [env.id, env.type, env.correlation_id, env.reply_to]
    if not all(is_json_safe(t) for t in texts) or not is_json_safe(env.metadata):
        raise InvalidPayloadError("message fields hold values PostgreSQL cannot store (NUL, bytes, NaN)")
    body, raw = (env.body, None) if is_json_safe(env.body) else (None, codec.encode(env.body))
    return MessageRow(msg.stream, msg.seq, env.id, env.sender, list(env.recipients), env.kind, env.board,
                      env.topic, env.type, body, raw, env.correlation_id, env.reply_to, dict(env.metadata),
                      msg.subject, env.created_at, msg.timestamp, message_search_text(env, index_chars))


async def write_messages(conn: Conn, rows: Sequence[MessageRow]) -> None:
    """Store messages in the caller's transaction (idempotent on (stream, seq))."""
    await conn.execute(q.CREATE_STAGE_MESSAGES)
    await conn.execute(q.TRUNCATE_STAGE_MESSAGES)
    async with conn.cursor() as cur, cur.copy(q.COPY_MESSAGES) as copy:
        for r in rows:
            await copy.write_row((
                r.stream, r.seq, r.id, r.sender, r.recipients, r.kind, r.board, r.topic, r.type,
                None if r.body_raw is not None else Jsonb(r.body), r.body_raw, r.correlation_id, r.reply_to,
                Jsonb(r.metadata), r.subject, r.created_at, r.stored_at, r.search_text, r.verdict,
            ))
    await conn.execute(q.MOVE_MESSAGES)


def _canonical(msg: RawMessage) -> bytes:
    """The canonical bytes of the envelope a message holds (the verifier's fallback)."""
    return validate_wire(MessageEnvelope, codec.decode(msg.data, codec.encoding_of(msg.headers))).canonical_bytes()


def message_signed(msg: RawMessage, row: MessageRow) -> Signed:
    """What the signature of a message must prove: written by its ``sender``."""
    return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, row.sender, lambda: _canonical(msg))


def message_handler(settings: Settings) -> StreamHandler:
    """The worker's handler of ``BB_MSG`` (durable ``<worker>-messages``)."""
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size
    chars = settings.worker.max_index_chars

    def decode(msg: RawMessage) -> MessageRow:
        return decode_message(msg, max_bytes=max_bytes, index_chars=chars)

    return StreamHandler("messages", MESSAGE_STREAM, Subjects.messages_all(), decode, write_messages,
                         signed=message_signed)

