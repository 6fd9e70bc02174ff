"""Comparison filters (``where``) end to end: every operator in every search mode, for memories and
entries, through the SDK and a real worker; selective filters (1 item of 1,000) are found in
semantic mode through the HNSW index as through the exact scan; bad filters are refused with a
message naming them; ``Board.entries`` filters the current entries alike."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from agents_sdk import Agent, Board, InvalidPayloadError, MemoryInput, WriteOp
from agents_sdk.search import raise_for_error
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.filters import matches
from blackboard.protocol.schemas.search import SearchMode
from blackboard.protocol.subjects import Subjects
from tests._worker_helpers import HashProvider, drop_db, fresh_db, running_worker, worker_settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio

N = 1000
NEEDLE = 537
STATUSES = ("open", "blocked", "done", "draft")
MODES: tuple[SearchMode, ...] = ("semantic", "keyword", "hybrid")


def _metadata(i: int, run: str) -> dict[str, Any]:
    m: dict[str, Any] = {"run": run, "n": i, "score": round(i / N, 3), "parity": "odd" if i % 2 else "even",
                         "group": f"g{i % 50:02d}", "nested": {"level": i % 4}}
    if i % 3 == 0:
        m["reviewed"] = i % 6 == 0
    if i % 7 == 0:
        m["note"] = None
    if i == NEEDLE:
        m["needle"] = "yes"
    return m


def _value(i: int) -> dict[str, Any]:
    return {"title": f"database migration task {i}", "status": STATUSES[i % 4], "n": i, "owner": f"o{i % 100}",
            "nested": {"pri": i % 5}}


@dataclass
class Corpus:
    run: str
    agent: Agent
    board: Board
    #: item id (memory id or entry key) -> (metadata, value)
    memories: dict[str, tuple[dict[str, Any], Any]]
    entries: dict[str, tuple[dict[str, Any], Any]]


@pytest_asyncio.fixture(scope="module")
async def corpus(nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres) -> AsyncIterator[Corpus]:
    run = "w" + uuid.uuid4().hex[:12]
    # A database of its own: the worker's wait for an empty embedding queue waits on its database's.
    db = fresh_db(postgres_server, run)
    settings = worker_settings(make_settings(nats_server.url, db), name=f"w{run}", batch_wait=0.02)
    try:
        async with Agent.connect(f"filter-{run}", settings=settings) as agent:
            board = agent.board(run)
            ids = await agent.remember_many(
                MemoryInput(f"database migration note {i}", board=run, metadata=_metadata(i, run)) for i in range(N))
            memories = {mid: (_metadata(i, run), None) for i, mid in enumerate(ids)}
            await board.put_many([WriteOp("items", f"k{i:04d}", _value(i), metadata=_metadata(i, run))
                                  for i in range(N)])
            entries = {f"k{i:04d}": (_metadata(i, run), _value(i)) for i in range(N)}
            async with running_worker(settings, provider=HashProvider()) as worker:
                await worker.wait_caught_up(120, embedded=True)
                yield Corpus(run, agent, board, memories, entries)
    finally:
        drop_db(postgres_server, run)


def _expected(items: dict[str, tuple[dict[str, Any], Any]], where: dict[str, Any]) -> set[str]:
    return {k for k, (m, v) in items.items() if matches(where, metadata=m, value=v)}


#: (where, how many of the corpus it keeps): each operator, alone or narrowed by another.
MEMORY_CASES: list[tuple[dict[str, Any], int]] = [
    ({"metadata.needle": "yes"}, 1),  # 1 of 1,000
    ({"metadata.n": {"$eq": NEEDLE}}, 1),
    ({"metadata.n": {"$lt": 10}, "metadata.parity": {"$ne": "even"}}, 5),
    ({"metadata.score": {"$gt": 0.99}}, 9),
    ({"metadata.n": {"$gte": 500, "$lte": 504}}, 5),
    ({"metadata.n": {"$lt": 3}}, 3),
    ({"metadata.group": {"$in": ["g07", "g99"]}, "metadata.n": {"$lt": 200}}, 4),
    ({"metadata.n": {"$lt": 12}, "metadata.group": {"$nin": ["g00", "g01"]}}, 10),
    ({"metadata.note": {"$exists": True}, "metadata.n": {"$lt": 50}}, 8),  # a present null exists
    ({"metadata.note": None, "metadata.n": {"$lt": 15}}, 3),
    ({"metadata.reviewed": {"$exists": False}, "metadata.n": {"$lt": 10}}, 6),
    ({"metadata.reviewed": True, "metadata.n": {"$lt": 20}}, 4),
    ({"metadata.nested.level": 3, "metadata.n": {"$lt": 20}}, 5),
    ({"metadata.group": {"$gt": "g48"}, "metadata.n": {"$lt": 100}}, 2),
    ({"metadata.n": {"$gt": "9"}}, 0),  # ordered comparisons need the operand's type
]
ENTRY_CASES: list[tuple[dict[str, Any], int]] = [
    ({"value.n": 777}, 1),  # 1 of 1,000
    ({"value.status": {"$in": ["open", "blocked"]}, "value.n": {"$lt": 10}}, 6),
    ({"value.owner": "o42"}, 10),
    ({"value.n": {"$lt": 8}, "value.status": {"$ne": "open"}}, 6),
    ({"value.n": {"$lt": 8}, "value.status": {"$nin": ["open", "done"]}}, 4),
    ({"value.n": {"$gte": 990, "$lte": 995}}, 6),
    ({"value.n": {"$gt": 997}}, 2),
    ({"value.status": {"$lt": "c"}, "value.n": {"$lt": 10}}, 3),  # "blocked"
    ({"value.missing": {"$exists": False}, "value.n": {"$gte": 995}}, 5),
    ({"value.nested.pri": {"$exists": True}, "value.n": {"$lt": 4}}, 4),
    ({"value.nested.pri": 4, "metadata.parity": "even", "value.n": {"$lt": 40}}, 4),
    ({"metadata.needle": "yes", "value.status": "open"}, 0),
    ({"metadata.needle": "yes", "value.status": "blocked"}, 1),
]


def _ids(where: dict[str, Any], run: str) -> dict[str, Any]:
    return {**where, "metadata.run": run}


async def test_every_operator_in_every_mode_on_memories(corpus: Corpus) -> None:
    for where, count in MEMORY_CASES:
        expected = _expected(corpus.memories, where)
        assert len(expected) == count, where
        for mode in MODES:
            on_board = await corpus.board.recall("database migration note", where=where, mode=mode, top_k=50)
            assert {h.id for h in on_board} == expected, (mode, where)
            # Without a board filter the HNSW index is scanned (a board this small is scanned exactly).
            anywhere = await corpus.agent.recall("database migration note", where=_ids(where, corpus.run),
                                                 mode=mode, top_k=50)
            assert {h.id for h in anywhere} == expected, (mode, "all boards", where)


async def test_every_operator_in_every_mode_on_entries(corpus: Corpus) -> None:
    for where, count in ENTRY_CASES:
        expected = _expected(corpus.entries, where)
        assert len(expected) == count, where
        for mode in MODES:
            hits = await corpus.board.search("database migration task", where=where, mode=mode, top_k=50)
            assert {h.key for h in hits} == expected, (mode, where)
            assert all(matches(where, metadata=h.metadata, value=h.value) for h in hits)
            anywhere = await corpus.agent.search.search_entries("database migration task", mode=mode, top_k=50,
                                                                where=_ids(where, corpus.run))
            assert {h.key for h in anywhere} == expected, (mode, "all boards", where)


async def test_a_selective_filter_keeps_the_nearest_of_the_rest(corpus: Corpus) -> None:
    """top_k of the items passing a filter, best first: the filtered search's head is the
    unfiltered ranking of those items."""
    where = {"metadata.parity": "even", "metadata.n": {"$gte": 100}}
    hits = await corpus.agent.recall("database migration note 420", where=_ids(where, corpus.run),
                                     mode="semantic", top_k=5)
    assert len(hits) == 5 and all(h.metadata["n"] % 2 == 0 and h.metadata["n"] >= 100 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


async def test_where_combines_with_the_other_filters(corpus: Corpus) -> None:
    hits = await corpus.board.recall("database", metadata={"parity": "odd"}, where={"metadata.n": {"$lt": 6}},
                                     mode="keyword", top_k=50)
    assert sorted(h.metadata["n"] for h in hits) == [1, 3, 5]
    assert await corpus.board.search("database", section="other", where={"value.n": 1}, mode="keyword") == []


@pytest.mark.parametrize(("where", "message"), [
    ({"metadata.n": {"$regex": "x"}}, "unknown operator '$regex' on 'metadata.n'"),
    ({"metadata.n": {"$gt": [1]}}, "$gt on 'metadata.n' takes a number or a string, not a list"),
    ({"metadata.n": {"$in": "abc"}}, "$in on 'metadata.n' takes a list, not str"),
    ({"metadata.n": {"$exists": "yes"}}, "$exists on 'metadata.n' takes true or false"),
    ({"meta.n": 1}, "path 'meta.n' must start with 'metadata.' or 'value.'"),
    ({"metadata..n": 1}, "path 'metadata..n' has an empty segment"),
])
async def test_bad_filters_are_refused_naming_the_problem(corpus: Corpus, where: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(InvalidPayloadError) as recall:
        await corpus.agent.recall("x", where=where)
    with pytest.raises(InvalidPayloadError) as search:
        await corpus.board.search("x", where=where)
    with pytest.raises(InvalidPayloadError) as listing:
        await corpus.board.entries(where=where)
    for info in (recall, search, listing):
        assert message in str(info.value)


async def test_memories_refuse_value_paths(corpus: Corpus) -> None:
    with pytest.raises(InvalidPayloadError, match=r"path 'value.status': memories have no value"):
        await corpus.agent.recall("x", where={"value.status": "open"})


async def test_the_service_refuses_a_bad_where_sent_raw(corpus: Corpus) -> None:
    """A request that bypasses the SDK's checks gets the service's InvalidPayloadError, naming the path."""
    agent = corpus.agent
    for body, message in [({"v": 1, "query": "x", "where": {"metadata.n": {"$gt": True}}}, "$gt on 'metadata.n'"),
                          ({"v": 1, "query": "x", "where": {"value.n": 1}}, "memories have no value")]:
        msg = await agent.nc.request(Subjects.search(agent.id, "memories"), codec.encode(body), timeout=10)
        with pytest.raises(InvalidPayloadError) as info:
            raise_for_error(msg.headers, msg.data)
        assert message in str(info.value)


async def test_board_entries_lists_and_filters_the_current_entries(corpus: Corpus) -> None:
    board = corpus.board
    everything = await board.entries()
    assert [e.key for e in everything] == sorted(corpus.entries)
    assert [e.key for e in await board.entries("items")] == sorted(corpus.entries)
    assert await board.entries("nothing") == []
    for where, _ in ENTRY_CASES:
        listed = await board.entries("items", where=where)
        assert [e.key for e in listed] == sorted(_expected(corpus.entries, where)), where
        assert listed == [e for e in everything if matches(where, metadata=e.metadata, value=e.value)]


async def test_board_entries_reads_live_entries_and_bytes_as_null(corpus: Corpus) -> None:
    board = corpus.agent.board(corpus.run + "x")
    await board.put("s", "blob", b"\x00raw bytes", metadata={"kind": "blob"})
    await board.put("s", "doc", {"a": 1}, metadata={"kind": "doc"})
    await board.put("s", "gone", {"a": 1})
    await board.delete("s", "gone")
    await board.put("t", "doc", {"a": 2})
    assert [(e.section, e.key) for e in await board.entries()] == [("s", "blob"), ("s", "doc"), ("t", "doc")]
    # A value JSON cannot hold reads as null (the search's stored JSON value is null then).
    assert [e.key for e in await board.entries(where={"value": None})] == ["blob"]
    assert [e.key for e in await board.entries("s", where={"value.a": {"$gte": 1}})] == ["doc"]
    assert [e.section for e in await board.entries(where={"value.a": {"$gte": 1}})] == ["s", "t"]
    assert [e.key for e in await board.entries(where={"metadata.kind": {"$nin": ["doc"]}})] == ["blob", "doc"]
