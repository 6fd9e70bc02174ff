"""User-facing board types: an entry (one revision of a key) and a change seen by a watch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, LimitExceededError
from blackboard.protocol.records import decode_entry_envelope, entry_wire
from blackboard.protocol.subjects import Header, KeyParts

__all__ = [
    "Change",
    "Entry",
    "Operation",
    "decode_entry",
    "default_content_type",
    "encode_entry",
    "parse_server_time",
]


class Operation(StrEnum):
    PUT = "put"
    DELETE = "delete"
    PURGE = "purge"


@dataclass(frozen=True, slots=True)
class Entry:
    """One revision of a board key.

    ``revision`` is the JetStream stream sequence: unique and increasing across
    the whole bucket, so it orders writes to different keys too.

    Entries are shared between the watches and views of one agent (each
    revision is decoded once): treat ``value`` and ``metadata`` as read-only.
    """

    board: str
    section: str
    key: str
    revision: int
    value: Any = None
    content_type: str = "application/json"
    author: str = ""
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Writer's clock (from the envelope).
    created_at: datetime | None = None
    #: Server's clock: when JetStream stored the revision.
    stored_at: datetime | None = None
    operation: Operation = Operation.PUT

    @property
    def deleted(self) -> bool:
        return self.operation is not Operation.PUT


@dataclass(frozen=True, slots=True)
class Change:
    """A change delivered by a watch: the entry, its revision and the operation."""

    entry: Entry
    #: Messages still to be delivered to this watch when this one was sent;
    #: 0 means the watch has caught up.
    pending: int = 0

    @property
    def operation(self) -> Operation:
        return self.entry.operation

    @property
    def revision(self) -> int:
        return self.entry.revision


def default_content_type(value: Any) -> str:
    """``text/plain`` for str, ``application/octet-stream`` for bytes, else ``application/json``."""
    if isinstance(value, str):
        return "text/plain"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "application/octet-stream"
    return "application/json"


def encode_entry(
    value: Any,
    *,
    author: str,
    content_type: str | None = None,
    tags: tuple[str, ...] | list[str] = (),
    metadata: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
    encoding: codec.Encoding = "msgpack",
) -> bytes:
    """Encode an :class:`~blackboard.protocol.schemas.EntryEnvelope` (pure), through the
    envelope's fast encoder :func:`~blackboard.protocol.records.entry_wire`.

    Raises:
        InvalidPayloadError: the value cannot be carried by the encoding, or a
            field the schema refuses.
    """
    if content_type is None:
        content_type = default_content_type(value)
    if encoding == "json" and isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidPayloadError("bytes values need the msgpack encoding")
    envelope = entry_wire(bytes(value) if isinstance(value, (bytearray, memoryview)) else value,
                          author=author, content_type=content_type, tags=tags, metadata=metadata,
                          created_at=created_at)
    return codec.encode(envelope, encoding)


def parse_server_time(value: str | None) -> datetime | None:
    """Parse JetStream's RFC 3339 timestamp (nanosecond precision) to a datetime."""
    if not value:
        return None
    try:  # the server's form (Python 3.11+ truncates the nanoseconds itself): ~0.2 µs
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is not None:
            return parsed.astimezone(UTC) if parsed.utcoffset() else parsed.replace(tzinfo=UTC)
    except ValueError:
        pass
    try:
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1]
        if "." in text:
            head, frac = text.split(".", 1)
            digits = "".join(ch for ch in frac if ch.isdigit())[:6]
            text = f"{head}.{digits}"
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


def _operation(headers: Mapping[str, str] | None) -> Operation:
    if headers:
        op = headers.get(Header.KV_OPERATION.value)
        if op == "DEL":
            return Operation.DELETE
        if op == "PURGE" or Header.MARKER_REASON.value in headers:  # the server's expiry marker
            return Operation.PURGE
    return Operation.PUT


def decode_entry(
    parts: KeyParts,
    revision: int,
    data: bytes | None,
    headers: Mapping[str, str] | None,
    stored_at: datetime | None = None,
) -> Entry:
    """Build an :class:`Entry` from a stored KV message (through the envelope's schema:
    :func:`~blackboard.protocol.records.decode_entry_envelope`).

    Raises:
        LimitExceededError: the payload goes beyond a protocol limit.
        InvalidPayloadError: the payload is not a valid entry envelope.
    """
    op = _operation(headers)
    if op is not Operation.PUT or not data:
        return Entry(parts.board, parts.section, parts.key, revision, operation=op, stored_at=stored_at)
    try:
        env = decode_entry_envelope(codec.decode(data, codec.encoding_of(headers, data)))
    except LimitExceededError as exc:
        raise LimitExceededError(exc.limit, f"entry {parts.board}.{parts.section}.{parts.key}@{revision}: "
                                 f"{exc.reason}") from exc
    except InvalidPayloadError as exc:
        raise InvalidPayloadError(f"entry {parts.board}.{parts.section}.{parts.key}@{revision}: {exc.reason}") from exc
    return Entry(
        board=parts.board,
        section=parts.section,
        key=parts.key,
        revision=revision,
        value=env.value,
        content_type=env.content_type,
        author=env.author,
        tags=tuple(env.tags),
        metadata=env.metadata,
        created_at=env.created_at,
        stored_at=stored_at,
        operation=Operation.PUT,
    )
