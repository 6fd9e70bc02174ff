-- 0017: contextual indexing of threaded memories (blackboard/worker/embed_text.py).
--
-- A memory whose metadata names a thread (metadata.thread) is embedded with the
-- text of the memory just before it on the same board and thread, by
-- (created_at, mid) (blackboard/db/embed_sql.py CONTEXT). This partial index
-- makes that lookup one probe; memories without a thread are not in it.
CREATE INDEX IF NOT EXISTS bb_memories_thread
    ON bb_memories (board, (metadata -> 'thread'), created_at, mid)
    WHERE metadata ? 'thread';
