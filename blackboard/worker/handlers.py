"""What the worker consumes: one handler per stream (decode, then write).

The table of handlers is the extension point: a stream is added by appending a
:class:`StreamHandler` in :func:`default_handlers` with a pure decoder (raising
``InvalidPayloadError`` for dead letters) and a writer that stores a batch of
decoded rows inside the transaction it is given (idempotent on the stream
sequence: ``ON CONFLICT DO NOTHING`` or forward-only upserts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from blackboard.db import ingest_sql as q
from blackboard.db.spaces import Space
from blackboard.settings import Settings
from blackboard.subjects import MEMORY_STREAM, Subjects
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
    """

    name: str
    stream: str
    filter_subject: str
    decode: Callable[[RawMessage], Any]
    write: Callable[[Conn, Sequence[Any]], Awaitable[None]]
    embeds: bool = False


async def write_entries(conn: Conn, rows: Sequence[EntryRow]) -> None:
    """Store entry revisions, move current state forward, queue embeddings."""
    await conn.execute(q.CREATE_STAGE_ENTRIES)
    await conn.execute(q.TRUNCATE_STAGE_ENTRIES)
    async with conn.cursor() as cur, cur.copy(q.COPY_ENTRIES) as copy:
        for r in rows:
            await copy.write_row((
                r.stream, r.seq, r.board, r.section, r.key, r.op,
                None if r.op != "PUT" else Jsonb(r.value), r.value_raw, r.content_type,
                r.tags, Jsonb(r.metadata), r.author, r.created_at, r.stored_at, r.search_text,
            ))
    await conn.execute(q.MOVE_ENTRY_REVISIONS)
    await conn.execute(q.MOVE_ENTRIES_CURRENT)


async def write_memories(conn: Conn, rows: Sequence[MemoryRow | ForgetRow]) -> None:
    """Store (or replace, by id, forward only) memories and queue their embeddings; apply forgets.

    A forget deletes the stored versions older than itself and leaves a
    tombstone, so an older copy arriving later is not stored again.
    """
    forgets = [r for r in rows if isinstance(r, ForgetRow)]
    if forgets:
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


async def _write_memory_rows(conn: Conn, rows: Sequence[MemoryRow]) -> None:
    await conn.execute(q.CREATE_STAGE_MEMORIES)
    await conn.execute(q.TRUNCATE_STAGE_MEMORIES)
    async with conn.cursor() as cur, cur.copy(q.COPY_MEMORIES) as copy:
        for r in rows:
            await copy.write_row((
                r.stream, r.seq, r.id, r.board, r.agent, r.kind, r.text, r.tags, Jsonb(r.metadata),
                r.importance, r.source, r.read_only, r.created_at, r.search_text,
            ))
    await conn.execute(q.MOVE_MEMORIES)


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
    from blackboard.worker.voting import vote_handler  # imports this module

    return [
        StreamHandler("entries", subjects.kv_stream, subjects.entry_filter(), entry, write_entries, True),
        StreamHandler("memories", MEMORY_STREAM, Subjects.memory_all(), memory, write_memories, True),
        message_handler(settings),
        vote_handler(settings),
    ]
