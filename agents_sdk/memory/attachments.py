"""Stores attached to an agent, and the prompt context they make.

:class:`Attachments` holds an agent's attached stores (``agent.memory.attach``),
each with its rights (``read``, ``write``), ``top_k``, ``similarity_threshold``
and the stages it is read at. :meth:`Attachments.context` asks every store
attached for reading at a stage, merges their hits (best score first; an id or
a text found twice kept once) and renders them as a ``## Related memories``
block within a token budget (:func:`render_related`, pure);
:meth:`Attachments.after_turn` writes a finished turn to every store attached
for writing.

The stores a config file declares (``agent_memory.stores_file``) are known by
name, and the file's ``[agents.<agent id>.attach.<store>]`` tables attach
them, on first use. Stores start on first use (a file store indexes its files)
and are closed by :meth:`Attachments.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agents_sdk.memory.items import truncate
from agents_sdk.memory.layers import LayerHit
from agents_sdk.memory.prompt import ChatMessage, TokenCounter
from agents_sdk.memory.stores.base import STAGES, MemoryStore, Stage, StoreSpec
from agents_sdk.memory.stores.config import MemoryConfig, load_config
from agents_sdk.memory.stores.registry import build_store
from agents_sdk.memory.tokens import chars_counter
from blackboard.protocol.errors import BlackboardError, ConfigurationError, InvalidPayloadError
from blackboard.settings import AgentMemorySettings

if TYPE_CHECKING:
    from agents_sdk.agent import Agent

__all__ = ["CONTEXT_HEADER", "Attachment", "Attachments", "RenderedContext", "check_stage", "merge_store_hits",
           "render_related"]

log = logging.getLogger("agents_sdk.memory")

#: The heading of the related-memories block.
CONTEXT_HEADER: Final = "## Related memories"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A store attached to an agent.

    Attributes:
        store: The store.
        read: Its hits go into the prompt context (at ``stages``).
        write: :meth:`Attachments.after_turn` writes turns to it.
        top_k: Most hits it gives a context.
        similarity_threshold: Least score (0..1) of a hit it gives.
        stages: The stages it is read at.
    """

    store: MemoryStore
    read: bool = True
    write: bool = False
    top_k: int = 5
    similarity_threshold: float = 0.0
    stages: tuple[Stage, ...] = STAGES

    @property
    def name(self) -> str:
        """The store's name."""
        return self.store.name

    def reads_at(self, stage: Stage) -> bool:
        """Whether it gives hits to a context of ``stage``."""
        return self.read and stage in self.stages

    async def close(self) -> None:
        """Close its store (what ``agent.memory``'s close calls for each attachment)."""
        await self.store.close()


@dataclass(frozen=True, slots=True)
class RenderedContext:
    """The related-memories block of a prompt.

    Attributes:
        messages: The block as chat messages (one ``user`` message; none when no hit fits).
        text: The block's text (empty when no hit fits).
        hits: The hits rendered, in the block's order.
        tokens: The text's tokens, by the counter it was rendered with (at most the budget).
        dropped: Hits found but left out for the budget.
        failed: Stores whose search failed (logged; the others still rendered).
    """

    messages: list[ChatMessage]
    text: str
    hits: list[LayerHit]
    tokens: int
    dropped: int
    failed: tuple[str, ...] = ()

    @property
    def ids(self) -> list[str]:
        """The ids of the rendered hits."""
        return [h.id for h in self.hits]


def _line(hit: LayerHit, max_chars: int | None) -> str:
    label = hit.source
    path = hit.provenance.get("path")
    if isinstance(path, str) and path:
        label = f"{label}: {Path(path).name}"
    text = " ".join(truncate(hit.text, max_chars).split())
    return f"- [{label}] {text}"


