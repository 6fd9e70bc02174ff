"""The layers of ``agent.memory`` and the one shape of a hit across them.

Four layers (docs/memory.md, "The facade and its layers"):

* ``short_term``: the current episode's items (:class:`~agents_sdk.memory.short_term.ShortTermMemory`),
  local to the process;
* ``working``: the current episode's notes with a time-to-live
  (:class:`~agents_sdk.memory.working.WorkingMemory`), local;
* ``long_term``: the agent's own long-term memories on ``agent_memory.long_term_board``;
* ``shared``: the long-term memories of the boards the agent has joined and of
  ``agent_memory.shared_boards``, whoever wrote them.

Every search of the facade and of an attached store returns :class:`LayerHit`, whose
``score`` is a relevance in 0..1 (how each layer normalises it: :func:`lexical_score`,
:func:`normalise_scores`). The conversions here are pure.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from agents_sdk.memory.items import MemoryItem, render_item, render_value
from agents_sdk.memory.working import WorkingItem
from blackboard.protocol.schemas.prune import PRUNE_STRATEGIES, PruneStrategy
from blackboard.protocol.schemas.search import MemoryHit, SearchMode

__all__ = [
    "LAYERS",
    "PRUNE_STRATEGIES",
    "HitCache",
    "Layer",
    "LayerHit",
    "PruneStrategy",
    "hit_of_item",
    "hit_of_memory",
    "hit_of_working",
    "item_kind",
    "item_text",
    "lexical_score",
    "merge_hits",
    "normalise_scores",
    "query_terms",
    "short_term_id",
    "working_id",
    "working_text",
]

Layer = Literal["short_term", "working", "long_term", "shared"]
LAYERS: tuple[Layer, ...] = ("short_term", "working", "long_term", "shared")
# PruneStrategy, PRUNE_STRATEGIES: how a prune picks what goes, the search service's
# strategies (blackboard.protocol.schemas.prune; docs/memory-lifecycle.md): lru (not used for
# threshold seconds), low_confidence (confidence below threshold), old_age (older than threshold
# seconds), importance (importance below threshold), max_per_board (all but the newest threshold).

#: The prefixes of local ids: ``st:<episode id>:<item id>`` and ``wm:<key>``.
SHORT_TERM_PREFIX: Final = "st:"
WORKING_PREFIX: Final = "wm:"


@dataclass(frozen=True, slots=True)
class LayerHit:
    """One hit of ``agent.memory.search`` or of an attached store (a
    :class:`~agents_sdk.memory.prompt.RecalledMemoryLike`, so the prompt renders it).

    Attributes:
        layer: a :data:`Layer`, or ``"store:<name>"`` for an attached store's hit.
        id: ``st:<episode id>:<item id>`` (short_term), ``wm:<key>`` (working), the
            memory id (long_term, shared) or the store's item id.
        text: what it says.
        score: relevance 0..1, normalised per layer (docs/memory.md).
        kind: the memory kind, ``"step"``, ``"note"``, ``"file"``, ``"log"``...
        source: where it is: ``"short_term"``, ``"working"``, a board, a store name.
        provenance: who and where, e.g. ``{"agent", "board", "episode", "step", "path"}``.
        created_at: when it was written (None: unknown).
        metadata: the memory's metadata.
    """

    layer: Layer | str
    id: str
    text: str
    score: float
    kind: str
    source: str
    provenance: Mapping[str, Any]
    created_at: datetime | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The hit as JSON-ready values (``created_at`` in ISO 8601)."""
        return {"layer": self.layer, "id": self.id, "text": self.text, "score": round(self.score, 4),
                "kind": self.kind, "source": self.source, "provenance": dict(self.provenance),
                "created_at": self.created_at.isoformat() if self.created_at is not None else None,
                "metadata": dict(self.metadata)}


def short_term_id(episode_id: str, item_id: int) -> str:
    """The id of a short-term item in hits: ``st:<episode id>:<item id>``."""
    return f"{SHORT_TERM_PREFIX}{episode_id}:{item_id}"


def working_id(key: str) -> str:
    """The id of a working note in hits: ``wm:<key>``."""
    return f"{WORKING_PREFIX}{key}"


_WORD: Final = re.compile(r"\w+", re.UNICODE)
#: Words too common to tell texts apart.
_STOP: Final = frozenset("""a an and are as at be by for from has have in is it its of on or that the this to was
were what when where which who with how do does did i we you they he she me my our your not no""".split())


def query_terms(text: str) -> frozenset[str]:
    """The distinct lowercase words of ``text`` that carry meaning (stop words and
    one-letter words left out)."""
    return frozenset(w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOP)


def lexical_score(terms: frozenset[str], text: str) -> float:
    """The relevance of ``text`` to a query of ``terms``: the share of the terms it holds,
    0..1 (the score of the local layers, which have no embeddings). No terms: 0."""
    if not terms:
        return 0.0
    return len(terms & query_terms(text)) / len(terms)


def item_text(item: MemoryItem) -> str:
    """What a short-term item says: its ``note`` (what ``agent.memory.write`` stored),
    else its rendering (:func:`~agents_sdk.memory.items.render_item`)."""
    note = item.extra.get("note")
    if isinstance(note, str):
        return note
    return render_item(item)


