"""SQL of supersession and contradictions (constants; the worker binds the values).

A subject key's versions are the memories of one ``(board, subject_key)`` in
valid-time order, ``(valid_from, seq)`` (the index ``bb_memories_subject_key``
of migration 0015). Transactions that change a key's versions hold its
advisory lock (:data:`LOCK_KEYS`, taken in hash order, before the rows are
written), so they settle one key one at a time whatever order their batches
commit in. Contradictions put to a vote live in ``bb_memory_contests``
(migration 0016). The logic is :mod:`blackboard.worker.supersession` and
:mod:`blackboard.worker.contradictions`; the model is docs/memory-lifecycle.md.
"""

from __future__ import annotations

__all__ = [
    "ADOPT_CONTEST",
    "CLEAR_VERSIONS",
    "DROP_CONTEST",
    "INSERT_CONTESTS",
    "LOAD_VERSIONS",
    "LOCK_KEYS",
    "MARK_DECIDED",
    "OLD_KEYS",
    "SELECT_CONTESTS_OF",
    "SELECT_OUTCOME",
    "SELECT_UNPROPOSED",
    "SETTLE_CHALLENGER",
    "UPDATE_VERSIONS",
]

#: Lock the keys ``%(boards)s``/``%(keys)s`` (parallel arrays) for the transaction, in hash
#: order (every writer takes them in that order: no deadlock between two of them).
LOCK_KEYS = """
SELECT pg_advisory_xact_lock(h) FROM (
    SELECT DISTINCT hashtextextended(b || E'\\n' || k, 2222) AS h
    FROM unnest(%(boards)s::text[], %(keys)s::text[]) AS s(b, k)
    ORDER BY h) locks"""

#: The stored keys and valid-time positions of memories by id (``%s``: ids), before a batch
#: replaces them: a new version of an id may move it, or take it to another key.
OLD_KEYS = """
SELECT id, board, subject_key, valid_from, seq FROM bb_memories
WHERE id = ANY(%s) AND subject_key IS NOT NULL AND valid_from IS NOT NULL"""

#: The versions of each key from a position on: from the version of the chain (neither
#: contested nor merged) just before (``%(froms)s``, ``%(seqs)s``), or from the start
#: when there is none, in key then valid-time order.
LOAD_VERSIONS = """
SELECT m.board, m.subject_key, m.mid, m.id, m.seq, m.agent, m.valid_from, m.content_hash, m.valid_to,
       m.superseded_by, m.contested_by, m.checked_seq, m.merged_into IS NOT NULL AS merged,
       m.archived_at IS NOT NULL AS archived
FROM unnest(%(boards)s::text[], %(keys)s::text[], %(froms)s::timestamptz[], %(seqs)s::bigint[])
     AS s(board, key, vf, seq)
LEFT JOIN LATERAL (
    SELECT p.valid_from, p.seq FROM bb_memories p
    WHERE p.board = s.board AND p.subject_key = s.key AND (p.valid_from, p.seq) < (s.vf, s.seq)
      AND p.contested_by IS NULL AND p.merged_into IS NULL
    ORDER BY p.valid_from DESC, p.seq DESC
    LIMIT 1) pred ON true
JOIN LATERAL (
    SELECT * FROM bb_memories m
    WHERE m.board = s.board AND m.subject_key = s.key
      AND (m.valid_from, m.seq) >= (coalesce(pred.valid_from, '-infinity'), coalesce(pred.seq, 0))) m ON true
ORDER BY m.board, m.subject_key, m.valid_from, m.seq"""

#: A memory written again without a subject key (``%(ids)s``/``%(seqs)s``: the versions
#: written) is no version: neither closed nor contested.
CLEAR_VERSIONS = """
UPDATE bb_memories m SET valid_to = NULL, superseded_by = NULL, contested_by = NULL, checked_seq = NULL
FROM unnest(%(ids)s::text[], %(seqs)s::bigint[]) AS w(id, seq)
WHERE m.id = w.id AND m.seq = w.seq AND m.subject_key IS NULL"""

#: Set the version columns of memories (parallel arrays by mid), in mid order.
UPDATE_VERSIONS = """
UPDATE bb_memories m SET valid_to = u.valid_to, superseded_by = u.superseded_by,
                         contested_by = u.contested_by, checked_seq = u.checked_seq
FROM (SELECT * FROM unnest(%(mids)s::bigint[], %(valid_to)s::timestamptz[], %(superseded_by)s::text[],
                           %(contested_by)s::text[], %(checked_seq)s::bigint[])
               AS t(mid, valid_to, superseded_by, contested_by, checked_seq)
      ORDER BY mid) u
WHERE m.mid = u.mid"""

