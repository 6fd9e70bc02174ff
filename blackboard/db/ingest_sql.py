"""SQL of the ingest path (constants; the worker binds the values).

Board entries: a batch is COPYed (binary) straight into ``bb_entry_revisions``
inside a savepoint; only if that hits an existing (stream, seq), i.e. a
redelivery after a crash, is the batch staged in a temp table and inserted
``ON CONFLICT DO NOTHING`` instead. The current-state table is then upserted
only forward (higher revision wins, whatever order batches commit in) from the
stored revisions, one row per key in key order (so concurrent batches lock in
the same order), and the changed items are handed to the embedding stage in
the same statement: one ``bb_embed_inbox`` row per batch (the embedder moves
them into the per-item ``bb_embed_queue``; see ``MOVE_INBOX``).

Memories: a batch is COPYed into a temp table and moved with one statement
(upsert by id, forward only, skipping forgotten ids), handing the changed
memories to the embedding stage the same way.
"""

from __future__ import annotations

__all__ = [
    "COPY_MEMORIES",
    "COPY_REVISIONS",
    "COPY_STAGE_REVISIONS",
    "CREATE_STAGE_MEMORIES",
    "CREATE_STAGE_REVISIONS",
    "DELETE_FORGOTTEN",
    "INBOX_SIZE",
    "INSERT_DEAD_LETTER",
    "LOCK_MEMORIES_FOR_FORGET",
    "MOVE_INBOX",
    "MOVE_MEMORIES",
    "MOVE_STAGED_REVISIONS",
    "SPACES",
    "UNQUEUE_MEMORIES",
    "UPSERT_CURRENT",
    "UPSERT_FORGET",
]

REVISION_COLUMNS = ("stream", "seq", "board", "section", "key", "op", "value", "value_raw", "content_type",
                    "tags", "metadata", "author", "created_at", "stored_at", "expires_at", "verdict")
#: The staged columns of a memory. ``subject_key`` .. ``content_hash`` are stored (with
#: ``valid_from`` = coalesce(occurred_at, created_at) and ``last_seen`` = created_at);
#: ``sig_key`` and ``sig`` (the message's signature headers) are staged for the provenance
#: of merges (``bb_memory_sources``), not stored in ``bb_memories``.
MEMORY_COLUMNS = ("stream", "seq", "id", "board", "agent", "kind", "text", "tags", "metadata",
                  "importance", "source", "read_only", "created_at", "search_text", "verdict", "embed_meta",
                  "subject_key", "occurred_at", "confidence", "content_hash", "sig_key", "sig")

#: Binary COPY of revision rows (columns :data:`REVISION_COLUMNS`).
COPY_REVISIONS = f"COPY bb_entry_revisions ({', '.join(REVISION_COLUMNS)}) FROM STDIN (FORMAT BINARY)"

#: The redelivery path: revisions staged, then inserted unless present.
CREATE_STAGE_REVISIONS = """
CREATE TEMP TABLE IF NOT EXISTS bb_stage_revisions (
    stream text, seq bigint, board text, section text, key text, op text, value jsonb,
    value_raw bytea, content_type text, tags text[], metadata jsonb, author text,
    created_at timestamptz, stored_at timestamptz, expires_at timestamptz, verdict text
) ON COMMIT DELETE ROWS"""
COPY_STAGE_REVISIONS = f"COPY bb_stage_revisions ({', '.join(REVISION_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
MOVE_STAGED_REVISIONS = f"""
INSERT INTO bb_entry_revisions ({', '.join(REVISION_COLUMNS)})
SELECT {', '.join(REVISION_COLUMNS)} FROM bb_stage_revisions
ON CONFLICT (stream, seq) DO NOTHING"""