def working_text(item: WorkingItem) -> str:
    """What a working note says: ``<key>: <value>`` (a string value as it is)."""
    return f"{item.key}: {render_value(item.value)}"


def item_kind(item: MemoryItem) -> str:
    """A short-term item's kind: the ``kind`` it was written with, else ``"note"`` for a
    note (``agent.memory.write``), ``"step"`` for any other item."""
    kind = item.extra.get("kind")
    return kind if isinstance(kind, str) else ("note" if "note" in item.extra else "step")


def hit_of_item(item: MemoryItem, *, episode_id: str, task_id: str, score: float, agent: str) -> LayerHit:
    """A short-term item as a hit."""
    meta = item.extra.get("metadata")
    return LayerHit(
        layer="short_term", id=short_term_id(episode_id, item.id), text=item_text(item), score=score,
        kind=item_kind(item),
        source="short_term",
        provenance={"agent": agent, "task": task_id, "episode": episode_id, "step": item.step, "item": item.id},
        created_at=datetime.fromtimestamp(item.created_at, UTC),
        metadata=dict(meta) if isinstance(meta, Mapping) else {})


def hit_of_working(item: WorkingItem, *, episode_id: str, task_id: str, score: float, agent: str) -> LayerHit:
    """A working note as a hit (``created_at`` None: working memory keeps a monotonic clock)."""
    return LayerHit(layer="working", id=working_id(item.key), text=working_text(item), score=score, kind=item.kind,
                    source="working",
                    provenance={"agent": agent, "task": task_id, "episode": episode_id, "key": item.key})


def hit_of_memory(hit: MemoryHit, *, layer: Layer | str, score: float | None = None) -> LayerHit:
    """A long-term memory hit of the search service as a hit of ``layer`` (``score``: its
    normalised relevance; default the hit's score clamped to 0..1)."""
    provenance: dict[str, Any] = {"agent": hit.agent, "board": hit.board, "revision": hit.revision,
                                  "verdict": str(hit.verdict.value if hasattr(hit.verdict, "value") else hit.verdict)}
    for name in ("key", "confidence", "source", "superseded_by", "archived_at"):
        value = getattr(hit, name)
        if value is not None:
            provenance[name] = value.isoformat() if isinstance(value, datetime) else value
    if hit.tags:
        provenance["tags"] = list(hit.tags)
    return LayerHit(layer=layer, id=hit.id, text=hit.text,
                    score=min(1.0, max(0.0, hit.score if score is None else score)),
                    kind=hit.kind, source=hit.board, provenance=provenance, created_at=hit.created_at,
                    metadata=dict(hit.metadata))


def normalise_scores(hits: Sequence[MemoryHit], mode: SearchMode) -> list[float]:
    """The relevance 0..1 of the search service's hits of one layer: a hybrid score (a
    weighted mean of min-max normalised scores, plus neighbour and thread bonuses) and a
    semantic one (cosine similarity) clamped to 0..1; a keyword score (unbounded rank)
    divided by the best of the layer's hits."""
    if mode == "keyword":
        best = max((h.score for h in hits), default=0.0)
        return [h.score / best if best > 0 else 0.0 for h in hits]
    return [min(1.0, max(0.0, h.score)) for h in hits]


def merge_hits(groups: Iterable[Sequence[LayerHit]], top_k: int) -> list[LayerHit]:
    """One ranked list of the layers' hits: by score, best first; a tie in layer order
    (:data:`LAYERS`), then the layer's own order (newest first for the local layers); an id found in two layers kept once (its first
    layer's hit, e.g. an own memory on a shared board counts as long_term)."""
    order: dict[str, int] = {name: i for i, name in enumerate(LAYERS)}
    seen: set[str] = set()
    flat: list[tuple[int, LayerHit]] = []
    for hits in groups:
        for hit in hits:
            flat.append((order.get(hit.layer, len(LAYERS)), hit))
    flat.sort(key=lambda pair: pair[0])  # stable: each layer's own order kept
    unique: list[LayerHit] = []
    for _, hit in flat:
        if hit.id in seen:
            continue
        seen.add(hit.id)
        unique.append(hit)
    unique.sort(key=lambda h: (-h.score, order.get(h.layer, len(LAYERS))))  # stable: a layer's order on ties
    return unique[:top_k]


class HitCache:
    """The long-term layers' search results, reused for ``ttl`` seconds (``agent_memory.cache_ttl``),
    at most ``size`` of them (``cache_size``), the least recently used out. ``ttl`` or ``size``
    0: nothing is kept, and lookups are not counted. Pure: the clock is injected.
    """

    def __init__(self, ttl: float, size: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, tuple[LayerHit, ...]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.ttl > 0 and self.size > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> list[LayerHit] | None:
        """The hits cached under ``key`` while fresh (a hit), else None (a miss)."""
        if not self.enabled:
            return None
        found = self._entries.get(key)
        if found is not None and found[0] > self._clock():
            self._entries.move_to_end(key)
            self.hits += 1
            return list(found[1])
        if found is not None:
            del self._entries[key]
        self.misses += 1
        return None

    def put(self, key: Hashable, hits: Sequence[LayerHit]) -> None:
        if not self.enabled:
            return
        self._entries[key] = (self._clock() + self.ttl, tuple(hits))
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
