"""The LLM summarizing condenser against a real local HTTP server speaking chat completions."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from agents_sdk.memory import (
    CondensedHistory,
    LLMSummarizingCondenser,
    OpenAISummarizer,
    ShortTermMemory,
    Summary,
    apply_events,
    summary_id,
)
from blackboard.protocol.errors import ConfigurationError, LLMError
from blackboard.settings import LLMSettings
from tests.fakes.openai_server import OpenAIFake


def llm_settings(fake: OpenAIFake) -> LLMSettings:
    return LLMSettings(
        model="summary-model", base_url=fake.base_url, api_key=SecretStr("k"), timeout=10
    )


def numbered_summary(messages: list[dict[str, Any]]) -> str:
    user = messages[-1]["content"]
    return f"condensed {user.count('[step ')} steps"


@pytest.mark.asyncio
async def test_summary_from_the_server_lands_in_the_event(openai_fake: OpenAIFake) -> None:
    openai_fake.chat = numbered_summary
    mem = ShortTermMemory()
    for i in range(8):
        mem.add(action=f"tool{i}", observation=f"observation-{i}-marker")
    async with OpenAISummarizer.from_settings(llm_settings(openai_fake)) as summarizer:
        condenser = LLMSummarizingCondenser(summarizer, max_size=6, keep_first=1, keep_last=2)
        events = await condenser.condense(mem.items())

    forgotten = (2, 3, 4, 5, 6)
    assert len(events) == 1
    event = events[0]
    assert event.summary == "condensed 5 steps"
    assert (event.forgotten_ids, event.summary_offset) == (forgotten, 1)
    assert event.summary_id == summary_id(forgotten)

    [request] = openai_fake.requests_to("/v1/chat/completions")
    assert request.body["model"] == "summary-model"
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["authorization"] == "Bearer k"
    sent = "\n".join(m["content"] for m in request.body["messages"])
    for i in range(1, 6):
        assert f"observation-{i}-marker" in sent  # the forgotten items were sent
    for i in (0, 6, 7):
        assert f"observation-{i}-marker" not in sent  # the kept ones were not

    view = apply_events(mem.items(), events)
    assert [item.id for item in view] == [1, summary_id(forgotten), 7, 8]
    assert isinstance(view[1], Summary) and view[1].text == "condensed 5 steps"


@pytest.mark.asyncio
async def test_next_condensation_sends_the_previous_summary(openai_fake: OpenAIFake) -> None:
    summaries = iter(["first summary", "second summary"])
    openai_fake.chat = lambda messages: next(summaries)
    mem = ShortTermMemory()
    async with OpenAISummarizer.from_settings(llm_settings(openai_fake)) as summarizer:
        log = CondensedHistory(
            LLMSummarizingCondenser(summarizer, max_size=4, keep_first=1, keep_last=1)
        )
        for i in range(7):
            mem.add(action=f"a{i}")
            await log.condense(mem.items())
    requests = openai_fake.requests_to("/v1/chat/completions")
    assert len(requests) == 2
    assert "first summary" in requests[1].body["messages"][1]["content"]
    view = log.view(mem.items())
    assert [i.text for i in view if isinstance(i, Summary)] == ["second summary"]


@pytest.mark.asyncio
async def test_server_errors_and_empty_answers_raise_llm_error(openai_fake: OpenAIFake) -> None:
    mem = ShortTermMemory()
    items = [mem.add(action="x") for _ in range(3)]
    async with OpenAISummarizer.from_settings(llm_settings(openai_fake)) as summarizer:
        openai_fake.fail_next(1, status=400)  # not retried by the client
        with pytest.raises(LLMError):
            await summarizer.summarize(items)
        openai_fake.chat = lambda messages: "   "
        with pytest.raises(LLMError):
            await summarizer.summarize(items)


def test_default_endpoint_without_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        OpenAISummarizer.from_settings(LLMSettings(timeout=5))
