"""``BlackboardStore``: LangGraph's long-term memory (``BaseStore``) on a board.

Each item is one entry of the store's board (default ``langgraph``), written through the
SDK's :class:`~agents_sdk.board.Board`, so signatures, permissions and compare-and-set hold
as for any entry; where an item lives and the metadata it carries are in
:mod:`agents_sdk.langgraph._items`. ``get``, ``put``, ``delete``, ``list_namespaces`` and a
search without a query read and write the board's KV (consistent); a search with a query
asks the search service (``board.search``: semantic by default), which finds an item once the
worker has stored and embedded it. docs/langgraph.md tells the whole contract.

Like LangGraph's stores, :meth:`BlackboardStore.abatch` is the one real operation; the sync
methods run the async ones on the agent's event loop (:class:`LoopBridge`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, Self

from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    NamespacePath,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from agents_sdk.agent import Agent
from agents_sdk.board import Board
from agents_sdk.langgraph._bridge import LoopBridge
from agents_sdk.langgraph._items import (
    ItemRecord,
    Location,
    item_metadata,
    item_of,
    listing_order,
    location,
    namespace_matches,
    prefix_metadata,
    section_of,
    ttl_seconds,
    where_of,
)
from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import ConflictError, NotFoundError, PermissionDeniedError
from blackboard.protocol.schemas.search import SearchMode
from blackboard.settings import Settings

__all__ = ["BlackboardStore"]

#: Most revisions remembered (revision, creation, TTL) to write an item in one round trip.
_KNOWN_MAX: Final = 10_000
#: Attempts of a put that keeps meeting other writers.
_RETRIES: Final = 100
#: A read refreshes a TTL once the item's last write is older than this share of it.
_REFRESH_SHARE: Final = 0.05
#: Most hits one search asks the search service for.
_MAX_TOP_K: Final = 1000


@dataclass(frozen=True, slots=True)
class _Known:
    """What this store last saw of an item's entry."""

    revision: int
    created_at: datetime
    ttl: int | None


@dataclass(frozen=True, slots=True)
class _Found:
    """An item read from the board, with when its revision was stored (for TTL refreshes)."""

    record: ItemRecord
    where: Location
    stored_at: datetime | None


