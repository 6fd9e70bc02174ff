"""What searches leave to do in the background: ANALYZE the tables searches found never
analysed.

The search service runs it every second (:meth:`SearchEngine.analyze_missing`); the engine
notes the work as it searches. (The recall hits of memories are
:mod:`blackboard.search.usage`'s.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.db.spaces import Space
from blackboard.protocol.schemas.search import SearchTarget

__all__ = ["Upkeep"]

log = logging.getLogger("blackboard.search.maintenance")


class Upkeep:
    """The pending background work of one search engine.

    Args:
        pool: open connection pool (the search service's).
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        #: Tables found never analysed.
        self.unanalysed: set[SearchTarget] = set()

    def note_rows(self, target: SearchTarget, reltuples: float) -> None:
        """Note a table's estimated row count as the statistics read it: ``reltuples`` is -1
        until the first VACUUM or ANALYZE of the table."""
        if reltuples < 0:
            self.unanalysed.add(target)

    async def analyze_missing(self, space: Space | None, analysed: Callable[[SearchTarget], None]) -> None:
        """ANALYZE the tables found never analysed (and, with a ``space``, their vector tables),
        then call ``analysed(target)`` (the engine drops the statistics it cached).

        A table freshly filled has no statistics until autovacuum gets to it
        (up to a minute, more on a busy server): meanwhile the planner guesses,
        keyword search cannot leave out the commonest words, and right after
        writing 2,000 LoCoMo turns keyword searches took 8.5 / 27.5 ms (p50 /
        p95) instead of 4.1 / 6.9 ms. A failure (e.g. a user who does not own
        the table) is logged and left to autovacuum.
        """
        while self.unanalysed:
            target = self.unanalysed.pop()
            try:
                async with self.pool.connection() as conn:
                    for statement in q.analyze_statements(target, space):
                        await conn.execute(statement)
            except psycopg.Error as exc:
                log.info("cannot ANALYZE the %s tables (autovacuum will): %s", target, exc)
            analysed(target)
