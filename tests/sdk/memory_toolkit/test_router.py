"""The router of agent.memory.search: each documented rule, the LLM router and its fallback."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from openai import AsyncOpenAI

from agents_sdk import Agent
from agents_sdk.memory.layers import LAYERS, Layer
from agents_sdk.memory.router import (
    DEFAULT_RULES,
    LLMRouter,
    Router,
    RouteRule,
    RuleRouter,
    parse_layers,
)
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import LLMSettings, Settings
from tests.fakes.openai_server import OpenAIFake

ALL: tuple[Layer, ...] = LAYERS


def _route(query: str, filters: Mapping[str, Any] | None = None, available: Sequence[Layer] = ALL) -> list[Layer]:
    return RuleRouter(agent_id="me").choose(query, available=available, filters=filters)


@pytest.mark.parametrize(("query", "expected"), [
    # rule "current": the scratchpad and the episode's steps
    ("what is my current goal", ["short_term", "working"]),
    ("the next step of the plan", ["short_term", "working"]),
    # rule "recent": the episode's steps
    ("the error I just saw", ["short_term"]),
    ("what happened so far", ["short_term"]),
    # rule "team": the boards joined
    ("what did the team find", ["shared"]),
    ("selectors other agents use", ["shared"]),
    # rule "past": long-term, own and shared
    ("what did I learn last time about login pages", ["long_term", "shared"]),
    ("the usual pattern for prices", ["long_term", "shared"]),
    # several rules: their union, in layer order
    ("remember the current goal", ["short_term", "working", "long_term", "shared"]),
    ("what did the team learn before", ["long_term", "shared"]),
])
def test_each_query_rule_adds_its_layers(query: str, expected: list[Layer]) -> None:
    assert _route(query) == expected


def test_no_rule_reads_every_available_layer() -> None:
    router = RuleRouter()
    assert router.choose("price of sku 12", available=ALL) == list(ALL)
    assert router.last == ("all",)
    assert router.choose("price of sku 12", available=["long_term", "working"]) == ["working", "long_term"]


def test_rules_are_whole_words_case_insensitive() -> None:
    assert _route("CURRENT focus") == ["short_term", "working"]
    assert _route("the weather") == list(ALL)  # "we" inside a word is not the team rule
    assert _route("unjust ruling") == list(ALL)  # nor "just"


def test_a_board_or_another_author_reads_the_long_term_layers_only() -> None:
    assert _route("what is my current goal", {"board": "team"}) == ["long_term", "shared"]
    assert _route("anything", {"boards": ["a", "b"]}) == ["long_term", "shared"]
    assert _route("anything", {"author": "someone-else"}) == ["long_term", "shared"]
    # the agent's own authorship is no reason
    assert _route("price of sku 12", {"author": "me"}) == list(ALL)


def test_a_time_range_leaves_working_memory_out() -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    assert _route("anything", {"since": since}) == ["short_term", "long_term", "shared"]
    assert _route("the current goal", {"until": since}) == ["short_term", "long_term", "shared"]


def test_chosen_layers_that_are_off_fall_back_to_the_available_ones() -> None:
    assert _route("what did the team find", available=["short_term", "working"]) == ["short_term", "working"]
    assert _route("the current goal", available=["working", "shared"]) == ["working"]


def test_custom_rules() -> None:
    router = RuleRouter([RouteRule("selectors", r"\bselector\b", ("shared",))])
    assert router.choose("which selector", available=ALL) == ["shared"]
    assert router.last == ("selectors",)
    assert {r.name for r in DEFAULT_RULES} == {"current", "recent", "team", "past"}
    assert isinstance(router, Router)


def test_parse_layers_validates_the_model_answer() -> None:
    assert parse_layers('{"layers": ["shared", "working"]}', ALL) == ["working", "shared"]
    assert parse_layers('```json\n["long_term"]\n```', ALL) == ["long_term"]
    for bad in ("not json", '{"layers": []}', '{"layers": ["attic"]}', '{"layer": "working"}', '[1]'):
        with pytest.raises(ValueError):
            parse_layers(bad, ALL)
    with pytest.raises(ValueError, match="not offered"):
        parse_layers('{"layers": ["shared"]}', ["working"])


@pytest.mark.asyncio
async def test_llm_router_asks_the_model_and_falls_back_to_the_rules_on_failure() -> None:
    answers: list[str] = ['{"layers": ["shared"]}', "I think working memory", '{"layers": ["attic"]}']

    def chat(messages: list[dict[str, Any]]) -> str:
        return answers.pop(0)

    with OpenAIFake(chat=chat) as fake:
        router = LLMRouter(AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0), "router-model")
        assert await router.route("price of sku 12", available=ALL) == ["shared"]
        asked = json.loads(fake.requests_to("/v1/chat/completions")[0].body["messages"][1]["content"])
        assert asked["query"] == "price of sku 12" and asked["layers_offered"] == list(ALL)
        assert router.fallbacks == 0
        # prose, then an unknown layer: the rules answer, each fallback counted
        assert await router.route("what is my current goal", available=ALL) == ["short_term", "working"]
        assert await router.route("what did the team find", available=ALL) == ["shared"]
        assert router.fallbacks == 2
        # the server fails: the rules again
        fake.fail_next(1, status=500)
        assert await router.route("the error I just saw", available=ALL) == ["short_term"]
        assert router.fallbacks == 3
        await router.aclose()


def test_llm_router_from_settings_needs_a_key_for_openai() -> None:
    with pytest.raises(ConfigurationError):
        LLMRouter.from_settings(LLMSettings())
    router = LLMRouter.from_settings(LLMSettings(base_url="http://127.0.0.1:9/v1", model="m"))
    assert router.model == "m" and isinstance(router.fallback, RuleRouter)


@pytest.mark.asyncio
async def test_agent_memory_routes_with_the_llm_of_its_settings_and_counts_fallbacks(settings: Settings,
                                                                                      unique: str) -> None:
    answers = ['{"layers": ["working"]}', "no idea"]
    with OpenAIFake(chat=lambda messages: answers.pop(0)) as fake:
        configured = settings.model_copy(update={
            "llm": settings.llm.model_copy(update={"base_url": fake.base_url, "model": "router"}),
            "agent_memory": settings.agent_memory.model_copy(update={"router": "llm",
                                                                    "layers": ["short_term", "working"]})})
        async with Agent.connect(f"{unique}-a", settings=configured) as agent:
            assert isinstance(agent.memory.router, LLMRouter) and agent.memory.router.model == "router"
            await agent.memory.write("alpha note")
            await agent.memory.write("alpha scratch", layer="working")
            assert [h.layer for h in await agent.memory.search("alpha")] == ["working"]  # the model's choice
            # prose: the rules (no rule matches: every layer on)
            assert {h.layer for h in await agent.memory.search("alpha")} == {"short_term", "working"}
            assert agent.memory.metrics().router_fallbacks == 1
            offered = json.loads(fake.requests_to("/v1/chat/completions")[0].body["messages"][1]["content"])
            assert offered["layers_offered"] == ["short_term", "working"]
