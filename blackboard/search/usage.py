"""Recording how often recall returns each memory, off the read path.

The search service notes the memories each recall returned (:meth:`AccessRecorder.record`,
no IO) and a background task writes them every ``memory.access_flush_interval`` seconds in
one statement per flush: ``hits`` plus the times returned, ``last_accessed`` the latest
(never moved back). The importance score (:mod:`blackboard.worker.importance`) and the
``lru`` prune read them. A flush that fails keeps its counts for the next one; a crash loses
at most one interval's counts (they are statistics, not data).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

import psycopg
from psycopg_pool import AsyncConnectionPool

__all__ = ["RECORD_ACCESS", "AccessRecorder"]

log = logging.getLogger("blackboard.search.usage")

#: Add recall hits to memories: params ids (text[]), counts (int[]), the flush's time. Rows are
#: locked in ``mid`` order, so two services flushing overlapping ids never deadlock.
RECORD_ACCESS = """
WITH u AS (SELECT * FROM unnest(%s::text[], %s::int[]) AS u(id, n)),
locked AS (SELECT m.mid, u.n FROM bb_memories m JOIN u ON u.id = m.id ORDER BY m.mid FOR UPDATE OF m)
UPDATE bb_memories m SET hits = m.hits + l.n, last_accessed = greatest(m.last_accessed, %s::timestamptz)
FROM locked l WHERE m.mid = l.mid"""


class AccessRecorder:
    """The recall hits not yet written, and the loop that writes them.

    Args:
        pool: the search service's pool.
        interval: seconds between flushes (``memory.access_flush_interval``).
    """

    def __init__(self, pool: AsyncConnectionPool, interval: float) -> None:
        self.pool = pool
        self.interval = interval
        self._pending: Counter[str] = Counter()
        self._last: datetime | None = None
        #: Memories' hits written so far (for status and tests).
        self.written = 0

    @property
    def pending(self) -> int:
        """Hits noted and not yet written."""
        return sum(self._pending.values())

    def record(self, ids: Iterable[str]) -> None:
        """Note that a recall returned these memories (by id; no IO)."""
        noted = list(ids)
        if noted:
            self._pending.update(noted)
            self._last = datetime.now(UTC)

    async def flush(self) -> int:
        """Write the hits noted since the last flush; returns how many were written.

        Raises:
            psycopg.Error: PostgreSQL failed (the hits stay noted for the next flush).
        """
        if not self._pending:
            return 0
        pending, self._pending = self._pending, Counter()
        at = self._last or datetime.now(UTC)
        ids = sorted(pending)
        try:
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute(RECORD_ACCESS, (ids, [pending[i] for i in ids], at))
        except BaseException:
            pending.update(self._pending)
            self._pending = pending
            raise
        n = sum(pending.values())
        self.written += n
        return n

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Flush every ``interval`` seconds until cancelled, then once more (what was noted
        before the cancellation is written).

        ``stop``, set before the cancel, ends the loop at its next turn even if the cancel
        was lost in a flush (Python 3.11's ``asyncio.wait_for``, under psycopg's waits,
        returns a result that is ready instead of raising a cancel that arrives with it).
        """
        try:
            while stop is None or not stop.is_set():
                await asyncio.sleep(self.interval)
                try:
                    await self.flush()
                except psycopg.Error as exc:
                    log.info("cannot record recall hits yet (kept for the next flush): %s", exc)
        finally:
            with contextlib.suppress(psycopg.Error, asyncio.CancelledError):
                await asyncio.shield(self.flush())
