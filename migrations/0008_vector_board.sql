-- 0008: the vector tables carry the item's board.
--
-- A board filter on semantic search used to be checked by a join probe into
-- bb_memories / bb_entries for every row the HNSW scan visited (a board with
-- 5% of the items: ~1,000 probes to find 50 of its own). With the board in
-- the vector table the filter is applied inside the scan, and a covering
-- (board) INCLUDE (item, embedding) index lets a small board be scanned
-- exactly, one index-only pass over its own vectors (see blackboard/db/spaces.py,
-- which creates new spaces this way).
--
-- Existing space tables are rebuilt rather than updated in place: an UPDATE of
-- every row would insert each row again into the HNSW index (milliseconds a
-- row; minutes at 100k). The copy keeps only vectors whose item still exists;
-- the HNSW index is built once over the new table (at 100k vectors, 20-90 s
-- depending on maintenance_work_mem).

DO $$
DECLARE
    sp record;
    kind text;
    t text;
    src text;
BEGIN
    FOR sp IN SELECT id, dims FROM bb_embedding_spaces ORDER BY id LOOP
        FOREACH kind IN ARRAY ARRAY['memories', 'entries'] LOOP
            t := format('bb_vec_%s_%s', sp.id, kind);
            CONTINUE WHEN to_regclass(quote_ident(t)) IS NULL;
            CONTINUE WHEN EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(quote_ident(t))
                                  AND attname = 'board' AND NOT attisdropped);
            src := CASE kind WHEN 'memories' THEN 'SELECT mid AS id, board FROM bb_memories'
                             ELSE 'SELECT eid AS id, board FROM bb_entries' END;
            EXECUTE format('ALTER TABLE %I RENAME TO %I', t, t || '_old');
            EXECUTE format('ALTER INDEX %I RENAME TO %I', t || '_pkey', t || '_old_pkey');
            EXECUTE format('ALTER INDEX IF EXISTS %I RENAME TO %I', t || '_hnsw', t || '_old_hnsw');
            EXECUTE format('CREATE TABLE %I (item bigint PRIMARY KEY, revision bigint NOT NULL, '
                           'board text NOT NULL, embedding vector(%s) NOT NULL)', t, sp.dims);
            EXECUTE format('INSERT INTO %I (item, revision, board, embedding) '
                           'SELECT v.item, v.revision, b.board, v.embedding FROM %I v JOIN (%s) b ON b.id = v.item '
                           'ORDER BY v.item', t, t || '_old', src);
            EXECUTE format('DROP TABLE %I', t || '_old');
            EXECUTE format('CREATE INDEX %I ON %I USING hnsw (embedding vector_cosine_ops)', t || '_hnsw', t);
            EXECUTE format('CREATE INDEX %I ON %I (board) INCLUDE (item, embedding)', t || '_board', t);
        END LOOP;
    END LOOP;
END $$;
