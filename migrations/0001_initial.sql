-- 0001: the Postgres side of the blackboard.
--
-- Every table is written by the persistence worker from JetStream; rows carry
-- the stream name and sequence they came from, and a UNIQUE constraint on
-- (stream, seq) makes a redelivered message write nothing twice.
--
-- Vectors do not live here: they go into per-embedding-space tables
-- (bb_vec_<space>_memories / bb_vec_<space>_entries) created by the worker for
-- the configured (model, dimensions), registered in bb_embedding_spaces. A new
-- model or dimension is a new space, filled by `blackboard reindex` while the
-- old one keeps serving.

CREATE EXTENSION IF NOT EXISTS vector;

-- Every revision of every board entry (the KV stream's messages).
CREATE TABLE bb_entry_revisions (
    stream       text        NOT NULL,
    seq          bigint      NOT NULL,           -- the entry's revision
    board        text        NOT NULL,
    section      text        NOT NULL,
    key          text        NOT NULL,
    op           text        NOT NULL CHECK (op IN ('PUT', 'DEL', 'PURGE')),
    value        jsonb,                          -- the value when JSON can hold it
    value_raw    bytea,                          -- otherwise its msgpack encoding
    content_type text,
    tags         text[]      NOT NULL DEFAULT '{}',
    metadata     jsonb       NOT NULL DEFAULT '{}',
    author       text,
    created_at   timestamptz,                    -- writer's clock
    stored_at    timestamptz NOT NULL,           -- JetStream's timestamp
    PRIMARY KEY (stream, seq)
);
CREATE INDEX bb_entry_revisions_key ON bb_entry_revisions (board, section, key, seq DESC);
CREATE INDEX bb_entry_revisions_stored ON bb_entry_revisions (board, section, key, stored_at DESC);

-- Current state of every key: converges to the highest revision whatever the
-- order batches commit in (upserts only move forward). Deletes keep a
-- tombstone row so that a late older revision cannot resurrect the key.
CREATE TABLE bb_entries (
    eid          bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    board        text        NOT NULL,
    section      text        NOT NULL,
    key          text        NOT NULL,
    stream       text        NOT NULL,
    revision     bigint      NOT NULL,
    deleted      boolean     NOT NULL DEFAULT false,
    value        jsonb,
    value_raw    bytea,
    content_type text,
    tags         text[]      NOT NULL DEFAULT '{}',
    metadata     jsonb       NOT NULL DEFAULT '{}',
    author       text,
    created_at   timestamptz,
    updated_at   timestamptz NOT NULL,
    search_text  text        NOT NULL DEFAULT '',
    tsv          tsvector    GENERATED ALWAYS AS (to_tsvector('english', search_text)) STORED,
    PRIMARY KEY (board, section, key)
);
CREATE INDEX bb_entries_tsv ON bb_entries USING gin (tsv);
CREATE INDEX bb_entries_tags ON bb_entries USING gin (tags);
CREATE INDEX bb_entries_metadata ON bb_entries USING gin (metadata jsonb_path_ops);
CREATE INDEX bb_entries_updated ON bb_entries (board, updated_at);
CREATE INDEX bb_entries_author ON bb_entries (author);

-- Long-term memories (the memory stream). `id` is chosen by the writer; a
-- later message with the same id replaces the memory (only if its seq is higher).
CREATE TABLE bb_memories (
    mid           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id            text        NOT NULL UNIQUE,
    board         text        NOT NULL,
    agent         text        NOT NULL,
    kind          text        NOT NULL,
    text          text        NOT NULL,
    tags          text[]      NOT NULL DEFAULT '{}',
    metadata      jsonb       NOT NULL DEFAULT '{}',
    importance    real        NOT NULL DEFAULT 0.5,
    source        text,
    read_only     boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_accessed timestamptz,
    stream        text        NOT NULL,
    seq           bigint      NOT NULL,
    -- What keyword search matches: the text plus indexable context (tags,
    -- selected metadata) chosen by the worker.
    search_text   text        NOT NULL DEFAULT '',
    tsv           tsvector    GENERATED ALWAYS AS (to_tsvector('english', search_text)) STORED,
    UNIQUE (stream, seq)
);
CREATE INDEX bb_memories_board ON bb_memories (board, created_at);
CREATE INDEX bb_memories_agent ON bb_memories (agent);
CREATE INDEX bb_memories_kind ON bb_memories (kind);
CREATE INDEX bb_memories_created ON bb_memories (created_at);
CREATE INDEX bb_memories_tsv ON bb_memories USING gin (tsv);
CREATE INDEX bb_memories_tags ON bb_memories USING gin (tags);
CREATE INDEX bb_memories_metadata ON bb_memories USING gin (metadata jsonb_path_ops);

-- Items waiting for an embedding (an outbox written in the ingest transaction,
-- so a crash between storing and embedding loses nothing). item_type is
-- 'memory' (item = bb_memories.mid) or 'entry' (item = bb_entries.eid).
-- An embedder leases rows (lease_until) instead of holding row locks while the
-- model runs; a re-enqueue moves enqueued_at, so the embedder's final delete
-- (matching enqueued_at) leaves a newer request in place.
CREATE TABLE bb_embed_queue (
    item_type   text        NOT NULL CHECK (item_type IN ('memory', 'entry')),
    item        bigint      NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_until timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (item_type, item)
);
CREATE INDEX bb_embed_queue_order ON bb_embed_queue (enqueued_at);

-- Embedding spaces: one per (model, dimensions), each with its own vector tables.
CREATE TABLE bb_embedding_spaces (
    id         integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model      text        NOT NULL,
    dims       integer     NOT NULL CHECK (dims > 0 AND dims <= 16000),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (model, dims)
);

-- Messages that could not be decoded, validated or stored.
CREATE TABLE bb_dead_letters (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream  text        NOT NULL,
    seq     bigint      NOT NULL,
    subject text        NOT NULL,
    reason  text        NOT NULL,
    data    bytea       NOT NULL,
    headers jsonb       NOT NULL DEFAULT '{}',
    at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, seq)
);

