"""SQL of the ingest path (constants; the worker binds the values).

A batch is COPYed into a session temp table, then moved with set-based
statements: revisions are inserted ``ON CONFLICT DO NOTHING`` (idempotent on
(stream, seq)), the current-state table is upserted only forward (higher
revision wins, whatever order batches commit in), and changed items are queued
for embedding in the same transaction.
"""

from __future__ import annotations

__all__ = [
    "COPY_ENTRIES",
    "COPY_MEMORIES",
    "CREATE_STAGE_ENTRIES",
    "CREATE_STAGE_MEMORIES",
    "DELETE_FORGOTTEN",
    "INSERT_DEAD_LETTER",
    "MOVE_ENTRIES_CURRENT",
    "MOVE_ENTRY_REVISIONS",
    "MOVE_MEMORIES",
    "SPACES",
    "TRUNCATE_STAGE_ENTRIES",
    "TRUNCATE_STAGE_MEMORIES",
    "UNQUEUE_MEMORIES",
    "UPSERT_FORGET",
]

ENTRY_COLUMNS = ("stream", "seq", "board", "section", "key", "op", "value", "value_raw", "content_type",
                 "tags", "metadata", "author", "created_at", "stored_at", "search_text")
MEMORY_COLUMNS = ("stream", "seq", "id", "board", "agent", "kind", "text", "tags", "metadata",
                  "importance", "source", "read_only", "created_at", "search_text")

CREATE_STAGE_ENTRIES = """
CREATE TEMP TABLE IF NOT EXISTS bb_stage_entries (
    stream text, seq bigint, board text, section text, key text, op text, value jsonb,
    value_raw bytea, content_type text, tags text[], metadata jsonb, author text,
    created_at timestamptz, stored_at timestamptz, search_text text
) ON COMMIT DELETE ROWS"""
TRUNCATE_STAGE_ENTRIES = "DELETE FROM bb_stage_entries"

COPY_ENTRIES = f"COPY bb_stage_entries ({', '.join(ENTRY_COLUMNS)}) FROM STDIN"

MOVE_ENTRY_REVISIONS = """
INSERT INTO bb_entry_revisions (stream, seq, board, section, key, op, value, value_raw, content_type,
                                tags, metadata, author, created_at, stored_at)
SELECT stream, seq, board, section, key, op, value, value_raw, content_type,
       tags, metadata, author, created_at, stored_at
FROM bb_stage_entries
ON CONFLICT (stream, seq) DO NOTHING"""

MOVE_ENTRIES_CURRENT = """
WITH latest AS (
    SELECT DISTINCT ON (board, section, key) *
    FROM bb_stage_entries
    ORDER BY board, section, key, seq DESC
), up AS (
    INSERT INTO bb_entries AS e (board, section, key, stream, revision, deleted, value, value_raw,
                                 content_type, tags, metadata, author, created_at, updated_at, search_text)
    SELECT board, section, key, stream, seq, op <> 'PUT', value, value_raw, content_type,
           tags, metadata, author, created_at, stored_at, search_text
    FROM latest
    ON CONFLICT (board, section, key) DO UPDATE SET
        stream = EXCLUDED.stream, revision = EXCLUDED.revision, deleted = EXCLUDED.deleted,
        value = EXCLUDED.value, value_raw = EXCLUDED.value_raw, content_type = EXCLUDED.content_type,
        tags = EXCLUDED.tags, metadata = EXCLUDED.metadata, author = EXCLUDED.author,
        created_at = CASE WHEN e.deleted THEN EXCLUDED.created_at ELSE e.created_at END,
        updated_at = EXCLUDED.updated_at, search_text = EXCLUDED.search_text
    WHERE e.revision < EXCLUDED.revision
    RETURNING e.eid, e.deleted, e.search_text
)
INSERT INTO bb_embed_queue (item_type, item)
SELECT 'entry', eid FROM up WHERE NOT deleted AND search_text <> ''
ON CONFLICT (item_type, item) DO UPDATE SET enqueued_at = clock_timestamp(), lease_until = NULL"""

CREATE_STAGE_MEMORIES = """
CREATE TEMP TABLE IF NOT EXISTS bb_stage_memories (
    stream text, seq bigint, id text, board text, agent text, kind text, text text, tags text[],
    metadata jsonb, importance real, source text, read_only boolean, created_at timestamptz,
    search_text text
) ON COMMIT DELETE ROWS"""
TRUNCATE_STAGE_MEMORIES = "DELETE FROM bb_stage_memories"

COPY_MEMORIES = f"COPY bb_stage_memories ({', '.join(MEMORY_COLUMNS)}) FROM STDIN"

MOVE_MEMORIES = """
WITH latest AS (
    SELECT DISTINCT ON (s.id) s.*
    FROM bb_stage_memories s
    WHERE NOT EXISTS (SELECT 1 FROM bb_memory_forgets f
                      WHERE f.id = s.id AND f.board = s.board AND f.seq > s.seq)
    ORDER BY s.id, s.seq DESC
), up AS (
    INSERT INTO bb_memories AS m (id, board, agent, kind, text, tags, metadata, importance, source,
                                  read_only, created_at, updated_at, stream, seq, search_text)
    SELECT id, board, agent, kind, text, tags, metadata, importance, source,
           read_only, created_at, created_at, stream, seq, search_text
    FROM latest
    ON CONFLICT (id) DO UPDATE SET
        board = EXCLUDED.board, agent = EXCLUDED.agent, kind = EXCLUDED.kind, text = EXCLUDED.text,
        tags = EXCLUDED.tags, metadata = EXCLUDED.metadata, importance = EXCLUDED.importance,
        source = EXCLUDED.source, read_only = EXCLUDED.read_only,
        updated_at = EXCLUDED.created_at, stream = EXCLUDED.stream, seq = EXCLUDED.seq,
        search_text = EXCLUDED.search_text
    WHERE m.seq < EXCLUDED.seq
    RETURNING m.mid
)
INSERT INTO bb_embed_queue (item_type, item)
SELECT 'memory', mid FROM up
ON CONFLICT (item_type, item) DO UPDATE SET enqueued_at = clock_timestamp(), lease_until = NULL"""

#: Record forget tombstones: (id, board, stream, seq) rows.
UPSERT_FORGET = """
INSERT INTO bb_memory_forgets AS f (id, board, stream, seq) VALUES (%s, %s, %s, %s)
ON CONFLICT (id, board) DO UPDATE SET stream = EXCLUDED.stream, seq = EXCLUDED.seq
WHERE f.seq < EXCLUDED.seq"""

#: Delete memories forgotten by a tombstone newer than the stored version.
DELETE_FORGOTTEN = """
DELETE FROM bb_memories m USING bb_memory_forgets f
WHERE f.id = m.id AND f.board = m.board AND f.seq > m.seq AND m.id = ANY(%s)
RETURNING m.mid"""

SPACES = "SELECT id, model, dims FROM bb_embedding_spaces"
UNQUEUE_MEMORIES = "DELETE FROM bb_embed_queue WHERE item_type = 'memory' AND item = ANY(%s)"

INSERT_DEAD_LETTER = """
INSERT INTO bb_dead_letters (stream, seq, subject, reason, data, headers)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (stream, seq) DO NOTHING"""
