"""BlackboardStore against real servers: every operation sync and async, parity with
LangGraph's InMemoryStore, filters through the store (with and without a query), TTL, bad
input, and two processes writing one namespace."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardStore
from agents_sdk.langgraph._bridge import LoopBridge
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.errors import PermissionDeniedError
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker, fresh_db
from tests.conftest import make_settings


def _rows(items: list[Any]) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    return [(i.namespace, i.key, i.value) for i in items]


@pytest.mark.asyncio
async def test_every_operation_async(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        assert await store.aget(("users", "u1"), "prefs") is None
        await store.aput(("users", "u1"), "prefs", {"theme": "dark", "n": 1})
        first = await store.aget(("users", "u1"), "prefs")
        assert first is not None and first.value == {"theme": "dark", "n": 1}
        assert (first.namespace, first.key) == (("users", "u1"), "prefs")
        await asyncio.sleep(0.01)
        await store.aput(("users", "u1"), "prefs", {"theme": "light"})
        second = await store.aget(("users", "u1"), "prefs")
        assert second is not None and second.value == {"theme": "light"}
        assert second.created_at == first.created_at and second.updated_at > first.updated_at
        await store.aput(("users", "u2"), "prefs", {"theme": "dark"})
        await store.aput(("users", "u2", "deep"), "k", {"x": 1})
        await store.aput(("docs",), "k", {"x": 2})

        found = await store.asearch(("users",))
        assert _rows(found) == [(("users", "u1"), "prefs", {"theme": "light"}),
                                (("users", "u2"), "prefs", {"theme": "dark"}),
                                (("users", "u2", "deep"), "k", {"x": 1})]
        assert all(i.score is None for i in found)
        assert _rows(await store.asearch(("users", "u2"), filter={"theme": "dark"})) == [
            (("users", "u2"), "prefs", {"theme": "dark"})]
        assert await store.alist_namespaces() == [("docs",), ("users", "u1"), ("users", "u2"),
                                                   ("users", "u2", "deep")]
        assert await store.alist_namespaces(prefix=("users",), max_depth=2) == [("users", "u1"), ("users", "u2")]

        await store.adelete(("users", "u1"), "prefs")
        assert await store.aget(("users", "u1"), "prefs") is None
        await store.abatch([PutOp(("users", "u2"), "prefs", None)])  # a put of None deletes
        assert await store.aget(("users", "u2"), "prefs") is None
        await store.adelete(("users", "nobody"), "nothing")  # deleting what is absent is no error
        assert await store.alist_namespaces() == [("docs",), ("users", "u2", "deep")]

        # a re-created item is new: its creation time too
        await store.aput(("users", "u1"), "prefs", {"theme": "blue"})
        again = await store.aget(("users", "u1"), "prefs")
        assert again is not None and again.created_at > first.created_at

        # a batch: reads see the board as before its writes; the last put of an item wins
        results = await store.abatch([
            PutOp(("docs",), "k", {"x": 3}), GetOp(("docs",), "k"), PutOp(("docs",), "k", {"x": 4}),
            SearchOp(("docs",)), ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("deep",)),))])
        assert results[0] is None and results[2] is None
        assert results[1] is not None and results[1].value == {"x": 2}  # type: ignore[union-attr]
        assert _rows(results[3]) == [(("docs",), "k", {"x": 2})]  # type: ignore[arg-type]
        assert results[4] == [("users", "u2", "deep")]
        assert (await store.aget(("docs",), "k")).value == {"x": 4}  # type: ignore[union-attr]

        # the item is an entry of the board, written as the agent, signed
        entry = await agent.board(unique).get("docs", '["k"]')
        assert entry.value == {"x": 4} and entry.author == agent.id and entry.metadata["langgraph"]["ns"] == ["docs"]


@pytest.mark.asyncio
async def test_every_operation_sync_from_another_thread(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)

        def run() -> None:
            store.put(("notes",), "a", {"text": "one", "n": 1})
            store.put(("notes",), "b", {"text": "two", "n": 2})
            store.put(("notes", "sub"), "c", {"text": "three", "n": 3})
            item = store.get(("notes",), "a")
            assert item is not None and item.value == {"text": "one", "n": 1}
            assert [i.key for i in store.search(("notes",), filter={"n": {"$gte": 2}})] == ["b", "c"]
            assert [i.key for i in store.search(("notes",), limit=1, offset=1)] == ["b"]
            assert store.list_namespaces(prefix=("notes",)) == [("notes",), ("notes", "sub")]
            store.delete(("notes",), "a")
            assert store.get(("notes",), "a") is None
            assert store.batch([GetOp(("notes",), "b")])[0] is not None

        await asyncio.to_thread(run)
        # on the agent's own loop a sync call would wait for itself: refused, naming the async one
        with pytest.raises(RuntimeError, match=r"await aget\(\)"):
            store.get(("notes",), "b")
        with pytest.raises(RuntimeError, match=r"await abatch\(\)"):
            store.batch([GetOp(("notes",), "b")])


def _invoke(graph: Any, state: dict[str, Any]) -> Any:
    return graph.invoke(state)


@pytest.mark.asyncio
async def test_a_graph_uses_the_store_sync_and_async(settings: Settings, unique: str) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.store.base import BaseStore

    class State(TypedDict):
        user: str
        seen: int

    def remember(state: State, *, store: BaseStore) -> dict[str, int]:  # a sync node: the sync API
        store.put(("visits", state["user"]), f"v{state['seen']}", {"n": state["seen"]})
        return {"seen": len(store.search(("visits", state["user"]), limit=100))}

    async def aremember(state: State, *, store: BaseStore) -> dict[str, int]:
        await store.aput(("visits", state["user"]), f"v{state['seen']}", {"n": state["seen"]})
        return {"seen": len(await store.asearch(("visits", state["user"]), limit=100))}

    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        for node in (remember, aremember):
            graph = StateGraph(State).add_node("n", node).add_edge(START, "n").add_edge("n", END).compile(store=store)
            user = node.__name__
            assert (await graph.ainvoke({"user": user, "seen": 0}))["seen"] == 1  # a sync node: in a thread
            if node is remember:  # the sync runner, from a thread of its own
                assert (await asyncio.to_thread(_invoke, graph, {"user": user, "seen": 1}))["seen"] == 2
            else:
                assert (await graph.ainvoke({"user": user, "seen": 1}))["seen"] == 2
        assert await store.alist_namespaces(prefix=("visits",)) == [("visits", "aremember"), ("visits", "remember")]


def test_connect_sync_without_an_event_loop(settings: Settings, unique: str) -> None:
    with BlackboardStore.connect_sync(f"a{unique}", settings=settings, board=unique) as store:
        store.put(("mem", "u1"), "likes", {"food": "pizza"})
        item = store.get(("mem", "u1"), "likes")
        assert item is not None and item.value == {"food": "pizza"}
        assert store.list_namespaces() == [("mem", "u1")]
    with pytest.raises(RuntimeError, match="not running"):
        store.get(("mem", "u1"), "likes")


def test_building_a_store_outside_async_code_is_refused(settings: Settings) -> None:
    with pytest.raises(RuntimeError, match="connect_sync"):
        BlackboardStore(object())  # type: ignore[arg-type]


async def _same_on_both(store: BlackboardStore, mem: InMemoryStore,
                        step: Callable[[Any], Awaitable[Any]]) -> Any:
    ours, theirs = await step(store), await step(mem)
    assert ours == theirs
    return ours


@pytest.mark.asyncio
async def test_parity_with_the_in_memory_store(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store, mem = BlackboardStore(agent, board=unique), InMemoryStore()
        docs: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
            (("a", "b"), "k1", {"score": 5, "color": "red", "nested": {"x": 1, "y": "s"}}),
            (("a", "c"), "k2", {"score": 3.5, "color": "blue", "tags": ["p", "q"]}),
            (("a", "b"), "k3", {"score": 9, "color": "red"}),
            (("z",), "k4", {"score": 1, "color": "green", "nested": {"x": 2}}),
            (("a", "b", "d", "e"), "k5", {"score": 7, "color": "blue"}),
            (("a", "b", "d", "i"), "k6", {"score": 7.5}),
            (("a", "b", "f"), "k7", {"score": 2, "color": None}),
        ]
        for ns, key, value in docs:
            for s in (store, mem):
                await s.aput(ns, key, value)
                await asyncio.sleep(0.002)  # distinct creation times
        for s in (store, mem):
            await s.aput(("a", "b"), "k1", {**docs[0][2], "score": 6})  # an update keeps the item's place
            await s.aput(("a", "b"), "k3", None)  # type: ignore[arg-type]
            await s.aput(("a", "b"), "k3", {"score": 9, "color": "red"})  # re-created: now last of its namespace

        async def rows(s: Any, prefix: tuple[str, ...], **kw: Any) -> Any:
            return _rows(await s.asearch(prefix, **kw))

        searches: list[tuple[tuple[str, ...], dict[str, Any]]] = [
            ((), {}), (("a",), {}), (("a", "b"), {}), (("a", "b", "d"), {}), (("nothing",), {}),
            ((), {"limit": 3}), ((), {"limit": 3, "offset": 2}), ((), {"offset": 100}), ((), {"limit": 0}),
            ((), {"filter": {"color": "red"}}), ((), {"filter": {"score": {"$gt": 5}}}),
            ((), {"filter": {"score": {"$gte": 6, "$lt": 9}}}), ((), {"filter": {"score": {"$lte": 4}}}),
            ((), {"filter": {"color": {"$ne": "red"}}}), ((), {"filter": {"color": {"$eq": "blue"}}}),
            ((), {"filter": {"nested": {"x": 1}}}), (("a",), {"filter": {"color": "red", "score": {"$gt": 6}}}),
            ((), {"filter": {"tags": ["p", "q"]}}), ((), {"filter": {"color": "blue"}, "limit": 1, "offset": 1}),
        ]
        for prefix, kw in searches:
            assert await rows(store, prefix, **kw) == await rows(mem, prefix, **kw), (prefix, kw)

        listings: list[dict[str, Any]] = [
            {}, {"prefix": ("a",)}, {"prefix": ("a", "b")}, {"suffix": ("b",)}, {"prefix": ("a", "*")},
            {"prefix": ("*", "b")}, {"suffix": ("*", "e")}, {"prefix": ("a",), "suffix": ("i",)},
            {"prefix": ("a", "b"), "max_depth": 3}, {"max_depth": 1}, {"max_depth": 2, "limit": 2},
            {"limit": 2, "offset": 3}, {"prefix": ("q",)},
        ]
        for kw in listings:
            assert await store.alist_namespaces(**kw) == await mem.alist_namespaces(**kw), kw
        for ns, key, _ in docs:
            ours, theirs = await store.aget(ns, key), await mem.aget(ns, key)
            assert ours is not None and theirs is not None and ours.value == theirs.value


@pytest.mark.asyncio
async def test_filters_with_each_operator_through_the_store(pg_settings: Settings, postgres_server: EmbeddedPostgres,
                                                            start_worker: StartWorker, unique: str) -> None:
    settings = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    worker = await start_worker(settings, name=f"w{unique}", batch_wait=0.02, provider=HashProvider())
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        values: dict[str, dict[str, Any]] = {
            "a": {"text": "apple pie recipe", "score": 1, "status": "open", "meta": {"lang": "en"}},
            "b": {"text": "apple tart recipe", "score": 2.5, "status": "done", "meta": {"lang": "fr"}},
            "c": {"text": "apple cake recipe", "score": 4, "status": "open", "flag": None},
            "d": {"text": "apple crumble recipe", "score": "high", "status": "blocked"},
            "e": {"text": "apple juice recipe", "score": True},
        }
        for key, value in values.items():
            await store.aput(("recipes", "fruit"), key, value)
        await store.aput(("recipes", "fruit"), "hidden", {"text": "apple secret recipe", "score": 3}, index=False)
        await store.aput(("other",), "x", {"text": "apple recipe elsewhere", "score": 3})
        await worker.wait_caught_up(60, embedded=True)

        cases: list[tuple[dict[str, Any], set[str]]] = [
            ({"status": "open"}, {"a", "c"}),
            ({"status": {"$eq": "done"}}, {"b"}),
            ({"status": {"$ne": "open"}}, {"b", "d", "e", "hidden"}),  # $ne: also where the field is missing
            ({"score": {"$gt": 2}}, {"b", "c", "hidden"}),  # numbers only: not "high", not true
            ({"score": {"$gte": 2.5}}, {"b", "c", "hidden"}),
            ({"score": {"$lt": 2.5}}, {"a"}),
            ({"score": {"$lte": 2.5}}, {"a", "b"}),
            ({"score": {"$gt": 1, "$lt": 4}}, {"b", "hidden"}),
            ({"score": {"$gt": "a"}}, {"d"}),  # strings compare with strings
            ({"status": {"$in": ["open", "blocked"]}}, {"a", "c", "d"}),
            ({"status": {"$nin": ["open", "blocked"]}}, {"b", "e", "hidden"}),
            ({"flag": {"$exists": True}}, {"c"}),  # a present null exists
            ({"status": {"$exists": False}}, {"e", "hidden"}),
            ({"meta": {"lang": "fr"}}, {"b"}),
            ({"score": 1}, {"a"}),  # 1 == 1.0, and true is not 1
            ({"score": True}, {"e"}),
        ]
        for filter, expected in cases:
            listed = await store.asearch(("recipes",), filter=filter, limit=100)
            assert {i.key for i in listed} == expected, filter
            ranked = await store.asearch(("recipes",), query="apple recipe", filter=filter, limit=100)
            assert {i.key for i in ranked} == expected, ("query", filter)
            # every indexed item is ranked (scored); the one put with index=False follows unscored
            assert [i.key for i in ranked if i.score is None] == (["hidden"] if "hidden" in expected else [])
            assert all(i.score is not None for i in ranked[:len(expected) - ("hidden" in expected)])


@pytest.mark.asyncio
async def test_search_by_query(pg_settings: Settings, postgres_server: EmbeddedPostgres,
                               start_worker: StartWorker, unique: str) -> None:
    settings = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    worker = await start_worker(settings, name=f"w{unique}", batch_wait=0.02, provider=HashProvider())
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        await store.aput(("u1", "memories"), "m1", {"text": "likes hiking in the alps"})
        await store.aput(("u1", "memories"), "m2", {"text": "allergic to peanuts"})
        await store.aput(("u1", "memories"), "m3", {"text": "works as a nurse at night"})
        await store.aput(("u2", "memories"), "m1", {"text": "allergic to cats and peanuts"})
        await worker.wait_caught_up(60, embedded=True)

        hits = await store.asearch(("u1",), query="peanuts allergic")
        assert [(i.namespace, i.key) for i in hits][:1] == [(("u1", "memories"), "m2")]
        assert all(i.score is not None for i in hits) and [i.score for i in hits] == sorted(
            [i.score for i in hits], reverse=True)  # type: ignore[type-var]
        assert {i.namespace for i in hits} == {("u1", "memories")}  # the prefix holds
        everywhere = await store.asearch((), query="peanuts allergic", limit=2)
        assert {(i.namespace, i.key) for i in everywhere} == {(("u1", "memories"), "m2"), (("u2", "memories"), "m1")}
        page = await store.asearch(("u1",), query="peanuts allergic", limit=1, offset=1)
        assert _rows(page) == _rows(hits[1:2])
        assert await store.asearch(("u1",), query="peanuts", limit=0) == []

        # a new item is found by query once the worker has embedded it; before, it may follow unscored
        await store.aput(("u1", "memories"), "m4", {"text": "peanuts make u1 sick"})
        early = await store.asearch(("u1",), query="peanuts sick", limit=10)
        assert "m4" in {i.key for i in early}
        await worker.wait_caught_up(60, embedded=True)
        late = await store.asearch(("u1",), query="peanuts sick", limit=10)
        assert late[0].key == "m4" and late[0].score is not None

        # a deleted item leaves the results at once when the board is read to fill them
        await store.adelete(("u1", "memories"), "m4")
        assert "m4" not in {i.key for i in await store.asearch(("u1",), query="peanuts sick", limit=10)}

        # without the fill, a query returns what the search ranked only (as AsyncPostgresStore)
        await store.aput(("u1", "memories"), "m5", {"text": "peanuts again"}, index=False)
        await worker.wait_caught_up(60, embedded=True)
        assert "m5" in {i.key for i in await store.asearch(("u1",), query="peanuts", limit=10)}
        ranked_only = BlackboardStore(agent, board=unique, fill_unranked=False)
        only = await ranked_only.asearch(("u1",), query="peanuts", limit=10)
        assert {i.key for i in only} == {"m1", "m2", "m3"} and all(i.score is not None for i in only)


async def _expiries(store: BlackboardStore, ns: tuple[str, ...], keys: list[str], start: float,
                    within: float = 20) -> dict[str, float]:
    """Seconds from ``start`` at which each key is first seen gone (read every 0.1 s, without
    refreshing); the server removes an expired entry a little after its expiry, alike for all."""
    gone: dict[str, float] = {}
    while len(gone) < len(keys):
        assert time.monotonic() - start < within, f"not expired: {set(keys) - set(gone)}"
        for key in keys:
            if key not in gone and await store.aget(ns, key, refresh_ttl=False) is None:
                gone[key] = time.monotonic() - start
        await asyncio.sleep(0.1)
    return gone


@pytest.mark.asyncio
async def test_ttl(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        ttl = 4 / 60  # minutes: 4 s
        start = time.monotonic()
        await store.aput(("t",), "read", {"v": 1}, ttl=ttl)
        await store.aput(("t",), "unread", {"v": 2}, ttl=ttl)
        await store.aput(("t",), "peeked", {"v": 3}, ttl=ttl)
        await store.aput(("t",), "forever", {"v": 4})
        await store.aput(("t",), "shortened", {"v": 5})  # no TTL first, then one: it must still expire
        await store.aput(("t",), "shortened", {"v": 6}, ttl=ttl)
        await store.aput(("t",), "searched", {"v": 7}, ttl=ttl)
        await asyncio.sleep(2.2)
        assert await store.aget(("t",), "read") is not None  # refreshes: 4 s from now
        assert await store.aget(("t",), "peeked", refresh_ttl=False) is not None
        assert {i.key for i in await store.asearch(("t",), filter={"v": {"$gte": 5}}, refresh_ttl=False)} == {
            "shortened", "searched"}
        assert [i.key for i in await store.asearch(("t",), filter={"v": 7})] == ["searched"]  # refreshes too

        gone = await _expiries(store, ("t",), ["read", "unread", "peeked", "shortened", "searched"], start)
        assert gone["peeked"] > 3.5 and gone["unread"] > 3.5 and gone["shortened"] > 3.5
        assert gone["read"] - gone["peeked"] > 1.5 and gone["searched"] - gone["peeked"] > 1.5  # refreshed at 2.2 s
        assert max(gone.values()) < 12
        assert await store.aget(("t",), "forever") is not None
        assert await store.alist_namespaces() == [("t",)]

        with pytest.raises(ValueError, match="positive number of minutes"):
            await store.aput(("t",), "bad", {"v": 1}, ttl=0)


@pytest.mark.asyncio
async def test_ttl_config(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique, ttl={"default_ttl": 3 / 60, "refresh_on_read": False})
        assert store.supports_ttl
        start = time.monotonic()
        await store.aput(("c",), "default", {"v": 1})  # the default TTL
        await store.aput(("c",), "twin", {"v": 2})
        await store.aput(("c",), "kept", {"v": 3}, ttl=None)  # None: never expires
        await asyncio.sleep(1.5)
        assert await store.aget(("c",), "twin") is not None  # no refresh by default
        assert [i.key for i in await store.asearch(("c",))] == ["default", "twin", "kept"]
        assert await store.aget(("c",), "default", refresh_ttl=True) is not None  # refreshed: ~4.5 s
        gone = await _expiries(store, ("c",), ["default", "twin"], start)
        assert gone["twin"] > 2.5 and gone["default"] - gone["twin"] > 1.0
        assert await store.aget(("c",), "kept") is not None


@pytest.mark.asyncio
async def test_bad_input_is_refused_before_anything_is_written(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as agent:
        store = BlackboardStore(agent, board=unique)
        for ns in [("a.b",), ("",), ("a", ""), ("a\x00",), (1,)]:
            with pytest.raises(InvalidNamespaceError):
                await store.aput(ns, "k", {"v": 1})  # type: ignore[arg-type]
            with pytest.raises(InvalidNamespaceError):
                await store.aget(ns, "k")  # type: ignore[arg-type]
            with pytest.raises(InvalidNamespaceError):
                await store.asearch(ns)  # type: ignore[arg-type]
            with pytest.raises(InvalidNamespaceError):
                await store.alist_namespaces(prefix=ns)  # type: ignore[arg-type]
        with pytest.raises(InvalidNamespaceError):
            await store.aput((), "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError):
            await store.aput(("langgraph", "x"), "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError):  # batch() given operations directly checks them too
            await store.abatch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
        with pytest.raises(TypeError):
            await store.abatch([PutOp(("ok",), "k", ["not", "a", "mapping"])])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await store.abatch([PutOp(("ok",), 5, {"v": 1})])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown operation"):
            await store.abatch(["get"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"\$regex"):
            await store.asearch(("ok",), filter={"v": {"$regex": "x"}})
        with pytest.raises(ValueError, match=r"without '\.'"):
            await store.asearch(("ok",), filter={"a.b": 1})
        with pytest.raises(ValueError, match="limit"):
            await store.asearch(("ok",), limit=-1)
        with pytest.raises(ValueError, match="offset"):
            await store.alist_namespaces(offset=-1)
        with pytest.raises(ValueError, match="max_depth"):
            await store.alist_namespaces(max_depth=0)
        with pytest.raises(ValueError, match="minutes"):
            await store.aput(("ok",), "k", {"v": 1}, ttl=-1)
        assert await store.alist_namespaces() == []  # nothing of the refused batches was written


@pytest.mark.asyncio
async def test_a_reader_reads_but_cannot_write(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"a{unique}", settings=settings) as writer, \
            Agent.connect(f"reader-{unique}", settings=settings) as reader:
        await BlackboardStore(writer, board=unique).aput(("n",), "k", {"v": 1}, ttl=1)
        store = BlackboardStore(reader, board=unique)
        await asyncio.sleep(1.1)
        item = await store.aget(("n",), "k")  # its TTL refresh is refused, silently
        assert item is not None and item.value == {"v": 1}
        with pytest.raises(PermissionDeniedError):
            await store.aput(("n",), "k", {"v": 2})


_WRITER = """
import json, sys
from agents_sdk.langgraph import BlackboardStore
from blackboard.settings import Settings