class BlackboardStore(BaseStore):
    """A LangGraph ``BaseStore`` on a board: items are board entries, found by long-term search.

    Build it inside async code from a connected agent (``BlackboardStore(agent)``), connect
    one (``await BlackboardStore.connect("me")``), or, in a program without an event loop,
    ``BlackboardStore.connect_sync("me")``, which runs an agent on a loop of its own
    (:meth:`close` stops it). The sync methods may be called from any thread but the agent's
    loop (there, await the async ones).

    Args:
        agent: a connected agent; items are written as it.
        board: the board holding the items (default ``langgraph``).
        ttl: LangGraph's ``TTLConfig``: ``default_ttl`` (minutes) for puts without one,
            ``refresh_on_read`` (default True). Expired items are removed by the server, so
            they are always omitted; ``sweep_interval_minutes`` is not needed.
        search_mode: how a search with a query ranks: ``semantic`` (cosine similarity, as
            LangGraph's stores), ``hybrid`` or ``keyword``.
        fill_unranked: when a search with a query ranks fewer items than asked for, list the
            namespace's items on the board and add those it did not rank, unscored (LangGraph's
            in-memory store does; its Postgres store does not). The listing reads the section of
            the namespace's first label: turn it off when that section is large.
        bridge: the loop the sync methods run on (default: the running loop).

    Raises:
        RuntimeError: built outside a running event loop without a ``bridge``.
        InvalidKeyError: an invalid board name.
    """

    supports_ttl: bool = True

    def __init__(self, agent: Agent, *, board: str = "langgraph", ttl: TTLConfig | None = None,
                 search_mode: SearchMode = "semantic", fill_unranked: bool = True,
                 bridge: LoopBridge | None = None) -> None:
        if bridge is None:
            try:
                bridge = LoopBridge.current()
            except RuntimeError:
                raise RuntimeError("BlackboardStore(agent) is built inside async code (on the agent's event "
                                   "loop); without one use BlackboardStore.connect_sync(...)") from None
        self.agent = agent
        self.board: Board = agent.board(board)
        self.ttl_config = ttl
        self.search_mode: SearchMode = search_mode
        self.fill_unranked = fill_unranked
        self._bridge = bridge
        self._owns_agent = False
        self._known: OrderedDict[Location, _Known] = OrderedDict()

    # ----------------------------------------------------------- lifecycle
    @classmethod
    async def connect(cls, agent_id: str, *, settings: Settings | None = None, board: str = "langgraph",
                      ttl: TTLConfig | None = None, search_mode: SearchMode = "semantic",
                      fill_unranked: bool = True) -> Self:
        """Connect an agent and build a store on it (the store owns the agent:
        :meth:`aclose` closes it); ``async with await BlackboardStore.connect(...)`` works too.

        Raises:
            what :meth:`agents_sdk.Agent.connect` raises.
        """
        agent = await Agent.connect(agent_id, settings=settings)
        store = cls(agent, board=board, ttl=ttl, search_mode=search_mode, fill_unranked=fill_unranked)
        store._owns_agent = True
        return store

    @classmethod
    def connect_sync(cls, agent_id: str, *, settings: Settings | None = None, board: str = "langgraph",
                     ttl: TTLConfig | None = None, search_mode: SearchMode = "semantic",
                     fill_unranked: bool = True) -> Self:
        """Connect an agent on an event loop of its own (a daemon thread) and build a store on
        it, for programs without an event loop; :meth:`close` (or ``with``) closes both.

        Raises:
            what :meth:`agents_sdk.Agent.connect` raises.
        """
        bridge = LoopBridge.start()

        async def connected() -> Agent:
            return await Agent.connect(agent_id, settings=settings)

        try:
            agent = bridge.run(connected(), method="connect_sync")
        except BaseException:
            bridge.close()
            raise
        store = cls(agent, board=board, ttl=ttl, search_mode=search_mode, fill_unranked=fill_unranked,
                    bridge=bridge)
        store._owns_agent = True
        return store

    async def aclose(self) -> None:
        """Close the agent if this store connected it (a no-op otherwise)."""
        if self._owns_agent:
            self._owns_agent = False
            await self.agent.close()

    def close(self) -> None:
        """Close the agent if this store connected it, and stop the loop :meth:`connect_sync`
        started.

        Raises:
            RuntimeError: called on the agent's loop (await :meth:`aclose` there).
        """
        if self._owns_agent:
            self._bridge.run(self.aclose(), method="close")
        self._bridge.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlackboardStore(board={self.board.name!r}, agent={self.agent.id!r})"

    # -------------------------------------------------------- the operation
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`abatch`, waited for on the agent's loop.

        Raises:
            RuntimeError: called on the agent's loop (await :meth:`abatch` there).
        """
        return self._bridge.run(self.abatch(list(ops)), method="batch")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run LangGraph operations; their results in order.

        Reads (gets, searches, namespace listings) run first and concurrently, then the
        writes (the last put of each item wins), as in LangGraph's in-memory store: a read
        in the batch sees the board as it was before the batch's writes.

        Raises:
            InvalidNamespaceError: an invalid namespace (a label empty, not a string, with a
                ``.``; a put's namespace empty or under ``langgraph``).
            ValueError: a negative limit or offset, a bad filter (``InvalidPayloadError``,
                a ``ValueError``, for what the ``where`` contract refuses), a TTL that is not a
                positive number of minutes, an unknown operation.
            TypeError: a value that is not a mapping, a key that is not a string.
            PermissionDeniedError, ConflictError, SearchError, TransportError: what the
                board's writes and the search service raise.
        """
        ops = list(ops)
        for op in ops:
            _check(op)
        results: list[Result] = [None] * len(ops)
        reads: list[tuple[int, Op]] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op
            else:
                reads.append((i, op))
        if reads:
            done = await asyncio.gather(*(self._read(op) for _, op in reads))
            for (i, _), result in zip(reads, done, strict=True):
                results[i] = result
        if puts:
            await asyncio.gather(*(self._put(op) for op in puts.values()))
        return results

    async def _read(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return await self._get(op)
        if isinstance(op, SearchOp):
            return await self._search(op)
        assert isinstance(op, ListNamespacesOp)
        return await self._list_namespaces(op)

    # ------------------------------------------------------------------ get
    async def _get(self, op: GetOp) -> Item | None:
        if not op.namespace:
            return None
        where = location(op.namespace, op.key)
        try:
            entry = await self.board.get(where.section, where.key)
        except NotFoundError:
            self._known.pop(where, None)
            return None
        found = self._found(entry)
        if found is None:
            return None
        if op.refresh_ttl:
            await self._refresh([found])
        return found.record.item

    def _found(self, entry: Entry) -> _Found | None:
        """The item of a live entry (None: not an item), remembered for later writes."""
        record = item_of(entry.section, entry.key, entry.revision, entry.value, entry.metadata)
        if record is None:
            return None
        where = Location(entry.section, entry.key)
        self._remember(where, _Known(record.revision, record.item.created_at, record.ttl))
        return _Found(record, where, entry.stored_at)

    # --------------------------------------------------------------- search
    async def _search(self, op: SearchOp) -> list[SearchItem]:
        where = where_of(op.filter)
        prefix = tuple(op.namespace_prefix)
        section = section_of(prefix[0]) if prefix else None
        want = op.offset + op.limit
        page: list[tuple[_Found, float | None]]
        if not op.query:
            page = [(f, None) for f in (await self._list(section, prefix, where))[op.offset:want]]
        else:
            ranked: list[tuple[_Found, float | None]] = []
            if want > 0:
                filters: dict[str, Any] = {"where": where} if where else {}
                hits = await self.board.search(op.query, section=section, mode=self.search_mode,
                                               metadata=prefix_metadata(prefix, indexed_only=True),
                                               top_k=min(want, _MAX_TOP_K), **filters)
                for hit in hits:
                    record = item_of(hit.section, hit.key, hit.revision, hit.value, hit.metadata)
                    if record is not None and record.item.namespace[:len(prefix)] == prefix:
                        ranked.append((_Found(record, Location(hit.section, hit.key), hit.updated_at), hit.score))
            if len(ranked) < want and self.fill_unranked:
                # Fewer ranked items than asked for: the others follow, unscored, as in
                # LangGraph's in-memory store (not indexed, or not embedded yet). The board's
                # current items also replace the search's (which may be a little behind).
                listed = await self._list(section, prefix, where)
                live = {f.where: f for f in listed}
                ranked = [(live[f.where], score) for f, score in ranked if f.where in live]
                seen = {f.where for f, _ in ranked}
                ranked += [(f, None) for f in listed if f.where not in seen]
            page = ranked[op.offset:want]
        if op.refresh_ttl:
            await self._refresh([f for f, _ in page])
        return [SearchItem(namespace=f.record.item.namespace, key=f.record.item.key, value=f.record.item.value,
                           created_at=f.record.item.created_at, updated_at=f.record.item.updated_at, score=score)
                for f, score in page]

    async def _list(self, section: str | None, prefix: tuple[str, ...], where: Mapping[str, Any]) -> list[_Found]:
        """The items under ``prefix`` that pass ``where``, from the KV, in insertion order."""
        entries = await self.board.entries(section, where=where or None)
        found = [f for f in map(self._found, entries)
                 if f is not None and f.record.item.namespace[:len(prefix)] == prefix]
        return listing_order(found, lambda f: f.record.item)

    # ------------------------------------------------------ list namespaces
    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        section = None
        for cond in conditions:
            if cond.match_type == "prefix" and cond.path and cond.path[0] != "*":
                section = section_of(cond.path[0])
        namespaces = {f.record.item.namespace for f in map(self._found, await self.board.entries(section))
                      if f is not None}
        matching = [ns for ns in namespaces if namespace_matches(ns, conditions)]
        if op.max_depth is not None:
            matching = list({ns[:op.max_depth] for ns in matching})
        return sorted(matching)[op.offset:op.offset + op.limit]

    # ------------------------------------------------------------------ put
    async def _put(self, op: PutOp) -> None:
        if not op.namespace:  # a delete there: nothing can be stored under ()
            return
        where = location(op.namespace, op.key)
        if op.value is None:
            self._known.pop(where, None)
            try:
                await self.board.delete(where.section, where.key)
            except NotFoundError:
                pass
            return
        ttl = ttl_seconds(op.ttl)
        value = dict(op.value)
        last: ConflictError | None = None
        for attempt in range(_RETRIES):
            known = self._known.get(where)
            now = datetime.now(UTC)
            created = known.created_at if known is not None else now
            meta = item_metadata(op.namespace, op.key, created_at=created, updated_at=now, ttl_minutes=op.ttl,
                                 index=op.index is not False)
            try:
                if known is None:
                    rev = await self.board.create(where.section, where.key, value, metadata=meta, ttl=ttl)
                elif ttl is not None and (known.ttl is None or known.ttl > ttl):
                    # The current revision would outlive this one, and the server serves the
                    # newest revision still kept once this one expires: a tombstone first.
                    await self.board.delete(where.section, where.key, expected_revision=known.revision)
                    self._known.pop(where, None)
                    rev = await self.board.create(where.section, where.key, value, metadata=meta, ttl=ttl)
                else:
                    rev = await self.board.update(where.section, where.key, value, expected_revision=known.revision,
                                                  metadata=meta, ttl=ttl)
            except ConflictError as exc:
                last = exc
                await self._reload(where)
                if attempt:
                    await asyncio.sleep(min(0.001 * attempt, 0.05))
                continue
            self._remember(where, _Known(rev, created, ttl))
            return
        assert last is not None
        raise last

    async def _reload(self, where: Location) -> None:
        """Remember the item's current revision (after a conflict)."""
        try:
            entry = await self.board.get(where.section, where.key)
        except NotFoundError:
            self._known.pop(where, None)
            return
        if self._found(entry) is None:  # an entry that is no item: overwritten as new, TTL unknown
            self._remember(where, _Known(entry.revision, datetime.now(UTC), None))

    def _remember(self, where: Location, known: _Known) -> None:
        self._known[where] = known
        self._known.move_to_end(where)
        if len(self._known) > _KNOWN_MAX:
            self._known.popitem(last=False)

    # ------------------------------------------------------------------ TTL
    async def _refresh(self, found: list[_Found]) -> None:
        """Write again, unchanged, the items with a TTL whose last write is older than
        ``_REFRESH_SHARE`` of it (at least a second): their TTL starts again. Best effort:
        an item written meanwhile (it is fresh), gone, or not writable by this agent is left."""
        now = datetime.now(UTC)
        due = [f for f in found if f.record.ttl is not None
               and (f.stored_at is None
                    or (now - f.stored_at).total_seconds() >= max(1.0, f.record.ttl * _REFRESH_SHARE))]
        if due:
            await asyncio.gather(*(self._refresh_one(f) for f in due))

    async def _refresh_one(self, f: _Found) -> None:
        try:
            rev = await self.board.update(f.where.section, f.where.key, f.record.item.value,
                                          expected_revision=f.record.revision, metadata=f.record.metadata,
                                          ttl=f.record.ttl)
        except (ConflictError, NotFoundError, PermissionDeniedError):
            return
        self._remember(f.where, _Known(rev, f.record.item.created_at, f.record.ttl))

    # ------------------------------------------------------- sync methods
    # BaseStore's sync methods call batch(); these run the async ones instead, so an error on
    # the agent's loop names the right async method.
    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        """See :meth:`BaseStore.get` (a sync call of :meth:`aget`)."""
        return self._bridge.run(self.aget(namespace, key, refresh_ttl=refresh_ttl), method="get")

    def search(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None,
               filter: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
               refresh_ttl: bool | None = None) -> list[SearchItem]:
        """See :meth:`BaseStore.search` (a sync call of :meth:`asearch`)."""
        return self._bridge.run(self.asearch(namespace_prefix, query=query, filter=filter, limit=limit,
                                             offset=offset, refresh_ttl=refresh_ttl), method="search")

    def put(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any],
            index: Literal[False] | list[str] | None = None, *,
            ttl: float | NotProvided | None = NOT_PROVIDED) -> None:
        """See :meth:`BaseStore.put` (a sync call of :meth:`aput`)."""
        self._bridge.run(self.aput(namespace, key, value, index, ttl=ttl), method="put")

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        """See :meth:`BaseStore.delete` (a sync call of :meth:`adelete`)."""
        self._bridge.run(self.adelete(namespace, key), method="delete")

    def list_namespaces(self, *, prefix: NamespacePath | None = None, suffix: NamespacePath | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        """See :meth:`BaseStore.list_namespaces` (a sync call of :meth:`alist_namespaces`)."""
        return self._bridge.run(self.alist_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth,
                                                      limit=limit, offset=offset), method="list_namespaces")


