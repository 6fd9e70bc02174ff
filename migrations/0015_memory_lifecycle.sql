-- 0015: the lifecycle of long-term memories (docs/memory-lifecycle.md):
-- deduplication and consolidation, supersession with time, importance and
-- pruning.
--
-- Every column is nullable or has a constant default, so adding them rewrites
-- nothing. Rows stored before this migration read as: no subject key, no event
-- time (valid from their created_at), never superseded, not archived, seen
-- once, never recalled, no content hash (exact deduplication does not see them;
-- near-duplicate consolidation does).
ALTER TABLE bb_memories
    -- What the memory is about (wire field `key`, e.g. 'price:shop.example.com:sku-1').
    -- A newer memory on the same (board, subject_key) supersedes the older ones.
    ADD COLUMN subject_key    text,
    -- When it happened (wire field `occurred_at`), distinct from created_at (when written).
    ADD COLUMN occurred_at    timestamptz,
    -- Its valid time: from coalesce(occurred_at, created_at), set at ingest...
    ADD COLUMN valid_from     timestamptz,
    -- ... to the valid_from of the version that superseded it (NULL: current).
    ADD COLUMN valid_to       timestamptz,
    -- The id of the memory that closed it (supersession, or a vote's winner).
    ADD COLUMN superseded_by  text,
    -- The writer's confidence in it, 0..1 (wire field `confidence`); NULL: not given.
    ADD COLUMN confidence     real,
    -- SHA-256 of the normalised text (blackboard/worker/dedup.py), set at ingest.
    ADD COLUMN content_hash   bytea,
    -- How many memories were merged into this one (itself included), and the
    -- newest write time among them.
    ADD COLUMN seen_count     integer NOT NULL DEFAULT 1,
    ADD COLUMN last_seen      timestamptz,
    -- How often recall returned it (last_accessed, from 0001, is when last).
    ADD COLUMN hits           integer NOT NULL DEFAULT 0,
    -- Archived (pruned, or merged into another memory): kept, restorable, not recalled.
    ADD COLUMN archived_at    timestamptz,
    ADD COLUMN archive_reason text,
    -- The id of the memory it was merged into (archive_reason 'merged').
    ADD COLUMN merged_into    text,
    -- The proposal deciding a contradiction this memory is part of (NULL: none open).
    ADD COLUMN contested_by   text;

-- Exact duplicates: the live memory of a board with a given content hash.
CREATE INDEX IF NOT EXISTS bb_memories_content_hash ON bb_memories (board, content_hash)
    WHERE content_hash IS NOT NULL AND archived_at IS NULL;
-- Versions of a fact: a subject key's memories in valid-time order.
CREATE INDEX IF NOT EXISTS bb_memories_subject_key ON bb_memories (board, subject_key, valid_from, seq)
    WHERE subject_key IS NOT NULL;

-- Provenance of merged memories: one row per memory merged into another (the
-- kept memory's own record is its row in bb_memories). `id` is the merged
-- memory's id, still known: a forget of it, or a wait for it, finds the kept
-- memory. The signature the source carried (SourceRef: stream, seq, key, sig)
-- is kept, so the source can be fetched from the stream and verified.
CREATE TABLE IF NOT EXISTS bb_memory_sources (
    id         text        PRIMARY KEY,
    mid        bigint      NOT NULL REFERENCES bb_memories (mid) ON DELETE CASCADE,
    board      text        NOT NULL,
    agent      text        NOT NULL,
    stream     text        NOT NULL,
    seq        bigint      NOT NULL,
    created_at timestamptz NOT NULL,
    sig_key    text,
    sig        text,
    verdict    text        NOT NULL DEFAULT 'unsigned',
    how        text        NOT NULL CHECK (how IN ('exact', 'near', 'llm')),
    merged_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bb_memory_sources_mid ON bb_memory_sources (mid);

-- Memories embedded and not yet checked for near-duplicates: the embedder adds
-- the memories whose vectors it wrote (in the same transaction), the
-- consolidator takes them (blackboard/worker/consolidator.py).
CREATE TABLE IF NOT EXISTS bb_consolidate_queue (
    mid         bigint      PRIMARY KEY,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
