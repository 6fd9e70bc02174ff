"""Search over the Postgres side: semantic, keyword and hybrid, plus history and as-of reads.

:class:`SearchEngine` does the IO (a pool and an embedding provider); term
selection, fusion and row shaping are pure functions.

* **semantic**: cosine similarity on the HNSW index of the provider's space
  (iterative scans, exact re-scan when a selective filter leaves it short);
  boards estimated to hold few items (:func:`board_rows`) are scanned exactly
  through the vector table's covering board index instead.
* **keyword**: BM25 over PostgreSQL full text (see
  :func:`blackboard.db.search_sql.keyword_query`); query words estimated to
  match very many items do not generate candidates, and the rarest words
  generate them within a budget (:func:`candidate_lexemes`).
* **hybrid**: the keyword query runs while the query is embedded, then the
  ANN query; the union of both candidate lists gets both scores (the cosine of
  keyword-only candidates is computed exactly; items without a keyword match
  score 0 there), each retriever's scores are min-max normalised over the
  union and combined as a weighted mean (:func:`fuse_convex`), a convex
  combination, which keeps how far apart the scores are where reciprocal-rank
  fusion (:func:`rrf`, ``settings.search.fusion = "rrf"``) keeps only the order.
  The keyword side computes its candidates' cosines on its own connection
  (in its statement for a cached query vector, else as soon as the vector is
  there), so fusion needs no statement of its own; both retrievers return
  their candidates' rows, with the neighbours (which :func:`smooth_neighbours`
  lends scores to) of each one's leading candidates: no statement follows
  the fusion.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.db.spaces import Space, find_space
from blackboard.embeddings import EmbeddingProvider
from blackboard.protocol import codec
from blackboard.protocol.errors import EmbeddingError, NotFoundError, SearchError, StorageError
from blackboard.protocol.schemas.search import (
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

__all__ = ["BoardStats", "Fused", "SearchEngine", "TermStats", "board_rows", "candidate_lexemes", "fuse_convex",
           "neighbour_map", "rrf", "smooth_neighbours"]

log = logging.getLogger("blackboard.search.engine")
_T = TypeVar("_T")

#: Largest share of a table's items that the filtered boards may hold for an exact board scan: above
#: it, the HNSW scan keeps so many of the vectors it visits that it is the cheaper one (measured: a
#: board with half of 4,000 memories, 4.4 ms p50 through HNSW vs 8.7 ms exactly, including the model).
_EXACT_MAX_SHARE = 0.2

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
    fused = _convex_scores(scores, weights)
    return _ranked(fused, _best_first(fused), parts if parts is not None else scores)


def _convex_scores(scores: Mapping[str, Mapping[int, float]],
                  weights: Mapping[str, float] | None = None) -> dict[int, float]:
    """The fused score of every item (:func:`fuse_convex` without the ranking), in order of
    first appearance."""
    weights = weights or {}
    total_w = sum(weights.get(name, 1.0) for name in scores) or 1.0
    fused: dict[int, float] = {}
    for s in scores.values():
        fused.update(dict.fromkeys(s, 0.0))
    for name, s in scores.items():
        if not s:
            continue
        lo, hi = min(s.values()), max(s.values())
        if hi <= lo:
            continue
        w = weights.get(name, 1.0) / total_w
        get = s.get
        for item in fused:
            fused[item] += w * (get(item, lo) - lo) / (hi - lo)
    return fused


def _best_first(score: Mapping[int, float]) -> list[int]:
    """Items by descending score; ties keep their order."""
    return sorted(score, key=score.__getitem__, reverse=True)


def _first(items: Iterable[_T], score: Callable[[_T], float], limit: int | None,
           min_score: float | None) -> Iterator[_T]:
    """The first ``limit`` of ``items`` (in their order) scoring at least ``min_score``: how
    every result list is cut."""
    kept = items if min_score is None else (item for item in items if score(item) >= min_score)
    return itertools.islice(kept, limit)


def _ranked(score: Mapping[int, float], order: Sequence[int], parts: Mapping[str, Mapping[int, float]],
           limit: int | None = None, min_score: float | None = None) -> list[Fused]:
    """:class:`Fused` results for the items of ``order`` that :func:`_first` keeps, each with
    its retrievers' scores from ``parts`` (built only for those)."""
    return [Fused(item, score[item], {n: float(p[item]) for n, p in parts.items() if item in p})
            for item in _first(order, score.__getitem__, limit, min_score)]


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
    smoothed = _smoothed_scores({f.item: f.score for f in fused}, neighbours, weight)
    out = [Fused(f.item, smoothed[f.item], f.parts) for f in fused]
    out.sort(key=lambda f: -f.score)
    return out


