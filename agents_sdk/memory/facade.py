"""``agent.memory``: the agent's memory toolkit behind one object (docs/memory.md, "The memory toolkit").

:class:`AgentMemory` puts the four layers (:mod:`agents_sdk.memory.layers`) behind one
``search``/``write``/``read``/``summarize``/``prune``, scopes the local layers by episode
(:mod:`agents_sdk.memory.episodes`), chooses layers with a router
(:mod:`agents_sdk.memory.router`), caches long-term searches and keeps metrics
(:mod:`agents_sdk.memory.metrics`). Memory actions as LLM tools
(:mod:`agents_sdk.memory.actions`) and attached stores with the prompt context
(:mod:`agents_sdk.memory.stores`, :mod:`agents_sdk.memory.attachments`) plug in here.

Awaiting it keeps the former ``agent.memory(id)`` method: ``await agent.memory(id)`` is
one long-term memory with its sources and versions. No IO in ``__init__``; ``agent.close()``
closes it (the automatic prune, the attachments).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from agents_sdk.memory.episodes import (
    DEFAULT_EPISODE,
    Episode,
    EpisodeSummary,
    new_episode_id,
    pick_kept,
)
from agents_sdk.memory.layers import (
    LAYERS,
    PRUNE_STRATEGIES,
    SHORT_TERM_PREFIX,
    WORKING_PREFIX,
    HitCache,
    Layer,
    LayerHit,
    PruneStrategy,
    hit_of_memory,
    merge_hits,
    normalise_scores,
)
from agents_sdk.memory.longterm import DEFAULT_MEMORY_BOARD, LongTermMemory
from agents_sdk.memory.metrics import MemoryMetrics, MetricsRecorder
from agents_sdk.memory.router import LLMRouter, Router, RuleRouter
from agents_sdk.memory.short_term import ShortTermMemory
from agents_sdk.memory.summarize import extractive_summary, llm_summary
from agents_sdk.memory.working import DefaultTTL, WorkingMemory
from agents_sdk.search import RecallArgs
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidPayloadError,
    NotFoundError,
)
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.search import MemoryDetail, MemoryHit, SearchFilters, SearchMode
from blackboard.settings import AgentMemorySettings

if TYPE_CHECKING:
    from agents_sdk.agent import Agent
    from agents_sdk.memory.actions import ActionResult
    from agents_sdk.memory.attachments import Attachment, Attachments, RenderedContext
    from agents_sdk.memory.prompt import TokenCounter
    from agents_sdk.memory.stores.base import MemoryStore, Stage
    from agents_sdk.memory.summarizer import OpenAISummarizer

__all__ = ["AgentMemory", "PruneResult", "SummaryResult"]

log = logging.getLogger("agents_sdk.memory.facade")

SummaryStrategy = Literal["extractive", "llm"]
#: The keywords of ``agent.recall`` a search's filters may hold (its ranking is search's own).
_FILTERS = frozenset(RecallArgs.__annotations__) - {"top_k", "mode", "min_score"}


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """What ``agent.memory.summarize`` made.

    Attributes:
        layer: the layer summarized.
        text: the summary (kept keys' ``key: value`` lines first, verbatim).
        strategy: ``"extractive"`` or ``"llm"``.
        source_ids: the ids summarized (as :class:`LayerHit` ids).
        tokens: the summary's size by ``agent.memory.counter``.
        kept: the kept keys found and their values.
        written_id: with ``replace=True``, the id of the summary written in their place.
        replaced: with ``replace=True``, the ids removed (local) or archived (long-term).
    """

    layer: Layer
    text: str
    strategy: str
    source_ids: tuple[str, ...]
    tokens: int
    kept: Mapping[str, str] = field(default_factory=dict)
    written_id: str | None = None
    replaced: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "text": self.text, "strategy": self.strategy,
                "source_ids": list(self.source_ids), "tokens": self.tokens, "kept": dict(self.kept),
                "written_id": self.written_id, "replaced": list(self.replaced)}


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What ``agent.memory.prune`` removed (or, with ``dry_run``, would remove).

    Attributes:
        layer, strategy: what was asked.
        board: the board pruned (None for the local layers).
        ids: the ids pruned (as :class:`LayerHit` ids).
        dry_run: nothing was removed.
    """

    layer: Layer
    strategy: PruneStrategy
    board: str | None
    ids: tuple[str, ...]
    dry_run: bool = False

    @property
    def count(self) -> int:
        return len(self.ids)

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "strategy": self.strategy, "board": self.board, "ids": list(self.ids),
                "count": self.count, "dry_run": self.dry_run}


