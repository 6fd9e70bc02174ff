"""The worker's scheduled prunes of long-term memories (docs/memory-lifecycle.md, "Pruning
and archive").

:class:`Pruner` is the worker's schedule (every ``memory.prune_interval`` seconds, the
strategies of ``memory.prune_strategies``, then the bound ``memory.max_per_board``). The work
itself, :func:`prune`, :func:`restore` and :func:`archive` with their reports, is
:mod:`blackboard.search.archive`'s (the search service's ``prune``, ``archive`` and
``restore`` endpoints run it too, with the principal's rights) and re-exported here:
``blackboard prune`` and ``blackboard restore`` (:mod:`blackboard.apps.prune`) call it from
here. The SQL is :mod:`blackboard.db.prune_sql`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from psycopg_pool import AsyncConnectionPool

from blackboard.protocol.errors import StorageError
from blackboard.search.archive import (
    STRATEGIES,
    ArchiveReport,
    Pruned,
    PruneReport,
    PruneStrategy,
    RestoreReport,
    archive,
    prune,
    restore,
    threshold_of,
)
from blackboard.settings import Settings

__all__ = ["STRATEGIES", "ArchiveReport", "PruneReport", "PruneStrategy", "Pruned", "Pruner", "RestoreReport",
           "archive", "prune", "restore", "threshold_of"]

log = logging.getLogger("blackboard.worker.pruning")

#: A scheduled prune archives at most this many memories per statement (and repeats until
#: none is left), so that no transaction holds a long list of row locks.
SCHEDULED_BATCH = 1000


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
