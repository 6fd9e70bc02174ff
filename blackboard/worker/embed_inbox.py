"""The hand-off from ingest to the embedding stage.

An ingest transaction records the items it changed as one ``bb_embed_inbox``
row per batch (cheap on the write path: one row, not one per item). The
mover, which runs next to the embedder, turns inbox rows into per-item
``bb_embed_queue`` rows (``MOVE_INBOX``, one transaction per step, so a crash
loses nothing and moves nothing twice) and wakes the embedder. Several
workers' movers share the inbox (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from blackboard.db import ingest_sql as q
from blackboard.settings import Settings
from blackboard.worker._tasks import first_of
from blackboard.worker.ingest import RETRYABLE, backoff_delays, error_line

__all__ = ["EmbedInbox"]

log = logging.getLogger("blackboard.worker.embed_inbox")

#: Inbox rows (ingest batches) moved per transaction.
_ROWS_PER_MOVE = 64


class EmbedInbox:
    """Moves ingest's hand-off rows into the embedding queue.

    Args:
        pool: the worker's PostgreSQL pool.
        settings: ``worker.embed_poll`` is how often it looks without being woken.
        on_moved: called after a step moved items (wakes the embedder).
    """

    def __init__(self, pool: AsyncConnectionPool, settings: Settings, *,
                 on_moved: Callable[[], None] | None = None) -> None:
        self._pool = pool
        self._settings = settings
        self._on_moved = on_moved
        self._wake = asyncio.Event()
        #: Items moved into the queue since start.
        self.moved = 0

    def wake(self) -> None:
        """Ingest committed a batch with items to embed: move them soon."""
        self._wake.set()

    async def size(self) -> int:
        """Items waiting in the inbox (not yet in the queue)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(q.INBOX_SIZE)
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def move_once(self) -> int:
        """Move up to a step's worth of inbox rows; the number of items moved (0: the inbox is empty)."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(q.MOVE_INBOX, {"n": _ROWS_PER_MOVE})
            row = await cur.fetchone()
        n = int(row[0]) if row else 0
        self.moved += n
        if n and self._on_moved is not None:
            self._on_moved()
        return n

    async def run(self, stop: asyncio.Event) -> None:
        """Move inbox rows whenever woken (or every ``embed_poll`` seconds) until ``stop``."""
        delay = backoff_delays(0.05, self._settings.worker.max_backoff)
        while not stop.is_set():
            self._wake.clear()  # before moving: a wake during the moves is kept for the wait below
            try:
                while not stop.is_set() and await self.move_once():
                    pass
            except RETRYABLE as exc:
                wait = delay()
                log.warning("embedding inbox: PostgreSQL unavailable (%s); retrying in %.2fs", error_line(exc), wait)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                continue
            delay = backoff_delays(0.05, self._settings.worker.max_backoff)
            await first_of(stop, self._wake, timeout=self._settings.worker.embed_poll)
