-- 0011: the GIN indexes that searches read keep a short pending list.
--
-- With fastupdate (PostgreSQL's default) a GIN index queues new rows in a
-- pending list and merges them into the index when the list passes
-- gin_pending_list_limit (4 MB by default) or a vacuum runs. Every scan of the
-- index reads the whole list, so under steady ingest a search pays for a list
-- that grows from 0 to 4 MB and back: at 100k memories, with 11,000 rows
-- pending (3.5 MB), keyword search took 8.8 ms p50 unfiltered and 13.8 ms with a
-- board filter, against 4.0 and 4.5 ms once the list was merged. A 128 kB list
-- (~300 rows) costs a scan well under 1 ms; the merge work is the same, in
-- smaller steps (ingest throughput and PostgreSQL CPU per entry were unchanged
-- within noise in alternating runs). Changing the setting takes no lock that
-- blocks reads or writes.
ALTER INDEX bb_memories_board_tsv SET (gin_pending_list_limit = 128);
ALTER INDEX bb_memories_tags SET (gin_pending_list_limit = 128);
ALTER INDEX bb_memories_metadata SET (gin_pending_list_limit = 128);
ALTER INDEX bb_entries_board_tsv SET (gin_pending_list_limit = 128);
ALTER INDEX bb_entries_tags SET (gin_pending_list_limit = 128);
ALTER INDEX bb_entries_metadata SET (gin_pending_list_limit = 128);
ALTER INDEX bb_messages_tsv SET (gin_pending_list_limit = 128);
ALTER INDEX bb_messages_recipients SET (gin_pending_list_limit = 128);