def render_related(hits: Iterable[LayerHit], *, budget: int, counter: TokenCounter = chars_counter,
                   header: str = CONTEXT_HEADER, max_item_chars: int | None = 2000,
                   failed: Sequence[str] = ()) -> RenderedContext:
    """Render ``hits`` (best first) as a related-memories block of at most ``budget`` tokens.

    The block is the header, then one line per hit (``- [<store>] <text>``, the text on
    one line, cut at ``max_item_chars``), in the order given. A hit whose line does not
    fit is left out and the next one tried; when not even the header and one hit fit,
    the block is empty. ``tokens`` is ``counter`` of the whole text (never above the
    budget: lines are dropped from the end until it fits, for counters that do not add
    up line by line).

    Raises:
        InvalidPayloadError: a budget below 1.
    """
    if budget < 1:
        raise InvalidPayloadError(f"a context budget is at least 1 token, not {budget}")
    ordered = list(hits)
    lines: list[str] = []
    kept: list[LayerHit] = []
    used = counter(header)
    for hit in ordered:
        line = _line(hit, max_item_chars)
        cost = counter("\n" + line)
        if used + cost > budget:
            continue
        lines.append(line)
        kept.append(hit)
        used += cost
    text = "\n".join([header, *lines]) if lines else ""
    tokens = counter(text) if text else 0
    while lines and tokens > budget:
        lines.pop()
        kept.pop()
        text = "\n".join([header, *lines]) if lines else ""
        tokens = counter(text) if text else 0
    messages: list[ChatMessage] = [{"role": "user", "content": text}] if text else []
    return RenderedContext(messages, text, kept, tokens, len(ordered) - len(kept), tuple(failed))


def merge_store_hits(groups: Sequence[Sequence[LayerHit]]) -> list[LayerHit]:
    """The stores' hits as one list: best score first, ties in attachment order; a hit
    whose id (in its layer) or text was already taken is left out."""
    flat = [(-hit.score, n, i, hit) for n, hits in enumerate(groups) for i, hit in enumerate(hits)]
    flat.sort(key=lambda t: t[:3])
    seen_ids: set[tuple[str, str]] = set()
    seen_texts: set[str] = set()
    out: list[LayerHit] = []
    for *_, hit in flat:
        text = " ".join(hit.text.split()).casefold()
        if (str(hit.layer), hit.id) in seen_ids or text in seen_texts:
            continue
        seen_ids.add((str(hit.layer), hit.id))
        seen_texts.add(text)
        out.append(hit)
    return out


def check_stage(stage: object) -> Stage:
    """``stage`` if it is a :data:`~agents_sdk.memory.stores.base.Stage`.

    Raises:
        InvalidPayloadError: it is not.
    """
    for known in STAGES:
        if stage == known:
            return known
    raise InvalidPayloadError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


@dataclass
class _Catalog:
    """The stores known by name: declared by the config file or in code."""

    specs: dict[str, StoreSpec] = field(default_factory=dict)
    made: dict[str, MemoryStore] = field(default_factory=dict)


