"""SDK client of the search micro service: recall memories, search entries, history, as-of.

``Agent.recall(...)`` and ``Board.search(...)`` delegate to :class:`SearchClient`.
Errors come back typed: ``NotFoundError`` for a missing key or revision,
``SearchError`` for everything else (service not running, timeout, failure),
``InvalidPayloadError`` for a request the service refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel

from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError, SearchError
from blackboard.protocol.schemas import WireModel, validate_wire
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    EntryHit,
    EntryRevision,
    EntrySearchRequest,
    EntrySearchResponse,
    ErrorReply,
    HistoryRequest,
    HistoryResponse,
    MemoryHit,
    MemorySearchRequest,
    MemorySearchResponse,
    SearchMode,
)
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import Settings

__all__ = ["SearchClient", "raise_for_error"]

R = TypeVar("R", bound=WireModel)


def _names(one: str | None, many: Sequence[str] | None) -> list[str]:
    out = list(many or [])
    if one is not None:
        out.insert(0, one)
    return out


def raise_for_error(headers: Mapping[str, str] | None, data: bytes) -> None:
    """Raise the typed error an error reply carries (no-op for a normal reply).

    Raises:
        NotFoundError, InvalidPayloadError, SearchError: as the service said.
    """
    if not headers or Header.ERROR.value not in headers:
        return
    name = headers[Header.ERROR.value]
    try:
        err = validate_wire(ErrorReply, codec.decode(data, codec.encoding_of(headers)))
        message, key = err.message, err.key
    except InvalidPayloadError:
        message, key = headers.get(Header.SERVICE_ERROR.value, name), None
    if name == "NotFoundError":
        raise NotFoundError(key or "", message)
    if name in ("InvalidPayloadError", "InvalidKeyError"):
        raise InvalidPayloadError(message)
    raise SearchError(message)


class SearchClient:
    """Calls the search service over NATS (any worker process answers).

    Args:
        nc: a connected NATS client.
        settings: for the request timeout and default top_k.
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self._nc = nc
        self._settings = settings

    async def _call(self, endpoint: str, request: BaseModel | None, reply: type[R]) -> R:
        data = codec.encode(request.model_dump(exclude_none=True)) if request is not None else b""
        try:
            msg = await self._nc.request(Subjects.search(endpoint), data, timeout=self._settings.search.timeout)
        except NoRespondersError as exc:
            raise SearchError("the search service is not running (start a worker)") from exc
        except (NatsTimeoutError, TimeoutError) as exc:
            raise SearchError(f"the search service did not answer within {self._settings.search.timeout:g}s") from exc
        raise_for_error(msg.headers, msg.data)
        return validate_wire(reply, codec.decode(msg.data, codec.encoding_of(msg.headers)))

    async def recall(self, query: str, *, board: str | None = None, boards: Sequence[str] | None = None,
                     kind: MemoryKind | None = None, kinds: Sequence[MemoryKind] | None = None,
                     tags_any: Sequence[str] = (), tags_all: Sequence[str] = (), author: str | None = None,
                     since: datetime | None = None, until: datetime | None = None,
                     metadata: Mapping[str, Any] | None = None, top_k: int | None = None,
                     min_score: float | None = None, mode: SearchMode = "hybrid") -> list[MemoryHit]:
        """Search long-term memories, best first.

        Raises:
            SearchError: the service is not running, timed out or failed.
            InvalidPayloadError: the request is invalid.
        """
        req = MemorySearchRequest(
            query=query, mode=mode, top_k=top_k or self._settings.search.default_top_k, min_score=min_score,
            boards=_names(board, boards), kinds=_names(kind, kinds), author=author,
            tags_any=list(tags_any), tags_all=list(tags_all), since=since, until=until,
            metadata=dict(metadata or {}))
        return (await self._call("memories", req, MemorySearchResponse)).hits

    async def search_entries(self, query: str, *, board: str | None = None, boards: Sequence[str] | None = None,
                             section: str | None = None, sections: Sequence[str] | None = None,
                             tags_any: Sequence[str] = (), tags_all: Sequence[str] = (),
                             author: str | None = None, since: datetime | None = None,
                             until: datetime | None = None, metadata: Mapping[str, Any] | None = None,
                             top_k: int | None = None, min_score: float | None = None,
                             mode: SearchMode = "hybrid") -> list[EntryHit]:
        """Search current board entries, best first.

        Raises:
            SearchError: the service is not running, timed out or failed.
            InvalidPayloadError: the request is invalid.
        """
        req = EntrySearchRequest(
            query=query, mode=mode, top_k=top_k or self._settings.search.default_top_k, min_score=min_score,
            boards=_names(board, boards), sections=_names(section, sections), author=author,
            tags_any=list(tags_any), tags_all=list(tags_all), since=since, until=until,
            metadata=dict(metadata or {}))
        return (await self._call("entries", req, EntrySearchResponse)).hits

    async def history(self, board: str, section: str, key: str, *, limit: int | None = None) -> list[EntryRevision]:
        """Every revision of a key stored in PostgreSQL, oldest first (deletes included).

        Raises:
            NotFoundError: no revision of the key is stored.
            SearchError: the service is not running, timed out or failed.
        """
        req = HistoryRequest(board=board, section=section, key=key, limit=limit)
        return (await self._call("history", req, HistoryResponse)).revisions

    async def as_of(self, board: str, section: str, key: str, *, revision: int | None = None,
                    at: datetime | None = None) -> EntryRevision:
        """The key's value as of a revision (newest <= it) or an instant (give one).

        Raises:
            NotFoundError: the key did not exist then or was deleted.
            InvalidPayloadError: neither or both of revision and at.
            SearchError: the service is not running, timed out or failed.
        """
        try:
            req = AsOfRequest(board=board, section=section, key=key, revision=revision, at=at)
        except ValueError as exc:
            raise InvalidPayloadError(str(exc)) from exc
        return await self._call("as_of", req, EntryRevision)

    async def status(self) -> dict[str, Any]:
        """A worker's status: consumer lag, counters, embedding backlog."""
        try:
            msg = await self._nc.request(Subjects.search("status"), b"", timeout=self._settings.search.timeout)
        except NoRespondersError as exc:
            raise SearchError("the search service is not running (start a worker)") from exc
        except (NatsTimeoutError, TimeoutError) as exc:
            raise SearchError("the search service did not answer") from exc
        raise_for_error(msg.headers, msg.data)
        result: dict[str, Any] = codec.decode(msg.data, codec.encoding_of(msg.headers))
        return result
