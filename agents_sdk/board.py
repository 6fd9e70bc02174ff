"""``Board``: one board as seen by one agent (writes carry the agent's id)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, Unpack

from agents_sdk.consensus import (
    NO_VALUE,
    BallotReceipt,
    DeadlineSpec,
    ProposalHandle,
    VoteWatch,
    Voting,
)
from agents_sdk.context import AgentContext
from agents_sdk.objects import ObjectStore, object_name
from agents_sdk.view import View
from blackboard.client.board_store import BoardStore, Hidden, Pipeline, Watch, WatchStart, WriteOp
from blackboard.observability import tracing
from blackboard.protocol.codec import Encoding
from blackboard.protocol.entries import Entry, Operation, default_content_type
from blackboard.protocol.errors import (
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
)
from blackboard.protocol.filters import Where
from blackboard.protocol.schemas import Policy, PolicyKind
from blackboard.protocol.subjects import validate_name

if TYPE_CHECKING:
    from agents_sdk.memory.longterm import LongTermMemory
    from agents_sdk.messaging.messenger import Messenger
    from agents_sdk.messaging.send import Sent
    from agents_sdk.search import EntrySearchArgs, RecallArgs, SearchClient
    from blackboard.protocol.schemas.search import (
        EntryHit,
        EntryRevision,
        MemoryDetail,
        MemoryHit,
        SearchFilters,
    )

__all__ = ["Board", "BoardOwner", "BoardPipeline"]


class BoardOwner(Protocol):
    """What a board handle uses of its agent (:class:`agents_sdk.agent.Agent` is one).

    A Protocol, so this module depends on the parts (context, search,
    messaging, voting, memory), not on the ``Agent`` that assembles them.
    """

    @property
    def id(self) -> str: ...

    @property
    def context(self) -> AgentContext: ...

    @property
    def objects(self) -> ObjectStore: ...

    @property
    def search(self) -> SearchClient: ...

    @property
    def longterm(self) -> LongTermMemory: ...

    @property
    def messaging(self) -> Messenger: ...

    @property
    def voting(self) -> Voting: ...


class Board:
    """Operations on one board. Get one with ``agent.board(name)``.

    Keys are addressed as ``(section, key)``: the section is a token
    (``[A-Za-z0-9_-]``), the key any non-empty string (URLs, paths, text).
    """

    def __init__(self, agent: BoardOwner, name: str) -> None:
        self.name = validate_name(name, "board")
        self.agent = agent
        #: The agent's shared state (store, settings, live views).
        self.context = agent.context
        self._store: BoardStore = self.context.store

    def __repr__(self) -> str:
        return f"Board({self.name!r}, agent={self.agent.id!r})"

    # ------------------------------------------------------------------ writes
    @tracing.traced("board.put", attributes=lambda self, section, key, *_, **__: _entry_span(self, section, key))
    async def put(self, section: str, key: str, value: Any, *, content_type: str | None = None,
                  tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                  ttl: float | None = None, encoding: Encoding = "msgpack") -> int:
        """Write ``value`` unconditionally; returns the new revision.

        ``ttl`` (seconds, >= 1) makes the server remove the entry after that time.

        Raises:
            InvalidKeyError, PayloadTooLargeError, InvalidPayloadError: bad input.
            NotConnectedError, OperationTimeoutError: not acknowledged within
                ``settings.nats.write_timeout``.
        """
        rev = await self._store.put(self.name, section, key, value, author=self.agent.id,
                                    content_type=content_type, tags=tags, metadata=metadata, ttl=ttl,
                                    encoding=encoding)
        self._written(section, key, rev, value, content_type, tags, metadata)
        return rev

    @tracing.traced("board.create", attributes=lambda self, section, key, *_, **__: _entry_span(self, section, key))
    async def create(self, section: str, key: str, value: Any, *, content_type: str | None = None,
                     tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                     ttl: float | None = None) -> int:
        """Write only if the key is absent (or deleted).

        Raises:
            ConflictError: the key exists (``current_revision`` tells its revision).
        """
        rev = await self._store.create(self.name, section, key, value, author=self.agent.id,
                                       content_type=content_type, tags=tags, metadata=metadata, ttl=ttl)
        self._written(section, key, rev, value, content_type, tags, metadata)
        return rev

    @tracing.traced("board.update", attributes=lambda self, section, key, *_, **__: _entry_span(self, section, key))
    async def update(self, section: str, key: str, value: Any, *, expected_revision: int,
                     content_type: str | None = None, tags: Sequence[str] = (),
                     metadata: Mapping[str, Any] | None = None, ttl: float | None = None) -> int:
        """Compare-and-set: write only if the key is still at ``expected_revision``.

        Raises:
            ConflictError: another write came first; ``current_revision`` is the
                key's latest revision, so the caller can re-read and retry.
        """
        rev = await self._store.put(self.name, section, key, value, author=self.agent.id,
                                    content_type=content_type, tags=tags, metadata=metadata, ttl=ttl,
                                    expected_revision=expected_revision)
        self._written(section, key, rev, value, content_type, tags, metadata)
        return rev

    async def modify(self, section: str, key: str, fn: Callable[[Any], Any | Awaitable[Any]], *,
                     default: Any = None, retries: int = 100) -> int:
        """Read-modify-write with compare-and-set, retried on conflict.

        ``fn`` gets the current value (``default`` when the key is absent) and
        returns the new one. Returns the revision written.

        Raises:
            ConflictError: still conflicting after ``retries`` attempts.
        """
        last: ConflictError | None = None
        for attempt in range(retries):
            try:
                entry = await self.get(section, key)
                current, revision = entry.value, entry.revision
            except NotFoundError:
                current, revision = default, None
            new = fn(current)
            if isinstance(new, Awaitable):
                new = await new
            try:
                if revision is None:
                    return await self.create(section, key, new)
                return await self.update(section, key, new, expected_revision=revision)
            except ConflictError as exc:
                last = exc
                await asyncio.sleep(min(0.001 * (attempt + 1), 0.05))
        assert last is not None
        raise last

    @tracing.traced("board.delete", attributes=lambda self, section, key, *_, **__: _entry_span(self, section, key))
    async def delete(self, section: str, key: str, *, expected_revision: int | None = None) -> int:
        """Delete a key (a tombstone revision; the key's history stays)."""
        rev = await self._store.delete(self.name, section, key, expected_revision=expected_revision)
        self._written(section, key, rev, None, None, (), None, Operation.DELETE)
        return rev

    async def purge(self, section: str | None = None, key: str | None = None) -> int:
        """Purge one key or, with no arguments, every key of the board.

        A purge writes a purge marker (``KV-Operation: PURGE``) as the key's
        latest revision: the key reads as absent, like after a delete. Its
        earlier revisions are not dropped at once (the board stream refuses
        rollups): they age out as newer revisions push them past the history
        depth (``board.history``). The worker's stored history keeps them all.

        Returns:
            The number of keys purged.
        """
        if section is None and key is None:
            return await self._store.purge_board(self.name)
        if section is None or key is None:
            raise InvalidKeyError(str(section if key is None else key),
                                  "purge takes both section and key, or neither")
        rev = await self._store.delete(self.name, section, key, purge=True)
        self._written(section, key, rev, None, None, (), None, Operation.PURGE)
        return 1

    def pipeline(self) -> BoardPipeline:
        """Pipelined writes for bulk producers.

        ::

            async with board.pipeline() as p:
                for i in range(10_000):
                    await p.put("items", f"k{i}", i)
            # every write is acknowledged here; p.flush() returns revisions
        """
        return BoardPipeline(self._store.pipeline(author=self.agent.id), self.name)

    async def put_many(self, ops: Sequence[WriteOp]) -> list[int]:
        """Write many entries pipelined; returns their revisions in order."""
        return await self._store.pipeline(author=self.agent.id).put_many(self.name, ops)

    def _written(self, section: str, key: str, revision: int, value: Any, content_type: str | None,
                 tags: Sequence[str], metadata: Mapping[str, Any] | None,
                 operation: Operation = Operation.PUT) -> None:
        """Show an acknowledged write in this agent's views at once (read-your-own-writes),
        with the verdict its readers give it (not at all when they would hide it)."""
        views = self.context.views
        if not views.watching(self.name):
            return
        verdict = self._store.own_verdict(self.agent.id)
        if not self._store.shows(verdict):
            return
        entry = Entry(self.name, section, key, revision,
                      value=value if operation is Operation.PUT else None,
                      content_type=content_type or default_content_type(value), author=self.agent.id,
                      tags=tuple(tags), metadata=dict(metadata or {}), created_at=datetime.now(UTC),
                      operation=operation, verdict=verdict)
        views.written(entry)

    # ------------------------------------------------------------------- reads
    async def get(self, section: str, key: str, *, revision: int | None = None) -> Entry:
        """The latest entry (or the one at ``revision``), its signature verified.

        Raises:
            NotFoundError: absent, deleted, or that revision is not kept.
            UnverifiedRecordError: that revision does not verify (its ``verdict``
                says why: unsigned, written by another identity than its author...);
                with ``security.unverified = "flag"`` the entry is returned instead,
                carrying its ``verdict``.
        """
        return await self._store.get(self.name, section, key, revision=revision)

    async def history(self, section: str, key: str) -> list[Entry]:
        """The revisions JetStream keeps of a key, oldest first (deletes included); a revision
        that does not verify is left out (or, with ``security.unverified = "flag"``, listed
        with its ``verdict``)."""
        return await self._store.history(self.name, section, key)

    async def keys(self, section: str) -> list[str]:
        """The section's live keys, sorted (a key whose latest revision does not verify is absent)."""
        return await self._store.keys(self.name, section)

    async def sections(self) -> list[str]:
        """The sections holding a live key, sorted."""
        return await self._store.sections(self.name)

    async def entries(self, section: str | None = None, *,
                      where: Mapping[str, Any] | Where | None = None) -> list[Entry]:
        """The board's live entries (or one section's), sorted by (section, key); with ``where``,
        those whose metadata and value it matches: the comparison filters of :meth:`search`
        (``{"value.status": {"$in": ["open", "blocked"]}}``, docs/search.md "Filters"), applied
        here to the current values read from JetStream (no worker needed). An entry whose latest
        revision does not verify is absent.

        Raises:
            InvalidKeyError: an invalid section name.
            InvalidPayloadError: an invalid ``where`` (the message names the path and operator).
        """
        return await self._store.entries(self.name, section, where=where)

    async def attach(self, section: str, key: str, data: bytes, *, content_type: str,
                     tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None) -> int:
        """Store a large binary in the object store and write an entry referencing it.

        The entry's ``content_type`` is the binary's; its value is an
        :class:`~agents_sdk.objects.ObjectRef` (``{"$object": {...}}``).
        Returns the entry's revision.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidPayloadError("attached data must be bytes")
        name = object_name(self.name, section, key, hashlib.sha256(data).hexdigest())
        ref = await self.agent.objects.put(name, data, content_type=content_type)
        return await self.put(section, key, ref.to_value(), content_type=content_type, tags=tags,
                              metadata=metadata)

    async def fetch(self, section: str, key: str, *, revision: int | None = None) -> bytes:
        """The bytes of an entry: the referenced object, or the entry's own bytes value."""
        return await self.agent.objects.resolve(await self.get(section, key, revision=revision))

    async def search(self, query: str, *, filters: SearchFilters | None = None,
                     **args: Unpack[EntrySearchArgs]) -> list[EntryHit]:
        """Search this board's current entries (semantic, keyword or hybrid), best first.

        Takes the filters of :meth:`agents_sdk.search.SearchClient.search_entries`
        (:class:`~agents_sdk.search.EntrySearchArgs`: ``section``/``sections``,
        ``tags_any``, ``tags_all``, ``author``, ``since``, ``until``, ``metadata``, ``where``,
        ``top_k``, ``min_score``, ``mode``; ``boards`` adds other boards), and/or
        one :class:`SearchFilters` value as ``filters``. Entries are found once
        the worker has stored (and, for semantic search, embedded) them.

        Raises:
            SearchError: no worker is serving search, or it failed.
            InvalidPayloadError: invalid filters.
            TypeError: ``board`` (this board is searched) or a keyword that is not a filter.
        """
        return await self.agent.search.search_entries(query, filters=filters, **_on_board(self.name, args))

    async def recall(self, query: str, *, filters: SearchFilters | None = None,
                     **args: Unpack[RecallArgs]) -> list[MemoryHit]:
        """``agent.recall(query, board=<this board>, ...)``.

        Raises:
            SearchError: no worker is serving search, or it failed.
            InvalidPayloadError: invalid filters.
            TypeError: ``board`` (this board is searched) or a keyword that is not a filter.
        """
        return await self.agent.search.recall(query, filters=filters, **_on_board(self.name, args))

    async def memory(self, id: str) -> MemoryDetail:
        """``agent.memory(id, board=<this board>)``: one memory of this board, with the memories
        merged into it and the versions of its subject key.

        Raises:
            NotFoundError: no memory of that id on this board.
            PermissionDeniedError: this agent may not read the board.
            SearchError: no worker is serving search, or it failed.
        """
        return await self.agent.search.memory(self.name, id)

    async def stored_history(self, section: str, key: str, *, limit: int | None = None) -> list[EntryRevision]:
        """Every revision of a key ever written, from PostgreSQL (JetStream keeps
        only the last ``board.history``), oldest first.

        Raises:
            NotFoundError: nothing stored for the key.
            SearchError: no worker is serving search.
        """
        return await self.agent.search.history(self.name, section, key, limit=limit)

    async def as_of(self, section: str, key: str, *, revision: int | None = None,
                    at: datetime | None = None) -> EntryRevision:
        """The value a key had at a revision or an instant, from PostgreSQL.

        Raises:
            NotFoundError: the key did not exist (or was deleted) then.
            SearchError: no worker is serving search.
        """
        return await self.agent.search.as_of(self.name, section, key, revision=revision, at=at)

    async def remember(self, text: str, **kwargs: Any) -> str:
        """``agent.remember(text, board=<this board>, ...)`` (``wait="searchable"`` included)."""
        return await self.agent.longterm.remember(text, board=self.name, **kwargs)

    async def wait_searchable(self, ids: Sequence[str], **kwargs: Any) -> None:
        """``agent.wait_searchable(ids, board=<this board>, ...)``."""
        await self.agent.longterm.wait_searchable(ids, board=self.name, **kwargs)

    async def broadcast(self, type: str, body: Any = None, **kwargs: Any) -> Sent:
        """Send a message to every agent that joined this board (see ``agent.join``)."""
        return await self.agent.messaging.broadcast(self.name, type, body, **kwargs)

    # ------------------------------------------------------------------ voting
    async def propose(self, section: str, key: str, candidates: Sequence[Any] | None = None, *,
                      value: Any = NO_VALUE, policy: Policy | PolicyKind = "majority",
                      voters: Sequence[str] | None = None, deadline: DeadlineSpec = None,
                      question: str = "", proposal_id: str | None = None) -> ProposalHandle:
        """Put the value of ``(section, key)`` to a vote; see :meth:`agents_sdk.consensus.Voting.propose`.

        ``await (await board.propose(...)).outcome()`` waits for the result; an
        accepted value is written to the entry once.
        """
        return await self.agent.voting.propose(self.name, section, key, candidates, value=value, policy=policy,
                                               voters=voters, deadline=deadline, question=question,
                                               proposal_id=proposal_id)

    async def vote(self, proposal_id: str, choice: Any, *, reason: str | None = None, index: bool = False,
                   ballot_id: str | None = None) -> BallotReceipt:
        """Cast this agent's ballot; see :meth:`agents_sdk.consensus.Voting.vote` (typed errors
        for unknown or closed proposals, ineligible voters and late ballots)."""
        return await self.agent.voting.vote(self.name, proposal_id, choice, reason=reason, index=index,
                                            ballot_id=ballot_id)

    async def proposal(self, proposal_id: str) -> ProposalHandle:
        """A handle on an existing proposal of this board (``ProposalNotFoundError`` if none)."""
        return await self.agent.voting.proposal(self.name, proposal_id)

    def watch_votes(self, proposal_id: str | None = None, *, start: Literal["new", "all"] = "new") -> VoteWatch:
        """Watch this board's proposals, ballots and outcomes (or one proposal's)."""
        return self.agent.voting.watch(self.name, proposal_id, start=start)

    def view(self, section: str | None = None, key: str | None = None) -> View:
        """A live local view of this board, a section, or one key.

        ``view = await board.view("tasks")`` returns once the snapshot is
        loaded; ``async with board.view("tasks") as view`` also closes it.
        """
        return View(self, section, key)

    def watch(self, section: str | None = None, key: str | None = None, *, start: WatchStart = "new",
              from_revision: int | None = None, include_deletes: bool = True, hidden: Hidden = "skip") -> Watch:
        """Watch this board, a section, or one key. See :meth:`BoardStore.watch`.

        An entry the watch delivered whose TTL runs out arrives as a ``PURGE`` change
        at its expired revision, at the moment it expires (the server writes no
        marker by default: the watch keeps the deadlines, :class:`Watch`).

        A revision that does not verify is skipped (counted in ``watch.hidden``), or
        with ``hidden="remove"`` delivered as the key's removal at that revision;
        with ``security.unverified = "flag"`` it is delivered with its ``verdict``.
        """
        return self._store.watch(self.name, section, key, start=start, from_revision=from_revision,
                                 include_deletes=include_deletes, hidden=hidden)


class BoardPipeline:
    """A :class:`~blackboard.client.board_store.Pipeline` bound to one board."""

    def __init__(self, pipeline: Pipeline, board: str) -> None:
        self._p = pipeline
        self._board = board

    async def __aenter__(self) -> BoardPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._p.flush()

    async def put(self, section: str, key: str, value: Any, **kwargs: Any) -> asyncio.Future[int]:
        """Send a put; returns a future of its revision (or of its error: ``ConflictError``...),
        resolved as the ack comes in or by ``flush``. Validation errors raise here."""
        return await self._p.put(self._board, section, key, value, **kwargs)

    async def delete(self, section: str, key: str, *, purge: bool = False) -> asyncio.Future[int]:
        """Send a delete; returns a future of the tombstone's revision."""
        return await self._p.delete(self._board, section, key, purge=purge)

    async def flush(self) -> list[int]:
        """Wait for every write sent so far and resolve each future; the revisions in order.

        Raises:
            BlackboardError: the first failed write's error (the others are applied).
        """
        return await self._p.flush()


_SearchArgsT = TypeVar("_SearchArgsT", "EntrySearchArgs", "RecallArgs")


def _entry_span(board: Board, section: str, key: str) -> dict[str, Any]:
    """A board write's span attributes (docs/observability.md, "Tracing")."""
    return {"messaging.system": "nats", "messaging.operation.type": "send", "blackboard.board": board.name,
            "blackboard.section": section, "blackboard.key": key, "blackboard.agent": board.agent.id}


def _on_board(board: str, args: _SearchArgsT) -> _SearchArgsT:
    """The search keywords of a board handle: ``args`` with ``board`` set to its own.

    Raises:
        TypeError: ``args`` names a ``board`` (a keyword function would have refused it twice).
    """
    if "board" in args:
        raise TypeError("a board's search takes no 'board' (it searches its own; boards= adds others)")
    return {**args, "board": board}