class Attachments(Mapping[str, Attachment]):
    """An agent's attached stores, by name (``agent.memory.attach``/``context``/``after_turn``;
    ``agent.memory.attachments`` is one).

    Args:
        agent: The agent the stores act as (needed to make stores by name).
        agent_id: Its id (default ``agent.id``): picks its ``[agents.<id>]`` attachments.
        settings: Its memory settings (default ``agent.settings.agent_memory``): the
            context budget, the config file.
        counter: The token counter of the budget (default: characters / 4).
        config: A loaded config (default: ``settings.stores_file``'s, loaded on first use).

    No IO here: the config file is read, and this agent's attachments made, on first use.

    Raises:
        ConfigurationError: neither ``agent`` nor both ``agent_id`` and ``settings``.
    """

    def __init__(self, agent: Agent | None = None, *, agent_id: str | None = None,
                 settings: AgentMemorySettings | None = None, counter: TokenCounter | None = None,
                 config: MemoryConfig | None = None) -> None:
        if agent is not None:
            agent_id = agent.id if agent_id is None else agent_id
            settings = agent.settings.agent_memory if settings is None else settings
        if agent_id is None or settings is None:
            raise ConfigurationError("Attachments needs the agent, or its id and memory settings")
        self.agent = agent
        self.agent_id = agent_id
        self.settings = settings
        self.counter: TokenCounter = counter or chars_counter
        self._config = config
        self._loaded = False
        self._catalog = _Catalog()
        self._attached: dict[str, Attachment] = {}
        self._started: dict[str, asyncio.Task[None]] = {}

    def __getitem__(self, name: str) -> Attachment:
        return self._attached[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._attached)

    def __len__(self) -> int:
        return len(self._attached)

    def _build(self, spec: StoreSpec) -> MemoryStore:
        if self.agent is None:
            raise ConfigurationError(f"making store {spec.name!r} needs the agent (Attachments(agent=...))")
        return build_store(spec, self.agent)

    # ------------------------------------------------------------ declaring
    def load(self) -> MemoryConfig | None:
        """Load the config (once): know its stores by name and attach this agent's
        attachments (those attached in code already are kept).

        Raises:
            ConfigFileError, ConfigurationError: see :func:`~agents_sdk.memory.stores.config.load_config`.
        """
        if self._loaded:
            return self._config
        if self._config is None and self.settings.stores_file is not None:
            self._config = load_config(self.settings.stores_file)
        self._loaded = True
        config = self._config
        if config is None:
            return None
        for name, spec in config.stores.items():
            if name in self._catalog.specs:
                raise ConfigurationError(f"{spec.origin}: duplicate store name {name!r} "
                                         f"(already declared at {self._catalog.specs[name].origin})")
            self._catalog.specs[name] = spec
        for att in config.attachments_for(self.agent_id):
            if att.store not in self._attached:
                self.attach(att.store, read=att.read, write=att.write, top_k=att.top_k,
                            similarity_threshold=att.similarity_threshold, stages=att.stages)
        return config

    def declare(self, name: str, type: str, **options: Any) -> MemoryStore:
        """Declare a store in code (like a ``[stores.<name>]`` table) and make it.

        Raises:
            ConfigurationError: the name is taken (by the config file or in code), or an
                invalid name, type or option.
        """
        self.load()
        if name in self._catalog.specs or name in self._catalog.made:
            origin = self._catalog.specs[name].origin if name in self._catalog.specs else "code"
            raise ConfigurationError(f"duplicate store name {name!r} (already declared at {origin})")
        spec = StoreSpec(name, type, options, "code", None)
        store = self._build(spec)
        self._catalog.specs[name] = spec
        self._catalog.made[name] = store
        return store

    def store(self, name: str) -> MemoryStore:
        """The store declared as ``name`` (made on first use).

        Raises:
            ConfigurationError: no store of that name is declared.
        """
        self.load()
        if name not in self._catalog.made:
            spec = self._catalog.specs.get(name)
            if spec is None:
                known = ", ".join(sorted(self._catalog.specs)) or "none"
                raise ConfigurationError(f"no store named {name!r} is declared (declared: {known})")
            self._catalog.made[name] = self._build(spec)
        return self._catalog.made[name]

    def attach(self, store: str | MemoryStore, *, read: bool = True, write: bool = False, top_k: int = 5,
               similarity_threshold: float = 0.0, stages: Iterable[Stage] = STAGES) -> Attachment:
        """Attach a store (by declared name, or a store object) to this agent; attaching a
        store again replaces its attachment.

        Raises:
            ConfigurationError: an undeclared name, a store of another object under a name
                taken, ``write`` on a read-only store, or a bad ``top_k``, threshold or stage.
        """
        self.load()
        if isinstance(store, str):
            store = self.store(store)
        elif self._catalog.made.get(store.name, store) is not store or (
                store.name in self._catalog.specs and store.name not in self._catalog.made):
            raise ConfigurationError(f"duplicate store name {store.name!r}: another store has it")
        if write and not store.writable:
            raise ConfigurationError(f"store {store.name!r} ({store.kind}) is read-only: it cannot be attached "
                                     "with write=True")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 1000:
            raise ConfigurationError(f"top_k must be an integer in 1..1000, not {top_k!r}")
        if not 0.0 <= similarity_threshold <= 1.0:
            raise ConfigurationError(f"similarity_threshold must be in 0..1, not {similarity_threshold!r}")
        try:
            chosen = tuple(dict.fromkeys(check_stage(s) for s in stages))
        except InvalidPayloadError as exc:
            raise ConfigurationError(str(exc)) from exc
        if not chosen:
            raise ConfigurationError("an attachment needs at least one stage")
        attachment = Attachment(store, read, write, top_k, float(similarity_threshold), chosen)
        self._catalog.made[store.name] = store
        self._attached[store.name] = attachment
        return attachment

    def detach(self, name: str) -> None:
        """Detach the store ``name`` (it stays declared; nothing when not attached)."""
        self._attached.pop(name, None)

    @property
    def attached(self) -> list[Attachment]:
        """The attachments, in the order they were made (the config file's loaded first)."""
        self.load()
        return list(self._attached.values())

    # ------------------------------------------------------------ using
    async def _start(self, store: MemoryStore) -> None:
        task = self._started.get(store.name)
        if task is None:
            task = asyncio.ensure_future(store.start())
            self._started[store.name] = task
        try:
            await asyncio.shield(task)
        except BaseException:
            if task.done():  # a failed start is tried again next time
                self._started.pop(store.name, None)
            raise

    async def _search(self, att: Attachment, query: str) -> list[LayerHit]:
        await self._start(att.store)
        hits = await att.store.search(query, att.top_k, att.similarity_threshold)
        return [h for h in hits if h.score >= att.similarity_threshold][:att.top_k]

    async def context(self, stage: Stage, query: str, *, budget: int | None = None) -> RenderedContext:
        """The related-memories block for ``stage``: the hits of every store attached for
        reading at that stage, merged and rendered within ``budget`` tokens (default
        ``agent_memory.context_budget``) by this object's counter. A store whose search
        fails is left out and named in ``failed`` (and logged).

        Raises:
            InvalidPayloadError: an unknown stage or a budget below 1.
        """
        stage = check_stage(stage)
        readers = [a for a in self.attached if a.reads_at(stage)]
        results = await asyncio.gather(*(self._search(a, query) for a in readers), return_exceptions=True)
        groups: list[list[LayerHit]] = []
        failed: list[str] = []
        for att, result in zip(readers, results, strict=True):
            if isinstance(result, BlackboardError):
                log.warning("memory store %s: search failed: %s", att.name, result)
                failed.append(att.name)
            elif isinstance(result, BaseException):
                raise result
            else:
                groups.append(result)
        return render_related(merge_store_hits(groups), budget=budget or self.settings.context_budget,
                              counter=self.counter, failed=failed)

    async def after_turn(self, text: str, *, stage: Stage | None = None,
                         metadata: Mapping[str, Any] | None = None) -> list[str]:
        """Write a finished turn to every store attached for writing (whatever their stages);
        returns the ids written, in attachment order. ``stage`` is recorded in the
        metadata (``"stage"``).

        Raises:
            InvalidPayloadError: an unknown stage or an empty text.
            the first error of a store's write (the other stores are still written).
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidPayloadError("after_turn needs a non-empty text")
        meta = dict(metadata or {})
        if stage is not None:
            meta["stage"] = check_stage(stage)
        writers = [a for a in self.attached if a.write]

        async def write(att: Attachment) -> str:
            await self._start(att.store)
            return await att.store.write(text, meta)

        results = await asyncio.gather(*(write(a) for a in writers), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, str)]

    def sizes(self) -> dict[str, int]:
        """Each attached store's size (:meth:`MemoryStore.size`), by name."""
        return {a.name: a.store.size() for a in self._attached.values()}

    async def close(self) -> None:
        """Close the stores this object started (their watchers); idempotent."""
        started, self._started = self._started, {}
        for name, task in started.items():
            if not task.done():
                task.cancel()
                # A start whose cancel was lost (Python 3.11's wait_for) runs on: closing the
                # store before it ends would leave the watcher it then starts running.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            store = self._catalog.made.get(name)
            if store is not None:
                try:
                    await store.close()
                except BlackboardError as exc:
                    log.warning("memory store %s: close failed: %s", name, exc)
