"""SQL of exact deduplication at ingest and of the provenance of merged memories.

A batch of memories is COPYed into ``bb_stage_memories`` (:mod:`.ingest_sql`);
with deduplication on (``memory.dedup``), the worker then runs, in the batch's
transaction, before ``MOVE_MEMORIES``:

1. ``LOCK_MEMORIES_FOR_DEDUP`` and ``LOCK_DEDUP_KEYS``: transaction-scoped
   advisory locks on the batch's boards (shared) and ids (see
   :func:`blackboard.worker.dedup.id_locks`), so that two batches writing the
   same id commit one after the other.
2. ``DROP_STALE_SOURCES``: a staged memory already merged (exactly) at this
   version or a later one (a redelivery) is dropped from the stage; a newer
   version of such a merged id drops that source (the kept memory's
   ``seen_count`` - 1, by ``RELEASE_SOURCES`` once the rows are locked) and is
   ingested afresh. (A near-duplicate merged away is
   still a row, archived: ``MOVE_MEMORIES`` stores its newer version and
   ``worker.derived.revive_merged`` makes it live again.)
3. ``MERGE_STAGED``: a new memory (its id not stored) whose text hash matches a
   live memory of its scope (same subject key; for a keyed memory, the current
   version, valid from no later than it) is a duplicate. Of the new memories of
   one scope and text that match nothing, the first (by valid time for a keyed
   one, then by stream order: the leader) stays staged and the others (the
   followers) are duplicates too. Duplicates are set aside in
   ``bb_dedup_followers``.
4. ``LOCK_DEDUP_KEYS`` on the leaders' texts (:func:`blackboard.worker.dedup.text_locks`),
   then ``MERGE_LEADERS``: a leader whose text a concurrent batch has stored
   since (it committed before the lock was granted) is set aside as well. Only
   new texts are locked, so batches that merely repeat what is stored do not
   wait for each other.

``LOCK_ROWS`` locks the stored rows the batch will update, in one order;
``MOVE_MEMORIES`` then stores what is staged, and ``MERGE_FOLLOWERS`` merges
what was set aside into the live memory of its text: no row, a
``bb_memory_sources`` row (``how = 'exact'``), the kept memory's ``seen_count``
+ 1 and ``last_seen`` the greatest (conditional on its still being live with
that text; one that finds none is put back and stored after all). The kept
rows are updated last, so they stay locked only for the end of the transaction.

Forgets: ``FORGET_MERGED`` (before ``DELETE_FORGOTTEN``) removes the source row
of a forgotten merged id (``seen_count`` - 1) and, for a forgotten kept memory,
leaves tombstones for its sources (so a late or replayed copy of one does not
come back as a memory of its own) and deletes the near-duplicates archived
into it; its sources' rows go with it (``ON DELETE CASCADE``).
"""

from __future__ import annotations

__all__ = [
    "CREATE_FOLLOWERS",
    "DROP_STALE_SOURCES",
    "FORGET_MERGED",
    "LOCK_DEDUP_KEYS",
    "LOCK_MEMORIES_FOR_DEDUP",
    "LOCK_ROWS",
    "MERGE_FOLLOWERS",
    "MERGE_LEADERS",
    "MERGE_STAGED",
    "RELEASE_SOURCES",
]

#: Taken by a batch without forgets before its dedup locks: the forget path takes
#: ``SHARE ROW EXCLUSIVE`` on the table and then its dedup locks, so every
#: batch takes the table lock first (one lock order, no deadlock).
LOCK_MEMORIES_FOR_DEDUP = "LOCK TABLE bb_memories IN ROW EXCLUSIVE MODE"

#: The advisory locks of a batch, in the order given (sorted by the caller):
#: arrays of lock spaces, keys, and whether each is taken shared.
LOCK_DEDUP_KEYS = """
SELECT count(*) FROM (
    SELECT CASE WHEN t.shared THEN pg_advisory_xact_lock_shared(t.space, t.key)
                ELSE pg_advisory_xact_lock(t.space, t.key) END
    FROM unnest(%s::int[], %s::int[], %s::boolean[]) WITH ORDINALITY AS t(space, key, shared, ord)
    ORDER BY t.ord
) l"""

