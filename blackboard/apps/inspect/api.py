"""The inspector's JSON API (docs/inspector.md): one handler per route, each reading through the
inspector's agent, so what it answers is what that identity may read.

Errors answer ``{"error": message, "type": ErrorClass}``: 400 for a malformed request, 403 for
a board the identity may not read, 404 for what does not exist, 503 when a server or the
worker does not answer (:func:`error_response`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import nats.errors
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agents_sdk.objects import ObjectRef
from blackboard.apps.inspect.events import KEEPALIVE, page_of, preview_of, proposal_json, sse
from blackboard.protocol.entries import Entry, Operation
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    OperationTimeoutError,
    PermissionDeniedError,
    SearchError,
    TransportError,
)
from blackboard.protocol.schemas import EntryRevision
from blackboard.protocol.subjects import validate_name

if TYPE_CHECKING:
    from blackboard.apps.inspect.app import Inspector

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "JSONResponse",
    "entry_json",
    "error_response",
    "routes",
    "value_json",
]

#: Entries a page holds unless ``limit`` says otherwise, and at most.
DEFAULT_LIMIT = 200
MAX_LIMIT = 2000
#: Messages listed unless ``limit`` says otherwise, and at most.
DEFAULT_MESSAGES = 100
MAX_MESSAGES = 500
#: Seconds the first read of a board's votes may take.
VOTES_TIMEOUT = 30.0
#: As-of states of boards kept (a slider asks for neighbouring revisions in turn).
ASOF_CACHE = 8

_DATETIME_FILTERS = ("since", "until", "as_of", "known_at", "occurred_after", "occurred_before")


class JSONResponse(Response):
    """A JSON response through orjson (datetimes as RFC 3339)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": len(value)}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# ------------------------------------------------------------------------ errors
def error_response(exc: BaseException) -> JSONResponse:
    """The JSON error answer of an exception: 400, 403, 404 or 503 (500 for anything else)."""
    if isinstance(exc, PermissionDeniedError):
        status = 403
    elif isinstance(exc, (NotFoundError, LookupError)):
        status = 404
    elif isinstance(exc, (InvalidKeyError, InvalidPayloadError, ValueError, TypeError)):
        status = 400
    elif isinstance(exc, (SearchError, TransportError, nats.errors.Error, TimeoutError, OSError)):
        status = 503
    else:
        status = 500
    message = " ".join(str(exc).split()) or type(exc).__name__
    return JSONResponse({"error": message, "type": type(exc).__name__}, status_code=status)


Handler = Callable[["Inspector", Request], Awaitable[Response]]

_HANDLED: tuple[type[BaseException], ...] = (BlackboardError, ValueError, TypeError, LookupError,
                                              nats.errors.Error, TimeoutError, OSError)


def _route(path: str, handler: Handler, inspector: Inspector, methods: list[str] | None = None) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(inspector, request)
        except _HANDLED as exc:
            return error_response(exc)

    return Route(path, endpoint, methods=methods or ["GET"])


# ----------------------------------------------------------------------- shaping
def _op(operation: Operation | str) -> str:
    value = operation.value if isinstance(operation, Operation) else str(operation)
    return {"PUT": "put", "DEL": "delete", "PURGE": "purge"}.get(value, value.lower())


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    ref = ObjectRef.from_value(value) if isinstance(value, dict) else None
    if ref is not None:
        return ref.size
    if isinstance(value, str):
        return len(value.encode())
    try:
        return len(orjson.dumps(value, default=str))
    except TypeError:
        return 0


def entry_json(entry: Entry) -> dict[str, Any]:
    """An entry's summary (no value): what a list row shows."""
    return {"board": entry.board, "section": entry.section, "key": entry.key, "revision": entry.revision,
            "author": entry.author, "created_at": entry.created_at, "stored_at": entry.stored_at,
            "tags": list(entry.tags), "metadata": dict(entry.metadata), "content_type": entry.content_type,
            "size": _size(entry.value), "preview": preview_of(entry), "verdict": entry.verdict.value}


def _object_url(board: str, section: str, key: str, revision: int) -> str:
    from urllib.parse import quote

    return f"/api/objects/{quote(board)}/{quote(section)}/{quote(key, safe='')}?revision={revision}"


