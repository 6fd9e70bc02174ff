"""Persistence of board entries (the board's KV stream ``KV_<bucket>``).

:func:`entry_handler` is the worker's :class:`StreamHandler` for the stream:
:func:`~blackboard.worker.decode.decode_entry` (pure) makes an
:class:`~blackboard.worker.decode.EntryRow` of each revision, and
:func:`write_entries` stores a batch of them (the revision history, the current
state, and the embedding queue).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

from blackboard.db import ingest_sql as q
from blackboard.db import pgcopy
from blackboard.protocol import codec, records
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.decode import EntryRow, RawMessage, decode_entry
from blackboard.worker.stream_handler import Conn, StreamHandler

__all__ = ["entry_handler", "entry_signed", "write_entries"]

_KV_OP = Header.KV_OPERATION.value
_MARKER = Header.MARKER_REASON.value
_SIG_KEY = Header.SIG_KEY.value


async def write_entries(conn: Conn, rows: Sequence[EntryRow]) -> None:
    """Store entry revisions, move current state forward, queue embeddings.

    Revisions are COPYed straight into their table; a batch that meets a
    revision already stored (a redelivery) is written again through the
    staging table, skipping what is there.
    """
    if not rows:
        return
    data = pgcopy.stream(_revision_row(r) for r in rows)
    try:
        async with conn.transaction():  # a savepoint inside the caller's transaction
            async with conn.cursor() as cur, cur.copy(q.COPY_REVISIONS) as copy:
                await copy.write(data)
    except psycopg.errors.UniqueViolation:
        await conn.execute(q.CREATE_STAGE_REVISIONS)
        async with conn.cursor() as cur:
            async with cur.copy(q.COPY_STAGE_REVISIONS) as copy:
                await copy.write(data)
            await cur.execute(q.MOVE_STAGED_REVISIONS)
    # The latest revision of each key, per stream (a batch comes from one
    # stream; a caller may mix several).
    latest: dict[tuple[str, str, str, str], EntryRow] = {}
    for r in rows:
        k = (r.stream, r.board, r.section, r.key)
        seen = latest.get(k)
        if seen is None or seen.seq < r.seq:
            latest[k] = r
    by_stream: dict[str, list[EntryRow]] = {}
    for r in latest.values():
        by_stream.setdefault(r.stream, []).append(r)
    for stream, top in by_stream.items():
        await conn.execute(q.UPSERT_CURRENT, {
            "stream": stream, "seqs": pgcopy.bigint_array_literal(r.seq for r in top),
            "texts": pgcopy.text_array_literal(r.search_text for r in top)})


def _revision_row(r: EntryRow) -> bytes:
    if r.op == "PUT":
        value = pgcopy.jsonb(r.value_json if r.value_json is not None else json.dumps(r.value))
    else:
        value = pgcopy.NULL
    meta = r.metadata_json if r.metadata_json is not None else json.dumps(r.metadata)
    return pgcopy.row((
        pgcopy.text(r.stream), pgcopy.bigint(r.seq), pgcopy.text(r.board), pgcopy.text(r.section),
        pgcopy.text(r.key), pgcopy.text(r.op), value, pgcopy.bytea(r.value_raw), pgcopy.text(r.content_type),
        pgcopy.text_array(r.tags), pgcopy.jsonb(meta), pgcopy.text(r.author),
        pgcopy.timestamptz(r.created_at), pgcopy.timestamptz(r.stored_at), pgcopy.timestamptz(r.expires_at),
        pgcopy.text(r.verdict),
    ))


def _canonical(msg: RawMessage) -> bytes:
    """The canonical bytes of the entry a message holds (the verifier's fallback for a
    payload that is not them, e.g. JSON)."""
    obj = codec.decode(msg.data, codec.encoding_of(msg.headers, msg.data))
    return records.decode_entry_envelope(obj).canonical_bytes()


def entry_signed(msg: RawMessage, row: EntryRow) -> Signed | None:
    """What the signature of an entry revision must prove: a value written by its ``author``;
    a delete or purge (a tombstone, no record) by whoever signed it. None for a delete
    marker the server wrote (a key's TTL or the stream's age limit: no identity signs it)."""
    if row.op == "PUT":
        return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, row.author, lambda: _canonical(msg))
    headers = msg.headers
    if _MARKER in headers and not headers.get(_KV_OP) and _SIG_KEY not in headers:
        return None
    return Signed(msg.subject, headers, msg.data, msg.timestamp)


def entry_handler(settings: Settings) -> StreamHandler:
    """The worker's handler of the board's KV stream (durable ``<worker>-entries``)."""
    subjects = Subjects(settings.board.bucket)
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size
    chars = settings.worker.max_index_chars

    def decode(msg: RawMessage) -> EntryRow:
        return decode_entry(msg, subjects, max_bytes=max_bytes, index_chars=chars)

    return StreamHandler("entries", subjects.kv_stream, subjects.entry_filter(), decode, write_entries,
                         embeds=True, concurrent_writes=True, signed=entry_signed)