#: Move current state forward to the given revisions of one stream (one per
#: key) and hand the changed items to the embedding stage (one inbox row). Params: stream text, seqs and search texts
#: as array literals (``pgcopy.bigint_array_literal`` / ``text_array_literal``).
UPSERT_CURRENT = """
WITH latest AS (
    -- LATERAL ... LIMIT 1: one primary-key probe per row, whatever the
    -- planner thinks of the (unanalysed, growing) revisions table.
    SELECT r.*, s.search_text
    FROM unnest(%(seqs)s::bigint[], %(texts)s::text[]) AS s(seq, search_text)
    CROSS JOIN LATERAL (SELECT * FROM bb_entry_revisions r
                        WHERE r.stream = %(stream)s AND r.seq = s.seq LIMIT 1) r
    ORDER BY r.board, r.section, r.key
), up AS (
    INSERT INTO bb_entries AS e (board, section, key, stream, revision, deleted, value, value_raw,
                                 content_type, tags, metadata, author, created_at, updated_at, search_text,
                                 expires_at, verdict)
    SELECT board, section, key, stream, seq, op <> 'PUT', value, value_raw, content_type,
           tags, metadata, author, created_at, stored_at, search_text, expires_at, verdict
    FROM latest
    ON CONFLICT (board, section, key) DO UPDATE SET
        stream = EXCLUDED.stream, revision = EXCLUDED.revision, deleted = EXCLUDED.deleted,
        value = EXCLUDED.value, value_raw = EXCLUDED.value_raw, content_type = EXCLUDED.content_type,
        tags = EXCLUDED.tags, metadata = EXCLUDED.metadata, author = EXCLUDED.author,
        created_at = CASE WHEN e.deleted THEN EXCLUDED.created_at ELSE e.created_at END,
        updated_at = EXCLUDED.updated_at, search_text = EXCLUDED.search_text,
        expires_at = EXCLUDED.expires_at, verdict = EXCLUDED.verdict
    WHERE e.revision < EXCLUDED.revision
    RETURNING e.eid, e.deleted, e.search_text
)
INSERT INTO bb_embed_inbox (item_type, items)
SELECT 'entry', array_agg(eid) FROM up WHERE NOT deleted AND search_text <> '' HAVING count(*) > 0"""

CREATE_STAGE_MEMORIES = """
CREATE TEMP TABLE IF NOT EXISTS bb_stage_memories (
    stream text, seq bigint, id text, board text, agent text, kind text, text text, tags text[],
    metadata jsonb, importance real, source text, read_only boolean, created_at timestamptz,
    search_text text, verdict text, embed_meta text, subject_key text, occurred_at timestamptz,
    confidence real, content_hash bytea, sig_key text, sig text
) ON COMMIT DELETE ROWS"""
COPY_MEMORIES = f"COPY bb_stage_memories ({', '.join(MEMORY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"

