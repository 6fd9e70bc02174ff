"""Boards, sections and entries as MCP resources, and their subscriptions.

URIs: ``blackboard://{board}`` (its sections), ``blackboard://{board}/{section}``
(its live entries) and ``blackboard://{board}/{section}/{key}`` (one entry; a
key that is not a plain token is percent-encoded). All are JSON.

A subscription to one of them is a watch of the board (the SDK's ``board.watch``)
as the subscriber's identity: every change under the URI sends
``notifications/resources/updated`` for it. Both protocol eras are served:
``subscriptions/listen`` (2026-07-28: the watches live as long as the listen
stream) and ``resources/subscribe``/``resources/unsubscribe`` (earlier versions:
until unsubscribed or the server's lifespan ends, at most
:data:`MAX_LEGACY_SUBSCRIPTIONS` per server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)

from agents_sdk import Agent
from blackboard.apps.mcp.results import dumps, entry_out
from blackboard.apps.mcp.tools import list_entries
from blackboard.protocol.errors import BlackboardError, InvalidKeyError, NotFoundError
from blackboard.protocol.subjects import validate_name

if TYPE_CHECKING:
    from blackboard.apps.mcp.server import AgentSource, BlackboardMCP

__all__ = ["MAX_LEGACY_SUBSCRIPTIONS", "SCHEME", "ResourceAddress", "Subscriptions", "parse_uri",
           "register_resources", "resource_uri"]

log = logging.getLogger("blackboard.apps.mcp")

SCHEME = "blackboard://"
#: Most ``resources/subscribe`` subscriptions one server keeps (the oldest is dropped past it).
MAX_LEGACY_SUBSCRIPTIONS = 256
#: Most entries a section resource lists.
SECTION_LIMIT = 500
#: Most URIs one ``subscriptions/listen`` stream may watch.
MAX_LISTEN_URIS = 64


@dataclass(frozen=True, slots=True)
class ResourceAddress:
    """What a resource URI names: a board, a section, or one entry."""

    board: str
    section: str | None = None
    key: str | None = None


def resource_uri(board: str, section: str | None = None, key: str | None = None) -> str:
    """The URI of a board, a section or an entry."""
    parts = [board] + ([section] if section is not None else []) + ([key] if key is not None else [])
    return SCHEME + "/".join(quote(p, safe="") for p in parts)


def parse_uri(uri: str) -> ResourceAddress:
    """The address a ``blackboard://`` URI names.

    Raises:
        InvalidKeyError: not a blackboard URI, or an invalid board, section or key.
    """
    if not uri.startswith(SCHEME):
        raise InvalidKeyError(uri, f"not a blackboard resource URI ({SCHEME}board[/section[/key]])")
    parts = uri[len(SCHEME):].split("/")
    if not 1 <= len(parts) <= 3 or any(not p for p in parts):
        raise InvalidKeyError(uri, f"a blackboard resource URI is {SCHEME}board[/section[/key]]")
    board = validate_name(unquote(parts[0]), "board")
    section = validate_name(unquote(parts[1]), "section") if len(parts) > 1 else None
    key = unquote(parts[2]) if len(parts) > 2 else None
    return ResourceAddress(board, section, key)


def register_resources(server: BlackboardMCP, source: AgentSource) -> None:
    """Register the board, section and entry resource templates on ``server``."""

    async def agent_of(ctx: Context[Any, Any]) -> Agent:
        try:
            return await source.agent_for(ctx.request_context)
        except BlackboardError as exc:
            raise ResourceError(f"{type(exc).__name__}: {exc}") from exc

    @server.resource(SCHEME + "{board}", name="board", mime_type="application/json",
                     description="A board: its sections. e.g. blackboard://project-x")
    async def board_resource(board: str, ctx: Context[Any, Any]) -> str:
        agent = await agent_of(ctx)
        with _resource_errors():
            sections = await agent.board(board).sections()
        return dumps({"board": board, "sections": sections,
                      "resources": [resource_uri(board, s) for s in sections]})

    @server.resource(SCHEME + "{board}/{section}", name="section", mime_type="application/json",
                     description="A section of a board: its live entries, sorted by key. "
                                 "e.g. blackboard://project-x/tasks")
    async def section_resource(board: str, section: str, ctx: Context[Any, Any]) -> str:
        agent = await agent_of(ctx)
        with _resource_errors():
            entries = await list_entries(agent, board, section, None)
        shown = entries[:SECTION_LIMIT]
        return dumps({"board": board, "section": section, "truncated": len(entries) > len(shown),
                      "entries": [entry_out(e).model_dump(mode="json") for e in shown]})

    @server.resource(SCHEME + "{board}/{section}/{key}", name="entry", mime_type="application/json",
                     description="One board entry (value, revision, author, tags, metadata). "
                                 "e.g. blackboard://project-x/tasks/t1")
    async def entry_resource(board: str, section: str, key: str, ctx: Context[Any, Any]) -> str:
        agent = await agent_of(ctx)
        with _resource_errors():
            entry = await agent.board(board).get(section, key)
        return dumps(entry_out(entry).model_dump(mode="json"))


@contextlib.contextmanager
def _resource_errors() -> Any:
    """A blackboard error as the SDK's resource error (a missing entry: not found)."""
    try:
        yield
    except NotFoundError as exc:
        raise ResourceNotFoundError(f"NotFoundError: {exc}") from exc
    except BlackboardError as exc:
        raise ResourceError(f"{type(exc).__name__}: {exc}") from exc


