"""The search service: every mode and filter returns the right items; history and as-of reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk.search import SearchClient, raise_for_error
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError, SearchError
from blackboard.protocol.schemas.search import ErrorReply
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._worker_helpers import (
    HashProvider,
    delete_entry,
    drop_db,
    fresh_db,
    put_entry,
    remember,
    running_worker,
    worker_settings,
)

pytestmark = pytest.mark.asyncio


@dataclass
class Corpus:
    a: str
    b: str
    client: SearchClient
    nc: NATS
    seqs: dict[str, int]
    t_before_update: datetime
    dsn: str
    worker: str


@pytest_asyncio.fixture(scope="module")
async def corpus(nats_server: object, postgres_server: object) -> AsyncIterator[Corpus]:
    import uuid

    from tests.conftest import make_settings
    tag = uuid.uuid4().hex[:10]
    a, b = f"sa{tag}", f"sb{tag}"
    base: Settings = make_settings(nats_server.url, postgres_server.dsn)  # type: ignore[attr-defined]
    s = worker_settings(base, name=f"search{tag}", batch_wait=0.02)
    nc = await connect_nats(s.nats, name="test-search")
    js = nc.jetstream()
    await ensure_streams(js, s)
    subj = Subjects(s.board.bucket)
    seqs: dict[str, int] = {}
    seqs["m1"] = await remember(js, a, "alice", f"{a}-m1",
                                "the deploy to production failed because the database migration timed out",
                                kind="episodic", tags=["ops", "incident"], metadata={"service": "api", "env": "prod"})
    seqs["m2"] = await remember(js, a, "bob", f"{a}-m2", "always run database migrations before deploying the api",
                                kind="procedural", tags=["ops"], metadata={"service": "api"})
    seqs["m3"] = await remember(js, a, "carol", f"{a}-m3", "the cafeteria serves pizza on fridays",
                                kind="semantic", tags=["food"])
    seqs["m4"] = await remember(js, b, "alice", f"{b}-m4", "database backups run nightly at two",
                                kind="knowledge", tags=["ops", "backup"], metadata={"env": "prod"})
    for i in range(300):  # many close matches, so that a selective filter defeats a plain ANN scan
        await remember(js, a, "filler", f"{a}-f{i}", f"database migration deploy note {i}", kind="episodic")
    seqs["needle"] = await remember(js, a, "dora", f"{a}-needle", "a remark on schema changes", tags=["needle"])
    seqs["plan1"] = await put_entry(js, subj, a, "notes", "plan", {"title": "migrate the database"}, author="bob")
    seqs["lunch"] = await put_entry(js, subj, a, "notes", "lunch", "pizza friday", author="carol", tags=["food"])
    seqs["db"] = await put_entry(js, subj, a, "facts", "db", "postgres eighteen with pgvector", author="bob",
                                 metadata={"verified": True})
    seqs["gone"] = await put_entry(js, subj, a, "facts", "gone", "database to be deleted", author="bob")
    seqs["gone_del"] = await delete_entry(js, subj, a, "facts", "gone")
    provider = HashProvider()
    async with running_worker(s, provider=provider) as w:
        await w.wait_caught_up(60, embedded=True)
        t_before = datetime.now(UTC)
        seqs["plan2"] = await put_entry(js, subj, a, "notes", "plan", {"title": "migrate the database twice"},
                                        author="bob")
        await w.wait_caught_up(60, embedded=True)
        yield Corpus(a, b, SearchClient(nc, s, "tester"), nc, seqs, t_before, s.postgres.dsn.get_secret_value(), s.worker.name)
    await nc.close()


async def test_keyword_mode_matches_words(corpus: Corpus) -> None:
    hits = await corpus.client.recall("pizza", board=corpus.a, mode="keyword")
    assert [h.id for h in hits] == [f"{corpus.a}-m3"]
    assert hits[0].score > 0 and hits[0].revision == corpus.seqs["m3"] and hits[0].agent == "carol"


async def test_semantic_mode_ranks_by_meaning(corpus: Corpus) -> None:
    hits = await corpus.client.recall("cafeteria pizza fridays", board=corpus.a, mode="semantic", top_k=3)
    assert hits[0].id == f"{corpus.a}-m3"
    assert hits[0].score > hits[1].score >= hits[2].score


async def test_hybrid_mode_fuses_both(corpus: Corpus) -> None:
    hits = await corpus.client.recall("why did the production deploy fail", boards=[corpus.a], top_k=5)
    assert hits[0].id == f"{corpus.a}-m1"
    assert set(hits[0].scores) == {"semantic", "keyword"} and 0 < hits[0].score <= 1.0


async def test_filters_board_kind_author_tags_metadata(corpus: Corpus) -> None:
    c, a, b = corpus.client, corpus.a, corpus.b
    ids = lambda hits: {h.id for h in hits}  # noqa: E731
    assert ids(await c.recall("database", boards=[a, b], tags_any=["backup"])) == {f"{b}-m4"}
    assert ids(await c.recall("database", board=b)) == {f"{b}-m4"}
    assert ids(await c.recall("database", boards=[a, b], kind="procedural")) == {f"{a}-m2"}
    assert ids(await c.recall("database", boards=[a, b], kinds=["procedural", "knowledge"])) == {f"{a}-m2", f"{b}-m4"}
    assert ids(await c.recall("database", boards=[a, b], author="alice")) == {f"{a}-m1", f"{b}-m4"}
    assert ids(await c.recall("database", boards=[a, b], tags_all=["ops", "incident"])) == {f"{a}-m1"}
    assert ids(await c.recall("database", boards=[a, b], tags_any=["incident", "backup"])) == {f"{a}-m1", f"{b}-m4"}
    assert ids(await c.recall("database", boards=[a, b], metadata={"env": "prod"})) == {f"{a}-m1", f"{b}-m4"}
    assert ids(await c.recall("database", boards=[a, b], metadata={"service": "api", "env": "prod"})) == {f"{a}-m1"}
    for mode in ("semantic", "keyword"):
        assert ids(await c.recall("database", board=b, mode=mode)) == {f"{b}-m4"}


async def test_time_range_filter(corpus: Corpus) -> None:
    future = datetime.now(UTC) + timedelta(days=1)
    assert await corpus.client.recall("database", board=corpus.a, since=future) == []
    hits = await corpus.client.recall("database", board=corpus.b, until=future,
                                      since=datetime.now(UTC) - timedelta(hours=1))
    assert [h.id for h in hits] == [f"{corpus.b}-m4"]


async def test_top_k_and_min_score(corpus: Corpus) -> None:
    hits = await corpus.client.recall("database migration deploy", board=corpus.a, top_k=7, mode="semantic")
    assert len(hits) == 7
    strict = await corpus.client.recall("database migration deploy", board=corpus.a, mode="semantic",
                                        min_score=0.99, top_k=50)
    assert strict and all(h.score >= 0.99 for h in strict) and len(strict) < 50


async def test_hybrid_top_k_and_min_score_cut_the_fused_ranking(corpus: Corpus) -> None:
    # m1's own words: it leads, above the 300 fillers, which share three of its words and can
    # all tie (the test vectors hash words into 64 dimensions), so the ranking has a step.
    query = "the deploy to production failed because the database migration timed out"
    full = await corpus.client.recall(query, board=corpus.a, top_k=20)  # hybrid, the default
    assert len(full) == 20
    scores = [h.score for h in full]
    assert scores == sorted(scores, reverse=True)
    first = await corpus.client.recall(query, board=corpus.a, top_k=3)
    # The two leaders are the same; the third is one of the tied fillers (which of the 300
    # equal vectors enter the candidate pool depends on top_k, and a filler next to a
    # leader on the board gets the neighbour bonus only when that leader is a candidate).
    assert [h.id for h in first[:2]] == [h.id for h in full[:2]] == [f"{corpus.a}-m1", f"{corpus.a}-m2"]
    assert len(first) == 3 and first[2].scores["semantic"] == pytest.approx(full[2].scores["semantic"])
    # A threshold between two scores of the ranking keeps exactly the hits above it.
    cut = next(i for i in range(1, len(full)) if scores[i] < scores[i - 1])
    threshold = (scores[cut - 1] + scores[cut]) / 2
    strict = await corpus.client.recall(query, board=corpus.a, top_k=20, min_score=threshold)
    assert [h.id for h in strict] == [h.id for h in full[:cut]]


async def test_selective_filter_still_finds_the_item(corpus: Corpus) -> None:
    # 300 memories are closer to the query than the needle; only the filter finds it.
    for mode in ("semantic", "hybrid"):
        hits = await corpus.client.recall("database migration deploy", board=corpus.a, tags_all=["needle"],
                                          mode=mode)
        assert [h.id for h in hits] == [f"{corpus.a}-needle"]
    hits = await corpus.client.recall("database migration deploy", board=corpus.a, author="dora",
                                      mode="semantic", top_k=3)
    assert [h.id for h in hits] == [f"{corpus.a}-needle"]


async def test_entry_search_current_values_sections_and_no_deleted(corpus: Corpus) -> None:
    c, a = corpus.client, corpus.a
    hits = await c.search_entries("database", board=a, top_k=10)
    keys = {(h.section, h.key) for h in hits}
    assert ("notes", "plan") in keys and ("facts", "gone") not in keys
    plan = next(h for h in hits if h.key == "plan")
    assert plan.value == {"title": "migrate the database twice"} and plan.revision == corpus.seqs["plan2"]
    assert {h.key for h in await c.search_entries("pizza", board=a, section="notes", mode="keyword")} == {"lunch"}
    assert {h.key for h in await c.search_entries("pgvector postgres", board=a, section="facts",
                                                  metadata={"verified": True})} == {"db"}
    assert await c.search_entries("pizza", board=a, section="facts", mode="keyword") == []
    assert {h.key for h in await c.search_entries("pizza", board=a, tags_any=["food"])} == {"lunch"}
    assert {h.key for h in await c.search_entries("database", board=a, author="carol")} <= {"lunch"}


async def test_history_and_as_of(corpus: Corpus) -> None:
    c, a, s = corpus.client, corpus.a, corpus.seqs
    revs = await c.history(a, "notes", "plan")
    assert [r.revision for r in revs] == [s["plan1"], s["plan2"]]
    assert revs[0].value == {"title": "migrate the database"} and revs[1].author == "bob"
    assert [r.revision for r in await c.history(a, "notes", "plan", limit=1)] == [s["plan2"]]
    assert (await c.as_of(a, "notes", "plan", revision=s["plan2"] - 1)).revision == s["plan1"]
    assert (await c.as_of(a, "notes", "plan", revision=s["plan2"])).value == {"title": "migrate the database twice"}
    assert (await c.as_of(a, "notes", "plan", at=corpus.t_before_update)).revision == s["plan1"]
    gone = await c.history(a, "facts", "gone")
    assert [r.op for r in gone] == ["PUT", "DEL"]
    assert (await c.as_of(a, "facts", "gone", revision=s["gone"])).value == "database to be deleted"
    with pytest.raises(NotFoundError):
        await c.as_of(a, "facts", "gone", revision=s["gone_del"])
    with pytest.raises(NotFoundError):
        await c.as_of(a, "notes", "plan", revision=s["plan1"] - 1)
    with pytest.raises(NotFoundError):
        await c.history(a, "notes", "never-written")
    with pytest.raises(InvalidPayloadError):
        await c.as_of(a, "notes", "plan")


async def test_invalid_request_gets_a_typed_error_reply(corpus: Corpus) -> None:
    msg = await corpus.nc.request(Subjects.search("tester", "memories"), codec.encode({"v": 1, "query": ""}), timeout=5)
    assert msg.headers is not None and msg.headers["Bb-Error"] == "InvalidPayloadError"
    with pytest.raises(InvalidPayloadError):
        raise_for_error(msg.headers, msg.data)
    # JSON clients get JSON back
    msg = await corpus.nc.request(Subjects.search("tester", "history"), json.dumps(
        {"board": corpus.a, "section": "notes", "key": "nope"}).encode(), headers={"Bb-Encoding": "json"}, timeout=5)
    assert msg.headers is not None and msg.headers["Bb-Error"] == "NotFoundError"
    assert ErrorReply.model_validate_json(msg.data).error == "NotFoundError"


async def test_service_is_discoverable_and_reports_status(corpus: Corpus) -> None:
    msg = await corpus.nc.request("$SRV.INFO.blackboard-search", b"", timeout=5)
    info = json.loads(msg.data)
    assert info["name"] == "blackboard-search"
    assert {e["name"] for e in info["endpoints"]} >= {"memories", "entries", "history", "as_of", "status"}
    status = await corpus.client.status()
    assert "lag" in status and status["embedding"]["model"] == "test-hash"


async def test_no_service_raises_search_error(nats_factory: Callable[[], EmbeddedNats]) -> None:
    from tests.conftest import make_settings

    server = await asyncio.to_thread(nats_factory)  # it sets the streams up in a loop of its own
    s = make_settings(server.url)
    nc = await connect_nats(s.nats, name="nosvc")
    try:
        with pytest.raises(SearchError, match="not running"):
            await SearchClient(nc, s, "tester").recall("anything")
    finally:
        await nc.close()


async def test_search_survives_its_connections_being_killed(corpus: Corpus) -> None:
    """The service's pool hands connections out unchecked: a query meeting a dead one is retried."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(corpus.dsn, autocommit=True) as admin:
        cur = await admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE application_name = %s", (f"blackboard-{corpus.worker}-search",))
        row = await cur.fetchone()
    assert row is not None and row[0] >= 1  # the service's idle connections are gone
    for mode in ("keyword", "semantic", "hybrid"):
        hits = await corpus.client.recall("pizza cafeteria", board=corpus.a, mode=mode)  # type: ignore[arg-type]
        assert hits and hits[0].id == f"{corpus.a}-m3", mode
    revisions = await corpus.client.history(corpus.a, "notes", "plan")
    assert [r.revision for r in revisions] == [corpus.seqs["plan1"], corpus.seqs["plan2"]]


