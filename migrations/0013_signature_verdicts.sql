-- 0013: the signature verdict of every stored record (docs/security.md, "Signatures").
--
-- The worker checks each record's signature once, at ingest, and stores the
-- verdict beside the row: 'verified', or 'unsigned' for a record that carries
-- no signature and was stored anyway (worker.require_signatures = false, a
-- worker on an open bus without a credential, worker.verify = false, or a
-- delete marker the server itself wrote). Any other verdict is a dead letter,
-- never a row. Rows stored before this migration were never checked: they
-- are 'unsigned'. Search hits and history reads carry the column.
--
-- A column with a constant default is added without rewriting the table.
ALTER TABLE bb_entry_revisions ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_entries ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_memories ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_memory_forgets ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_messages ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_proposals ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_ballots ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
ALTER TABLE bb_outcomes ADD COLUMN verdict text NOT NULL DEFAULT 'unsigned';
