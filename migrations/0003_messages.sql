-- 0003: agent messages. What 0001's bb_messages left out of the envelope
-- (metadata, the reply subject, bodies JSON cannot hold), and indexes for the
-- message search filters (recipient, type, time, id).
ALTER TABLE bb_messages
    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN body_raw bytea,
    ADD COLUMN reply_to text;
CREATE INDEX bb_messages_recipients ON bb_messages USING gin (recipients);
CREATE INDEX bb_messages_type ON bb_messages (type, stored_at);
CREATE INDEX bb_messages_stored ON bb_messages (stored_at);
CREATE INDEX bb_messages_id ON bb_messages (id);