async def test_search_embeds_queries_with_a_provider_of_its_own(pg_settings: Settings, unique: str) -> None:
    """The embedder's batches hold the local model for a while: queries get their own instance."""
    s = worker_settings(pg_settings, name=f"own{unique}", lag_interval=600)
    async with running_worker(s) as w:
        assert w.embedder is not None and w.search is not None and w.search.engine is not None
        query_provider = w.search.engine.provider
        assert query_provider is not None and query_provider is not w.embedder.provider
        assert (query_provider.model, query_provider.dimensions) == (w.embedder.provider.model,
                                                                     w.embedder.provider.dimensions)
    async with running_worker(s, embed=False) as w:  # a worker that does not embed still embeds queries
        assert w.embedder is None and w.search is not None and w.search.engine is not None
        assert w.search.engine.provider is not None


async def test_search_connections_plan_each_query_for_its_parameters(pg_settings: Settings, unique: str) -> None:
    """A generic plan of a prepared search can be several times slower: the service's pool forces
    custom plans, prices random reads with the configured ``search.random_page_cost`` and never JITs."""
    s = pg_settings.model_copy(update={"search": pg_settings.search.model_copy(update={"random_page_cost": 1.7})})
    async with running_worker(s, name=f"plan{unique}", lag_interval=600, embed=False) as w:
        assert w.search is not None and w.search.engine is not None
        pool = w.search.engine.pool
        async with pool.connection() as a, pool.connection() as b:  # two connections, both configured
            for conn in (a, b):
                row = await (await conn.execute(
                    "SELECT current_setting('plan_cache_mode'), current_setting('random_page_cost'), "
                    "current_setting('jit')")).fetchone()
                assert row == ("force_custom_plan", "1.7", "off")


