"""The MCP server's resources: boards, sections and entries as JSON, and subscriptions whose
updates come from board watches, through the ``mcp`` package's own clients (in process, and
over stdio and HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.session import IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agents_sdk import Agent
from blackboard.apps.mcp import SingleAgent, create_server
from blackboard.apps.mcp.http import HttpServer
from blackboard.apps.mcp.resources import parse_uri, resource_uri
from blackboard.protocol.errors import InvalidKeyError
from blackboard.settings import Settings
from tests.apps.mcp.conftest import REPO, held, settings_env

#: resources/subscribe is what hosts before 2026-07-28 use; the SDK's client marks it deprecated.
pytestmark = [pytest.mark.asyncio, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

WAIT = 10.0


def _json(result: types.ReadResourceResult) -> Any:
    (content,) = result.contents
    assert isinstance(content, types.TextResourceContents)
    assert content.mime_type == "application/json"
    return json.loads(content.text)


async def test_uris_round_trip() -> None:
    assert resource_uri("b", "s", "a key/with?odd#chars") == "blackboard://b/s/a%20key%2Fwith%3Fodd%23chars"
    address = parse_uri(resource_uri("b", "s", "a key/with?odd#chars"))
    assert (address.board, address.section, address.key) == ("b", "s", "a key/with?odd#chars")
    assert parse_uri("blackboard://b").section is None
    for bad in ("file:///etc/passwd", "blackboard://", "blackboard://b//k", "blackboard://b/s/k/x",
                "blackboard://bad%20board"):
        with pytest.raises(InvalidKeyError):
            parse_uri(bad)


async def test_boards_sections_and_entries_read_as_json(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"agent-{unique}", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("tasks", "t1", {"title": "write docs"}, tags=["docs"])
        await board.put("tasks", "odd key/1", 42)
        await board.put("notes", "n1", "hello")
        async with Client(create_server(SingleAgent(agent), settings)) as client:
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"blackboard://{board}", "blackboard://{board}/{section}",
                                 "blackboard://{board}/{section}/{key}"}

            top = _json(await client.read_resource(resource_uri(unique)))
            assert top["sections"] == ["notes", "tasks"]
            assert top["resources"] == [resource_uri(unique, "notes"), resource_uri(unique, "tasks")]

            section = _json(await client.read_resource(resource_uri(unique, "tasks")))
            assert [(e["key"], e["value"]) for e in section["entries"]] == [("odd key/1", 42),
                                                                             ("t1", {"title": "write docs"})]
            assert section["truncated"] is False

            entry = _json(await client.read_resource(resource_uri(unique, "tasks", "odd key/1")))
            assert (entry["value"], entry["author"], entry["verdict"]) == (42, agent.id, "verified")
            entry = _json(await client.read_resource(resource_uri(unique, "tasks", "t1")))
            assert entry["tags"] == ["docs"] and entry["revision"] >= 1

            with pytest.raises(MCPError, match="NotFoundError"):
                await client.read_resource(resource_uri(unique, "tasks", "missing"))
            with pytest.raises(MCPError, match="InvalidKeyError"):
                await client.read_resource("blackboard://bad%20board/tasks")


async def test_a_refused_read_is_a_resource_error(settings: Settings, unique: str) -> None:
    async with (Agent.connect(f"agent-{unique}", settings=settings) as writer,
                Agent.connect(f"outsider-{unique}", settings=settings) as outsider):
        await writer.board(unique).put("tasks", "t1", 1)
        async with Client(create_server(SingleAgent(outsider), settings)) as client:
            with pytest.raises(MCPError, match=r"PermissionDenied|permission"):
                await client.read_resource(resource_uri(unique, "tasks", "t1"))


async def _next_event(sub: Any) -> Any:
    with anyio.fail_after(WAIT):
        return await sub.__anext__()


async def test_listen_stream_reports_writes_of_another_agent(settings: Settings, unique: str) -> None:
    """2026-07-28 clients: a ``subscriptions/listen`` stream on an entry and a section."""
    async with (Agent.connect(f"agent-{unique}", settings=settings) as me,
                Agent.connect(f"other-{unique}", settings=settings) as other):
        server = create_server(SingleAgent(me), settings)
        entry, section = resource_uri(unique, "tasks", "t1"), resource_uri(unique, "notes")
        async with Client(server) as client:
            assert client.protocol_version == "2026-07-28"
            async with client.listen(resource_subscriptions=[entry, section]) as sub:
                await other.board(unique).put("tasks", "t1", {"v": 1})
                event = await _next_event(sub)
                assert event.uri == entry
                assert _json(await client.read_resource(entry))["value"] == {"v": 1}
                await other.board(unique).put("tasks", "t2", "not watched")
                await other.board(unique).put("notes", "n1", "x")
                event = await _next_event(sub)
                assert event.uri == section  # not t2: nobody subscribed to it
            with pytest.raises(MCPError, match="cannot subscribe"):
                async with client.listen(resource_subscriptions=["file:///etc/passwd"]):
                    pass


@contextlib.asynccontextmanager
async def _legacy_client(settings: Settings, agent: Agent,
                         updates: asyncio.Queue[str]) -> AsyncIterator[Client]:
    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.put_nowait(str(message.params.uri))

    async with Client(create_server(SingleAgent(agent), settings), mode="legacy",
                      message_handler=on_message) as client:
        yield client


async def _updated(updates: asyncio.Queue[str]) -> str:
    return await asyncio.wait_for(updates.get(), WAIT)


async def test_resources_subscribe_reports_writes_until_unsubscribed(settings: Settings, unique: str) -> None:
    """Clients before 2026-07-28: ``resources/subscribe`` and ``notifications/resources/updated``."""
    updates: asyncio.Queue[str] = asyncio.Queue()
    async with (Agent.connect(f"agent-{unique}", settings=settings) as me,
                Agent.connect(f"other-{unique}", settings=settings) as other,
                _legacy_client(settings, me, updates) as client):
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe is True
        whole = resource_uri(unique)
        await client.session.subscribe_resource(whole)
        await client.session.subscribe_resource(whole)  # twice: one watch
        await other.board(unique).put("tasks", "t1", 1)
        assert await _updated(updates) == whole
        await client.session.unsubscribe_resource(whole)
        await other.board(unique).put("tasks", "t1", 2)
        await asyncio.sleep(0.5)
        assert updates.empty()
        with pytest.raises(MCPError, match="cannot subscribe"):
            await client.session.subscribe_resource("blackboard://a/b/c/d")


async def test_an_outsider_cannot_subscribe(settings: Settings, unique: str) -> None:
    updates: asyncio.Queue[str] = asyncio.Queue()
    async with (Agent.connect(f"outsider-{unique}", settings=settings) as outsider,
                _legacy_client(settings, outsider, updates) as client):
        with pytest.raises(MCPError, match="cannot watch"):
            await client.session.subscribe_resource(resource_uri(unique, "tasks"))


# --------------------------------------------------------------------- over stdio and HTTP


@contextlib.asynccontextmanager
async def _transport_session(transport: str, settings: Settings, agent_id: str, http: HttpServer | None,
                             updates: asyncio.Queue[str], errlog: Path) -> AsyncIterator[ClientSession]:
    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.put_nowait(str(message.params.uri))

    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            params = StdioServerParameters(command=sys.executable,
                                           args=["-m", "blackboard", "mcp", "--stdio", "--as", agent_id],
                                           env=settings_env(settings), cwd=str(REPO))
            err = stack.enter_context(errlog.open("a", encoding="utf-8"))
            read, write = await stack.enter_async_context(stdio_client(params, errlog=err))
        else:
            assert http is not None
            token, _ = http.tokens.add(agent_id)
            client = await stack.enter_async_context(
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)))
            read, write = await stack.enter_async_context(streamable_http_client(http.url, http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write, message_handler=on_message))
        await session.initialize()
        yield session


@pytest.fixture
def http_server(mcp_transport: str, request: pytest.FixtureRequest) -> HttpServer | None:
    """The HTTP server when the test runs over HTTP."""
    if mcp_transport != "http":
        return None
    server: HttpServer = request.getfixturevalue("mcp_http")
    return server


async def test_subscription_over_each_transport(mcp_transport: str, settings: Settings, unique: str,
                                                mcp_errlog: Path, http_server: HttpServer | None) -> None:
    http = http_server
    updates: asyncio.Queue[str] = asyncio.Queue()
    uri = resource_uri(unique, "tasks", "t1")
    async with (Agent.connect(f"other-{unique}", settings=settings) as other,
                held(lambda: _transport_session(mcp_transport, settings, f"agent-{unique}", http, updates,
                                                mcp_errlog)) as session):
        await session.subscribe_resource(uri)
        await other.board(unique).put("tasks", "t1", {"done": True})
        assert await _updated(updates) == uri
        read = await session.read_resource(uri)
        assert _json(read)["value"] == {"done": True}


@contextlib.asynccontextmanager
async def _modern_client(transport: str, settings: Settings, agent_id: str,
                         http: HttpServer | None) -> AsyncIterator[Client]:
    """A 2026-07-28 ``mcp.Client`` (the SDK's default negotiation) over ``transport``."""
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "blackboard", "mcp", "--stdio", "--as", agent_id],
                                       env=settings_env(settings), cwd=str(REPO))
        async with Client(params) as client:
            yield client
        return
    assert http is not None
    token, _ = http.tokens.add(agent_id)
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx2.Timeout(30, read=300)) as http_client,
                Client(streamable_http_client(http.url, http_client=http_client)) as client):
        yield client


async def test_listen_stream_over_each_transport(mcp_transport: str, settings: Settings, unique: str,
                                                 http_server: HttpServer | None) -> None:
    uri = resource_uri(unique, "tasks")
    async with (Agent.connect(f"other-{unique}", settings=settings) as other,
                _modern_client(mcp_transport, settings, f"agent-{unique}", http_server) as client):
        assert client.protocol_version == "2026-07-28"
        async with client.listen(resource_subscriptions=[uri]) as sub:
            await other.board(unique).put("tasks", "t1", {"done": True})
            assert (await _next_event(sub)).uri == uri
        assert _json(await client.read_resource(uri))["entries"][0]["value"] == {"done": True}
