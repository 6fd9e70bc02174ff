"""SQL of importance and pruning (pure builders; docs/memory-lifecycle.md, "Importance" and
"Pruning and archive").

:func:`importance_sql` is the SQL twin of
:func:`blackboard.worker.importance.importance_score` (a test holds them equal). Its named
parameters, which every statement here takes: ``w_recency``, ``w_frequency``,
``w_confidence``, ``w_importance`` (the normalised weights), ``half_life``,
``frequency_scale`` and ``now`` (the instant the scores are for).

A prune selects its candidates among the **live** memories (``archived_at IS NULL``) that are
not a knowledge file's (``read_only``) nor under an open contradiction vote (``contested_by``),
optionally of one board (parameter ``board``, NULL: every board) and of one author (``agent``,
NULL: every author: the search service's ``prune`` endpoint passes the principal for a prune of
its own memories), and locks them (``FOR UPDATE OF m SKIP LOCKED``: a memory another transaction is changing is left
for the next prune; one changed meanwhile is re-checked against the strategy's condition on
its newest version, so a memory recalled while the prune ran is not archived as unused).
Each strategy is a condition and an order, least worth keeping first:

============== ================================================= ==============================
strategy       condition (parameter ``threshold``)               first
============== ================================================= ==============================
lru            last used (read or write) before ``threshold``    least recently used
low_confidence ``confidence < threshold`` (none given: kept)     least confident
old_age        event time before ``threshold``                   oldest
importance     importance score below ``threshold``              least important
max_per_board  beyond the ``threshold`` most important of board  least important
============== ================================================= ==============================

The statements: :func:`candidates_query` (a dry run), :func:`archive_query` (archive them),
:func:`delete_query` (delete them, leaving a forget tombstone per id: see
:data:`TOMBSTONE_SEQ`), :data:`LOCK_BY_ID` / :data:`ARCHIVE_BY_ID` for archiving chosen
memories, and :data:`RESTORE` / :data:`ARCHIVED_STATE` for restoring.
"""

from __future__ import annotations

from typing import Literal

from blackboard.settings import MemorySettings

__all__ = [
    "ARCHIVED_STATE",
    "ARCHIVE_BY_ID",
    "DELETE_MERGED_INTO",
    "LOCK_BY_ID",
    "PRUNE_LOCK",
    "RESTORE",
    "STRATEGIES",
    "TOMBSTONE_SEQ",
    "UNQUEUE_CONSOLIDATION",
    "PruneStrategy",
    "archive_query",
    "candidates_query",
    "delete_query",
    "event_time_sql",
    "importance_params",
    "importance_sql",
    "used_at_sql",
]

PruneStrategy = Literal["lru", "low_confidence", "old_age", "importance", "max_per_board"]
STRATEGIES: tuple[PruneStrategy, ...] = ("lru", "low_confidence", "old_age", "importance", "max_per_board")

#: Serialises prunes (transaction-scoped advisory lock, key "bbprune"): two workers' scheduled
#: prunes (or a prune and ``blackboard prune``) never rank the same memories at once.
PRUNE_LOCK = 0x62627072756E65


def used_at_sql(alias: str = "m") -> str:
    """When the memory was last used: its last recall, last write (``last_seen``, ``updated_at``)
    or ``created_at``, whichever is latest (``greatest`` leaves NULLs out)."""
    return f"greatest({alias}.created_at, {alias}.updated_at, {alias}.last_seen, {alias}.last_accessed)"


def event_time_sql(alias: str = "m") -> str:
    """The memory's event time: ``coalesce(valid_from, created_at)`` (rows from before
    migration 0015 have no valid_from)."""
    return f"coalesce({alias}.valid_from, {alias}.created_at)"


def importance_params(memory: MemorySettings) -> dict[str, float]:
    """The weights and scales :func:`importance_sql` takes, from ``memory``: ``weight_*``
    normalised to sum to 1 (all 0 when all are 0), ``recency_half_life``, ``frequency_scale``;
    the same numbers as :meth:`blackboard.worker.importance.ImportanceWeights.from_settings`
    (a test holds them equal; this layer may not import the worker's)."""
    raw = (memory.weight_recency, memory.weight_frequency, memory.weight_confidence, memory.weight_importance)
    total = sum(raw)
    r, f, c, i = (w / total for w in raw) if total > 0 else (0.0, 0.0, 0.0, 0.0)
    return {"w_recency": r, "w_frequency": f, "w_confidence": c, "w_importance": i,
            "half_life": memory.recency_half_life, "frequency_scale": memory.frequency_scale}


