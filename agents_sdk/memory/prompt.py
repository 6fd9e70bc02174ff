"""Prompt context: render memory, board entries and recalled memories into chat messages.

:func:`build_prompt` turns an agent's context into OpenAI chat messages that
fit a character or token budget. Pure and deterministic: the same inputs (and
the same working-memory clock reading) give identical messages.

Output: an optional ``system`` message (the system prompt), one ``user``
message holding the context sections (working memory, recalled memories,
shared board, history - in that display order), and an optional final
``user`` message with the task. The context message's ``content`` is a string,
or a list of ``{"type": "text"}`` / ``{"type": "image_url"}`` parts when an
image board entry (``content_type`` ``image/*`` with a ``bytes`` value) is
included.

Priority (what is kept when the budget is short), highest first:

1. the system prompt and the task - always included, ``BudgetExceededError``
   when they alone exceed the budget;
2. working memory: the goal, the focus, then other items by first write;
3. condensation summaries in the history, newest first;
4. the ``recent_steps`` newest history items, newest first;
5. board entries, highest revision first (ties by board, section, key);
6. recalled memories, highest score first (ties by id);
7. older history items, newest first.

Within each level, a block that does not fit is skipped and the next one is
tried, except in the history: once a history item does not fit, no older item
is included, so the rendered steps are always a contiguous tail of the history.

Cost: the budget's unit (characters, or tokens by a pluggable counter - by
default ``ceil(len/4)``) summed over every string ``content`` and every text
part; an image part costs ``PromptBudget.image_cost`` (by default its data
URL's length in characters, or 765 tokens). Roles and message framing are not
counted. The result is checked by :func:`prompt_cost` and never exceeds the
budget.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from agents_sdk.memory.items import (
    Summary,
    ViewItem,
    render_item,
    render_value,
    truncate,
)
from agents_sdk.memory.working import FOCUS, GOAL, WorkingItem, WorkingMemory
from blackboard.protocol.errors import BudgetExceededError, ConfigurationError

__all__ = [
    "BoardEntryLike",
    "ChatMessage",
    "PromptBudget",
    "PromptContext",
    "RecalledMemoryLike",
    "TokenCounter",
    "approx_tokens",
    "build_prompt",
    "prompt_cost",
    "render_prompt",
]

#: An OpenAI chat message (``role`` and ``content``).
ChatMessage = dict[str, Any]
#: Counts the tokens of a text.
TokenCounter = Callable[[str], int]

#: Token cost charged for an image by default (a 1024x1024 high-detail image).
DEFAULT_IMAGE_TOKENS: Final = 765

_Section = Literal["working", "memories", "board", "history"]
_DISPLAY_ORDER: Final[tuple[_Section, ...]] = ("working", "memories", "board", "history")
_HEADERS: Final[Mapping[_Section, str]] = {
    "working": "## Working memory",
    "memories": "## Recalled memories",
    "board": "## Shared board",
    "history": "## History (oldest first)",
}
_PLAIN_TYPES: Final = ("application/json", "text/plain")


def approx_tokens(text: str) -> int:
    """Cheap token estimate: ``ceil(len(text) / 4)``."""
    return (len(text) + 3) // 4


class BoardEntryLike(Protocol):
    """What the renderer reads from a board entry (e.g. ``blackboard.protocol.entries.Entry``)."""

    @property
    def board(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> Any: ...
    @property
    def content_type(self) -> str: ...
    @property
    def revision(self) -> int: ...
    @property
    def author(self) -> str: ...
    @property
    def tags(self) -> Sequence[str]: ...


class RecalledMemoryLike(Protocol):
    """What the renderer reads from a long-term memory search hit."""

    @property
    def text(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class PromptBudget:
    """A character or token budget (neither: unlimited).

    Args:
        max_chars: Most characters.
        max_tokens: Most tokens, as counted by ``count_tokens``.
        count_tokens: The token counter (default :func:`approx_tokens`).
        image_cost: What one image part costs in the budget's unit (default:
            its data URL's length for characters, 765 for tokens).

    Raises:
        ConfigurationError: both limits given, or a negative one.
    """

    max_chars: int | None = None
    max_tokens: int | None = None
    count_tokens: TokenCounter = approx_tokens
    image_cost: int | None = None

    def __post_init__(self) -> None:
        if self.max_chars is not None and self.max_tokens is not None:
            raise ConfigurationError("give max_chars or max_tokens, not both")
        for value in (self.max_chars, self.max_tokens, self.image_cost):
            if value is not None and value < 0:
                raise ConfigurationError("prompt budgets and costs must not be negative")

    @property
    def unit(self) -> Literal["chars", "tokens"]:
        """``"tokens"`` with ``max_tokens``, else ``"chars"``."""
        return "tokens" if self.max_tokens is not None else "chars"

    @property
    def limit(self) -> int | None:
        """The limit in :attr:`unit`, ``None`` when unlimited."""
        return self.max_tokens if self.max_tokens is not None else self.max_chars

    def text_cost(self, text: str) -> int:
        """Cost of a text."""
        return self.count_tokens(text) if self.unit == "tokens" else len(text)

    def url_cost(self, url: str) -> int:
        """Cost of an image part with this URL."""
        if self.image_cost is not None:
            return self.image_cost
        return DEFAULT_IMAGE_TOKENS if self.unit == "tokens" else len(url)


@dataclass(frozen=True, slots=True)
class PromptContext:
    """The rendered prompt and what went into it.

    Attributes:
        messages: The chat messages.
        cost: Their cost in ``unit`` (:func:`prompt_cost`).
        limit: The budget (``None``: unlimited).
        unit: ``"chars"`` or ``"tokens"``.
        included: Ids of the included blocks, in priority order
            (``working:<key>``, ``summary:<id>``, ``step:<id>``,
            ``board:<board>/<section>/<key>``, ``memory:<id>``).
        omitted: Ids of the blocks left out for the budget, in priority order.
    """

    messages: list[ChatMessage]
    cost: int
    limit: int | None
    unit: str
    included: tuple[str, ...]
    omitted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Block:
    ident: str
    section: _Section
    order: tuple[Any, ...]
    text: str
    image_url: str | None = None
    contiguous: bool = False


def prompt_cost(messages: Iterable[ChatMessage], budget: PromptBudget) -> int:
    """Cost of chat messages under ``budget``'s unit (see the module doc)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += budget.text_cost(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    total += budget.text_cost(part["text"])
                elif part.get("type") == "image_url":
                    total += budget.url_cost(part["image_url"]["url"])
    return total


