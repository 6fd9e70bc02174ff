-- Consensus voting: what the voting handler needs beyond 0001's tables.
-- Ballot fates (recomputed with the pure tally whenever a proposal's rows
-- change), the decision columns of outcomes, and their application to the
-- target board entry. See docs/voting.md.

ALTER TABLE bb_proposals
    ADD COLUMN section  text,
    ADD COLUMN key      text,
    ADD COLUMN question text NOT NULL DEFAULT '',
    -- open | accepted | rejected | no_quorum (from the recorded outcome)
    ADD COLUMN status   text NOT NULL DEFAULT 'open';

ALTER TABLE bb_ballots
    ADD COLUMN ballot_id text,
    -- a candidate index as text, 'reject' or 'abstain'
    ADD COLUMN choice    text,
    -- counted | superseded | rejected; NULL until classified
    ADD COLUMN status    text,
    -- why a rejected ballot was not counted: ineligible, unknown_proposal,
    -- closed, late, invalid_choice, duplicate
    ADD COLUMN reason    text;
CREATE INDEX bb_ballots_fate ON bb_ballots (board, proposal_id, status);

ALTER TABLE bb_outcomes
    ADD COLUMN section       text,
    ADD COLUMN key           text,
    ADD COLUMN status        text,
    ADD COLUMN candidate     integer,
    ADD COLUMN value         jsonb,
    ADD COLUMN closed_by     text,
    ADD COLUMN deciding_seq  bigint,
    -- the target entry's revision when the outcome was recorded
    ADD COLUMN base_revision bigint,
    -- the revision that applied an accepted outcome, and the .applied message
    ADD COLUMN revision      bigint,
    ADD COLUMN applied_seq   bigint,
    ADD COLUMN applied_at    timestamptz;
