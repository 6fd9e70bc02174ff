-- 0007: a lighter hand-off from ingest to the embedding stage.
--
-- An ingest transaction used to insert one bb_embed_queue row per changed
-- item (a heap row and two index entries each: ~10 µs of PostgreSQL CPU per
-- entry, a sixth of the whole write). It now inserts one inbox row per batch
-- holding the ids of the items it changed. The embedding stage, which is bound
-- by the model, moves inbox rows into bb_embed_queue (one row per item,
-- re-enqueueing items already there) before it claims work; the queue's
-- leases, attempts and re-enqueue rules are unchanged. Both steps are
-- transactional, so a crash anywhere loses no item.
CREATE TABLE bb_embed_inbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_type   text        NOT NULL CHECK (item_type IN ('memory', 'entry')),
    items       bigint[]    NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
