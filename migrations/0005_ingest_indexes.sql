-- 0005: lighter write path for board entries.
--
-- bb_entry_revisions_stored duplicated bb_entry_revisions_key: the as-of-time
-- read orders by seq (bb_entry_revisions_key serves it, filtering stored_at
-- while it walks one key's revisions newest first), and nothing else reads by
-- stored_at. One fewer index entry per revision on the ingest hot path.
DROP INDEX IF EXISTS bb_entry_revisions_stored;
