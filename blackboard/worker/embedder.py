"""The embedding stage: queued items are embedded in batches after they are stored.

The ingest transaction queues every new or changed memory and entry in
``bb_embed_queue``. The embedder leases a batch (a short transaction, so no
row locks are held while the model runs), embeds the texts in one model call,
then in one transaction upserts the vectors into the space's tables and deletes
the finished queue rows (unless re-queued meanwhile). Two slots run at once so
that one batch's database write overlaps the next batch's model call; model
calls themselves are serialised. A crash leaves leased rows to expire and be
taken again, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from blackboard.db import embed_sql as q
from blackboard.db.spaces import ItemType, Space, ensure_space
from blackboard.embeddings import EmbeddingProvider
from blackboard.errors import EmbeddingError
from blackboard.settings import Settings

__all__ = ["EmbedStats", "Embedder", "EmbeddingProvider", "load_provider", "memory_embed_text"]

log = logging.getLogger("blackboard.worker.embedder")

#: Characters of an item's text sent to the model (MiniLM reads 256 tokens).
MAX_EMBED_CHARS = 2000
_LEASE_SECONDS = 120.0
_MAX_ATTEMPTS = 5


def load_provider(settings: Settings) -> EmbeddingProvider:
    """The provider configured in ``settings.embedding``.

    Raises:
        ConfigurationError: the embeddings package or the configured model is unavailable.
    """
    from blackboard.embeddings import provider_from_settings

    return provider_from_settings(settings.embedding)


#: Metadata values longer than this are left out of the embedded text.
MAX_EMBED_META_VALUE = 200


def memory_embed_text(text: str, metadata: Mapping[str, Any] | None = None) -> str:
    """The text embedded for a memory: its short scalar metadata as ``key: value`` lines, then its text.

    Metadata often holds what a question names but the text leaves implicit
    (who said it, when, about which project); the keyword index sees those
    values too (``memory_search_text``), so the vector should as well.
    Cut to what the model reads.
    """
    lines = []
    for key, value in (metadata or {}).items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        shown = str(value).strip()
        if shown and len(shown) <= MAX_EMBED_META_VALUE and len(str(key)) <= MAX_EMBED_META_VALUE:
            lines.append(f"{key}: {shown}")
    lines.append(text)
    return "\n".join(lines)[:MAX_EMBED_CHARS]


@dataclass
class EmbedStats:
    """Counters of the embedder since start."""

    embedded: int = 0
    batches: int = 0
    failures: int = 0
    model_seconds: float = 0.0
    write_seconds: float = 0.0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class _Claimed:
    item_type: ItemType
    item: int
    enqueued_at: Any
    attempts: int


class Embedder:
    """Embeds queued items into the space of ``provider``'s (model, dimensions)."""

    def __init__(self, pool: AsyncConnectionPool, provider: EmbeddingProvider, settings: Settings,
                 *, slots: int = 2) -> None:
        self.provider = provider
        self.settings = settings
        self.stats = EmbedStats()
        self.space: Space | None = None
        self._pool = pool
        self._slots = slots
        self._wake = asyncio.Event()
        self._model_lock = asyncio.Lock()
        self._batch = settings.worker.embed_batch_size or settings.embedding.batch_size

    async def setup(self) -> None:
        """Register the provider's space and create its tables if needed."""
        async with self._pool.connection() as conn:
            self.space = await ensure_space(conn, self.provider.model, self.provider.dimensions)

    def wake(self) -> None:
        """Tell the embedder new items were queued (called after an ingest commit)."""
        self._wake.set()

    async def backlog(self) -> int:
        """Items waiting for an embedding (all spaces share the queue)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(q.BACKLOG)
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def status(self) -> dict[str, Any]:
        s = self.stats
        return {"model": self.provider.model, "dimensions": self.provider.dimensions,
                "space": self.space.id if self.space else None, "backlog": await self.backlog(),
                "embedded": s.embedded, "batches": s.batches, "failures": s.failures,
                "model_seconds": round(s.model_seconds, 3), "write_seconds": round(s.write_seconds, 3),
                "last_error": s.last_error}

    async def run(self, stop: asyncio.Event) -> None:
        """Embed until ``stop`` is set."""
        if self.space is None:
            await self.setup()
        await asyncio.gather(*(self._slot(stop) for _ in range(self._slots)))

    async def _slot(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                n = await self.embed_once()
            except (psycopg.OperationalError, PoolTimeout) as exc:
                self.stats.last_error = repr(exc)
                log.warning("embedder: PostgreSQL unavailable: %s", str(exc).strip()[:200])
                n = 0
            if n == 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.worker.embed_poll)

    async def embed_once(self) -> int:
        """Embed one batch of queued items. Returns how many items it took."""
        assert self.space is not None
        space = self.space
        async with self._pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(q.CLAIM, {"lease": _LEASE_SECONDS, "n": self._batch})
                claimed = [_Claimed(t, int(i), e, int(a)) for t, i, e, a in await cur.fetchall()]
            if not claimed:
                return 0
            texts, targets, skip = await self._load(conn, claimed)
            await conn.commit()
        vectors: np.ndarray | None = None
        if texts:
            try:
                t0 = time.perf_counter()
                async with self._model_lock:
                    vectors = await self.provider.embed(texts)
                self.stats.model_seconds += time.perf_counter() - t0
            except EmbeddingError as exc:
                self.stats.failures += 1
                self.stats.last_error = repr(exc)
                log.warning("embedder: model failed on %d items (%s); they stay queued", len(texts), exc)
                await self._give_up_old(claimed)
                return len(claimed)
        t0 = time.perf_counter()
        async with self._pool.connection() as conn, conn.transaction():
            if vectors is not None:
                for item_type in ("memory", "entry"):
                    params = [(item, rev, vectors[i]) for i, (t, item, rev) in enumerate(targets)
                              if t == item_type]
                    if params:
                        async with conn.cursor() as c:
                            await c.executemany(q.upsert_vectors(space, item_type), params)
            done = [c for c in claimed if (c.item_type, c.item) in skip or vectors is not None]
            await self._done(conn, done)
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.embedded += len(targets)
        self.stats.batches += 1
        return len(claimed)

    async def _load(self, conn: psycopg.AsyncConnection[Any], claimed: list[_Claimed]
                    ) -> tuple[list[str], list[tuple[ItemType, int, int]], set[tuple[ItemType, int]]]:
        mids = [c.item for c in claimed if c.item_type == "memory"]
        eids = [c.item for c in claimed if c.item_type == "entry"]
        texts: list[str] = []
        targets: list[tuple[ItemType, int, int]] = []
        found: set[tuple[ItemType, int]] = set()
        if mids:
            cur = await conn.execute(q.LOAD_MEMORIES, (mids,))
            for mid, seq, text, metadata in await cur.fetchall():
                texts.append(memory_embed_text(text, metadata))
                targets.append(("memory", int(mid), int(seq)))
                found.add(("memory", int(mid)))
        if eids:
            cur = await conn.execute(q.LOAD_ENTRIES, (eids,))
            for eid, rev, text, deleted in await cur.fetchall():
                if deleted or not text:
                    continue
                texts.append(text[:MAX_EMBED_CHARS])
                targets.append(("entry", int(eid), int(rev)))
                found.add(("entry", int(eid)))
        # Items gone (or deleted, or without text) need no vector: just finish them.
        skip = {(c.item_type, c.item) for c in claimed} - found
        return texts, targets, skip

    async def _done(self, conn: psycopg.AsyncConnection[Any], done: Sequence[_Claimed]) -> None:
        if done:
            await conn.execute(q.DONE, ([c.item_type for c in done], [c.item for c in done],
                                        [c.enqueued_at for c in done]))

    async def _give_up_old(self, claimed: Sequence[_Claimed]) -> None:
        old = [c for c in claimed if c.attempts >= _MAX_ATTEMPTS]
        if old:
            log.error("embedder: giving up on %d items after %d attempts", len(old), _MAX_ATTEMPTS)
            async with self._pool.connection() as conn, conn.transaction():
                await self._done(conn, old)
