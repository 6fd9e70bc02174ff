"""The OpenAI-compatible chat client of ``settings.llm``, made in one place.

The SDK's summarizer, memory router and tool loop and the worker's chat model
each own a client made here, so the rules are the same everywhere: the base
URL is always explicit (the client never falls back to ``OPENAI_BASE_URL``),
a server of one's own needs no key, and the default endpoint
(api.openai.com) without a key is a :class:`ConfigurationError` before any
request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OPENAI_URL", "openai_client"]

#: The endpoint used when ``llm.base_url`` is not set.
OPENAI_URL: Final = "https://api.openai.com/v1"
#: The key sent when ``llm.api_key`` is not set: servers of one's own ignore it, but the client needs one.
_NO_KEY: Final = "not-needed"


def openai_client(llm: LLMSettings, *, max_retries: int = 2) -> AsyncOpenAI:
    """A new ``openai.AsyncOpenAI`` for ``llm`` (base_url, api_key, timeout); the caller closes it.

    Args:
        llm: the model's settings.
        max_retries: the client's retries of a failed request (0 where a fallback
            answers instead, as the memory router's rules do).

    Raises:
        ConfigurationError: no ``api_key`` while pointing at api.openai.com.
    """
    from openai import AsyncOpenAI

    if llm.api_key is None and llm.base_url is None:
        raise ConfigurationError("llm.api_key is required for the default OpenAI endpoint")
    return AsyncOpenAI(api_key=llm.api_key.get_secret_value() if llm.api_key is not None else _NO_KEY,
                       base_url=llm.base_url or OPENAI_URL, timeout=llm.timeout, max_retries=max_retries)
