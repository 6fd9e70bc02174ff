"""Episodes: a (task id, episode id) that scopes the short-term and working memory of
``agent.memory`` (docs/memory.md, "Episodes").

An :class:`Episode` holds its own :class:`~agents_sdk.memory.short_term.ShortTermMemory` and
:class:`~agents_sdk.memory.working.WorkingMemory`, bounded by ``agent_memory``'s limits, and
the operations of the two local layers on them (search, read, prune, replace by a summary).
Ending one (``agent.memory.end_episode``) can summarize it into long-term memory
(:class:`EpisodeSummary`), then clears it. Local and pure: no IO here.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from agents_sdk.memory.items import MemoryItem, render_value
from agents_sdk.memory.layers import (
    SHORT_TERM_PREFIX,
    WORKING_PREFIX,
    Layer,
    LayerHit,
    PruneStrategy,
    hit_of_item,
    hit_of_working,
    item_kind,
    item_text,
    lexical_score,
    query_terms,
    working_text,
)
from agents_sdk.memory.short_term import ShortTermMemory
from agents_sdk.memory.working import WorkingItem, WorkingMemory
from blackboard.protocol.errors import InvalidKeyError, NotFoundError
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


def _kinds(filters: Mapping[str, Any]) -> set[str]:
    return set(filters.get("kinds") or ()) | ({filters["kind"]} if filters.get("kind") else set())


@dataclass(eq=False)
class Episode:
    """One episode's local memory.

    Attributes:
        task_id: the task it serves.
        episode_id: its id (unique among the agent's open episodes).
        short_term: its items (steps, notes).
        working: its notes with a time-to-live.
        started_at: wall-clock seconds when it began.
        ended: whether ``end_episode`` ended it.
        agent: the agent it belongs to (its hits' provenance).
    """

    task_id: str
    episode_id: str
    short_term: ShortTermMemory
    working: WorkingMemory
    started_at: float = field(default_factory=time.time)
    ended: bool = False
    agent: str = ""
    clock: Callable[[], float] = field(default=time.time, repr=False)
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False)
    #: The words of each short-term item searched, by item id.
    _terms: dict[int, tuple[MemoryItem, frozenset[str]]] = field(default_factory=dict, repr=False)

    @classmethod
    def new(cls, task_id: str, episode_id: str, settings: AgentMemorySettings, *, agent: str = "",
            clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> Episode:
        """An empty episode bounded by ``settings`` (``short_term_max_items``/``_bytes``, ``working_ttl``);
        ``clock`` stamps its items (wall-clock seconds), ``monotonic`` times its notes' TTLs.

        Raises:
            InvalidKeyError: a task or episode id outside ``[A-Za-z0-9_.:-]{1,128}``.
        """
        return cls(_check(task_id, "task id"), _check(episode_id, "episode id"),
                   ShortTermMemory(max_items=settings.short_term_max_items,
                                   max_bytes=settings.short_term_max_bytes, clock=clock),
                   WorkingMemory(default_ttl=settings.working_ttl, clock=monotonic), started_at=clock(),
                   agent=agent, clock=clock, monotonic=monotonic)

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
        self._terms.clear()

    @property
    def empty(self) -> bool:
        return len(self.short_term) == 0 and len(self.working) == 0

    # -- hits -------------------------------------------------------------
    def item_hit(self, item: MemoryItem, score: float = 1.0) -> LayerHit:
        return hit_of_item(item, episode_id=self.episode_id, task_id=self.task_id, score=score, agent=self.agent)

    def note_hit(self, note: WorkingItem, score: float = 1.0) -> LayerHit:
        return hit_of_working(note, episode_id=self.episode_id, task_id=self.task_id, score=score,
                              agent=self.agent)

    def item_id(self, item: MemoryItem) -> str:
        """The hit id of a short-term item of this episode: ``st:<episode id>:<item id>``."""
        return f"{SHORT_TERM_PREFIX}{self.episode_id}:{item.id}"

    def find_item(self, ref: str) -> MemoryItem:
        """A short-term item by its number (``"12"``) or the ``key`` it was written with (the newest).

        Raises:
            NotFoundError: none.
        """
        item = self.short_term.get(int(ref)) if ref.isdigit() else None
        if item is None:
            keyed = [i for i in self.short_term if i.extra.get("key") == ref]
            item = keyed[-1] if keyed else None
        if item is None:
            raise NotFoundError(ref, f"no short-term item {ref!r} in episode {self.episode_id!r}")
        return item

    def find_note(self, ref: str) -> WorkingItem:
        """A live working note by key (``wm:<key>`` or the key).

        Raises:
            NotFoundError: none.
        """
        key = ref.removeprefix(WORKING_PREFIX)
        note = self.working.item(key)
        if note is None:
            raise NotFoundError(ref, f"no working note {key!r} in episode {self.episode_id!r}")
        return note

    # -- the local layers' operations -------------------------------------
    def search(self, layer: Layer, query: str, filters: Mapping[str, Any], top_k: int) -> list[LayerHit]:
        """The hits of ``query`` in the short_term or working layer: scored by
        :func:`~agents_sdk.memory.layers.lexical_score` (an item holding no query word is no hit;
        an empty query lists the layer at score 0), best first, newest first on ties. Filters:
        ``tags_any``/``tags_all`` and ``since``/``until`` (short-term items; they leave working
        notes out, which have neither), ``kind``/``kinds``; ``board``/``boards``/an ``author``
        other than the agent leave both out (local items have no board).
        """
        author = filters.get("author")
        if filters.get("board") or filters.get("boards") or (author is not None and author != self.agent):
            return []
        terms, kinds = query_terms(query), _kinds(filters)
        if layer == "short_term":
            since, until = filters.get("since"), filters.get("until")
            tags_any, tags_all = set(filters.get("tags_any") or ()), set(filters.get("tags_all") or ())
            items: list[tuple[float, MemoryItem]] = []
            for item in reversed(self.short_term):  # newest first: the sort below is stable
                if since is not None or until is not None:
                    created = datetime.fromtimestamp(item.created_at, UTC)
                    if (since is not None and created < since) or (until is not None and created > until):
                        continue
                if (tags_any and not tags_any & set(item.tags)) or not tags_all <= set(item.tags):
                    continue
                if kinds and item_kind(item) not in kinds:
                    continue
                score = len(terms & self._item_terms(item)) / len(terms) if terms else 0.0
                if not terms or score > 0:
                    items.append((score, item))
            items.sort(key=lambda pair: -pair[0])
            self._forget_terms()
            return [self.item_hit(item, score) for score, item in items[:top_k]]
        if any(filters.get(k) is not None for k in ("since", "until")) or filters.get("tags_any") or \
                filters.get("tags_all"):
            return []
        notes: list[tuple[float, WorkingItem]] = []
        for note in reversed(self.working.live()):
            score = lexical_score(terms, working_text(note)) if terms else 0.0
            if (not terms or score > 0) and (not kinds or note.kind in kinds):
                notes.append((score, note))
        notes.sort(key=lambda pair: -pair[0])
        return [self.note_hit(note, score) for score, note in notes[:top_k]]

    def _item_terms(self, item: MemoryItem) -> frozenset[str]:
        """An item's words (items never change: computed once per item)."""
        found = self._terms.get(item.id)
        if found is None or found[0] is not item:  # another item under a reused id: computed again
            found = self._terms[item.id] = (item, query_terms(item_text(item)))
        return found[1]

    def _forget_terms(self) -> None:
        if len(self._terms) > 2 * len(self.short_term) + 64:  # items evicted or deleted since
            self._terms = {i: t for i, t in self._terms.items() if i in self.short_term}

    def select(self, layer: Layer, query: str | None, refs: Sequence[str]) -> list[LayerHit]:
        """What a summary of ``layer`` takes: the items ``refs`` (hit ids, numbers or keys), else
        those holding a word of ``query``, else all, oldest first.

        Raises:
            NotFoundError: a ref names nothing.
        """
        if refs:
            return [self.item_hit(self.find_item(r.rpartition(":")[2] if r.startswith(SHORT_TERM_PREFIX) else r))
                    if layer == "short_term" else self.note_hit(self.find_note(r)) for r in refs]
        hits = ([self.item_hit(i) for i in self.short_term] if layer == "short_term"
                else [self.note_hit(n) for n in self.working.live()])
        if query:
            terms = query_terms(query)
            hits = [h for h in hits if lexical_score(terms, h.text) > 0]
        return hits

    def replace(self, layer: Layer, hits: Iterable[LayerHit], text: str) -> str:
        """Remove ``hits`` (of :meth:`select`) and write ``text`` in their place: a ``summary``
        item (short_term) or the note ``summary`` (working); returns its id."""
        for hit in hits:
            if layer == "short_term":
                self.short_term.delete(int(hit.provenance["item"]))
            else:
                self.working.delete(str(hit.provenance["key"]))
        if layer == "short_term":
            return self.item_id(self.short_term.add(note=text, kind="summary", tags=("summary",)))
        return f"{WORKING_PREFIX}{self.working.set('summary', text, kind='summary').key}"

    def prune(self, layer: Layer, strategy: PruneStrategy, threshold: float, *, limit: int | None = None,
              dry_run: bool = False) -> list[str]:
        """Remove what ``strategy`` picks from ``layer`` (oldest first, at most ``limit``); returns
        the hit ids (``dry_run``: that would go). lru/old_age: older than ``threshold`` seconds
        (short-term items by their write time, never rewritten; working notes lru by the last
        write, old_age by the first); low_confidence/importance: items written with a
        ``confidence``/``importance`` below ``threshold`` (working notes have neither);
        max_per_board: all but the newest ``threshold``."""
        if layer == "short_term":
            items = list(self.short_term)
            now = self.clock()
            if strategy in ("lru", "old_age"):
                doomed = [i for i in items if now - i.created_at > threshold]
            elif strategy == "max_per_board":
                doomed = items[:max(0, len(items) - int(threshold))]
            else:
                name = "confidence" if strategy == "low_confidence" else "importance"
                doomed = [i for i in items if isinstance(i.extra.get(name), int | float) and i.extra[name] < threshold]
            doomed = doomed[:limit] if limit is not None else doomed
            if not dry_run:
                for i in doomed:
                    self.short_term.delete(i.id)
            return [self.item_id(i) for i in doomed]
        notes = sorted(self.working.live(), key=lambda n: n.seq)
        mono = self.monotonic()
        if strategy == "lru":
            gone = [n for n in notes if mono - n.updated_at > threshold]
        elif strategy == "old_age":
            gone = [n for n in notes if mono - n.created_at > threshold]
        elif strategy == "max_per_board":
            gone = notes[:max(0, len(notes) - int(threshold))]
        else:
            gone = []
        gone = gone[:limit] if limit is not None else gone
        if not dry_run:
            for n in gone:
                self.working.delete(n.key)
        return [f"{WORKING_PREFIX}{n.key}" for n in gone]


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
