"""User-facing board types: an entry (one revision of a key) and a change seen by a watch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from blackboard.protocol import codec
from blackboard.protocol.canonical import canonical_bytes, canonical_timestamp
from blackboard.protocol.errors import InvalidPayloadError, LimitExceededError
from blackboard.protocol.records import canonical_entry, decode_entry_envelope, entry_wire
from blackboard.protocol.schemas import EntryEnvelope, validate_wire
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, KeyParts

__all__ = [
    "Change",
    "Entry",
    "Operation",
    "decode_entry",
    "default_content_type",
    "encode_entry",
    "encode_entry_record",
    "entry_operation",
    "entry_record_bytes",
    "make_entry",
    "parse_server_time",
    "read_envelope",
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

    ``verdict`` is what the reader concluded about the revision's signature
    (:class:`~blackboard.protocol.signing.Verdict`): ``verified``, or why not;
    ``unsigned`` when the reader does not verify (``security.verify`` off, an
    open bus). Only ``settings.security.unverified = "flag"`` lets a reader see
    an entry whose verdict is not ``verified``.
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
    #: The signature's verdict (``unsigned`` when the reader does not verify).
    verdict: Verdict = Verdict.UNSIGNED

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


def encode_entry_record(
    value: Any,
    *,
    author: str,
    content_type: str | None = None,
    tags: tuple[str, ...] | list[str] = (),
    metadata: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
    encoding: codec.Encoding = "msgpack",
) -> tuple[bytes, bytes]:
    """Encode an :class:`~blackboard.protocol.schemas.EntryEnvelope` (pure): the payload to
    publish and the record's canonical encoding (what its signature covers).

    With msgpack the payload *is* the canonical encoding (one byte string); with
    JSON it is the JSON text of the same record. The envelope is laid out by
    :func:`~blackboard.protocol.records.entry_wire` and encoded by
    :func:`~blackboard.protocol.records.canonical_entry`; a value that fast path
    does not vouch for is encoded, decoded and validated as a reader would, and
    its canonical bytes computed by :mod:`blackboard.protocol.canonical`.

    Raises:
        InvalidPayloadError: the value cannot be carried by the encoding (or has no
            canonical encoding), or a field the schema refuses.
        LimitExceededError: beyond a protocol limit.
    """
    if content_type is None:
        content_type = default_content_type(value)
    if encoding == "json" and isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidPayloadError("bytes values need the msgpack encoding")
    envelope = entry_wire(bytes(value) if isinstance(value, (bytearray, memoryview)) else value,
                          author=author, content_type=content_type, tags=tags, metadata=metadata,
                          created_at=created_at)
    canonical = canonical_entry(envelope)
    if canonical is None:  # an unusual value: what a reader makes of it, canonically
        payload = codec.encode(envelope, encoding)
        canonical = canonical_bytes(validate_wire(EntryEnvelope, codec.decode(payload, encoding)))
        return (canonical if encoding == "msgpack" else payload), canonical
    if encoding == "msgpack":
        return canonical, canonical
    return codec.encode(envelope, encoding), canonical


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
    """The payload of an entry (pure): its canonical encoding with msgpack, JSON text with
    ``encoding="json"`` (see :func:`encode_entry_record`).

    Raises:
        InvalidPayloadError: the value cannot be carried by the encoding, or a
            field the schema refuses.
    """
    return encode_entry_record(value, author=author, content_type=content_type, tags=tags, metadata=metadata,
                               created_at=created_at, encoding=encoding)[0]


def entry_record_bytes(env: EntryEnvelope) -> bytes:
    """The canonical encoding of a decoded envelope (a reader's, to check a signature over a
    payload that is not canonical, e.g. JSON): the fast path, else the reference encoder.

    Raises:
        InvalidPayloadError: the record has no canonical encoding.
    """
    wire = {"v": env.v, "value": env.value, "content_type": env.content_type, "tags": env.tags,
            "metadata": env.metadata, "author": env.author, "created_at": canonical_timestamp(env.created_at)}
    try:
        fast = canonical_entry(wire)
    except InvalidPayloadError:
        fast = None
    return fast if fast is not None else canonical_bytes(env)


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


def entry_operation(headers: Mapping[str, str] | None) -> Operation:
    """The operation of a stored KV message: a put, or a delete / purge marker (its
    ``KV-Operation`` header, or the server's expiry marker)."""
    if headers:
        op = headers.get(Header.KV_OPERATION.value)
        if op == "DEL":
            return Operation.DELETE
        if op == "PURGE" or Header.MARKER_REASON.value in headers:  # the server's expiry marker
            return Operation.PURGE
    return Operation.PUT


def read_envelope(parts: KeyParts, revision: int, data: bytes | None,
                  headers: Mapping[str, str] | None) -> tuple[Operation, EntryEnvelope | None]:
    """The operation of a stored KV message and, for a put with a payload, its envelope.

    Raises:
        LimitExceededError: the payload goes beyond a protocol limit.
        InvalidPayloadError: the payload is not a valid entry envelope.
    """
    op = entry_operation(headers)
    if op is not Operation.PUT or not data:
        return op, None
    try:
        return op, decode_entry_envelope(codec.decode(data, codec.encoding_of(headers, data)))
    except LimitExceededError as exc:
        raise LimitExceededError(exc.limit, f"entry {parts.board}.{parts.section}.{parts.key}@{revision}: "
                                 f"{exc.reason}") from exc
    except InvalidPayloadError as exc:
        raise InvalidPayloadError(f"entry {parts.board}.{parts.section}.{parts.key}@{revision}: {exc.reason}") from exc


def make_entry(parts: KeyParts, revision: int, op: Operation, env: EntryEnvelope | None,
               stored_at: datetime | None, verdict: Verdict = Verdict.UNSIGNED) -> Entry:
    """The :class:`Entry` of a stored KV message read by :func:`read_envelope`."""
    if env is None:
        return Entry(parts.board, parts.section, parts.key, revision, operation=op, stored_at=stored_at,
                     verdict=verdict)
    return Entry(parts.board, parts.section, parts.key, revision, env.value, env.content_type, env.author,
                 tuple(env.tags), env.metadata, env.created_at, stored_at, op, verdict)


def decode_entry(
    parts: KeyParts,
    revision: int,
    data: bytes | None,
    headers: Mapping[str, str] | None,
    stored_at: datetime | None = None,
) -> Entry:
    """Build an :class:`Entry` from a stored KV message (through the envelope's schema:
    :func:`~blackboard.protocol.records.decode_entry_envelope`), its signature not checked
    (``verdict`` ``unsigned``; the board store verifies).

    Raises:
        LimitExceededError: the payload goes beyond a protocol limit.
        InvalidPayloadError: the payload is not a valid entry envelope.
    """
    op, env = read_envelope(parts, revision, data, headers)
    return make_entry(parts, revision, op, env, stored_at)
