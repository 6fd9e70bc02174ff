"""The ``conversation`` store: read/write long-term memories in a scope of a board.

A write is ``agent.remember`` on the store's board, tagged ``store:<name>`` and
with ``metadata.store = <name>``; a search is ``agent.recall`` filtered to that
scope (hybrid by default), its scores normalised to 0..1 as the facade's
long-term layer does (:func:`~agents_sdk.memory.layers.normalise_scores`). The
same text written twice is one memory: the worker deduplicates exact repeats
at ingest (``memory.dedup``, docs/memory-lifecycle.md). Several agents may
attach the same conversation store (the same board and name): each reads what
the others wrote unless ``own_only``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agents_sdk.memory.layers import LayerHit, hit_of_memory, normalise_scores
from agents_sdk.memory.stores.base import StoreOptions, StoreSpec, store_layer, validate_store_name
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.search import SearchMode

if TYPE_CHECKING:
    from agents_sdk.agent import Agent

__all__ = ["ConversationOptions", "ConversationStore", "make_store"]


class ConversationOptions(StoreOptions):
    """Options of a ``conversation`` store."""

    #: The board holding its memories (default: ``agent_memory.long_term_board``).
    board: str | None = None
    #: The kind of the memories it writes.
    kind: MemoryKind = "episodic"
    #: How it searches.
    mode: SearchMode = "hybrid"
    #: Read only the memories this agent wrote.
    own_only: bool = False
    #: Tags added to every memory it writes (besides ``store:<name>``).
    tags: list[str] = Field(default_factory=list)
    #: Importance of the memories it writes.
    importance: float = Field(0.5, ge=0, le=1)


class ConversationStore:
    """Long-term memories on a board, scoped by the store's name (see the module doc)."""

    kind = "conversation"
    writable = True

    def __init__(self, agent: Agent, name: str, options: ConversationOptions | None = None) -> None:
        self.name = validate_store_name(name)
        self.options = options or ConversationOptions()
        self.agent = agent
        self.board = self.options.board or agent.settings.agent_memory.long_term_board
        self._written = 0

    def __repr__(self) -> str:
        return f"ConversationStore({self.name!r}, board={self.board!r})"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        """``agent.remember(text)`` on the store's board, in its scope; returns the memory id.

        Raises:
            InvalidPayloadError, PayloadTooLargeError: bad input (see ``Agent.remember``).
        """
        tags = [f"store:{self.name}", *self.options.tags]
        memory_id = await self.agent.remember(text, kind=self.options.kind, tags=tags,
                                              metadata={**(metadata or {}), "store": self.name},
                                              importance=self.options.importance, board=self.board)
        self._written += 1
        return memory_id

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        """The store's memories that best match ``query`` (``agent.recall`` in its scope).

        Raises:
            SearchError: no worker serves search. PermissionDeniedError: the board is not readable.
        """
        hits = await self.agent.recall(query, board=self.board, metadata={"store": self.name}, top_k=top_k,
                                       mode=self.options.mode,
                                       author=self.agent.id if self.options.own_only else None)
        scores = normalise_scores(hits, self.options.mode)
        out = [replace(hit_of_memory(hit, layer=store_layer(self.name), score=score), source=self.name)
               for hit, score in zip(hits, scores, strict=True) if score >= threshold]
        return out[:top_k]

    def size(self) -> int:
        """The memories written through this store object (the board may hold more)."""
        return self._written


def make_store(spec: StoreSpec, agent: Agent) -> ConversationStore:
    """The registry's factory of ``conversation`` stores."""
    return ConversationStore(agent, spec.name, ConversationOptions.model_validate(dict(spec.options)))