agent, board, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with BlackboardStore.connect_sync(agent, settings=Settings(), board=board) as store:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(n):
        store.put(("shared", "ns"), f"{agent}-{i}", {"i": i, "by": agent})
        store.put(("shared", "ns"), "common", {"i": i, "by": agent})
    print(json.dumps(len(store.search(("shared",), limit=1000))), flush=True)
"""


def _environ(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env["BLACKBOARD_NATS__URL"] = settings.nats.url
    env["BLACKBOARD_NATS__WRITE_TIMEOUT"] = str(settings.nats.write_timeout)
    for name, value in [("NATS__CREDS_FILE", settings.nats.creds_file), ("NATS__TLS_CA_FILE", settings.nats.tls_ca_file),
                        ("SECURITY__AUTHORITY_DIR", settings.security.authority_dir),
                        ("SECURITY__POLICY_FILE", settings.security.policy_file)]:
        if value is not None:
            env[f"BLACKBOARD_{name}"] = str(value)
    return env


@pytest.mark.asyncio
async def test_two_processes_write_one_namespace_without_loss(settings: Settings, unique: str) -> None:
    n = 40
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, f"p{unique}", unique, str(n),
                                                env=_environ(settings), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"ready", line + await proc.stderr.read()
        async with Agent.connect(f"q{unique}", settings=settings) as agent:
            store = BlackboardStore(agent, board=unique)
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            for i in range(n):  # both processes write at once: their own keys, and one key in common
                await store.aput(("shared", "ns"), f"{agent.id}-{i}", {"i": i, "by": agent.id})
                await store.aput(("shared", "ns"), "common", {"i": i, "by": agent.id})
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, err.decode()
            assert json.loads(out.decode().strip().splitlines()[-1]) >= n + 1
            items = await store.asearch(("shared",), limit=1000)
            assert {i.key for i in items} == {f"{w}{unique}-{i}" for w in "pq" for i in range(n)} | {"common"}
            assert all(i.value["i"] == int(i.key.rsplit("-", 1)[1]) for i in items if i.key != "common")
            common = await store.aget(("shared", "ns"), "common")
            assert common is not None and common.value["i"] == n - 1
            history = await agent.board(unique).history("shared", '["ns","common"]')
            assert len(history) == min(2 * n, settings.board.history)  # every put of both is a revision
            assert len({e.metadata["langgraph"]["created_at"] for e in history}) == 1  # created once
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_bridge_to_a_closed_loop_is_refused() -> None:
    bridge = LoopBridge.start()
    bridge.close()

    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="not running"):
        bridge.run(nothing(), method="get")