def _count(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r}")


def _check(op: Op) -> None:
    """Refuse an invalid operation before any of the batch runs (the checks BaseStore's
    methods make, for operations given to ``batch`` directly, and this store's own).

    Raises:
        InvalidNamespaceError, ValueError, TypeError: see :meth:`BlackboardStore.abatch`.
    """
    if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
        raise ValueError(f"unknown operation {type(op).__name__}")
    validate_op_namespace(op)
    if isinstance(op, GetOp | PutOp):
        if not isinstance(op.key, str):
            raise TypeError(f"an item's key is a string, not {type(op.key).__name__}")
    if isinstance(op, PutOp):
        if op.value is None:
            return
        if not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if op.namespace[0] == "langgraph":
            raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {op.namespace}')
        if not isinstance(op.value, Mapping):
            raise TypeError(f"an item's value is a mapping, not {type(op.value).__name__}")
        if op.index is not None and op.index is not False and not isinstance(op.index, list):
            raise TypeError("index is False, None or a list of field paths")
        ttl_seconds(op.ttl)
    elif isinstance(op, SearchOp):
        _count(op.limit, "limit")
        _count(op.offset, "offset")
        if op.query is not None and not isinstance(op.query, str):
            raise TypeError(f"a query is a string, not {type(op.query).__name__}")
        where_of(op.filter)
    elif isinstance(op, ListNamespacesOp):
        _count(op.limit, "limit")
        _count(op.offset, "offset")
        if op.max_depth is not None:
            _count(op.max_depth, "max_depth")
            if op.max_depth < 1:
                raise ValueError("max_depth must be at least 1")