def _smoothed_scores(score: Mapping[int, float], neighbours: Mapping[int, Sequence[int | None]],
                    weight: float) -> dict[int, float]:
    """The scores of :func:`smooth_neighbours` (same order as ``score``)."""
    get = score.get
    out: dict[int, float] = {}
    for item, value in score.items():
        near = max((get(n, 0.0) for n in neighbours.get(item, ()) if n is not None), default=0.0)
        out[item] = (value + weight * near) / (1 + weight)
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


def candidate_lexemes(lexemes: Sequence[str], stats: TermStats | None, max_rows: int,
                      budget: float | None = None, share: float = 1.0) -> list[str]:
    """The query lexemes that generate keyword candidates.

    A lexeme estimated to match more than ``max_rows`` items is left out when
    a rarer one remains (it would cost a scan of most of the table for an
    inverse document frequency near zero); when all are that frequent, the
    rarest one is kept. Of the others, the rarest are kept while their
    estimated matches add up to at most ``budget`` (the rarest one always):
    the candidates a query can score are bounded, and those left out match
    only commoner words, so they could score but little; a plain ``LIMIT`` on
    the candidates would drop arbitrary ones instead (the oldest rows come
    first), the best matches among them. Estimates are of the whole table
    times ``share`` (the filtered boards' part of it). Without statistics
    every lexeme is kept.
    """
    if stats is None or stats.rows <= 0:
        return list(lexemes)
    est = {lx: stats.freqs.get(lx, 0.0) * stats.rows * share for lx in lexemes}
    kept = [lx for lx in lexemes if est[lx] <= max_rows]
    if not kept:
        return [min(lexemes, key=lambda lx: est[lx])] if lexemes else []
    if budget is None:
        return kept
    chosen: set[str] = set()
    total = 0.0
    for lx in sorted(kept, key=lambda lx: est[lx]):
        if chosen and total + est[lx] > budget:
            break
        chosen.add(lx)
        total += est[lx]
    return [lx for lx in kept if lx in chosen]


@dataclass(frozen=True, slots=True)
class BoardStats:
    """How a table's items spread over boards (ANALYZE's statistics of its ``board`` column).

    ``freqs``: share of the rows of each most common board; ``n_distinct``:
    PostgreSQL's estimate of distinct boards (negative: a share of the rows;
    0: unknown); ``rows``: the table's estimated row count (negative: never
    counted).
    """

    freqs: Mapping[str, float]
    n_distinct: float
    rows: float
    at: float = 0.0


def board_rows(boards: Iterable[str], stats: BoardStats | None) -> float | None:
    """Estimated items of ``boards`` (the planner's formula), None if unknown.

    A board among the most common ones has its measured share; any other gets
    an equal part of what the common ones leave. Without column statistics
    every board may hold the whole table.
    """
    if stats is None or stats.rows < 0:
        return None
    rest = max(0.0, 1.0 - sum(stats.freqs.values())) * stats.rows
    distinct = stats.n_distinct if stats.n_distinct > 0 else -stats.n_distinct * stats.rows
    others = distinct - len(stats.freqs)
    per_other = rest / others if others >= 1 else rest
    total = sum(stats.freqs[b] * stats.rows if b in stats.freqs else per_other for b in set(boards))
    return min(total, stats.rows)


def _value(value: Any, raw: bytes | None) -> Any:
    return codec.decode(bytes(raw)) if raw is not None else value


def _json(text: str | None) -> Any:
    """A JSON column read as text (see :func:`search_sql.with_rows`)."""
    return None if text is None else json.loads(text)


def _target(req: Request) -> Target:
    return "memory" if isinstance(req, MemorySearchRequest) else "entry"


def _has_filters(req: Request) -> bool:
    return bool(q.filters(req)[1])


