"""SQL of near-duplicate consolidation and of derived memories (constants and ``psycopg.sql``
builders, no IO; docs/memory-lifecycle.md, "Deduplication and consolidation").

Every write that consolidates is conditional on the versions read: the rows it changes are
named by ``mid`` *and* ``seq`` (the stream sequence of the version read) and must still be
live, so a memory written or changed since it was read is never overwritten (the statement
changes no row and the caller rolls the whole merge back).
"""

from __future__ import annotations

from psycopg import sql

from blackboard.db.spaces import Space

__all__ = [
    "ARCHIVE_CONFLICT",
    "ARCHIVE_MERGED",
    "CLAIM",
    "DONE",
    "ENQUEUE",
    "FOLD_INTO_KEPT",
    "INSERT_SOURCES",
    "LOCK_BY_VERSION",
    "LOCK_MEMORIES",
    "MOVE_SOURCES",
    "QUEUE_SIZE",
    "READ_CURRENT",
    "REVIVE_MERGED",
    "SET_SEEN",
    "near_candidates",
]

#: Queue the memories whose vectors were just written (the embedder's transaction). A memory
#: queued again moves to now, so a consolidator holding it (its lease, below) leaves it queued.
ENQUEUE = """
INSERT INTO bb_consolidate_queue (mid) SELECT unnest(%s::bigint[])
ON CONFLICT (mid) DO UPDATE SET enqueued_at = clock_timestamp()"""

#: Lease up to %(n)s queued memories: their enqueued_at moves %(lease)s seconds ahead (out of
#: every other consolidator's sight until then; a crash leaves them to be taken again).
CLAIM = """
UPDATE bb_consolidate_queue q SET enqueued_at = clock_timestamp() + make_interval(secs => %(lease)s)
FROM (
    SELECT mid FROM bb_consolidate_queue
    WHERE enqueued_at <= clock_timestamp()
    ORDER BY enqueued_at
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
) c
WHERE q.mid = c.mid
RETURNING q.mid, q.enqueued_at"""

#: Finish leased memories, unless queued again meanwhile (enqueued_at moved).
DONE = """
DELETE FROM bb_consolidate_queue q
USING unnest(%s::bigint[], %s::timestamptz[]) AS d(mid, enqueued_at)
WHERE q.mid = d.mid AND q.enqueued_at = d.enqueued_at"""

QUEUE_SIZE = "SELECT count(*) FROM bb_consolidate_queue"

#: The columns a consolidation reads of a memory (``_MemoryVersion`` in the consolidator).
_COLUMNS = ("m.mid, m.id, m.seq, m.stream, m.board, m.agent, m.kind, m.text, m.tags, m.metadata, m.importance, "
            "m.subject_key, m.created_at, coalesce(m.valid_from, m.created_at) AS valid_from, m.verdict, "
            "m.seen_count, m.hits, coalesce(m.last_seen, m.created_at) AS last_seen")
#: A memory a consolidation may touch: live (not archived) and current (not closed by a newer
#: version of its key, not contested).
_CURRENT = "{a}.archived_at IS NULL AND {a}.valid_to IS NULL AND {a}.contested_by IS NULL"


#: The names of :data:`_COLUMNS` (as the rows of :func:`near_candidates` carry them).
_NAMES = ("mid", "id", "seq", "stream", "board", "agent", "kind", "text", "tags", "metadata", "importance",
          "subject_key", "created_at", "valid_from", "verdict", "seen_count", "hits", "last_seen")


def near_candidates(space: Space, *, per_agent: bool) -> sql.Composed:
    """Each of the given memories (``%(mids)s``) that is current and has the vector of its
    version in ``space``, with its nearest current neighbour of the same scope (board, and
    agent with ``per_agent``) and subject key (both NULL, or equal) at a cosine of at least
    ``%(threshold)s`` (``n_mid``, ``n_seq``: the version compared, ``cosine``; NULL: none).

    The board's vectors are scanned exactly (the covering board index: a near-duplicate must
    not be missed by an approximate search), and only those within the threshold are looked
    up in ``bb_memories`` (the materialised steps keep the planner from checking every
    vector's row first: 40 ms a memory on a board of 10,000).
    """
    vec = space.table("memory")
    agent = sql.SQL("AND o.agent = q.agent") if per_agent else sql.SQL("")
    return sql.SQL("""
WITH q AS MATERIALIZED (
    SELECT {cols}, mv.embedding
    FROM bb_memories m JOIN {vec} mv ON mv.item = m.mid AND mv.revision = m.seq
    WHERE m.mid = ANY(%(mids)s) AND {current_m}
), near AS MATERIALIZED (
    SELECT q.mid AS q_mid, v.item, v.revision, v.embedding <=> q.embedding AS distance
    FROM q JOIN {vec} v ON v.board = q.board AND v.item <> q.mid
    WHERE (v.embedding <=> q.embedding) <= 1 - %(threshold)s::float8
), best AS (
    SELECT DISTINCT ON (n.q_mid) n.q_mid, o.mid, o.seq, 1 - n.distance AS cosine
    FROM near n
    JOIN q ON q.mid = n.q_mid
    JOIN bb_memories o ON o.mid = n.item AND o.seq = n.revision
    WHERE {current_o} AND o.subject_key IS NOT DISTINCT FROM q.subject_key {agent}
    ORDER BY n.q_mid, n.distance
)
SELECT {names}, best.mid AS n_mid, best.seq AS n_seq, best.cosine
FROM q LEFT JOIN best ON best.q_mid = q.mid""").format(
        cols=sql.SQL(_COLUMNS), vec=vec, agent=agent, names=sql.SQL(", ".join(f"q.{n}" for n in _NAMES)),
        current_o=sql.SQL(_CURRENT.format(a="o")), current_m=sql.SQL(_CURRENT.format(a="m")))