def _working_blocks(
    working: WorkingMemory | Iterable[WorkingItem] | None, max_chars: int | None
) -> list[_Block]:
    if working is None:
        return []
    items = working.live() if isinstance(working, WorkingMemory) else list(working)
    rank = {GOAL: 0, FOCUS: 1}
    items.sort(key=lambda it: (rank.get(it.kind, 2), it.seq, it.key))
    out = []
    for n, item in enumerate(items):
        label = item.kind if item.key == item.kind else f"{item.kind} [{item.key}]"
        text = f"- {label}: {render_value(item.value, max_chars)}"
        out.append(_Block(f"working:{item.key}", "working", (n,), text))
    return out


def _history_blocks(
    history: Sequence[ViewItem], recent_steps: int, max_chars: int | None
) -> tuple[list[_Block], list[_Block], list[_Block]]:
    summaries: list[_Block] = []
    steps: list[_Block] = []
    for index in range(len(history) - 1, -1, -1):
        item = history[index]
        text = render_item(item, max_chars)
        if isinstance(item, Summary):
            summaries.append(_Block(f"summary:{item.id}", "history", (index,), text))
        else:
            steps.append(_Block(f"step:{item.id}", "history", (index,), text, contiguous=True))
    return summaries, steps[:recent_steps], steps[recent_steps:]


def _board_blocks(entries: Iterable[BoardEntryLike], max_chars: int | None) -> list[_Block]:
    ordered = sorted(
        entries, key=lambda e: (-e.revision, e.board, e.section, e.key, e.content_type)
    )
    out = []
    for entry in ordered:
        name = f"{entry.board}/{entry.section}/{entry.key}"
        meta = f"rev {entry.revision} by {entry.author}"
        if entry.content_type not in _PLAIN_TYPES:
            meta += f", {entry.content_type}"
        if entry.tags:
            meta += "; tags: " + ", ".join(entry.tags)
        value = entry.value
        url = None
        if isinstance(value, bytes | bytearray) and entry.content_type.startswith("image/"):
            url = f"data:{entry.content_type};base64,{base64.b64encode(bytes(value)).decode()}"
            shown = f"<image, {len(value)} bytes>"
        else:
            shown = render_value(value, max_chars)
        order = (entry.board, entry.section, entry.key, entry.revision)
        out.append(_Block(f"board:{name}", "board", order, f"- {name} [{meta}]: {shown}", url))
    return out


def _memory_blocks(memories: Iterable[RecalledMemoryLike], max_chars: int | None) -> list[_Block]:
    ordered = sorted(memories, key=lambda m: (-m.score, m.id))
    return [
        _Block(
            f"memory:{m.id}",
            "memories",
            (n,),
            f"- ({m.kind}, score {m.score:.3f}) {truncate(m.text, max_chars)}",
        )
        for n, m in enumerate(ordered)
    ]