def value_json(board: str, section: str, key: str, revision: int, value: Any,
               content_type: str | None) -> dict[str, Any]:
    """``value``, ``value_kind`` (json, text, image, binary, object) and, for bytes, ``object_url``
    (the bytes, served by ``/api/objects/...``)."""
    ctype = content_type or ""
    ref = ObjectRef.from_value(value) if isinstance(value, dict) else None
    if ref is not None:
        kind = "image" if (ref.content_type or ctype).startswith("image/") else "object"
        return {"value": value, "value_kind": kind, "object_url": _object_url(board, section, key, revision)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        kind = "image" if ctype.startswith("image/") else "binary"
        return {"value": None, "value_kind": kind, "object_url": _object_url(board, section, key, revision)}
    if isinstance(value, str) and not ctype.endswith("json"):
        return {"value": value, "value_kind": "text", "object_url": None}
    return {"value": value, "value_kind": "json", "object_url": None}


def _revision_json(rev: EntryRevision | Entry) -> dict[str, Any]:
    ctype: str | None
    if isinstance(rev, Entry):
        op, value, ctype = _op(rev.operation), (None if rev.deleted else rev.value), rev.content_type
        shaped = {"revision": rev.revision, "op": op, "author": rev.author, "created_at": rev.created_at,
                  "stored_at": rev.stored_at, "content_type": ctype, "tags": list(rev.tags),
                  "metadata": dict(rev.metadata)}
    else:
        op, value, ctype = _op(rev.op), rev.value, rev.content_type
        shaped = {"revision": rev.revision, "op": op, "author": rev.author, "created_at": rev.created_at,
                  "stored_at": rev.stored_at, "content_type": ctype, "tags": list(rev.tags),
                  "metadata": dict(rev.metadata)}
    shaped.update(value_json("", "", "", 0, value, ctype) if op == "put" else
                  {"value": None, "value_kind": None, "object_url": None})
    return shaped


# ------------------------------------------------------------------------ params
def _int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidPayloadError(f"{name} must be an integer, not {text!r}") from None
    if not lo <= value <= hi:
        raise InvalidPayloadError(f"{name} must be between {lo} and {hi}, not {value}")
    return value


def _cursor_encode(k: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(k))).decode().rstrip("=")


def _cursor_decode(text: str | None) -> tuple[str, str] | None:
    if not text:
        return None
    try:
        section, key = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return str(section), str(key)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidPayloadError(f"invalid cursor {text!r}") from None


