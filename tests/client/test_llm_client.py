"""The one OpenAI-compatible chat client made from ``settings.llm``, and its users."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from agents_sdk.memory.router import LLMRouter
from agents_sdk.memory.summarizer import OpenAISummarizer
from blackboard.client.llm import OPENAI_URL, openai_client
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import LLMSettings
from blackboard.worker.llm import ChatModel


@pytest.mark.asyncio
async def test_a_server_of_ones_own_needs_no_key_and_its_url_is_used() -> None:
    client = openai_client(LLMSettings(base_url="http://127.0.0.1:9/v1", timeout=7), max_retries=0)
    try:
        assert str(client.base_url).rstrip("/") == "http://127.0.0.1:9/v1"
        assert client.api_key == "not-needed" and client.max_retries == 0 and client.timeout == 7
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_the_default_endpoint_is_explicit_and_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere.invalid/v1")  # never read
    client = openai_client(LLMSettings(api_key=SecretStr("sk-test")))
    try:
        assert str(client.base_url).rstrip("/") == OPENAI_URL and client.api_key == "sk-test"
        assert client.max_retries == 2
    finally:
        await client.close()
    with pytest.raises(ConfigurationError, match="api_key is required"):
        openai_client(LLMSettings())


def test_every_user_refuses_the_default_endpoint_without_a_key() -> None:
    for make in (OpenAISummarizer.from_settings, LLMRouter.from_settings):
        with pytest.raises(ConfigurationError, match="api_key is required"):
            make(LLMSettings())
    with pytest.raises(ConfigurationError, match="base_url is not set"):
        ChatModel.from_settings(LLMSettings(api_key=SecretStr("sk-test")))