async def _watch(agent: Agent, address: ResourceAddress, changed: Callable[[], Awaitable[None]],
                 started: anyio.Event) -> None:
    """Call ``changed`` after every change under ``address`` (as ``agent``), until cancelled."""
    watch = agent.board(address.board).watch(address.section, address.key, start="new")
    async with watch:
        started.set()
        async for _change in watch:
            await changed()


class Subscriptions:
    """The resource subscriptions of one server: ``subscriptions/listen`` streams and
    ``resources/subscribe`` watches, each watching the board as the subscriber's identity."""

    def __init__(self, source: AgentSource) -> None:
        self.source = source
        #: (connection key, uri) -> the watch task of a ``resources/subscribe``.
        self.legacy: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def _agent(self, ctx: ServerRequestContext[Any, Any]) -> Agent:
        try:
            return await self.source.agent_for(ctx)
        except BlackboardError as exc:
            raise MCPError(INVALID_PARAMS, f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _addresses(uris: list[str]) -> dict[str, ResourceAddress]:
        out: dict[str, ResourceAddress] = {}
        for uri in uris:
            try:
                out[uri] = parse_uri(uri)
            except InvalidKeyError as exc:
                raise MCPError(INVALID_PARAMS, f"cannot subscribe to {uri!r}: {exc}") from exc
        return out

    async def _started(self, agent: Agent, address: ResourceAddress, uri: str,
                       changed: Callable[[], Awaitable[None]], tg: anyio.abc.TaskGroup) -> None:
        """Start the watch of one URI in ``tg`` and wait until it runs (errors: the subscription's)."""
        started = anyio.Event()
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await _watch(agent, address, changed, started)
            except BlackboardError as exc:
                if started.is_set():  # the watch broke later: end the stream (the client re-listens)
                    log.warning("listen stream: the watch of %s ended: %s", uri, exc)
                    raise
                failure.append(exc)
                started.set()

        tg.start_soon(run)
        await started.wait()
        if failure:
            raise MCPError(INVALID_PARAMS, f"cannot watch {uri}: {type(failure[0]).__name__}: {failure[0]}")

    # ---------------------------------------------------------------- 2026-07-28: subscriptions/listen
    async def listen(self, ctx: ServerRequestContext[Any, Any],
                     params: SubscriptionsListenRequestParams) -> SubscriptionsListenResult:
        """Serve one listen stream: its own event bus, fed by a watch per subscribed URI."""
        uris = list(params.notifications.resource_subscriptions or [])
        if len(uris) > MAX_LISTEN_URIS:
            raise MCPError(INVALID_PARAMS, f"at most {MAX_LISTEN_URIS} resource subscriptions per stream")
        addresses = self._addresses(uris)
        agent = await self._agent(ctx) if addresses else None
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus, max_subscriptions=1)
        async with anyio.create_task_group() as tg:
            for uri, address in addresses.items():
                assert agent is not None

                async def changed(uri: str = uri) -> None:
                    await bus.publish(ResourceUpdated(uri=uri))

                await self._started(agent, address, uri, changed, tg)
            try:
                result = await handler(ctx, params)
            finally:
                tg.cancel_scope.cancel()
        return result

    # ---------------------------------------------------------------- before 2026: resources/subscribe
    @staticmethod
    def _connection(ctx: ServerRequestContext[Any, Any]) -> str:
        """The key of the request's connection: its HTTP session id ('' over stdio, one connection)."""
        headers = getattr(ctx.request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        return str(session or "")

    async def subscribe(self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams) -> EmptyResult:
        """Watch ``params.uri`` for this connection; changes are sent on its standalone channel."""
        uri = str(params.uri)
        address = self._addresses([uri])[uri]
        agent = await self._agent(ctx)
        key = (self._connection(ctx), uri)
        if key in self.legacy and not self.legacy[key].done():
            return EmptyResult()
        session: ServerSession = ctx.session

        async def changed() -> None:
            await session.send_resource_updated(uri)

        ready = anyio.Event()
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await _watch(agent, address, changed, ready)
            except BlackboardError as exc:
                if ready.is_set():  # the watch broke later: the client may subscribe again
                    log.warning("resources/subscribe: the watch of %s ended: %s", uri, exc)
                failure.append(exc)
            finally:
                ready.set()

        task = asyncio.create_task(run(), name=f"mcp subscription {uri}")
        await ready.wait()
        if failure:
            raise MCPError(INVALID_PARAMS, f"cannot watch {uri}: {type(failure[0]).__name__}: {failure[0]}")
        self.legacy[key] = task
        while len(self.legacy) > MAX_LEGACY_SUBSCRIPTIONS:
            oldest = next(iter(self.legacy))
            self.legacy.pop(oldest).cancel()
        return EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any],
                          params: UnsubscribeRequestParams) -> EmptyResult:
        """Stop this connection's watch of ``params.uri`` (none: nothing to do)."""
        task = self.legacy.pop((self._connection(ctx), str(params.uri)), None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return EmptyResult()

    async def close(self) -> None:
        """Stop every ``resources/subscribe`` watch."""
        tasks = list(self.legacy.values())
        self.legacy.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