-- Agent messages (BB_MSG); written by the messaging handler.
CREATE TABLE bb_messages (
    stream         text        NOT NULL,
    seq            bigint      NOT NULL,
    id             text,
    sender         text,
    recipients     text[]      NOT NULL DEFAULT '{}',
    kind           text,
    board          text,
    topic          text,
    type           text,
    body           jsonb,
    correlation_id text,
    subject        text        NOT NULL,
    created_at     timestamptz,
    stored_at      timestamptz NOT NULL,
    search_text    text        NOT NULL DEFAULT '',
    tsv            tsvector    GENERATED ALWAYS AS (to_tsvector('english', search_text)) STORED,
    PRIMARY KEY (stream, seq)
);
CREATE INDEX bb_messages_board ON bb_messages (board, stored_at);
CREATE INDEX bb_messages_sender ON bb_messages (sender, stored_at);
CREATE INDEX bb_messages_correlation ON bb_messages (correlation_id);
CREATE INDEX bb_messages_tsv ON bb_messages USING gin (tsv);

-- Consensus voting (BB_VOTE); written by the voting handler.
CREATE TABLE bb_proposals (
    stream      text        NOT NULL,
    seq         bigint      NOT NULL,
    board       text        NOT NULL,
    proposal_id text        NOT NULL,
    proposer    text,
    body        jsonb       NOT NULL,
    created_at  timestamptz,
    deadline    timestamptz,
    stored_at   timestamptz NOT NULL,
    PRIMARY KEY (stream, seq),
    UNIQUE (board, proposal_id)
);
CREATE TABLE bb_ballots (
    stream      text        NOT NULL,
    seq         bigint      NOT NULL,
    board       text        NOT NULL,
    proposal_id text        NOT NULL,
    voter       text,
    body        jsonb       NOT NULL,
    created_at  timestamptz,
    stored_at   timestamptz NOT NULL,
    PRIMARY KEY (stream, seq)
);
CREATE INDEX bb_ballots_proposal ON bb_ballots (board, proposal_id);
CREATE TABLE bb_outcomes (
    stream      text        NOT NULL,
    seq         bigint      NOT NULL,
    board       text        NOT NULL,
    proposal_id text        NOT NULL,
    body        jsonb       NOT NULL,
    decided_at  timestamptz,
    stored_at   timestamptz NOT NULL,
    PRIMARY KEY (stream, seq),
    UNIQUE (board, proposal_id)
);