#: Open contests (parallel arrays), once each.
INSERT_CONTESTS = """
INSERT INTO bb_memory_contests (board, proposal_id, subject_key, challenger, challenger_seq, incumbent,
                                incumbent_seq)
SELECT * FROM unnest(%(boards)s::text[], %(pids)s::text[], %(keys)s::text[], %(challengers)s::text[],
                     %(challenger_seqs)s::bigint[], %(incumbents)s::text[], %(incumbent_seqs)s::bigint[])
ON CONFLICT DO NOTHING"""

#: Contests whose proposal is not published yet (the outbox), oldest first, with both
#: memories as stored (NULL columns: the memory is gone, or is another version now).
SELECT_UNPROPOSED = """
SELECT c.board, c.proposal_id, c.subject_key, c.challenger, c.challenger_seq, c.incumbent, c.incumbent_seq,
       ch.text AS challenger_text, ch.agent AS challenger_agent, ch.valid_from AS challenger_from,
       inc.text AS incumbent_text, inc.agent AS incumbent_agent, inc.valid_from AS incumbent_from
FROM bb_memory_contests c
LEFT JOIN bb_memories ch ON ch.id = c.challenger AND ch.board = c.board AND ch.seq = c.challenger_seq
LEFT JOIN bb_memories inc ON inc.id = c.incumbent AND inc.board = c.board
WHERE c.proposed_at IS NULL
ORDER BY c.opened_at
LIMIT %(n)s"""

#: The contest's proposal is published (or found published by a worker) under ``%(pid)s``
#: (its id, or a free one when another identity took that id first): the contest and its
#: challenger take that id. Params: board, old, pid.
ADOPT_CONTEST = """
WITH c AS (
    UPDATE bb_memory_contests SET proposal_id = %(pid)s, proposed_at = now()
    WHERE board = %(board)s AND proposal_id = %(old)s AND proposed_at IS NULL
    RETURNING board, challenger, challenger_seq)
UPDATE bb_memories m SET contested_by = %(pid)s
FROM c WHERE m.board = c.board AND m.id = c.challenger AND m.seq = c.challenger_seq
  AND m.contested_by = %(old)s AND %(pid)s <> %(old)s"""

#: Forget an unpublished contest whose challenger is gone (or is another version now).
DROP_CONTEST = """
DELETE FROM bb_memory_contests WHERE board = %(board)s AND proposal_id = %(pid)s AND proposed_at IS NULL"""

#: The published contests of proposals (``%(boards)s``, ``%(pids)s``), with the key and
#: position of their challenger as stored (NULL: gone, or another version now).
SELECT_CONTESTS_OF = """
SELECT c.board, c.proposal_id, c.subject_key, c.challenger, c.challenger_seq, c.incumbent,
       m.valid_from AS challenger_from, m.contested_by AS challenger_contested_by,
       EXISTS (SELECT 1 FROM bb_memories i WHERE i.board = c.board AND i.id = c.incumbent) AS incumbent_exists
FROM unnest(%(boards)s::text[], %(pids)s::text[]) AS s(board, pid)
JOIN bb_memory_contests c ON c.board = s.board AND c.proposal_id = s.pid
LEFT JOIN bb_memories m ON m.board = c.board AND m.id = c.challenger AND m.seq = c.challenger_seq
WHERE c.proposed_at IS NOT NULL"""

#: The stored outcome of a proposal (board, proposal_id): status, value, decided_at.
SELECT_OUTCOME = "SELECT status, value, decided_at FROM bb_outcomes WHERE board = %s AND proposal_id = %s"

#: Settle a contest's challenger (the version contested by the proposal): a winner joins its
#: key's versions (contested_by cleared); a loser is closed at its own valid_from (never
#: valid), superseded by the winner, and keeps contested_by (the vote that rejected it).
#: Params: won, winner, board, challenger, seq, pid.
SETTLE_CHALLENGER = """
UPDATE bb_memories SET
    contested_by = CASE WHEN %(won)s THEN NULL ELSE contested_by END,
    valid_to = CASE WHEN %(won)s THEN NULL ELSE valid_from END,
    superseded_by = CASE WHEN %(won)s THEN NULL ELSE %(winner)s END
WHERE board = %(board)s AND id = %(challenger)s AND seq = %(seq)s AND contested_by = %(pid)s"""

#: Record a contest's decision. Params: board, pid, decided_at, winner.
MARK_DECIDED = """
UPDATE bb_memory_contests SET decided_at = %(decided_at)s, winner = %(winner)s
WHERE board = %(board)s AND proposal_id = %(pid)s"""
