"""The memory actions on a real agent's memory (``agent.memory.tools()`` / ``agent.memory.call``):
each tool with valid and invalid arguments on the local layers, the long-term layer through a
worker, and actions refused for lack of rights (prune scope "all", archiving another agent's
memory by summarize(replace=True)) end to end: a clear error, nothing written or archived."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory.actions import ACTION_NAMES, ActionResult, call_action, memory_tools
from blackboard.settings import AgentMemorySettings, Settings
from tests._worker_helpers import HashProvider, StartWorker
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio


async def _ok(agent: Agent, name: str, **arguments: Any) -> ActionResult:
    result = await agent.memory.call({"name": name, "arguments": arguments})
    assert isinstance(result, ActionResult)
    assert result.ok, result.error
    assert result.name == name and result.error is None and result.data is not None
    return result


async def _refused(agent: Agent, name: str, arguments: dict[str, Any] | str) -> str:
    result = await agent.memory.call({"type": "function", "id": "c",
                                      "function": {"name": name, "arguments": arguments}})
    assert not result.ok and result.data is None and result.error is not None, result
    assert result.content == f"error: {result.error}" and "Traceback" not in result.content
    return str(result.error)


def _ids(result: ActionResult) -> list[str]:
    assert result.data is not None
    return [h["id"] for h in result.data["hits"]]


async def test_each_action_on_the_local_layers(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"actor-{unique}", settings=settings) as agent:
        assert agent.memory.tools() == memory_tools()
        goal = await _ok(agent, "memory_write", text="collect the price of every product", layer="working",
                         key="goal")
        assert goal.data == {"id": "wm:goal", "layer": "working", "key": "goal"}
        assert goal.content == "stored in working: id=wm:goal key=goal"
        low = await _ok(agent, "memory_write", text="the price may be in div.amount", confidence=0.2,
                        tags=["selector"])
        high = await _ok(agent, "memory_write", text="the price is in span.cost on product pages",
                         confidence=0.9, tags=["selector"], metadata={"page": "/p/1"})
        await _ok(agent, "memory_write", text="opened the catalogue page")
        low_id, high_id = (r.data["id"] for r in (low, high))  # type: ignore[index]
        assert low_id.startswith("st:default:") and high_id.startswith("st:default:")

        read = await _ok(agent, "memory_read", id="goal")
        assert read.data is not None and read.data["hit"]["id"] == "wm:goal"
        assert "[working 1.00] id=wm:goal" in read.content and "collect the price" in read.content
        read = await _ok(agent, "memory_read", id=high_id)
        assert read.data is not None and read.data["hit"]["metadata"] == {"page": "/p/1"}

        found = await _ok(agent, "memory_search", query="price span cost", layers=["short_term", "working"])
        assert _ids(found)[0] == high_id and set(_ids(found)) >= {high_id, low_id, "wm:goal"}
        assert found.content.startswith(f"{len(_ids(found))} hit(s), best first:\n1. [short_term ")
        assert f"id={high_id}" in found.content.splitlines()[1]
        tagged = await _ok(agent, "memory_search", query="price", layers=["short_term"],
                           filters={"tags_any": ["selector"]})
        assert set(_ids(tagged)) == {high_id, low_id}
        future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        none = await _ok(agent, "memory_search", query="price", layers=["short_term"], since=future)
        assert none.data == {"hits": []} and none.content == "no memories found for 'price'"

        summary = await _ok(agent, "memory_summarize", layer="short_term", keep_keys=["goal"], target_tokens=64)
        assert summary.data is not None and summary.data["strategy"] == "extractive"
        assert summary.content.startswith("summary of 3 item(s) of short_term (extractive, ")
        assert "collect the price of every product" in summary.data["text"]  # the kept key, verbatim

        would = await _ok(agent, "memory_prune", layer="short_term", strategy="low_confidence", threshold=0.5,
                          dry_run=True)
        assert would.data is not None and would.data["ids"] == [low_id] and would.data["dry_run"] is True
        assert would.content == f"would prune 1 from short_term (low_confidence, scope own): {low_id}"
        await _ok(agent, "memory_read", id=low_id)  # still there
        pruned = await _ok(agent, "memory_prune", layer="short_term", strategy="low_confidence", threshold=0.5)
        assert pruned.data is not None and pruned.data["ids"] == [low_id]
        assert (await _refused(agent, "memory_read", {"id": low_id})).startswith("NotFoundError:")

        # invalid arguments of each tool: refused, with the field named, nothing done
        before = _ids(await _ok(agent, "memory_search", query="price", layers=["short_term", "working"]))
        assert "layer: Input should be" in await _refused(agent, "memory_write", {"text": "x", "layer": "attic"})
        assert "text: Field required" in await _refused(agent, "memory_write", '{"layer": "working"}')
        assert "id: Field required" in await _refused(agent, "memory_read", {})
        assert "top_k: Input should be less than or equal to 100" in await _refused(
            agent, "memory_search", {"query": "x", "top_k": 500})
        assert "strategy: Input should be" in await _refused(agent, "memory_summarize", {"strategy": "magic"})
        assert "dry: Extra inputs are not permitted" in await _refused(agent, "memory_prune", {"dry": True})
        assert "not valid JSON" in await _refused(agent, "memory_prune", "{scope: own}")
        # refused by the facade itself: also a result, not an exception
        error = await _refused(agent, "memory_write", {"text": "x", "ttl": 5})
        assert error.startswith("InvalidPayloadError: ttl applies to the working layer only")
        error = await _refused(agent, "memory_summarize", {"layer": "working", "query": "nothing matches this"})
        assert error.startswith("InvalidPayloadError: nothing to summarize")
        assert _ids(await _ok(agent, "memory_search", query="price", layers=["short_term", "working"])) == before
        assert set(ACTION_NAMES) == {t["function"]["name"] for t in agent.memory.tools()}


async def test_long_term_actions_and_refusals_for_lack_of_rights(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, f"h-{unique}"),
                       query_provider=HashProvider(32, f"h-{unique}"))
    own = pg_settings.model_copy(update={"agent_memory": AgentMemorySettings(long_term_board=unique)})
    async with (Agent.connect(f"owner-{unique}", settings=own) as owner,
                Agent.connect(f"other-{unique}", settings=own) as other,
                Agent.connect(f"admin-{unique}", settings=own) as admin):
        weak = await _ok(owner, "memory_write", text=f"{unique} the price might be in div.amount",
                         layer="long_term", kind="semantic", key="selector:price", confidence=0.1)
        strong = await _ok(owner, "memory_write", text=f"{unique} the stock level is in span.stock",
                           layer="long_term", kind="semantic", key="selector:stock", confidence=0.9)
        mine = await _ok(other, "memory_write", text=f"{unique} reviews live under div.reviews",
                         layer="long_term", confidence=0.2)
        weak_id, strong_id, other_id = (str(r.data["id"]) for r in (weak, strong, mine))  # type: ignore[index]
        await owner.wait_searchable([weak_id, strong_id, other_id], board=unique, timeout=60)

        found = await _ok(owner, "memory_search", query=f"{unique} price selector div amount",
                          layers=["long_term"], mode="keyword")
        assert _ids(found)[0] == weak_id
        assert found.data is not None and found.data["hits"][0]["layer"] == "long_term"
        assert found.data["hits"][0]["provenance"]["key"] == "selector:price"
        read = await _ok(owner, "memory_read", id=strong_id)
        assert read.data is not None and read.data["hit"]["text"].endswith("span.stock")

        would = await _ok(owner, "memory_prune", strategy="low_confidence", threshold=0.5, dry_run=True)
        assert would.data is not None and would.data["ids"] == [weak_id] and would.data["board"] == unique
        records = len(await stored_memories(pg_settings.nats.url, unique))

        # another agent without admin: prune scope "all" is refused, nothing archived
        error = await _refused(other, "memory_prune", {"strategy": "low_confidence", "threshold": 0.5,
                                                       "scope": "all"})
        assert error.startswith("PermissionDeniedError:") and unique in error and "admin" in error
        # ... and so is replacing the owner's memory by a summary (archiving another's memory)
        error = await _refused(other, "memory_summarize", {"layer": "long_term", "ids": [weak_id],
                                                           "replace": True, "board": unique})
        assert error.startswith("PermissionDeniedError:") and "admin" in error
        assert len(await stored_memories(pg_settings.nats.url, unique)) == records  # no summary written
        live = {h.id for h in await owner.recall(f"{unique} price stock reviews", board=unique, mode="keyword",
                                                 top_k=20)}
        assert {weak_id, strong_id, other_id} <= live  # nothing archived

        # its own memories: allowed
        own_prune = await _ok(other, "memory_prune", strategy="low_confidence", threshold=0.5)
        assert own_prune.data is not None and own_prune.data["ids"] == [other_id]
        # an admin of the board may prune everyone's
        everyone = await _ok(admin, "memory_prune", strategy="low_confidence", threshold=0.5, scope="all")
        assert everyone.data is not None and everyone.data["ids"] == [weak_id]
        live = {h.id for h in await owner.recall(f"{unique} price stock reviews", board=unique, mode="keyword",
                                                 top_k=20)}
        assert live == {strong_id}


async def test_call_action_is_what_agent_memory_call_runs(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"direct-{unique}", settings=settings) as agent:
        direct = await call_action(agent.memory, {"name": "memory_write",
                                                  "arguments": {"text": "a", "layer": "working", "key": "k"}})
        via = await agent.memory.call({"function": {"name": "memory_read", "arguments": '{"id": "k"}'}})
        assert direct.ok and via.ok and via.data is not None and via.data["hit"]["text"] == "k: a"
