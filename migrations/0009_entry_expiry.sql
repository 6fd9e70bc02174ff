-- 0009: board entries written with a TTL carry their expiry.
--
-- nats-server removes an expired key and leaves a delete marker for
-- board.expiry_marker_ttl (1 s by default); a worker that reads the marker
-- stores it as a purge. A worker that lags by more than the marker's lifetime
-- never sees it, and the entry would stay current in PostgreSQL. The revision
-- now records when it expires (its stored_at plus its Nats-TTL), the current
-- state keeps it, and entry searches skip expired entries: right whether or
-- not the marker was read. NULL: no TTL. (Adding a nullable column without a
-- default rewrites nothing.)
ALTER TABLE bb_entry_revisions ADD COLUMN expires_at timestamptz;
ALTER TABLE bb_entries ADD COLUMN expires_at timestamptz;
