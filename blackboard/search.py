"""Search over the Postgres side: semantic, keyword and hybrid, plus history and as-of reads.

:class:`SearchEngine` does the IO (a pool and an embedding provider); fusion
and row shaping are pure functions. Hybrid search runs the keyword query while
the query is being embedded, then the vector query, and fuses both ranked
lists with weighted reciprocal-rank fusion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool

from blackboard import codec
from blackboard.db import search_sql as q
from blackboard.db.spaces import Space, find_space
from blackboard.embeddings import EmbeddingProvider
from blackboard.errors import NotFoundError, SearchError, StorageError
from blackboard.schemas.search import (
    AsOfRequest,
    EntryHit,
    EntryRevision,
    EntrySearchRequest,
    EntrySearchResponse,
    HistoryRequest,
    HistoryResponse,
    MemoryHit,
    MemorySearchRequest,
    MemorySearchResponse,
)
from blackboard.settings import SearchSettings

__all__ = ["Fused", "SearchEngine", "rrf"]

#: Rank constant of reciprocal-rank fusion (Cormack et al. 2009).
RRF_K = 60


@dataclass(frozen=True, slots=True)
class Fused:
    """One fused result: the item, its fused score and each retriever's score."""

    item: int
    score: float
    parts: dict[str, float]


def rrf(ranked: dict[str, Sequence[tuple[int, float]]], weights: dict[str, float] | None = None,
        k: int = RRF_K) -> list[Fused]:
    """Weighted reciprocal-rank fusion of ranked ``(item, score)`` lists.

    The fused score is normalised by its maximum (an item ranked first by every
    retriever scores 1.0). Ties keep the order of first appearance.
    """
    weights = weights or {}
    total: dict[int, float] = {}
    parts: dict[int, dict[str, float]] = {}
    for name, hits in ranked.items():
        w = weights.get(name, 1.0)
        for rank, (item, score) in enumerate(hits):
            total[item] = total.get(item, 0.0) + w / (k + rank + 1)
            parts.setdefault(item, {})[name] = float(score)
    best = sum(weights.get(name, 1.0) for name in ranked) / (k + 1) or 1.0
    out = [Fused(i, s / best, parts[i]) for i, s in total.items()]
    out.sort(key=lambda f: -f.score)
    return out


def _value(value: Any, raw: bytes | None) -> Any:
    return codec.decode(bytes(raw)) if raw is not None else value


