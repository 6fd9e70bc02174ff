"""SDK client of the search micro service: recall memories, search entries, history, as-of;
prune, archive and restore long-term memories with the principal's rights.

``Agent.recall(...)`` and ``Board.search(...)`` delegate to :class:`SearchClient`.
The filters are keyword arguments (:class:`RecallArgs`, :class:`EntrySearchArgs`:
one typed declaration serves every signature) and/or a
:class:`~blackboard.protocol.schemas.search.SearchFilters` value; keywords given
replace the fields of ``filters``, and ``board``/``kind``/``section`` add one
board, kind or section in front of the list.

Requests go to ``bb.search.<principal>.<endpoint>``: the agent's own id is the
principal (with a credential the server lets an agent publish only there), and
the service answers only from the boards the principal may read.

Errors come back typed: ``NotFoundError`` for a missing key or revision,
``PermissionDeniedError`` for a board the principal may not read (or a
principal the policy does not declare), ``SearchError`` for everything else
(service not running, timeout, failure), ``InvalidPayloadError`` for a request
the service (or the client) refused. :func:`search_request` is the one request
path of every search endpoint (the messenger's message search uses it too).

Hits (``MemoryHit``, ``EntryHit``, ``MessageHit``) and history revisions
(``EntryRevision``) carry ``verdict``, the record's signature as the worker
found it at ingest (``Verdict.VERIFIED``, or ``Verdict.UNSIGNED`` for a record
stored without a signature); a record that did not verify is never stored, so
no search returns it (docs/search.md, "Signatures").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict, TypeVar, Unpack, overload

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel, ValidationError

from agents_sdk._args import mapping_arg, sequence_arg, str_list
from blackboard.observability import tracing
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    InvalidPayloadError,
    NotFoundError,
    PermissionDeniedError,
    SearchError,
)
from blackboard.protocol.filters import Where, parse_where
from blackboard.protocol.limits import MAX_REPLY_DEPTH
from blackboard.protocol.schemas import WireModel, validate_wire
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.prune import (
    MemoryArchiveRequest,
    MemoryArchiveResponse,
    MemoryPruneRequest,
    MemoryPruneResponse,
    MemoryRestoreRequest,
    MemoryRestoreResponse,
    PruneScope,
    PruneStrategy,
)
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    EntryHit,
    EntryRevision,
    EntrySearchRequest,
    EntrySearchResponse,
    ErrorReply,
    HistoryRequest,
    HistoryResponse,
    MemoryDetail,
    MemoryGetRequest,
    MemoryHit,
    MemorySearchRequest,
    MemorySearchResponse,
    SearchableItem,
    SearchableRequest,
    SearchableResponse,
    SearchFilters,
    SearchMode,
)
from blackboard.protocol.subjects import Header, Subjects, validate_name
from blackboard.settings import Settings

__all__ = ["EntrySearchArgs", "RecallArgs", "SearchArgs", "SearchClient", "SearchFilters", "raise_for_error",
           "search_filters", "search_request"]

R = TypeVar("R", bound=WireModel)
_Request = TypeVar("_Request", MemorySearchRequest, EntrySearchRequest)


class SearchArgs(TypedDict, total=False):
    """The keyword arguments of every search: the filters both targets have, and the ranking.

    ``board`` is one more board in front of ``boards``; ``top_k`` defaults to
    ``settings.search.default_top_k``; ``mode`` to ``"hybrid"``.
    """

    board: str | None
    boards: Sequence[str] | None
    author: str | None
    tags_any: Sequence[str]
    tags_all: Sequence[str]
    since: datetime | None
    until: datetime | None
    metadata: Mapping[str, Any] | None
    where: Mapping[str, Any] | Where | None  # a mapping, or parsed already (parse_where)
    top_k: int | None
    min_score: float | None
    mode: SearchMode


class RecallArgs(SearchArgs, total=False):
    """The keyword arguments of a memory search (``kind``: one more in front of ``kinds``), with
    the lifecycle filters (docs/memory-lifecycle.md, "Retrieval"; default: current memories only):
    ``include_superseded``, ``include_archived``, ``as_of`` (valid time), ``known_at`` (what the
    board knew then), ``occurred_after``/``occurred_before`` (event time), ``min_confidence``."""

    kind: MemoryKind | None
    kinds: Sequence[MemoryKind] | None
    include_superseded: bool
    include_archived: bool
    as_of: datetime | None
    known_at: datetime | None
    occurred_after: datetime | None
    occurred_before: datetime | None
    min_confidence: float | None


class EntrySearchArgs(SearchArgs, total=False):
    """The keyword arguments of an entry search (``section``: one more in front of ``sections``)."""

    section: str | None
    sections: Sequence[str] | None


#: The filter keywords that take one value as it is (not a sequence or a mapping).
_SCALARS = frozenset({"author", "since", "until", "include_superseded", "include_archived", "as_of", "known_at",
                      "occurred_after", "occurred_before", "min_confidence"})
#: A single value and the list it goes in front of.
_ONE_OF = {"board": "boards", "kind": "kinds", "section": "sections"}
_RANKING = ("top_k", "min_score", "mode")


def search_filters(filters: SearchFilters | None, args: Mapping[str, Any]) -> SearchFilters:
    """``filters`` (default: none) with the filter keywords of ``args`` applied: each keyword
    given replaces that field, and ``board``/``kind``/``section`` go in front of their list
    (``None`` leaves a field as it was). The ranking keywords (``top_k``, ``min_score``,
    ``mode``) are ignored here.

    Raises:
        TypeError: a keyword that is not a filter.
        InvalidPayloadError: an invalid value (a board name that is not a token, an unknown kind,
            a ``where`` :func:`~blackboard.protocol.filters.parse_where` refuses).
    """
    update: dict[str, Any] = {}
    for name, value in args.items():
        if name in _RANKING or name in _ONE_OF or value is None:
            continue
        if name not in SearchFilters.model_fields:
            raise TypeError(f"unexpected search filter {name!r}")
        if name == "metadata":
            value = mapping_arg(value, name)
        elif name == "where":
            value = parse_where(value)
        elif name not in _SCALARS:
            value = sequence_arg(value, name)
        update[name] = value
    for one, many in _ONE_OF.items():
        if args.get(one) is not None:
            rest = update[many] if many in update else getattr(filters, many) if filters is not None else []
            update[many] = [args[one], *rest]
    try:
        if filters is None:
            return SearchFilters(**update)
        if not update:
            return filters
        fields = filters.model_dump(exclude={"where"})
        return SearchFilters.model_validate({**fields, "where": filters.where, **update})
    except ValidationError as exc:
        raise InvalidPayloadError(f"invalid search filters: {exc.errors()[0]['msg']}") from exc


def raise_for_error(headers: Mapping[str, str] | None, data: bytes) -> None:
    """Raise the typed error an error reply carries (no-op for a normal reply).

    Raises:
        NotFoundError, PermissionDeniedError, InvalidPayloadError, SearchError: as the service said.
    """
    if not headers or Header.ERROR.value not in headers:
        return
    name = headers[Header.ERROR.value]
    try:
        err = validate_wire(ErrorReply, codec.decode(data, codec.encoding_of(headers)))
        message, key = err.message, err.key
    except InvalidPayloadError:
        message, key = headers.get("Nats-Service-Error", name), None
    if name == "NotFoundError":
        raise NotFoundError(key or "", message)
    if name == "PermissionDeniedError":
        raise PermissionDeniedError(message, operation=key)
    if name in ("InvalidPayloadError", "InvalidKeyError"):
        raise InvalidPayloadError(message)
    raise SearchError(message)


@overload
async def search_request(nc: NATS, endpoint: str, request: BaseModel | None, reply: type[R], *,
                         principal: str, timeout: float) -> R: ...


@overload
async def search_request(nc: NATS, endpoint: str, request: BaseModel | None, reply: None, *,
                         principal: str, timeout: float) -> Any: ...


async def search_request(nc: NATS, endpoint: str, request: BaseModel | None, reply: type[R] | None, *,
                         principal: str, timeout: float) -> R | Any:
    """Ask the search service's ``endpoint`` as ``principal`` (``bb.search.<principal>.<endpoint>``):
    the request encoded without its None fields, the reply validated as ``reply`` (None: the
    decoded reply as it is).

    Raises:
        SearchError: the service is not running, did not answer within ``timeout`` seconds, or
            failed.
        PermissionDeniedError: the principal may not read a board the request names, or the
            policy does not declare it.
        NotFoundError, InvalidPayloadError: the service said so.
    """
    data = codec.encode(request.model_dump(exclude_none=True)) if request is not None else b""
    if tracing.enabled:
        with tracing.span(f"search {endpoint}", "client", tracing.search_attributes(endpoint, request, principal)):
            return await _search_request(nc, endpoint, data, reply, principal, timeout, traced=True)
    return await _search_request(nc, endpoint, data, reply, principal, timeout)


async def _search_request(nc: NATS, endpoint: str, data: bytes, reply: type[R] | None, principal: str,
                          timeout: float, *, traced: bool = False) -> R | Any:
    subject = Subjects.search(principal, endpoint)
    try:
        if traced:  # the service's span joins this one's trace
            headers: dict[str, str] = {}
            tracing.inject(headers)
            msg = await nc.request(subject, data, timeout=timeout, headers=headers)
        else:
            msg = await nc.request(subject, data, timeout=timeout)
    except NoRespondersError as exc:
        raise SearchError("the search service is not running (start a worker)") from exc
    except (NatsTimeoutError, TimeoutError) as exc:
        raise SearchError(f"the search service did not answer within {timeout:g}s") from exc
    raise_for_error(msg.headers, msg.data)
    decoded = codec.decode(msg.data, codec.encoding_of(msg.headers), max_depth=MAX_REPLY_DEPTH)  # replies nest records
    return decoded if reply is None else validate_wire(reply, decoded)


class SearchClient:
    """Calls the search service over NATS (any worker process answers).

    Every search runs as ``principal``, over the boards it may read: a board it
    may not read raises ``PermissionDeniedError``; without a board filter only
    readable boards are searched.

    Args:
        nc: a connected NATS client.
        settings: for the request timeout and default top_k.
        principal: whose rights the searches run with (the agent's id; with a credential, the
            id the credential names).

    Raises:
        InvalidKeyError: ``principal`` is not a valid id.
    """

    def __init__(self, nc: NATS, settings: Settings, principal: str) -> None:
        self._nc = nc
        self._settings = settings
        self.principal = validate_name(principal, "principal")

    async def _call(self, endpoint: str, request: BaseModel | None, reply: type[R]) -> R:
        return await search_request(self._nc, endpoint, request, reply, principal=self.principal,
                                    timeout=self._settings.search.timeout)

    def _request(self, cls: type[_Request], query: str, filters: SearchFilters | None,
                 args: Mapping[str, Any]) -> _Request:
        """The request of a search: ``filters`` with the keywords of ``args`` applied
        (:func:`search_filters`), and the ranking keywords."""
        try:
            return cls.of(query, search_filters(filters, args), mode=args.get("mode") or "hybrid",
                          top_k=args.get("top_k") or self._settings.search.default_top_k,
                          min_score=args.get("min_score"))
        except InvalidPayloadError:
            raise
        except ValueError as exc:  # pydantic's ValidationError too
            raise InvalidPayloadError(f"invalid {cls.target} search: {exc}") from exc

    async def recall(self, query: str, *, filters: SearchFilters | None = None,
                     **args: Unpack[RecallArgs]) -> list[MemoryHit]:
        """Search long-term memories, best first.

        Args:
            query: what to look for, in words.
            filters: the filters as one value (:class:`SearchFilters`; its ``sections`` are
                refused); the keyword filters of :class:`RecallArgs` replace its fields.
            **args: :class:`RecallArgs`: ``board``/``boards``, ``kind``/``kinds``,
                ``author``, ``tags_any``, ``tags_all``, ``since``, ``until``, ``metadata``,
                ``where`` (comparison filters, docs/search.md "Filters"), the lifecycle filters
                (``include_superseded``, ``include_archived``, ``as_of``, ``known_at``,
                ``occurred_after``, ``occurred_before``, ``min_confidence``; default: current
                memories only), ``top_k``, ``min_score``, ``mode``.

        Raises:
            SearchError: the service is not running, timed out or failed.
            PermissionDeniedError: a board filter names a board this principal may not read.
            InvalidPayloadError: the request is invalid.
            TypeError: a keyword that is not a memory search filter.
        """
        req = self._request(MemorySearchRequest, query, filters, _only(args, RecallArgs))
        return (await self._call("memories", req, MemorySearchResponse)).hits

    async def memory(self, board: str, id: str) -> MemoryDetail:
        """One memory of ``board`` by id: the memory (``score`` 0; archived or superseded ones
        too), the memories merged into it (``sources``: who wrote each, when, the stream
        sequence and signature of the version merged, how it was merged) and every version of
        its subject key (``versions``, valid-time order, itself included). The id of a memory
        merged into another answers with the kept memory.

        Raises:
            NotFoundError: no memory of that id on that board.
            PermissionDeniedError: this principal may not read the board.
            InvalidPayloadError: an invalid board name or id.
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = MemoryGetRequest(board=board, id=id)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid memory read: {exc}") from exc
        return await self._call("memory", req, MemoryDetail)

    async def search_entries(self, query: str, *, filters: SearchFilters | None = None,
                             **args: Unpack[EntrySearchArgs]) -> list[EntryHit]:
        """Search current board entries, best first.

        Args:
            query: what to look for, in words.
            filters: the filters as one value (:class:`SearchFilters`; its ``kinds`` are
                refused); the keyword filters of :class:`EntrySearchArgs` replace its fields.
            **args: :class:`EntrySearchArgs`: ``board``/``boards``, ``section``/``sections``,
                ``author``, ``tags_any``, ``tags_all``, ``since``, ``until``, ``metadata``,
                ``where`` (comparison filters, docs/search.md "Filters"), ``top_k``, ``min_score``, ``mode``.

        Raises:
            SearchError: the service is not running, timed out or failed.
            PermissionDeniedError: a board filter names a board this principal may not read.
            InvalidPayloadError: the request is invalid.
            TypeError: a keyword that is not an entry search filter.
        """
        req = self._request(EntrySearchRequest, query, filters, _only(args, EntrySearchArgs))
        return (await self._call("entries", req, EntrySearchResponse)).hits

    async def history(self, board: str, section: str, key: str, *, limit: int | None = None) -> list[EntryRevision]:
        """Every revision of a key stored in PostgreSQL, oldest first (deletes included).

        Raises:
            NotFoundError: no revision of the key is stored.
            PermissionDeniedError: this principal may not read the board.
            SearchError: the service is not running, timed out or failed.
        """
        req = HistoryRequest(board=board, section=section, key=key, limit=limit)
        return (await self._call("history", req, HistoryResponse)).revisions

    async def as_of(self, board: str, section: str, key: str, *, revision: int | None = None,
                    at: datetime | None = None) -> EntryRevision:
        """The key's value as of a revision (newest <= it) or an instant (give one).

        Raises:
            NotFoundError: the key did not exist then or was deleted.
            PermissionDeniedError: this principal may not read the board.
            InvalidPayloadError: neither or both of revision and at.
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = AsOfRequest(board=board, section=section, key=key, revision=revision, at=at)
        except ValueError as exc:
            raise InvalidPayloadError(str(exc)) from exc
        return await self._call("as_of", req, EntryRevision)

    async def searchable(self, board: str, items: Sequence[tuple[str, int]]) -> SearchableResponse:
        """Which of these memories of ``board`` (``(id, seq)``: the stream sequence of the version
        written, 0 for any) every search mode does not find yet: not stored, or not embedded.

        Raises:
            PermissionDeniedError: this principal may not read the board.
            InvalidPayloadError: no items, or more than ``MAX_SEARCHABLE_ITEMS``, or a bad id.
            SearchError: the service is not running, has no embedding provider, timed out or failed.
        """
        try:
            req = SearchableRequest(board=board, items=[SearchableItem(id=i, seq=n) for i, n in items])
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid searchable request: {exc}") from exc
        return await self._call("searchable", req, SearchableResponse)

    async def prune(self, board: str, *, strategy: PruneStrategy = "low_confidence", threshold: float | None = None,
                    scope: PruneScope = "own", dry_run: bool = False,
                    limit: int | None = None) -> MemoryPruneResponse:
        """Archive the long-term memories of ``board`` a strategy selects, least worth keeping
        first (docs/memory-lifecycle.md, "Pruning and archive"; restore them with
        :meth:`restore`). A knowledge file's memories and contested ones are never pruned.

        Args:
            board: the board whose memories to prune.
            strategy: ``lru``, ``low_confidence``, ``old_age``, ``importance`` or ``max_per_board``.
            threshold: replaces the strategy's setting (``memory.prune_*``): seconds for ``lru``
                and ``old_age``, 0..1 for ``low_confidence`` and ``importance``, a count for
                ``max_per_board``.
            scope: ``"own"``: only this principal's memories (it must hold ``write`` on the
                board); ``"all"``: every author's (``admin`` on the board).
            dry_run: only tell which would be archived (the rights are checked alike).
            limit: at most this many (default and most: ``MAX_PRUNE_LIMIT``, 10,000).

        Returns:
            The ids archived (``dry_run``: that would be) and their count.

        Raises:
            PermissionDeniedError: ``scope="all"`` without ``admin`` on the board, or no
                ``write`` there; nothing is archived.
            InvalidPayloadError: an unknown strategy or scope, a threshold out of range, a bad
                board name or limit.
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = MemoryPruneRequest(board=board, strategy=strategy, threshold=threshold, scope=scope,
                                     dry_run=dry_run, limit=limit)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid prune: {exc}") from exc
        return await self._call("prune", req, MemoryPruneResponse)

    async def archive(self, board: str, ids: Sequence[str], *, reason: str = "archived",
                      dry_run: bool = False) -> MemoryArchiveResponse:
        """Archive these long-term memories of ``board`` (recall leaves them out; :meth:`restore`
        brings them back), recording ``reason``. All or nothing on the rights: another agent's
        memory among them needs ``admin`` on the board; this principal's own need ``write``.

        Returns:
            ``archived`` (dry_run: would be), ``missing`` (no memory of the board has that id)
            and ``refused`` (id -> why left: already archived, read-only, contested).

        Raises:
            PermissionDeniedError: an id of another agent's memory without ``admin`` on the
                board, or no ``write`` there; nothing is archived.
            InvalidPayloadError: no ids or more than 1,000, a bad board name or reason (``merged``
                and ``conflict`` are reserved).
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = MemoryArchiveRequest(board=board, ids=str_list(ids, "ids"), reason=reason, dry_run=dry_run)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid archive: {exc}") from exc
        return await self._call("archive", req, MemoryArchiveResponse)

    async def restore(self, board: str, ids: Sequence[str]) -> MemoryRestoreResponse:
        """Bring archived memories of ``board`` back into recall (rights as :meth:`archive`).

        Returns:
            ``restored``, and ``refused`` (id -> why not: not found, not archived, merged into
            another memory, a merge whose sources changed).

        Raises:
            PermissionDeniedError: an id of another agent's memory without ``admin`` on the
                board, or no ``write`` there; nothing is restored.
            InvalidPayloadError: no ids or more than 1,000, a bad board name.
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = MemoryRestoreRequest(board=board, ids=str_list(ids, "ids"))
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid restore: {exc}") from exc
        return await self._call("restore", req, MemoryRestoreResponse)

    async def status(self) -> dict[str, Any]:
        """A worker's status: consumer lag, counters, embedding backlog.

        Raises:
            SearchError: the service is not running, timed out or failed.
        """
        result: dict[str, Any] = await search_request(self._nc, "status", None, None, principal=self.principal,
                                                      timeout=self._settings.search.timeout)
        return result


def _only(args: Mapping[str, Any], allowed: type[SearchArgs]) -> Mapping[str, Any]:
    """``args``, checked to be keywords of ``allowed`` (a keyword function would have refused
    the others).

    Raises:
        TypeError: another keyword.
    """
    unknown = set(args) - allowed.__annotations__.keys()  # (a TypedDict's: its bases' keys too)
    if unknown:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    return args
