"""run_tool_loop against a local HTTP server speaking chat completions with tool calls
(tests/fakes' OpenAIFake, scripted per round): memory actions run on a real agent's memory,
their results go back as tool messages, bad arguments come back as errors the model can
correct, the loop stops at a reply or at max_rounds, extra tools, settings, failures."""

from __future__ import annotations

from typing import Any, cast

import pytest
from openai import AsyncOpenAI

from agents_sdk import Agent
from agents_sdk.memory.actions import ACTION_NAMES, ActionResult
from agents_sdk.memory.toolloop import ExtraTool, run_tool_loop
from blackboard.protocol.errors import ConfigurationError, LLMError
from blackboard.settings import LLMSettings, Settings
from tests.fakes.openai_server import OpenAIFake, tool_call

pytestmark = pytest.mark.asyncio


def _round(body: dict[str, Any]) -> int:
    """Which round a request is: 1 + the assistant messages already in it."""
    return 1 + sum(1 for m in body["messages"] if m.get("role") == "assistant")


def _tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m.get("role") == "tool"]


def _client(fake: OpenAIFake) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)


async def test_the_loop_runs_memory_actions_and_feeds_their_results_back(
        settings: Settings, openai_fake: OpenAIFake, unique: str) -> None:
    seen: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        n = _round(body)
        if n == 1:
            return {"tool_calls": [
                tool_call("memory_write", {"text": "find the css selector of the price", "layer": "working",
                                           "key": "goal"}, "c1"),
                tool_call("memory_write", {"text": f"visited page {unique}/p/1: price in span.cost"}, "c2")]}
        if n == 2:
            return {"content": "let me look", "tool_calls": [
                tool_call("memory_search", {"query": "price selector span cost",
                                            "layers": ["working", "short_term"]}, "c3")]}
        return {"content": "the price is in span.cost"}

    openai_fake.respond = respond
    messages = [{"role": "system", "content": "You scrape shops."}, {"role": "user", "content": "Find the price."}]
    async with Agent.connect(f"looper-{unique}", settings=settings) as agent:
        async with _client(openai_fake) as client:
            result = await run_tool_loop(client, messages, agent.memory, model="fake-model")
        goal = await agent.memory.read("goal", layer="working")
        assert "find the css selector of the price" in goal.text

    assert result.finished and result.reply == "the price is in span.cost" and result.rounds == 3
    assert [r.name for r in result.results] == ["memory_write", "memory_write", "memory_search"]
    assert all(r.ok for r in result.results), [r.error for r in result.results]
    assert len(messages) == 2  # the caller's list is not modified
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert [m["tool_call_id"] for m in result.messages if m["role"] == "tool"] == ["c1", "c2", "c3"]
    # each request offered the memory tools and carried the previous rounds' tool results
    assert all([t["function"]["name"] for t in b["tools"]] == list(ACTION_NAMES) for b in seen)
    assert all(b["model"] == "fake-model" for b in seen)
    second = _tool_messages(seen[1])
    assert [m["content"] for m in second] == [r.content for r in result.results[:2]]
    assert "stored in working" in second[0]["content"] and "key=goal" in second[0]["content"]
    search = _tool_messages(seen[2])[-1]["content"]
    assert "[working" in search and "wm:goal" in search and "span.cost" in search
    hits = cast(dict[str, Any], result.results[2].data)["hits"]
    assert {h["layer"] for h in hits} == {"working", "short_term"}


async def test_bad_arguments_go_back_to_the_model_which_corrects_them(
        settings: Settings, openai_fake: OpenAIFake, unique: str) -> None:
    seen: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        n = _round(body)
        if n == 1:
            return {"tool_calls": [tool_call("memory_write", {"txt": "oops", "layer": "working"}, "bad1"),
                                   tool_call("memory_forget", {}, "bad2"),
                                   tool_call("memory_search", "{\"query\": ", "bad3")]}
        if n == 2:
            return {"tool_calls": [tool_call("memory_write", {"text": "the shop is example.test",
                                                              "layer": "working", "key": "shop"}, "good")]}
        return {"content": "noted"}

    openai_fake.respond = respond
    async with Agent.connect(f"fixer-{unique}", settings=settings) as agent:
        async with _client(openai_fake) as client:
            result = await run_tool_loop(client, [{"role": "user", "content": "go"}], agent.memory,
                                         model="m")
        assert (await agent.memory.read("shop", layer="working")).text.endswith("the shop is example.test")

    assert result.finished and result.reply == "noted"
    assert [r.ok for r in result.results] == [False, False, False, True]
    errors = [m["content"] for m in _tool_messages(seen[1])]
    assert errors[0].startswith("error: InvalidArguments:")
    assert "text: Field required" in errors[0] and "txt: Extra inputs are not permitted" in errors[0]
    assert errors[1].startswith("error: UnknownTool: no tool 'memory_forget'")
    assert errors[2].startswith("error: InvalidArguments: the arguments are not valid JSON")