def _render(system: str | None, task: str | None, blocks: Iterable[_Block]) -> list[ChatMessage]:
    by_section: dict[_Section, list[_Block]] = {}
    for block in blocks:
        by_section.setdefault(block.section, []).append(block)
    segments: list[str | tuple[str]] = []  # text, or (image_url,)
    first_section = True
    for section in _DISPLAY_ORDER:
        chosen = sorted(by_section.get(section, ()), key=lambda b: b.order)
        if not chosen:
            continue
        segments.append(("" if first_section else "\n\n") + _HEADERS[section])
        first_section = False
        for block in chosen:
            segments.append("\n" + block.text)
            if block.image_url is not None:
                segments.append((block.image_url,))
    messages: list[ChatMessage] = []
    if system:
        messages.append({"role": "system", "content": system})
    if segments:
        if all(isinstance(s, str) for s in segments):
            messages.append(
                {"role": "user", "content": "".join(s for s in segments if isinstance(s, str))}
            )
        else:
            parts: list[dict[str, Any]] = []
            text: list[str] = []
            for segment in segments:
                if isinstance(segment, str):
                    text.append(segment)
                    continue
                if text:
                    parts.append({"type": "text", "text": "".join(text)})
                    text = []
                parts.append({"type": "image_url", "image_url": {"url": segment[0]}})
            if text:
                parts.append({"type": "text", "text": "".join(text)})
            messages.append({"role": "user", "content": parts})
    if task:
        messages.append({"role": "user", "content": task})
    return messages


def build_prompt(
    *,
    system: str | None = None,
    task: str | None = None,
    working: WorkingMemory | Iterable[WorkingItem] | None = None,
    history: Iterable[ViewItem] = (),
    board: Iterable[BoardEntryLike] = (),
    memories: Iterable[RecalledMemoryLike] = (),
    budget: PromptBudget | None = None,
    recent_steps: int = 5,
    max_field_chars: int | None = 2000,
) -> PromptContext:
    """Render an agent's context into chat messages within ``budget``.

    Args:
        system: The system prompt (always included).
        task: The final user message (always included).
        working: Working memory (its live items) or working items.
        history: Short-term memory items or a condensed view, oldest first
            (a ``ShortTermMemory`` works as is).
        board: Board entries (e.g. a board view's entries).
        memories: Recalled long-term memories.
        budget: The budget; ``None`` or an empty one is unlimited.
        recent_steps: How many newest history items rank above board entries.
        max_field_chars: Longest text of one field / value / memory (cut with
            a ``… [+N chars]`` marker).

    Returns:
        The messages with their cost and the included/omitted block ids.

    Raises:
        BudgetExceededError: the system prompt and task alone exceed the budget.
    """
    budget = budget or PromptBudget()
    limit = budget.limit
    fixed = _render(system, task, ())
    fixed_cost = prompt_cost(fixed, budget)
    if limit is not None and fixed_cost > limit:
        raise BudgetExceededError(fixed_cost, limit, budget.unit)

    view = list(history)
    summaries, recent, older = _history_blocks(view, max(0, recent_steps), max_field_chars)
    ordered = [
        *_working_blocks(working, max_field_chars),
        *summaries,
        *recent,
        *_board_blocks(board, max_field_chars),
        *_memory_blocks(memories, max_field_chars),
        *older,
    ]

    included: list[_Block] = []
    omitted: list[_Block] = []
    if limit is None:
        included = ordered
    else:
        remaining = limit - fixed_cost
        opened: set[_Section] = set()
        history_closed = False
        for block in ordered:
            cost = budget.text_cost(block.text + "\n")
            if block.image_url is not None:
                cost += budget.url_cost(block.image_url)
            if block.section not in opened:
                cost += budget.text_cost(_HEADERS[block.section] + "\n\n")
            if (block.contiguous and history_closed) or cost > remaining:
                history_closed = history_closed or block.contiguous
                omitted.append(block)
                continue
            included.append(block)
            opened.add(block.section)
            remaining -= cost

    messages = _render(system, task, included)
    cost = prompt_cost(messages, budget)
    # The per-block estimate is an upper bound for additive counters; for any
    # other counter, drop the lowest-priority blocks until the real cost fits.
    while limit is not None and cost > limit and included:
        omitted.append(included.pop())
        messages = _render(system, task, included)
        cost = prompt_cost(messages, budget)
    rank = {id(b): n for n, b in enumerate(ordered)}
    omitted.sort(key=lambda b: rank[id(b)])
    return PromptContext(
        messages=messages,
        cost=cost,
        limit=limit,
        unit=budget.unit,
        included=tuple(b.ident for b in included),
        omitted=tuple(b.ident for b in omitted),
    )


def render_prompt(
    *,
    system: str | None = None,
    task: str | None = None,
    working: WorkingMemory | Iterable[WorkingItem] | None = None,
    history: Iterable[ViewItem] = (),
    board: Iterable[BoardEntryLike] = (),
    memories: Iterable[RecalledMemoryLike] = (),
    budget: PromptBudget | None = None,
    recent_steps: int = 5,
    max_field_chars: int | None = 2000,
) -> list[ChatMessage]:
    """The messages of :func:`build_prompt` (same arguments).

    Raises:
        BudgetExceededError: the system prompt and task alone exceed the budget.
    """
    return build_prompt(
        system=system,
        task=task,
        working=working,
        history=history,
        board=board,
        memories=memories,
        budget=budget,
        recent_steps=recent_steps,
        max_field_chars=max_field_chars,
    ).messages
