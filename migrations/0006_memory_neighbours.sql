-- 0006: memories in board order, for hybrid search's neighbour context.
--
-- Hybrid memory search looks up each candidate's previous and next memory on
-- its board by (created_at, mid). With mid in the index the lookup is one
-- index probe, also when many memories share a timestamp; the new index
-- covers every query the old (board, created_at) one served, so that one goes
-- (no extra index work per ingested memory).
CREATE INDEX IF NOT EXISTS bb_memories_board_order ON bb_memories (board, created_at, mid);
DROP INDEX IF EXISTS bb_memories_board;
