"""agent.memory: the facade over the four layers (write, read, search, summarize, prune),
the former agent.memory(id), and its lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agents_sdk import Agent, AgentMemory, LayerHit
from agents_sdk.memory import PruneResult, RuleRouter
from agents_sdk.memory.layers import Layer
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError, PermissionDeniedError
from blackboard.settings import Settings
from tests._lost_cancel import LostCancel, closes_for_good
from tests._worker_helpers import HashProvider, StartWorker

pytestmark = pytest.mark.asyncio


def with_memory(settings: Settings, **fields: Any) -> Settings:
    """``settings`` with ``agent_memory`` fields replaced."""
    return settings.model_copy(update={"agent_memory": settings.agent_memory.model_copy(update=fields)})


async def test_agent_memory_is_one_facade_per_agent_and_closes_with_it(settings: Settings, unique: str) -> None:
    agent = await Agent.connect(f"{unique}-a", settings=settings)
    memory = agent.memory
    assert isinstance(memory, AgentMemory) and agent.memory is memory
    assert memory.settings == settings.agent_memory and memory.longterm is agent.longterm
    assert (memory.episode.task_id, memory.episode.episode_id) == ("default", "default")
    await memory.write("a note", layer="working", key="k")
    await agent.close()
    with pytest.raises(InvalidPayloadError, match="closed"):
        await memory.write("after close")


async def test_write_and_read_the_local_layers(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        memory = agent.memory
        st = await memory.write("opened the product page", tags=["nav"], key="page", metadata={"url": "/p/1"},
                                confidence=0.8)
        assert st == f"st:default:{memory.short_term.latest().id}"
        hit = await memory.read(st)
        assert isinstance(hit, LayerHit)
        assert (hit.layer, hit.text, hit.kind, hit.source, hit.score) == ("short_term", "opened the product page",
                                                                         "note", "short_term", 1.0)
        assert hit.metadata == {"url": "/p/1"} and hit.provenance["episode"] == "default"
        assert (await memory.read("page", layer="short_term")).id == st  # by its key
        wm = await memory.write("price is in span.price", layer="working", key="selector", ttl=60)
        assert wm == "wm:selector"
        assert memory.working.get("selector") == "price is in span.price"
        assert (await memory.read("selector")).id == wm  # a working key, no layer needed
        assert (await memory.read("wm:selector")).text == "selector: price is in span.price"
        fresh = await memory.write("no key", layer="working")
        assert fresh == "wm:note-1"
        with pytest.raises(NotFoundError):
            await memory.read("st:default:999")
        with pytest.raises(NotFoundError):
            await memory.read("wm:nothing")
        with pytest.raises(InvalidPayloadError, match="ttl"):
            await memory.write("x", ttl=5)
        with pytest.raises(InvalidPayloadError, match="unknown memory layer"):
            await memory.write("x", layer="attic")  # type: ignore[arg-type]
        with pytest.raises(InvalidPayloadError, match="non-empty"):
            await memory.write("  ")
        with pytest.raises(InvalidPayloadError, match="needs a board"):
            await memory.write("x", layer="shared")


async def test_a_layer_turned_off_is_refused(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=with_memory(settings, layers=["short_term"])) as agent:
        with pytest.raises(InvalidPayloadError, match="working layer is off"):
            await agent.memory.write("x", layer="working")
        with pytest.raises(InvalidPayloadError, match="off"):
            await agent.memory.search("x", layers=["long_term"])
        await agent.memory.write("the only layer")
        assert [h.layer for h in await agent.memory.search("layer")] == ["short_term"]


async def test_search_ranks_the_local_layers_by_the_share_of_query_words(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        memory = agent.memory
        await memory.write("the price selector is span.price", tags=["selector"])
        await memory.write("the login form needs a token")
        await memory.write("price selector", layer="working", key="focus")
        await memory.write("unrelated words")
        hits = await memory.search("price selector span", layers=["short_term", "working"])
        assert [(h.layer, round(h.score, 2)) for h in hits] == [("short_term", 1.0), ("working", 0.67)]
        assert hits[0].text == "the price selector is span.price"
        # min_relevance and top_k
        assert [h.layer for h in await memory.search("price selector span", layers=["short_term", "working"],
                                                     min_relevance=0.9)] == ["short_term"]
        assert len(await memory.search("price selector span", layers=["short_term", "working"], top_k=1)) == 1
        # filters: tags, time range; a board leaves local items out
        assert [h.text for h in await memory.search("price", layers=["short_term"],
                                                    filters={"tags_any": ["selector"]})] == [
            "the price selector is span.price"]
        later = datetime.now(UTC) + timedelta(hours=1)
        assert await memory.search("price", layers=["short_term"], time_range=(later, None)) == []
        assert await memory.search("price", layers=["short_term"], filters={"board": "x"}) == []
        # the router chose the local layers for a question about now
        routed = await memory.search("current price selector")
        assert {h.layer for h in routed} == {"short_term", "working"}
        with pytest.raises(InvalidPayloadError, match="top_k"):
            await memory.search("x", top_k=0)
        with pytest.raises(InvalidPayloadError, match="unknown search filter 'colour'"):
            await memory.search("x", filters={"colour": "red"})
        with pytest.raises(InvalidPayloadError, match="unknown search filter 'top_k'"):
            await memory.search("x", filters={"top_k": 3})
        with pytest.raises(InvalidPayloadError, match="timezone-aware"):
            await memory.search("x", time_range=(datetime(2026, 1, 1), None))


async def test_a_pluggable_router(settings: Settings, unique: str) -> None:
    class Only:
        def __init__(self, layer: Layer) -> None:
            self.layer = layer
            self.asked: list[str] = []

        async def route(self, query: str, *, available: Any, filters: Any = None) -> list[Layer]:
            self.asked.append(query)
            return [self.layer]

    local = with_memory(settings, layers=["short_term", "working"])  # no search service here
    async with Agent.connect(f"{unique}-a", settings=local) as agent:
        await agent.memory.write("alpha in short term")
        await agent.memory.write("alpha in working", layer="working")
        only = Only("working")
        agent.memory.router = only
        assert [h.layer for h in await agent.memory.search("alpha")] == ["working"]
        assert only.asked == ["alpha"]
        agent.memory.router = RuleRouter()
        assert {h.layer for h in await agent.memory.search("alpha")} == {"short_term", "working"}
        # a router's answer is only a wish: a layer that is off or unknown is not searched
        agent.memory.router = Only("long_term")
        assert {h.layer for h in await agent.memory.search("alpha")} == {"short_term", "working"}


async def test_summarize_a_local_layer_keeps_keys_and_replaces_the_items(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        memory = agent.memory
        await memory.write("SKU-9 costs 12.50 euros on the listing page.", key="price")
        await memory.write("The price sits in span.price. The listing page is paginated.")
        await memory.write("The listing page has 40 products. The price sits in span.price.")
        result = await memory.summarize(target_tokens=40, keep_keys=["price", "missing"])
        assert result.layer == "short_term" and result.strategy == "extractive"
        assert result.text.startswith("price: SKU-9 costs 12.50 euros on the listing page.\n")
        assert result.kept == {"price": "SKU-9 costs 12.50 euros on the listing page."}
        assert len(result.source_ids) == 3 and result.written_id is None and len(memory.short_term) == 3
        assert result.tokens == memory.counter(result.text) <= 40
        replaced = await memory.summarize(query="price span", replace=True)
        assert len(replaced.replaced) == 2 and replaced.written_id is not None
        left = [h.kind for h in await memory.search("", layers=["short_term"])]
        assert sorted(left) == ["note", "summary"]
        assert (await memory.read(replaced.written_id)).text == replaced.text
        with pytest.raises(InvalidPayloadError, match="nothing to summarize"):
            await memory.summarize(layer="working")
        await memory.write("goal: ship", layer="working", key="goal")
        note = await memory.summarize(layer="working", replace=True)
        assert note.written_id == "wm:summary" and "goal" not in memory.working
        assert memory.metrics().pruned == {"short_term": 2, "working": 1}


async def test_prune_the_local_layers(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        memory = agent.memory
        sure = await memory.write("sure", confidence=0.9)
        unsure = await memory.write("unsure", confidence=0.1)
        await memory.write("unrated")
        dry = await memory.prune(layer="short_term", strategy="low_confidence", threshold=0.5, dry_run=True)
        assert isinstance(dry, PruneResult) and dry.ids == (unsure,) and dry.count == 1 and dry.board is None
        assert len(memory.short_term) == 3
        done = await memory.prune(layer="short_term", strategy="low_confidence", threshold=0.5)
        assert done.ids == (unsure,) and len(memory.short_term) == 2
        kept = await memory.prune(layer="short_term", strategy="max_per_board", threshold=1)
        assert kept.ids == (sure,) and [h.text for h in await memory.search("", layers=["short_term"])] == ["unrated"]
        assert (await memory.prune(layer="short_term", strategy="old_age", threshold=3600)).ids == ()
        assert (await memory.prune(layer="short_term", strategy="old_age", threshold=0)).count == 1
        for i in range(3):
            await memory.write(f"note {i}", layer="working")
        assert (await memory.prune(layer="working", strategy="max_per_board", threshold=1, limit=1)).ids == (
            "wm:note-1",)
        assert len(memory.working) == 2
        assert memory.metrics().pruned == {"short_term": 3, "working": 1}
        with pytest.raises(InvalidPayloadError, match="strategy"):
            await memory.prune(layer="short_term", strategy="random")  # type: ignore[arg-type]


async def test_long_term_and_shared_layers_through_the_search_service(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, model),
                       query_provider=HashProvider(32, model))
    mine_board, team_board = f"{unique}-mine", f"{unique}-team"
    settings = with_memory(pg_settings, long_term_board=mine_board, shared_boards=[team_board])
    async with Agent.connect(f"{unique}-a", settings=settings) as agent, \
            Agent.connect(f"{unique}-b", settings=settings) as other:
        memory = agent.memory
        own = await memory.write(f"the {unique} kestrel nests on the tower", layer="long_term", confidence=0.9,
                                 key=f"bird:{unique}")
        theirs = await other.remember(f"the {unique} kestrel hunts over the meadow", board=team_board,
                                      wait="searchable")
        await other.remember(f"the {unique} kestrel is someone else's on my board", board=mine_board,
                             wait="searchable")
        await agent.wait_searchable([own], board=mine_board)
        hits = await memory.search(f"{unique} kestrel", layers=["long_term", "shared"])
        by_id = {h.id: h for h in hits}
        assert by_id[own].layer == "long_term" and by_id[theirs].layer == "shared"
        assert all(h.provenance["agent"] == agent.id for h in hits if h.layer == "long_term")  # own only
        assert by_id[own].source == mine_board and by_id[own].provenance["key"] == f"bird:{unique}"
        assert all(0.0 <= h.score <= 1.0 for h in hits) and hits == sorted(hits, key=lambda h: -h.score)
        # the former method: one memory by id
        detail = await agent.memory(own, board=mine_board)
        assert detail.memory.id == own and detail.memory.confidence == 0.9
        read = await memory.read(own)
        assert (read.layer, read.id, read.score) == ("long_term", own, 1.0)
        assert (await memory.read(theirs, layer="shared")).layer == "shared"
        with pytest.raises(NotFoundError):
            await memory.read(f"{unique}-nothing")
        # the same search again comes from the cache; a write clears it
        metrics = memory.metrics()
        again = await memory.search(f"{unique} kestrel", layers=["long_term", "shared"])
        assert again == hits
        after = memory.metrics()
        assert after.cache_hits == metrics.cache_hits + 2 and after.cache_misses == metrics.cache_misses
        await memory.write(f"the {unique} kestrel left", layer="shared")
        await memory.search(f"{unique} kestrel", layers=["long_term", "shared"])
        assert memory.metrics().cache_misses == after.cache_misses + 2
        assert memory.metrics().latency_by_layer["long_term"].count >= 3


async def _archived(agent: Agent, board: str, *ids: str) -> dict[str, bool]:
    return {i: (await agent.memory(i, board=board)).memory.archived_at is not None for i in ids}


async def test_long_term_prune_and_summary_go_through_the_service_with_the_agents_rights(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    board = unique
    settings = with_memory(pg_settings, long_term_board=board, shared_boards=[board])
    async with Agent.connect(f"{unique}-alice", settings=settings) as alice, \
            Agent.connect(f"{unique}-bob", settings=settings) as bob, \
            Agent.connect(f"admin-{unique}", settings=settings) as admin:
        a_low = await alice.remember("the selector guess div.cost", board=board, confidence=0.1, wait="searchable")
        a_high = await alice.remember("the selector span.price holds the price", board=board, confidence=0.9,
                                      wait="searchable")
        b_low = await bob.remember("the selector maybe p.amount", board=board, confidence=0.2, wait="searchable")
        everyone = (a_low, a_high, b_low)
        dry = await alice.memory.prune(threshold=0.5, dry_run=True)
        assert (dry.layer, dry.board, dry.ids, dry.dry_run) == ("long_term", board, (a_low,), True)
        assert await _archived(alice, board, *everyone) == dict.fromkeys(everyone, False)
        # every author's needs admin on the board: refused, nothing archived
        with pytest.raises(PermissionDeniedError) as caught:
            await alice.memory.prune(layer="shared", threshold=0.5, scope="all")
        assert board in str(caught.value) and "admin" in str(caught.value)
        assert await _archived(alice, board, *everyone) == dict.fromkeys(everyone, False)
        done = await alice.memory.prune(threshold=0.5)
        assert done.ids == (a_low,) and alice.memory.metrics().pruned == {"long_term": 1}
        adm = await admin.memory.prune(layer="shared", board=board, threshold=0.5, scope="all")
        assert adm.ids == (b_low,)
        assert await _archived(alice, board, *everyone) == {a_low: True, a_high: False, b_low: True}
        await admin.search.restore(board, [a_low, b_low])

        # a summary replacing another agent's memory: refused before anything is written
        before = {h.id for h in await alice.recall("selector", board=board, mode="keyword", top_k=50)}
        with pytest.raises(PermissionDeniedError):
            await alice.memory.summarize(layer="long_term", ids=[a_high, b_low], replace=True)
        assert {h.id for h in await alice.recall("selector", board=board, mode="keyword", top_k=50)} == before
        # its own: the summary is remembered, the sources archived
        made = await alice.memory.summarize(layer="long_term", ids=[a_low, a_high], replace=True)
        assert made.written_id is not None and set(made.replaced) == {a_low, a_high}
        assert "span.price" in made.text
        assert await _archived(alice, board, a_low, a_high, b_low) == {a_low: True, a_high: True, b_low: False}
        await alice.wait_searchable([made.written_id], board=board)
        summary = (await alice.memory(made.written_id, board=board)).memory
        assert (summary.kind, summary.agent, summary.metadata["summarizes"]) == ("summary", alice.id,
                                                                                 [a_low, a_high])
        # without replace: only the text, nothing written or archived
        text_only = await alice.memory.summarize(layer="shared", query="selector", board=board)
        assert text_only.written_id is None and text_only.replaced == ()


async def test_the_automatic_prune_runs_in_the_background_and_stops_with_the_agent(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    settings = with_memory(pg_settings, long_term_board=unique, auto_prune_interval=0.2,
                           auto_prune_strategy="low_confidence", auto_prune_threshold=0.5)
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        low = await agent.memory.write("a shaky guess", layer="long_term", confidence=0.1)
        high = await agent.memory.write("a solid fact", layer="long_term", confidence=0.9)
        task = agent.memory._prune_task
        assert task is not None and not task.done()  # started by the first write
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            with contextlib.suppress(NotFoundError):  # not stored by the worker yet
                if (await _archived(agent, unique, low))[low]:
                    break
            assert asyncio.get_running_loop().time() < deadline, "the automatic prune never ran"
            await asyncio.sleep(0.1)
        assert await _archived(agent, unique, high) == {high: False}
        assert agent.memory.metrics().pruned.get("long_term", 0) >= 1
    assert task.done()


async def test_the_shared_layer_reads_the_boards_the_agent_joined(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    team = f"{unique}-team"
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent, \
            Agent.connect(f"{unique}-b", settings=pg_settings) as other:
        theirs = await other.remember(f"the {unique} heron fishes at dawn", board=team, wait="searchable")
        assert await agent.memory.search(f"{unique} heron", layers=["shared"]) == []  # nothing joined yet
        await agent.join(team)
        fresh = AgentMemory(agent, agent.settings.agent_memory)  # the first one cached the boards joined
        hits = await fresh.search(f"{unique} heron", layers=["shared"], mode="keyword")
        assert [(h.id, h.layer, h.source) for h in hits] == [(theirs, "shared", team)]
        await fresh.close()


async def test_close_while_an_automatic_prune_loses_its_cancel_returns(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune's requests may swallow close()'s cancel (Python 3.11's ``asyncio.wait_for``
    returns a ready answer instead of raising it): the loop must still end, and close() return."""
    prune = LostCancel()  # the server "answers" while close() cancels
    async with Agent.connect(f"{unique}-a", settings=with_memory(settings, auto_prune_interval=0.05)) as agent:
        memory = agent.memory
        monkeypatch.setattr(memory, "prune", prune)
        await memory.write("a note", layer="working", key="k")  # starts the automatic prune
        await asyncio.wait_for(prune.entered.wait(), 5)
        await closes_for_good(memory.close(), prune)  # and no prune after it
