-- 0016: supersession and contradictions of keyed memories
-- (docs/memory-lifecycle.md, "Keys and supersession" and "Contradictions";
-- blackboard/worker/supersession.py, blackboard/worker/contradictions.py).
--
-- checked_seq: the version (stream sequence) of a keyed memory whose place in
-- its key's versions has been settled (superseding, or contesting, the current
-- version). A redelivered batch finds it equal to seq and settles nothing twice;
-- a new version of the same id (a higher seq) is settled afresh. NULL: never
-- settled (a row without a subject key, or one stored before this migration).
ALTER TABLE bb_memories ADD COLUMN checked_seq bigint;

-- A contradiction sent to a vote (memory.contradictions = 'vote'): the
-- challenger (a newer memory on the key, by another agent, saying something
-- else) is stored with contested_by = proposal_id while the incumbent (the
-- current version when the challenger was settled) stays current. The worker
-- publishes the proposal from here (proposed_at NULL: not yet: an outbox that
-- survives a crash between the ingest transaction and the publish), and the
-- stored outcome settles it (decided_at, winner) in the transaction that
-- stores the outcome.
CREATE TABLE IF NOT EXISTS bb_memory_contests (
    board          text        NOT NULL,
    proposal_id    text        NOT NULL,
    subject_key    text        NOT NULL,
    challenger     text        NOT NULL,
    challenger_seq bigint      NOT NULL,
    incumbent      text        NOT NULL,
    incumbent_seq  bigint      NOT NULL,
    opened_at      timestamptz NOT NULL DEFAULT now(),
    proposed_at    timestamptz,
    decided_at     timestamptz,
    winner         text,
    PRIMARY KEY (board, proposal_id)
);
-- The outbox: contests whose proposal is not published yet.
CREATE INDEX IF NOT EXISTS bb_memory_contests_unproposed ON bb_memory_contests (opened_at)
    WHERE proposed_at IS NULL;
-- A challenger's contest (one per version of it).
CREATE INDEX IF NOT EXISTS bb_memory_contests_challenger ON bb_memory_contests (board, challenger, challenger_seq);
