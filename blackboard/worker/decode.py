"""Pure decoding of stream messages into rows (no IO).

Each decoder takes a :class:`RawMessage` and returns a row for its writer, or
raises :class:`~blackboard.protocol.errors.InvalidPayloadError` with the reason the
message goes to the dead-letter table. Records are read through their schemas and
the fast paths beside them (:mod:`blackboard.protocol.records`); this module adds
what is the worker's own: the rows for COPY, and what PostgreSQL can store. Text that PostgreSQL cannot store (NUL
characters, lone surrogates) and values JSON cannot carry (bytes, NaN,
non-string keys) are caught here, before they could fail a whole batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from blackboard.protocol import codec, records
from blackboard.protocol.codec import is_json_safe, is_storable_text
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import EntryEnvelope, MemoryForget, MemoryRecord, SourceRef
from blackboard.protocol.subjects import Header, KeyParts, Subjects, parse_ttl, validate_name
from blackboard.worker.dedup import content_hash
from blackboard.worker.embed_text import MAX_EMBED_CHARS, memory_embed_lines

__all__ = [
    "DeadLetter",
    "EntryRow",
    "ForgetRow",
    "MemoryRow",
    "RawMessage",
    "decode_entry",
    "decode_memory",
    "entry_search_text",
    "memory_search_text",
    "parse_ack_reply",
    "parse_ttl",
]

#: Metadata values longer than this are not copied into the keyword index.
_MAX_META_VALUE = 200
#: Deepest nesting stored as jsonb (deeper values are kept as msgpack).
_MAX_JSON_DEPTH = 200
_KV_OP = Header.KV_OPERATION.value
_ENCODING = Header.ENCODING.value
_MARKER = Header.MARKER_REASON.value
_TTL = Header.MSG_TTL.value
_SIG_KEY = Header.SIG_KEY.value
_SIG = Header.SIG.value
#: Longer ``Bb-Sig-Key`` / ``Bb-Sig`` values are not kept (``SourceRef``'s bound).
_MAX_SIG_CHARS = SourceRef.model_fields["sig"].metadata[0].max_length
#: Stream, stream sequence and exact server time of a JetStream message, from its
#: ack subject (the one parser lives in the protocol module; raises ``InvalidKeyError``,
#: a ``ValueError``, when the reply is not an ack subject).
parse_ack_reply = Subjects.parse_ack
_parse_memory_subject = Subjects.parse_memory


def _json_text(value: Any, floats: bool = True) -> bytes | None:
    """The JSON text (UTF-8) of ``value`` when it is certainly storable as ``jsonb`` unchanged, else None.

    A fast stand-in for :func:`is_json_safe` + ``json.dumps``, for values
    decoded by :func:`_unpack_strict` (valid UTF-8 strings; map keys are
    ``str`` or ``bytes``). ``floats=False`` promises the value holds no float
    (the msgpack payload has no float marker byte): then orjson encodes it,
    ~10x faster than ``json.dumps``; it refuses bytes, non-string keys and
    integers beyond 64 bits (None: the general path decides). With floats,
    ``json.dumps`` runs, because orjson writes NaN and infinities as ``null``
    where they must be refused. An escaped NUL and deep nesting are spotted
    in the text. None means "not sure": ask :func:`is_json_safe` (a literal
    ``\\u0000`` in a string also lands there).
    """
    if not floats:
        try:
            out = orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):
            return None
    else:
        try:
            text = json.dumps(value)  # the default encoder is cached: the fastest stdlib call
        except (TypeError, ValueError, RecursionError):
            return None
        if "NaN" in text or "Infinity" in text:  # NaN may also be a string: unsure
            return None
        out = text.encode()
    if b"\\u0000" in out:
        return None
    if len(out) > _MAX_JSON_DEPTH and out.count(b"[") + out.count(b"{") > _MAX_JSON_DEPTH:
        return None
    return out


def _has_float_marker(data: bytes) -> bool:
    """Whether a msgpack payload may hold a float (float 32/64 type bytes; other bytes can match too)."""
    return b"\xcb" in data or b"\xca" in data


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 µs more per row
class RawMessage:
    """One JetStream message as the worker received it."""

    stream: str
    seq: int
    subject: str
    headers: Mapping[str, str]
    data: bytes
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that could not be stored, and why."""

    stream: str
    seq: int
    subject: str
    reason: str
    data: bytes
    headers: Mapping[str, str]

    @classmethod
    def of(cls, msg: RawMessage, reason: str) -> DeadLetter:
        """The dead letter of ``msg``; its text fields made storable (a dead letter must never fail to insert)."""
        return cls(msg.stream, msg.seq, _storable(msg.subject), _storable(reason[:2000]), msg.data,
                   {_storable(k): _storable(v) for k, v in msg.headers.items()})


