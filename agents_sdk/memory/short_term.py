"""Short-term memory: a bounded, indexed, local log of what an agent did.

Pure and synchronous; nothing here touches the network.

Bounds and eviction: after every add the memory evicts its *oldest* items
(lowest id, i.e. first added) until it holds at most ``max_items`` items and at
most ``max_bytes`` bytes, where an item's bytes are the UTF-8 length of its
compact JSON encoding (:attr:`MemoryItem.nbytes`). An item larger than
``max_bytes`` on its own is refused with ``PayloadTooLargeError``.

Tag-weighted retrieval: an item's score for weights ``{tag: w}`` is the sum of
the weights of the queried tags it carries. Candidates are the items carrying
at least one tag of positive weight (negative weights only lower scores; zero
and unknown tags do nothing). The best item is the highest-scoring one, ties
broken by recency (highest id). Weights are summed in a fixed order (positive
ones, then negative ones, each by tag name), so the same tags always give the
same float.

Costs: ``add``, ``latest``, eviction and ``delete`` take constant time in the
number of items held (``add`` encodes the new item once to measure it);
``recent(n)`` is O(n). Tags are indexed in two levels, tag -> tag sets
-> item ids (newest last), so :meth:`ShortTermMemory.best` costs O(number of
distinct tag sets carrying a queried tag), independent of the item count.
Filtering by steps or tags uses the indexes; filtering by field names alone
scans.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from agents_sdk.memory.items import (
    MemoryItem,
    decode_json_value,
    encode_json_value,
    make_item,
    normalize_tags,
)
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, PayloadTooLargeError

__all__ = ["ShortTermMemory"]

_TagSet = frozenset[str]


def _canonical(weights: Mapping[str, float]) -> list[tuple[str, float]]:
    """Non-zero weights, positive ones first, each group sorted by tag.

    Scores are summed in this order, so a tag set's score does not depend on
    the iteration order of sets or of the caller's mapping.
    """
    for tag, weight in weights.items():
        if not isinstance(weight, int | float) or not math.isfinite(weight):
            raise InvalidPayloadError(f"weight of tag {tag!r} must be a finite number")
    positive = sorted((t, float(w)) for t, w in weights.items() if w > 0)
    negative = sorted((t, float(w)) for t, w in weights.items() if w < 0)
    return positive + negative


def _score(tags: Iterable[str], weights: Mapping[str, float]) -> float:
    tagset = frozenset(tags)
    total = 0.0
    for tag, weight in _canonical(weights):
        if tag in tagset:
            total += weight
    return total


class ShortTermMemory:
    """Bounded execution history of one agent (steps, actions, observations...).

    Args:
        max_items: Most items kept (``None``: unbounded).
        max_bytes: Most bytes kept, summed over :attr:`MemoryItem.nbytes`
            (``None``: unbounded).
        clock: Returns the current time in seconds (``time.time`` by default;
            inject a fake in tests).
        on_evict: Called with each item evicted by the bounds (not on
            ``delete``/``clear``), e.g. to consolidate it into long-term memory.

    Raises:
        ConfigurationError: a bound is smaller than 1.
    """

    def __init__(
        self,
        *,
        max_items: int | None = 1000,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        on_evict: Callable[[MemoryItem], None] | None = None,
    ) -> None:
        if max_items is not None and max_items < 1:
            raise ConfigurationError(f"max_items must be at least 1, got {max_items}")
        if max_bytes is not None and max_bytes < 1:
            raise ConfigurationError(f"max_bytes must be at least 1, got {max_bytes}")
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._clock = clock
        self._on_evict = on_evict
        self._items: OrderedDict[int, MemoryItem] = OrderedDict()
        self._by_step: dict[int, dict[int, None]] = {}
        self._by_tagset: dict[_TagSet, OrderedDict[int, None]] = {}
        self._tagsets_by_tag: dict[str, dict[_TagSet, None]] = {}
        self._nbytes = 0
        self._next_id = 1
        self._last_step = 0

    # -- properties ---------------------------------------------------------

    @property
    def max_items(self) -> int | None:
        """The item-count bound."""
        return self._max_items

    @property
    def max_bytes(self) -> int | None:
        """The byte bound."""
        return self._max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes held, the sum of the items' :attr:`MemoryItem.nbytes`."""
        return self._nbytes

    @property
    def last_step(self) -> int:
        """Highest step number added so far (0 before any); survives eviction and clear."""
        return self._last_step

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[MemoryItem]:
        """Items oldest first."""
        return iter(list(self._items.values()))

    def __reversed__(self) -> Iterator[MemoryItem]:
        """Items newest first."""
        return iter(list(reversed(self._items.values())))

    def __contains__(self, item: object) -> bool:
        if isinstance(item, MemoryItem):
            return self._items.get(item.id) is item
        return isinstance(item, int) and item in self._items

    def __repr__(self) -> str:
        return (
            f"ShortTermMemory(items={len(self)}, bytes={self._nbytes}, "
            f"max_items={self._max_items}, max_bytes={self._max_bytes})"
        )

    # -- writing ------------------------------------------------------------

    def add(
        self,
        *,
        step: int | None = None,
        action: Any = None,
        arguments: Any = None,
        observation: Any = None,
        result: Any = None,
        cost: Any = None,
        error: Any = None,
        tags: Iterable[str] | str = (),
        **extra: Any,
    ) -> MemoryItem:
        """Append an item, then evict the oldest items beyond the bounds.

        Args:
            step: The step number; by default one more than :attr:`last_step`.
            action: What the agent did.
            arguments: The action's arguments.
            observation: What it observed.
            result: The step's outcome.
            cost: The step's cost.
            error: The step's error.
            tags: Labels for retrieval.
            **extra: Custom fields (JSON values or bytes).

        Returns:
            The stored item (with its id, step, creation time and size).

        Raises:
            InvalidPayloadError: a value is not JSON-encodable, a tag is not a
                non-empty string, or a custom field name is reserved.
            PayloadTooLargeError: the item alone exceeds ``max_bytes``.
        """
        if step is None:
            step = self._last_step + 1
        elif not isinstance(step, int) or isinstance(step, bool):
            raise InvalidPayloadError(f"step must be an integer, got {step!r}")
        standard = {
            "action": action,
            "arguments": arguments,
            "observation": observation,
            "result": result,
            "cost": cost,
            "error": error,
        }
        extra = {k: v for k, v in extra.items() if v is not None}
        item = make_item(
            self._next_id, step, float(self._clock()), normalize_tags(tags), standard, extra
        )
        self._store(item)
        return item

    def _store(self, item: MemoryItem) -> None:
        if self._max_bytes is not None and item.nbytes > self._max_bytes:
            raise PayloadTooLargeError(item.nbytes, self._max_bytes)
        self._next_id = max(self._next_id, item.id + 1)
        self._last_step = max(self._last_step, item.step)
        self._items[item.id] = item
        self._nbytes += item.nbytes
        self._by_step.setdefault(item.step, {})[item.id] = None
        if item.tags:
            tagset = frozenset(item.tags)
            group = self._by_tagset.get(tagset)
            if group is None:
                group = self._by_tagset[tagset] = OrderedDict()
                for tag in tagset:
                    self._tagsets_by_tag.setdefault(tag, {})[tagset] = None
            group[item.id] = None
        self._evict()

    def _evict(self) -> None:
        max_items, max_bytes = self._max_items, self._max_bytes
        while (max_items is not None and len(self._items) > max_items) or (
            max_bytes is not None and self._nbytes > max_bytes
        ):
            _, item = self._items.popitem(last=False)
            self._unindex(item)
            if self._on_evict is not None:
                self._on_evict(item)

    def _unindex(self, item: MemoryItem) -> None:
        self._nbytes -= item.nbytes
        ids = self._by_step[item.step]
        del ids[item.id]
        if not ids:
            del self._by_step[item.step]
        if item.tags:
            tagset = frozenset(item.tags)
            group = self._by_tagset[tagset]
            del group[item.id]
            if not group:
                del self._by_tagset[tagset]
                for tag in tagset:
                    sets = self._tagsets_by_tag[tag]
                    del sets[tagset]
                    if not sets:
                        del self._tagsets_by_tag[tag]

    def delete(self, item_id: int) -> bool:
        """Remove one item by id; ``False`` if it is not held."""
        item = self._items.pop(item_id, None)
        if item is None:
            return False
        self._unindex(item)
        return True

    def delete_step(self, step: int) -> int:
        """Remove every item of ``step``; returns how many were removed."""
        ids = list(self._by_step.get(step, ()))
        for item_id in ids:
            self._unindex(self._items.pop(item_id))
        return len(ids)

    def clear(self) -> None:
        """Remove every item (ids and step numbers keep counting up)."""
        self._items.clear()
        self._by_step.clear()
        self._by_tagset.clear()
        self._tagsets_by_tag.clear()
        self._nbytes = 0

    # -- reading ------------------------------------------------------------

    def get(self, item_id: int) -> MemoryItem | None:
        """The item with this id, if held."""
        return self._items.get(item_id)

    def latest(self) -> MemoryItem | None:
        """The newest item, ``None`` when empty."""
        if not self._items:
            return None
        return self._items[next(reversed(self._items))]

    def recent(self, n: int) -> list[MemoryItem]:
        """The ``n`` newest items, oldest first (fewer if fewer are held)."""
        if n <= 0:
            return []
        out = list(itertools.islice(reversed(self._items.values()), n))
        out.reverse()
        return out

    def items(self) -> list[MemoryItem]:
        """Every item, oldest first."""
        return list(self._items.values())

    def steps(self) -> list[int]:
        """The step numbers held, ascending."""
        return sorted(self._by_step)

    def tags(self) -> list[str]:
        """The tags held, sorted."""
        return sorted(self._tagsets_by_tag)

    def filter(
        self,
        *,
        fields: Iterable[str] | None = None,
        steps: Iterable[int] | None = None,
        tags: Iterable[str] | None = None,
        all_tags: bool = False,
    ) -> list[MemoryItem]:
        """Items matching every given criterion, oldest first.

        Args:
            fields: Keep items where each of these fields is set (not ``None``).
            steps: Keep items whose step is one of these.
            tags: Keep items carrying any of these tags (all of them with
                ``all_tags``).
            all_tags: See ``tags``.
        """
        ids: set[int] | None = None
        if steps is not None:
            ids = set()
            for step in set(steps):
                ids.update(self._by_step.get(step, ()))
        if tags is not None:
            wanted = frozenset(tags)
            tag_ids: set[int] = set()
            for tagset in self._tagsets_for(wanted):
                if not all_tags or wanted <= tagset:
                    tag_ids.update(self._by_tagset[tagset])
            ids = tag_ids if ids is None else ids & tag_ids
        if ids is None:
            candidates: Iterable[MemoryItem] = self._items.values()
        else:
            candidates = (self._items[i] for i in sorted(ids))
        names = tuple(fields or ())
        return [it for it in candidates if all(it.get(n) is not None for n in names)]

    def _tagsets_for(self, tags: Iterable[str]) -> set[_TagSet]:
        out: set[_TagSet] = set()
        for tag in tags:
            out.update(self._tagsets_by_tag.get(tag, ()))
        return out

    # -- tag-weighted retrieval ----------------------------------------------

    def _scored_groups(self, weights: Mapping[str, float]) -> dict[_TagSet, float]:
        scores: dict[_TagSet, float] = {}
        for tag, weight in _canonical(weights):
            groups = self._tagsets_by_tag.get(tag, ())
            if weight > 0:
                for tagset in groups:
                    scores[tagset] = scores.get(tagset, 0.0) + weight
            else:
                for tagset in groups:
                    if tagset in scores:
                        scores[tagset] += weight
        return scores

    def score(self, item: MemoryItem, weights: Mapping[str, float]) -> float:
        """An item's score for ``weights`` (sum of the weights of its tags).

        Raises:
            InvalidPayloadError: a weight is not a finite number.
        """
        return _score(item.tags, weights)

    def best(self, weights: Mapping[str, float]) -> MemoryItem | None:
        """The best-scoring item for ``{tag: weight}``, the newest on ties.

        Returns ``None`` when no item carries a tag of positive weight.

        Raises:
            InvalidPayloadError: a weight is not a finite number.
        """
        scored = self._scored_groups(weights)
        if not scored:
            return None
        top = max(scored.values())
        newest = max(next(reversed(self._by_tagset[ts])) for ts, s in scored.items() if s == top)
        return self._items[newest]

    def best_all(self, weights: Mapping[str, float]) -> list[MemoryItem]:
        """Every item sharing the best score, newest first.

        Raises:
            InvalidPayloadError: a weight is not a finite number.
        """
        scored = self._scored_groups(weights)
        if not scored:
            return []
        top = max(scored.values())
        ids: list[int] = []
        for tagset, score in scored.items():
            if score == top:
                ids.extend(self._by_tagset[tagset])
        ids.sort(reverse=True)
        return [self._items[i] for i in ids]

    def rank(
        self, weights: Mapping[str, float], limit: int | None = None
    ) -> list[tuple[float, MemoryItem]]:
        """Candidates as ``(score, item)``, best first, newest first on ties.

        Lazy: with a ``limit`` only the needed items are visited.

        Raises:
            InvalidPayloadError: a weight is not a finite number.
        """
        scored = sorted(self._scored_groups(weights).items(), key=lambda pair: -pair[1])
        out: list[tuple[float, MemoryItem]] = []
        for score, tier in itertools.groupby(scored, key=lambda pair: pair[1]):
            streams = [reversed(self._by_tagset[ts]) for ts, _ in tier]
            for item_id in heapq.merge(*streams, reverse=True):
                if limit is not None and len(out) >= limit:
                    return out
                out.append((score, self._items[item_id]))
        return out

    # -- serialisation ------------------------------------------------------

    def to_dicts(self) -> list[dict[str, Any]]:
        """Every item as :meth:`MemoryItem.to_dict`, oldest first."""
        return [item.to_dict() for item in self._items.values()]

    def to_json(self) -> str:
        """JSON array of :meth:`to_dicts` (``bytes`` as ``{"__bytes__": base64}``)."""
        return encode_json_value(self.to_dicts())

    @classmethod
    def from_dicts(
        cls,
        data: Iterable[Mapping[str, Any]],
        *,
        max_items: int | None = 1000,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        on_evict: Callable[[MemoryItem], None] | None = None,
    ) -> ShortTermMemory:
        """A memory holding the given items (ids, steps, tags and times kept).

        Items are loaded in id order and the bounds applied as if added.

        Raises:
            InvalidPayloadError: a malformed item or a duplicate id.
            PayloadTooLargeError: an item alone exceeds ``max_bytes``.
        """
        memory = cls(max_items=max_items, max_bytes=max_bytes, clock=clock, on_evict=on_evict)
        items = sorted((MemoryItem.from_dict(d) for d in data), key=lambda it: it.id)
        for prev, item in itertools.pairwise(items):
            if prev.id == item.id:
                raise InvalidPayloadError(f"duplicate memory item id {item.id}")
        for item in items:
            memory._store(item)
        return memory

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        max_items: int | None = 1000,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        on_evict: Callable[[MemoryItem], None] | None = None,
    ) -> ShortTermMemory:
        """Inverse of :meth:`to_json` (same arguments as :meth:`from_dicts`).

        Raises:
            InvalidPayloadError: invalid JSON or a malformed item.
        """
        data = decode_json_value(text)
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise InvalidPayloadError("short-term memory JSON must be an array of objects")
        return cls.from_dicts(
            data, max_items=max_items, max_bytes=max_bytes, clock=clock, on_evict=on_evict
        )