MOVE_MEMORIES = """
WITH latest AS (
    SELECT DISTINCT ON (s.id) s.*
    FROM bb_stage_memories s
    WHERE NOT EXISTS (SELECT 1 FROM bb_memory_forgets f
                      WHERE f.id = s.id AND f.board = s.board AND f.seq > s.seq)
    ORDER BY s.id, s.seq DESC
), up AS (
    INSERT INTO bb_memories AS m (id, board, agent, kind, text, tags, metadata, importance, source,
                                  read_only, created_at, updated_at, stream, seq, search_text, verdict, embed_meta,
                                  subject_key, occurred_at, valid_from, confidence, content_hash, last_seen)
    SELECT id, board, agent, kind, text, tags, metadata, importance, source,
           read_only, created_at, created_at, stream, seq, search_text, verdict, embed_meta,
           subject_key, occurred_at, coalesce(occurred_at, created_at), confidence, content_hash, created_at
    FROM latest
    ON CONFLICT (id) DO UPDATE SET
        board = EXCLUDED.board, agent = EXCLUDED.agent, kind = EXCLUDED.kind, text = EXCLUDED.text,
        tags = EXCLUDED.tags, metadata = EXCLUDED.metadata, importance = EXCLUDED.importance,
        source = EXCLUDED.source, read_only = EXCLUDED.read_only,
        updated_at = EXCLUDED.created_at, stream = EXCLUDED.stream, seq = EXCLUDED.seq,
        search_text = EXCLUDED.search_text, verdict = EXCLUDED.verdict, embed_meta = EXCLUDED.embed_meta,
        subject_key = EXCLUDED.subject_key, occurred_at = EXCLUDED.occurred_at, valid_from = EXCLUDED.valid_from,
        confidence = EXCLUDED.confidence, content_hash = EXCLUDED.content_hash,
        last_seen = greatest(m.last_seen, EXCLUDED.last_seen),
        -- a new version of a pruned memory is live again (its writer said it anew); one merged
        -- away is revived by worker.derived.revive_merged, which also mends its kept memory's count
        archived_at = CASE WHEN m.archive_reason IN ('merged', 'conflict') THEN m.archived_at END,
        archive_reason = CASE WHEN m.archive_reason IN ('merged', 'conflict') THEN m.archive_reason END
    WHERE m.seq < EXCLUDED.seq
    RETURNING m.mid
)
INSERT INTO bb_embed_inbox (item_type, items)
SELECT 'memory', array_agg(mid) FROM up HAVING count(*) > 0"""

#: Taken by a batch holding forgets: waits for memory writers in flight and
#: holds new ones off until the forget commits, so a memory committed
#: concurrently with its forget is either seen by the delete or sees the
#: tombstone (forgets are rare; memory batches without one never take it).
LOCK_MEMORIES_FOR_FORGET = "LOCK TABLE bb_memories IN SHARE ROW EXCLUSIVE MODE"

#: Record forget tombstones: (id, board, stream, seq, verdict) rows.
UPSERT_FORGET = """
INSERT INTO bb_memory_forgets AS f (id, board, stream, seq, verdict) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (id, board) DO UPDATE SET stream = EXCLUDED.stream, seq = EXCLUDED.seq, verdict = EXCLUDED.verdict
WHERE f.seq < EXCLUDED.seq"""

#: Delete memories forgotten by a tombstone newer than the stored version.
DELETE_FORGOTTEN = """
DELETE FROM bb_memories m USING bb_memory_forgets f
WHERE f.id = m.id AND f.board = m.board AND f.seq > m.seq AND m.id = ANY(%s)
RETURNING m.mid"""

SPACES = "SELECT id, model, dims FROM bb_embedding_spaces"
UNQUEUE_MEMORIES = "DELETE FROM bb_embed_queue WHERE item_type = 'memory' AND item = ANY(%s)"

#: The embedding stage's side of the hand-off: move up to %(n)s inbox rows
#: (oldest first, skipping rows another worker is moving) into the per-item
#: queue, re-enqueueing items already queued, in item order (concurrent movers
#: lock queue rows in the same order). Returns the number of items moved.
MOVE_INBOX = """
WITH batch AS (
    DELETE FROM bb_embed_inbox WHERE id IN (
        SELECT id FROM bb_embed_inbox ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
    RETURNING item_type, items
), moved AS (
    INSERT INTO bb_embed_queue (item_type, item)
    SELECT DISTINCT b.item_type, i.item FROM batch b CROSS JOIN LATERAL unnest(b.items) AS i(item)
    ORDER BY 1, 2
    ON CONFLICT (item_type, item) DO UPDATE SET enqueued_at = clock_timestamp(), lease_until = NULL
    RETURNING 1
)
SELECT count(*) FROM moved"""

#: Items handed over by ingest and not yet moved into the queue.
INBOX_SIZE = "SELECT coalesce(sum(cardinality(items)), 0) FROM bb_embed_inbox"

INSERT_DEAD_LETTER = """
INSERT INTO bb_dead_letters (stream, seq, subject, reason, data, headers)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (stream, seq) DO NOTHING"""
