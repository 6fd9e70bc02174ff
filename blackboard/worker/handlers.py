"""What the worker consumes: one handler per stream (decode, then write).

The table of handlers is the extension point: a stream is added by appending a
:class:`StreamHandler` in :func:`default_handlers` with a pure decoder (raising
``InvalidPayloadError`` for dead letters) and a writer that stores a batch of
decoded rows inside the transaction it is given (idempotent on the stream
sequence: ``ON CONFLICT DO NOTHING`` or forward-only upserts).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from blackboard.db import ingest_sql as q
from blackboard.db import pgcopy
from blackboard.db.spaces import Space
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import (
    EntryRow,
    ForgetRow,
    MemoryRow,
    RawMessage,
    decode_entry,
    decode_memory,
)

__all__ = ["Conn", "StreamHandler", "default_handlers", "write_entries", "write_memories"]

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class StreamHandler:
    """How one stream is persisted.

    Attributes:
        name: consumer suffix (the durable is ``<worker.name>-<name>``).
        stream: JetStream stream name.
        filter_subject: subjects of the stream to consume.
        decode: pure decoder; raises ``InvalidPayloadError`` for a dead letter.
        write: stores decoded rows in the caller's transaction.
        embeds: the writer queues items for embedding (wakes the embedder).
        concurrent_writes: batches may be written by concurrent transactions
            (the writer converges whatever order they commit in); otherwise
            one batch at a time.
    """

    name: str
    stream: str
    filter_subject: str
    decode: Callable[[RawMessage], Any]
    write: Callable[[Conn, Sequence[Any]], Awaitable[None]]
    embeds: bool = False
    concurrent_writes: bool = False


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
    ))


async def write_memories(conn: Conn, rows: Sequence[MemoryRow | ForgetRow]) -> None:
    """Store (or replace, by id, forward only) memories and queue their embeddings; apply forgets.

    A forget deletes the stored versions older than itself and leaves a
    tombstone, so an older copy arriving later is not stored again. A batch
    with forgets first locks out concurrent memory writers (see
    ``LOCK_MEMORIES_FOR_FORGET``), so a memory and its forget committed at the
    same time by two batches cannot miss each other.
    """
    forgets = [r for r in rows if isinstance(r, ForgetRow)]
    if forgets:
        await conn.execute(q.LOCK_MEMORIES_FOR_FORGET)
        async with conn.cursor() as cur:
            await cur.executemany(q.UPSERT_FORGET, [(i, f.board, f.stream, f.seq) for f in forgets for i in f.ids])
    memories = [r for r in rows if isinstance(r, MemoryRow)]
    if memories:
        await _write_memory_rows(conn, memories)
    if forgets:
        ids = sorted({i for f in forgets for i in f.ids})
        cur = await conn.execute(q.DELETE_FORGOTTEN, (ids,))
        mids = [int(r[0]) for r in await cur.fetchall()]
        if mids:
            await _delete_vectors(conn, mids)


async def _delete_vectors(conn: Conn, mids: list[int]) -> None:
    cur = await conn.execute(q.SPACES)
    for sid, model, dims in await cur.fetchall():
        space = Space(int(sid), str(model), int(dims))
        await conn.execute(sql.SQL("DELETE FROM {} WHERE item = ANY(%s)").format(space.table("memory")), (mids,))
    await conn.execute(q.UNQUEUE_MEMORIES, (mids,))


def _memory_row(r: MemoryRow) -> bytes:
    meta = r.metadata_json if r.metadata_json is not None else json.dumps(r.metadata)
    return pgcopy.row((
        pgcopy.text(r.stream), pgcopy.bigint(r.seq), pgcopy.text(r.id), pgcopy.text(r.board),
        pgcopy.text(r.agent), pgcopy.text(r.kind), pgcopy.text(r.text), pgcopy.text_array(r.tags),
        pgcopy.jsonb(meta), pgcopy.float4(r.importance), pgcopy.text(r.source), pgcopy.boolean(r.read_only),
        pgcopy.timestamptz(r.created_at), pgcopy.text(r.search_text),
    ))


async def _write_memory_rows(conn: Conn, rows: Sequence[MemoryRow]) -> None:
    await conn.execute(q.CREATE_STAGE_MEMORIES)
    async with conn.cursor() as cur:
        async with cur.copy(q.COPY_MEMORIES) as copy:
            await copy.write(pgcopy.stream(_memory_row(r) for r in rows))
        await cur.execute(q.MOVE_MEMORIES)


def default_handlers(settings: Settings) -> list[StreamHandler]:
    """The streams every worker persists: board entries (KV), memories and agent messages."""
    subjects = Subjects(settings.board.bucket)
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size
    chars = settings.worker.max_index_chars

    def entry(msg: RawMessage) -> EntryRow:
        return decode_entry(msg, subjects, max_bytes=max_bytes, index_chars=chars)

    def memory(msg: RawMessage) -> MemoryRow | ForgetRow:
        return decode_memory(msg, max_bytes=max_bytes, index_chars=chars)

    from blackboard.worker.messages import message_handler  # imports this module
    from blackboard.worker.votes import vote_handler  # imports this module

    return [
        StreamHandler("entries", subjects.kv_stream, subjects.entry_filter(), entry, write_entries, True, True),
        StreamHandler("memories", MEMORY_STREAM, Subjects.memory_all(), memory, write_memories, True, True),
        message_handler(settings),
        vote_handler(settings),
    ]
