"""The embedding stage: queued items are embedded in batches after they are stored.

The ingest transaction queues every new or changed memory and entry in
``bb_embed_queue``. The embedder is a three-stage pipeline so that the model,
the bottleneck, never waits for the database:

* a feeder leases the next batch (a short transaction, so no row locks are
  held while the model runs) and loads its texts while the model works;
* the model stage embeds two batches at a time (in worker threads for the
  local provider, so the event loop keeps serving ingest and search): the
  provider bounds its model calls in flight, so the second batch's calls
  only fill the cores the first one's last calls leave idle, or a core whose
  model thread the database's index inserts have preempted (3,000 memories:
  0.79-0.80x the model's own rate against 0.75-0.76x one batch at a time);
* writers upsert the vectors into the space's HNSW-indexed tables and delete
  the finished queue rows (unless re-queued meanwhile) in one transaction per
  batch; an HNSW insert costs milliseconds a row, so two writers run while the
  model moves on.

A crash leaves leased rows to expire and be taken again, so nothing is lost;
a clean stop releases the leases of batches not yet written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from blackboard.db import consolidate_sql
from blackboard.db import embed_sql as q
from blackboard.db.spaces import ItemType, Space, ensure_space
from blackboard.embeddings import EmbeddingProvider
from blackboard.observability import tracing
from blackboard.protocol.errors import EmbeddingError
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker._tasks import first_of, run_until_stopped
from blackboard.worker.embed_text import MAX_EMBED_CHARS, memory_embed_text

__all__ = ["EmbedStats", "Embedder", "EmbeddingProvider", "load_provider", "memory_embed_text",
           "storable_vectors"]

log = logging.getLogger("blackboard.worker.embedder")

_MAX_ATTEMPTS = 5


def load_provider(settings: Settings, *, queries: bool = False) -> EmbeddingProvider:
    """The provider configured in ``settings.embedding`` (``queries``: the instance for search queries).

    Raises:
        ConfigurationError: the embeddings package or the configured model is unavailable.
    """
    from blackboard.embeddings import provider_from_settings

    return provider_from_settings(settings.embedding, queries=queries)


def storable_vectors(vectors: Any, texts: int, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a model's answer for ``texts`` texts that PostgreSQL can store, scaled to
    unit length, and the mask of those rows: a row holding NaN or infinity is left out
    (pgvector refuses it); a zero row stays zero. The length does not matter to cosine, and
    the HNSW index's ``halfvec`` cast overflows past 65,504.

    Raises:
        EmbeddingError: the answer is not ``texts`` rows of ``dims`` values.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.shape != (texts, dims):
        raise EmbeddingError(f"the model gave vectors of shape {vectors.shape} for {texts} texts "
                             f"and {dims} dimensions")
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    finite = np.isfinite(norms)
    kept, norms = vectors[finite], norms[finite]
    scale = np.where(norms > 0, norms, 1.0)
    return (kept / scale[:, None]).astype(np.float32), finite


@dataclass
class EmbedStats:
    """Counters of the embedder since start."""

    embedded: int = 0
    batches: int = 0
    failures: int = 0
    #: Seconds the model ran (with one batch or more), and seconds spent writing
    #: vectors (overlapping it).
    model_seconds: float = 0.0
    write_seconds: float = 0.0
    #: Seconds the model had no batch (after the first one).
    idle_seconds: float = 0.0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class _Claimed:
    item_type: ItemType
    item: int
    enqueued_at: Any
    attempts: int


@dataclass(slots=True)
class _Batch:
    claimed: list[_Claimed]
    texts: list[str]
    #: (item type, item, revision, board) of each text
    targets: list[tuple[ItemType, int, int, str]]
    skip: set[tuple[ItemType, int]]
    vectors: np.ndarray | None = None
    #: When it was leased (time.time_ns; tracing on only): its embedding spans start there.
    leased_ns: int = 0


class Embedder:
    """Embeds queued items into the space of ``provider``'s (model, dimensions).

    Args:
        pool: PostgreSQL pool.
        provider: the embedding model.
        settings: batch size (``worker.embed_batch_size``, default the
            provider's ``embedding.batch_size``) and idle poll interval.
        writers: concurrent vector-writing transactions.
        model_batches: batches in the model stage at once.
    """

    def __init__(self, pool: AsyncConnectionPool, provider: EmbeddingProvider, settings: Settings,
                 *, writers: int = 2, model_batches: int = 2) -> None:
        self.provider = provider
        self.settings = settings
        self.stats = EmbedStats()
        self.space: Space | None = None
        self._pool = pool
        self._writers = max(1, writers)
        self._model_batches = max(1, model_batches)
        # Batches in the model now; when the model last became busy / idle (see _embed).
        self._in_model = 0
        self._busy_since = 0.0
        self._idle_since: float | None = None
        self._wake = asyncio.Event()
        self._batch = settings.worker.embed_batch_size or settings.embedding.batch_size
        #: Leased batches not yet written (their leases are released on stop).
        self._inflight: list[_Batch] = []
        #: Set by the worker when it consolidates: the memories whose vectors a batch writes are
        #: queued for consolidation in the same transaction, and this is called after the commit.
        self.consolidation: Callable[[], None] | None = None

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
                "idle_seconds": round(s.idle_seconds, 3), "last_error": s.last_error}

    async def run(self, stop: asyncio.Event) -> None:
        """Embed until ``stop`` is set (then release the leases of unwritten batches)."""
        if self.space is None:
            await self.setup()
        loaded: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=1)
        embedded: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=self._writers)
        try:
            await run_until_stopped(stop, {
                "embed feed": lambda halt: self._feed(halt, loaded),
                **{f"embed model {i}": lambda halt: self._model(halt, loaded, embedded)
                   for i in range(self._model_batches)},
                **{f"embed write {i}": lambda halt: self._write_loop(halt, embedded) for i in range(self._writers)},
            })
        finally:
            # The owner cancels this task right after setting ``stop``: finish
            # giving the leases back before ending (then honour the cancel).
            release = asyncio.create_task(self._release_inflight())
            cancelled = False
            while not release.done():
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError

    async def embed_once(self) -> int:
        """Lease, embed and write one batch in sequence. Returns how many items it took."""
        batch = await self._lease()
        if batch is None:
            return 0
        try:
            await self._embed(batch)
            await self._write(batch)
        finally:
            if batch in self._inflight:
                await self._release_inflight([batch])
        return len(batch.claimed)

    # -- stages --------------------------------------------------------------

    async def _feed(self, stop: asyncio.Event, out: asyncio.Queue[_Batch]) -> None:
        while not stop.is_set():
            try:
                batch = await self._lease()
            except (psycopg.OperationalError, PoolTimeout) as exc:
                self.stats.last_error = repr(exc)
                log.warning("embedder: PostgreSQL unavailable: %s", str(exc).strip()[:200])
                batch = None
            if batch is None:
                self._wake.clear()
                await first_of(stop, self._wake, timeout=self.settings.worker.embed_poll)
                continue
            if stop.is_set():  # a cancel lost in the lease (see _model): run() releases the batch
                return
            await out.put(batch)

    async def _model(self, stop: asyncio.Event, inp: asyncio.Queue[_Batch], out: asyncio.Queue[_Batch]) -> None:
        while not stop.is_set():
            batch = await inp.get()
            await self._embed(batch)
            if stop.is_set():
                # The cancel that came with ``stop`` may have been lost in the model's call
                # (Python 3.11's wait_for returns a result that is ready instead of raising
                # it): the writers are gone, a full queue would keep this waiting for ever.
                # run() gives the batch's leases back.
                return
            await out.put(batch)

    async def _write_loop(self, stop: asyncio.Event, inp: asyncio.Queue[_Batch]) -> None:
        while not stop.is_set():
            batch = await inp.get()
            delay = 0.05
            while True:
                try:
                    await self._write(batch)
                    break
                except (psycopg.OperationalError, PoolTimeout) as exc:
                    self.stats.last_error = repr(exc)
                    log.warning("embedder: cannot write vectors (%s); retrying", str(exc).strip()[:200])
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        return
                    delay = min(self.settings.worker.max_backoff, delay * 2)

    # -- steps -----------------------------------------------------------------

    async def _lease(self) -> _Batch | None:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(q.CLAIM, {"lease": self.settings.worker.embed_lease, "n": self._batch})
                claimed = [_Claimed(t, int(i), e, int(a)) for t, i, e, a in await cur.fetchall()]
            if not claimed:
                return None
            batch = _Batch(claimed, *(await self._load(conn, claimed)))
            if tracing.enabled:
                batch.leased_ns = time.time_ns()
            await conn.commit()
        self._inflight.append(batch)
        return batch

    async def _embed(self, batch: _Batch) -> None:
        if not batch.texts:
            return
        self._model_enter()
        try:
            batch.vectors = self._storable(batch, await self.provider.embed(batch.texts))
        except EmbeddingError as exc:
            self.stats.failures += 1
            self.stats.last_error = repr(exc)
            log.warning("embedder: model failed on %d items (%s); they stay queued", len(batch.texts), exc)
            await self._give_up_old(batch.claimed)
        finally:
            self._model_exit()

    def _storable(self, batch: _Batch, vectors: Any) -> np.ndarray:
        """The batch's vectors scaled to unit length (cosine ignores the length; the HNSW index
        casts to ``halfvec``, which overflows past 65,504), without those holding NaN or
        infinity, which PostgreSQL refuses: their items are left without a vector (logged and
        counted as failures), instead of failing the whole batch again and again.

        Raises:
            EmbeddingError: the answer has the wrong shape (a model failure: the items stay
                queued).
        """
        unit, finite = storable_vectors(vectors, len(batch.texts), self.provider.dimensions)
        if not finite.all():
            bad = [f"{t} {item}" for (t, item, _, _), ok in zip(batch.targets, finite, strict=True) if not ok]
            self.stats.failures += len(bad)
            self.stats.last_error = f"non-finite vectors for {', '.join(bad[:5])}"
            log.error("embedder: the model gave %d items vectors holding NaN or infinity; they get none: %s",
                      len(bad), ", ".join(bad[:20]))
            batch.targets = [t for t, ok in zip(batch.targets, finite, strict=True) if ok]
        return unit

    def _model_enter(self) -> None:
        """Count the model's busy time once however many batches it has (and its idle time
        between batches, from the first batch on)."""
        now = time.perf_counter()
        if self._in_model == 0:
            if self._idle_since is not None:
                self.stats.idle_seconds += now - self._idle_since
            self._busy_since = now
        self._in_model += 1

    def _model_exit(self) -> None:
        self._in_model -= 1
        if self._in_model == 0:
            now = time.perf_counter()
            self.stats.model_seconds += now - self._busy_since
            self._idle_since = now

    async def _write(self, batch: _Batch) -> None:
        assert self.space is not None
        space, vectors = self.space, batch.vectors
        if vectors is None and batch.texts:  # the model failed: leave the items leased until they expire
            self._forget(batch)
            return
        t0 = time.perf_counter()
        consolidate = self.consolidation
        mids = [item for t, item, _, _ in batch.targets if t == "memory"] if consolidate is not None else []
        async with self._pool.connection() as conn, conn.transaction():
            if vectors is not None:
                for item_type in ("memory", "entry"):
                    params = [(item, rev, board, vectors[i])
                              for i, (t, item, rev, board) in enumerate(batch.targets) if t == item_type]
                    if params:
                        async with conn.cursor() as c:
                            await c.executemany(q.upsert_vectors(space, item_type), params)
                if mids:
                    await conn.execute(consolidate_sql.ENQUEUE, (mids,))
            await self._done(conn, batch.claimed)
        if consolidate is not None and mids:
            consolidate()
        if tracing.enabled and batch.leased_ns:  # each item's span, in its write's trace
            streams = {"memory": MEMORY_STREAM, "entry": Subjects(self.settings.board.bucket).kv_stream}
            tracing.embedding_spans([(streams[t], seq) for t, _, seq, _ in batch.targets], self.provider.model,
                                    batch.leased_ns)
        self._forget(batch)
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.embedded += len(batch.targets)
        self.stats.batches += 1

    def _forget(self, batch: _Batch) -> None:
        with contextlib.suppress(ValueError):
            self._inflight.remove(batch)

    async def _release_inflight(self, batches: Sequence[_Batch] | None = None) -> None:
        """Give the leases of unwritten batches back, so another embedder takes them now."""
        todo = list(self._inflight if batches is None else batches)
        for b in todo:
            self._forget(b)
        claimed = [c for b in todo for c in b.claimed]
        if not claimed:
            return
        with contextlib.suppress(Exception):
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(q.RELEASE, ([c.item_type for c in claimed], [c.item for c in claimed],
                                               [c.enqueued_at for c in claimed]))

    async def _load(self, conn: psycopg.AsyncConnection[Any], claimed: list[_Claimed]
                    ) -> tuple[list[str], list[tuple[ItemType, int, int, str]], set[tuple[ItemType, int]]]:
        mids = [c.item for c in claimed if c.item_type == "memory"]
        eids = [c.item for c in claimed if c.item_type == "entry"]
        texts: list[str] = []
        targets: list[tuple[ItemType, int, int, str]] = []
        found: set[tuple[ItemType, int]] = set()
        if mids:
            cur = await conn.execute(q.LOAD_MEMORIES, (mids,))
            for mid, seq, text, metadata, board, lines, context in await cur.fetchall():
                texts.append(memory_embed_text(text, metadata, lines=lines, context=context))
                targets.append(("memory", int(mid), int(seq), str(board)))
                found.add(("memory", int(mid)))
        if eids:
            cur = await conn.execute(q.LOAD_ENTRIES, (eids,))
            for eid, rev, text, deleted, board in await cur.fetchall():
                if deleted or not text:
                    continue
                texts.append(text[:MAX_EMBED_CHARS])
                targets.append(("entry", int(eid), int(rev), str(board)))
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
