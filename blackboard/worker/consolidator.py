"""Near-duplicate consolidation of long-term memories, after they are embedded.

The embedder queues every memory whose vector it wrote (``bb_consolidate_queue``,
in the same transaction) and wakes the :class:`Consolidator`, which also looks
every ``memory.consolidate_interval`` seconds. For each queued memory that is
current (live, not superseded, not contested) it finds the nearest current
memory of the same scope (board; and agent with ``memory.dedup_per_agent``), the
same embedding space and the same subject key (or both without one). At a
cosine of ``memory.near_threshold`` or more, the newer of the two (by write
time, then stream order) is merged into the older:

* the newer is archived (``archive_reason`` ``merged``, ``merged_into`` the
  kept id); it becomes a source of the kept memory (``bb_memory_sources``, how
  ``near``, with its stream, sequence and signature), and its own sources
  move with it;
* the kept memory counts it (``seen_count`` and ``hits`` summed, ``last_seen``
  the later).

Every write is conditional on the versions read (their ``mid`` *and* ``seq``,
still current): a memory written or changed while the merge was being
decided is never overwritten; the merge rolls back as a whole and counts as a
conflict (the changed memory is embedded and queued again anyway, so it is
looked at afresh). A ``before_write`` callback (a test hook) runs between the
read and the write.

With a chat model (``llm.base_url``), ``memory.llm_merge`` merges the two
texts into one and ``memory.llm_extract_kinds`` turns memories of those kinds
into atomic facts: both are *derived* memories the worker publishes signed,
with provenance (:mod:`blackboard.worker.derived`), stored by ingest under the
same condition. A model that fails is logged and counted; a merge then keeps
the older text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from blackboard.db import consolidate_sql as q
from blackboard.db.spaces import Space
from blackboard.protocol.errors import BlackboardError, LLMError
from blackboard.protocol.schemas.provenance import SourceRef
from blackboard.settings import Settings
from blackboard.worker._tasks import first_of
from blackboard.worker.derived import DerivedPublisher, MemoryVersion, fact_records, merge_record
from blackboard.worker.llm import ChatModel

__all__ = ["ConsolidateStats", "Consolidator", "Merge", "consolidation_enabled"]

log = logging.getLogger("blackboard.worker.consolidator")

#: Queued memories taken per pass.
_BATCH = 32
#: Seconds a pass holds its memories before another consolidator may take them (a crash
#: leaves them to be taken again after this).
_LEASE = 300.0
#: LLM merges remembered as published (see ``Consolidator._published``).
_PUBLISHED_KEPT = 10_000


def consolidation_enabled(settings: Settings) -> bool:
    """Whether the worker consolidates embedded memories: near-duplicates, or a chat model
    (``llm.base_url``) that merges or extracts."""
    m = settings.memory
    llm = settings.llm.base_url is not None and (m.llm_merge or bool(m.llm_extract_kinds))
    return m.near_duplicates or llm


@dataclass
class ConsolidateStats:
    """Counters of a :class:`Consolidator` since start."""

    #: Queued memories looked at.
    checked: int = 0
    #: Near-duplicates merged by the worker itself (archived into the older memory).
    merged: int = 0
    #: Merges rolled back because a memory changed after it was read.
    conflicts: int = 0
    #: Merged texts the chat model wrote (published as derived memories).
    llm_merges: int = 0
    #: Facts the chat model extracted (published as derived memories).
    facts: int = 0
    #: Chat model or publishing failures.
    llm_failures: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class Merge:
    """A merge decided from the versions read: ``merged`` goes into ``kept``."""

    kept: MemoryVersion
    merged: MemoryVersion
    cosine: float


class _Conflict(Exception):
    """A version read is no longer current: the merge rolls back."""


class Consolidator:
    """Merges near-duplicate memories of the embedded space ``space``.

    Args:
        pool: PostgreSQL pool.
        settings: ``memory.*`` (threshold, interval, scope, LLM use).
        space: the embedding space whose vectors are compared.
        publisher: publishes derived memories and reads sources' signatures (None: no
            derived memories, and merged sources are recorded without their signature).
        model: the chat model (None: no LLM merge or extraction).
        before_write: awaited between reading a merge's versions and writing it (a test hook).
    """

    def __init__(self, pool: AsyncConnectionPool, settings: Settings, space: Space, *,
                 publisher: DerivedPublisher | None = None, model: ChatModel | None = None,
                 before_write: Callable[[Merge], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.space = space
        self.publisher = publisher
        self.model = model
        self.before_write = before_write
        self.stats = ConsolidateStats()
        self._pool = pool
        self._wake = asyncio.Event()
        self._candidates = q.near_candidates(space, per_agent=settings.memory.dedup_per_agent)
        #: The version pairs whose LLM merge was published (until ingest archives them, they
        #: still look current: each other's near-duplicate is not merged twice).
        self._published: set[tuple[int, int, int, int]] = set()

    def wake(self) -> None:
        """Tell the consolidator memories were queued (called after the embedder's commit)."""
        self._wake.set()

    async def backlog(self) -> int:
        """Memories queued and not yet consolidated."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(q.QUEUE_SIZE)
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"checked": s.checked, "merged": s.merged, "conflicts": s.conflicts, "llm_merges": s.llm_merges,
                "facts": s.facts, "llm_failures": s.llm_failures, "last_error": s.last_error}

    async def run(self, stop: asyncio.Event) -> None:
        """Consolidate until ``stop`` is set: when woken, and every ``memory.consolidate_interval``."""
        interval = self.settings.memory.consolidate_interval
        while not stop.is_set():
            self._wake.clear()  # before the pass: a wake during it (memories queued meanwhile) is kept
            try:
                taken = await self.consolidate_once()
            except (psycopg.OperationalError, PoolTimeout) as exc:
                self.stats.last_error = repr(exc)
                log.warning("consolidator: PostgreSQL unavailable: %s", str(exc).strip()[:200])
                taken = 0
            if taken >= _BATCH:
                continue
            await first_of(stop, self._wake, timeout=interval)

    async def consolidate_once(self) -> int:
        """One pass over up to a batch of queued memories. Returns how many it took."""
        async with self._pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(q.CLAIM, {"lease": _LEASE, "n": _BATCH})
                claimed = [(int(m), e) for m, e in await cur.fetchall()]
            if not claimed:
                return 0
            async with conn.cursor(row_factory=dict_row) as c:
                await c.execute(self._candidates, {"mids": [m for m, _ in claimed],
                                                   "threshold": self.settings.memory.near_threshold})
                found = await c.fetchall()
            await conn.commit()
        for row in found:
            self.stats.checked += 1
            version = MemoryVersion.of(row)
            await self._extract(version)
            cosine = row["cosine"]
            if self.settings.memory.near_duplicates and row["n_mid"] is not None and cosine is not None:
                await self._merge(version, (int(row["n_mid"]), int(row["n_seq"])), float(cosine))
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(q.DONE, ([m for m, _ in claimed], [e for _, e in claimed]))
        return len(claimed)

    # -- merging ------------------------------------------------------------------
    async def _merge(self, version: MemoryVersion, other: tuple[int, int], cosine: float) -> None:
        """Merge ``version`` and its near-duplicate ``other`` (mid, seq: the version compared)."""
        async with self._pool.connection() as conn:
            async with conn.cursor(row_factory=dict_row) as c:
                await c.execute(q.READ_CURRENT, ([version.mid, other[0]],))
                current = {v.mid: v for v in map(MemoryVersion.of, await c.fetchall())}
            await conn.commit()
        me, neighbour = current.get(version.mid), current.get(other[0])
        if me is None or me.seq != version.seq:
            return  # changed (queued again once embedded) or merged since the batch was read
        if neighbour is None or neighbour.seq != other[1]:
            await self._requeue(me)  # its neighbour changed or went meanwhile: look again
            return
        kept, merged = sorted((me, neighbour), key=lambda v: (v.created_at, v.seq))
        merge = Merge(kept, merged, cosine)
        if self.before_write is not None:
            await self.before_write(merge)
        if await self._llm_merge(merge):
            return
        ref = await self._ref(merged)
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await self._write_merge(conn, merge, ref)
        except (_Conflict, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            self.stats.conflicts += 1
            log.info("consolidator: merge of %s into %s rolled back (%s)", merged.id, kept.id,
                     "changed since read" if isinstance(exc, _Conflict) else type(exc).__name__)
            # The changed side is queued again once embedded; the other one may have another
            # near-duplicate: both are looked at afresh.
            await self._requeue(kept, merged)
            return
        self.stats.merged += 1
        log.debug("consolidator: %s merged into %s (cosine %.3f)", merged.id, kept.id, cosine)

    async def _requeue(self, *versions: MemoryVersion) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(q.ENQUEUE, ([v.mid for v in versions],))

    @staticmethod
    async def _write_merge(conn: psycopg.AsyncConnection[Any], merge: Merge, ref: SourceRef) -> None:
        """The merge's writes, each conditional on the version read (raises :class:`_Conflict`)."""
        kept, merged = merge.kept, merge.merged
        await conn.execute(q.LOCK_MEMORIES, ([kept.mid, merged.mid],))  # one lock order (by mid)
        cur = await conn.execute(q.ARCHIVE_MERGED, {"into": kept.id, "mid": merged.mid, "seq": merged.seq})
        archived = await cur.fetchone()
        if archived is None:
            raise _Conflict
        _, seen, hits, last_seen = archived
        cur = await conn.execute(q.FOLD_INTO_KEPT, {"mid": kept.mid, "seq": kept.seq, "seen": seen, "hits": hits,
                                                    "last_seen": last_seen})
        if await cur.fetchone() is None:
            raise _Conflict
        await conn.execute(q.MOVE_SOURCES, {"into": kept.mid, "mid": merged.mid})
        await conn.execute(q.INSERT_SOURCES, (merged.id, kept.mid, merged.board, merged.agent, merged.stream,
                                              merged.seq, merged.created_at, ref.key, ref.sig, merged.verdict,
                                              "near"))

    async def _ref(self, version: MemoryVersion) -> SourceRef:
        if self.publisher is None:
            return SourceRef(stream=version.stream, seq=version.seq)
        return await self.publisher.source_ref(version)

    # -- the chat model -------------------------------------------------------------
    async def _llm_merge(self, merge: Merge) -> bool:
        """Publish the chat model's merge of the two texts as a derived memory (ingest archives
        the two if they are still current then). False: not configured, or it failed (the
        plain merge follows)."""
        if self.model is None or self.publisher is None or not self.settings.memory.llm_merge:
            return False
        pair = (merge.kept.mid, merge.kept.seq, merge.merged.mid, merge.merged.seq)
        if pair in self._published:
            return True
        try:
            text = await self.model.merge(merge.kept.text, merge.merged.text)
            if _same_text(text, merge.kept.text) or _same_text(text, merge.merged.text):
                return False  # nothing new to say: a plain merge keeps the older one
            refs = [await self._ref(merge.kept), await self._ref(merge.merged)]
            await self.publisher.publish(merge_record(merge.kept, merge.merged, text,
                                                      agent=self.publisher.principal, refs=refs))
        except (LLMError, BlackboardError) as exc:
            self._failed("merge", merge.merged.id, exc)
            return False
        self.stats.llm_merges += 1
        if len(self._published) >= _PUBLISHED_KEPT:
            self._published.clear()
        self._published.add(pair)
        return True

    async def _extract(self, version: MemoryVersion) -> None:
        """Publish the atomic facts of a memory of a kind in ``memory.llm_extract_kinds``."""
        if (self.model is None or self.publisher is None or version.kind not in self.settings.memory.llm_extract_kinds
                or version.agent == self.publisher.principal):  # never from what the worker derived
            return
        try:
            facts = await self.model.extract(version.text)
            if not facts:
                return
            ref = await self._ref(version)
            for record in fact_records(version, facts, agent=self.publisher.principal, ref=ref):
                await self.publisher.publish(record)
        except (LLMError, BlackboardError) as exc:
            self._failed("extraction", version.id, exc)
            return
        self.stats.facts += len(facts)

    def _failed(self, what: str, memory_id: str, exc: BaseException) -> None:
        self.stats.llm_failures += 1
        self.stats.last_error = repr(exc)
        log.warning("consolidator: %s of %s failed: %s", what, memory_id, exc)


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.casefold().split()) == " ".join(b.casefold().split())