def importance_sql(alias: str = "m") -> str:
    """The importance score of the row ``alias`` (float8), with the module's named parameters.

    The exponents are capped as in :mod:`blackboard.worker.importance` (PostgreSQL raises on
    an underflow of ``power`` and ``exp``).
    """
    age = f"greatest(0, extract(epoch FROM (%(now)s::timestamptz - {used_at_sql(alias)}))::float8)"
    return (
        f"(%(w_recency)s::float8 * power(0.5::float8, least({age} / %(half_life)s::float8, 1000::float8))"
        f" + %(w_frequency)s::float8 * (1 - exp(-least(greatest({alias}.hits, 0)::float8"
        f" / %(frequency_scale)s::float8, 700::float8)))"
        f" + %(w_confidence)s::float8 * coalesce({alias}.confidence, 1)::float8"
        f" + %(w_importance)s::float8 * {alias}.importance::float8)"
    )


#: The memories a prune may archive: live, not a knowledge file's (read-only: a re-ingest of an
#: unchanged file would not bring it back), not under an open contradiction vote; of the board
#: and the author given (NULL: any).
_PRUNABLE = ("m.archived_at IS NULL AND NOT m.read_only AND m.contested_by IS NULL"
             " AND (%(board)s::text IS NULL OR m.board = %(board)s::text)"
             " AND (%(agent)s::text IS NULL OR m.agent = %(agent)s::text)")

#: Per strategy: the condition (on ``m``, parameter ``threshold``) and the order, first the
#: least worth keeping.
_CONDITIONS: dict[PruneStrategy, tuple[str, str]] = {
    "lru": (f"{used_at_sql()} < %(threshold)s::timestamptz", f"{used_at_sql()}, m.mid"),
    "low_confidence": ("m.confidence < %(threshold)s::float8", "m.confidence, m.mid"),
    "old_age": (f"{event_time_sql()} < %(threshold)s::timestamptz", f"{event_time_sql()}, m.mid"),
    "importance": (f"{importance_sql()} < %(threshold)s::float8", f"{importance_sql()}, m.mid"),
}

_FIELDS = (f"m.mid, m.id, m.board, m.agent, m.kind, m.text, m.confidence, m.hits, m.importance,"
           f" {used_at_sql()} AS used_at, {event_time_sql()} AS event_at, {importance_sql()} AS score")


def _selection(strategy: PruneStrategy, *, lock: bool) -> str:
    """The candidates of ``strategy``: ``_FIELDS``, least worth keeping first, at most
    ``%(limit)s`` (NULL: all)."""
    locking = " FOR UPDATE OF m SKIP LOCKED" if lock else ""
    if strategy == "max_per_board":
        # The window cannot sit beside FOR UPDATE: it ranks in a subquery, the outer query locks.
        return (f"SELECT {_FIELDS} FROM ("
                f"SELECT m.mid, row_number() OVER (PARTITION BY m.board ORDER BY {importance_sql()} DESC, m.mid DESC)"
                f" AS rank FROM bb_memories m WHERE {_PRUNABLE}) r JOIN bb_memories m ON m.mid = r.mid"
                f" WHERE r.rank > %(threshold)s::bigint AND {_PRUNABLE}"
                f" ORDER BY {importance_sql()}, m.mid LIMIT %(limit)s{locking}")
    condition, order = _CONDITIONS[strategy]
    return (f"SELECT {_FIELDS} FROM bb_memories m WHERE {_PRUNABLE} AND {condition}"
            f" ORDER BY {order} LIMIT %(limit)s{locking}")


def candidates_query(strategy: PruneStrategy) -> str:
    """What a prune by ``strategy`` would archive (nothing locked): a dry run. Parameters: the
    module's, ``threshold`` (an instant for lru and old_age, a number otherwise), ``board``
    (NULL: every board), ``agent`` (the author; NULL: every author; with ``max_per_board`` the
    bound then counts that author's memories of each board) and ``limit`` (NULL: no limit)."""
    return _selection(strategy, lock=False)


def archive_query(strategy: PruneStrategy) -> str:
    """Archive the candidates of ``strategy`` (``archived_at = %(now)s``, ``archive_reason =
    %(reason)s``), returning them as :func:`candidates_query` does (in no order)."""
    return (f"WITH c AS ({_selection(strategy, lock=True)}) "
            "UPDATE bb_memories m SET archived_at = %(now)s::timestamptz, archive_reason = %(reason)s::text "
            "FROM c WHERE m.mid = c.mid "
            "RETURNING c.mid, c.id, c.board, c.agent, c.kind, c.text, c.confidence, c.hits, c.importance, "
            "c.used_at, c.event_at, c.score")


#: A hard-deleted memory's tombstone (``bb_memory_forgets``) has the sequence of the version
#: deleted plus one: ingest skips a memory older than a forget of its id (``MOVE_MEMORIES``),
#: so a replay of the stream does not bring that version (or an older one) back, while a
#: version written later is stored as a new memory.
TOMBSTONE_SEQ = "seq + 1"