#: Followers: new memories of the batch that duplicate an earlier one of the
#: same batch, merged once that one is stored.
CREATE_FOLLOWERS = """
CREATE TEMP TABLE IF NOT EXISTS bb_dedup_followers (LIKE bb_stage_memories) ON COMMIT DELETE ROWS"""

#: What deduplication reads of a staged memory (its row is copied by ``ctid``).
_KEYS = "s.ctid AS at, s.id, s.seq, s.board, s.agent, s.subject_key, s.content_hash, s.occurred_at, s.created_at, s.source"

#: The staged versions the ingest would store: the newest of each id, unless forgotten.
_LATEST = f"""
SELECT DISTINCT ON (s.id) {_KEYS}
FROM bb_stage_memories s
-- a probe per row (LATERAL ... LIMIT 1), whatever the planner thinks of the tombstones
CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM bb_memory_forgets f
                    WHERE f.id = s.id AND f.board = s.board AND f.seq > s.seq LIMIT 1) f) f
WHERE f.n = 0
ORDER BY s.id, s.seq DESC"""

DROP_STALE_SOURCES = """
WITH src AS (
    -- (a forgotten staged version needs no care here: its tombstone removes the source)
    SELECT l.id, l.seq AS new_seq, x.seq AS src_seq
    FROM (SELECT id, max(seq) AS seq FROM bb_stage_memories GROUP BY id) l
    CROSS JOIN LATERAL (SELECT x.seq FROM bb_memory_sources x WHERE x.id = l.id AND x.how = 'exact' LIMIT 1) x
), done AS (
    -- merged at this version or a later one: nothing to store
    DELETE FROM bb_stage_memories st USING src
    WHERE st.id = src.id AND src.src_seq >= src.new_seq
), stale AS (
    -- a newer version of a merged id: it is no longer that memory's source
    DELETE FROM bb_memory_sources x USING src
    WHERE x.id = src.id AND src.src_seq < src.new_seq
    RETURNING x.mid
)
SELECT array_agg(mid) FROM stale"""

#: The memories that lost sources (``mids``, one per source, from
#: ``DROP_STALE_SOURCES``) are seen once less each (after ``LOCK_ROWS``).
RELEASE_SOURCES = """
UPDATE bb_memories m SET seen_count = greatest(1, m.seen_count - d.n)
FROM (SELECT mid, count(*)::int AS n FROM unnest(%(mids)s::bigint[]) AS u(mid) GROUP BY mid ORDER BY mid) d
WHERE m.mid = d.mid"""


def _match(new: str, per_agent: str) -> str:
    """The live memory a new memory ``new`` merges into (one ``mid`` row, or none)."""
    return f"""
    SELECT m.mid FROM bb_memories m
    WHERE m.board = {new}.board AND m.content_hash = {new}.content_hash AND m.archived_at IS NULL
      AND ({per_agent} IS NOT TRUE OR m.agent = {new}.agent)
      AND m.subject_key IS NOT DISTINCT FROM {new}.subject_key
      AND ({new}.subject_key IS NULL
           OR (m.valid_to IS NULL AND coalesce(m.valid_from, m.created_at) <= coalesce({new}.occurred_at, {new}.created_at)))
      AND m.id <> {new}.id
    ORDER BY m.mid LIMIT 1"""


def _merge() -> str:
    """CTEs ``bump`` (the kept memories' counts, conditional on their still being live
    with that text) and ``merged`` (the source rows written; RETURNING ``id``) for the
    rows of a CTE ``hit``: new memories (the stage's columns) and the ``kept`` memory each
    merges into."""
    return """
bump AS (
    UPDATE bb_memories m SET seen_count = m.seen_count + h.n, last_seen = greatest(m.last_seen, h.last)
    FROM (SELECT kept, content_hash, count(*)::int AS n, max(created_at) AS last
          FROM hit GROUP BY kept, content_hash ORDER BY kept) h
    WHERE m.mid = h.kept AND m.archived_at IS NULL AND m.content_hash = h.content_hash
    RETURNING m.mid
), merged AS (
    INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, sig_key, sig, verdict, how)
    SELECT h.id, h.kept, h.board, h.agent, h.stream, h.seq, h.created_at, h.sig_key, h.sig, h.verdict, 'exact'
    FROM hit h WHERE h.kept IN (SELECT mid FROM bump)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)"""


