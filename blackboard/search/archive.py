"""Archiving long-term memories: prune by a strategy, archive chosen ones, restore archived
ones (docs/memory-lifecycle.md, "Pruning and archive").

:func:`prune` runs one strategy (:data:`~blackboard.db.prune_sql.STRATEGIES`) with its
threshold from ``settings.memory`` or given, optionally over one author's memories only;
:func:`archive` archives memories chosen by id; :func:`restore` brings archived memories back.
The search service's ``prune``, ``archive`` and ``restore`` endpoints
(:mod:`blackboard.search.lifecycle`, with the principal's rights) call them, as do
``blackboard prune`` / ``blackboard restore`` and the worker's scheduled prunes
(:mod:`blackboard.worker.pruning`, which re-exports them). The SQL is
:mod:`blackboard.db.prune_sql`.

An archived memory keeps its row and its vectors (``archived_at``, ``archive_reason`` = the
strategy, or the reason given to :func:`archive`): recall leaves it out, ``include_archived``
finds it, :func:`restore` brings it back. A hard delete removes the row, its vectors and its
sources, and leaves a forget tombstone per id so that a replay of the memory stream does not
store it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from blackboard.db import ingest_sql
from blackboard.db import prune_sql as q
from blackboard.db.prune_sql import STRATEGIES, PruneStrategy
from blackboard.db.spaces import Space
from blackboard.protocol.errors import ConfigurationError, StorageError
from blackboard.protocol.schemas.prune import RESERVED_ARCHIVE_REASONS
from blackboard.settings import MemorySettings

__all__ = ["RESERVED_REASONS", "STRATEGIES", "ArchiveReport", "AuthorCheck", "PruneReport", "PruneStrategy", "Pruned",
           "RestoreReport", "archive", "prune", "restore", "threshold_of"]

#: Called with the authors (memory id -> agent) of the memories an archive or a restore by id
#: found, before it changes anything; what it raises aborts the change.
AuthorCheck = Callable[[Mapping[str, str]], None]

#: Archive reasons the lifecycle gives itself (a memory merged into another, a merge whose
#: sources changed): :func:`archive` refuses them, :func:`restore` never restores them.
RESERVED_REASONS = RESERVED_ARCHIVE_REASONS


@dataclass(frozen=True, slots=True)
class Pruned:
    """A memory a prune archived, deleted, or would (a dry run)."""

    mid: int
    id: str
    board: str
    agent: str
    kind: str
    text: str
    confidence: float | None
    hits: int
    importance: float
    #: When it was last used (recalled or written).
    used_at: datetime
    #: Its event time (``coalesce(valid_from, created_at)``).
    event_at: datetime
    #: Its importance score at the prune (docs/memory-lifecycle.md, "Importance").
    score: float


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What one prune did (or, ``dry_run``, would do)."""

    strategy: PruneStrategy
    #: The threshold applied: an instant (lru: last used before; old_age: event time before),
    #: a confidence or score (low_confidence, importance), a count (max_per_board).
    threshold: datetime | float | int
    dry_run: bool
    hard: bool
    #: Least worth keeping first.
    memories: list[Pruned] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.memories)


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What :func:`restore` did: the ids restored, and why each other id was not."""

    restored: list[str]
    #: id -> why not ("not found", "not archived", "merged into <id>", "on board <b>").
    refused: dict[str, str]


def threshold_of(memory: MemorySettings, strategy: PruneStrategy, given: float | None = None, *,
                 now: datetime) -> datetime | float | int:
    """The threshold a prune by ``strategy`` applies: ``given`` (seconds for lru and old_age, a
    count for max_per_board) or the strategy's setting, as the SQL takes it (an instant for lru
    and old_age).

    Raises:
        ConfigurationError: max_per_board without ``given`` nor ``memory.max_per_board``; a
            threshold out of its range.
    """
    if strategy == "lru":
        return now - timedelta(seconds=_positive(memory.prune_unused_for if given is None else given, strategy))
    if strategy == "old_age":
        return now - timedelta(seconds=_positive(memory.prune_max_age if given is None else given, strategy))
    if strategy == "low_confidence":
        return _unit(memory.prune_min_confidence if given is None else given, strategy)
    if strategy == "importance":
        return _unit(memory.prune_min_importance if given is None else given, strategy)
    if strategy == "max_per_board":
        bound = memory.max_per_board if given is None else given
        if bound is None:
            raise ConfigurationError("max_per_board: no bound (give a threshold, or set memory.max_per_board)")
        if bound != int(bound) or bound < 0:
            raise ConfigurationError(f"max_per_board: the bound must be a whole number >= 0, not {bound}")
        return int(bound)
    raise ConfigurationError(f"unknown prune strategy {strategy!r} (one of {', '.join(STRATEGIES)})")


def _positive(seconds: float, strategy: str) -> float:
    if not seconds > 0:
        raise ConfigurationError(f"{strategy}: the threshold must be a duration > 0 seconds, not {seconds}")
    return float(seconds)


def _unit(value: float, strategy: str) -> float:
    if not 0 <= value <= 1:
        raise ConfigurationError(f"{strategy}: the threshold must be within 0..1, not {value}")
    return float(value)


def _params(memory: MemorySettings, *, now: datetime, threshold: datetime | float | int, board: str | None,
            agent: str | None, limit: int | None, reason: str) -> dict[str, Any]:
    return {**q.importance_params(memory), "now": now, "threshold": threshold, "board": board, "agent": agent,
            "limit": limit, "reason": reason}


async def prune(conn: psycopg.AsyncConnection[Any], memory: MemorySettings, strategy: PruneStrategy, *,
                threshold: float | None = None, board: str | None = None, agent: str | None = None,
                dry_run: bool = False, hard: bool = False, limit: int | None = None, now: datetime | None = None,
                wait: bool = True) -> PruneReport:
    """Archive (``hard``: delete) the memories ``strategy`` selects, least worth keeping first,
    in one transaction on ``conn``; with ``dry_run`` only list them.

    Args:
        conn: a connection (autocommit or not: the work is one transaction of its own).
        memory: the weights of the importance score and the strategies' thresholds.
        strategy: lru, low_confidence, old_age, importance or max_per_board.
        threshold: replaces the strategy's setting (seconds for lru and old_age; a count for
            max_per_board): see :func:`threshold_of`.
        board: only this board's memories (default: every board).
        agent: only this author's memories (default: every author's); with ``max_per_board``
            the bound counts that author's memories of each board.
        limit: at most this many (default: all).
        now: the instant the prune is for (default: now).
        wait: wait for a prune running elsewhere to finish; otherwise return an empty report
            at once (the worker's schedule).

    Raises:
        ConfigurationError: an invalid threshold (see :func:`threshold_of`), or a limit < 1.
        StorageError: PostgreSQL failed.
    """
    if limit is not None and limit < 1:
        raise ConfigurationError(f"limit must be >= 1, not {limit}")
    at = now or datetime.now(UTC)
    cut = threshold_of(memory, strategy, threshold, now=at)
    report = PruneReport(strategy, cut, dry_run, hard)
    params = _params(memory, now=at, threshold=cut, board=board, agent=agent, limit=limit, reason=strategy)
    try:
        async with conn.transaction():
            if dry_run:
                query = q.candidates_query(strategy)
            else:
                if not await _lock(conn, wait):
                    return report
                if hard:
                    await conn.execute(ingest_sql.LOCK_MEMORIES_FOR_FORGET)
                query = q.delete_query(strategy) if hard else q.archive_query(strategy)
            async with conn.cursor(row_factory=class_row(Pruned)) as cur:
                await cur.execute(query, params)
                found = await cur.fetchall()
            if hard and found:
                deleted = await conn.execute(q.DELETE_MERGED_INTO, ([p.id for p in found],))
                merged = [int(r[0]) for r in await deleted.fetchall()]
                await _delete_vectors(conn, [p.mid for p in found] + merged)
    except psycopg.Error as exc:
        raise StorageError(f"prune ({strategy}) failed: {exc}") from exc
    found.sort(key=_order(strategy))
    report.memories.extend(found)
    return report


def _order(strategy: PruneStrategy) -> Any:
    """The order the SQL selects in (an UPDATE ... RETURNING returns in none)."""
    keys: dict[str, Any] = {
        "lru": lambda p: (p.used_at, p.mid),
        "low_confidence": lambda p: (p.confidence, p.mid),
        "old_age": lambda p: (p.event_at, p.mid),
    }
    return keys.get(strategy, lambda p: (p.score, p.mid))


async def _lock(conn: psycopg.AsyncConnection[Any], wait: bool) -> bool:
    if wait:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (q.PRUNE_LOCK,))
        return True
    row = await (await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (q.PRUNE_LOCK,))).fetchone()
    return bool(row and row[0])


async def _delete_vectors(conn: psycopg.AsyncConnection[Any], mids: list[int]) -> None:
    cur = await conn.execute(ingest_sql.SPACES)
    for sid, model, dims in await cur.fetchall():
        space = Space(int(sid), str(model), int(dims))
        await conn.execute(sql.SQL("DELETE FROM {} WHERE item = ANY(%s)").format(space.table("memory")), (mids,))
    await conn.execute(ingest_sql.UNQUEUE_MEMORIES, (mids,))
    await conn.execute(q.UNQUEUE_CONSOLIDATION, (mids,))


async def restore(conn: psycopg.AsyncConnection[Any], ids: Sequence[str], *,
                  board: str | None = None, check: AuthorCheck | None = None) -> RestoreReport:
    """Bring archived memories back into recall (``archived_at`` cleared), by id.

    A memory merged into another (archive reason ``merged``, or an exact duplicate kept only as
    a source of the memory it matched) is not restored: the memory kept carries its provenance;
    remember it again to have it on its own. Nor is a derived merge stored archived because its
    sources changed meanwhile (``conflict``): its sources are live.

    ``check``, when given, is called with the authors of the memories of those ids found (on
    ``board`` when given; id -> agent), their rows locked, before anything is restored: what it
    raises aborts the restore (the search service refuses another agent's memories there).

    Raises:
        StorageError: PostgreSQL failed.
        Exception: what ``check`` raised (nothing restored).
    """
    wanted = sorted(set(ids))
    try:
        async with conn.transaction():
            if check is not None:
                cur = await conn.execute(q.LOCK_BY_ID, {"ids": wanted, "board": board})
                check({str(r[1]): str(r[2]) for r in await cur.fetchall()})
            cur = await conn.execute(q.RESTORE, {"ids": wanted, "board": board})
            restored = sorted(str(r[0]) for r in await cur.fetchall())
            cur = await conn.execute(q.ARCHIVED_STATE, {"ids": [i for i in wanted if i not in set(restored)]})
            states = await cur.fetchall()
    except psycopg.Error as exc:
        raise StorageError(f"restore failed: {exc}") from exc
    refused: dict[str, str] = {}
    for mid, mboard, archived_at, reason, merged_into, _kept in states:
        if reason == "merged":
            refused[str(mid)] = f"merged into {merged_into}" if merged_into else "merged into another memory"
        elif reason == "conflict":
            refused[str(mid)] = "a merge whose sources changed before it was stored (conflict)"
        elif board is not None and mboard != board:
            refused[str(mid)] = f"on board {mboard}, not {board}"
        elif archived_at is None:
            refused[str(mid)] = "not archived"
    for mid in wanted:
        if mid not in restored and mid not in refused:
            refused[mid] = "not found"
    return RestoreReport(restored, refused)


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    """What :func:`archive` did (or, ``dry_run``, would do)."""

    #: The ids archived (would be), in the order asked.
    archived: list[str]
    #: The ids of no memory of the board.
    missing: list[str]
    #: id -> why it was not archived: "already archived", "read-only (a knowledge file's)",
    #: "contested (an open contradiction vote)".
    refused: dict[str, str]
    dry_run: bool


async def archive(conn: psycopg.AsyncConnection[Any], ids: Sequence[str], *, board: str, reason: str = "archived",
                  dry_run: bool = False, now: datetime | None = None,
                  check: AuthorCheck | None = None) -> ArchiveReport:
    """Archive the memories of ``board`` with these ids (``archive_reason`` = ``reason``), in
    one transaction on ``conn``; with ``dry_run`` only tell which would be.

    As a prune, it leaves alone a knowledge file's memories (``read_only``) and those under an
    open contradiction vote; an id of no memory of ``board`` is ``missing``. ``check``, when
    given, is called with the authors of the memories found (id -> agent), their rows locked,
    before anything is archived: what it raises aborts the archive (the search service refuses
    another agent's memories there).

    Raises:
        ConfigurationError: ``reason`` is one of :data:`RESERVED_REASONS` or empty.
        StorageError: PostgreSQL failed.
        Exception: what ``check`` raised (nothing archived).
    """
    if not reason or reason in RESERVED_REASONS:
        raise ConfigurationError(f"archive reason {reason!r} is reserved or empty (not {', '.join(sorted(RESERVED_REASONS))})")
    wanted = list(dict.fromkeys(ids))
    refused: dict[str, str] = {}
    try:
        async with conn.transaction():
            cur = await conn.execute(q.LOCK_BY_ID, {"ids": wanted, "board": board})
            rows = await cur.fetchall()
            if check is not None:
                check({str(r[1]): str(r[2]) for r in rows})
            mids: list[int] = []
            for mid, mem_id, _agent, archived, read_only, contested in rows:
                if archived:
                    refused[str(mem_id)] = "already archived"
                elif read_only:
                    refused[str(mem_id)] = "read-only (a knowledge file's)"
                elif contested:
                    refused[str(mem_id)] = "contested (an open contradiction vote)"
                else:
                    mids.append(int(mid))
            if dry_run:
                done = {str(r[1]) for r in rows if int(r[0]) in set(mids)}
            else:
                cur = await conn.execute(q.ARCHIVE_BY_ID, {"mids": mids, "now": now or datetime.now(UTC),
                                                           "reason": reason})
                done = {str(r[0]) for r in await cur.fetchall()}
    except psycopg.Error as exc:
        raise StorageError(f"archive failed: {exc}") from exc
    found = {str(r[1]) for r in rows}
    return ArchiveReport([i for i in wanted if i in done], [i for i in wanted if i not in found], refused, dry_run)
