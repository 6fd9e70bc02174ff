"""The memory actions through the MCP server's client, over stdio and HTTP: the same tools as
``agent.memory.tools()`` (names, argument schemas, descriptions), the same results
(``ActionResult`` as structured content, its content as text), invalid arguments as tool
errors naming the field, and a prune refused for lack of rights end to end."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import ClientSession
from mcp.types import CallToolResult, TextContent

from agents_sdk import Agent
from agents_sdk.memory.actions import ACTION_NAMES, action_description, action_schema
from blackboard.apps.mcp.actions import ActionOut
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker
from tests.apps.mcp.conftest import McpConnect

pytestmark = pytest.mark.asyncio


async def act(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a memory action expecting ok; its structured result (an ActionResult)."""
    result = await session.call_tool(tool, arguments)
    out = dict(result.structured_content or {})
    assert not result.is_error and out.get("ok") is True, f"{tool}{arguments}: {result.content}"
    (content,) = result.content
    assert isinstance(content, TextContent) and content.text == out["content"]
    ActionOut.model_validate(out)
    return out


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """Call a memory action expecting a refusal; its error text."""
    result: CallToolResult = await session.call_tool(tool, arguments)
    out = dict(result.structured_content or {})
    assert result.is_error, f"{tool}{arguments} did not fail: {out}"
    assert out["ok"] is False and out["name"] == tool and out["data"] is None
    (content,) = result.content
    assert isinstance(content, TextContent) and content.text == f"error: {out['error']}"
    assert "Traceback" not in content.text
    return str(out["error"])


async def test_the_memory_actions_are_the_sdks_tools(mcp_session: ClientSession) -> None:
    tools = {t.name: t for t in (await mcp_session.list_tools()).tools}
    assert set(ACTION_NAMES) <= set(tools)
    for name in ACTION_NAMES:
        tool = tools[name]
        assert tool.input_schema == action_schema(name), name
        assert tool.description == action_description(name)
        assert tool.output_schema is not None and set(tool.output_schema["properties"]) == set(ActionOut.model_fields)
        assert tool.annotations is not None
    assert tools["memory_search"].annotations.read_only_hint  # type: ignore[union-attr]
    assert tools["memory_prune"].annotations.destructive_hint  # type: ignore[union-attr]


async def test_memory_actions_valid_and_invalid(mcp_session: ClientSession, mcp_agent_id: str) -> None:
    goal = await act(mcp_session, "memory_write", text="collect every product's price", layer="working",
                     key="goal")
    assert goal["data"] == {"id": "wm:goal", "layer": "working", "key": "goal"}
    step = await act(mcp_session, "memory_write", text="the price is in span.cost", confidence=0.3)
    step_id = step["data"]["id"]
    await act(mcp_session, "memory_write", text="opened the catalogue", confidence=0.9)

    read = await act(mcp_session, "memory_read", id="goal")
    assert read["data"]["hit"]["text"] == "goal: collect every product's price"
    assert read["data"]["hit"]["provenance"]["agent"] == mcp_agent_id
    found = await act(mcp_session, "memory_search", query="price span cost", layers=["working", "short_term"])
    assert found["data"]["hits"][0]["id"] == step_id
    assert found["content"].startswith("2 hit(s), best first:\n1. [short_term ")
    summary = await act(mcp_session, "memory_summarize", layer="short_term", keep_keys=["goal"])
    assert summary["data"]["source_ids"] and "collect every product's price" in summary["data"]["text"]
    would = await act(mcp_session, "memory_prune", layer="short_term", threshold=0.5, dry_run=True)
    assert would["data"]["ids"] == [step_id] and would["content"].startswith("would prune 1 from short_term")

    assert "text: Field required" in await refused(mcp_session, "memory_write", layer="working")
    assert "layer: Input should be" in await refused(mcp_session, "memory_write", text="x", layer="attic")
    assert "colour: Extra inputs are not permitted" in await refused(mcp_session, "memory_read", id="goal",
                                                                     colour="red")
    assert "min_relevance: Input should be less than or equal to 1" in await refused(
        mcp_session, "memory_search", query="x", min_relevance=3)
    assert "strategy: Input should be" in await refused(mcp_session, "memory_summarize", strategy="magic")
    assert "scope: Input should be 'own' or 'all'" in await refused(mcp_session, "memory_prune", scope="any")
    assert (await refused(mcp_session, "memory_read", id="wm:nothing")).startswith("NotFoundError:")
    again = await act(mcp_session, "memory_read", id=step_id)  # the dry run and the refusals changed nothing
    assert again["data"]["hit"]["text"] == "the price is in span.cost"


async def test_a_prune_of_everyones_memories_is_refused_without_admin(
        mcp_connect: McpConnect, pg_settings: Settings, settings: Settings, start_worker: StartWorker,
        unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, f"h-{unique}"),
                       query_provider=HashProvider(32, f"h-{unique}"))
    async with Agent.connect(f"owner-{unique}", settings=pg_settings) as owner:
        weak = await owner.remember(f"{unique} the price might be in div.amount", board=unique, confidence=0.1,
                                    wait="searchable", timeout=60)
        async with mcp_connect(f"agent-{unique}") as session:
            error = await refused(session, "memory_prune", board=unique, strategy="low_confidence",
                                  threshold=0.5, scope="all")
            assert error.startswith("PermissionDeniedError:") and unique in error and "admin" in error
            error = await refused(session, "memory_summarize", layer="long_term", board=unique, ids=[weak],
                                  replace=True)
            assert error.startswith("PermissionDeniedError:")
            mine = await act(session, "memory_prune", board=unique, strategy="low_confidence", threshold=0.5)
            assert mine["data"]["ids"] == [] and mine["data"]["board"] == unique
        hits = await owner.recall(f"{unique} price div amount", board=unique, mode="keyword")
        assert [h.id for h in hits] == [weak]  # nothing archived
        async with mcp_connect(f"admin-{unique}") as session:
            everyone = await act(session, "memory_prune", board=unique, strategy="low_confidence",
                                 threshold=0.5, scope="all")
            assert everyone["data"]["ids"] == [weak]
        assert await owner.recall(f"{unique} price div amount", board=unique, mode="keyword") == []
