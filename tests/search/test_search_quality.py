"""Ranking quality of the search path: the vector path returns exactly what a brute-force scan
of the stored vectors returns, the embedded text carries the metadata, keyword scores weigh rare
words above common ones (BM25), and hybrid fusion is a convex combination of normalised scores."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from agents_sdk.search import SearchClient
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import open_pool
from blackboard.db import search_sql as q
from blackboard.db.spaces import find_space
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.errors import EmbeddingError
from blackboard.protocol.schemas.search import MemorySearchRequest, SearchFilters
from blackboard.search.engine import SearchEngine
from blackboard.search.fusion import Fused, fuse_convex, neighbour_map, smooth_neighbours
from blackboard.search.planning import BoardStats, TermStats, board_rows, candidate_lexemes
from blackboard.settings import Settings
from blackboard.worker.embedder import memory_embed_text
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    drop_db,
    fresh_db,
    remember,
    running_worker,
    worker_settings,
)

aio = pytest.mark.asyncio

_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
          "quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber basil cedar dune ember "
          "fjord grove heath inlet jade knoll lagoon marsh nectar orchid pebble quartz reef slate thicket").split()
_BOARDS = 6
_PER_BOARD = 120


@dataclass
class Stack:
    boards: list[str]
    texts: dict[str, str]  # memory id -> text
    client: SearchClient
    settings: Settings
    provider: HashProvider
    chat: str


@pytest_asyncio.fixture(scope="module")
async def stack(nats_server: object, postgres_server: object) -> AsyncIterator[Stack]:
    from tests.conftest import make_settings

    tag = uuid.uuid4().hex[:8]
    base: Settings = make_settings(nats_server.url, postgres_server.dsn)  # type: ignore[attr-defined]
    s = worker_settings(base, name=f"quality{tag}", batch_wait=0.02)
    # The corpus holds near-duplicates on purpose (the two speakers' lines); the oracles below scan
    # every stored vector, so nothing may be merged away (consolidation: tests/worker/test_consolidation.py).
    s = s.model_copy(update={"memory": s.memory.model_copy(update={"near_duplicates": False})})
    nc = await connect_nats(s.nats, name="test-search-quality")
    js = nc.jetstream()
    await ensure_streams(js, s)
    rng = random.Random(3)
    boards = [f"q{i}{tag}" for i in range(_BOARDS)]
    texts: dict[str, str] = {}
    for i in range(_PER_BOARD):
        for b in boards:  # interleaved, so that every board's rows are spread over the shared index
            text = " ".join(rng.sample(_WORDS, 6))
            mid = f"{b}-{i}"
            texts[mid] = text
            await remember(js, b, "writer", mid, text)
    # The speaker is only in the metadata: semantic search must still see it.
    await remember(js, boards[0], "writer", f"{boards[0]}-said-a", "i went to the support group yesterday",
                   metadata={"speaker": "Caroline"})
    await remember(js, boards[0], "writer", f"{boards[0]}-said-b", "i went to the support group yesterday too",
                   metadata={"speaker": "Melanie"})
    # Keyword weights: "common" is in many memories, "rare" in one.
    for i in range(30):
        await remember(js, boards[1], "writer", f"{boards[1]}-common-{i}", f"common filler note {i}")
    await remember(js, boards[1], "writer", f"{boards[1]}-rare", "rare")
    # On a board of their own: unrelated memories, a question, its answer (no shared words), more unrelated ones.
    chat = f"chat{tag}"
    for name, text in (("early1", "printer toner"), ("early2", "window blinds"),
                       ("question", "which city did the team pick for the offsite"), ("answer", "lisbon"),
                       ("later1", "umbrella stand"), ("later2", "keyboard layout")):
        await remember(js, chat, "writer", f"{chat}-{name}", text)
    provider = HashProvider()
    async with running_worker(s, provider=provider) as w:
        await w.wait_caught_up(60, embedded=True)
        yield Stack(boards, texts, SearchClient(nc, s, "tester"), s, provider, chat)
    await nc.close()


@aio
async def test_semantic_finds_the_exact_stored_text_first_with_a_board_filter(stack: Stack) -> None:
    rng = random.Random(5)
    for mid in rng.sample(sorted(stack.texts), 40):
        board = mid.rsplit("-", 1)[0]
        hits = await stack.client.recall(stack.texts[mid], board=board, mode="semantic", top_k=5)
        assert hits[0].id == mid
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert all(h.board == board for h in hits)


async def _stored_vectors(conn: Any, space: Any, boards: list[str], board_column: str
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory ids, boards (read from ``board_column``: ``m.board`` or the vector table's ``v.board``)
    and stored vectors of the given boards."""
    rows = await (await conn.execute(sql.SQL(
        "SELECT m.id, {}, v.embedding FROM bb_memories m JOIN {} v ON v.item = m.mid "
        "WHERE m.board = ANY(%s)").format(sql.SQL(board_column), space.table("memory")), (boards,))).fetchall()
    return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
            np.stack([np.asarray(r[2].to_numpy(), dtype=np.float32) for r in rows]))


