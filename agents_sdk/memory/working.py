"""Working memory: a scratchpad of the reasoning in progress, whose items expire.

Each item (the current goal, a reasoning step, a hypothesis, the focus, a note)
carries a time-to-live. Expiry is lazy: every read first drops the items whose
deadline has passed (``now >= expires_at``, by the injected clock), so no
timer or task is involved. Writing an item again (``set``) or ``touch`` sets
its deadline anew from the current time; an item keeps the position of its
first write in listings.
"""

from __future__ import annotations

import enum
import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, NotFoundError

__all__ = [
    "FOCUS",
    "GOAL",
    "HYPOTHESIS",
    "NOTE",
    "REASONING",
    "DefaultTTL",
    "WorkingItem",
    "WorkingMemory",
]

#: Conventional kinds (any string is accepted).
GOAL: Final = "goal"
FOCUS: Final = "focus"
REASONING: Final = "reasoning"
HYPOTHESIS: Final = "hypothesis"
NOTE: Final = "note"


class DefaultTTL(enum.Enum):
    """Marker for "use the memory's ``default_ttl``"."""

    DEFAULT = "default"


_DEFAULT: Final = DefaultTTL.DEFAULT


@dataclass(frozen=True, slots=True)
class WorkingItem:
    """One scratchpad entry.

    Attributes:
        key: Unique key within the memory.
        value: Any value (rendered as text in prompts).
        kind: ``goal``, ``focus``, ``reasoning``, ``hypothesis``, ``note`` or any string.
        created_at: Clock reading of the first write.
        updated_at: Clock reading of the last write or touch.
        expires_at: Deadline (clock reading), ``None`` for no expiry.
        seq: Order of the first write (listings sort by it).
    """

    key: str
    value: Any
    kind: str
    created_at: float
    updated_at: float
    expires_at: float | None
    seq: int

    def remaining(self, now: float) -> float | None:
        """Seconds left at clock reading ``now`` (``None`` without expiry)."""
        return None if self.expires_at is None else max(0.0, self.expires_at - now)


