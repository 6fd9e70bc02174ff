"""Persistence of long-term memories (stream ``BB_MEM``).

:func:`memory_handler` is the worker's :class:`StreamHandler` for the stream:
:func:`~blackboard.worker.decode.decode_memory` (pure) makes a
:class:`~blackboard.worker.decode.MemoryRow` of each memory (or a
:class:`~blackboard.worker.decode.ForgetRow` of each forget), and
:func:`write_memories` stores a batch of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from psycopg import sql

from blackboard.db import ingest_sql as q
from blackboard.db import memory_sql as dq
from blackboard.db import pgcopy
from blackboard.db.spaces import Space
from blackboard.protocol import codec, records
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.decode import ForgetRow, MemoryRow, RawMessage, decode_memory
from blackboard.worker.dedup import DedupLocks, id_locks, text_locks
from blackboard.worker.derived import MERGE_SOURCE, derived_kind, revive_merged, store_derived
from blackboard.worker.stream_handler import Conn, StreamHandler
from blackboard.worker.supersession import (
    ContradictionPolicy,
    keys_before_write,
    settle_keys,
    settle_written,
)

__all__ = ["memory_handler", "memory_signed", "write_memories"]


async def write_memories(conn: Conn, rows: Sequence[MemoryRow | ForgetRow], *,
                         policy: ContradictionPolicy | None = None, dedup: bool = True,
                         dedup_per_agent: bool = False) -> None:
    """Store (or replace, by id, forward only) memories and queue their embeddings; apply forgets.

    A forget deletes the stored versions older than itself and leaves a
    tombstone, so an older copy arriving later is not stored again. A batch
    with forgets first locks out concurrent memory writers (see
    ``LOCK_MEMORIES_FOR_FORGET``), so a memory and its forget committed at the
    same time by two batches cannot miss each other.

    The subject keys the batch changes are settled after it is stored (versions
    linked, contradictions contested under ``policy``: :mod:`.supersession`);
    their locks are taken first, before any row is written (a batch with
    forgets holds the table instead).

    With ``dedup`` (``memory.dedup``), a new memory whose normalised text is that
    of a live memory of its scope (its board, and its agent with
    ``dedup_per_agent``; its subject key) is merged into it rather than stored: a
    ``bb_memory_sources`` row, the kept memory seen once more
    (:mod:`blackboard.db.memory_sql`). A forget of a merged id removes that
    source; a forget of a kept memory takes its sources with it.
    """
    forgets = [r for r in rows if isinstance(r, ForgetRow)]
    if forgets:
        await conn.execute(q.LOCK_MEMORIES_FOR_FORGET)
        async with conn.cursor() as cur:
            await cur.executemany(q.UPSERT_FORGET, [(i, f.board, f.stream, f.seq, f.verdict)
                                                      for f in forgets for i in f.ids])
    memories = [r for r in rows if isinstance(r, MemoryRow)]
    if memories:
        keyed = [(r.board, r.key, (r.valid_from, r.seq)) for r in memories if r.key is not None]
        # Where the batch's ids were, for a batch with keys only: a new version of a keyed id
        # without a key leaves its old key's links as they were until that key's next write
        # (docs/memory-lifecycle.md), and a batch without keys costs nothing more.
        changes = await keys_before_write(conn, [r.id for r in memories] if keyed else [], keyed, lock=not forgets)
        await _write_memory_rows(conn, memories, dedup=dedup, per_agent=dedup_per_agent,
                                 table_locked=bool(forgets))
        await revive_merged(conn, memories)
        await store_derived(conn, memories)
        await settle_written(conn, changes, [(r.id, r.seq, r.key) for r in memories], policy)
    if forgets:
        ids = sorted({i for f in forgets for i in f.ids})
        forgotten = await keys_before_write(conn, ids, (), lock=False)
        cur = await conn.execute(dq.FORGET_MERGED, {"ids": ids})
        mids = [int(r[0]) for r in await cur.fetchall()]  # near-duplicates archived into a forgotten memory
        cur = await conn.execute(q.DELETE_FORGOTTEN, (ids,))
        mids += [int(r[0]) for r in await cur.fetchall()]
        if mids:
            await _delete_vectors(conn, mids)
        await settle_keys(conn, forgotten.starts)  # a forgotten version leaves its key's versions


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
        pgcopy.timestamptz(r.created_at), pgcopy.text(r.search_text), pgcopy.text(r.verdict),
        pgcopy.text(r.embed_meta), pgcopy.text(r.key), pgcopy.timestamptz(r.occurred_at),
        pgcopy.float4(r.confidence), pgcopy.bytea(r.content_hash), pgcopy.text(r.sig_key), pgcopy.text(r.sig),
    ))


async def _write_memory_rows(conn: Conn, rows: Sequence[MemoryRow], *, dedup: bool, per_agent: bool,
                             table_locked: bool) -> None:
    await conn.execute(q.CREATE_STAGE_MEMORIES)
    async with conn.cursor() as cur, cur.copy(q.COPY_MEMORIES) as copy:
        await copy.write(pgcopy.stream(_memory_row(r) for r in rows))
    locks = id_locks(rows) if dedup else None
    if not locks:
        await conn.execute(q.MOVE_MEMORIES)
        return
    await _deduplicated_move(conn, rows, locks, per_agent, table_locked)


async def _deduplicated_move(conn: Conn, rows: Sequence[MemoryRow], locks: DedupLocks, per_agent: bool,
                             table_locked: bool) -> None:
    """Store the staged batch with exact deduplication (``memory_sql``'s steps): the ids'
    locks; the duplicates of stored memories, and the followers (duplicates of an earlier
    memory of the batch), set aside; the new texts' locks and their first memories (the
    leaders) checked again; the stored rows to update locked; the rest stored; what was
    set aside merged into the memories of its texts. Two round trips (pipelined
    statements) more than without."""
    async with conn.pipeline():
        if not table_locked:
            await conn.execute(dq.LOCK_MEMORIES_FOR_DEDUP)
        await conn.execute(dq.LOCK_DEDUP_KEYS, (locks.spaces, locks.keys, locks.shared))
        await conn.execute(dq.CREATE_FOLLOWERS)
        stale = await conn.execute(dq.DROP_STALE_SOURCES)
        staged = await conn.execute(dq.MERGE_STAGED, {"per_agent": per_agent,
                                                        # a derived merge takes its sources' place: never merged
                                                        "unmerged_source": MERGE_SOURCE})
    found = await staged.fetchone()
    released = await stale.fetchone()
    leaders: list[str] = (found[0] if found is not None else None) or []
    lost: list[int] = (released[0] if released is not None else None) or []
    aside = bool(found is not None and found[1])
    back = None
    async with conn.pipeline():
        if leaders and not locks.coarse:
            chosen = set(leaders)
            texts = text_locks([r for r in rows if r.id in chosen], per_agent=per_agent)
            await conn.execute(dq.LOCK_DEDUP_KEYS, (texts.spaces, texts.keys, texts.shared))
            await conn.execute(dq.MERGE_LEADERS, {"per_agent": per_agent, "ids": leaders})
            aside = True
        if lost or (found is not None and found[3]):  # replacing stored rows: lock all it updates first
            await conn.execute(dq.LOCK_ROWS, {"kept": ((found[2] if found is not None else None) or []) + lost})
        if lost:
            await conn.execute(dq.RELEASE_SOURCES, {"mids": lost})
        await conn.execute(q.MOVE_MEMORIES)
        if aside:
            back = await conn.execute(dq.MERGE_FOLLOWERS, {"per_agent": per_agent})
    restaged = await back.fetchone() if back is not None else None
    if restaged is not None and restaged[0]:  # a follower that found no leader: not expected, never lost
        await conn.execute(q.MOVE_MEMORIES)


def _canonical(msg: RawMessage) -> bytes:
    """The canonical bytes of the memory or forget a message holds (the verifier's fallback)."""
    obj = codec.decode(msg.data, codec.encoding_of(msg.headers, msg.data))
    return records.decode_memory(obj).canonical_bytes()


def memory_signed(msg: RawMessage, row: MemoryRow | ForgetRow) -> Signed:
    """What the signature of a memory or a forget must prove: written by its ``agent`` (the
    decoder checked that a forget's agent is its subject's); a memory with provenance (one the
    worker derived) by a ``worker`` identity."""
    if isinstance(row, MemoryRow):
        return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, row.agent, lambda: _canonical(msg),
                      kind=derived_kind(row))
    agent = Subjects.parse_memory(msg.subject)[1]
    return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, agent, lambda: _canonical(msg))


def memory_handler(settings: Settings) -> StreamHandler:
    """The worker's handler of ``BB_MEM`` (durable ``<worker>-memories``)."""
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size
    chars = settings.worker.max_index_chars

    policy = ContradictionPolicy.from_settings(settings.memory)

    def decode(msg: RawMessage) -> MemoryRow | ForgetRow:
        return decode_memory(msg, max_bytes=max_bytes, index_chars=chars)

    dedup, per_agent = settings.memory.dedup, settings.memory.dedup_per_agent

    async def write(conn: Conn, rows: Sequence[MemoryRow | ForgetRow]) -> None:
        await write_memories(conn, rows, policy=policy, dedup=dedup, dedup_per_agent=per_agent)

    return StreamHandler("memories", MEMORY_STREAM, Subjects.memory_all(), decode, write,
                         embeds=True, concurrent_writes=True, signed=memory_signed)