class SearchEngine:
    """Runs searches against PostgreSQL.

    Args:
        pool: open connection pool.
        provider: embeds queries; without one, semantic and hybrid searches
            raise ``SearchError`` (keyword search still works).
        settings: search settings (ef_search, fusion weights).
    """

    def __init__(self, pool: AsyncConnectionPool, provider: EmbeddingProvider | None,
                 settings: SearchSettings) -> None:
        self.pool = pool
        self.provider = provider
        self.settings = settings
        self._space: Space | None = None
        self._touched: set[int] = set()

    async def space(self) -> Space:
        """The embedding space of the provider's (model, dimensions).

        Raises:
            SearchError: no provider, or no worker has embedded with this model yet.
        """
        if self.provider is None:
            raise SearchError("semantic search needs an embedding provider (worker.embed is off)")
        if self._space is None:
            async with self.pool.connection() as conn:
                self._space = await find_space(conn, self.provider.model, self.provider.dimensions)
            if self._space is None:
                raise SearchError(f"no embeddings for model {self.provider.model!r} "
                                  f"({self.provider.dimensions} dims) yet: run a worker or reindex")
        return self._space

    async def _embed(self, text: str) -> np.ndarray:
        assert self.provider is not None
        vecs = await self.provider.embed([text])
        return np.asarray(vecs[0], dtype=np.float32)

    async def _semantic(self, req: MemorySearchRequest | EntrySearchRequest, vector: np.ndarray,
                        limit: int) -> list[tuple[int, float]]:
        space = await self.space()
        sql_, params = q.semantic_query(space, req, vector, limit)
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(q.SET_SCAN, (str(max(self.settings.ef_search, limit)),))
            rows = await (await conn.execute(sql_, params)).fetchall()
            has_filters = len(params) > 3
            if len(rows) < limit and has_filters:
                # The filter is so selective that the index scan ran dry before
                # filling `limit`: scan the filtered rows exactly instead.
                sql_, params = q.semantic_query(space, req, vector, limit, exact=True)
                rows = await (await conn.execute(sql_, params)).fetchall()
        hits = [(int(r[0]), float(r[1])) for r in rows]
        hits.sort(key=lambda h: -h[1])  # relaxed_order may be slightly out of order
        return hits

    async def _keyword(self, req: MemorySearchRequest | EntrySearchRequest, limit: int) -> list[tuple[int, float]]:
        sql_, params = q.keyword_query(req, limit)
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(sql_, params)).fetchall()
            await conn.rollback()
        return [(int(r[0]), float(r[1])) for r in rows]

    async def _ranked(self, req: MemorySearchRequest | EntrySearchRequest) -> list[Fused]:
        try:
            if req.mode == "keyword":
                return [Fused(i, s, {"keyword": s}) for i, s in await self._keyword(req, req.top_k)]
            if req.mode == "semantic":
                vec = await self._embed(req.query)
                return [Fused(i, s, {"semantic": s}) for i, s in await self._semantic(req, vec, req.top_k)]
            depth = max(req.top_k * self.settings.hybrid_depth, self.settings.hybrid_min_candidates)
            keyword = asyncio.create_task(self._keyword(req, depth))
            try:
                vec = await self._embed(req.query)
                semantic = await self._semantic(req, vec, depth)
            finally:
                kw = await keyword
            weights = {"semantic": self.settings.semantic_weight, "keyword": self.settings.keyword_weight}
            return rrf({"semantic": semantic, "keyword": kw}, weights)
        except psycopg.OperationalError as exc:
            raise StorageError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SearchError(f"search query failed: {exc}") from exc

    def _cut(self, fused: list[Fused], req: MemorySearchRequest | EntrySearchRequest) -> list[Fused]:
        if req.min_score is not None:
            fused = [f for f in fused if f.score >= req.min_score]
        return fused[: req.top_k]

    async def search_memories(self, req: MemorySearchRequest) -> MemorySearchResponse:
        """Search long-term memories (see :class:`MemorySearchRequest`)."""
        t0 = time.perf_counter()
        fused = self._cut(await self._ranked(req), req)
        rows: dict[int, tuple[Any, ...]] = {}
        if fused:
            async with self.pool.connection() as conn:
                cur = await conn.execute(q.fetch_memories(), ([f.item for f in fused],))
                rows = {int(r[0]): r for r in await cur.fetchall()}
                await conn.rollback()
        hits = []
        for f in fused:
            r = rows.get(f.item)
            if r is None:
                continue
            hits.append(MemoryHit(id=r[1], board=r[2], agent=r[3], kind=r[4], text=r[5], tags=r[6],
                                  metadata=r[7], importance=r[8], source=r[9], created_at=r[10],
                                  updated_at=r[11], revision=r[12], score=f.score, scores=f.parts))
        self._touched.update(f.item for f in fused)
        return MemorySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    async def search_entries(self, req: EntrySearchRequest) -> EntrySearchResponse:
        """Search current board entries (see :class:`EntrySearchRequest`)."""
        t0 = time.perf_counter()
        fused = self._cut(await self._ranked(req), req)
        rows: dict[int, tuple[Any, ...]] = {}
        if fused:
            async with self.pool.connection() as conn:
                cur = await conn.execute(q.fetch_entries(), ([f.item for f in fused],))
                rows = {int(r[0]): r for r in await cur.fetchall()}
                await conn.rollback()
        hits = []
        for f in fused:
            r = rows.get(f.item)
            if r is None:
                continue
            hits.append(EntryHit(board=r[1], section=r[2], key=r[3], revision=r[4], value=_value(r[5], r[6]),
                                 content_type=r[7], tags=r[8], metadata=r[9], author=r[10], created_at=r[11],
                                 updated_at=r[12], score=f.score, scores=f.parts))
        return EntrySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    @staticmethod
    def _revision(r: Sequence[Any]) -> EntryRevision:
        return EntryRevision(board=r[0], section=r[1], key=r[2], revision=r[3], op=r[4], value=_value(r[5], r[6]),
                             content_type=r[7], tags=r[8], metadata=r[9], author=r[10], created_at=r[11],
                             stored_at=r[12])

    async def history(self, req: HistoryRequest) -> HistoryResponse:
        """Every stored revision of a key, oldest first.

        Raises:
            NotFoundError: the key has no stored revision.
        """
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.HISTORY, (req.board, req.section, req.key, req.limit or 2**62))
            rows = await cur.fetchall()
            await conn.rollback()
        if not rows:
            raise NotFoundError(f"{req.board}.{req.section}.{req.key}", "no stored revision of this key")
        return HistoryResponse(revisions=[self._revision(r) for r in rows])

    async def as_of(self, req: AsOfRequest) -> EntryRevision:
        """The revision of a key current at ``req.revision`` or ``req.at``.

        Raises:
            NotFoundError: the key did not exist then, or was deleted.
        """
        sql_, when = (q.AS_OF_REVISION, req.revision) if req.revision is not None else (q.AS_OF_AT, req.at)
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql_, (req.board, req.section, req.key, when))
            row = await cur.fetchone()
            await conn.rollback()
        name = f"{req.board}.{req.section}.{req.key}"
        if row is None:
            raise NotFoundError(name, f"{name!r} did not exist at that point")
        rev = self._revision(row)
        if rev.op != "PUT":
            raise NotFoundError(name, f"{name!r} was deleted at that point (revision {rev.revision})")
        return rev

    async def flush_touched(self) -> None:
        """Record ``last_accessed`` of the memories returned since the last flush."""
        if not self._touched:
            return
        mids, self._touched = sorted(self._touched), set()
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(q.TOUCH_MEMORIES, (mids,))