#: Memories by mid (the two sides of a merge), the current ones.
READ_CURRENT = f"SELECT {_COLUMNS} FROM bb_memories m WHERE m.mid = ANY(%s) AND {_CURRENT.format(a='m')}"

#: Lock memories by mid (the two sides of a merge, in one order), current ones only.
LOCK_MEMORIES = f"""
SELECT {_COLUMNS} FROM bb_memories m
WHERE m.mid = ANY(%s) AND {_CURRENT.format(a="m")}
ORDER BY m.mid FOR UPDATE"""

#: The memory stored at (stream, seq) of a board, whatever its state (a derived merge's source), locked.
LOCK_BY_VERSION = f"""
SELECT {_COLUMNS}, m.archived_at, m.merged_into, ({_CURRENT.format(a="m")}) AS current
FROM bb_memories m WHERE m.stream = %s AND m.seq = %s AND m.board = %s
FOR UPDATE"""

#: Archive a merged memory, at the version read, if it is still current.
ARCHIVE_MERGED = f"""
UPDATE bb_memories m SET archived_at = clock_timestamp(), archive_reason = 'merged', merged_into = %(into)s
WHERE m.mid = %(mid)s AND m.seq = %(seq)s AND {_CURRENT.format(a="m")}
RETURNING m.mid, m.seen_count, m.hits, coalesce(m.last_seen, m.created_at) AS last_seen"""

#: Fold merged memories' counts into the kept one, at the version read, if it is still current.
FOLD_INTO_KEPT = f"""
UPDATE bb_memories m SET seen_count = m.seen_count + %(seen)s, hits = m.hits + %(hits)s,
                         last_seen = greatest(coalesce(m.last_seen, m.created_at), %(last_seen)s)
WHERE m.mid = %(mid)s AND m.seq = %(seq)s AND {_CURRENT.format(a="m")}
RETURNING m.mid"""

#: Set a derived merge's counts (the sum of its sources'), at the version stored.
SET_SEEN = """
UPDATE bb_memories m SET seen_count = %(seen)s, hits = %(hits)s,
                         last_seen = greatest(coalesce(m.last_seen, m.created_at), %(last_seen)s)
WHERE m.mid = %(mid)s AND m.seq = %(seq)s
RETURNING m.mid"""

#: A derived merge whose sources changed before it was stored: kept, archived as a conflict.
ARCHIVE_CONFLICT = """
UPDATE bb_memories m SET archived_at = clock_timestamp(), archive_reason = 'conflict'
WHERE m.mid = %(mid)s AND m.seq = %(seq)s AND m.archived_at IS NULL"""

#: The sources of merged memories go with them to the memory they were merged into.
MOVE_SOURCES = "UPDATE bb_memory_sources SET mid = %(into)s WHERE mid = %(mid)s"

#: One source row per merged memory (params: id, mid, board, agent, stream, seq, created_at,
#: sig_key, sig, verdict, how).
INSERT_SOURCES = """
INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, sig_key, sig, verdict, how)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET mid = EXCLUDED.mid, board = EXCLUDED.board, agent = EXCLUDED.agent,
    stream = EXCLUDED.stream, seq = EXCLUDED.seq, created_at = EXCLUDED.created_at, sig_key = EXCLUDED.sig_key,
    sig = EXCLUDED.sig, verdict = EXCLUDED.verdict, how = EXCLUDED.how, merged_at = now()"""

#: A new version of a memory merged away (near or LLM) is live again: the writer changed it
#: after the merge (its stored version is newer than the one merged; a redelivered copy of
#: the merged version is not). Its source row leaves the memory it was merged into (whose count drops by
#: one); params: the ids and sequences of the versions just stored. Returns the revived mids.
REVIVE_MERGED = """
WITH revived AS (
    UPDATE bb_memories m SET archived_at = NULL, archive_reason = NULL, merged_into = NULL, seen_count = 1
    FROM unnest(%s::text[], %s::bigint[]) AS w(id, seq), bb_memory_sources s
    WHERE m.id = w.id AND m.seq = w.seq AND m.archive_reason = 'merged'
      AND s.id = m.id AND s.seq < m.seq AND s.how IN ('near', 'llm')
    RETURNING m.mid, m.id
), gone AS (
    DELETE FROM bb_memory_sources s USING revived r WHERE s.id = r.id AND s.how IN ('near', 'llm')
    RETURNING s.mid
), counted AS (
    UPDATE bb_memories k SET seen_count = greatest(1, k.seen_count - g.n)
    FROM (SELECT mid, count(*) AS n FROM gone GROUP BY mid) g
    WHERE k.mid = g.mid
)
SELECT mid FROM revived"""