async def test_the_loop_stops_at_max_rounds(settings: Settings, openai_fake: OpenAIFake, unique: str) -> None:
    openai_fake.respond = lambda body: {"tool_calls": [
        tool_call("memory_search", {"query": "anything", "layers": ["short_term"]}, f"c{_round(body)}")]}
    async with Agent.connect(f"spinner-{unique}", settings=settings) as agent, _client(openai_fake) as client:
        result = await run_tool_loop(client, [{"role": "user", "content": "go"}], agent.memory, model="m",
                                     max_rounds=2)
    assert not result.finished and result.reply is None and result.rounds == 2
    assert len(openai_fake.requests_to("/v1/chat/completions")) == 2
    assert [r.ok for r in result.results] == [True, True]
    assert [m["role"] for m in result.messages][-2:] == ["assistant", "tool"]  # every call answered


async def test_settings_extra_tools_and_options(settings: Settings, openai_fake: OpenAIFake, unique: str) -> None:
    fetched: list[dict[str, Any]] = []

    async def fetch(args: dict[str, Any]) -> str:
        fetched.append(args)
        if args.get("url") == "bad":
            raise ValueError("not a URL")
        return "<span class=cost>12 EUR</span>"

    page = ExtraTool("fetch_page", "Fetch a page of the shop.",
                     {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}, fetch)

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        n = _round(body)
        if n == 1:
            return {"tool_calls": [tool_call("fetch_page", {"url": "http://shop.test/p/1"}, "f1"),
                                   tool_call("fetch_page", {"url": "bad"}, "f2")]}
        return {"content": _tool_messages(body)[0]["content"]}

    openai_fake.respond = respond
    llm = LLMSettings(model=f"local-{unique}", base_url=openai_fake.base_url)
    async with Agent.connect(f"extra-{unique}", settings=settings) as agent:
        result = await run_tool_loop(llm, [{"role": "user", "content": "price?"}], agent.memory,
                                     extra_tools=[page], options={"temperature": 0})
    assert result.reply == "<span class=cost>12 EUR</span>" and result.finished
    assert fetched == [{"url": "http://shop.test/p/1"}, {"url": "bad"}]
    assert [(r.name, r.ok) for r in result.results] == [("fetch_page", True), ("fetch_page", False)]
    assert result.results[1].error == "ValueError: not a URL"
    first = openai_fake.requests_to("/v1/chat/completions")[0].body
    assert first["model"] == f"local-{unique}" and first["temperature"] == 0
    assert [t["function"]["name"] for t in first["tools"]] == [*ACTION_NAMES, "fetch_page"]


async def test_a_failed_completion_is_an_llm_error(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(1, status=400)
    async with _client(openai_fake) as client:
        with pytest.raises(LLMError, match="chat completion of 'm' failed"):
            await run_tool_loop(client, [{"role": "user", "content": "go"}], cast(Any, object()), model="m")


async def test_loop_configuration_errors(openai_fake: OpenAIFake) -> None:
    memory = cast(Any, object())
    msgs = [{"role": "user", "content": "go"}]

    async def nothing(args: dict[str, Any]) -> ActionResult | str:
        return ""

    async with _client(openai_fake) as client:
        with pytest.raises(ConfigurationError, match="model="):
            await run_tool_loop(client, msgs, memory)
        with pytest.raises(ConfigurationError, match="max_rounds"):
            await run_tool_loop(client, msgs, memory, model="m", max_rounds=0)
        with pytest.raises(ConfigurationError, match="memory_write"):
            await run_tool_loop(client, msgs, memory, model="m",
                                extra_tools=[ExtraTool("memory_write", "x", {"type": "object"}, nothing)])
        twice = ExtraTool("t", "x", {"type": "object"}, nothing)
        with pytest.raises(ConfigurationError, match="distinct"):
            await run_tool_loop(client, msgs, memory, model="m", extra_tools=[twice, twice])
    with pytest.raises(ConfigurationError, match="api_key"):
        await run_tool_loop(LLMSettings(), msgs, memory)
    assert openai_fake.requests == []
