"""The search micro service (``nats.micro``): discoverable with ``$SRV.PING|INFO|STATS``.

Endpoints on ``bb.search.*.<endpoint>`` (:meth:`Subjects.search_endpoint`), all in the
queue group ``blackboard-search`` so that every worker process shares the requests.
A request comes on ``bb.search.<principal>.<endpoint>`` (:meth:`Subjects.search`): the
server's permissions let only that principal publish there, so the service
takes the principal from the subject, never from the request, asks its
:class:`~blackboard.search.access.RightsLookup` (the policy file, or everything on an
open bus) what it may read, and restricts the request to that
(:mod:`blackboard.search.access`): a principal the policy does not declare, or a
request naming a board it may not read, is refused with ``PermissionDeniedError``
(service error code 403).

=========== ======================= =========================
endpoint    request                 reply
=========== ======================= =========================
memories    MemorySearchRequest     MemorySearchResponse
entries     EntrySearchRequest      EntrySearchResponse
history     HistoryRequest          HistoryResponse
as_of       AsOfRequest             EntryRevision
messages    MessageSearchRequest    MessageSearchResponse
boards      (empty)                 BoardsResponse
searchable  SearchableRequest       SearchableResponse
memory      MemoryGetRequest        MemoryDetail
status      (empty)                 worker status (lag, embedding backlog)
prune       MemoryPruneRequest      MemoryPruneResponse
archive     MemoryArchiveRequest    MemoryArchiveResponse
restore     MemoryRestoreRequest    MemoryRestoreResponse
=========== ======================= =========================

``searchable`` answers which of some memories of one readable board are not yet
stored or not yet embedded (what ``remember(..., wait="searchable")`` polls); a
board the principal may not read is refused like a search naming it.

``prune``, ``archive`` and ``restore`` archive long-term memories (by a strategy, by id) or
bring archived ones back, with the principal's rights (:mod:`blackboard.search.lifecycle`): its
own memories where it may write on the board, every author's (``scope="all"``) or another
agent's only with ``admin`` on the board; a refusal changes nothing.

``memory`` reads one memory of a readable board by id (the id of a memory merged
into another answers with the kept one), with the memories merged into it and
the versions of its subject key (:mod:`blackboard.search.detail`); a board the
principal may not read is refused like a search naming it.

``boards`` lists the boards of the board bucket that hold a live key and that
the principal may read (:meth:`BoardStore.boards`, which reads the stream's
subjects across every board: the system identity may, an agent may not).

Requests are handled concurrently (up to the pool size); errors are replied
with ``Bb-Error`` and an ``ErrorReply`` body. A stored row that cannot be read
back, or a hit the reply's encoding cannot carry, is left out of the reply,
logged and counted (:mod:`blackboard.search.rows`; ``skipped_rows`` in the
status reply): one bad row never fails a search.

The service has a PostgreSQL pool of its own (``postgres.pool_max``
connections), so that queries never wait behind the ingest and embedding
transactions of the same worker, in autocommit mode and without a check on
checkout: two to four round trips less per query (the engine retries a query
once on a connection found broken). Its statements are planned for their
parameters every time, with random reads costed as for data in memory or on
SSD, and without JIT compilation (:func:`search_session`).

The memories each recall returns are noted (:class:`~blackboard.search.usage.AccessRecorder`)
and their ``hits`` and ``last_accessed`` written every ``memory.access_flush_interval``
seconds in one statement, off the read path (and once more when the service stops): the
importance score and the ``lru`` prune read them (docs/memory-lifecycle.md, "Importance").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from blackboard.client.board_store import BoardStore
from blackboard.client.lifecycle import first_error
from blackboard.db import open_pool
from blackboard.embeddings import EmbeddingProvider
from blackboard.observability import tracing
from blackboard.observability.metrics import WorkerMetrics
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    PermissionDeniedError,
)
from blackboard.protocol.limits import MAX_REPLY_DEPTH
from blackboard.protocol.schemas import validate_wire
from blackboard.protocol.schemas.message_search import MessageSearchRequest, MessageSearchResponse
from blackboard.protocol.schemas.prune import (
    MemoryArchiveRequest,
    MemoryPruneRequest,
    MemoryRestoreRequest,
)
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    BoardsResponse,
    EntryRevision,
    EntrySearchRequest,
    EntrySearchResponse,
    ErrorReply,
    HistoryRequest,
    HistoryResponse,
    MemoryDetail,
    MemoryGetRequest,
    MemorySearchRequest,
    MemorySearchResponse,
    SearchableRequest,
    SearchableResponse,
)
from blackboard.protocol.subjects import SEARCH_SERVICE, Header, Subjects
from blackboard.search.access import RightsLookup, check_boards, message_scope, scoped_search
from blackboard.search.detail import memory_detail
from blackboard.search.engine import SearchEngine
from blackboard.search.history import EntryHistory
from blackboard.search.lifecycle import archive_memories, prune_memories, restore_memories
from blackboard.search.messages import search_messages
from blackboard.search.rows import SkippedRows, encode_response
from blackboard.search.usage import AccessRecorder
from blackboard.security.policy import Right, Rights
from blackboard.security.source import RightsSource
from blackboard.settings import Settings

__all__ = ["SEARCH_SESSION", "SEARCH_VERSION", "SearchService", "error_reply", "principal_rights",
           "search_session"]

log = logging.getLogger("blackboard.worker.search")

SEARCH_VERSION = "2.3.0"
#: Session settings of the search pool's connections. psycopg prepares a
#: statement run five times, and PostgreSQL then may switch it to a generic
#: plan, made without the parameters' values: for a search (which boards,
#: which words, how selective) that plan can be several times slower (keyword
#: search on 2,000 LoCoMo turns: p95 26 ms prepared, 5 ms planned per query).
#: A custom plan each time costs ~0.3-0.6 ms of planning; parsing stays saved.
#: JIT compilation is off: a search's statements cost ~200-6,000 (at 100k
#: memories), far below ``jit_above_cost``, but on a much larger table one
#: crossing it would pay tens of milliseconds of compiling for a few of work.
SEARCH_SESSION: dict[str, str] = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


def search_session(settings: Settings) -> dict[str, str]:
    """The session settings of the search pool's connections: :data:`SEARCH_SESSION` and
    ``random_page_cost`` from ``settings.search`` (see :class:`~blackboard.settings.SearchSettings`)."""
    return {**SEARCH_SESSION, "random_page_cost": repr(float(settings.search.random_page_cost))}


_CODES = {"NotFoundError": "404", "InvalidPayloadError": "400", "InvalidKeyError": "400",
          "PermissionDeniedError": "403"}

#: A route: the request (None for an endpoint without one) and the principal's rights -> the reply.
Route = Callable[[Any, Rights], Awaitable[Any]]


def error_reply(exc: BaseException, encoding: codec.Encoding, *,
                fallback: str = "SearchError") -> tuple[bytes, dict[str, str]]:
    """Body and headers of the error reply for ``exc`` (pure): ``Bb-Error`` names its class
    (``fallback`` for an error outside the error tree), the ``ErrorReply`` body carries its
    message and its ``key`` (a ``PermissionDeniedError``'s ``operation``)."""
    name = type(exc).__name__ if isinstance(exc, BlackboardError) else fallback
    message = str(exc) if isinstance(exc, BlackboardError) else f"internal error: {exc!r}"
    key = exc.operation if isinstance(exc, PermissionDeniedError) else getattr(exc, "key", None)
    body = codec.encode(ErrorReply(error=name, message=message,
                                   key=key if isinstance(key, str) else None).model_dump(), encoding)
    headers = {Header.ERROR.value: name, Header.SERVICE_ERROR.value: message[:200],
               Header.SERVICE_ERROR_CODE.value: _CODES.get(name, "500"), **codec.headers_for(encoding)}
    return body, headers


def principal_rights(source: RightsLookup, subject: str, what: str) -> Rights:
    """The rights of the principal a request's ``subject`` names (``bb.search.<principal>.*``).

    Raises:
        PermissionDeniedError: the policy does not declare the principal.
        InvalidKeyError: not a search subject.
    """
    principal, _ = Subjects.parse_search(subject)
    rights = source.rights(principal)
    if rights is None:
        raise PermissionDeniedError(f"{principal!r} is not declared in the access policy", operation=what)
    return rights


class SearchService:
    """Serves :class:`SearchEngine`, :class:`EntryHistory` and message search over NATS, each
    request restricted to what its principal may read.

    Args:
        nc: the worker's NATS connection.
        settings: the deployment's settings.
        provider: embeds queries (None: keyword search only).
        status: the worker's status (the ``status`` endpoint).
        metrics: times each request's work by endpoint and mode, counts its errors (None: off).
        rights: where principals' rights come from (default, at :meth:`start`:
            :meth:`RightsSource.from_settings`, the policy file or the open bus).
    """

    def __init__(self, nc: NATS, settings: Settings, *,
                 provider: EmbeddingProvider | None,
                 status: Callable[[], Awaitable[dict[str, Any]]] | None = None,
                 rights: RightsLookup | None = None, metrics: WorkerMetrics | None = None) -> None:
        self._settings = settings
        self._metrics = metrics
        self._provider = provider
        self._rights: RightsLookup | None = rights
        self._pool: AsyncConnectionPool | None = None
        self.engine: SearchEngine | None = None
        #: The recall hits noted and written off the read path (:mod:`blackboard.search.usage`).
        self.access: AccessRecorder | None = None
        self._nc = nc
        self._status = status
        self._service: Service | None = None
        self._sem = asyncio.Semaphore(max(1, settings.postgres.pool_max - 1))
        #: Holds the pool and the task group of the flusher and the requests in flight.
        self._host: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None
        self._closing = asyncio.Event()
        #: Stored rows and hits the service's reads skipped because they cannot be read back
        #: or encoded (by kind: see :class:`~blackboard.search.rows.SkippedRows`).
        self.skipped = SkippedRows()

    async def start(self) -> None:
        """Open the service's pool, register the service and its endpoints; returns once it serves.

        The pool, the flusher and the requests in flight belong to a host task
        of the service's own (a task group inside ``async with`` the pool), so
        the service is either fully up when this returns, or it raised having
        closed what it opened.

        Raises:
            StorageError: PostgreSQL is not reachable.
            ConfigurationError: no rights were given and the settings name no policy (nor
                ``nats.insecure_open_bus``), or the policy file is invalid.
        """
        if self._host is not None and not self._host.done():
            return
        if self._rights is None:
            self._rights = RightsSource.from_settings(self._settings)
        self._closing.clear()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._host = asyncio.create_task(self._serve(ready), name="blackboard search service")
        try:
            await ready
        except BaseException:
            await self.stop()
            raise

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        s = self._settings
        try:
            async with open_pool(s.postgres, name=f"blackboard-{s.worker.name}-search", min_size=1,
                                 check=False, autocommit=True, session=search_session(s)) as pool:
                self._pool = pool
                self.engine = engine = SearchEngine(pool, self._provider, s.search, skipped=self.skipped)
                self.access = access = AccessRecorder(pool, s.memory.access_flush_interval)
                try:
                    # Leaving the group waits for the requests in flight (the
                    # endpoints are stopped first); only the flusher is cancelled.
                    async with asyncio.TaskGroup() as group:
                        self._group = group
                        await self._register()
                        flusher = group.create_task(self._flush_loop(), name="search flusher")
                        recorder = group.create_task(access.run(self._closing), name="search access recorder")
                        if not ready.done():
                            ready.set_result(None)
                        try:
                            await self._closing.wait()
                        finally:
                            # Set before the cancels (this task may itself have been cancelled): the
                            # loops end on it even if a cancel is lost (Python 3.11's wait_for).
                            self._closing.set()
                            flusher.cancel()
                            recorder.cancel()  # after one last flush of the recall hits noted
                            await self._unregister()
                finally:
                    await engine.aclose()  # the reranker's client, if any
        except BaseException as exc:
            if ready.done():
                raise
            if isinstance(exc, asyncio.CancelledError):
                ready.cancel()
                raise
            ready.set_exception(first_error(exc))
        finally:
            self._group = None
            self._pool = None

    async def _unregister(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            with contextlib.suppress(Exception):
                await service.stop()

    async def _register(self) -> None:
        assert self.engine is not None
        history = EntryHistory(self.engine.pool, skipped=self.skipped)
        svc = await add_service(self._nc, name=SEARCH_SERVICE, version=SEARCH_VERSION,
                                description="blackboard search: memories, entries, history, as-of, messages, boards, searchable, "
                                            "memory, prune, archive, restore",
                                queue_group=SEARCH_SERVICE)
        engine = self.engine
        access = self.access
        assert access is not None
        store = BoardStore(self._nc, self._settings)

        async def memories(req: MemorySearchRequest, rights: Rights) -> MemorySearchResponse:
            scoped = scoped_search(req, rights)
            if scoped is None:
                return MemorySearchResponse(hits=[])
            found = await engine.search_memories(scoped)
            access.record(hit.id for hit in found.hits)  # hits and last_accessed, written later
            return found

        async def entries(req: EntrySearchRequest, rights: Rights) -> EntrySearchResponse:
            scoped = scoped_search(req, rights)
            return await engine.search_entries(scoped) if scoped is not None else EntrySearchResponse(hits=[])

        async def revisions(req: HistoryRequest, rights: Rights) -> HistoryResponse:
            check_boards(rights, [req.board], "history")
            return await history.history(req)

        async def as_of(req: AsOfRequest, rights: Rights) -> EntryRevision:
            check_boards(rights, [req.board], "as-of read")
            return await history.as_of(req)

        async def searchable(req: SearchableRequest, rights: Rights) -> SearchableResponse:
            check_boards(rights, [req.board], "searchable")
            return await engine.searchable(req)

        async def memory(req: MemoryGetRequest, rights: Rights) -> MemoryDetail:
            check_boards(rights, [req.board], "memory read")
            return await memory_detail(engine.pool, req, skipped=self.skipped)

        async def boards(_: Any, rights: Rights) -> BoardsResponse:
            if rights.boards(Right.READ) == frozenset():
                return BoardsResponse(boards=[])
            return BoardsResponse(boards=await store.boards(where=lambda board: rights.can(board, Right.READ)))

        async def prune(req: MemoryPruneRequest, rights: Rights) -> BaseModel:
            return await prune_memories(engine.pool, self._settings.memory, req, rights)

        async def archive(req: MemoryArchiveRequest, rights: Rights) -> BaseModel:
            return await archive_memories(engine.pool, req, rights)

        async def restore(req: MemoryRestoreRequest, rights: Rights) -> BaseModel:
            return await restore_memories(engine.pool, req, rights)

        routes: dict[str, tuple[type[BaseModel] | None, Route]] = {
            "memories": (MemorySearchRequest, memories),
            "entries": (EntrySearchRequest, entries),
            "history": (HistoryRequest, revisions),
            "as_of": (AsOfRequest, as_of),
            "status": (None, self._get_status),
            "messages": (MessageSearchRequest, self._search_messages),
            "boards": (None, boards),
            "searchable": (SearchableRequest, searchable),
            "memory": (MemoryGetRequest, memory),
            "prune": (MemoryPruneRequest, prune),
            "archive": (MemoryArchiveRequest, archive),
            "restore": (MemoryRestoreRequest, restore),
        }
        for name, (model, fn) in routes.items():
            if self._metrics is not None:
                fn = _timed(self._metrics, name, fn)
            await svc.add_endpoint(name=name, subject=Subjects.search_endpoint(name),
                                   handler=self._handler(model, fn))
        self._service = svc

    async def stop(self) -> None:
        """Stop the endpoints, let the requests in flight finish, close the pool (idempotent)."""
        self._closing.set()
        host, self._host = self._host, None
        if host is not None:
            await asyncio.wait([host])

    async def __aenter__(self) -> SearchService:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _search_messages(self, req: MessageSearchRequest, rights: Rights) -> MessageSearchResponse:
        assert self._pool is not None
        return await search_messages(self._pool, req, scope=message_scope(rights), skipped=self.skipped)

    async def _get_status(self, _: Any, __: Rights) -> dict[str, Any]:
        status = await self._status() if self._status else {}
        return {**status, "skipped_rows": dict(self.skipped.counts)}

    def _handler(self, model: type[BaseModel] | None, fn: Route) -> Callable[[Request], Awaitable[None]]:
        async def handle(request: Request) -> None:
            # nats-py runs a subscription's callbacks one at a time: answer in a
            # task so slow queries do not queue the fast ones behind them.
            if self._group is None:
                return  # stopping: the endpoints are going away
            self._group.create_task(self._answer(request, model, fn) if not tracing.enabled
                                    else self._traced_answer(request, model, fn))

        return handle

    async def _traced_answer(self, request: Request, model: type[BaseModel] | None, fn: Route) -> None:
        """:meth:`_answer` in a server span, in the requester's trace (docs/observability.md)."""
        try:
            principal, endpoint = Subjects.parse_search(request.subject)
        except InvalidKeyError:  # not on a search subject: _answer refuses it
            principal, endpoint = "", request.subject
        with tracing.remote_span(request.headers, f"search {endpoint}", "server",
                                 {"rpc.system.name": "nats", "rpc.method": endpoint, "blackboard.principal": principal}):
            await self._answer(request, model, fn)

    async def _answer(self, request: Request, model: type[BaseModel] | None, fn: Route) -> None:
        encoding = codec.encoding_of(request.headers)
        try:
            assert self._rights is not None
            rights = principal_rights(self._rights, request.subject, "search")
            async with self._sem:
                req: Any = None
                if model is not None:
                    req = validate_wire(model, codec.decode(request.data, encoding))  # type: ignore[type-var]
                result = await fn(req, rights)
            body = encode_response(result, encoding, self.skipped) if isinstance(result, BaseModel) \
                else codec.encode(result, encoding, max_depth=MAX_REPLY_DEPTH)
            await request.respond(body, headers=codec.headers_for(encoding) or None)
        except (InvalidPayloadError, NotFoundError, BlackboardError) as exc:
            body, headers = error_reply(exc, encoding)
            with contextlib.suppress(Exception):
                await request.respond(body, headers=headers)
        except Exception as exc:
            log.exception("search request on %s failed", request.subject)
            body, headers = error_reply(exc, encoding)
            with contextlib.suppress(Exception):
                await request.respond(body, headers=headers)

    async def _flush_loop(self) -> None:
        while not self._closing.is_set():
            await asyncio.sleep(1.0)
            if self.engine is None:
                continue
            try:
                await self.engine.analyze_missing()
            except Exception as exc:
                log.debug("cannot analyze: %r", exc)


def _timed(metrics: WorkerMetrics, endpoint: str, fn: Route) -> Route:
    """``fn`` timed into ``blackboard_search_seconds`` (by endpoint and the request's mode)
    and its errors counted into ``blackboard_search_errors`` (by endpoint and error class)."""
    seconds = metrics.search_seconds
    errors = metrics.search_errors

    async def timed(req: Any, rights: Rights) -> Any:
        started = time.perf_counter()
        try:
            return await fn(req, rights)
        except Exception as exc:
            errors.labels(endpoint, type(exc).__name__).inc()
            raise
        finally:
            seconds.labels(endpoint, str(getattr(req, "mode", None) or "none")).observe(time.perf_counter() - started)

    return timed
