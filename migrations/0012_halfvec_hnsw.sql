-- 0012: the HNSW index of each vector table is built on the vectors cast to
-- halfvec; past 512 dimensions the board index no longer carries the vector.
--
-- The tables keep their vector(dims) column (exact scores, exact board scans);
-- only the index changes, to (embedding::halfvec(dims)) halfvec_cosine_ops, and
-- the searches order by that expression (blackboard/db/spaces.py, ann_order).
-- Measured at 100k MiniLM vectors (bench/hnsw_recall.py and an insert test, the
-- two indexes alternating): an insert costs ~2.4 ms of PostgreSQL CPU instead of
-- 3.1-3.3 ms, a scan is 10-25% faster, recall@10 at ef_search 100 is unchanged
-- (0.975-0.979 against 0.974-0.975), and the index holds 2 bytes a dimension
-- instead of 4. It also indexes up to 4,000 dimensions, where vector's HNSW
-- stops at 2,000.
--
-- The old index is dropped and the new one built in this migration's
-- transaction, which holds the vector table's lock until it commits: searches
-- and vector writes wait for the build (at 100k vectors ~25-35 s here, with
-- 512 MB of maintenance_work_mem and a parallel build). On a large table, run `blackboard migrate`
-- at a quiet time before starting the upgraded workers.
--
-- The covering board index (board) INCLUDE (item, embedding) cannot hold a
-- vector of more than ~600 dimensions (a btree entry is at most 2,704 bytes):
-- every insert into a space of a 768- or 1,536-dimension model failed. Such a
-- space's board index becomes (board) INCLUDE (item), as spaces.board_index now
-- creates it; its tables are empty, since no vector could be written.

-- The build gets at least 512 MB of maintenance_work_mem (pgvector builds the
-- graph in memory when it fits). A parallel build takes that memory as shared
-- memory in /dev/shm, of which a container gets 64 MB unless told otherwise
-- (docker: shm_size): if the build cannot get it (disk_full / out_of_memory:
-- "could not resize shared memory segment"), the index is built serially.

DO $$
DECLARE
    sp record;
    kind text;
    t text;
BEGIN
    IF pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes('512MB') THEN
        PERFORM set_config('maintenance_work_mem', '512MB', true);
    END IF;
    FOR sp IN SELECT id, dims FROM bb_embedding_spaces ORDER BY id LOOP
        FOREACH kind IN ARRAY ARRAY['memories', 'entries'] LOOP
            t := format('bb_vec_%s_%s', sp.id, kind);
            CONTINUE WHEN to_regclass(quote_ident(t)) IS NULL;
            EXECUTE format('DROP INDEX IF EXISTS %I', t || '_hnsw');
            BEGIN
                EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::halfvec(%s)) halfvec_cosine_ops)',
                               t || '_hnsw', t, sp.dims);
            EXCEPTION WHEN disk_full OR out_of_memory THEN
                RAISE WARNING 'parallel build of %_hnsw failed (%): building it serially; give PostgreSQL a /dev/shm larger than maintenance_work_mem', t, SQLERRM;
                PERFORM set_config('max_parallel_maintenance_workers', '0', true);
                EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::halfvec(%s)) halfvec_cosine_ops)',
                               t || '_hnsw', t, sp.dims);
            END;
            IF sp.dims > 512 THEN
                EXECUTE format('DROP INDEX IF EXISTS %I', t || '_board');
                EXECUTE format('CREATE INDEX %I ON %I (board) INCLUDE (item)', t || '_board', t);
            END IF;
        END LOOP;
    END LOOP;
END $$;
