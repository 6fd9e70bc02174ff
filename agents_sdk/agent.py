"""``Agent``: one agent process's connection to the blackboard."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Unpack

import nats.errors
from nats.aio.client import Client as NATS

from agents_sdk.board import Board
from agents_sdk.consensus import Voting
from agents_sdk.context import AgentContext
from agents_sdk.memory.facade import AgentMemory
from agents_sdk.memory.longterm import LongTermMemory, MemoryInput
from agents_sdk.memory.searchable import DEFAULT_SEARCHABLE_TIMEOUT, WaitFor
from agents_sdk.messaging.inbox import Inbox
from agents_sdk.messaging.messenger import Messenger, Subscriptions
from agents_sdk.messaging.rpc import Handler
from agents_sdk.messaging.send import Sent
from agents_sdk.objects import ObjectStore
from agents_sdk.search import RecallArgs, SearchClient, search_request
from blackboard.client.board_store import BoardStore
from blackboard.client.connection import check_nats_url, connect_nats, permission_violations
from blackboard.client.streams import ensure_streams
from blackboard.observability import tracing
from blackboard.protocol import codec
from blackboard.protocol.errors import SearchError
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.message_search import MessageHit
from blackboard.protocol.schemas.search import (
    BoardsResponse,
    MemoryHit,
    SearchFilters,
)
from blackboard.protocol.subjects import Subjects, validate_name
from blackboard.security.credentials import CredentialsArg, find_credentials
from blackboard.settings import Settings

__all__ = ["Agent"]

log = logging.getLogger("agents_sdk.agent")


class Agent:
    """An agent connected to the blackboard. Create with :meth:`Agent.connect`.

    ::

        async with Agent.connect("planner", nats_url="nats://127.0.0.1:4222") as agent:
            board = agent.board("project-x")
            rev = await board.put("tasks", "t1", {"title": "write docs"})
    """

    def __init__(self, agent_id: str, nc: NATS, settings: Settings) -> None:
        self.id = validate_name(agent_id, "agent id")
        self.settings = settings
        self.nc = nc
        #: What this agent's parts share (store, publisher, live views); handed to
        #: the boards, views, voting and memory instead of the agent itself.
        self.context = AgentContext.build(self.id, nc, settings)
        self._boards: dict[str, Board] = {}
        self._longterm: LongTermMemory | None = None
        self._search: SearchClient | None = None
        self._messenger: Messenger | None = None
        self._voting: Voting | None = None
        self._memory: AgentMemory | None = None
        self._closed = False
        #: Large binaries (JetStream object store).
        self.objects = ObjectStore(self.context.js, settings.board.objects_bucket)

    @classmethod
    def connect(cls, agent_id: str, *, nats_url: str | None = None, settings: Settings | None = None,
                ensure: bool = True, credentials: CredentialsArg | None = None) -> _Connector:
        """Connect an agent; use as ``async with Agent.connect(...) as agent`` or ``await``.

        Args:
            agent_id: this agent's id (``[A-Za-z0-9_-]``, up to 128 characters);
                it is the author of every write.
            nats_url: overrides ``settings.nats.url``.
            settings: defaults to ``Settings()`` (``BLACKBOARD_*`` environment).
            ensure: create the JetStream assets if they are missing (only on an
                open bus: with a credential the worker or ``blackboard dev``
                creates them; an agent holds no right to).
            credentials: this agent's credential: a path to its ``.creds`` file or a
                ``Credentials``. None: ``settings.nats.creds_file``, then
                ``<settings.nats.credentials_dir>/<agent_id>.creds``, then
                ``<settings.dev.data_dir>/auth/creds/<agent_id>.creds`` (what
                ``blackboard dev`` writes); see docs/security.md.

        Raises:
            InvalidKeyError: invalid agent id.
            ConfigurationError: the NATS URL is malformed (an unknown scheme,
                no host, a bad port), found before connecting.
            AuthenticationError: no credential for ``agent_id`` (unless
                ``settings.nats.insecure_open_bus``), a credential issued for
                another id (both before connecting), or the server refused it.
            NotConnectedError: no NATS server answered (the message names a
                host that does not resolve, or the last connection error).
        """
        validate_name(agent_id, "agent id")
        settings = settings or Settings()
        if nats_url is not None:
            settings = settings.model_copy(update={"nats": settings.nats.model_copy(update={"url": nats_url})})
        return _Connector(cls, agent_id, settings, ensure, credentials)

    def board(self, name: str) -> Board:
        """The handle of board ``name`` (cheap; cached per name)."""
        try:
            board = self._boards.get(name)
        except TypeError:  # unhashable (a dict, a list): Board refuses it with InvalidKeyError
            board = None
        if board is None:
            board = self._boards[name] = Board(self, name)
        return board

    async def boards(self) -> list[str]:
        """The names of the boards that hold at least one live key, sorted.

        A board exists while it holds a key: one whose keys were all deleted
        or purged is not listed (its history stays readable through
        ``agent.board(name)``). With a credential, only the boards this agent
        may read, as the system service (a worker) lists them
        (``bb.search.<agent id>.boards``): listing needs the stream's subjects
        across every board, which an agent may not read. On an open bus (no
        credential) the agent lists them itself: one listing request to the
        server, then a short read per board (:meth:`BoardStore.boards`).

        Raises:
            SearchError: with a credential, no system service answered in time
                (no worker running), or it failed.
            PermissionDeniedError: with a credential, the access policy does not declare
                this agent.
            NotConnectedError, OperationTimeoutError, TransportError: the listing failed (open bus).
        """
        violations = permission_violations(self.nc)
        if violations is None or violations.principal is None:
            return await self.context.store.boards()
        try:
            reply = await search_request(self.nc, "boards", None, BoardsResponse, principal=self.id,
                                         timeout=self.settings.search.timeout)
        except SearchError as exc:
            raise SearchError(f"listing the boards: {exc} (with a credential the system service lists "
                              f"the boards an agent may read, on {Subjects.search(self.id, 'boards')})") from exc
        return reply.boards

    # ------------------------------------------------------------ long-term memory
    @property
    def longterm(self) -> LongTermMemory:
        if self._longterm is None:
            self._longterm = LongTermMemory(self.context)
        return self._longterm

    async def remember(self, text: str, *, kind: MemoryKind = "episodic", tags: Sequence[str] = (),
                       metadata: Mapping[str, Any] | None = None, importance: float = 0.5,
                       board: str | None = None, source: str | None = None, read_only: bool = False,
                       id: str | None = None, wait: WaitFor | None = None, timeout: float | None = None,
                       key: str | None = None, occurred_at: datetime | None = None,
                       confidence: float | None = None) -> str:
        """Store a long-term memory; returns its id once it is durably in JetStream.

        The worker persists it to PostgreSQL (keyword search finds it) and embeds
        it afterwards (semantic search finds it; docs/search.md, "Not embedded
        yet"). ``wait="searchable"`` returns only once both are done, so that
        every mode of :meth:`recall` finds it (at most ``timeout`` seconds,
        default 30); the default (None, or ``"stored"``) costs nothing more.
        ``board`` scopes the memory (default ``"default"``).

        ``key`` says what the memory is about (a subject key such as
        ``"price:shop.example.com:sku-1"``, 1-256 characters, no control
        characters): a newer memory on the same key of the board supersedes
        the older ones, which recall then leaves out unless asked. ``occurred_at``
        is when what it says happened (timezone-aware; default: now, its write
        time), which orders the versions of a key and the event-time filters;
        ``confidence`` (0 to 1) is how sure the writer is (docs/memory-lifecycle.md).

        Raises:
            InvalidPayloadError, PayloadTooLargeError, InvalidKeyError: bad input.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
            NotSearchableError: (``wait="searchable"``) not stored and embedded in time (an
                ``OperationTimeoutError``; the memory is written all the same).
            PermissionDeniedError, SearchError: (``wait="searchable"``) this agent may not
                read the board, or no worker serves search or embeds.
        """
        return await self.longterm.remember(text, kind=kind, tags=tags, metadata=metadata,
                                            importance=importance, board=board, source=source,
                                            read_only=read_only, id=id, wait=wait, timeout=timeout, key=key,
                                            occurred_at=occurred_at, confidence=confidence)

    async def wait_searchable(self, ids: Sequence[str], *, board: str | None = None,
                              timeout: float = DEFAULT_SEARCHABLE_TIMEOUT) -> None:
        """Return once a worker has stored and embedded the memories ``ids`` of ``board``
        (default ``"default"``), so that every mode of :meth:`recall` finds them.

        Raises:
            NotSearchableError: some were not stored or not embedded after ``timeout`` seconds.
            PermissionDeniedError: this agent may not read the board.
            SearchError: no worker serves search, or it embeds nothing.
        """
        await self.longterm.wait_searchable(ids, board=board, timeout=timeout)

    @property
    def search(self) -> SearchClient:
        """The search service client (memories, entries, Postgres history and as-of reads)."""
        if self._search is None:
            self._search = SearchClient(self.nc, self.settings, self.id)
        return self._search

    async def recall(self, query: str, *, filters: SearchFilters | None = None,
                     **args: Unpack[RecallArgs]) -> list[MemoryHit]:
        """Search the shared long-term memory, best first.

        ``mode`` is ``"hybrid"`` (default: keyword and semantic fused),
        ``"semantic"`` or ``"keyword"``. Filters (:class:`~agents_sdk.search.RecallArgs`,
        and/or one :class:`SearchFilters` value as ``filters``, whose fields the
        keywords replace): ``board``/``boards``, ``kind``/``kinds``,
        ``tags_any``/``tags_all``, ``author``, a time range (``since``/``until``),
        ``metadata`` containment and ``where`` comparisons (``{"metadata.confidence": {"$gt": 0.8}}``,
        docs/search.md "Filters"); ``min_score`` drops weak hits. Only current
        memories are found unless a lifecycle filter says otherwise:
        ``include_superseded``, ``include_archived``, ``as_of`` (valid time),
        ``known_at`` (what the board knew then), ``occurred_after``/``occurred_before``
        (event time), ``min_confidence`` (docs/memory-lifecycle.md, "Retrieval"). Each hit
        carries its score and provenance (memory id, agent, board) and its
        lifecycle (key, valid time, confidence, ...). A memory is found once a
        worker has embedded it.

        Raises:
            SearchError: no worker is serving search, or it failed / timed out.
            InvalidPayloadError: invalid filters.
        """
        return await self.search.recall(query, filters=filters, **args)

    @property
    def memory(self) -> AgentMemory:
        """This agent's memory toolkit (:class:`~agents_sdk.memory.facade.AgentMemory`: layers,
        episodes, search across them, memory actions as tools, attached stores; docs/memory.md).

        Awaiting it with an id is one long-term memory of ``board`` (default ``"default"``),
        with the memories merged into it and the versions of its subject key
        (:meth:`~agents_sdk.search.SearchClient.memory`; the id of a merged memory answers with
        the kept one): ``detail = await agent.memory(id)``, which raises NotFoundError (no
        memory of that id on that board), PermissionDeniedError (this agent may not read the
        board) or SearchError (no worker is serving search, or it failed / timed out).
        """
        if self._memory is None:
            self._memory = AgentMemory(self)
        return self._memory

    async def forget(self, ids: Sequence[str], *, board: str | None = None) -> None:
        """Delete long-term memories by id (the workers apply it)."""
        await self.longterm.forget(ids, board=board)

    async def remember_many(self, memories: Iterable[MemoryInput], *, wait: WaitFor | None = None,
                            timeout: float | None = None) -> list[str]:
        """Store many memories pipelined; returns their ids once all are acknowledged (with
        ``wait="searchable"``, once all are stored and embedded: see :meth:`remember`)."""
        return await self.longterm.remember_many(memories, wait=wait, timeout=timeout)

    # ------------------------------------------------------------ messages
    @property
    def messaging(self) -> Messenger:
        """This agent's messaging (see :mod:`agents_sdk.messaging.messenger`); the methods below delegate to it."""
        if self._messenger is None:
            self._messenger = Messenger(self.id, self.nc, self.settings)
        return self._messenger

    @property
    def voting(self) -> Voting:
        """This agent's consensus voting (see :mod:`agents_sdk.consensus`); ``Board.propose``,
        ``Board.vote`` and ``Board.proposal`` delegate to it."""
        if self._voting is None:
            self._voting = Voting(self.context)
        return self._voting

    async def send(self, to: str | Sequence[str], type: str, body: Any = None, *, board: str | None = None,
                   correlation_id: str | None = None, metadata: Mapping[str, Any] | None = None,
                   encoding: codec.Encoding = "msgpack") -> Sent:
        """Send a direct message to one agent (or several); returns once JetStream stored it.

        Raises:
            InvalidKeyError: invalid agent id. Others: see :meth:`Messenger.send`.
        """
        return await self.messaging.send(to, type, body, board=board, correlation_id=correlation_id,
                                         metadata=metadata, encoding=encoding)

    async def publish(self, topic: str, type: str, body: Any = None, **kwargs: Any) -> Sent:
        """Publish a topic message to the agents subscribed to a matching pattern."""
        return await self.messaging.publish(topic, type, body, **kwargs)

    def inbox(self, *, types: Collection[str] | None = None, batch: int | None = None,
              timeout: float | None = None, limit: int | None = None, include_own: bool = False) -> Inbox:
        """This agent's durable inbox, in order: ``async for msg in agent.inbox(): ...; await msg.ack()``."""
        return self.messaging.inbox(types=types, batch=batch, timeout=timeout, limit=limit,
                                    include_own=include_own)

    async def request(self, to: str, type: str, body: Any = None, *, timeout: float | None = None,
                      **kwargs: Any) -> Any:
        """Ask agent ``to`` and return its reply body.

        Raises:
            NoResponderError, NoHandlerError, RequestTimeoutError, RemoteError: see
                :meth:`Messenger.request`.
        """
        return await self.messaging.request(to, type, body, timeout=timeout, **kwargs)

    async def handle(self, type: str, fn: Handler) -> None:
        """Answer requests of ``type`` (``"*"``: any) with ``fn(request) -> reply body``."""
        await self.messaging.handle(type, fn)

    async def join(self, board: str | Board) -> None:
        """Receive ``board``'s broadcasts in the inbox from now on (durable)."""
        await self.messaging.join(board.name if isinstance(board, Board) else board)

    async def leave(self, board: str | Board) -> None:
        """Stop receiving ``board``'s broadcasts."""
        await self.messaging.leave(board.name if isinstance(board, Board) else board)

    async def subscribe(self, pattern: str) -> None:
        """Receive topic messages matching ``pattern`` in the inbox from now on (durable)."""
        await self.messaging.subscribe(pattern)

    async def unsubscribe(self, pattern: str) -> None:
        """Remove a topic subscription."""
        await self.messaging.unsubscribe(pattern)

    async def subscriptions(self) -> Subscriptions:
        """Boards joined and topic patterns subscribed to."""
        return await self.messaging.subscriptions()

    async def search_messages(self, query: str | None = None, **filters: Any) -> list[MessageHit]:
        """Search stored messages by keyword and/or filters (see :meth:`Messenger.search`)."""
        return await self.messaging.search(query, **filters)

    @property
    def store(self) -> BoardStore:
        """The underlying board store (all boards)."""
        return self.context.store

    @property
    def verification(self) -> dict[str, int]:
        """How the records this agent read verified (docs/security.md, "Signatures"): the
        connection's verifier counts, by verdict (``verified``, ``bad_signature``,
        ``wrong_author``, ``unsigned``...; each stored revision is verified once, then
        ``cache_hits``), and ``hidden``: records its reads hid because they do not verify
        (board reads, inbox messages, requests and replies, vote messages).
        Empty counts when this agent does not verify (``security.verify`` off, an open bus).
        """
        store = self.context.store
        verifier = store.signing.verifier
        stats = dict(verifier.stats) if verifier is not None else {}
        stats["hidden"] = (store.hidden + (self._messenger.hidden if self._messenger is not None else 0)
                           + (self._voting.hidden if self._voting is not None else 0))
        return stats

    async def close(self) -> None:
        """Close the memory toolkit, views, messaging and voting, flush pending writes and close the connection.

        Everything is closed even when a part fails to; the first failure is
        raised afterwards. Closing twice does nothing. A connection that is down
        (the server gone, reconnecting) is closed without draining, and that is
        not a failure: ``close`` raises no NATS error of its own.
        """
        if self._closed:
            return
        self._closed = True
        async with contextlib.AsyncExitStack() as stack:  # closes in reverse order of the pushes
            stack.push_async_callback(self._drain)  # also ends the shared publisher's ack subscription
            if self._voting is not None:
                stack.push_async_callback(self._voting.close)
            if self._messenger is not None:
                stack.push_async_callback(self._messenger.close)
            stack.push_async_callback(self.context.views.close_all)
            if self._memory is not None:  # first: its automatic prune and stores use the connection
                stack.push_async_callback(self._memory.close)

    async def _drain(self) -> None:
        """Drain the connection (what is buffered goes out, the subscriptions finish), which
        closes it. A connection that is down (the server gone, reconnecting) cannot drain: it
        is closed at once, without raising (nothing acknowledged is lost: every write waits
        for its ack, and fails on its own when the ack cannot come)."""
        nc = self.nc
        if nc.is_closed:
            return
        if nc.is_connected:
            try:
                await nc.drain()
                return
            except (nats.errors.Error, TimeoutError) as exc:  # the server went away while draining
                log.info("agent %s: the connection could not drain (%r); closing it", self.id, exc)
        else:
            log.info("agent %s: the NATS connection is down; closing it without draining", self.id)
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.close()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Connector:
    """Awaitable and async context manager returned by :meth:`Agent.connect`."""

    def __init__(self, cls: type[Agent], agent_id: str, settings: Settings, ensure: bool,
                 credentials: CredentialsArg | None = None) -> None:
        self._cls = cls
        self._agent_id = agent_id
        self._settings = settings
        self._ensure = ensure
        self._credentials = credentials
        self._agent: Agent | None = None

    async def _open(self) -> Agent:
        check_nats_url(self._settings.nats.url)  # a malformed URL is told before a missing credential
        tracing.configure(self._settings.observability)  # observability.tracing: spans from now on
        found = find_credentials(self._agent_id, self._settings, self._credentials)
        nats_settings = self._settings.nats
        if found is None and nats_settings.creds_file is not None:  # another id's, passed over: none
            nats_settings = nats_settings.model_copy(update={"creds_file": None})
        # The whole settings: their security part says what the connection signs and verifies.
        nc = await connect_nats(self._settings.model_copy(update={"nats": nats_settings}),
                                name=f"agent:{self._agent_id}", credentials=found)
        try:
            # An agent with a credential has no right to create streams (the worker does).
            if self._ensure and found is None:
                await ensure_streams(nc.jetstream(timeout=self._settings.nats.request_timeout), self._settings)
            agent = self._cls(self._agent_id, nc, self._settings)
        except BaseException:
            await nc.close()
            raise
        return agent

    def __await__(self) -> Generator[Any, None, Agent]:
        return self._open().__await__()

    async def __aenter__(self) -> Agent:
        self._agent = await self._open()
        return self._agent

    async def __aexit__(self, *exc: object) -> None:
        if self._agent is not None:
            await self._agent.close()