#: Set aside (in ``bb_dedup_followers``) the staged new memories that duplicate a
#: stored live one, and the followers (see the module's docstring); they are merged
#: once the batch is stored (``MERGE_FOLLOWERS``), so that the kept memories' rows
#: are locked for the end of the transaction only. Params: ``per_agent`` (bool),
#: ``unmerged_source``: the ``source`` of memories never merged (the worker's
#: derived merges, which take their sources' place: ``worker.derived``).
#: Returns the ids of the leaders (the new memories left to store, each the first of
#: its text in the batch; an array, NULL when none), the number set aside, the
#: memories the duplicates of stored memories merge into (``mid``s, NULL when none),
#: and the number of staged ids already stored (``MOVE_MEMORIES`` replaces them).
MERGE_STAGED = f"""
WITH latest AS ({_LATEST}
), probed AS (
    -- each id probed (LATERAL ... LIMIT 1: one index probe per row, whatever the planner
    -- thinks): stored already, or new and then with the memory it duplicates
    SELECT l.*, e.n AS stored, k.mid AS kept FROM latest l
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM bb_memories m WHERE m.id = l.id LIMIT 1) e) e
    LEFT JOIN LATERAL ({_match("l", "%(per_agent)s::boolean")} ) k
        ON e.n = 0 AND l.content_hash IS NOT NULL AND l.source IS DISTINCT FROM %(unmerged_source)s
), new AS (
    SELECT * FROM probed
    WHERE content_hash IS NOT NULL AND stored = 0 AND source IS DISTINCT FROM %(unmerged_source)s
), ranked AS (
    SELECT n.*, row_number() OVER (
        PARTITION BY n.board, CASE WHEN %(per_agent)s THEN n.agent END, n.subject_key, n.content_hash
        ORDER BY CASE WHEN n.subject_key IS NOT NULL THEN coalesce(n.occurred_at, n.created_at) END, n.seq) AS rn
    FROM new n WHERE n.kept IS NULL
), aside AS (
    INSERT INTO bb_dedup_followers
    SELECT st.* FROM bb_stage_memories st
    WHERE st.ctid = ANY(ARRAY(SELECT at FROM new WHERE kept IS NOT NULL UNION ALL SELECT at FROM ranked WHERE rn > 1))
    RETURNING id
), gone AS (
    DELETE FROM bb_stage_memories st WHERE st.id IN (SELECT id FROM aside)
)
SELECT (SELECT array_agg(id) FROM ranked WHERE rn = 1), (SELECT count(*) FROM aside),
       (SELECT array_agg(DISTINCT kept) FROM new WHERE kept IS NOT NULL),
       (SELECT count(*) FROM probed WHERE stored > 0)"""

#: Lock, in ``mid`` order, the stored rows the rest of the batch will update: the
#: memories the duplicates merge into (``kept``) and the stored versions of the staged
#: ids (``MOVE_MEMORIES`` replaces them). Taken in one statement, in one order, they
#: cannot deadlock with another batch's (which a row updated by one statement and
#: another by the next could). Only a batch that replaces stored versions (or releases
#: sources) needs it: a batch that only adds memories updates stored rows in its last
#: statement alone (``MERGE_FOLLOWERS``, in ``mid`` order), which keeps them locked for
#: the shortest time. Param: ``kept`` (bigint[]).
LOCK_ROWS = """
SELECT count(*) FROM (
    SELECT 1 FROM bb_memories m
    WHERE m.mid = ANY(%(kept)s::bigint[] || ARRAY(
        SELECT x.mid FROM bb_stage_memories s
        CROSS JOIN LATERAL (SELECT y.mid FROM bb_memories y WHERE y.id = s.id LIMIT 1) x))
    ORDER BY m.mid
    FOR NO KEY UPDATE OF m
) t"""

