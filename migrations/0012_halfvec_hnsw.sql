-- 0012: the HNSW index of each vector table is built on the vectors cast to
-- halfvec; past 512 dimensions the board index no longer carries the vector.
--
-- The tables keep their vector(dims) column (exact scores, exact board scans);
-- only the index changes, to (embedding::halfvec(dims)) halfvec_cosine_ops, and
-- the searches order by that expression (blackboard/db/spaces.py, ann_order).
-- Measured at 100k MiniLM vectors (bench/hnsw_recall.py and an insert test, the
-- two indexes alternating): an insert costs ~2.4 ms of PostgreSQL CPU instead of
-- 3.1-3.3 ms, a scan is 10-25% faster, recall@10 at ef_search 100 is unchanged
-- (0.975-0.979 against 0.974-0.975), and the index is half the size. It also
-- indexes up to 4,000 dimensions, where vector's HNSW stops at 2,000.
--
-- The old index is dropped and the new one built in this migration's
-- transaction, which holds the vector table's lock until it commits: searches
-- and vector writes wait for the build (at 100k vectors ~25-35 s with the
-- maintenance_work_mem set here). On a large table, run `blackboard migrate`
-- at a quiet time before starting the upgraded workers.
--
-- The covering board index (board) INCLUDE (item, embedding) cannot hold a
-- vector of more than ~600 dimensions (a btree entry is at most 2,704 bytes):
-- every insert into a space of a 768- or 1,536-dimension model failed. Such a
-- space's board index becomes (board) INCLUDE (item), as spaces.board_index now
-- creates it; its tables are empty, since no vector could be written.

SET LOCAL maintenance_work_mem = '512MB';

DO $$
DECLARE
    sp record;
    kind text;
    t text;
BEGIN
    FOR sp IN SELECT id, dims FROM bb_embedding_spaces ORDER BY id LOOP
        FOREACH kind IN ARRAY ARRAY['memories', 'entries'] LOOP
            t := format('bb_vec_%s_%s', sp.id, kind);
            CONTINUE WHEN to_regclass(quote_ident(t)) IS NULL;
            EXECUTE format('DROP INDEX IF EXISTS %I', t || '_hnsw');
            EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::halfvec(%s)) halfvec_cosine_ops)',
                           t || '_hnsw', t, sp.dims);
            IF sp.dims > 512 THEN
                EXECUTE format('DROP INDEX IF EXISTS %I', t || '_board');
                EXECUTE format('CREATE INDEX %I ON %I (board) INCLUDE (item)', t || '_board', t);
            END IF;
        END LOOP;
    END LOOP;
END $$;
