"""Consolidation: send summaries and chosen items to long-term memory.

The long-term store is reached through an injected :class:`Remember` callable
(``agent.remember`` once an agent is connected), so this module does no IO of
its own. :func:`consolidation_requests` builds what will be sent (pure);
:func:`consolidate` sends it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents_sdk.memory.condense import CondensationEvent
from agents_sdk.memory.items import MemoryItem, Summary, normalize_tags, render_value
from blackboard.protocol.schemas import MemoryKind

__all__ = ["ConsolidationRequest", "Remember", "consolidate", "consolidation_requests"]


class Remember(Protocol):
    """Stores one long-term memory; may be sync or async (``agent.remember``)."""

    def __call__(
        self, text: str, *, kind: MemoryKind, tags: list[str], metadata: dict[str, Any]
    ) -> object:
        """Store ``text``; the return value (or awaited value) is passed back."""
        ...


@dataclass(frozen=True, slots=True)
class ConsolidationRequest:
    """One memory to store: the arguments of one ``remember`` call."""

    text: str
    kind: MemoryKind
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


def item_text(item: MemoryItem, max_field_chars: int | None = None) -> str:
    """The text stored for a memory item: one ``name: value`` line per set field."""
    lines = [
        f"{name}: {render_value(value, max_field_chars)}" for name, value in item.fields().items()
    ]
    return "\n".join(lines) or f"step {item.step}"


def consolidation_requests(
    *,
    summaries: Iterable[CondensationEvent | Summary] = (),
    items: Iterable[MemoryItem] = (),
    item_kind: MemoryKind = "episodic",
    summary_kind: MemoryKind = "summary",
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    max_field_chars: int | None = None,
) -> list[ConsolidationRequest]:
    """What :func:`consolidate` would store, summaries first (pure).

    Events without a summary (e.g. from a rolling window) are skipped. Items
    keep their own tags (after ``tags``) and carry ``source``, ``item_id``,
    ``step`` and ``created_at`` in their metadata; summaries carry ``source``,
    ``summary_id`` and, from events, ``forgotten_ids``. ``metadata`` is merged
    into every request.

    Raises:
        InvalidPayloadError: a tag is not a non-empty string.
    """
    common_tags = normalize_tags(tags)
    extra = dict(metadata or {})
    out: list[ConsolidationRequest] = []
    for summary in summaries:
        if isinstance(summary, CondensationEvent):
            if summary.summary is None:
                continue
            meta: dict[str, Any] = {
                "source": "condensation",
                "summary_id": summary.summary_id,
                "forgotten_ids": list(summary.forgotten_ids),
            }
            text = summary.summary
        else:
            meta = {"source": "condensation", "summary_id": summary.id, "count": summary.count}
            text = summary.text
        if text.strip():
            out.append(ConsolidationRequest(text, summary_kind, common_tags, {**meta, **extra}))
    for item in items:
        meta = {
            "source": "short_term",
            "item_id": item.id,
            "step": item.step,
            "created_at": item.created_at,
        }
        out.append(
            ConsolidationRequest(
                item_text(item, max_field_chars),
                item_kind,
                normalize_tags((*common_tags, *item.tags)),
                {**meta, **extra},
            )
        )
    return out


async def consolidate(
    remember: Remember,
    *,
    summaries: Iterable[CondensationEvent | Summary] = (),
    items: Iterable[MemoryItem] = (),
    item_kind: MemoryKind = "episodic",
    summary_kind: MemoryKind = "summary",
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    max_field_chars: int | None = None,
) -> list[object]:
    """Store summaries and items in long-term memory through ``remember``.

    Calls ``remember(text, kind=..., tags=[...], metadata={...})`` once per
    :func:`consolidation_requests` entry, in order, awaiting it when it
    returns an awaitable.

    Returns:
        What each call returned (e.g. the memory ids), in order.

    Raises:
        InvalidPayloadError: a tag is not a non-empty string.
        Exception: whatever ``remember`` raises (the remaining requests are not sent).
    """
    results: list[object] = []
    for request in consolidation_requests(
        summaries=summaries,
        items=items,
        item_kind=item_kind,
        summary_kind=summary_kind,
        tags=tags,
        metadata=metadata,
        max_field_chars=max_field_chars,
    ):
        result = remember(
            request.text,
            kind=request.kind,
            tags=list(request.tags),
            metadata=dict(request.metadata),
        )
        if inspect.isawaitable(result):
            result = await result
        results.append(result)
    return results