def _candidate_rows(*retrieved: Sequence[tuple[Any, ...]], linked: bool) -> dict[int, tuple[Any, ...]]:
    """Item -> full row, from retriever rows ``(item, score, flag, *row)``. With ``linked`` (rows
    ending with the neighbours, NULL for candidates outside a retriever's lead), an item that
    both retrievers returned keeps the row that has its neighbours."""
    rows: dict[int, tuple[Any, ...]] = {}
    for found in retrieved:
        for r in found:
            item = int(r[0])
            have = rows.get(item)
            if have is None or (linked and have[-2] is None and have[-1] is None):
                rows[item] = r[3:]
    return rows


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
        self._boards: dict[Target, BoardStats] = {}
        # Query text -> embedding, least recently used first (the model costs more than the search).
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        # Query word -> its lexemes (a query whose words were all seen needs no round trip for them).
        self._word_lexemes: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        # ef_search each pooled connection was given (session settings survive checkouts).
        self._scan_ef: weakref.WeakKeyDictionary[Conn, int] = weakref.WeakKeyDictionary()
        # Tables found never analysed (see analyze_missing).
        self._unanalysed: set[Target] = set()

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
        cached = self._cached_vector(text)
        if cached is not None:
            return cached
        vecs = await self.provider.embed([text])
        vec = np.asarray(vecs[0], dtype=np.float32)
        self._remember(self._queries, text, vec, self.settings.query_cache_size)
        return vec

    def _cached_vector(self, text: str) -> np.ndarray | None:
        return self._recall(self._queries, text)

    @staticmethod
    def _recall(cache: OrderedDict[str, _T], key: str) -> _T | None:
        """The cached value of ``key`` (now the most recently used), or None."""
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
        return value

    @staticmethod
    def _remember(cache: OrderedDict[str, _T], key: str, value: _T, size: int) -> None:
        """Keep ``value`` as the most recently used, dropping the least recently used beyond
        ``size`` entries (0: keep nothing)."""
        if size:
            cache[key] = value
            while len(cache) > size:
                cache.popitem(last=False)

    async def _scan_settings(self, conn: Conn, ef_search: int) -> None:
        """Session-level HNSW settings, set once per connection (and again when ef_search changes)."""
        if self._scan_ef.get(conn) == ef_search:
            return
        await conn.execute(q.SET_SCAN_SESSION, (str(ef_search),))
        await conn.commit()  # a rolled-back transaction would undo the settings
        self._scan_ef[conn] = ef_search

    async def _board_stats(self, conn: Conn, target: Target) -> BoardStats | None:
        now = time.monotonic()
        cached = self._boards.get(target)
        if cached is not None and now - cached.at < self.settings.term_stats_ttl:
            return cached
        sql_, params = q.board_stats_query(target)
        row = await (await conn.execute(sql_, params)).fetchone()
        stats = None
        if row is not None and row[3] is not None:
            freqs = dict(zip(row[0], (float(f) for f in row[1]), strict=False)) if row[0] and row[1] else {}
            stats = BoardStats(freqs, float(row[2] or 0.0), float(row[3]), now)
            self._note_unanalysed(target, float(row[3]))
        self._boards[target] = stats or BoardStats({}, 0.0, -1.0, now)
        return stats

    async def _exact(self, conn: Conn, req: Request) -> bool:
        """Whether to scan the filtered boards' vectors exactly rather than through the HNSW index:
        they are few, and a small share of the table (a filtered HNSW scan visits about
        1 / share vectors for each one it keeps; a large share keeps most of them)."""
        limit = self.settings.exact_scan_max_rows
        if not req.boards or limit <= 0:
            return False
        stats = await self._board_stats(conn, _target(req))
        rows = board_rows(req.boards, stats)
        return rows is not None and stats is not None and rows <= limit and rows <= _EXACT_MAX_SHARE * stats.rows

    async def _board_share(self, conn: Conn, req: Request) -> float:
        """The filtered boards' estimated share of the items (1.0 without a board filter or statistics)."""
        if not req.boards:
            return 1.0
        stats = await self._board_stats(conn, _target(req))
        rows = board_rows(req.boards, stats)
        return 1.0 if rows is None or stats is None or stats.rows <= 0 else rows / stats.rows

    async def _semantic(self, conn: Conn, req: Request, vector: np.ndarray, limit: int, ef_search: int, *,
                        rows: bool = False, linked: int = 0) -> list[tuple[Any, ...]]:
        """Rows ``(item, score, nearest)``: the nearest items passing the filters, best first
        (see :func:`search_sql.semantic_query`); with ``rows``, each followed by the item's full
        row (:func:`search_sql.with_rows`, ``linked`` as there)."""
        space = await self.space()
        exact = await self._exact(conn, req)
        if not exact:
            await self._scan_settings(conn, max(ef_search, limit))
        target = _target(req) if rows else None
        found = await self._run(conn, *q.semantic_query(space, req, vector, limit, exact=exact),
                                target=target, linked=linked)
        if not exact and sum(1 for r in found if r[2]) < limit and _has_filters(req):
            # A filter so selective that the index scan ran dry before filling
            # `limit`: scan the filtered rows exactly instead.
            found = await self._run(conn, *q.semantic_query(space, req, vector, limit, exact=True),
                                    target=target, linked=linked)
        # relaxed_order may be slightly out of order
        found.sort(key=lambda r: (not r[2], -float(r[1])))
        return found

    @staticmethod
    async def _run(conn: Conn, query: str, params: Sequence[Any], *,
                   target: Target | None = None, linked: int = 0) -> list[tuple[Any, ...]]:
        """The rows of ``query``; with a ``target``, each followed by the item's full row (and
        for the ``linked`` best, the item's neighbours: :func:`search_sql.with_rows`)."""
        if target is not None:
            query = q.with_rows(query, target, linked=linked)
        # Binary results: PostgreSQL skips formatting the rows as text (timestamps, arrays),
        # ~0.25 ms of a keyword statement returning 50 candidates' rows.
        return list(await (await conn.execute(query, params, binary=True)).fetchall())

    async def _term_stats(self, conn: psycopg.AsyncConnection[Any], target: Target) -> TermStats | None:
        now = time.monotonic()
        cached = self._stats.get(target)
        if cached is not None and now - cached[1] < self.settings.term_stats_ttl:
            return cached[0]
        sql_, params = q.term_stats_query(target)
        row = await (await conn.execute(sql_, params)).fetchone()
        stats = None
        if row is not None and row[2] is not None:
            self._note_unanalysed(target, float(row[2]))
        if row is not None and row[0] is not None and row[1] is not None and row[2] is not None:
            # most_common_elem_freqs has three extra trailing entries (min, max, nulls): zip drops them.
            stats = TermStats(dict(zip(row[0], (float(f) for f in row[1]), strict=False)), float(row[2]), now)
        self._stats[target] = (stats, now)
        return stats

    async def _lexemes(self, conn: Conn, text: str) -> list[str]:
        """The query's distinct lexemes under the index's configuration, sorted (the union of its
        words' lexemes, see :func:`search_sql.query_words`; words not seen recently are parsed by
        PostgreSQL, in one statement)."""
        words = q.query_words(text)
        found: dict[str, tuple[str, ...]] = {}
        missing = []
        for w in words:
            lx = self._recall(self._word_lexemes, w)
            if lx is None:
                missing.append(w)
            else:
                found[w] = lx
        if missing:
            parsed: dict[int, list[str]] = {}
            for i, lexeme in await (await conn.execute(q.WORD_LEXEMES, (missing,))).fetchall():
                parsed.setdefault(int(i), []).append(str(lexeme))
            for i, w in enumerate(missing, 1):
                found[w] = tuple(parsed.get(i, ()))
                self._remember(self._word_lexemes, w, found[w], self.settings.lexeme_cache_size)
        return sorted({lx for w in words for lx in found[w]})[: q.MAX_QUERY_LEXEMES]

    async def _keyword(self, conn: Conn, req: Request, limit: int, *, vector: np.ndarray | None = None,
                       rows: bool = False, linked: int = 0) -> list[tuple[Any, ...]]:
        """Rows ``(item, BM25 score, cosine or None)``, best first; with ``rows``, each followed
        by the item's full row (``linked`` as in :func:`search_sql.with_rows`)."""
        lexemes = await self._lexemes(conn, req.query)
        if not lexemes:  # only stop words
            return []
        stats = await self._term_stats(conn, _target(req))
        space = await self.space() if vector is not None else None
        chosen = candidate_lexemes(lexemes, stats, self.settings.keyword_term_max_rows,
                                   self.settings.keyword_candidate_budget, await self._board_share(conn, req))
        sql_, params = q.keyword_query(req, lexemes, chosen, limit, max_candidates=self.settings.keyword_max_candidates,
                                       space=space, vector=vector)
        found = await self._run(conn, sql_, params, target=_target(req) if rows else None, linked=linked)
        if rows:  # the join does not keep the order
            found.sort(key=lambda r: (-float(r[1]), int(r[0])))
        return found

    async def _keyword_own(self, req: Request, limit: int, *, vector: np.ndarray | None = None,
                           later: asyncio.Future[np.ndarray] | None = None, linked: int = 0
                           ) -> list[tuple[Any, ...]]:
        """:meth:`_keyword` on a connection of its own, with the candidates' rows (``linked`` as
        in :func:`search_sql.with_rows`). ``later``: the query's vector, still being computed;
        once the keyword statement is done, the candidates' cosines are computed here when it
        comes, so the rows carry their cosine either way."""
        async with self.pool.connection() as conn:
            try:
                rows = await self._keyword(conn, req, limit, vector=vector, rows=True, linked=linked)
                if vector is None and later is not None and rows:
                    vec = await later
                    sql_, params = q.vector_scores(await self.space(), _target(req), [int(r[0]) for r in rows], vec)
                    cosine = {int(r[0]): float(r[1]) for r in await (await conn.execute(sql_, params)).fetchall()}
                    rows = [(r[0], r[1], cosine.get(int(r[0])), *r[3:]) for r in rows]
                return rows
            finally:
                await conn.rollback()

    async def _search(self, req: Request) -> tuple[list[Fused], dict[int, tuple[Any, ...]]]:
        """Ranked, cut results and their rows (as :func:`search_sql.with_rows` gives them, without
        its first three columns).

        Run once more on a broken connection (see :meth:`_once_more`).
        """
        try:
            return await self._once_more(lambda: self._search_once(req))
        except psycopg.OperationalError as exc:
            raise StorageError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SearchError(f"search query failed: {exc}") from exc

    async def _search_once(self, req: Request) -> tuple[list[Fused], dict[int, tuple[Any, ...]]]:
        if req.mode == "hybrid":
            return await self._hybrid_search(req)
        # One retriever, no fusion: its statement returns the results' rows too.
        query_vec = await self._embed(req.query) if req.mode == "semantic" else None
        async with self.pool.connection() as conn:
            try:
                if query_vec is not None:
                    found = await self._semantic(conn, req, query_vec, req.top_k, self.settings.ef_search,
                                                 rows=True)
                else:
                    found = await self._keyword(conn, req, req.top_k, rows=True)
                ranked = [Fused(int(r[0]), float(r[1]), {req.mode: float(r[1])}) for r in found]
                return self._cut(ranked, req), {int(r[0]): r[3:] for r in found}
            finally:
                await conn.rollback()

    async def _hybrid_search(self, req: Request) -> tuple[list[Fused], dict[int, tuple[Any, ...]]]:
        """Keyword and nearest-neighbour candidates, fused (see the module docstring).

        The keyword query runs on a connection of its own while the query is
        embedded and the ANN query runs. (The search service admits fewer
        requests than the pool has connections, so a request holding one
        while it waits for its keyword query always leaves one for that
        query.) The keyword side returns its candidates with their cosine:
        in its statement when the query's vector is cached, else computed on
        its connection once the vector is there (while the ANN query runs on
        the other), so fusion itself is pure. Both retrievers' statements
        return their candidates' rows, and with neighbour smoothing the
        neighbours of each one's leading candidates (see :meth:`_fuse`):
        no statement follows the fusion.
        """
        depth = self._depth(req)
        convex = self.settings.fusion != "rrf"
        neighbours = convex and isinstance(req, MemorySearchRequest) and self.settings.neighbour_weight > 0
        lead = self._lead(req) if neighbours else 0
        await self.space()  # fail early (no provider, no space) before starting anything
        cached = self._cached_vector(req.query)
        # The model starts before the keyword side sends its first statement (tasks start in
        # the order they were made): a backend woken by a statement can take the sender's
        # core for a while, and the model's start then waited for it (in process, the two
        # orders alternating query by query: hybrid p50 -0.2 to -0.4 ms).
        embedding = None if cached is not None else asyncio.create_task(self._embed(req.query))
        later = asyncio.get_running_loop().create_future() if convex and cached is None else None
        keyword_task = asyncio.create_task(self._keyword_own(
            req, depth, vector=cached if convex else None, later=later, linked=lead))
        try:
            vec = await embedding if embedding is not None else cached
            assert vec is not None  # (no task only when the vector was cached)
            if later is not None:
                later.set_result(vec)
            async with self.pool.connection() as conn:
                try:
                    semantic = await self._semantic(conn, req, vec, depth, self.settings.hybrid_ef_search,
                                                    rows=True, linked=lead)
                    keyword = await keyword_task
                    rows = _candidate_rows(semantic, keyword, linked=lead > 0)
                    return self._fuse(semantic, keyword, req, rows if neighbours else None), rows
                finally:
                    await conn.rollback()
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()
                with contextlib.suppress(asyncio.CancelledError, EmbeddingError):
                    await embedding
            if later is not None and not later.done():
                later.cancel()
            if not keyword_task.done():
                keyword_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await keyword_task

    @staticmethod
    def _lead(req: Request) -> int:
        """How many of each retriever's best candidates come with their neighbours."""
        return max(2 * req.top_k, 20)

    def _depth(self, req: Request) -> int:
        return max(req.top_k * self.settings.hybrid_depth, self.settings.hybrid_min_candidates)

    def _fuse(self, semantic: Sequence[tuple[Any, ...]], keyword: Sequence[tuple[Any, ...]], req: Request,
              rows: Mapping[int, tuple[Any, ...]] | None = None) -> list[Fused]:
        """The results: both retrievers' rows ``(item, cosine, nearest)`` and ``(item, BM25,
        cosine)`` fused (the keyword rows carry every candidate's cosine, NULL for an item
        without a vector), with ``rows`` smoothed over the neighbour links that came with them
        (see :func:`smooth_neighbours`; only strong items lend much, and the links of each
        retriever's leading candidates, :meth:`_lead`, are there: the fused lead is almost
        always among them), then cut (``top_k``, ``min_score``). Only the results become
        :class:`Fused` objects."""
        weights = {"semantic": self.settings.semantic_weight, "keyword": self.settings.keyword_weight}
        ann = [(int(r[0]), float(r[1])) for r in semantic if r[2]]
        kw = {int(r[0]): float(r[1]) for r in keyword}
        if self.settings.fusion == "rrf":
            return self._cut(rrf({"semantic": ann, "keyword": list(kw.items())}, weights), req)
        sem = dict(ann)
        for r in keyword:
            if r[2] is not None:
                sem.setdefault(int(r[0]), float(r[2]))
        items = list(dict.fromkeys([*(i for i, _ in ann), *kw]))
        floor = min(sem.values(), default=0.0)  # an item not embedded yet ranks last here
        fused = _convex_scores({"semantic": {i: sem.get(i, floor) for i in items},
                                "keyword": {i: kw.get(i, 0.0) for i in items}}, weights)
        order = _best_first(fused)
        if rows is not None:
            links = neighbour_map((item, r[-2], r[-1]) for item, r in rows.items())
            fused = _smoothed_scores(fused, links, self.settings.neighbour_weight)
            order.sort(key=fused.__getitem__, reverse=True)  # stable: ties keep the fused order
        return _ranked(fused, order, {"semantic": sem, "keyword": kw}, req.top_k, req.min_score)

    @staticmethod
    def _cut(fused: list[Fused], req: MemorySearchRequest | EntrySearchRequest) -> list[Fused]:
        return list(_first(fused, lambda f: f.score, req.top_k, req.min_score))

    async def search_memories(self, req: MemorySearchRequest) -> MemorySearchResponse:
        """Search long-term memories (see :class:`MemorySearchRequest`)."""
        t0 = time.perf_counter()
        fused, rows = await self._search(req)
        hits = []
        for f in fused:
            r = rows.get(f.item)
            if r is None:
                continue
            hits.append(MemoryHit(id=r[1], board=r[2], agent=r[3], kind=r[4], text=r[5], tags=r[6],
                                  metadata=_json(r[7]), importance=r[8], source=r[9], created_at=r[10],
                                  updated_at=r[11], revision=r[12], score=f.score, scores=f.parts))
        self._touched.update(f.item for f in fused)
        return MemorySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    async def search_entries(self, req: EntrySearchRequest) -> EntrySearchResponse:
        """Search current board entries (see :class:`EntrySearchRequest`)."""
        t0 = time.perf_counter()
        fused, rows = await self._search(req)
        hits = []
        for f in fused:
            r = rows.get(f.item)
            if r is None:
                continue
            hits.append(EntryHit(board=r[1], section=r[2], key=r[3], revision=r[4],
                                 value=_value(_json(r[5]), r[6]), content_type=r[7], tags=r[8],
                                 metadata=_json(r[9]), author=r[10], created_at=r[11],
                                 updated_at=r[12], score=f.score, scores=f.parts))
        return EntrySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    @staticmethod
    def _revision(r: Sequence[Any]) -> EntryRevision:
        return EntryRevision(board=r[0], section=r[1], key=r[2], revision=r[3], op=r[4], value=_value(r[5], r[6]),
                             content_type=r[7], tags=r[8], metadata=r[9], author=r[10], created_at=r[11],
                             stored_at=r[12])

    async def _fetch(self, sql_: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of one read query, run once more on a broken connection (see :meth:`_once_more`)."""

        async def read() -> list[tuple[Any, ...]]:
            async with self.pool.connection() as conn:
                try:
                    return list(await (await conn.execute(sql_, params)).fetchall())
                finally:
                    await conn.rollback()

        try:
            return await self._once_more(read)
        except psycopg.OperationalError as exc:
            raise StorageError(f"PostgreSQL unavailable: {exc}") from exc

    async def _once_more(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``attempt()``; after a broken connection (the pool may hand one out unchecked), the pool
        checks its idle connections, replacing the broken ones (PostgreSQL restarted: all of them),
        and ``attempt()`` runs once more."""
        try:
            return await attempt()
        except psycopg.OperationalError as exc:
            log.info("search: a connection was broken (%s); checking the pool", str(exc).strip()[:200])
            with contextlib.suppress(Exception):
                await self.pool.check()
            return await attempt()

    async def history(self, req: HistoryRequest) -> HistoryResponse:
        """Every stored revision of a key, oldest first.

        Raises:
            NotFoundError: the key has no stored revision.
        """
        rows = await self._fetch(q.HISTORY, (req.board, req.section, req.key, req.limit or 2**62))
        if not rows:
            raise NotFoundError(f"{req.board}.{req.section}.{req.key}", "no stored revision of this key")
        return HistoryResponse(revisions=[self._revision(r) for r in rows])

    async def as_of(self, req: AsOfRequest) -> EntryRevision:
        """The revision of a key current at ``req.revision`` or ``req.at``.

        Raises:
            NotFoundError: the key did not exist then, was deleted, or (at a time) had expired.
        """
        sql_, when = (q.AS_OF_REVISION, req.revision) if req.revision is not None else (q.AS_OF_AT, req.at)
        rows = await self._fetch(sql_, (req.board, req.section, req.key, when))
        row = rows[0] if rows else None
        name = f"{req.board}.{req.section}.{req.key}"
        if row is None:
            raise NotFoundError(name, f"{name!r} did not exist at that point")
        rev = self._revision(row)
        if rev.op != "PUT":
            raise NotFoundError(name, f"{name!r} was deleted at that point (revision {rev.revision})")
        if req.at is not None and row[-1] is not None and row[-1] <= req.at:
            raise NotFoundError(name, f"{name!r} had expired at that point (revision {rev.revision}, "
                                      f"its TTL ended at {row[-1].isoformat()})")
        return rev

    def _note_unanalysed(self, target: Target, reltuples: float) -> None:
        # reltuples is -1 until the first VACUUM or ANALYZE of the table.
        if reltuples < 0:
            self._unanalysed.add(target)

    async def analyze_missing(self) -> None:
        """ANALYZE the tables that searches found never analysed (and their vector tables).

        A table freshly filled has no statistics until autovacuum gets to it
        (up to a minute, more on a busy server): meanwhile the planner guesses,
        keyword search cannot leave out the commonest words, and right after
        writing 2,000 LoCoMo turns keyword searches took 8.5 / 27.5 ms (p50 /
        p95) instead of 4.1 / 6.9 ms. The search service calls this every
        second; the cached statistics are dropped so the next search reads the
        new ones. A failure (e.g. a user who does not own the table) is logged
        and left to autovacuum.
        """
        while self._unanalysed:
            target = self._unanalysed.pop()
            try:
                async with self.pool.connection() as conn:
                    for statement in q.analyze_statements(target, self._space):
                        await conn.execute(statement)
            except psycopg.Error as exc:
                log.info("cannot ANALYZE the %s tables (autovacuum will): %s", target, exc)
            self._stats.pop(target, None)
            self._boards.pop(target, None)

    async def flush_touched(self) -> None:
        """Record ``last_accessed`` of the memories returned since the last flush."""
        if not self._touched:
            return
        mids, self._touched = sorted(self._touched), set()
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(q.TOUCH_MEMORIES, (mids,))
