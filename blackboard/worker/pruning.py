"""Pruning long-term memories: archive (or delete) the ones least worth keeping, and restore
archived ones (docs/memory-lifecycle.md, "Pruning and archive").

:func:`prune` runs one strategy (:data:`~blackboard.db.prune_sql.STRATEGIES`) with its
threshold from ``settings.memory`` or given; :func:`restore` brings archived memories back;
:class:`Pruner` is the worker's schedule (every ``memory.prune_interval`` seconds, the
strategies of ``memory.prune_strategies``, then the bound ``memory.max_per_board``).
``blackboard prune`` and ``blackboard restore`` (:mod:`blackboard.apps.prune`) call the first
two. The SQL is :mod:`blackboard.db.prune_sql`.

An archived memory keeps its row and its vectors (``archived_at``, ``archive_reason`` = the
strategy): recall leaves it out, ``include_archived`` finds it, :func:`restore` brings it
back. A hard delete removes the row, its vectors and its sources, and leaves a forget
tombstone per id so that a replay of the memory stream does not store it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool

from blackboard.db import ingest_sql
from blackboard.db import prune_sql as q
from blackboard.db.prune_sql import STRATEGIES, PruneStrategy
from blackboard.db.spaces import Space
from blackboard.protocol.errors import ConfigurationError, StorageError
from blackboard.settings import MemorySettings, Settings
from blackboard.worker.importance import ImportanceWeights

__all__ = ["STRATEGIES", "PruneReport", "PruneStrategy", "Pruned", "Pruner", "RestoreReport", "prune", "restore",
           "threshold_of"]

log = logging.getLogger("blackboard.worker.pruning")

#: A scheduled prune archives at most this many memories per statement (and repeats until
#: none is left), so that no transaction holds a long list of row locks.
SCHEDULED_BATCH = 1000


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
            limit: int | None, reason: str) -> dict[str, Any]:
    w = ImportanceWeights.from_settings(memory)
    return {"w_recency": w.recency, "w_frequency": w.frequency, "w_confidence": w.confidence,
            "w_importance": w.importance, "half_life": w.half_life, "frequency_scale": w.frequency_scale,
            "now": now, "threshold": threshold, "board": board, "limit": limit, "reason": reason}


async def prune(conn: psycopg.AsyncConnection[Any], memory: MemorySettings, strategy: PruneStrategy, *,
                threshold: float | None = None, board: str | None = None, dry_run: bool = False,
                hard: bool = False, limit: int | None = None, now: datetime | None = None,
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
    params = _params(memory, now=at, threshold=cut, board=board, limit=limit, reason=strategy)
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
                  board: str | None = None) -> RestoreReport:
    """Bring archived memories back into recall (``archived_at`` cleared), by id.

    A memory merged into another (archive reason ``merged``, or an exact duplicate kept only as
    a source of the memory it matched) is not restored: the memory kept carries its provenance;
    remember it again to have it on its own. Nor is a derived merge stored archived because its
    sources changed meanwhile (``conflict``): its sources are live.

    Raises:
        StorageError: PostgreSQL failed.
    """
    wanted = sorted(set(ids))
    try:
        async with conn.transaction():
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


class Pruner:
    """The worker's scheduled prunes: every ``memory.prune_interval`` seconds, each strategy of
    ``memory.prune_strategies`` with its setting's threshold, then ``memory.max_per_board``
    when set. Workers take turns (an advisory lock: a worker finding a prune running skips
    its turn).

    Args:
        pool: the worker's pool.
        settings: the deployment's settings.
    """

    def __init__(self, pool: AsyncConnectionPool, settings: Settings) -> None:
        self.pool = pool
        self.memory = settings.memory
        #: Memories archived by this pruner, by strategy (for status and tests).
        self.archived: dict[str, int] = {}

    @staticmethod
    def wanted(settings: Settings) -> bool:
        """Whether the settings schedule any prune."""
        m = settings.memory
        return m.prune_interval > 0 and (bool(m.prune_strategies) or m.max_per_board is not None)

    def strategies(self) -> list[PruneStrategy]:
        out: list[PruneStrategy] = list(dict.fromkeys(self.memory.prune_strategies))
        if self.memory.max_per_board is not None:
            out.append("max_per_board")
        return out

    async def prune_once(self) -> list[PruneReport]:
        """One scheduled round: every strategy, in batches, until none selects anything (or
        another prune holds the lock)."""
        reports = []
        for strategy in self.strategies():
            total: list[Pruned] = []
            while True:
                async with self.pool.connection() as conn:
                    report = await prune(conn, self.memory, strategy, limit=SCHEDULED_BATCH, wait=False)
                total += report.memories
                if report.count < SCHEDULED_BATCH:
                    break
            if total:
                self.archived[strategy] = self.archived.get(strategy, 0) + len(total)
                log.info("pruned %d memories (%s)", len(total), strategy)
            reports.append(PruneReport(strategy, report.threshold, False, False, total))
        return reports

    async def run(self, stop: asyncio.Event) -> None:
        """Prune every ``memory.prune_interval`` seconds until ``stop`` is set (a failed round is
        logged and tried again at the next)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.memory.prune_interval)
                return
            try:
                await self.prune_once()
            except StorageError as exc:
                log.warning("scheduled prune failed (tried again in %.0f s): %s", self.memory.prune_interval, exc)