def _storable(text: str) -> str:
    """``text`` as PostgreSQL text and jsonb can hold it: NUL shown as ``\\0``, lone surrogates replaced."""
    text = str(text).replace("\x00", "\\0")
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 µs more per row
class EntryRow:
    """One revision of a board entry (a KV message)."""

    stream: str
    seq: int
    board: str
    section: str
    key: str
    op: str  # PUT, DEL or PURGE
    value: Any  # JSON-safe value (jsonb) or None
    value_raw: bytes | None  # msgpack of a value jsonb cannot hold
    content_type: str | None
    tags: list[str]
    metadata: dict[str, Any]
    author: str | None
    created_at: datetime | None
    stored_at: datetime
    search_text: str
    #: ``value`` / ``metadata`` as JSON text (UTF-8) when the decoder already made it.
    value_json: bytes | None = None
    metadata_json: bytes | None = None
    #: When a revision written with a TTL (``Nats-TTL``) expires: ``stored_at`` + TTL.
    expires_at: datetime | None = None
    #: The signature's verdict (``blackboard.protocol.signing.Verdict``), set by the ingest loop.
    verdict: str = "unsigned"


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 µs more per row
class MemoryRow:
    """One long-term memory (a memory-stream message)."""

    stream: str
    seq: int
    id: str
    board: str
    agent: str
    kind: str
    text: str
    tags: list[str]
    #: In the writer's key order (the record's ``metadata_order``, when it names one).
    metadata: dict[str, Any]
    importance: float
    source: str | None
    read_only: bool
    created_at: datetime
    search_text: str
    #: ``metadata`` as JSON text (UTF-8) when the decoder already made it.
    metadata_json: bytes | None = None
    #: The signature's verdict (``blackboard.protocol.signing.Verdict``), set by the ingest loop.
    verdict: str = "unsigned"
    #: The metadata lines embedded before the text, in the writer's key order
    #: (``embed_text.memory_embed_lines``); None: the embedder makes them from ``metadata``.
    embed_meta: str | None = None
    #: Version 2 of the record (docs/memory-lifecycle.md): the subject key, the event time, the
    #: writer's confidence, and the sources of a memory the worker derived (empty: none).
    key: str | None = None
    occurred_at: datetime | None = None
    confidence: float | None = None
    provenance: list[SourceRef] = field(default_factory=list)
    #: ``dedup.content_hash`` of the text (None only for rows built by hand).
    content_hash: bytes | None = None
    #: The message's ``Bb-Sig-Key`` and ``Bb-Sig`` headers, as ``source_ref`` reads them (the
    #: provenance of a merge keeps them).
    sig_key: str | None = None
    sig: str | None = None

    @property
    def valid_from(self) -> datetime:
        """When what the memory says became true: its event time, else its write time."""
        return self.occurred_at if self.occurred_at is not None else self.created_at


@dataclass(slots=True)
class ForgetRow:
    """A request to forget memories of a board by id (a memory-stream message)."""

    stream: str
    seq: int
    board: str
    ids: list[str]
    #: The signature's verdict (``blackboard.protocol.signing.Verdict``), set by the ingest loop.
    verdict: str = "unsigned"