def _check_layer(layer: object, settings: AgentMemorySettings) -> Layer:
    if layer not in LAYERS:
        raise InvalidPayloadError(f"unknown memory layer {layer!r} (one of {', '.join(LAYERS)})")
    if layer not in settings.layers:
        raise InvalidPayloadError(f"the {layer} layer is off (agent_memory.layers: {', '.join(settings.layers)})")
    return layer


def _filters_dict(filters: SearchFilters | Mapping[str, Any] | None) -> dict[str, Any]:
    if filters is None:
        return {}
    if isinstance(filters, SearchFilters):
        return {k: v for k, v in filters.model_dump(exclude_defaults=True).items() if v is not None}
    if not isinstance(filters, Mapping):
        raise InvalidPayloadError(f"filters must be a mapping or SearchFilters, not {type(filters).__name__}")
    unknown = sorted(str(k) for k in filters if k not in _FILTERS)
    if unknown:
        raise InvalidPayloadError(f"unknown search filter {unknown[0]!r} (filters: {', '.join(sorted(_FILTERS))}; "
                                  "top_k, mode and min_relevance are arguments of search)")
    return {k: v for k, v in filters.items() if v is not None}


class AgentMemory:
    """The agent's memory toolkit: ``agent.memory`` (one per agent).

    Args:
        agent: the agent.
        settings: default ``agent.settings.agent_memory``.
        router: chooses layers when a search names none (default by ``settings.router``:
            :class:`RuleRouter`, or :class:`LLMRouter` on ``agent.settings.llm``).
    """

    def __init__(self, agent: Agent, settings: AgentMemorySettings | None = None, *,
                 router: Router | None = None) -> None:
        self._agent = agent
        self.settings = settings if settings is not None else agent.settings.agent_memory
        self._router = router
        default = Episode.new(*DEFAULT_EPISODE, self.settings, agent=agent.id)
        #: Open episodes, the current last; the default episode stays at the bottom.
        self._stack: list[Episode] = [default]
        self._metrics = MetricsRecorder(self.settings.metrics_window)
        self._cache = HitCache(self.settings.cache_ttl, self.settings.cache_size)
        self._joined: tuple[float, tuple[str, ...]] | None = None
        self._counter: TokenCounter | None = None
        self._summarizer: OpenAISummarizer | None = None
        self._attachments: Attachments | None = None
        self._prune_task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------ the former agent.memory(id)
    async def __call__(self, id: str, *, board: str | None = None) -> MemoryDetail:
        """One long-term memory of ``board`` (default ``"default"``) by id, with the memories merged
        into it and the versions of its subject key (what ``agent.memory(id)`` always returned).

        Raises:
            NotFoundError: no memory of that id on that board.
            PermissionDeniedError: this agent may not read the board.
            SearchError: no worker is serving search, or it failed / timed out.
        """
        return await self._agent.search.memory(board or DEFAULT_MEMORY_BOARD, id)

    # ------------------------------------------------------------ parts
    @property
    def longterm(self) -> LongTermMemory:
        """The agent's long-term memory (``agent.longterm``)."""
        return self._agent.longterm

    @property
    def agent(self) -> Agent:
        """The agent this memory belongs to."""
        return self._agent

    @property
    def agent_id(self) -> str:
        return self._agent.id

    @property
    def attachments(self) -> Attachments:
        """The attached stores, by name (:class:`~agents_sdk.memory.attachments.Attachments`:
        those of ``settings.stores_file`` for this agent, and those of :meth:`attach`)."""
        if self._attachments is None:
            from agents_sdk.memory.attachments import Attachments

            self._attachments = Attachments(self._agent, settings=self.settings, counter=self.counter)
        return self._attachments

    @attachments.setter
    def attachments(self, attachments: Attachments) -> None:
        self._attachments = attachments

    @property
    def episode(self) -> Episode:
        """The current episode (the default one, ``("default", "default")``, until another begins)."""
        return self._stack[-1]

    @property
    def short_term(self) -> ShortTermMemory:
        """The current episode's :class:`~agents_sdk.memory.short_term.ShortTermMemory`."""
        return self.episode.short_term

    @property
    def working(self) -> WorkingMemory:
        """The current episode's :class:`~agents_sdk.memory.working.WorkingMemory`."""
        return self.episode.working

    @property
    def router(self) -> Router:
        """The router of searches without ``layers`` (settable)."""
        if self._router is None:
            if self.settings.router == "llm":
                self._router = LLMRouter.from_settings(self._agent.settings.llm,
                                                       fallback=RuleRouter(agent_id=self.agent_id))
            else:
                self._router = RuleRouter(agent_id=self.agent_id)
        return self._router

    @router.setter
    def router(self, router: Router) -> None:
        self._router = router

    @property
    def counter(self) -> TokenCounter:
        """The token counter of ``settings.tokenizer`` (:mod:`agents_sdk.memory.tokens`)."""
        if self._counter is None:
            from agents_sdk.memory.tokens import token_counter

            self._counter = token_counter(self.settings)
        return self._counter

    # ------------------------------------------------------------ episodes
    def begin_episode(self, task_id: str, episode_id: str | None = None) -> Episode:
        """Begin an episode (a new id when ``episode_id`` is None) and make it current; the
        previous one stays open and becomes current again when this one ends.

        Raises:
            InvalidKeyError: an id outside ``[A-Za-z0-9_.:-]{1,128}``.
            InvalidPayloadError: an open episode has that id.
        """
        episode_id = episode_id or new_episode_id()
        if any(e.episode_id == episode_id for e in self._stack):
            raise InvalidPayloadError(f"episode {episode_id!r} is open already")
        episode = Episode.new(task_id, episode_id, self.settings, agent=self.agent_id)
        self._stack.append(episode)
        return episode

    @contextlib.asynccontextmanager
    async def episode_scope(self, task_id: str, episode_id: str | None = None) -> AsyncIterator[Episode]:
        """``async with agent.memory.episode_scope("task-1") as ep:``: begin an episode, and end
        it on exit (:meth:`end_episode` with the settings' defaults), also on an error."""
        episode = self.begin_episode(task_id, episode_id)
        try:
            yield episode
        finally:
            if self.episode is episode:
                await self.end_episode()

    async def end_episode(self, *, summarize: bool | None = None, keep_keys: Sequence[str] = (),
                          board: str | None = None) -> EpisodeSummary | None:
        """End the current episode: summarize it into long-term memory (``summarize``, default
        ``settings.auto_summarize``; nothing for an empty episode), clear it, and make the
        previous episode current (the default episode is cleared and stays).

        The summary (``settings.summarize_strategy``, ``settings.summary_tokens``) opens with
        the ``keep_keys`` verbatim (a working note's key, or a short-term item written with
        ``key=``) and is written to ``board`` (default ``settings.long_term_board``) as a
        ``summary`` memory tagged ``episode-summary`` with the task and episode in its metadata.

        Raises:
            LLMError: the LLM summary failed (the episode is left as it was).
            NotConnectedError, OperationTimeoutError: the summary was not stored (likewise).
        """
        self._check_open()
        episode = self.episode
        result: EpisodeSummary | None = None
        if (self.settings.auto_summarize if summarize is None else summarize) and not episode.empty:
            texts = episode.texts()
            kept = pick_kept(episode.keyed(), keep_keys)
            strategy = self.settings.summarize_strategy
            text = await self._summary_text(texts, strategy, self.settings.summary_tokens, kept)
            target = board or self.settings.long_term_board
            memory_id = await self.longterm.remember(
                text, kind="summary", tags=["episode-summary"], board=target, source="episode",
                metadata={"task_id": episode.task_id, "episode_id": episode.episode_id, "items": len(texts)})
            self._cache.clear()
            result = EpisodeSummary(episode.task_id, episode.episode_id, text, memory_id, target, strategy,
                                    len(texts), self.counter(text), kept)
        episode.clear()
        if len(self._stack) > 1:
            episode.ended = True
            self._stack.pop()
        return result

    def _find_episode(self, episode_id: str) -> Episode | None:
        return next((e for e in reversed(self._stack) if e.episode_id == episode_id), None)

    # ------------------------------------------------------------ search
    async def search(self, query: str, *, layers: Sequence[Layer] | None = None, mode: SearchMode = "hybrid",
                     min_relevance: float | None = None,
                     time_range: tuple[datetime | None, datetime | None] | None = None,
                     filters: SearchFilters | Mapping[str, Any] | None = None,
                     top_k: int | None = None) -> list[LayerHit]:
        """Search the layers (``layers``, or the router's choice) and return one list, best first.

        Each hit carries its layer, a relevance 0..1 and its provenance; hits below
        ``min_relevance`` (default ``settings.min_relevance``) are left out, at most ``top_k``
        (default ``settings.top_k``) are returned. ``mode`` is the long-term layers' search mode
        (the local layers score words: docs/memory.md). ``time_range`` is (since, until);
        ``filters`` are :class:`~agents_sdk.search.RecallArgs` (``tags_any``, ``kind``, ``board``,
        ``metadata``, ``where``, ...) or a :class:`SearchFilters`. Long-term results are cached
        for ``settings.cache_ttl`` seconds.

        Raises:
            InvalidPayloadError: an unknown or disabled layer, a bad top_k, mode or filter.
            SearchError, PermissionDeniedError: the long-term search failed or was refused.
        """
        self._check_open()
        self._start_background()
        started = time.perf_counter()
        top_k = self.settings.top_k if top_k is None else top_k
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 1000:
            raise InvalidPayloadError(f"top_k must be an integer from 1 to 1000, got {top_k!r}")
        if mode not in ("hybrid", "semantic", "keyword"):
            raise InvalidPayloadError(f"mode must be hybrid, semantic or keyword, not {mode!r}")
        floor = self.settings.min_relevance if min_relevance is None else float(min_relevance)
        flt = _filters_dict(filters)
        if time_range is not None:
            since, until = time_range
            flt.update({k: v for k, v in (("since", since), ("until", until)) if v is not None})
        for name in ("since", "until"):
            value = flt.get(name)
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise InvalidPayloadError(f"{name} must be a timezone-aware datetime, not {value!r}")
        if layers is None:
            routed = set(await self.router.route(query, available=list(self.settings.layers), filters=flt))
            # what a router answers is only a wish: unknown or disabled layers are dropped
            chosen = [layer for layer in LAYERS if layer in routed and layer in self.settings.layers] or [
                layer for layer in LAYERS if layer in self.settings.layers]
        else:
            if isinstance(layers, str):
                layers = [layers]  # type: ignore[list-item]
            asked = {_check_layer(layer, self.settings) for layer in layers}
            chosen = [layer for layer in LAYERS if layer in asked]
        groups = await asyncio.gather(*(self._search_layer(layer, query, mode, flt, top_k) for layer in chosen))
        hits = [h for h in merge_hits(groups, top_k * 4) if h.score >= floor][:top_k]
        self._metrics.retrieval((time.perf_counter() - started) * 1000)
        self._metrics.recalled(h.id for h in hits)
        return hits

    async def _search_layer(self, layer: Layer, query: str, mode: SearchMode, flt: Mapping[str, Any],
                            top_k: int) -> list[LayerHit]:
        started = time.perf_counter()
        try:
            if layer in ("short_term", "working"):
                return self.episode.search(layer, query, flt, top_k)
            return await self._search_long_term(layer, query, mode, flt, top_k)
        finally:
            self._metrics.retrieval((time.perf_counter() - started) * 1000, layer)

    async def _shared_boards(self) -> list[str]:
        boards = list(dict.fromkeys(self.settings.shared_boards))
        now = time.monotonic()
        if self._joined is None or now >= self._joined[0]:
            joined: tuple[str, ...] = ()
            try:
                joined = (await self._agent.subscriptions()).boards
            except BlackboardError as exc:  # no inbox yet, or not allowed: the shared_boards alone
                log.debug("agent %s: boards joined unknown (%s)", self.agent_id, exc)
            self._joined = (now + max(self.settings.cache_ttl, 1.0), joined)
        return list(dict.fromkeys(boards + list(self._joined[1])))

    async def _search_long_term(self, layer: Layer, query: str, mode: SearchMode, flt: Mapping[str, Any],
                                top_k: int) -> list[LayerHit]:
        args = dict(flt)
        given = [b for b in [args.pop("board", None), *(args.pop("boards", None) or ())] if b]
        if layer == "long_term":
            boards = given or [self.settings.long_term_board]
            args["author"] = self.agent_id
        else:
            boards = given or await self._shared_boards()
            if not boards:
                return []
        key = (layer, query, mode, top_k, tuple(boards), repr(sorted(args.items())))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        recalled: list[MemoryHit] = await self._agent.recall(query, boards=boards, mode=mode, top_k=top_k,
                                                             **args)
        scores = normalise_scores(recalled, mode)
        hits = [hit_of_memory(h, layer=layer, score=s) for h, s in zip(recalled, scores, strict=True)]
        self._cache.put(key, hits)
        return hits

    # ------------------------------------------------------------ write and read
    async def write(self, text: str, *, layer: Layer = "short_term", key: str | None = None,
                    tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                    ttl: float | None = None, confidence: float | None = None, importance: float = 0.5,
                    board: str | None = None, kind: MemoryKind | None = None) -> str:
        """Write ``text`` to ``layer``; returns its id (``st:<episode>:<n>``, ``wm:<key>``, or the
        long-term memory id).

        short_term: a ``note`` item of the current episode (``key``, ``metadata``, ``confidence``,
        ``importance``, ``kind`` kept on it). working: a note under ``key`` (a fresh
        ``note-<n>`` without one) living ``ttl`` seconds (default ``settings.working_ttl``).
        long_term: a memory on ``board`` (default ``settings.long_term_board``); shared: on
        ``board`` (default the first of ``settings.shared_boards``). ``key`` is then the
        subject key (docs/memory-lifecycle.md).

        Raises:
            InvalidPayloadError: empty text, an unknown or disabled layer, a ttl outside the
                working layer, no board for the shared layer, or what the layer refuses.
            NotConnectedError, OperationTimeoutError, PayloadTooLargeError: (long-term) not stored.
        """
        self._check_open()
        self._start_background()
        layer = _check_layer(layer, self.settings)
        if not isinstance(text, str) or not text.strip():
            raise InvalidPayloadError("memory text must be a non-empty string")
        if ttl is not None and layer != "working":
            raise InvalidPayloadError(f"ttl applies to the working layer only, not {layer}")
        if layer == "short_term":
            extra: dict[str, Any] = {"note": text, "key": key, "kind": kind, "confidence": confidence,
                                     "metadata": dict(metadata) if metadata else None}
            if importance != 0.5:
                extra["importance"] = importance
            return self.episode.item_id(self.episode.short_term.add(tags=tuple(tags), **extra))
        if layer == "working":
            working = self.episode.working
            when: float | DefaultTTL = DefaultTTL.DEFAULT if ttl is None else ttl
            note = working.set(key, text, kind="note", ttl=when) if key else working.append("note", text, ttl=when)
            return f"{WORKING_PREFIX}{note.key}"
        target = self._board_of(layer, board)
        memory_id = await self.longterm.remember(text, kind=kind or "episodic", tags=tags, metadata=metadata,
                                                 importance=importance, board=target, key=key,
                                                 confidence=confidence)
        self._cache.clear()
        return memory_id

    def _board_of(self, layer: Layer, board: str | None) -> str:
        if board:
            return board
        if layer == "long_term":
            return self.settings.long_term_board
        if self.settings.shared_boards:
            return self.settings.shared_boards[0]
        raise InvalidPayloadError("the shared layer needs a board (board=..., or agent_memory.shared_boards)")

    async def read(self, id_or_key: str, *, layer: Layer | None = None, board: str | None = None) -> LayerHit:
        """One item by id or key: ``st:<episode>:<n>`` (short_term), ``wm:<key>`` or a working key,
        else a long-term memory id on ``board`` (default ``settings.long_term_board``; the
        memory's layer is long_term when this agent wrote it, else shared). Score 1.0.

        Raises:
            NotFoundError: nothing by that id or key.
            InvalidPayloadError: an unknown or disabled layer.
            PermissionDeniedError, SearchError: (long-term) refused, or no search service.
        """
        self._check_open()
        if layer is not None:
            layer = _check_layer(layer, self.settings)
        if not isinstance(id_or_key, str) or not id_or_key:
            raise InvalidPayloadError("read needs an id or key")
        episode = self.episode
        if id_or_key.startswith(SHORT_TERM_PREFIX):
            episode_id, _, number = id_or_key.removeprefix(SHORT_TERM_PREFIX).rpartition(":")
            found = self._find_episode(episode_id)
            if found is None:
                raise NotFoundError(id_or_key, f"no open episode {episode_id!r}")
            return found.item_hit(found.find_item(number))
        if layer == "short_term":
            return episode.item_hit(episode.find_item(id_or_key))
        if id_or_key.startswith(WORKING_PREFIX) or layer == "working" or (layer is None and id_or_key in episode.working):
            return episode.note_hit(episode.find_note(id_or_key))
        target = board or (self._board_of(layer, None) if layer == "shared" else self.settings.long_term_board)
        memory = (await self(id_or_key, board=target)).memory
        return hit_of_memory(memory, layer="long_term" if memory.agent == self.agent_id else "shared", score=1.0)

    # ------------------------------------------------------------ summarize and prune
    async def _summary_text(self, texts: Sequence[str], strategy: SummaryStrategy, target_tokens: int,
                            keep: Mapping[str, str]) -> str:
        if strategy == "llm":
            if self._summarizer is None:
                from agents_sdk.memory.summarizer import OpenAISummarizer

                self._summarizer = OpenAISummarizer.from_settings(self._agent.settings.llm)
            return await llm_summary(self._summarizer, texts, target_tokens=target_tokens, keep=keep,
                                     count_tokens=self.counter)
        if strategy != "extractive":
            raise InvalidPayloadError(f"strategy must be extractive or llm, not {strategy!r}")
        return extractive_summary(texts, target_tokens=target_tokens, keep=keep, count_tokens=self.counter)

    async def summarize(self, *, layer: Layer = "short_term", query: str | None = None, ids: Sequence[str] = (),
                        strategy: SummaryStrategy | None = None, target_tokens: int | None = None,
                        keep_keys: Sequence[str] = (), board: str | None = None,
                        replace: bool = False) -> SummaryResult:
        """Summarize a layer's items: ``ids``, else those matching ``query``, else all of a local
        layer (a long-term layer needs ``ids`` or ``query``). ``strategy`` defaults to
        ``settings.summarize_strategy``, ``target_tokens`` to ``settings.summary_tokens``; the
        ``keep_keys`` open the summary verbatim.

        With ``replace=True`` the summary takes their place: locally the items are removed and a
        ``summary`` item (short_term) or note ``summary`` (working) written; on long_term/shared
        the summary is remembered on ``board`` and the sources archived through the search
        service (the agent's own memories; others' only with ``admin`` on the board: the service
        is asked first, with nothing written if it refuses).

        Raises:
            InvalidPayloadError: an unknown or disabled layer or strategy; nothing to summarize.
            PermissionDeniedError: (replace, long-term) the agent may not archive those memories.
            LLMError: the LLM summary failed.
        """
        self._check_open()
        layer = _check_layer(layer, self.settings)
        strategy = strategy or self.settings.summarize_strategy
        target = self.settings.summary_tokens if target_tokens is None else int(target_tokens)
        if target < 1:
            raise InvalidPayloadError(f"target_tokens must be at least 1, got {target}")
        if layer in ("short_term", "working"):
            return await self._summarize_local(layer, query, ids, strategy, target, keep_keys, replace)
        return await self._summarize_long_term(layer, query, ids, strategy, target, keep_keys, board, replace)

    async def _summarize_local(self, layer: Layer, query: str | None, ids: Sequence[str],
                               strategy: SummaryStrategy, target: int, keep_keys: Sequence[str],
                               replace: bool) -> SummaryResult:
        episode = self.episode
        hits = episode.select(layer, query, ids)
        if not hits:
            raise InvalidPayloadError(f"nothing to summarize in {layer}")
        kept = pick_kept(episode.keyed(), keep_keys)
        text = await self._summary_text([h.text for h in hits], strategy, target, kept)
        written: str | None = None
        replaced: tuple[str, ...] = ()
        if replace:
            written = episode.replace(layer, hits, text)
            replaced = tuple(h.id for h in hits)
            self._metrics.pruned(layer, len(replaced))
        return SummaryResult(layer, text, strategy, tuple(h.id for h in hits), self.counter(text), kept,
                             written, replaced)

    async def _summarize_long_term(self, layer: Layer, query: str | None, ids: Sequence[str],
                                   strategy: SummaryStrategy, target: int, keep_keys: Sequence[str],
                                   board: str | None, replace: bool) -> SummaryResult:
        if ids:
            hits = [await self.read(i, layer=layer, board=board) for i in ids]
        elif query:
            hits = await self.search(query, layers=[layer], filters={"board": board} if board else None)
        else:
            raise InvalidPayloadError(f"summarizing {layer} needs ids or a query")
        if not hits:
            raise InvalidPayloadError(f"nothing to summarize in {layer}")
        keyed = {str(h.provenance["key"]): h.text for h in hits if h.provenance.get("key")}
        kept = pick_kept(keyed, keep_keys)
        text = await self._summary_text([h.text for h in hits], strategy, target, kept)
        written: str | None = None
        replaced: tuple[str, ...] = ()
        if replace:
            target_board = board or hits[0].source
            if any(h.source != target_board for h in hits):
                raise InvalidPayloadError("summarize(replace=True) replaces memories of one board: give board=")
            source_ids = [h.id for h in hits]
            await self._archive(target_board, source_ids, dry_run=True)  # refused before anything is written
            written = await self.longterm.remember(text, kind="summary", tags=["summary"], board=target_board,
                                                   metadata={"summarizes": source_ids}, source="summary")
            replaced = tuple(await self._archive(target_board, source_ids, dry_run=False))
            self._cache.clear()
            self._metrics.pruned(layer, len(replaced))
        return SummaryResult(layer, text, strategy, tuple(h.id for h in hits), self.counter(text), kept,
                             written, replaced)

    async def _archive(self, board: str, ids: Sequence[str], *, dry_run: bool) -> list[str]:
        reply = await self._agent.search.archive(board, list(ids), reason="summarized", dry_run=dry_run)
        return list(reply.archived)

    async def prune(self, *, layer: Layer = "long_term", strategy: PruneStrategy = "low_confidence",
                    threshold: float | None = None, board: str | None = None,
                    scope: Literal["own", "all"] = "own", dry_run: bool = False,
                    limit: int | None = None) -> PruneResult:
        """Prune a layer by ``strategy`` (:data:`~agents_sdk.memory.layers.PruneStrategy`).

        long_term/shared: the search service archives the memories of ``board`` (default
        ``settings.long_term_board``, or the first shared board) that the strategy picks, with
        ``threshold`` (None: the service's setting); ``scope="own"`` touches this agent's
        memories only, ``"all"`` needs ``admin`` on the board. short_term/working (always the
        agent's own): ``threshold`` default ``settings.auto_prune_threshold``; lru and old_age
        remove items older than ``threshold`` seconds (working: lru by last write, old_age by
        first), low_confidence and importance items whose ``confidence``/``importance`` is
        below it (items without one are kept), max_per_board all but the newest ``threshold``.
        ``limit`` bounds the count (oldest first); ``dry_run`` removes nothing.

        Raises:
            InvalidPayloadError: an unknown or disabled layer, strategy or scope.
            PermissionDeniedError: (long-term) scope "all" without admin rights on the board.
            SearchError: (long-term) no search service answered.
        """
        self._check_open()
        layer = _check_layer(layer, self.settings)
        if strategy not in PRUNE_STRATEGIES:
            raise InvalidPayloadError(f"unknown prune strategy {strategy!r} (one of {', '.join(PRUNE_STRATEGIES)})")
        if scope not in ("own", "all"):
            raise InvalidPayloadError(f"scope must be 'own' or 'all', not {scope!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise InvalidPayloadError(f"limit must be a positive integer, got {limit!r}")
        if layer in ("short_term", "working"):
            value = self.settings.auto_prune_threshold if threshold is None else float(threshold)
            ids = self.episode.prune(layer, strategy, value, limit=limit, dry_run=dry_run)
            if not dry_run:
                self._metrics.pruned(layer, len(ids))
            return PruneResult(layer, strategy, None, tuple(ids), dry_run)
        target = self._board_of(layer, board)
        reply = await self._agent.search.prune(target, strategy=strategy, threshold=threshold, scope=scope,
                                               dry_run=dry_run, limit=limit)
        pruned = tuple(reply.ids)
        if not dry_run:
            self._cache.clear()
            self._metrics.pruned(layer, len(pruned))
        return PruneResult(layer, strategy, target, pruned, dry_run)

    # ------------------------------------------------------------ actions, stores, context (H-B, H-C)
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool definitions of the memory actions (:func:`agents_sdk.memory.actions.memory_tools`)."""
        from agents_sdk.memory.actions import memory_tools

        return memory_tools()

    async def call(self, tool_call: Any) -> ActionResult:
        """Run one tool call of a model on this memory (:func:`agents_sdk.memory.actions.call_action`);
        never raises for the call's faults: the result says ``ok=False`` and why."""
        from agents_sdk.memory.actions import call_action

        return await call_action(self, tool_call)

    def attach(self, store: str | MemoryStore, *, read: bool = True, write: bool = False, top_k: int = 5,
               similarity_threshold: float = 0.0,
               stages: Iterable[Stage] = ("pre", "plan", "gen", "critique")) -> Attachment:
        """Attach a store (by its name in ``settings.stores_file``, or a store object) with rights,
        ``top_k``, a similarity threshold and the stages it is read at
        (:meth:`~agents_sdk.memory.attachments.Attachments.attach`).

        Raises:
            ConfigurationError: an undeclared store, write on a read-only one, bad options.
        """
        return self.attachments.attach(store, read=read, write=write, top_k=top_k,
                                       similarity_threshold=similarity_threshold, stages=stages)

    async def context(self, stage: Stage, query: str, *, budget: int | None = None) -> RenderedContext:
        """The related-memories block of the stores attached for ``stage``, within ``budget``
        tokens (default ``settings.context_budget``;
        :meth:`~agents_sdk.memory.attachments.Attachments.context`). Its hits count as recalled,
        and as used when the step then succeeds (:meth:`mark_step`).

        Raises:
            InvalidPayloadError: an unknown stage or a budget below 1.
        """
        self._check_open()
        started = time.perf_counter()
        rendered = await self.attachments.context(stage, query, budget=budget)
        ms = (time.perf_counter() - started) * 1000
        self._metrics.retrieval(ms)
        self._metrics.retrieval(ms, "context")
        self._metrics.rendered(hit.id for hit in rendered.hits)
        return rendered

    async def after_turn(self, text: str, *, stage: Stage | None = None,
                         metadata: Mapping[str, Any] | None = None) -> list[str]:
        """Store a finished turn in the stores attached with ``write``; returns the ids written
        (:meth:`~agents_sdk.memory.attachments.Attachments.after_turn`)."""
        self._check_open()
        return await self.attachments.after_turn(text, stage=stage, metadata=metadata)

    # ------------------------------------------------------------ usage and metrics
    def mark_used(self, ids: Iterable[str]) -> None:
        """Count recalled ``ids`` as used (ids never recalled are ignored)."""
        self._metrics.used([ids] if isinstance(ids, str) else ids)

    def mark_step(self, *, success: bool) -> None:
        """End a step: when it succeeded, the ids ``context`` rendered since the last step count as used."""
        self._metrics.step(success)

    def metrics(self) -> MemoryMetrics:
        """A snapshot of the metrics (:class:`MemoryMetrics`; ``as_dict()`` for JSON)."""
        episode = self.episode
        sizes: dict[str, int] = {"short_term_items": len(episode.short_term),
                                 "short_term_bytes": episode.short_term.nbytes,
                                 "working_items": len(episode.working)}
        if self._attachments is not None:
            sizes.update((f"store:{name}", size) for name, size in self._attachments.sizes().items())
        fallbacks = self._router.fallbacks if isinstance(self._router, LLMRouter) else 0
        return self._metrics.snapshot(sizes, fallbacks, (self._cache.hits, self._cache.misses))

    # ------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidPayloadError("agent.memory is closed (the agent was closed)")

    def _start_background(self) -> None:
        if (self._prune_task is None and self.settings.auto_prune_interval > 0 and not self._closed
                and "long_term" in self.settings.layers):
            self._prune_task = asyncio.get_running_loop().create_task(self._auto_prune(),
                                                                      name=f"memory-prune:{self.agent_id}")

    async def _auto_prune(self) -> None:
        interval = self.settings.auto_prune_interval
        # close() sets _closed before its cancel: a cancel lost in a prune's requests
        # (Python 3.11's wait_for returns a ready answer instead of raising it) ends the loop here.
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                await self.prune(layer="long_term", strategy=self.settings.auto_prune_strategy,
                                 threshold=self.settings.auto_prune_threshold, scope="own")
            except BlackboardError as exc:  # the next interval tries again
                log.warning("agent %s: automatic prune failed: %s", self.agent_id, exc)

    async def close(self) -> None:
        """Stop the automatic prune, close the attachments and the router's and summarizer's
        clients. Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        async with contextlib.AsyncExitStack() as stack:
            if self._prune_task is not None:
                task = self._prune_task
                task.cancel()

                async def _stopped() -> None:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                stack.push_async_callback(_stopped)
            if self._attachments is not None:
                stack.push_async_callback(self._attachments.close)
            if isinstance(self._router, LLMRouter):
                stack.push_async_callback(self._router.aclose)
            if self._summarizer is not None:
                stack.push_async_callback(self._summarizer.aclose)