def delete_query(strategy: PruneStrategy) -> str:
    """Delete the candidates of ``strategy`` with a forget tombstone for each memory and for
    each memory merged into it (its sources), returning them as :func:`candidates_query` does.
    The caller deletes their vectors and queue rows (:data:`UNQUEUE_CONSOLIDATION`, and the
    embedding queue) in the same transaction, having locked out concurrent memory writers
    (``ingest_sql.LOCK_MEMORIES_FOR_FORGET``)."""
    return (f"WITH c AS ({_selection(strategy, lock=True)}), "
            "t AS (SELECT DISTINCT ON (id, board) id, board, stream, seq FROM ("
            f"  SELECT m.id, m.board, m.stream, m.{TOMBSTONE_SEQ} AS seq FROM bb_memories m JOIN c ON c.mid = m.mid"
            f"  UNION ALL SELECT s.id, s.board, s.stream, s.{TOMBSTONE_SEQ} FROM bb_memory_sources s"
            "   JOIN c ON c.mid = s.mid) x ORDER BY id, board, seq DESC), "
            "f AS (INSERT INTO bb_memory_forgets AS f (id, board, stream, seq) SELECT id, board, stream, seq FROM t "
            "  ON CONFLICT (id, board) DO UPDATE SET stream = EXCLUDED.stream, seq = EXCLUDED.seq "
            "  WHERE f.seq < EXCLUDED.seq), "
            "d AS (DELETE FROM bb_memories m USING c WHERE m.mid = c.mid RETURNING m.mid) "
            "SELECT c.mid, c.id, c.board, c.agent, c.kind, c.text, c.confidence, c.hits, c.importance, "
            "c.used_at, c.event_at, c.score FROM c JOIN d ON d.mid = c.mid")


#: After :func:`delete_query`: the memories archived into the deleted ones (near-duplicates and
#: the sources of a derived merge: ``merged_into``; their tombstones were left with the deleted
#: memories' sources) go too, as a forget of the memory kept takes them. Param: the deleted ids
#: (text[]). Returns their ``mid`` (their vectors go too).
DELETE_MERGED_INTO = """
DELETE FROM bb_memories a WHERE a.merged_into = ANY(%s::text[]) AND a.archived_at IS NOT NULL
  AND a.archive_reason = 'merged'
RETURNING a.mid"""

#: Memories deleted are not checked for near-duplicates any more. Param: mids (bigint[]).
UNQUEUE_CONSOLIDATION = "DELETE FROM bb_consolidate_queue WHERE mid = ANY(%s)"

#: The memories among some ids (of one board; NULL: any), locked for an archive by id
#: (:data:`ARCHIVE_BY_ID`) or a restore that checks their authors first, with what decides whether they may be archived: the author, and whether each is archived
#: already, a knowledge file's (``read_only``) or under an open contradiction vote. Params: ids
#: (text[]), board (text or NULL).
LOCK_BY_ID = """
SELECT m.mid, m.id, m.agent, m.archived_at IS NOT NULL AS archived, m.read_only, m.contested_by IS NOT NULL AS contested
FROM bb_memories m WHERE m.id = ANY(%(ids)s::text[]) AND (%(board)s::text IS NULL OR m.board = %(board)s::text)
ORDER BY m.mid FOR UPDATE OF m"""

#: Archive chosen memories (locked by :data:`LOCK_BY_ID`) that are still live. Params: mids
#: (bigint[]), now, reason. Returns the ids archived.
ARCHIVE_BY_ID = """
UPDATE bb_memories m SET archived_at = %(now)s::timestamptz, archive_reason = %(reason)s::text
WHERE m.mid = ANY(%(mids)s::bigint[]) AND m.archived_at IS NULL
RETURNING m.id"""

#: Bring archived memories back (by id, optionally of one board), but not those merged into
#: another memory (their provenance lives on in the memory kept) nor a derived merge stored
#: archived because its sources changed (``conflict``). Params: ids, board. Returns the ids
#: restored.
RESTORE = """
UPDATE bb_memories m SET archived_at = NULL, archive_reason = NULL
WHERE m.id = ANY(%(ids)s::text[]) AND (%(board)s::text IS NULL OR m.board = %(board)s::text)
  AND m.archived_at IS NOT NULL AND m.archive_reason IS DISTINCT FROM 'merged'
  AND m.archive_reason IS DISTINCT FROM 'conflict'
RETURNING m.id"""

#: What became of ids not restored: their row (board, archived, why, merged into), or the
#: memory they were merged into as an exact duplicate (``bb_memory_sources``). Params: ids.
ARCHIVED_STATE = """
SELECT m.id, m.board, m.archived_at, m.archive_reason, m.merged_into, NULL AS kept
FROM bb_memories m WHERE m.id = ANY(%(ids)s::text[])
UNION ALL
SELECT s.id, s.board, NULL, 'merged', k.id, k.id
FROM bb_memory_sources s JOIN bb_memories k ON k.mid = s.mid WHERE s.id = ANY(%(ids)s::text[])"""
