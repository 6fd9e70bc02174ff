"""The worker's chat model: merging near-duplicate memories and extracting atomic facts.

Optional: only when ``llm.base_url`` is set (any OpenAI-compatible server) and
``memory.llm_merge`` or ``memory.llm_extract_kinds`` asks for it. The prompts are
built by pure functions (:func:`merge_messages`, :func:`extract_messages`) and the
answers read by a tolerant parser (:func:`parse_json_answer`: a JSON object or
list, possibly in a code fence or among other words); :class:`ChatModel` only
sends them through ``openai.AsyncOpenAI``. Every failure (the request, an empty
or unreadable answer) is an ``LLMError``: the consolidator logs it, counts it
and goes on without the model (a plain merge keeps the older text).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Final, cast

from blackboard.client.llm import openai_client
from blackboard.protocol.errors import ConfigurationError, LLMError
from blackboard.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = [
    "MERGE_INSTRUCTIONS",
    "ChatModel",
    "extract_messages",
    "merge_messages",
    "parse_facts",
    "parse_json_answer",
    "parse_merged",
]

#: Longest text of one memory sent to the model (characters).
MAX_INPUT_CHARS: Final = 4000
#: Most facts taken from one extraction, and the longest fact kept (characters).
MAX_FACTS: Final = 20
MAX_FACT_CHARS: Final = 1000

MERGE_INSTRUCTIONS: Final = (
    "You merge two memories of an AI agent that say nearly the same thing into one. Keep every "
    "fact either states (names, numbers, dates, places); when they disagree, keep both values and "
    "say so. Do not add anything. Answer with JSON only: {\"text\": \"<the merged memory>\"}."
)
EXTRACT_INSTRUCTIONS: Final = (
    "You turn a memory of an AI agent (a conversation turn, a note or a document) into atomic "
    "facts: short, self-contained statements, each true on its own, naming who or what it is "
    "about instead of pronouns. Leave out chatter and anything not stated. Answer with JSON "
    f"only: {{\"facts\": [\"<fact>\", ...]}} (at most {MAX_FACTS}; an empty list when there are none)."
)


def merge_messages(older: str, newer: str) -> list[dict[str, str]]:
    """The chat messages asking to merge two memories' texts (pure, deterministic)."""
    return [
        {"role": "system", "content": MERGE_INSTRUCTIONS},
        {"role": "user", "content": f"Memory 1:\n{older[:MAX_INPUT_CHARS]}\n\nMemory 2:\n{newer[:MAX_INPUT_CHARS]}"},
    ]


def extract_messages(text: str) -> list[dict[str, str]]:
    """The chat messages asking for the atomic facts of a memory's text (pure, deterministic)."""
    return [
        {"role": "system", "content": EXTRACT_INSTRUCTIONS},
        {"role": "user", "content": f"Memory:\n{text[:MAX_INPUT_CHARS]}"},
    ]


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def parse_json_answer(answer: str) -> Any:
    """The JSON value of a model's answer: the whole answer, else the inside of a code fence,
    else the first ``{...}`` or ``[...]`` span in it (pure).

    Raises:
        LLMError: no JSON object or list in the answer.
    """
    candidates = [answer.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(answer)]
    for opening, closing in (("{", "}"), ("[", "]")):
        start, end = answer.find(opening), answer.rfind(closing)
        if 0 <= start < end:
            candidates.append(answer[start:end + 1])
    for text in candidates:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict | list):
            return value
    raise LLMError(f"the model's answer holds no JSON object: {answer[:200]!r}")


def _clean(text: Any, limit: int) -> str | None:
    if not isinstance(text, str):
        return None
    text = " ".join(text.replace("\x00", " ").split())
    return text[:limit] if text else None


def parse_merged(answer: str, *, limit: int = 2 * MAX_INPUT_CHARS) -> str:
    """The merged text of a merge answer (``{"text": ...}``; a bare string or JSON-less prose
    is taken as the text).

    Raises:
        LLMError: an empty answer, or JSON without a text.
    """
    try:
        value = parse_json_answer(answer)
    except LLMError:
        value = answer
    if isinstance(value, dict):
        value = value.get("text", value.get("memory"))
    text = _clean(value, limit)
    if text is None:
        raise LLMError(f"the model gave no merged text: {answer[:200]!r}")
    return text


def parse_facts(answer: str) -> list[str]:
    """The facts of an extraction answer (``{"facts": [...]}`` or a bare list), cleaned,
    without repeats, at most :data:`MAX_FACTS`.

    Raises:
        LLMError: no list of facts in the answer.
    """
    value = parse_json_answer(answer)
    if isinstance(value, dict):
        value = value.get("facts")
    if not isinstance(value, list):
        raise LLMError(f"the model gave no list of facts: {answer[:200]!r}")
    out: list[str] = []
    for item in value:
        if isinstance(item, dict):
            item = item.get("fact", item.get("text"))
        fact = _clean(item, MAX_FACT_CHARS)
        if fact is not None and fact not in out:
            out.append(fact)
        if len(out) == MAX_FACTS:
            break
    return out


class ChatModel:
    """An OpenAI-compatible chat model (``llm.*`` settings) for the worker's derived memories.

    Args:
        client: the chat client.
        model: model name sent with each request.
        owns_client: close ``client`` in :meth:`aclose`.
    """

    def __init__(self, client: AsyncOpenAI, model: str, *, owns_client: bool = False) -> None:
        self.client = client
        self.model = model
        self._owns_client = owns_client

    @classmethod
    def from_settings(cls, llm: LLMSettings) -> ChatModel:
        """A model with its own client for ``llm`` (model, base_url, api_key, timeout).

        Raises:
            ConfigurationError: ``llm.base_url`` is not set (the worker uses no model then).
        """
        if llm.base_url is None:
            raise ConfigurationError("llm.base_url is not set: the worker uses no chat model")
        return cls(openai_client(llm), llm.model, owns_client=True)

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """The model's answer to ``messages``.

        Raises:
            LLMError: the request failed (after the client's retries) or the answer held no text.
        """
        import openai

        try:
            response = await self.client.chat.completions.create(
                model=self.model, messages=cast(Any, messages), temperature=0)
        except openai.OpenAIError as exc:
            raise LLMError(f"chat request to {self.model!r} failed: {exc}") from exc
        text: str | None = response.choices[0].message.content if response.choices else None
        if not text or not text.strip():
            raise LLMError(f"model {self.model!r} returned an empty answer")
        return text

    async def merge(self, older: str, newer: str) -> str:
        """One text saying what both memories say.

        Raises:
            LLMError: the request failed or the answer held no text.
        """
        return parse_merged(await self.complete(merge_messages(older, newer)))

    async def extract(self, text: str) -> list[str]:
        """The atomic facts a memory states (possibly none).

        Raises:
            LLMError: the request failed or the answer held no list of facts.
        """
        return parse_facts(await self.complete(extract_messages(text)))

    async def aclose(self) -> None:
        """Close the client if this model created it."""
        if self._owns_client:
            await self.client.close()