def _check_text(value: str | None, what: str) -> None:
    if value is not None and not is_storable_text(value):
        raise InvalidPayloadError(f"{what} holds text PostgreSQL cannot store (NUL or invalid UTF-8)")


def _check_fields(tags: list[str], metadata: dict[str, Any], *texts: tuple[str | None, str]) -> None:
    for tag in tags:
        _check_text(tag, "a tag")
    if not is_json_safe(metadata):
        raise InvalidPayloadError("metadata is not storable as JSON (bytes, NaN, NUL or non-string keys)")
    for text, what in texts:
        _check_text(text, what)


def _strings(value: Any, out: list[str], budget: list[int], depth: int = 0) -> None:
    """Append the strings of ``value`` (keys, string leaves, numbers) in document order, within ``budget`` characters.

    Exact-type checks first (what msgpack and JSON decode to), ``isinstance``
    for anything else; string children of a container are taken inline.
    """
    if budget[0] <= 0 or depth > 50:
        return
    t = type(value)
    if t is str:
        out.append(value)
        budget[0] -= len(value)
    elif t is dict:
        inline = depth < 50
        for k, v in value.items():
            if type(k) is str or isinstance(k, str):
                out.append(k)
                budget[0] -= len(k)
            if inline and type(v) is str:
                if budget[0] > 0:
                    out.append(v)
                    budget[0] -= len(v)
            else:
                _strings(v, out, budget, depth + 1)
    elif t is list:
        for v in value:
            _strings(v, out, budget, depth + 1)
    elif t is int or t is float:
        out.append(str(value))
        budget[0] -= 8
    elif t is bool or value is None:
        return
    elif isinstance(value, str):
        out.append(value)
        budget[0] -= len(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                out.append(k)
                budget[0] -= len(k)
            _strings(v, out, budget, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            _strings(v, out, budget, depth + 1)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out.append(str(value))
        budget[0] -= 8


def _clean(text: str, limit: int) -> str:
    text = text[:limit]
    if not is_storable_text(text):
        text = text.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8")
    return text


def entry_search_text(value: Any, content_type: str | None, tags: list[str], limit: int) -> str:
    """The text of an entry that keyword and semantic search see.

    Strings (and object keys, numbers) of a JSON value in document order, text
    of a ``text/*`` binary value, then the tags; cut to ``limit`` characters.
    """
    parts: list[str] = []
    if isinstance(value, bytes | bytearray):
        if content_type and content_type.startswith("text/"):
            parts.append(bytes(value[: limit * 4]).decode("utf-8", "replace"))
    else:
        _strings(value, parts, [limit])
    parts.extend(tags)
    return _clean("\n".join(p for p in parts if p), limit)


def memory_search_text(text: str, tags: list[str], metadata: Mapping[str, Any], limit: int) -> str:
    """The text of a memory that keyword search sees: its text, tags and short metadata values."""
    parts = [text, *tags]
    for value in metadata.values():
        if isinstance(value, str) and 0 < len(value) <= _MAX_META_VALUE:
            parts.append(value)
    return _clean("\n".join(parts), limit)


def _unpack_strict(msg: RawMessage) -> Any:
    """The payload of a plain msgpack message with string map keys only, or None.

    The fast path of the decoders: msgpack's UTF-8 decoding is strict (no lone
    surrogates), ``str_keys`` leaves only ``str``/``bytes`` keys, and the codec's
    limits hold (depth, sizes: ``docs/protocol.md``, "Limits"). Any
    doubt (JSON encoding, other keys, undecodable bytes) returns None and the
    message takes the general path, which decides and explains.
    """
    headers = msg.headers
    if headers and _ENCODING in headers:
        return None
    data = msg.data
    if not data or data[0] in b"{ \t\r\n":  # JSON sniffing: see codec.encoding_of
        return None
    try:
        return codec.decode(data, str_keys=True)
    except InvalidPayloadError:  # anything the codec refuses goes the general way, which explains
        return None


def _tags_ok(tags: list[str]) -> bool:
    for tag in tags:
        if "\x00" in tag:
            return False
    return True


def _fast_entry_row(env: EntryEnvelope, msg: RawMessage, parts: KeyParts, index_chars: int) -> EntryRow | None:
    """The row of an envelope decoded by the fast path, when PostgreSQL can certainly store it unchanged.

    The payload came from :func:`_unpack_strict` (valid UTF-8 strings). None when
    unsure (NUL, values needing msgpack storage...): the general path decides and explains.
    """
    ctype, author, tags = env.content_type, env.author, env.tags
    if "\x00" in ctype or "\x00" in author or not _tags_ok(tags):
        return None
    floats = _has_float_marker(msg.data)
    meta_json = _json_text(env.metadata, floats)
    value_json = None if meta_json is None else _json_text(env.value, floats)
    if value_json is None:
        return None
    text = entry_search_text(env.value, ctype, tags, index_chars)
    return EntryRow(msg.stream, msg.seq, parts.board, parts.section, parts.key, "PUT", env.value, None,
                    ctype, tags, env.metadata, author, env.created_at, msg.timestamp, text, value_json, meta_json)


def _fast_memory_row(rec: MemoryRecord, msg: RawMessage, index_chars: int) -> MemoryRow | None:
    """The row of a record decoded by the fast path, when PostgreSQL can certainly store it unchanged
    (see :func:`_fast_entry_row`); None when unsure."""
    source = rec.source
    if ("\x00" in rec.id or "\x00" in rec.text or (source is not None and "\x00" in source)
            or not _tags_ok(rec.tags)):
        return None
    meta_json = _json_text(rec.metadata, _has_float_marker(msg.data))
    if meta_json is None:
        return None
    search = memory_search_text(rec.text, rec.tags, rec.metadata, index_chars)
    metadata = _writer_ordered(rec)
    row = MemoryRow(msg.stream, msg.seq, rec.id, rec.board, rec.agent, rec.kind, rec.text, rec.tags,
                    metadata, rec.importance, source, rec.read_only, rec.created_at, search, meta_json,
                    embed_meta=_clean(memory_embed_lines(metadata), MAX_EMBED_CHARS))
    return _lifecycle(row, rec, msg)


def _writer_ordered(rec: MemoryRecord) -> dict[str, Any]:
    """A memory's metadata in its writer's key order (``metadata_order``, which the canonical
    encoding's sorted map cannot keep), or as decoded when it names none."""
    order = rec.metadata_order
    return rec.metadata if order is None else {k: rec.metadata[k] for k in order}


def _lifecycle(row: MemoryRow, rec: MemoryRecord, msg: RawMessage) -> MemoryRow:
    """``row`` with the record's version-2 fields, its content hash and the message's signature."""
    row.key, row.occurred_at, row.confidence = rec.key, rec.occurred_at, rec.confidence
    if rec.provenance:
        row.provenance = list(rec.provenance)
    row.content_hash = content_hash(rec.text)
    headers = msg.headers
    if headers:
        key, sig = headers.get(_SIG_KEY), headers.get(_SIG)
        # as protocol.schemas.provenance.source_ref reads them (tests/worker/test_decode_lifecycle.py)
        row.sig_key = key if key and len(key) <= _MAX_SIG_CHARS else None
        row.sig = sig if sig and len(sig) <= _MAX_SIG_CHARS else None
    return row


def _payload(msg: RawMessage, max_bytes: int) -> Any:
    if len(msg.data) > max_bytes:
        raise InvalidPayloadError(f"oversized: {len(msg.data)} bytes > limit {max_bytes}")
    return codec.decode(msg.data, codec.encoding_of(msg.headers, msg.data))


def decode_entry(msg: RawMessage, subjects: Subjects, *, max_bytes: int, index_chars: int) -> EntryRow:
    """Decode one KV message into an entry revision.

    Raises:
        InvalidPayloadError: bad subject, undecodable or invalid payload.
    """
    try:
        parts = subjects.parse_entry(msg.subject)
        validate_name(parts.board, "board")
        validate_name(parts.section, "section")
    except InvalidKeyError as exc:
        raise InvalidPayloadError(f"bad entry subject: {exc.reason}") from exc
    _check_text(parts.key, "the key")
    op = (msg.headers.get(_KV_OP) or "").upper() if msg.headers else ""
    if not op and msg.headers and _MARKER in msg.headers:  # the server removed the key (TTL / max age)
        op = "PURGE"
    if op in ("DEL", "PURGE"):
        return EntryRow(msg.stream, msg.seq, parts.board, parts.section, parts.key, op, None, None,
                        None, [], {}, None, None, msg.timestamp, "")
    ttl = msg.headers.get(_TTL) if msg.headers else None
    row = None
    if len(msg.data) <= max_bytes:
        fast = records.fast_entry(_unpack_strict(msg))
        if fast is not None:
            row = _fast_entry_row(fast, msg, parts, index_chars)
    if row is None:
        env = records.decode_entry_envelope(_payload(msg, max_bytes))
        _check_fields(env.tags, env.metadata, (env.author, "author"), (env.content_type, "content_type"))
        if is_json_safe(env.value):
            value, raw = env.value, None
        else:
            value, raw = None, codec.encode(env.value)
        text = entry_search_text(env.value, env.content_type, env.tags, index_chars)
        row = EntryRow(msg.stream, msg.seq, parts.board, parts.section, parts.key, "PUT", value, raw,
                       env.content_type, list(env.tags), dict(env.metadata), env.author, env.created_at,
                       msg.timestamp, text)
    if ttl is not None:
        seconds = parse_ttl(ttl)
        if seconds is not None:
            row.expires_at = msg.timestamp + timedelta(seconds=seconds)
    return row


def decode_memory(msg: RawMessage, *, max_bytes: int, index_chars: int) -> MemoryRow | ForgetRow:
    """Decode one memory-stream message.

    The board and agent of the record must match its subject
    (``bb.mem.<board>.<agent>``), so subject permissions bind the writer.

    Raises:
        InvalidPayloadError: undecodable, invalid, or not matching its subject.
    """
    try:
        board, agent = _parse_memory_subject(msg.subject)
    except InvalidKeyError as exc:
        raise InvalidPayloadError(f"bad memory subject {msg.subject!r}") from exc
    if len(msg.data) <= max_bytes:
        fast = records.fast_memory(_unpack_strict(msg))
        if fast is not None and fast.board == board and fast.agent == agent:
            row = _fast_memory_row(fast, msg, index_chars)
            if row is not None:
                return row
    decoded = records.decode_memory(_payload(msg, max_bytes))
    if isinstance(decoded, MemoryForget):
        forget = decoded
        if forget.board != board or forget.agent != agent:
            raise InvalidPayloadError(
                f"forget board/agent {forget.board!r}/{forget.agent!r} do not match subject {msg.subject!r}")
        for mid in forget.ids:
            _check_text(mid, "an id")
        return ForgetRow(msg.stream, msg.seq, forget.board, list(forget.ids))
    rec = decoded
    if rec.board != board or rec.agent != agent:
        raise InvalidPayloadError(
            f"record board/agent {rec.board!r}/{rec.agent!r} do not match subject {msg.subject!r}")
    _check_fields(rec.tags, rec.metadata, (rec.id, "id"), (rec.text, "text"), (rec.source, "source"),
                  (rec.key, "the subject key"))
    search = memory_search_text(rec.text, rec.tags, rec.metadata, index_chars)
    metadata = dict(_writer_ordered(rec))
    row = MemoryRow(msg.stream, msg.seq, rec.id, rec.board, rec.agent, rec.kind, rec.text,
                    list(rec.tags), metadata, rec.importance, rec.source, rec.read_only,
                    rec.created_at, search, embed_meta=_clean(memory_embed_lines(metadata), MAX_EMBED_CHARS))
    return _lifecycle(row, rec, msg)