class WorkingMemory:
    """A scratchpad whose items expire after their time-to-live.

    Args:
        default_ttl: Seconds an item lives when written without a ``ttl``
            (``None``: items never expire by default).
        clock: Returns seconds (``time.monotonic`` by default; inject a fake in tests).

    Raises:
        ConfigurationError: ``default_ttl`` is not positive.
    """

    def __init__(
        self,
        *,
        default_ttl: float | None = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if default_ttl is not None and not default_ttl > 0:
            raise ConfigurationError(f"default_ttl must be positive, got {default_ttl}")
        self._default_ttl = default_ttl
        self._clock = clock
        self._items: dict[str, WorkingItem] = {}
        # (expires_at, seq_of_write, key); entries whose write was superseded are stale.
        self._deadlines: list[tuple[float, int, str]] = []
        self._writes: dict[str, int] = {}
        self._seq = 0
        self._counters: dict[str, int] = {}

    def _ttl(self, ttl: float | DefaultTTL | None) -> float | None:
        if ttl is _DEFAULT:
            return self._default_ttl
        if ttl is not None and (
            not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0
        ):
            raise InvalidPayloadError(f"ttl must be a positive number of seconds, got {ttl!r}")
        return ttl

    def expire(self) -> list[WorkingItem]:
        """Drop the items whose deadline has passed; returns them, soonest first."""
        now = self._clock()
        dropped: list[WorkingItem] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, write, key = heapq.heappop(heap)
            if self._writes.get(key) == write:
                dropped.append(self._items.pop(key))
                del self._writes[key]
        return dropped

    def _write(
        self, key: str, value: Any, kind: str, ttl: float | DefaultTTL | None
    ) -> WorkingItem:
        if not isinstance(key, str) or not key:
            raise InvalidPayloadError(f"working memory keys must be non-empty strings, got {key!r}")
        seconds = self._ttl(ttl)
        self.expire()
        now = self._clock()
        self._seq += 1
        old = self._items.get(key)
        item = WorkingItem(
            key=key,
            value=value,
            kind=kind,
            created_at=old.created_at if old else now,
            updated_at=now,
            expires_at=None if seconds is None else now + seconds,
            seq=old.seq if old else self._seq,
        )
        self._items[key] = item
        self._writes[key] = self._seq
        if item.expires_at is not None:
            heapq.heappush(self._deadlines, (item.expires_at, self._seq, key))
        return item

    def set(
        self,
        key: str,
        value: Any,
        *,
        kind: str | None = None,
        ttl: float | DefaultTTL | None = _DEFAULT,
    ) -> WorkingItem:
        """Write ``key`` (creating or replacing it) and set its deadline to now + ``ttl``.

        Args:
            key: The item's key.
            value: Its value.
            kind: Its kind; defaults to the key (so ``set("goal", ...)`` is a goal).
            ttl: Seconds to live; ``None`` never expires; default ``default_ttl``.

        Raises:
            InvalidPayloadError: an empty key or a non-positive ttl.
        """
        return self._write(key, value, key if kind is None else kind, ttl)

    def append(
        self, kind: str, value: Any, *, ttl: float | DefaultTTL | None = _DEFAULT
    ) -> WorkingItem:
        """Add a new item of ``kind`` under a fresh key ``"<kind>-<n>"``.

        Raises:
            InvalidPayloadError: a non-positive ttl.
        """
        while True:
            n = self._counters.get(kind, 0) + 1
            self._counters[kind] = n
            key = f"{kind}-{n}"
            if key not in self._items:
                return self._write(key, value, kind, ttl)

    def set_goal(self, value: Any, *, ttl: float | DefaultTTL | None = _DEFAULT) -> WorkingItem:
        """Set the current goal (key and kind ``goal``)."""
        return self._write(GOAL, value, GOAL, ttl)

    def set_focus(self, value: Any, *, ttl: float | DefaultTTL | None = _DEFAULT) -> WorkingItem:
        """Set the current focus (key and kind ``focus``)."""
        return self._write(FOCUS, value, FOCUS, ttl)

    def add_reasoning(
        self, value: Any, *, ttl: float | DefaultTTL | None = _DEFAULT
    ) -> WorkingItem:
        """Append a reasoning step (kind ``reasoning``)."""
        return self.append(REASONING, value, ttl=ttl)

    def add_hypothesis(
        self, value: Any, *, ttl: float | DefaultTTL | None = _DEFAULT
    ) -> WorkingItem:
        """Append a hypothesis (kind ``hypothesis``)."""
        return self.append(HYPOTHESIS, value, ttl=ttl)

    def touch(self, key: str, *, ttl: float | DefaultTTL | None = _DEFAULT) -> WorkingItem:
        """Keep ``key``'s value and set its deadline to now + ``ttl``.

        Raises:
            NotFoundError: no live item has this key.
            InvalidPayloadError: a non-positive ttl.
        """
        item = self.item(key)
        if item is None:
            raise NotFoundError(key, f"no live working memory item {key!r}")
        return self._write(key, item.value, item.kind, ttl)

    def item(self, key: str) -> WorkingItem | None:
        """The live item under ``key``."""
        self.expire()
        return self._items.get(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The live value under ``key``, ``default`` if absent or expired."""
        item = self.item(key)
        return default if item is None else item.value

    @property
    def goal(self) -> Any:
        """The live goal's value, or ``None``."""
        return self.get(GOAL)

    @property
    def focus(self) -> Any:
        """The live focus's value, or ``None``."""
        return self.get(FOCUS)

    def delete(self, key: str) -> bool:
        """Remove ``key``; ``False`` if there was no live item."""
        self.expire()
        if self._items.pop(key, None) is None:
            return False
        del self._writes[key]
        return True

    def clear(self) -> None:
        """Remove every item."""
        self._items.clear()
        self._writes.clear()
        self._deadlines.clear()

    def live(self, kind: str | None = None) -> list[WorkingItem]:
        """The live items (of ``kind`` if given), in order of first write."""
        self.expire()
        items = sorted(self._items.values(), key=lambda it: it.seq)
        return items if kind is None else [it for it in items if it.kind == kind]

    def __len__(self) -> int:
        self.expire()
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        self.expire()
        return key in self._items

    def __iter__(self) -> Iterator[WorkingItem]:
        return iter(self.live())

    def __repr__(self) -> str:
        return f"WorkingMemory(live={len(self)}, default_ttl={self._default_ttl})"