@aio
async def test_semantic_results_equal_a_brute_force_scan_of_the_stored_vectors(stack: Stack) -> None:
    """The vector path (shared HNSW index, board filter, iterative scan, exact fallback,
    score sign, item ids) must return what an exact scan of that board's vectors returns."""
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        space = await find_space(conn, stack.provider.model, stack.provider.dimensions)
        assert space is not None
        ids, boards, vectors = await _stored_vectors(conn, space, stack.boards, "m.board")
    rng = random.Random(11)
    for _ in range(30):
        board = rng.choice(stack.boards)
        query = " ".join(rng.sample(_WORDS, 3))
        hits = await stack.client.recall(query, board=board, mode="semantic", top_k=10)
        mask = boards == board
        sims = vectors[mask] @ stack.provider.vector(query)
        order = np.argsort(-sims, kind="stable")[:10]
        assert len(hits) == 10
        # The same scores as the exact scan (ties may swap items of equal score) ...
        assert [h.score for h in hits] == pytest.approx([float(sims[i]) for i in order], abs=1e-5)
        # ... each the similarity of the item named (vectors stored for the right rows).
        by_id = dict(zip(ids[mask], sims, strict=True))
        for h in hits:
            assert h.board == board
            assert h.score == pytest.approx(float(by_id[h.id]), abs=1e-5)


@aio
@pytest.mark.parametrize("exact_scan_max_rows", [0, 10_000])
async def test_hnsw_and_exact_board_scans_both_equal_a_brute_force_scan(stack: Stack, exact_scan_max_rows: int
                                                                        ) -> None:
    """With statistics, a small board is scanned exactly (index-only scan of the covering board index);
    without the exact path, through the HNSW index. Both must return the exact scan's items and scores."""
    settings = stack.settings.search.model_copy(update={"exact_scan_max_rows": exact_scan_max_rows})
    async with open_pool(stack.settings.postgres, min_size=1, max_size=2) as pool:
        async with pool.connection() as conn:
            space = await find_space(conn, stack.provider.model, stack.provider.dimensions)
            assert space is not None
            await conn.execute("ANALYZE bb_memories")
            await conn.commit()
            ids, boards, vectors = await _stored_vectors(conn, space, stack.boards, "v.board")
        engine = SearchEngine(pool, stack.provider, settings)
        async with pool.connection() as conn:
            # The statistics see each test board as small (120 of many rows), and its vectors as there.
            for board in stack.boards[:2]:
                estimate = board_rows([board], await engine._board_stats(conn, "memory"))
                assert estimate is not None and 0 < estimate <= 10_000
                assert await engine._exact(conn, MemorySearchRequest(query="x", boards=[board])) == (
                    exact_scan_max_rows > 0)
            await conn.rollback()
        rng = random.Random(17)
        for _ in range(15):
            board = rng.choice(stack.boards)
            query = " ".join(rng.sample(_WORDS, 3))
            res = await engine.search_memories(MemorySearchRequest(query=query, boards=[board], mode="semantic",
                                                                   top_k=10))
            sims = vectors[boards == board] @ stack.provider.vector(query)
            by_id = dict(zip(ids[boards == board], sims, strict=True))
            assert [h.score for h in res.hits] == pytest.approx(sorted(sims, reverse=True)[:10], abs=1e-5)
            assert all(h.board == board and h.score == pytest.approx(float(by_id[h.id]), abs=1e-5)
                       for h in res.hits)


