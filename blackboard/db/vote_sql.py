"""SQL of the voting handler (constants; the worker binds the values).

Rows are inserted idempotently on (stream, seq). An outcome row is keyed by
(board, proposal_id) and can be created by either of its two messages (the
recorded outcome and its application), whichever a worker commits first.
Ballot fates are recomputed under a per-proposal advisory lock, so the last
transaction that touches a proposal sees all of its committed rows.
"""

from __future__ import annotations

__all__ = [
    "INSERT_APPLIED",
    "INSERT_BALLOT",
    "INSERT_OUTCOME",
    "INSERT_PROPOSAL",
    "LOCK_PROPOSAL",
    "SELECT_BALLOTS",
    "SELECT_PROPOSAL",
    "UPDATE_FATES",
    "UPDATE_PROPOSAL_STATUS",
]

INSERT_PROPOSAL = """
INSERT INTO bb_proposals (stream, seq, board, proposal_id, proposer, body, created_at, deadline, stored_at,
                          section, key, question, verdict)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING"""

INSERT_BALLOT = """
INSERT INTO bb_ballots (stream, seq, board, proposal_id, voter, body, created_at, stored_at, ballot_id, choice,
                        verdict)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (stream, seq) DO NOTHING"""

_OUTCOME_COLUMNS = """stream, seq, board, proposal_id, body, decided_at, stored_at, section, key, status,
                         candidate, value, closed_by, deciding_seq, verdict"""

#: The recorded outcome. A row made first from the application message
#: (seq = applied_seq) takes the outcome message's sequence, base revision and
#: verdict (the row's verdict is the outcome message's once it is stored).
INSERT_OUTCOME = f"""
INSERT INTO bb_outcomes AS o ({_OUTCOME_COLUMNS}, base_revision)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (board, proposal_id) DO UPDATE SET
    seq = EXCLUDED.seq, stored_at = EXCLUDED.stored_at, base_revision = EXCLUDED.base_revision,
    verdict = EXCLUDED.verdict
WHERE o.seq = o.applied_seq"""

#: The application: sets the revision (creating the row if the outcome
#: message has not been stored yet).
INSERT_APPLIED = f"""
INSERT INTO bb_outcomes AS o ({_OUTCOME_COLUMNS}, revision, applied_seq, applied_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (board, proposal_id) DO UPDATE SET
    revision = EXCLUDED.revision, applied_seq = EXCLUDED.applied_seq, applied_at = EXCLUDED.applied_at,
    body = EXCLUDED.body
WHERE o.applied_seq IS NULL"""

#: Serialises the transactions that touch one proposal (key: "<board>.<proposal>").
LOCK_PROPOSAL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 4242))"

SELECT_PROPOSAL = """
SELECT seq, body FROM bb_proposals WHERE board = %s AND proposal_id = %s ORDER BY seq LIMIT 1"""

SELECT_BALLOTS = """
SELECT seq, stored_at, body FROM bb_ballots WHERE board = %s AND proposal_id = %s ORDER BY seq"""

UPDATE_FATES = """
UPDATE bb_ballots AS b SET status = u.status, reason = u.reason
FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS u(seq, status, reason)
WHERE b.stream = %s AND b.seq = u.seq
  AND (b.status IS DISTINCT FROM u.status OR b.reason IS DISTINCT FROM u.reason)"""

UPDATE_PROPOSAL_STATUS = """
UPDATE bb_proposals AS p
SET status = coalesce((SELECT o.status FROM bb_outcomes o
                       WHERE o.board = p.board AND o.proposal_id = p.proposal_id), 'open')
WHERE p.board = %s AND p.proposal_id = %s"""
