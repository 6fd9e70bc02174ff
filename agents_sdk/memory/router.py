"""Which layers ``agent.memory.search`` reads when the call names none (docs/memory.md,
"The router").

:class:`RuleRouter` (the default) applies documented rules to the query's words and the
filters; :class:`LLMRouter` asks an OpenAI-compatible chat model for a JSON answer and falls
back to the rules on any failure (counted in :attr:`LLMRouter.fallbacks`). Any object with
an ``async route(query, *, available, filters)`` plugs in (:class:`Router`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, runtime_checkable

from agents_sdk.memory.layers import LAYERS, Layer
from blackboard.client.llm import openai_client
from blackboard.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["DEFAULT_RULES", "LLMRouter", "RouteRule", "Router", "RuleRouter", "parse_layers"]

log = logging.getLogger("agents_sdk.memory.router")


@runtime_checkable
class Router(Protocol):
    """Chooses the layers a search reads."""

    async def route(self, query: str, *, available: Sequence[Layer],
                    filters: Mapping[str, Any] | None = None) -> list[Layer]:
        """The layers to search for ``query``: a non-empty subset of ``available``, in
        :data:`~agents_sdk.memory.layers.LAYERS` order. ``filters`` are the search's filters
        (``board``, ``boards``, ``author``, ``since``, ``until``, ...)."""
        ...


@dataclass(frozen=True, slots=True)
class RouteRule:
    """A rule: when the query matches ``pattern`` (whole words, case-insensitive), read ``layers``."""

    name: str
    pattern: str
    layers: tuple[Layer, ...]

    def matches(self, query: str) -> bool:
        return re.search(self.pattern, query, re.IGNORECASE) is not None


def _words(*words: str) -> str:
    return r"\b(?:" + "|".join(w.replace(" ", r"\s+") for w in words) + r")\b"


#: The query rules of :class:`RuleRouter`, each documented in docs/memory.md.
DEFAULT_RULES: Final[tuple[RouteRule, ...]] = (
    # what the agent is doing now: its scratchpad and the episode's steps
    RouteRule("current", _words("now", "current", "currently", "goal", "focus", "hypothesis", "hypotheses",
                                "plan", "todo", "next step", "working on"), ("short_term", "working")),
    # what just happened: the episode's steps
    RouteRule("recent", _words("just", "recent", "recently", "last step", "previous step", "so far",
                               "this episode", "this task", "earlier"), ("short_term",)),
    # what the others know: the boards joined
    RouteRule("team", _words("team", "teammate", "teammates", "others", "other agents", "everyone",
                             "shared", "board", "we", "our", "us"), ("shared",)),
    # what was learned before: long-term memory, own and shared
    RouteRule("past", _words("remember", "remembered", "learned", "learnt", "last time", "before",
                             "previously", "history", "pattern", "patterns", "usually", "always", "known",
                             "lesson", "lessons", "past"), ("long_term", "shared")),
)


class RuleRouter:
    """The default router: documented rules, first the filters', then the query's.

    1. Filters naming a board (``board``/``boards``) or another author read the long-term
       layers only: ``long_term`` and ``shared`` (local items have no board or author).
    2. A time range (``since``/``until``) reads ``long_term``, ``shared`` and ``short_term``
       (working notes carry no wall-clock time).
    3. Otherwise each rule of ``rules`` (:data:`DEFAULT_RULES`) whose words the query holds
       adds its layers.
    4. No rule matched, or none of the chosen layers is available: every available layer.

    The answer keeps :data:`~agents_sdk.memory.layers.LAYERS` order.

    Args:
        rules: the query rules (default :data:`DEFAULT_RULES`).
        agent_id: the agent whose own authorship does not count as "another author" in rule 1.
    """

    def __init__(self, rules: Sequence[RouteRule] = DEFAULT_RULES, *, agent_id: str | None = None) -> None:
        self.rules = tuple(rules)
        self.agent_id = agent_id
        #: The rules that decided the last route (for logs and tests).
        self.last: tuple[str, ...] = ()

    def choose(self, query: str, *, available: Sequence[Layer],
               filters: Mapping[str, Any] | None = None) -> list[Layer]:
        """The rules' choice (pure; :meth:`route` awaits nothing more)."""
        filters = filters or {}
        chosen: set[Layer] = set()
        fired: list[str] = []
        author = filters.get("author")
        if filters.get("board") or filters.get("boards") or (author and author != self.agent_id):
            chosen.update(("long_term", "shared"))
            fired.append("filters:board")
        elif filters.get("since") is not None or filters.get("until") is not None:
            chosen.update(("long_term", "shared", "short_term"))
            fired.append("filters:time")
        else:
            for rule in self.rules:
                if rule.matches(query):
                    chosen.update(rule.layers)
                    fired.append(rule.name)
        picked = [layer for layer in LAYERS if layer in chosen and layer in available]
        if not picked:
            fired.append("all")
            picked = [layer for layer in LAYERS if layer in available]
        self.last = tuple(fired)
        return picked

    async def route(self, query: str, *, available: Sequence[Layer],
                    filters: Mapping[str, Any] | None = None) -> list[Layer]:
        return self.choose(query, available=available, filters=filters)


