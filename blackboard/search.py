"""Search over the Postgres side: semantic, keyword and hybrid, plus history and as-of reads.

:class:`SearchEngine` does the IO (a pool and an embedding provider); term
selection, fusion and row shaping are pure functions.

* **semantic**: cosine similarity on the HNSW index of the provider's space
  (iterative scans, exact re-scan when a selective filter leaves it short).
* **keyword**: BM25 over PostgreSQL full text (see
  :func:`blackboard.db.search_sql.keyword_query`); query words estimated to
  match very many items do not generate candidates (:func:`candidate_lexemes`).
* **hybrid**: the keyword query runs while the query is embedded, then the
  ANN query; the union of both candidate lists gets both scores (the cosine of
  keyword-only candidates is computed exactly; items without a keyword match
  score 0 there), each retriever's scores are min-max normalised over the
  union and combined as a weighted mean (:func:`fuse_convex`), a convex
  combination, which keeps how far apart the scores are where reciprocal-rank
  fusion (:func:`rrf`, ``settings.search.fusion = "rrf"``) keeps only the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

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

__all__ = ["Fused", "SearchEngine", "TermStats", "candidate_lexemes", "fuse_convex", "neighbour_map", "rrf",
           "smooth_neighbours"]

#: Rank constant of reciprocal-rank fusion (Cormack et al. 2009).
RRF_K = 60

Target = Literal["memory", "entry"]
Request = MemorySearchRequest | EntrySearchRequest
Conn = psycopg.AsyncConnection[Any]


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


def fuse_convex(scores: Mapping[str, Mapping[int, float]], weights: Mapping[str, float] | None = None,
                parts: Mapping[str, Mapping[int, float]] | None = None) -> list[Fused]:
    """Convex combination of min-max normalised scores.

    Args:
        scores: per retriever, the score of every candidate (give each
            retriever a score for the same items; an item a retriever lacks
            counts as that retriever's lowest score).
        weights: per retriever (default 1.0); normalised to sum to 1.
        parts: the raw scores to report per item (default: ``scores``).

    Returns:
        Items best first, scores in 0..1 (1.0: best of every retriever). A
        retriever whose scores are all equal adds nothing. Ties keep the order
        of first appearance.
    """
    weights = weights or {}
    total_w = sum(weights.get(name, 1.0) for name in scores) or 1.0
    order: dict[int, None] = {}
    for s in scores.values():
        order.update(dict.fromkeys(s))
    fused = dict.fromkeys(order, 0.0)
    for name, s in scores.items():
        if not s:
            continue
        lo, hi = min(s.values()), max(s.values())
        if hi <= lo:
            continue
        w = weights.get(name, 1.0) / total_w
        for item in fused:
            fused[item] += w * (s.get(item, lo) - lo) / (hi - lo)
    shown = parts if parts is not None else scores
    out = [Fused(i, v, {n: float(p[i]) for n, p in shown.items() if i in p}) for i, v in fused.items()]
    out.sort(key=lambda f: -f.score)
    return out


def smooth_neighbours(fused: Sequence[Fused], neighbours: Mapping[int, Sequence[int | None]],
                      weight: float) -> list[Fused]:
    """Let each item borrow ``weight`` times the score of its best-scoring neighbour.

    A memory right before or after a strongly matching one on the same board
    (the reply to a question, the next chunk of a document) is often what
    the query is after, though its own words do not say so. Neighbours that
    are not among ``fused`` add nothing. Scores are divided by ``1 + weight``
    (so they stay within 0..1); ties keep their order.
    """
    if weight <= 0 or not fused:
        return list(fused)
    score = {f.item: f.score for f in fused}
    out = []
    for f in fused:
        near = max((score.get(n, 0.0) for n in neighbours.get(f.item, ()) if n is not None), default=0.0)
        out.append(Fused(f.item, (f.score + weight * near) / (1 + weight), f.parts))
    out.sort(key=lambda f: -f.score)
    return out


def neighbour_map(links: Iterable[tuple[int, int | None, int | None]]) -> dict[int, list[int]]:
    """Both directions of ``(item, previous, next)`` links: each item's known neighbours."""
    out: dict[int, list[int]] = {}
    for item, prev, nxt in links:
        for other in (prev, nxt):
            if other is not None:
                out.setdefault(item, []).append(other)
                out.setdefault(other, []).append(item)
    return out


@dataclass(frozen=True, slots=True)
class TermStats:
    """How often lexemes occur in a table's ``tsv`` (ANALYZE's most common elements)."""

    freqs: Mapping[str, float]
    rows: float
    at: float = 0.0


def candidate_lexemes(lexemes: Sequence[str], stats: TermStats | None, max_rows: int) -> list[str]:
    """The query lexemes that generate keyword candidates.

    A lexeme estimated to match more than ``max_rows`` items is left out when
    a rarer one remains (it would cost a scan of most of the table for an
    inverse document frequency near zero); when all are that frequent, the
    rarest one is kept. Without statistics every lexeme is kept.
    """
    if stats is None or stats.rows <= 0:
        return list(lexemes)
    est = {lx: stats.freqs.get(lx, 0.0) * stats.rows for lx in lexemes}
    kept = [lx for lx in lexemes if est[lx] <= max_rows]
    if kept or not lexemes:
        return kept
    return [min(lexemes, key=lambda lx: est[lx])]


def _value(value: Any, raw: bytes | None) -> Any:
    return codec.decode(bytes(raw)) if raw is not None else value


def _target(req: Request) -> Target:
    return "memory" if isinstance(req, MemorySearchRequest) else "entry"


class SearchEngine:
    """Runs searches against PostgreSQL.

    Args:
        pool: open connection pool.
        provider: embeds queries; without one, semantic and hybrid searches
            raise ``SearchError`` (keyword search still works).
        settings: search settings (ef_search, fusion, keyword limits).
    """

    def __init__(self, pool: AsyncConnectionPool, provider: EmbeddingProvider | None,
                 settings: SearchSettings) -> None:
        self.pool = pool
        self.provider = provider
        self.settings = settings
        self._space: Space | None = None
        self._touched: set[int] = set()
        self._stats: dict[Target, tuple[TermStats | None, float]] = {}
        # Query text -> embedding, least recently used first (the model costs more than the search).
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        # ef_search each pooled connection was given (session settings survive checkouts).
        self._scan_ef: weakref.WeakKeyDictionary[Conn, int] = weakref.WeakKeyDictionary()

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
        cached = self._queries.get(text)
        if cached is not None:
            self._queries.move_to_end(text)
            return cached
        vecs = await self.provider.embed([text])
        vec = np.asarray(vecs[0], dtype=np.float32)
        if self.settings.query_cache_size:
            self._queries[text] = vec
            while len(self._queries) > self.settings.query_cache_size:
                self._queries.popitem(last=False)
        return vec

    async def _scan_settings(self, conn: Conn, ef_search: int) -> None:
        """Session-level HNSW settings, set once per connection (and again when ef_search changes)."""
        if self._scan_ef.get(conn) == ef_search:
            return
        await conn.execute(q.SET_SCAN_SESSION, (str(ef_search),))
        await conn.commit()  # a rolled-back transaction would undo the settings
        self._scan_ef[conn] = ef_search

    async def _semantic(self, conn: Conn, req: Request, vector: np.ndarray, limit: int,
                        ef_search: int) -> list[tuple[int, float]]:
        """Nearest items passing the filters, best first."""
        space = await self.space()
        await self._scan_settings(conn, max(ef_search, limit))
        sql_, params = q.semantic_query(space, req, vector, limit)
        rows = await (await conn.execute(sql_, params)).fetchall()
        if len(rows) < limit and len(params) > 3:
            # A filter so selective that the index scan ran dry before filling
            # `limit`: scan the filtered rows exactly instead.
            sql_, params = q.semantic_query(space, req, vector, limit, exact=True)
            rows = await (await conn.execute(sql_, params)).fetchall()
        hits = [(int(r[0]), float(r[1])) for r in rows]
        hits.sort(key=lambda h: -h[1])  # relaxed_order may be slightly out of order
        return hits

    async def _term_stats(self, conn: psycopg.AsyncConnection[Any], target: Target) -> TermStats | None:
        now = time.monotonic()
        cached = self._stats.get(target)
        if cached is not None and now - cached[1] < self.settings.term_stats_ttl:
            return cached[0]
        sql_, params = q.term_stats_query(target)
        row = await (await conn.execute(sql_, params)).fetchone()
        stats = None
        if row is not None and row[0] is not None and row[1] is not None and row[2] is not None:
            # most_common_elem_freqs has three extra trailing entries (min, max, nulls): zip drops them.
            stats = TermStats(dict(zip(row[0], (float(f) for f in row[1]), strict=False)), float(row[2]), now)
        self._stats[target] = (stats, now)
        return stats

    async def _keyword(self, conn: Conn, req: Request, limit: int) -> list[tuple[int, float]]:
        cur = await conn.execute(q.QUERY_LEXEMES, (req.query,))
        lexemes = [str(r[0]) for r in await cur.fetchall()][: q.MAX_QUERY_LEXEMES]
        if not lexemes:  # only stop words
            return []
        stats = await self._term_stats(conn, _target(req))
        sql_, params = q.keyword_query(
            req, lexemes, candidate_lexemes(lexemes, stats, self.settings.keyword_term_max_rows), limit,
            max_candidates=self.settings.keyword_max_candidates)
        rows = await (await conn.execute(sql_, params)).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    async def _keyword_own(self, req: Request, limit: int) -> list[tuple[int, float]]:
        async with self.pool.connection() as conn:
            try:
                return await self._keyword(conn, req, limit)
            finally:
                await conn.rollback()

    async def _search(self, req: Request, fetch: str) -> tuple[list[Fused], dict[int, tuple[Any, ...]]]:
        """Ranked, cut results and their rows (``fetch``: the row query by id)."""
        try:
            if req.mode == "hybrid":
                # The keyword query runs on a connection of its own while the
                # query is embedded and the ANN query runs.
                # (The search service admits fewer requests than the pool has
                # connections, so a request holding one while it waits for its
                # keyword query always leaves one for that query.)
                keyword_task = asyncio.create_task(self._keyword_own(req, self._depth(req)))
                try:
                    vec = await self._embed(req.query)
                    async with self.pool.connection() as conn:
                        try:
                            fused = self._cut(await self._hybrid(conn, req, vec, keyword_task), req)
                            return fused, await self._rows(conn, fetch, fused)
                        finally:
                            await conn.rollback()
                finally:
                    if not keyword_task.done():
                        keyword_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                        await keyword_task
            query_vec = await self._embed(req.query) if req.mode == "semantic" else None
            async with self.pool.connection() as conn:
                try:
                    if query_vec is not None:
                        nearest = await self._semantic(conn, req, query_vec, req.top_k, self.settings.ef_search)
                        ranked = [Fused(i, s, {"semantic": s}) for i, s in nearest]
                    else:
                        ranked = [Fused(i, s, {"keyword": s}) for i, s in await self._keyword(conn, req, req.top_k)]
                    fused = self._cut(ranked, req)
                    return fused, await self._rows(conn, fetch, fused)
                finally:
                    await conn.rollback()
        except psycopg.OperationalError as exc:
            raise StorageError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SearchError(f"search query failed: {exc}") from exc

    @staticmethod
    async def _rows(conn: Conn, fetch: str, fused: Sequence[Fused]) -> dict[int, tuple[Any, ...]]:
        if not fused:
            return {}
        cur = await conn.execute(fetch, ([f.item for f in fused],))
        return {int(r[0]): r for r in await cur.fetchall()}

    def _depth(self, req: Request) -> int:
        return max(req.top_k * self.settings.hybrid_depth, self.settings.hybrid_min_candidates)

    async def _hybrid(self, conn: Conn, req: Request, vec: np.ndarray,
                      keyword_task: asyncio.Task[list[tuple[int, float]]]) -> list[Fused]:
        semantic = await self._semantic(conn, req, vec, self._depth(req), self.settings.hybrid_ef_search)
        keyword = await keyword_task
        weights = {"semantic": self.settings.semantic_weight, "keyword": self.settings.keyword_weight}
        if self.settings.fusion == "rrf":
            return rrf({"semantic": semantic, "keyword": keyword}, weights)
        sem = dict(semantic)
        kw = dict(keyword)
        missing = [i for i in kw if i not in sem]
        if missing:  # keyword-only candidates: their exact cosine
            sql_, params = q.vector_scores(await self.space(), _target(req), missing, vec)
            sem.update((int(r[0]), float(r[1])) for r in await (await conn.execute(sql_, params)).fetchall())
        items = list(dict.fromkeys([*(i for i, _ in semantic), *kw]))
        floor = min(sem.values(), default=0.0)  # an item not embedded yet ranks last here
        scores = {"semantic": {i: sem.get(i, floor) for i in items}, "keyword": {i: kw.get(i, 0.0) for i in items}}
        fused = fuse_convex(scores, weights, parts={"semantic": sem, "keyword": kw})
        if isinstance(req, MemorySearchRequest) and self.settings.neighbour_weight > 0 and fused:
            # Only strong items lend much: look up the neighbours of the leading ones.
            lead = [f.item for f in fused[: max(2 * req.top_k, 20)]]
            rows = await (await conn.execute(q.NEIGHBOURS, (lead,))).fetchall()
            fused = smooth_neighbours(fused, neighbour_map((int(r[0]), r[1], r[2]) for r in rows),
                                      self.settings.neighbour_weight)
        return fused

    def _cut(self, fused: list[Fused], req: MemorySearchRequest | EntrySearchRequest) -> list[Fused]:
        if req.min_score is not None:
            fused = [f for f in fused if f.score >= req.min_score]
        return fused[: req.top_k]

    async def search_memories(self, req: MemorySearchRequest) -> MemorySearchResponse:
        """Search long-term memories (see :class:`MemorySearchRequest`)."""
        t0 = time.perf_counter()
        fused, rows = await self._search(req, q.fetch_memories())
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
        fused, rows = await self._search(req, q.fetch_entries())
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
