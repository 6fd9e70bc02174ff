"""Episodes: a (task id, episode id) that scopes the short-term and working memory of
``agent.memory`` (docs/memory.md, "Episodes").

An :class:`Episode` holds its own :class:`~agents_sdk.memory.short_term.ShortTermMemory` and
:class:`~agents_sdk.memory.working.WorkingMemory`, bounded by ``agent_memory``'s limits.
Ending one (``agent.memory.end_episode``) can summarize it into long-term memory
(:class:`EpisodeSummary`), then clears it. Local and pure: no IO here.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agents_sdk.memory.items import render_value
from agents_sdk.memory.layers import item_text, working_text
from agents_sdk.memory.short_term import ShortTermMemory
from agents_sdk.memory.working import WorkingMemory
from blackboard.protocol.errors import InvalidKeyError
from blackboard.settings import AgentMemorySettings

__all__ = ["DEFAULT_EPISODE", "Episode", "EpisodeSummary", "new_episode_id"]

#: The (task id, episode id) of the episode that exists from the start.
DEFAULT_EPISODE: Final = ("default", "default")
_ID: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def new_episode_id() -> str:
    """A fresh episode id (random, 16 hex digits)."""
    return uuid.uuid4().hex[:16]


def _check(value: str, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidKeyError(str(value), f"a {what} is 1-128 characters of [A-Za-z0-9_.:-]")
    return value


@dataclass(eq=False)
class Episode:
    """One episode's local memory.

    Attributes:
        task_id: the task it serves.
        episode_id: its id (unique within the agent).
        short_term: its items (steps, notes).
        working: its notes with a time-to-live.
        started_at: wall-clock seconds when it began.
        ended: whether ``end_episode`` ended it.
    """

    task_id: str
    episode_id: str
    short_term: ShortTermMemory
    working: WorkingMemory
    started_at: float = field(default_factory=time.time)
    ended: bool = False

    @classmethod
    def new(cls, task_id: str, episode_id: str, settings: AgentMemorySettings, *,
            clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> Episode:
        """An empty episode bounded by ``settings`` (``short_term_max_items``/``_bytes``, ``working_ttl``).

        Raises:
            InvalidKeyError: a task or episode id outside ``[A-Za-z0-9_.:-]{1,128}``.
        """
        return cls(_check(task_id, "task id"), _check(episode_id, "episode id"),
                   ShortTermMemory(max_items=settings.short_term_max_items,
                                   max_bytes=settings.short_term_max_bytes, clock=clock),
                   WorkingMemory(default_ttl=settings.working_ttl, clock=monotonic), started_at=clock())

    def texts(self) -> list[str]:
        """What the episode says, oldest first: its short-term items, then its live working notes."""
        return [item_text(i) for i in self.short_term] + [working_text(w) for w in self.working.live()]

    def keyed(self) -> dict[str, str]:
        """The values by key: short-term items written with a ``key`` (the newest wins), then
        working notes (which win over items of the same key)."""
        out: dict[str, str] = {}
        for item in self.short_term:
            key = item.extra.get("key")
            if isinstance(key, str):
                out[key] = item_text(item)
        for note in self.working.live():
            out[note.key] = render_value(note.value)
        return out

    def clear(self) -> None:
        self.short_term.clear()
        self.working.clear()

    @property
    def empty(self) -> bool:
        return len(self.short_term) == 0 and len(self.working) == 0


@dataclass(frozen=True, slots=True)
class EpisodeSummary:
    """What ``end_episode`` wrote into long-term memory.

    Attributes:
        task_id, episode_id: the episode.
        text: the summary (the kept keys' ``key: value`` lines first, verbatim).
        memory_id: the long-term memory that holds it.
        board: where it was written.
        strategy: ``"extractive"`` or ``"llm"``.
        items: short-term items and working notes summarized.
        tokens: the summary's size by the memory's token counter.
        kept: the kept keys and their values.
    """

    task_id: str
    episode_id: str
    text: str
    memory_id: str
    board: str
    strategy: str
    items: int
    tokens: int
    kept: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "episode_id": self.episode_id, "text": self.text,
                "memory_id": self.memory_id, "board": self.board, "strategy": self.strategy,
                "items": self.items, "tokens": self.tokens, "kept": dict(self.kept)}


def pick_kept(values: Mapping[str, str], keys: Sequence[str]) -> dict[str, str]:
    """The kept keys found in ``values``, in the order asked (missing keys left out)."""
    return {k: values[k] for k in keys if k in values}