async def test_a_table_never_analysed_is_analysed_after_a_search_finds_it(pg_settings: Settings,
                                                                          postgres_server: EmbeddedPostgres) -> None:
    """Freshly filled tables have no statistics until autovacuum comes (the planner guesses, keyword
    search cannot leave out common words): the engine notices and ANALYZEs them."""
    import uuid

    import psycopg

    from blackboard.db import migrate, open_pool
    from blackboard.protocol.schemas.search import MemorySearchRequest
    from blackboard.search.engine import SearchEngine
    from tests.conftest import make_settings

    name = "fresh" + uuid.uuid4().hex[:10]
    dsn = fresh_db(postgres_server, name)
    s = make_settings(pg_settings.nats.url, dsn)
    await migrate(s)
    words = ["harbour", "ferry", "morning", "bread", "engine", "river", "garden", "letter"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE bb_memories SET (autovacuum_enabled = false)")  # only the engine analyses
        conn.execute(
            "INSERT INTO bb_memories (id, board, agent, kind, text, search_text, created_at, updated_at, stream, seq) "
            "SELECT 'm' || i, 'b', 'a', 'episodic', t, t, now(), now(), 'BB_MEMORY', i "
            "FROM generate_series(1, 300) i, LATERAL (SELECT %s::text[] AS w) ws, "
            "LATERAL (SELECT w[1 + i %% 8] || ' ' || w[1 + (i / 8) %% 8] || ' number ' || i AS t) x", (words,))
        reltuples = "SELECT reltuples FROM pg_class WHERE oid = 'bb_memories'::regclass"
        assert conn.execute(reltuples).fetchone() == (-1.0,)  # never analysed
        async with open_pool(s.postgres, min_size=1, max_size=2) as pool:
            engine = SearchEngine(pool, None, s.search)
            req = MemorySearchRequest(query="ferry number 9", mode="keyword", top_k=3)
            before = [h.id for h in (await engine.search_memories(req)).hits]
            await engine.analyze_missing()
            assert conn.execute(reltuples).fetchone() == (300.0,)
            assert conn.execute("SELECT count(*) FROM pg_stats WHERE tablename = 'bb_memories' "
                                "AND attname = 'tsv' AND most_common_elems IS NOT NULL").fetchone() == (1,)
            after = [h.id for h in (await engine.search_memories(req)).hits]
            await engine.analyze_missing()  # nothing left to do
    assert before[0] == after[0] == "m9"
    drop_db(postgres_server, name)


async def test_an_entry_that_expired_while_the_worker_was_away_is_not_found(pg_settings: Settings,
                                                                          unique: str) -> None:
    """The server's delete marker lives ~1 s: a worker down meanwhile never reads it. The stored
    revision's expiry still keeps the entry out of searches and time-based as-of reads."""
    import asyncio
    from datetime import UTC, datetime

    from agents_sdk import Agent

    # A bucket of its own: the other tests' workers (sharing this PostgreSQL) must not read the marker.
    own_bucket = pg_settings.board.model_copy(update={"bucket": f"ttl{unique}"})
    s = worker_settings(pg_settings.model_copy(update={"board": own_bucket}), name=f"ttl{unique}", embed=False,
                        batch_wait=0.02, lag_interval=600)
    nc = await connect_nats(s.nats, name="test-ttl")
    await ensure_streams(nc.jetstream(), s)
    client = SearchClient(nc, s, "tester")
    try:
        async with Agent.connect("ttl-writer", settings=s) as agent:
            board = agent.board(unique)
            async with running_worker(s) as w:
                # (2 s: this worker is stopped before the key expires and its marker appears)
                rev = await board.put("s", "gone", f"ephemeral {unique}", ttl=2)
                await board.put("s", "kept", f"durable {unique}")
                await w.wait_caught_up(30)
                hits = await client.search_entries(unique, board=unique, mode="keyword")
                assert {h.key for h in hits} == {"gone", "kept"}  # stored while it lived
            # The worker is stopped: the key expires, the server places its
            # delete marker, and the marker expires too (the stream then holds
            # nothing for the key).
            import nats.js.errors

            subj = Subjects(s.board.bucket)
            js = nc.jetstream()
            for _ in range(200):
                try:
                    await js.get_last_msg(subj.kv_stream, subj.entry(unique, "s", "gone"))
                except nats.js.errors.NotFoundError:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the entry and its delete marker did not expire within 20 s")
            with pytest.raises(NotFoundError):
                await board.get("s", "gone")
            async with running_worker(s) as w:
                await w.wait_caught_up(30)
                hits = await client.search_entries(unique, board=unique, mode="keyword")
                assert [h.key for h in hits] == ["kept"]
                revisions = await client.history(unique, "s", "gone")
                assert [(r.revision, r.op) for r in revisions] == [(rev, "PUT")]  # the marker was never read
                assert (await client.as_of(unique, "s", "gone", revision=rev)).value == f"ephemeral {unique}"
                with pytest.raises(NotFoundError, match="expired"):
                    await client.as_of(unique, "s", "gone", at=datetime.now(UTC))
    finally:
        await nc.close()