def _instant(text: str, name: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidPayloadError(f"{name} must be an ISO 8601 instant, not {text!r}") from None
    if value.tzinfo is None:
        raise InvalidPayloadError(f"{name} must carry a time zone (…Z or +00:00)")
    return value


def _path(request: Request, name: str) -> str:
    return str(request.path_params[name])


# ---------------------------------------------------------------------- handlers
async def whoami(inspector: Inspector, request: Request) -> Response:
    return JSONResponse({"agent": inspector.agent.id, "read_only": True})


async def boards(inspector: Inspector, request: Request) -> Response:
    return JSONResponse({"boards": await inspector.access.boards()})


async def entries(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    section = request.query_params.get("section") or None
    prefix = request.query_params.get("prefix") or None
    cursor = _cursor_decode(request.query_params.get("cursor"))
    feeds = inspector.feeds
    feed = feeds.opened(board)
    if feed is None:  # its view is not loaded yet: a page of the key listing, the view loaded meanwhile
        listing = await feeds.listing(board)
        page, after, total = await feeds.listing_page(listing, section=section, prefix=prefix, after=cursor,
                                                      limit=limit)
        feeds.open_soon(board)
        sections, revision, source = listing.sections(), listing.revision, "listing"
    else:
        page, after, total = feed.page(section=section, prefix=prefix, after=cursor, limit=limit)
        sections, revision, source = feed.sections(), feed.view.revision, "view"
    return JSONResponse({"entries": [entry_json(e) for e in page],
                         "next": _cursor_encode(after) if after is not None else None,
                         "total": total, "sections": sections, "revision": revision, "source": source})


async def entry(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    section, key = _path(request, "section"), _path(request, "key")
    revision = _int(request, "revision", 0, 0, 2**63)
    found: Entry | None = None
    feed = inspector.feeds.opened(board)
    if not revision and feed is not None:
        found = feed.view.get(section, key)
    if found is None:
        found = await inspector.agent.board(board).get(section, key, revision=revision or None)
    shaped = entry_json(found)
    shaped.update(value_json(board, section, key, found.revision, found.value, found.content_type))
    return JSONResponse(shaped)


async def objects(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    section, key = _path(request, "section"), _path(request, "key")
    revision = _int(request, "revision", 0, 0, 2**63) or None
    handle = inspector.agent.board(board)
    found = await handle.get(section, key, revision=revision)
    data = await inspector.agent.objects.resolve(found)
    ref = ObjectRef.from_value(found.value) if isinstance(found.value, dict) else None
    ctype = (ref.content_type if ref is not None else None) or found.content_type or "application/octet-stream"
    return Response(data, media_type=ctype, headers={"Cache-Control": "private, max-age=3600",
                                                     "X-Content-Type-Options": "nosniff",
                                                     "Content-Security-Policy": "default-src 'none'; sandbox"})


async def history(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    section, key = _path(request, "section"), _path(request, "key")
    handle = inspector.agent.board(board)
    kept = await handle.history(section, key)
    merged: dict[int, dict[str, Any]] = {}
    source = "jetstream"
    try:
        stored = await handle.stored_history(section, key)
    except (NotFoundError, SearchError):
        stored = []  # nothing stored yet, or no worker: the revisions JetStream keeps
    else:
        source = "postgres+jetstream"
    for rev in stored:
        merged[rev.revision] = _revision_json(rev)
    for item in kept:
        merged[item.revision] = _revision_json(item)
    if not merged:
        raise NotFoundError(key, f"no revision of {section}/{key} on board {board!r}")
    return JSONResponse({"board": board, "section": section, "key": key, "source": source,
                         "revisions": [merged[r] for r in sorted(merged)]})


async def asof(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    text_rev, text_at = request.query_params.get("revision"), request.query_params.get("at")
    if bool(text_rev) == bool(text_at):
        raise InvalidPayloadError("give one of revision=N or at=ISO8601")
    revision = _int(request, "revision", 0, 0, 2**63) if text_rev else None
    at = _instant(text_at, "at") if text_at else None
    cursor = _cursor_decode(request.query_params.get("cursor"))
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    state = await inspector.board_as_of(board, revision=revision, at=at)
    page, after, total = page_of(state.order, state.get, section=request.query_params.get("section") or None,
                                 prefix=request.query_params.get("prefix") or None, after=cursor, limit=limit)
    rows = []
    for item in page:
        shaped = entry_json(item)
        shaped.update(value_json(board, item.section, item.key, item.revision, item.value, item.content_type))
        rows.append(shaped)
    return JSONResponse({"entries": rows, "revision": state.revision, "total": total,
                         "next": _cursor_encode(after) if after is not None else None})


async def events(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    feed = await inspector.feeds.feed_after_first_page(board)
    votes = request.query_params.get("votes", "1") not in ("0", "false", "no")

    async def stream() -> AsyncIterator[bytes]:
        async with feed.listen() as queue:
            if votes:
                task = asyncio.create_task(feed.start_votes())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
            yield sse("ready", {"board": board, "revision": feed.view.revision, "agent": inspector.agent.id})
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if item is None:
                    return
                yield sse(*item)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def votes(inspector: Inspector, request: Request) -> Response:
    board = await inspector.access.check(_path(request, "board"))
    feed = await inspector.feeds.feed(board)
    try:
        await asyncio.wait_for(feed.start_votes(), VOTES_TIMEOUT)
    except TimeoutError:
        raise OperationTimeoutError(f"the votes of board {board!r} were not read within {VOTES_TIMEOUT:g} s") from None
    shaped = [proposal_json(state) for state in feed.proposals.values() if state.log.proposal is not None]
    shaped.sort(key=lambda p: (not p["open"], str(p["created_at"] or "")), reverse=False)
    return JSONResponse({"proposals": shaped})


def _message_json(hit: Any) -> dict[str, Any]:
    body = hit.body
    try:
        text = body if isinstance(body, str) else orjson.dumps(body, default=str).decode()
    except TypeError:
        text = repr(body)
    text = " ".join(text.split())
    return {"id": hit.id, "seq": hit.seq, "kind": hit.kind, "from": hit.sender, "to": hit.recipients,
            "board": hit.board, "topic": hit.topic, "type": hit.type, "created_at": hit.created_at,
            "stored_at": hit.stored_at, "correlation_id": hit.correlation_id, "body": body,
            "preview": text if len(text) <= 160 else text[:159] + "…", "verdict": hit.verdict.value}


async def messages(inspector: Inspector, request: Request) -> Response:
    params = request.query_params
    limit = _int(request, "limit", DEFAULT_MESSAGES, 1, MAX_MESSAGES)
    filters: dict[str, Any] = {"top_k": limit}
    if params.get("type"):
        filters["types"] = [params["type"]]
    if params.get("kind"):
        filters["kinds"] = [params["kind"]]
    if params.get("board"):
        filters["boards"] = [params["board"]]
    if params.get("topic"):
        filters["topics"] = [params["topic"]]
    query = params.get("q") or None
    messenger = inspector.agent.messaging
    agent = params.get("agent")
    if agent:
        sent, received = await asyncio.gather(messenger.search(query, senders=[agent], **filters),
                                              messenger.search(query, recipients=[agent], **filters))
        hits = {h.seq: h for h in [*sent, *received]}
        found = sorted(hits.values(), key=lambda h: h.seq, reverse=True)[:limit]
    else:
        found = await messenger.search(query, **filters)
    return JSONResponse({"messages": [_message_json(h) for h in found]})


_MEMORY_FILTERS = frozenset({"board", "boards", "author", "tags_any", "tags_all", "since", "until", "metadata",
                             "where", "kind", "kinds", "include_superseded", "include_archived", "as_of",
                             "known_at", "occurred_after", "occurred_before", "min_confidence"})
_ENTRY_FILTERS = frozenset({"board", "boards", "author", "tags_any", "tags_all", "since", "until", "metadata",
                            "where", "section", "sections"})


async def search(inspector: Inspector, request: Request) -> Response:
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise InvalidPayloadError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidPayloadError("the request body must be a JSON object")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InvalidPayloadError("query must be a non-empty string")
    target = body.get("target") or "memories"
    if target not in ("memories", "entries"):
        raise InvalidPayloadError("target must be 'memories' or 'entries'")
    allowed = _MEMORY_FILTERS if target == "memories" else _ENTRY_FILTERS
    filters = dict(body.get("filters") or {})
    for name in ("board", "boards"):
        if body.get(name):
            filters[name] = body[name]
    unknown = sorted(set(filters) - allowed)
    if unknown:
        raise InvalidPayloadError(f"unknown {target} filter(s): {', '.join(unknown)}")
    for name in _DATETIME_FILTERS:
        if isinstance(filters.get(name), str):
            filters[name] = _instant(filters[name], name)
    args: dict[str, Any] = {k: v for k, v in filters.items() if v not in (None, "", [])}
    mode, top_k, min_score = body.get("mode") or None, body.get("top_k"), body.get("min_score")
    if mode is not None:
        if mode not in ("hybrid", "semantic", "keyword"):
            raise InvalidPayloadError(f"mode must be hybrid, semantic or keyword, not {mode!r}")
        args["mode"] = mode
    if top_k not in (None, ""):
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise InvalidPayloadError(f"top_k must be a positive integer, not {top_k!r}")
        args["top_k"] = top_k
    if min_score not in (None, ""):
        if not isinstance(min_score, (int, float)) or isinstance(min_score, bool):
            raise InvalidPayloadError(f"min_score must be a number, not {min_score!r}")
        args["min_score"] = float(min_score)
    started = time.perf_counter()
    client = inspector.agent.search
    if target == "memories":
        hits: list[dict[str, Any]] = [{**h.model_dump(mode="json"), "target": "memory"}
                                      for h in await client.recall(query, **args)]
    else:
        hits = [{**h.model_dump(mode="json"), "target": "entry", "id": f"{h.section}/{h.key}"}
                for h in await client.search_entries(query, **args)]
    return JSONResponse({"hits": hits, "took_ms": round((time.perf_counter() - started) * 1000, 1)})


async def memory(inspector: Inspector, request: Request) -> Response:
    # No check against the listed boards: a board holding only memories has no live key, so it is
    # not listed; the search service checks this principal's rights itself (403 when refused).
    board = validate_name(_path(request, "board"), "board")
    detail = await inspector.agent.search.memory(board, _path(request, "id"))
    return JSONResponse(detail.model_dump(mode="json"))


async def system(inspector: Inspector, request: Request) -> Response:
    return JSONResponse(await inspector.system())


def routes(inspector: Inspector) -> list[Route]:
    """The API's routes, bound to ``inspector``."""
    return [
        _route("/api/whoami", whoami, inspector),
        _route("/api/boards", boards, inspector),
        _route("/api/boards/{board}/entries", entries, inspector),
        _route("/api/boards/{board}/entry/{section}/{key:path}", entry, inspector),
        _route("/api/boards/{board}/history/{section}/{key:path}", history, inspector),
        _route("/api/boards/{board}/asof", asof, inspector),
        _route("/api/boards/{board}/events", events, inspector),
        _route("/api/boards/{board}/votes", votes, inspector),
        _route("/api/objects/{board}/{section}/{key:path}", objects, inspector),
        _route("/api/messages", messages, inspector),
        _route("/api/search", search, inspector, methods=["POST"]),
        _route("/api/memory/{board}/{id}", memory, inspector),
        _route("/api/system", system, inspector),
    ]

