"""SQL of the embedding stage (constants and ``psycopg.sql`` builders, no IO)."""

from __future__ import annotations

from psycopg import sql

from blackboard.db.spaces import ItemType, Space

__all__ = ["BACKLOG", "CLAIM", "CONTEXT", "DONE", "LOAD_ENTRIES", "LOAD_MEMORIES", "RELEASE", "upsert_vectors"]

#: Lease up to %(n)s queued items whose lease is free or expired.
CLAIM = """
UPDATE bb_embed_queue q SET lease_until = clock_timestamp() + make_interval(secs => %(lease)s),
                            attempts = q.attempts + 1
FROM (
    SELECT item_type, item FROM bb_embed_queue
    WHERE lease_until IS NULL OR lease_until < clock_timestamp()
    ORDER BY enqueued_at
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
) c
WHERE q.item_type = c.item_type AND q.item = c.item
RETURNING q.item_type, q.item, q.enqueued_at, q.attempts"""

#: The text of the memory before ``m`` on its board and thread (``metadata.thread``, compared
#: as JSON), by ``(created_at, mid)``: a threaded memory's context (worker/embed_text.py,
#: contextual indexing); NULL for a memory without a thread or the first of its thread. One
#: probe of the partial index bb_memories_thread (migration 0017).
CONTEXT = ("CASE WHEN m.metadata ? 'thread' THEN (SELECT p.text FROM bb_memories p "
           "WHERE p.board = m.board AND p.metadata ? 'thread' AND p.metadata -> 'thread' = m.metadata -> 'thread' "
           "AND (p.created_at, p.mid) < (m.created_at, m.mid) ORDER BY p.created_at DESC, p.mid DESC LIMIT 1) END")

LOAD_MEMORIES = (f"SELECT m.mid, m.seq, m.text, m.metadata, m.board, m.embed_meta, {CONTEXT} AS context "
                 "FROM bb_memories m WHERE m.mid = ANY(%s)")
LOAD_ENTRIES = "SELECT eid, revision, search_text, deleted, board FROM bb_entries WHERE eid = ANY(%s)"

#: Remove finished queue rows, unless they were re-enqueued meanwhile.
DONE = """
DELETE FROM bb_embed_queue q
USING unnest(%s::text[], %s::bigint[], %s::timestamptz[]) AS d(item_type, item, enqueued_at)
WHERE q.item_type = d.item_type AND q.item = d.item AND q.enqueued_at = d.enqueued_at"""

#: Give leases back (a clean stop), unless the rows were re-enqueued meanwhile.
RELEASE = """
UPDATE bb_embed_queue q SET lease_until = NULL
FROM unnest(%s::text[], %s::bigint[], %s::timestamptz[]) AS d(item_type, item, enqueued_at)
WHERE q.item_type = d.item_type AND q.item = d.item AND q.enqueued_at = d.enqueued_at"""

BACKLOG = "SELECT count(*) FROM bb_embed_queue"


def upsert_vectors(space: Space, item_type: ItemType, suffix: str = "") -> sql.Composed:
    """INSERT one vector (item, revision, board, vector), replacing an older revision's (never a newer one).

    The board is the item's board at that revision (a memory rewritten onto
    another board is queued again, and its new row carries the new board).
    """
    return sql.SQL(
        "INSERT INTO {t} AS v (item, revision, board, embedding) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (item) DO UPDATE SET revision = EXCLUDED.revision, board = EXCLUDED.board, "
        "embedding = EXCLUDED.embedding "
        "WHERE v.revision <= EXCLUDED.revision").format(t=space.table(item_type, suffix))
