"""Search over the Postgres side: semantic, keyword and hybrid.

:class:`SearchEngine` does the IO (a pool and an embedding provider) and keeps
its caches (query vectors, word lexemes, table statistics); fusion
(:mod:`blackboard.search.fusion`), planning from statistics
(:mod:`blackboard.search.planning`), SQL building (:mod:`blackboard.db.search_sql`)
and hit shaping (:mod:`blackboard.search.hits`) are pure functions.

* **semantic**: cosine similarity on the HNSW index of the provider's space
  (iterative scans, exact re-scan when a selective filter leaves it short);
  boards estimated to hold few items (:func:`~blackboard.search.planning.board_rows`)
  are scanned exactly through the vector table's covering board index instead.
* **keyword**: BM25 over PostgreSQL full text (see
  :func:`blackboard.db.search_sql.keyword_query`); query words estimated to
  match very many items do not generate candidates, and the rarest words
  generate them within a budget (:func:`~blackboard.search.planning.candidate_lexemes`).
* **hybrid**: the keyword query runs while the query is embedded, then the
  ANN query; the union of both candidate lists gets both scores (the cosine of
  keyword-only candidates is computed exactly; items without a keyword match
  score 0 there), each retriever's scores are min-max normalised over the
  union and combined as a weighted mean (:func:`~blackboard.search.fusion.fuse_convex`),
  a convex combination, which keeps how far apart the scores are where
  reciprocal-rank fusion (:func:`~blackboard.search.fusion.rrf`,
  ``settings.search.fusion = "rrf"``) keeps only the order.
  The keyword side computes its candidates' cosines on its own connection
  (in its statement for a cached query vector, else as soon as the vector is
  there), so fusion needs no statement of its own; both retrievers return
  their candidates' rows, with the neighbours (which
  :func:`~blackboard.search.fusion.smooth_neighbours` lends scores to) of each
  one's leading candidates: no statement follows the fusion.

Rows come back through row factories (:func:`blackboard.db.search_sql.named_rows`),
read by column name. History and as-of reads are :mod:`blackboard.search.history`;
the background upkeep (ANALYZE) is :mod:`blackboard.search.maintenance`; the recall hits, which
the service records, :mod:`blackboard.search.usage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
import psycopg
from psycopg.rows import RowMaker, dict_row
from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.db.search_sql import EntryRow, MemoryRow
from blackboard.db.spaces import Space, find_space
from blackboard.embeddings import EmbeddingProvider
from blackboard.protocol.errors import ConfigurationError, EmbeddingError, SearchError, StorageError
from blackboard.protocol.schemas.search import (
    EntrySearchRequest,
    EntrySearchResponse,
    MemorySearchRequest,
    MemorySearchResponse,
    SearchableRequest,
    SearchableResponse,
    SearchTarget,
)
from blackboard.search.fusion import Fused, cut, fuse_hybrid
from blackboard.search.hits import entry_hit, memory_hit
from blackboard.search.maintenance import Upkeep
from blackboard.search.planning import (
    BoardStats,
    DropRate,
    TermStats,
    board_share,
    candidate_lexemes,
    exact_scan,
    probe_depth,
)
from blackboard.search.pool import once_more
from blackboard.search.rerank import Reranker, apply_rerank, passage, reranker_from_settings
from blackboard.search.rows import SkippedRows, fetch_readable, readable
from blackboard.settings import SearchSettings

__all__ = ["SearchEngine"]

_T = TypeVar("_T")
log = logging.getLogger("blackboard.search.engine")

Request = MemorySearchRequest | EntrySearchRequest
Row = MemoryRow | EntryRow
Conn = psycopg.AsyncConnection[Any]

_ROWS: dict[SearchTarget, Callable[[Any], RowMaker[Row]]] = {
    "memory": q.named_rows(MemoryRow), "entry": q.named_rows(EntryRow)}


def _has_filters(req: Request) -> bool:
    return bool(q.filters(req.target, req.filters)[1])


def _candidate_rows(*retrieved: Sequence[Row]) -> dict[int, Row]:
    """Item -> its row, from the retrievers' rows. An item that both retrievers returned keeps
    the row that has its neighbours (rows outside a retriever's lead have none)."""
    rows: dict[int, Row] = {}
    for found in retrieved:
        for r in found:
            have = rows.get(r.item)
            if have is None or (isinstance(have, MemoryRow) and have.prev is None and have.next is None):
                rows[r.item] = r
    return rows


def _threads(rows: Iterable[Row]) -> dict[int, tuple[str, bool, str]]:
    """Item -> (board, thread) of the memory candidates whose metadata names a thread
    (``metadata.thread``, compared as JSON, as the contextual indexing of the worker does)."""
    out: dict[int, tuple[str, bool, str]] = {}
    for r in rows:
        if isinstance(r, MemoryRow) and r.metadata and '"thread"' in r.metadata:
            try:
                thread = orjson.loads(r.metadata).get("thread")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(thread, str):
                out[r.item] = (r.board, False, thread)
            elif thread is not None:  # a number, list or map: its JSON (7 is not "7")
                out[r.item] = (r.board, True, orjson.dumps(thread, option=orjson.OPT_SORT_KEYS).decode())
    return out


class SearchEngine:
    """Runs searches against PostgreSQL.

    Args:
        pool: open connection pool.
        provider: embeds queries; without one, semantic and hybrid searches
            raise ``SearchError`` (keyword search still works).
        settings: search settings (ef_search, fusion, keyword limits).
        skipped: counts the stored rows skipped as unreadable (a new counter by default).
        reranker: reranks memory searches (default: the one ``settings.rerank`` names, if any;
            see :mod:`blackboard.search.rerank`).
    """

    def __init__(self, pool: AsyncConnectionPool, provider: EmbeddingProvider | None,
                 settings: SearchSettings, *, skipped: SkippedRows | None = None,
                 reranker: Reranker | None = None) -> None:
        self.pool = pool
        self.provider = provider
        self.settings = settings
        self.reranker = reranker if reranker is not None else reranker_from_settings(settings)
        #: Memory searches whose reranker failed (their fused order was kept).
        self.rerank_failures = 0
        #: Background work the searches leave (ANALYZE).
        self.upkeep = Upkeep(pool)
        #: Stored rows the searches skipped because they cannot be read back (by kind).
        self.skipped = skipped if skipped is not None else SkippedRows()
        self._space: Space | None = None
        self._stats: dict[SearchTarget, tuple[TermStats | None, float]] = {}
        self._boards: dict[SearchTarget, BoardStats] = {}
        # Query text -> embedding, least recently used first (the model costs more than the search).
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        # Query word -> its lexemes (a query whose words were all seen needs no round trip for them).
        self._word_lexemes: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        # The share of the nearest vectors the semantic probe found not current, lately.
        self._dropped = DropRate()
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

    async def _statistics(self, conn: Conn, query: tuple[str, list[Any]], target: SearchTarget
                          ) -> dict[str, Any] | None:
        """The one row of a statistics query (by column name), noting a table never analysed."""
        row = await (await conn.cursor(row_factory=dict_row).execute(*query)).fetchone()
        if row is not None and row["reltuples"] is not None:
            self.upkeep.note_rows(target, float(row["reltuples"]))
        return row

    async def _board_stats(self, conn: Conn, target: SearchTarget) -> BoardStats | None:
        now = time.monotonic()
        cached = self._boards.get(target)
        if cached is not None and now - cached.at < self.settings.term_stats_ttl:
            return cached
        row = await self._statistics(conn, q.board_stats_query(target), target)
        stats = None
        if row is not None and row["reltuples"] is not None:
            boards, freqs = row["boards"], row["freqs"]
            common = dict(zip(boards, (float(f) for f in freqs), strict=False)) if boards and freqs else {}
            stats = BoardStats(common, float(row["n_distinct"] or 0.0), float(row["reltuples"]), now)
        self._boards[target] = stats or BoardStats({}, 0.0, -1.0, now)
        return stats

    async def _exact(self, conn: Conn, req: Request) -> bool:
        """Whether to scan the filtered boards' vectors exactly rather than through the HNSW index
        (:func:`~blackboard.search.planning.exact_scan`; statistics are read for a board filter only)."""
        limit = self.settings.exact_scan_max_rows
        if not req.boards or limit <= 0:
            return False
        return exact_scan(req.boards, await self._board_stats(conn, req.target), limit)

    async def _board_share(self, conn: Conn, req: Request) -> float:
        """The filtered boards' estimated share of the items (1.0 without a board filter or statistics)."""
        if not req.boards:
            return 1.0
        return board_share(req.boards, await self._board_stats(conn, req.target))

    async def _semantic(self, conn: Conn, req: Request, vector: np.ndarray, limit: int, ef_search: int, *,
                        linked: int = 0) -> list[Row]:
        """The nearest items passing the filters, best first, with their rows
        (:func:`search_sql.semantic_query` wrapped by :func:`search_sql.with_rows`, ``linked``
        as there)."""
        space = await self.space()
        exact = await self._exact(conn, req)
        probing = q.probes(req.target, req.filters)
        # The probe takes a few more of the nearest when recent probes dropped some.
        depth = probe_depth(limit, self._dropped.value) if probing else limit
        if not exact:
            await self._scan_settings(conn, max(ef_search, depth))
        found = await self._run(conn, *q.semantic_query(space, req.target, req.filters, vector, depth, exact=exact),
                                target=req.target, linked=linked)
        if probing:
            usable = [r for r in found if r.flag]
            self._dropped.note(len(found), len(found) - len(usable))
            if len(usable) < len(found) and len(usable) < limit:
                # Some of the nearest are not current (superseded, archived, contested) or
                # moved board: apply the conditions in the scan instead, which fills `limit`.
                usable = await self._run(conn, *q.semantic_query(space, req.target, req.filters, vector, limit,
                                                                 exact=exact, probe=False),
                                         target=req.target, linked=linked)
            elif len(usable) > limit:
                usable.sort(key=lambda r: -float(r.score))
                del usable[limit:]
            found = usable
        elif not exact and sum(1 for r in found if r.flag) < limit and _has_filters(req):
            # A filter so selective that the index scan ran dry before filling
            # `limit`: scan the filtered rows exactly instead.
            found = await self._run(conn, *q.semantic_query(space, req.target, req.filters, vector, limit,
                                                            exact=True),
                                    target=req.target, linked=linked)
        # relaxed_order may be slightly out of order
        found.sort(key=lambda r: (not r.flag, -float(r.score)))
        return found

    async def _run(self, conn: Conn, query: str, params: Sequence[Any], *, target: SearchTarget,
                   linked: int = 0) -> list[Row]:
        """The rows of a retriever's ``query``, each with the item's full row (and for the
        ``linked`` best, the item's neighbours: :func:`search_sql.with_rows`); a row that cannot
        be read back is skipped and counted (:func:`~blackboard.search.rows.fetch_readable`)."""
        # Binary results: PostgreSQL skips formatting the rows as text (timestamps, arrays),
        # ~0.25 ms of a keyword statement returning 50 candidates' rows.
        cur = conn.cursor(row_factory=_ROWS[target])
        await cur.execute(q.with_rows(query, target, linked=linked), params, binary=True)
        return await fetch_readable(cur, target, self.skipped)

    async def _term_stats(self, conn: Conn, target: SearchTarget) -> TermStats | None:
        now = time.monotonic()
        cached = self._stats.get(target)
        if cached is not None and now - cached[1] < self.settings.term_stats_ttl:
            return cached[0]
        row = await self._statistics(conn, q.term_stats_query(target), target)
        stats = None
        if row is not None and row["lexemes"] is not None and row["freqs"] is not None \
                and row["reltuples"] is not None:
            # most_common_elem_freqs has three extra trailing entries (min, max, nulls): zip drops them.
            stats = TermStats(dict(zip(row["lexemes"], (float(f) for f in row["freqs"]), strict=False)),
                              float(row["reltuples"]), now)
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
            for position, lexeme in await (await conn.execute(q.WORD_LEXEMES, (missing,))).fetchall():
                parsed.setdefault(int(position), []).append(str(lexeme))
            for i, w in enumerate(missing, 1):
                found[w] = tuple(parsed.get(i, ()))
                self._remember(self._word_lexemes, w, found[w], self.settings.lexeme_cache_size)
        return sorted({lx for w in words for lx in found[w]})[: q.MAX_QUERY_LEXEMES]

    async def _keyword(self, conn: Conn, req: Request, limit: int, *, vector: np.ndarray | None = None,
                       linked: int = 0) -> list[Row]:
        """The candidates ``(item, BM25 score, cosine or None)`` with their rows, best first
        (``linked`` as in :func:`search_sql.with_rows`)."""
        lexemes = await self._lexemes(conn, req.query)
        if not lexemes:  # only stop words
            return []
        stats = await self._term_stats(conn, req.target)
        space = await self.space() if vector is not None else None
        chosen = candidate_lexemes(lexemes, stats, self.settings.keyword_term_max_rows,
                                   self.settings.keyword_candidate_budget, await self._board_share(conn, req))
        sql_, params = q.keyword_query(req.target, req.filters, lexemes, chosen, limit,
                                       max_candidates=self.settings.keyword_max_candidates, space=space,
                                       vector=vector)
        found = await self._run(conn, sql_, params, target=req.target, linked=linked)
        found.sort(key=lambda r: (-float(r.score), r.item))  # the join does not keep the order
        return found

    async def _keyword_own(self, req: Request, limit: int, *, vector: np.ndarray | None = None,
                           later: asyncio.Future[np.ndarray] | None = None, linked: int = 0) -> list[Row]:
        """:meth:`_keyword` on a connection of its own (``linked`` as in
        :func:`search_sql.with_rows`). ``later``: the query's vector, still being computed;
        once the keyword statement is done, the candidates' cosines are computed here when it
        comes, so the rows carry their cosine either way."""
        async with self.pool.connection() as conn:
            try:
                rows = await self._keyword(conn, req, limit, vector=vector, linked=linked)
                if vector is None and later is not None and rows:
                    vec = await later
                    sql_, params = q.vector_scores(await self.space(), req.target, [r.item for r in rows], vec)
                    cosine = {item: float(cos) for item, cos in await (await conn.execute(sql_, params)).fetchall()}
                    rows = [r._replace(flag=cosine.get(r.item)) for r in rows]
                return rows
            finally:
                await conn.rollback()

    async def _search(self, req: Request) -> tuple[list[Fused], dict[int, Row]]:
        """Ranked, cut results and their candidates' rows.

        Run once more on a broken connection (see :func:`blackboard.search.pool.once_more`).
        """
        try:
            return await once_more(self.pool, lambda: self._search_once(req))
        except psycopg.OperationalError as exc:
            raise StorageError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SearchError(f"search query failed: {exc}") from exc

    async def _search_once(self, req: Request) -> tuple[list[Fused], dict[int, Row]]:
        if req.mode == "hybrid":
            return await self._hybrid_search(req)
        # One retriever, no fusion: its statement returns the results' rows too.
        query_vec = await self._embed(req.query) if req.mode == "semantic" else None
        async with self.pool.connection() as conn:
            try:
                if query_vec is not None:
                    found = await self._semantic(conn, req, query_vec, req.top_k, self.settings.ef_search)
                else:
                    found = await self._keyword(conn, req, req.top_k)
                ranked = (Fused(r.item, float(r.score), {req.mode: float(r.score)}) for r in found)
                return self._cut(ranked, req), {r.item: r for r in found}
            finally:
                await conn.rollback()

    async def _hybrid_search(self, req: Request) -> tuple[list[Fused], dict[int, Row]]:
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
        neighbours of each one's leading candidates (see
        :func:`~blackboard.search.fusion.fuse_hybrid`): no statement follows the fusion.
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
                                                    linked=lead)
                    keyword = await keyword_task
                    rows = _candidate_rows(semantic, keyword)
                    links = ((r.item, r.prev, r.next) for r in rows.values() if isinstance(r, MemoryRow)) \
                        if neighbours else None
                    threads = _threads(rows.values()) if convex and isinstance(req, MemorySearchRequest) \
                        and self.settings.thread_weight > 0 else None
                    fused = fuse_hybrid(semantic, keyword, weights=self._weights(),
                                        reciprocal_rank=not convex, links=links,
                                        neighbour_weight=self.settings.neighbour_weight, threads=threads,
                                        thread_weight=self.settings.thread_weight, limit=req.top_k,
                                        min_score=req.min_score)
                    return fused, rows
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

    def _weights(self) -> dict[str, float]:
        return {"semantic": self.settings.semantic_weight, "keyword": self.settings.keyword_weight}

    @staticmethod
    def _lead(req: Request) -> int:
        """How many of each retriever's best candidates come with their neighbours."""
        return max(2 * req.top_k, 20)

    def _depth(self, req: Request) -> int:
        return max(req.top_k * self.settings.hybrid_depth, self.settings.hybrid_min_candidates)

    @staticmethod
    def _cut(fused: Iterable[Fused], req: Request) -> list[Fused]:
        return list(cut(fused, lambda f: f.score, req.top_k, req.min_score))

    async def search_memories(self, req: MemorySearchRequest) -> MemorySearchResponse:
        """Search long-term memories (see :class:`MemorySearchRequest`); with a reranker, its
        ``max(top_k, rerank_depth)`` leading results are reranked, then cut to ``top_k``."""
        t0 = time.perf_counter()
        if self.reranker is not None:
            deep = req.model_copy(update={"top_k": max(req.top_k, self.settings.rerank_depth)})
            fused, rows = await self._search(deep)
            fused = (await self._rerank(req.query, fused, rows, self.reranker))[:req.top_k]
        else:
            fused, rows = await self._search(req)
        hits = readable(((f, r) for f in fused if isinstance(r := rows.get(f.item), MemoryRow)),
                        lambda fr: memory_hit(fr[1], fr[0].score, fr[0].parts), "memory", self.skipped,
                        lambda fr: f"memory {fr[1].id!r}")
        return MemorySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    async def _rerank(self, query: str, fused: list[Fused], rows: dict[int, Row], reranker: Reranker
                      ) -> list[Fused]:
        """``fused`` reranked (:func:`~blackboard.search.rerank.apply_rerank`), or as it is when
        the reranker fails (logged, counted in :attr:`rerank_failures`)."""
        head: list[Fused] = []
        texts: list[str] = []
        for f in fused:
            row = rows.get(f.item)
            if isinstance(row, MemoryRow):
                head.append(f)
                texts.append(passage(row.text, row.metadata))
        if len(head) < 2:
            return fused
        try:
            scores = await reranker.scores(query, texts)
            if len(scores) != len(head):
                raise SearchError(f"the reranker gave {len(scores)} scores for {len(head)} texts")
        except (SearchError, ConfigurationError) as exc:
            self.rerank_failures += 1
            log.warning("reranker failed, fused order kept: %s", exc)
            return fused
        return apply_rerank(head, scores, weight=self.settings.rerank_weight)

    async def aclose(self) -> None:
        """Release the reranker's client or model, if any."""
        if self.reranker is not None:
            await self.reranker.aclose()

    async def search_entries(self, req: EntrySearchRequest) -> EntrySearchResponse:
        """Search current board entries (see :class:`EntrySearchRequest`)."""
        t0 = time.perf_counter()
        fused, rows = await self._search(req)
        hits = readable(((f, r) for f in fused if isinstance(r := rows.get(f.item), EntryRow)),
                        lambda fr: entry_hit(fr[1], fr[0].score, fr[0].parts), "entry", self.skipped,
                        lambda fr: f"entry {fr[1].board}.{fr[1].section}.{fr[1].key}")
        return EntrySearchResponse(hits=hits, took_ms=(time.perf_counter() - t0) * 1000)

    async def searchable(self, req: SearchableRequest) -> SearchableResponse:
        """Which memories of ``req`` every mode does not find yet: not stored (at the version
        asked, on the board asked) or stored without the vector of that version.

        Raises:
            SearchError: no embedding provider (this service runs no semantic search, so no
                memory ever becomes searchable by every mode here).
        """
        if self.provider is None:
            raise SearchError("semantic search needs an embedding provider (worker.embed is off): "
                              "no memory becomes searchable by every mode")
        space: Space | None
        try:
            space = await self.space()
        except SearchError:  # no vector in this model's space yet: none is embedded
            space = None
        query, params = q.searchable_query(space, req.board, [i.id for i in req.items], [i.seq for i in req.items])
        try:
            async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                rows = await (await cur.execute(query, params)).fetchall()
        except psycopg.Error as exc:
            raise SearchError(f"searchable query failed: {exc}") from exc
        unstored = sorted({str(r["id"]) for r in rows if not r["stored"]})
        unembedded = sorted({str(r["id"]) for r in rows if r["stored"] and not r["embedded"]})
        return SearchableResponse(unstored=unstored, unembedded=unembedded)

    async def analyze_missing(self) -> None:
        """ANALYZE the tables that searches found never analysed (and their vector tables), then
        drop the statistics cached of them, so the next search reads the new ones (see
        :meth:`blackboard.search.maintenance.Upkeep.analyze_missing`; the search service calls
        this every second)."""
        await self.upkeep.analyze_missing(self._space, self._forget_statistics)

    def _forget_statistics(self, target: SearchTarget) -> None:
        self._stats.pop(target, None)
        self._boards.pop(target, None)