@aio
async def test_the_exact_board_scan_reads_only_the_covering_board_index(stack: Stack) -> None:
    """Once vacuumed (autovacuum does it after inserts), a board's vectors are read from the index alone."""
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        space = await find_space(conn, stack.provider.model, stack.provider.dimensions)
        assert space is not None
        await conn.rollback()
        await conn.set_autocommit(True)
        await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(space.table("memory")))
        await conn.set_autocommit(False)
        await conn.execute("SET enable_seqscan = off")  # the test boards are small next to the shared table
        query, params = q.semantic_query(space, "memory", SearchFilters(boards=[stack.boards[0]]),
                                         stack.provider.vector("alpha bravo"), 10, exact=True)
        plan = "\n".join(r[0] for r in await (await conn.execute(
            "EXPLAIN " + query, params)).fetchall())
        await conn.rollback()
    assert f"Index Only Scan using {space.table_name('memory')}_board" in plan, plan


@aio
@pytest.mark.parametrize("req", [
    MemorySearchRequest(query="x"),
    MemorySearchRequest(query="x", boards=["b1"]),
    MemorySearchRequest(query="x", boards=["b1"], kinds=["episodic"], tags_any=["t"]),
], ids=["unfiltered", "board", "board+kind+tags"])
async def test_the_index_scan_orders_by_the_hnsw_indexs_halfvec_expression(stack: Stack,
                                                                            req: MemorySearchRequest) -> None:
    """The HNSW index is built on the vectors cast to halfvec; the non-exact semantic statement must
    order by that same expression, or PostgreSQL would sort every vector instead (same results, no index)."""
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        space = await find_space(conn, stack.provider.model, stack.provider.dimensions)
        assert space is not None
        definition = await (await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                                                (space.table_name("memory", "_hnsw"),))).fetchone()
        assert definition is not None and "halfvec_cosine_ops" in definition[0], definition
        # Whatever the test tables' sizes: no plan that sorts the vectors if an index gives the order.
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_sort = off")
        query, params = q.semantic_query(space, req.target, req.filters, stack.provider.vector("alpha bravo"), 10)
        plan = "\n".join(r[0] for r in await (await conn.execute("EXPLAIN " + query, params)).fetchall())
        await conn.rollback()
    assert f"Index Scan using {space.table_name('memory')}_hnsw" in plan, plan


