"""Condensation: when a history outgrows a budget, forget (and summarise) its middle.

A condenser looks at a *view* (a sequence of :data:`ViewItem`) and returns
:class:`CondensationEvent` records: which ids were forgotten, the summary text
(if any), where in the resulting view the summary goes. The events are the
source of truth: :func:`apply_events` replays them on the original history and
gives back exactly the condensed view, so a condensed history can be stored as
``(items, events)`` and reproduced.

Condensers compose: :class:`CondenserPipeline` runs each on the view left by
the previous one. Selection logic is pure and synchronous; the only IO is the
:class:`Summarizer` the LLM condenser is given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agents_sdk.memory.items import ItemId, Summary, ViewItem
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError

__all__ = [
    "CondensationEvent",
    "CondensedHistory",
    "Condenser",
    "CondenserPipeline",
    "LLMSummarizingCondenser",
    "RollingWindowCondenser",
    "Summarizer",
    "apply_events",
    "summary_id",
]


@dataclass(frozen=True, slots=True)
class CondensationEvent:
    """One condensation step.

    Attributes:
        forgotten_ids: Ids of the view items removed, in view order.
        summary: The summary text inserted in their place, ``None`` for none.
        summary_offset: Index of the summary in the view after the removal.
        summary_id: Id of the inserted :class:`Summary` (see :func:`summary_id`).
    """

    forgotten_ids: tuple[ItemId, ...]
    summary: str | None = None
    summary_offset: int | None = None
    summary_id: str | None = None

    def __post_init__(self) -> None:
        if self.summary is not None and (self.summary_offset is None or self.summary_offset < 0):
            raise InvalidPayloadError("a summary needs a non-negative summary_offset")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "forgotten_ids": list(self.forgotten_ids),
            "summary": self.summary,
            "summary_offset": self.summary_offset,
            "summary_id": self.summary_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CondensationEvent:
        """Inverse of :meth:`to_dict`.

        Raises:
            InvalidPayloadError: malformed data.
        """
        ids = data.get("forgotten_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, str) or (isinstance(i, int) and not isinstance(i, bool)) for i in ids
        ):
            raise InvalidPayloadError("forgotten_ids must be a list of int or str ids")
        summary, offset, sid = (
            data.get("summary"),
            data.get("summary_offset"),
            data.get("summary_id"),
        )
        if summary is not None and not isinstance(summary, str):
            raise InvalidPayloadError("summary must be a string")
        if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
            raise InvalidPayloadError("summary_offset must be an integer")
        if sid is not None and not isinstance(sid, str):
            raise InvalidPayloadError("summary_id must be a string")
        return cls(tuple(ids), summary, offset, sid)


def summary_id(forgotten_ids: Sequence[ItemId]) -> str:
    """Deterministic id of the summary replacing ``forgotten_ids``.

    An id can be forgotten only once along a chain of events, so the ids of
    the summaries of one history never collide.
    """
    digest = hashlib.blake2b(repr(tuple(forgotten_ids)).encode(), digest_size=8).hexdigest()
    return f"summary-{digest}"


def apply_events(
    history: Iterable[ViewItem], events: Iterable[CondensationEvent]
) -> list[ViewItem]:
    """Replay condensation events on a history: the condensed view.

    For each event in order: drop the items whose id is in ``forgotten_ids``
    (ids no longer present are ignored, e.g. items already evicted), then
    insert ``Summary(summary_id, summary, len(forgotten_ids))`` at
    ``summary_offset`` (clamped to the view's length). Items appended to the
    history after the events were recorded stay at the end.
    """
    view = list(history)
    for event in events:
        forgotten = set(event.forgotten_ids)
        if forgotten:
            view = [item for item in view if item.id not in forgotten]
        if event.summary is not None:
            sid = event.summary_id or summary_id(event.forgotten_ids)
            offset = min(event.summary_offset or 0, len(view))
            view.insert(offset, Summary(sid, event.summary, len(event.forgotten_ids)))
    return view


@runtime_checkable
class Condenser(Protocol):
    """Anything that condenses a view into zero or more events."""

    async def condense(self, view: Sequence[ViewItem]) -> list[CondensationEvent]:
        """Events that condense ``view`` (empty when it is within budget)."""
        ...


@runtime_checkable
class Summarizer(Protocol):
    """Turns view items into one summary text (the LLM swap point)."""

    async def summarize(self, items: Sequence[ViewItem]) -> str:
        """A summary of ``items`` (which may include earlier summaries)."""
        ...


def _middle(view: Sequence[ViewItem], keep_first: int, keep_last: int) -> list[ItemId]:
    end = len(view) - keep_last
    return [item.id for item in view[keep_first:end]] if end > keep_first else []


class RollingWindowCondenser:
    """Keeps the first ``keep_first`` and the last ``keep_last`` items, forgets the middle.

    Triggered when the view holds more than ``max_size`` items (by default
    ``keep_first + keep_last``). No summary is inserted.

    Raises:
        ConfigurationError: negative counts, or ``max_size`` below
            ``keep_first + keep_last``.
    """

    def __init__(self, *, keep_first: int = 1, keep_last: int = 20, max_size: int | None = None):
        if keep_first < 0 or keep_last < 0:
            raise ConfigurationError("keep_first and keep_last must not be negative")
        max_size = keep_first + keep_last if max_size is None else max_size
        if max_size < keep_first + keep_last:
            raise ConfigurationError("max_size must be at least keep_first + keep_last")
        self.keep_first = keep_first
        self.keep_last = keep_last
        self.max_size = max_size

    def plan(self, view: Sequence[ViewItem]) -> CondensationEvent | None:
        """The event condensing ``view``, or ``None`` if within ``max_size`` (pure)."""
        if len(view) <= self.max_size:
            return None
        forgotten = _middle(view, self.keep_first, self.keep_last)
        return CondensationEvent(tuple(forgotten)) if forgotten else None

    async def condense(self, view: Sequence[ViewItem]) -> list[CondensationEvent]:
        """:meth:`plan` as a :class:`Condenser`."""
        event = self.plan(view)
        return [] if event is None else [event]

    def __repr__(self) -> str:
        return (
            f"RollingWindowCondenser(keep_first={self.keep_first}, "
            f"keep_last={self.keep_last}, max_size={self.max_size})"
        )


class LLMSummarizingCondenser:
    """Summarises the middle of a view that grew past ``max_size`` items.

    Keeps the first ``keep_first`` and last ``keep_last`` items, asks the
    :class:`Summarizer` for a summary of the items between (earlier summaries
    included, so knowledge carries forward) and inserts it at ``keep_first``.

    Args:
        summarizer: Produces the summary text (e.g. ``OpenAISummarizer``).
        max_size: The view length that triggers condensation when exceeded.
        keep_first: Items kept at the head (the task, the first observation...).
        keep_last: Items kept at the tail (default ``max_size // 2``).

    Raises:
        ConfigurationError: negative counts, or ``keep_first + keep_last``
            not below ``max_size``.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        max_size: int = 40,
        keep_first: int = 1,
        keep_last: int | None = None,
    ) -> None:
        keep_last = max_size // 2 if keep_last is None else keep_last
        if keep_first < 0 or keep_last < 0:
            raise ConfigurationError("keep_first and keep_last must not be negative")
        if keep_first + keep_last >= max_size:
            raise ConfigurationError("keep_first + keep_last must be below max_size")
        self.summarizer = summarizer
        self.max_size = max_size
        self.keep_first = keep_first
        self.keep_last = keep_last

    def select(self, view: Sequence[ViewItem]) -> list[ViewItem]:
        """The items to summarise and forget (empty when within budget; pure)."""
        if len(view) <= self.max_size:
            return []
        return list(view[self.keep_first : len(view) - self.keep_last])

    def event_for(self, forgotten: Sequence[ViewItem], summary: str) -> CondensationEvent:
        """The event recording ``summary`` in place of ``forgotten`` (pure)."""
        ids = tuple(item.id for item in forgotten)
        return CondensationEvent(ids, summary, self.keep_first, summary_id(ids))

    async def condense(self, view: Sequence[ViewItem]) -> list[CondensationEvent]:
        """Summarise the middle of ``view`` if it is over ``max_size``.

        Raises:
            LLMError: the summarizer failed (from ``OpenAISummarizer``).
        """
        forgotten = self.select(view)
        if not forgotten:
            return []
        text = await self.summarizer.summarize(forgotten)
        return [self.event_for(forgotten, text)]

    def __repr__(self) -> str:
        return (
            f"LLMSummarizingCondenser(max_size={self.max_size}, "
            f"keep_first={self.keep_first}, keep_last={self.keep_last})"
        )


class CondenserPipeline:
    """Runs condensers in order, each on the view the previous ones left.

    A pipeline is itself a :class:`Condenser`, so pipelines nest.
    """

    def __init__(self, *condensers: Condenser) -> None:
        self.condensers = condensers

    async def condense(self, view: Sequence[ViewItem]) -> list[CondensationEvent]:
        """Every stage's events, in order."""
        events: list[CondensationEvent] = []
        current = list(view)
        for condenser in self.condensers:
            produced = await condenser.condense(current)
            if produced:
                events.extend(produced)
                current = apply_events(current, produced)
        return events

    def __repr__(self) -> str:
        return f"CondenserPipeline{self.condensers!r}"


class CondensedHistory:
    """The events recorded for one growing history, and its condensed view.

    Args:
        condenser: Run by :meth:`condense`.
        events: Events recorded earlier (e.g. loaded with :meth:`events_from_dicts`).
    """

    def __init__(self, condenser: Condenser, events: Iterable[CondensationEvent] = ()) -> None:
        self.condenser = condenser
        self.events: list[CondensationEvent] = list(events)

    def view(self, history: Iterable[ViewItem]) -> list[ViewItem]:
        """The condensed view of ``history`` (pure replay of the recorded events)."""
        return apply_events(history, self.events)

    async def condense(self, history: Iterable[ViewItem]) -> list[ViewItem]:
        """Condense the current view if needed, record the new events, return the view."""
        view = self.view(history)
        new = await self.condenser.condense(view)
        self.events.extend(new)
        return apply_events(view, new)

    def events_to_dicts(self) -> list[dict[str, Any]]:
        """The recorded events as JSON-ready dicts."""
        return [event.to_dict() for event in self.events]

    @staticmethod
    def events_from_dicts(data: Iterable[Mapping[str, Any]]) -> list[CondensationEvent]:
        """Inverse of :meth:`events_to_dicts`.

        Raises:
            InvalidPayloadError: malformed data.
        """
        return [CondensationEvent.from_dict(d) for d in data]