#: The leaders again (``ids``), once their texts are locked: one that now has a
#: live memory to merge into (stored by a batch that committed since) is set aside
#: too. Param: ``per_agent``. Returns the number set aside.
MERGE_LEADERS = f"""
WITH hit AS (
    SELECT s.at FROM (SELECT DISTINCT ON (s.id) {_KEYS} FROM bb_stage_memories s WHERE s.id = ANY(%(ids)s)
                      ORDER BY s.id, s.seq DESC) s
    WHERE EXISTS ({_match("s", "%(per_agent)s::boolean")})
), aside AS (
    INSERT INTO bb_dedup_followers
    SELECT st.* FROM bb_stage_memories st WHERE st.ctid = ANY(ARRAY(SELECT at FROM hit))
    RETURNING id
), gone AS (
    DELETE FROM bb_stage_memories st WHERE st.id IN (SELECT id FROM aside)
)
SELECT count(*) FROM aside"""

#: Merge the memories set aside into the live memories of their texts (stored
#: before, or by this batch: their leaders), and put back on the stage any that
#: found none (a kept memory archived or rewritten meanwhile; then stored by a second
#: ``MOVE_MEMORIES``). Param: ``per_agent``. Returns the number put back.
MERGE_FOLLOWERS = f"""
WITH hit AS (
    SELECT f.*, k.mid AS kept FROM bb_dedup_followers f
    CROSS JOIN LATERAL ({_match("f", "%(per_agent)s::boolean")}) k
), {_merge()},
back AS (
    INSERT INTO bb_stage_memories
    SELECT f.* FROM bb_dedup_followers f WHERE f.id NOT IN (SELECT id FROM merged)
    RETURNING 1
)
SELECT count(*) FROM back"""

#: After the tombstones of a batch's forgets are written and before
#: ``DELETE_FORGOTTEN``: a forgotten merged id is no longer a source of its kept
#: memory (``seen_count`` - 1); a forgotten kept memory's sources get tombstones
#: too, and the near-duplicates archived into it are deleted (RETURNING their
#: ``mid``: their vectors go too). Param: ``ids`` (the forgotten ids).
FORGET_MERGED = """
WITH kept AS (
    SELECT m.mid, m.id, f.stream, f.seq, f.verdict
    FROM bb_memories m JOIN bb_memory_forgets f ON f.id = m.id AND f.board = m.board AND f.seq > m.seq
    WHERE m.id = ANY(%(ids)s)
), src AS (
    SELECT x.id, x.board, x.seq AS src_seq, kept.id AS kept_id, kept.stream, kept.seq, kept.verdict
    FROM kept JOIN bb_memory_sources x ON x.mid = kept.mid
), tomb AS (
    INSERT INTO bb_memory_forgets AS t (id, board, stream, seq, verdict)
    SELECT id, board, stream, seq, verdict FROM src WHERE src_seq < seq
    ON CONFLICT (id, board) DO UPDATE SET stream = EXCLUDED.stream, seq = EXCLUDED.seq, verdict = EXCLUDED.verdict
    WHERE t.seq < EXCLUDED.seq
), gone AS (
    DELETE FROM bb_memory_sources x USING bb_memory_forgets f
    WHERE f.id = x.id AND f.board = x.board AND f.seq > x.seq AND x.id = ANY(%(ids)s)
    RETURNING x.mid
), dec AS (
    UPDATE bb_memories m SET seen_count = greatest(1, m.seen_count - d.n)
    FROM (SELECT mid, count(*)::int AS n FROM gone GROUP BY mid) d
    WHERE m.mid = d.mid
)
DELETE FROM bb_memories a USING src
WHERE a.id = src.id AND a.merged_into = src.kept_id AND a.archived_at IS NOT NULL
RETURNING a.mid"""