class _SlowProvider:
    """The test provider, slower than a keyword query (like a real model)."""

    def __init__(self, inner: HashProvider, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.model, self.dimensions = inner.model, inner.dimensions

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        await asyncio.sleep(self.delay)
        return await self.inner.embed(texts)


@aio
async def test_hybrid_scores_do_not_depend_on_which_statement_scored_the_keyword_candidates(stack: Stack) -> None:
    """A keyword candidate's cosine comes from the keyword statement (cached query vector) or from a
    statement of its own once the vector is there, whether the keyword query finished before the
    model or after it: the results must be the same."""
    settings = stack.settings.search
    results = []
    async with open_pool(stack.settings.postgres, min_size=1, max_size=4) as pool:
        slow = SearchEngine(pool, _SlowProvider(stack.provider, 0.3), settings)  # type: ignore[arg-type]
        fast = SearchEngine(pool, stack.provider, settings.model_copy(update={"query_cache_size": 0}))
        for engine in (slow, slow, fast):  # new (keyword done first), repeated (cached), model first
            req = MemorySearchRequest(query="alpha bravo charlie delta support group", boards=stack.boards[:3],
                                      top_k=10)
            results.append([(h.id, round(h.score, 6), {k: round(v, 6) for k, v in h.scores.items()})
                            for h in (await engine.search_memories(req)).hits])
    assert len(results[0]) == 10
    assert results[0] == results[1] == results[2]
    assert any(set(h[2]) == {"semantic", "keyword"} for h in results[0])


class _FailingProvider:
    """A query model that fails after a while (a broken model, an API down)."""

    def __init__(self, inner: HashProvider, delay: float) -> None:
        self.delay = delay
        self.model, self.dimensions = inner.model, inner.dimensions

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        await asyncio.sleep(self.delay)
        raise EmbeddingError("the query model is down")


@aio
async def test_a_failed_or_cancelled_hybrid_search_gives_its_connections_back(stack: Stack) -> None:
    """The query is embedded while the keyword side runs on a connection of its own: a model
    failure raises, a cancelled search stops, and neither keeps a connection of the pool."""
    settings = stack.settings.search.model_copy(update={"query_cache_size": 0})
    req = MemorySearchRequest(query="alpha bravo charlie delta support group", boards=stack.boards[:3], top_k=5)
    async with asyncio.timeout(30), open_pool(stack.settings.postgres, min_size=1, max_size=2) as pool:
        failing = SearchEngine(pool, _FailingProvider(stack.provider, 0.05), settings)  # type: ignore[arg-type]
        slow = SearchEngine(pool, _SlowProvider(stack.provider, 5.0), settings)  # type: ignore[arg-type]
        for _ in range(4):  # more searches than the pool has connections
            with pytest.raises(EmbeddingError, match="down"):
                await failing.search_memories(req)
            search = asyncio.create_task(slow.search_memories(req))
            await asyncio.sleep(0.1)  # the keyword side holds its connection by now
            search.cancel()
            with pytest.raises(asyncio.CancelledError):
                await search
        assert pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"]
        fine = SearchEngine(pool, stack.provider, settings)
        hits = (await fine.search_memories(req)).hits
    assert len(hits) == 5


@aio
async def test_a_memory_moved_to_another_board_is_found_on_the_new_board_only(stack: Stack) -> None:
    """The vector table's board follows the memory: the embedder writes the board of the revision it embeds."""
    old, new = stack.boards[3], stack.boards[4]
    mid, text = f"{old}-moving", "zulu yankee xray whiskey victor uniform"
    nc = await connect_nats(stack.settings.nats, name="test-move")
    try:
        js = nc.jetstream()
        await remember(js, old, "writer", mid, text)
        await _until_found(stack, text, old, mid)
        await remember(js, new, "writer", mid, text)  # same id, same text, another board
        await _until_found(stack, text, new, mid)
    finally:
        await nc.close()
    for mode in ("semantic", "hybrid"):
        assert mid not in {h.id for h in await stack.client.recall(text, board=old, mode=mode, top_k=5)}
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        space = await find_space(conn, stack.provider.model, stack.provider.dimensions)
        assert space is not None
        row = await (await conn.execute(sql.SQL(
            "SELECT v.board FROM {} v JOIN bb_memories m ON m.mid = v.item WHERE m.id = %s").format(
            space.table("memory")), (mid,))).fetchone()
    assert row == (new,)


@aio
async def test_a_moved_memory_whose_vector_still_names_the_old_board_is_not_found_there(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    """Until the embedder rewrites its vector, a moved memory's vector row still carries the old
    board: semantic and hybrid searches of the old board must check the memory's current board."""
    from tests.conftest import make_settings

    name = "moved" + unique
    dsn = fresh_db(postgres_server, name)
    old, new = f"{unique}old", f"{unique}new"
    mid, text = f"{unique}-moving", "zulu yankee xray whiskey victor uniform"
    try:
        s = make_settings(nats_server.url, dsn)  # the first worker migrates the database
        provider = HashProvider()
        nc = await connect_nats(s.nats, name="test-stale-board")
        try:
            js = nc.jetstream()
            await ensure_streams(js, s)
            # One durable per board (a handler's name names its durable).
            handlers = [board_memories_handler(s, old),
                        dataclasses.replace(board_memories_handler(s, new), name="memories-new")]
            await remember(js, old, "writer", mid, text)
            async with running_worker(s, provider=provider, handlers=handlers, name=f"e{unique}", batch_wait=0.02,
                                      serve_search=False) as w:
                await w.wait_caught_up(30, embedded=True)
            await remember(js, new, "writer", mid, text)  # same id: the memory moves
            async with running_worker(s, handlers=handlers, name=f"i{unique}", batch_wait=0.02, embed=False,
                                      serve_search=False) as w:
                await w.wait_caught_up(30)
        finally:
            await nc.close()
        async with open_pool(s.postgres, min_size=1, max_size=2) as pool:
            async with pool.connection() as conn:
                space = await find_space(conn, provider.model, provider.dimensions)
                assert space is not None
                row = await (await conn.execute(sql.SQL(
                    "SELECT m.board, v.board FROM bb_memories m JOIN {} v ON v.item = m.mid WHERE m.id = %s"
                ).format(space.table("memory")), (mid,))).fetchone()
            assert row == (new, old)  # the state under test: the vector not rewritten yet
            engine = SearchEngine(pool, provider, s.search)
            for mode in ("semantic", "hybrid"):
                hits = (await engine.search_memories(MemorySearchRequest(
                    query=text, mode=mode, boards=[old], top_k=5))).hits
                assert mid not in {h.id for h in hits}, mode
            hits = (await engine.search_memories(MemorySearchRequest(
                query=text, mode="keyword", boards=[new], top_k=5))).hits
            assert [h.id for h in hits] == [mid]
    finally:
        drop_db(postgres_server, name)


async def _until_found(stack: Stack, text: str, board: str, mid: str, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        hits = await stack.client.recall(text, board=board, mode="semantic", top_k=3)
        if hits and hits[0].id == mid and hits[0].board == board:
            return
        assert loop.time() < deadline, f"{mid} not found semantically on {board}"
        await asyncio.sleep(0.05)


@aio
async def test_semantic_search_sees_the_metadata(stack: Stack) -> None:
    """A question names the speaker, the text does not: the embedded text must carry the metadata."""
    b = stack.boards[0]
    for who in ("Caroline", "Melanie"):
        hits = await stack.client.recall(f"when did {who} go to the support group", board=b, mode="semantic",
                                         top_k=2)
        assert hits[0].metadata == {"speaker": who}


@aio
async def test_keyword_weighs_a_rare_word_above_a_common_one(stack: Stack) -> None:
    hits = await stack.client.recall("common rare", board=stack.boards[1], mode="keyword", top_k=3)
    assert hits[0].id == f"{stack.boards[1]}-rare"
    assert hits[0].score > hits[1].score > 0


@aio
async def test_hybrid_scores_are_a_convex_combination(stack: Stack) -> None:
    hits = await stack.client.recall("i went to the support group Caroline", board=stack.boards[0], top_k=5)
    assert hits[0].id == f"{stack.boards[0]}-said-a"
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert set(hits[0].scores) == {"semantic", "keyword"}


@aio
async def test_a_repeated_query_is_embedded_once(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    query = f"juliet kilo lima {uuid.uuid4().hex}"
    embedded: list[str] = []
    embed = stack.provider.embed

    async def spy(texts: Sequence[str]) -> np.ndarray:
        embedded.extend(texts)
        return await embed(texts)

    monkeypatch.setattr(stack.provider, "embed", spy)
    first = await stack.client.recall(query, board=stack.boards[2], mode="semantic", top_k=3)
    second = await stack.client.recall(query, board=stack.boards[2], top_k=3)  # hybrid, same text
    assert embedded.count(query) == 1
    # Both searches scored with that one vector: each hit's semantic score is the
    # cosine of the query's vector and the hit's stored text. (Whether the
    # semantic best match also ranks in hybrid's top 3 depends on the random
    # query's keyword matches: the keyword side may rightly outrank it.)
    qvec = stack.provider.vector(query)
    sem = [(h.id, h.scores["semantic"]) for h in [*first, *second] if "semantic" in h.scores]
    assert len(sem) >= len(first) + 1
    for mid, score in sem:
        assert score == pytest.approx(float(stack.provider.vector(stack.texts[mid]) @ qvec), abs=1e-5), mid


@aio
async def test_hybrid_memory_search_lifts_the_neighbour_of_a_strong_match(stack: Stack) -> None:
    b, query = stack.chat, "which city did the team pick for the offsite"
    hits = await stack.client.recall(query, board=b, top_k=6)
    # Right after the question come the memories written just before and just after it.
    assert hits[0].id == f"{b}-question"
    assert {h.id for h in hits[1:3]} == {f"{b}-early2", f"{b}-answer"}
    assert hits[1].score == pytest.approx(hits[2].score) and hits[1].score > hits[3].score
    # No other memory shares a word with the question: without neighbours they would all tie at 0.
    plain = await stack.client.recall(query, board=b, top_k=6, mode="semantic")
    assert plain[0].id == f"{b}-question" and all(h.score == pytest.approx(0.0, abs=1e-6) for h in plain[1:])


@aio
async def test_a_texts_lexemes_are_the_union_of_its_words_lexemes(stack: Stack) -> None:
    """What the per-word lexeme cache of the search engine relies on, on PostgreSQL's own parser."""
    texts = ["When did Caroline go to the LGBTQ support group?", "well-known e-mail foo@bar.com http://x.org/a-b?c=d",
             "3.14 1,000 -5 2023-05-08 1:56 pm", "don't rock'n'roll Mr. O'Neil's naïve café", "C++ C# .NET node.js v1.2.3",
             "The U.S.A. vs. U.K. -- co-operate; re-enter!", "x_y a/b c\\d ''quoted'' \"dq\"", "日本語 テキスト",
             "tab\tand\nnewline  double  space", "-leading trailing- a - b", "the of and", ""]
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        for text in texts:
            whole = [r[0] for r in await (await conn.execute(
                "SELECT lexeme FROM unnest(to_tsvector('english', %s))", (text,))).fetchall()]
            words = q.query_words(text)
            rows = await (await conn.execute(q.WORD_LEXEMES, (words,))).fetchall()
            assert sorted({r[1] for r in rows}) == sorted(whole), text
            assert all(1 <= r[0] <= len(words) for r in rows)
    assert q.query_words("a  b\ta a\n") == ["a", "b"]


@aio
async def test_retriever_rows_carry_the_neighbours_of_their_leading_candidates(stack: Stack) -> None:
    """``with_rows(linked=n)``: every candidate gets its full row; the n best-scoring ones end
    with the previous and next memory on their board, the others with NULLs."""
    b = stack.chat
    order = ["early1", "early2", "question", "answer", "later1", "later2"]
    # A stand-in retriever: the chat board's memories, scored so that "answer" and "early1" lead.
    score = {"answer": 9.0, "early1": 8.0, "later2": 1.0}
    cases = sql.SQL(" ").join(sql.SQL("WHEN {} THEN {}").format(sql.Literal(f"{b}-{n}"), sql.Literal(s))
                              for n, s in score.items())
    retriever = sql.SQL("SELECT mid, CASE id {} ELSE 0.0 END, true FROM bb_memories WHERE board = %s").format(
        cases).as_string()
    async with open_pool(stack.settings.postgres, min_size=1, max_size=1) as pool, pool.connection() as conn:
        # One snapshot for both reads: a search service's flush of recall hits (other tests of the
        # module recall these memories) may change a row's hits between two statements.
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        async with conn.transaction():
            got = await (await conn.execute(q.with_rows(retriever, "memory", linked=2), (b,))).fetchall()
            plain = {int(r[0]): r
                     for r in await (await conn.execute(q.with_rows(retriever, "memory"), (b,))).fetchall()}
    assert len(got) == len(order) == len(plain)
    by_name = {r[4].removeprefix(f"{b}-"): r for r in got}  # row: item, score, flag, mid, id, ...
    mid_of = {n: int(r[3]) for n, r in by_name.items()}
    for name, r in by_name.items():
        assert r[:-2] == plain[int(r[0])]  # the same full row, two columns more
        if name in ("answer", "early1"):
            i = order.index(name)
            assert r[-2:] == (mid_of[order[i - 1]] if i else None, mid_of[order[i + 1]]), name
        else:
            assert r[-2:] == (None, None), name


# -- pure parts ------------------------------------------------------------------


def test_memory_embed_text_puts_short_scalar_metadata_before_the_text() -> None:
    text = memory_embed_text("hello there", {"speaker": "Caroline", "session": 3, "flag": True,
                                             "nested": {"a": 1}, "long": "x" * 500, "empty": ""})
    assert text == "speaker: Caroline\nsession: 3\nhello there"
    assert memory_embed_text("plain") == "plain"
    assert len(memory_embed_text("y" * 5000, {"k": "v"})) == 2000


def test_fuse_convex_normalises_weights_and_missing_items() -> None:
    fused = fuse_convex({"semantic": {1: 0.9, 2: 0.5, 3: 0.7}, "keyword": {1: 0.0, 2: 8.0, 3: 4.0}})
    assert [f.item for f in fused] == [1, 2, 3]  # ties keep the order of first appearance
    assert {f.item: round(f.score, 6) for f in fused} == {1: 0.5, 2: 0.5, 3: 0.5}
    weighted = fuse_convex({"semantic": {1: 0.9, 2: 0.5}, "keyword": {1: 0.0, 2: 8.0}},
                           {"semantic": 3.0, "keyword": 1.0})
    assert [f.item for f in weighted] == [1, 2]
    assert weighted[0].score == pytest.approx(0.75)
    # A retriever whose scores are all equal (and above 0) ranks nothing among its items: each
    # gets its top, 1.0, as a lone candidate does (issue 18: min_score dropped a lone hit that
    # scored 0.0); the ranking comes from the other retriever alone.
    flat = fuse_convex({"semantic": {1: 0.2, 2: 0.8}, "keyword": {1: 1.0, 2: 1.0}})
    assert [(f.item, f.score) for f in flat] == [(2, pytest.approx(1.0)), (1, pytest.approx(0.5))]
    lacking = fuse_convex({"semantic": {1: 0.9, 2: 0.1}, "keyword": {2: 5.0, 1: 1.0, 3: 3.0}})
    assert {f.item: round(f.score, 3) for f in lacking}[3] == pytest.approx(0.25)
    top = fuse_convex({"semantic": {7: 0.3, 8: 0.1}, "keyword": {7: 2.0, 8: 1.0}}, parts={"semantic": {7: 0.3}})
    assert top[0].score == pytest.approx(1.0) and top[0].parts == {"semantic": 0.3}


def test_smooth_neighbours_lends_a_share_of_the_best_neighbour() -> None:
    fused = [Fused(1, 1.0, {}), Fused(2, 0.3, {}), Fused(3, 0.1, {}), Fused(4, 0.2, {})]
    neighbours = {1: (None, 3), 2: (9, None), 3: (1, 4), 4: (3, None)}
    out = smooth_neighbours(fused, neighbours, 0.5)
    assert [f.item for f in out] == [1, 3, 2, 4]
    assert {f.item: round(f.score, 4) for f in out} == {1: round((1.0 + 0.05) / 1.5, 4), 3: 0.4, 2: 0.2,
                                                         4: round((0.2 + 0.05) / 1.5, 4)}
    assert smooth_neighbours(fused, neighbours, 0.0) == fused


def test_neighbour_map_links_both_ways() -> None:
    assert neighbour_map([(5, 4, 6), (9, None, None), (6, 5, None)]) == {5: [4, 6, 6], 4: [5], 6: [5, 5]}


def test_candidate_lexemes_drop_very_frequent_words_but_never_all() -> None:
    stats = TermStats({"common": 0.4, "usual": 0.1, "rare": 0.0001}, rows=100_000)
    assert candidate_lexemes(["common", "rare", "unseen"], stats, 5000) == ["rare", "unseen"]
    assert candidate_lexemes(["common", "usual"], stats, 5000) == ["usual"]
    assert candidate_lexemes(["common", "usual"], None, 5000) == ["common", "usual"]
    assert candidate_lexemes(["common"], TermStats({"common": 0.4}, rows=-1), 10) == ["common"]
    assert candidate_lexemes([], stats, 10) == []


def test_candidate_lexemes_keep_the_rarest_words_within_the_budget() -> None:
    stats = TermStats({"a": 0.004, "b": 0.002, "c": 0.003, "d": 0.0001}, rows=100_000)  # 400, 200, 300, 10
    assert candidate_lexemes(["a", "b", "c", "d"], stats, 1000, budget=520) == ["b", "c", "d"]
    assert candidate_lexemes(["a", "b", "c", "d"], stats, 1000, budget=250) == ["b", "d"]
    assert candidate_lexemes(["a", "b", "c", "d"], stats, 1000, budget=1) == ["d"]  # the rarest, always
    assert candidate_lexemes(["a", "b"], stats, 1000, budget=100) == ["b"]
    # A board filter holding a tenth of the rows: every word fits.
    assert candidate_lexemes(["a", "b", "c", "d"], stats, 1000, budget=100, share=0.1) == ["a", "b", "c", "d"]


def test_board_rows_estimates_from_the_most_common_boards_and_the_rest() -> None:
    stats = BoardStats({"big": 0.5, "mid": 0.3}, n_distinct=12, rows=100_000)
    assert board_rows(["big"], stats) == pytest.approx(50_000)
    assert board_rows(["mid", "mid", "big"], stats) == pytest.approx(80_000)
    assert board_rows(["small"], stats) == pytest.approx(20_000 / 10)  # the rest, shared by the 10 others
    assert board_rows(["small"], BoardStats({"big": 0.5}, n_distinct=-0.001, rows=100_000)) == pytest.approx(
        50_000 / 99)
    # No column statistics: any board may be the whole table; never counted: unknown.
    assert board_rows(["x"], BoardStats({}, n_distinct=0, rows=500)) == 500
    assert board_rows(["x"], BoardStats({}, n_distinct=0, rows=-1)) is None
    assert board_rows(["x"], None) is None


def test_tsquery_literal_quotes_lexemes() -> None:
    assert q.tsquery_literal(["it's", "a\\b", "plain"]) == "'it''s' | 'a\\\\b' | 'plain'"
    with pytest.raises(ValueError):
        q.tsquery_literal([])


def test_keyword_query_binds_one_value_per_placeholder() -> None:
    req = MemorySearchRequest(query="x y", boards=["b"], tags_any=["t"], metadata={"k": 1})
    query, params = q.keyword_query(req.target, req.filters, ["x", "y", "z"], ["x", "y"], 50, max_candidates=100)
    text = query
    assert text.count("%s") == len(params) == 3 + 1 + 3 + 2
    assert params[-2:] == [100, 50] and params[3] == "'x' | 'y'"
