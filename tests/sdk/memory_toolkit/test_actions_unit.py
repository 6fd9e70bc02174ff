"""The memory actions' pure parts: the tool definitions a model reads, the parsing of a tool
call in each form, and the refusals that never reach the memory (no server)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from agents_sdk.memory.actions import (
    ACTION_NAMES,
    TEXT_CHARS,
    ActionResult,
    MemoryPruneArgs,
    MemorySearchArgs,
    MemoryWriteArgs,
    action_model,
    action_schema,
    call_action,
    memory_tools,
    parse_tool_call,
)
from agents_sdk.memory.layers import LAYERS, PRUNE_STRATEGIES, LayerHit


def _walk(schema: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        out.append(schema)
        for v in schema.values():
            out.extend(_walk(v))
    elif isinstance(schema, list):
        for v in schema:
            out.extend(_walk(v))
    return out


def test_memory_tools_are_openai_function_definitions() -> None:
    tools = memory_tools()
    names = [t["function"]["name"] for t in tools]
    assert names == list(ACTION_NAMES) == ["memory_write", "memory_read", "memory_search", "memory_summarize",
                                           "memory_prune"]
    for tool in tools:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert len(fn["description"]) > 40 and "Example" in fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        for prop, spec in params["properties"].items():
            assert spec.get("description"), f"{fn['name']}.{prop} has no description"
        assert not any("title" in node and isinstance(node["title"], str) for node in _walk(params))
        json.dumps(tool)  # plain JSON
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert by_name["memory_write"]["required"] == ["text"]
    assert by_name["memory_read"]["required"] == ["id"]
    assert by_name["memory_search"]["required"] == ["query"]
    assert "required" not in by_name["memory_prune"]
    assert by_name["memory_write"]["properties"]["layer"]["enum"] == list(LAYERS)
    assert by_name["memory_prune"]["properties"]["strategy"]["enum"] == list(PRUNE_STRATEGIES)
    assert by_name["memory_prune"]["properties"]["scope"]["enum"] == ["own", "all"]


def test_schemas_are_the_argument_models() -> None:
    for name in ACTION_NAMES:
        model = action_model(name)
        assert set(action_schema(name)["properties"]) == set(model.model_fields)
    with pytest.raises(KeyError):
        action_model("memory_forget")


@pytest.mark.parametrize("bad", [
    {"text": ""}, {"text": "x", "layer": "everything"}, {"text": "x", "confidence": 1.5},
    {"text": "x", "importance": -0.1}, {"text": "x", "ttl": 0}, {"text": "x", "kind": "gossip"},
    {"text": "x", "unknown": 1}, {"text": "x", "tags": [""]}, {"layer": "working"},
])
def test_write_arguments_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        MemoryWriteArgs.model_validate(bad)


def test_search_and_prune_arguments_are_validated() -> None:
    ok = MemorySearchArgs.model_validate({"query": "q", "layers": ["working", "long_term"],
                                          "since": "2026-01-01T00:00:00Z", "min_relevance": 0.2})
    assert ok.layers == ["working", "long_term"] and ok.since is not None and ok.since.tzinfo is not None
    for bad in ({"query": "q", "layers": []}, {"query": "q", "min_relevance": 2},
                {"query": "q", "since": "2026-01-01T00:00:00"},  # no offset
                {"query": "q", "since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                {"query": "q", "top_k": 0}, {"query": "q", "mode": "fuzzy"}):
        with pytest.raises(ValidationError):
            MemorySearchArgs.model_validate(bad)
    assert MemoryPruneArgs().scope == "own" and MemoryPruneArgs().layer == "long_term"
    with pytest.raises(ValidationError):
        MemoryPruneArgs.model_validate({"scope": "everyone"})


def test_parse_tool_call_takes_each_form() -> None:
    args = '{"query": "selectors"}'
    openai_dict = {"id": "call_1", "type": "function", "function": {"name": "memory_search", "arguments": args}}
    sdk_object = SimpleNamespace(id="call_1", type="function",
                                 function=SimpleNamespace(name="memory_search", arguments=args))
    plain = {"name": "memory_search", "arguments": {"query": "selectors"}}
    assert parse_tool_call(openai_dict) == ("memory_search", args)
    assert parse_tool_call(sdk_object) == ("memory_search", args)
    assert parse_tool_call(plain) == ("memory_search", {"query": "selectors"})
    for bad in ({}, {"function": {"arguments": "{}"}}, SimpleNamespace(), {"name": ""}):
        with pytest.raises(ValueError):
            parse_tool_call(bad)


@pytest.mark.asyncio
@pytest.mark.parametrize(("call", "error"), [
    ({"name": "memory_forget", "arguments": {}}, "UnknownTool: no memory tool 'memory_forget'"),
    ({"arguments": {}}, "InvalidToolCall"),
    ({"name": "memory_search", "arguments": "{not json"}, "InvalidArguments: the arguments are not valid JSON"),
    ({"name": "memory_search", "arguments": "[1, 2]"}, "InvalidArguments: the arguments must be a JSON object"),
    ({"name": "memory_search", "arguments": {}}, "InvalidArguments: query: Field required"),
    ({"name": "memory_write", "arguments": {"text": "x", "colour": "red"}},
     "InvalidArguments: colour: Extra inputs are not permitted"),
    ({"name": "memory_prune", "arguments": {"scope": "everyone"}}, "InvalidArguments: scope: Input should be"),
])
async def test_refused_calls_never_reach_the_memory(call: dict[str, Any], error: str) -> None:
    # The memory is never touched: an object without any method would fail loudly if it were.
    result = await call_action(cast(Any, object()), call)
    assert isinstance(result, ActionResult)
    assert not result.ok and result.data is None
    assert result.error is not None and result.error.startswith(error), result.error
    assert result.content == f"error: {result.error}"
    assert result.name == call.get("name", "?")
    assert result.as_dict() == {"ok": False, "name": result.name, "content": result.content, "data": None,
                                "error": result.error}


@pytest.mark.asyncio
async def test_unknown_tool_lists_the_tools() -> None:
    result = await call_action(cast(Any, object()), {"function": {"name": "memory_forget", "arguments": "{}"}})
    assert result.error is not None
    for name in ACTION_NAMES:
        assert name in result.error


@pytest.mark.asyncio
async def test_search_results_are_compact_and_the_data_whole() -> None:
    long_text = "word " * 200

    class Memory:
        """Answers one search (the facade's result shapes are pinned by test_actions.py)."""

        async def search(self, query: str, **options: Any) -> list[LayerHit]:
            assert options["layers"] == ["long_term"] and options["time_range"] is None
            return [LayerHit(layer="long_term", id="m1", text=long_text, score=0.876543, kind="semantic",
                             source="team", provenance={"agent": "a", "board": "team"},
                             created_at=datetime(2026, 1, 31, 12, 0, tzinfo=UTC), metadata={"n": 1})]

    result = await call_action(cast(Any, Memory()), {"name": "memory_search",
                                                     "arguments": {"query": "q", "layers": ["long_term"]}})
    assert result.ok
    line = result.content.splitlines()[1]
    assert line.startswith("1. [long_term 0.88] id=m1 (semantic, team 2026-01-31 12:00): word word")
    assert line.endswith("…") and len(line) < TEXT_CHARS + 80
    assert result.data == {"hits": [{"layer": "long_term", "id": "m1", "text": long_text, "score": 0.8765,
                                     "kind": "semantic", "source": "team",
                                     "provenance": {"agent": "a", "board": "team"},
                                     "created_at": "2026-01-31T12:00:00+00:00", "metadata": {"n": 1}}]}
