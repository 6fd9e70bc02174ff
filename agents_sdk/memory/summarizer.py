"""The LLM summarizer: an OpenAI-compatible chat model behind the ``Summarizer`` Protocol.

The request is built by the pure :func:`summary_messages`; :class:`OpenAISummarizer`
only sends it through ``openai.AsyncOpenAI`` (any OpenAI-compatible server:
OpenAI, vLLM, Ollama, LiteLLM...) and wraps failures in ``LLMError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from agents_sdk.memory.items import ViewItem, render_item
from blackboard.client.llm import openai_client
from blackboard.protocol.errors import LLMError
from blackboard.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["DEFAULT_SUMMARY_INSTRUCTIONS", "OpenAISummarizer", "summary_messages"]


DEFAULT_SUMMARY_INSTRUCTIONS: Final = (
    "You condense an AI agent's execution history. Summarise the steps below so "
    "the agent can continue its task without them: keep goals, decisions, facts "
    "learned, results, open questions and errors; drop chatter. Earlier summaries "
    "may appear among the steps: fold them in. Answer with the summary only."
)


def summary_messages(
    items: Sequence[ViewItem],
    *,
    instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
    max_field_chars: int | None = 2000,
) -> list[dict[str, str]]:
    """The chat messages asking for a summary of ``items`` (pure, deterministic)."""
    body = "\n".join(render_item(item, max_field_chars) for item in items)
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": f"History to summarise ({len(items)} items):\n\n{body}"},
    ]


class OpenAISummarizer:
    """A ``Summarizer`` backed by an OpenAI-compatible chat completions endpoint.

    Use as an async context manager (or call :meth:`aclose`) when it created
    its own client (:meth:`from_settings`).

    Args:
        client: The chat client.
        model: Model name sent with each request.
        instructions: The system prompt.
        max_field_chars: Longest field text sent per item (longer ones are cut).
        max_tokens: Upper bound on the summary's tokens (``None``: server default).
        owns_client: Close ``client`` in :meth:`aclose`.
    """

    def __init__(
        self,
        client: AsyncOpenAI,
        model: str,
        *,
        instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
        max_field_chars: int | None = 2000,
        max_tokens: int | None = None,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.model = model
        self.instructions = instructions
        self.max_field_chars = max_field_chars
        self.max_tokens = max_tokens
        self._owns_client = owns_client

    @classmethod
    def from_settings(cls, llm: LLMSettings, **kwargs: Any) -> OpenAISummarizer:
        """A summarizer with its own client for ``llm`` (model, base_url, api_key, timeout).

        Raises:
            ConfigurationError: no ``api_key`` while pointing at api.openai.com.
        """
        return cls(openai_client(llm), llm.model, owns_client=True, **kwargs)

    async def summarize(self, items: Sequence[ViewItem]) -> str:
        """Ask the model for a summary of ``items``.

        Raises:
            LLMError: the request failed (after the client's retries) or the
                answer held no text.
        """
        import openai

        messages = summary_messages(
            items, instructions=self.instructions, max_field_chars=self.max_field_chars
        )
        extra: dict[str, Any] = {}
        if self.max_tokens is not None:
            extra["max_tokens"] = self.max_tokens
        try:
            response = await self.client.chat.completions.create(
                model=self.model, messages=cast(Any, messages), **extra
            )
        except openai.OpenAIError as exc:
            raise LLMError(f"summary request to {self.model!r} failed: {exc}") from exc
        text: str | None = response.choices[0].message.content if response.choices else None
        if not text or not text.strip():
            raise LLMError(f"model {self.model!r} returned an empty summary")
        return text.strip()

    async def aclose(self) -> None:
        """Close the client if this summarizer created it."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAISummarizer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