_LLM_INSTRUCTIONS: Final = (
    "You route a memory search of an AI agent to the memory layers worth reading. Layers: "
    "short_term (the steps of the current task's episode), working (the agent's current goal, focus, "
    "notes and hypotheses), long_term (what this agent learned in earlier tasks), shared (what the "
    "agent's team wrote on the boards it joined). Answer with JSON only: "
    '{"layers": ["<layer>", ...]} using only the layers offered.'
)


def parse_layers(text: str, available: Sequence[Layer]) -> list[Layer]:
    """The layers of a router model's JSON answer (``{"layers": [...]}`` or a bare list),
    in :data:`LAYERS` order.

    Raises:
        ValueError: not JSON, not that shape, an unknown or unavailable layer, or none.
    """
    text = text.strip()
    if text.startswith("```"):  # a fenced block: its body
        text = text.strip("`").removeprefix("json").strip()
    value = json.loads(text)
    names = value.get("layers") if isinstance(value, dict) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"expected {{'layers': [...]}}, got {text[:200]!r}")
    wrong = [n for n in names if n not in available]
    if wrong:
        raise ValueError(f"layers not offered: {wrong}")
    return [layer for layer in LAYERS if layer in names]


class LLMRouter:
    """Routes with an OpenAI-compatible chat model (``settings.llm``); on any failure (the
    request, a non-JSON answer, an unknown layer) it falls back to ``fallback`` (a
    :class:`RuleRouter`) and counts it in :attr:`fallbacks`.

    Args:
        client: the chat client (``openai.AsyncOpenAI``).
        model: the model name.
        fallback: the router used when the model fails (default :class:`RuleRouter`).
        owns_client: close ``client`` in :meth:`aclose`.
    """

    def __init__(self, client: AsyncOpenAI, model: str, *, fallback: Router | None = None,
                 owns_client: bool = False) -> None:
        self.client = client
        self.model = model
        self.fallback: Router = fallback if fallback is not None else RuleRouter()
        self.fallbacks = 0
        self._owns_client = owns_client

    @classmethod
    def from_settings(cls, llm: LLMSettings, **kwargs: Any) -> LLMRouter:
        """A router with its own client for ``llm`` (model, base_url, api_key, timeout).

        Raises:
            ConfigurationError: no ``api_key`` while pointing at api.openai.com.
        """
        # No retries: a failed route falls back to the rules at once.
        return cls(openai_client(llm, max_retries=0), llm.model, owns_client=True, **kwargs)

    def messages(self, query: str, available: Sequence[Layer],
                 filters: Mapping[str, Any] | None) -> list[dict[str, str]]:
        """The chat messages asking for a route (pure)."""
        described = json.dumps({"query": query, "layers_offered": list(available),
                                "filters": {k: str(v) for k, v in (filters or {}).items() if v}})
        return [{"role": "system", "content": _LLM_INSTRUCTIONS}, {"role": "user", "content": described}]

    async def route(self, query: str, *, available: Sequence[Layer],
                    filters: Mapping[str, Any] | None = None) -> list[Layer]:
        import openai

        try:
            response = await self.client.chat.completions.create(
                model=self.model, messages=cast(Any, self.messages(query, available, filters)), temperature=0)
            text = response.choices[0].message.content if response.choices else None
            return parse_layers(text or "", available)
        except (openai.OpenAIError, ValueError, KeyError, IndexError, AttributeError) as exc:
            self.fallbacks += 1
            log.info("LLM router %r failed (%s); routing by the rules", self.model, exc)
            return await self.fallback.route(query, available=available, filters=filters)

    async def aclose(self) -> None:
        """Close the client if this router created it."""
        if self._owns_client:
            await self.client.close()
