"""MCP clients of the blackboard's MCP server, over both transports, against the real servers.

* ``mcp_connect`` (parametrized ``stdio`` / ``http``): ``async with mcp_connect(agent_id) as
  session`` gives an initialized ``mcp.ClientSession`` acting as ``agent_id``: over stdio a
  ``python -m blackboard mcp --stdio --as agent_id`` process with the test settings in its
  environment; over HTTP a client of the test's in-process HTTP server (``mcp_http``) with a
  bearer token made for ``agent_id``.
* ``mcp_session``: one such session as ``mcp_agent_id`` (``agent-<unique>``).
* ``mcp_stdio`` / ``mcp_http_connect``: one transport only; ``mcp_http``: the running HTTP server
  (``.url``, ``.tokens`` (the token file), ``.agents``).

Tool tests parametrize over both transports by taking ``mcp_connect`` or ``mcp_session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import pytest_asyncio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from blackboard.apps.mcp.http import HttpServer, running_http
from blackboard.apps.mcp.tokens import TokenFile
from blackboard.settings import Settings

#: ``async with connect(agent_id) as session``: an initialized ClientSession acting as agent_id.
McpConnect = Callable[[str], contextlib.AbstractAsyncContextManager[ClientSession]]

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[3]


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``BLACKBOARD_*`` environment of a process that should use ``settings``' servers and
    identities (the test authority issues the agent's credential on first use)."""
    env = {"BLACKBOARD_NATS__URL": settings.nats.url,
           "BLACKBOARD_NATS__WRITE_TIMEOUT": str(settings.nats.write_timeout)}
    if settings.nats.tls_ca_file:
        env["BLACKBOARD_NATS__TLS_CA_FILE"] = str(settings.nats.tls_ca_file)
    if settings.security.authority_dir:
        env["BLACKBOARD_SECURITY__AUTHORITY_DIR"] = str(settings.security.authority_dir)
    if settings.security.policy_file:
        env["BLACKBOARD_SECURITY__POLICY_FILE"] = str(settings.security.policy_file)
    if settings.nats.insecure_open_bus:
        env["BLACKBOARD_NATS__INSECURE_OPEN_BUS"] = "true"
    if settings.postgres.dsn.get_secret_value():
        env["BLACKBOARD_POSTGRES__DSN"] = settings.postgres.dsn.get_secret_value()
    return env


def blackboard_env(settings: Settings) -> dict[str, str]:
    """The whole environment of a ``blackboard`` subprocess: this one's without any
    ``BLACKBOARD_*`` setting, plus :func:`settings_env`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | settings_env(settings)


@contextlib.asynccontextmanager
async def held(enter: Callable[[], contextlib.AbstractAsyncContextManager[T]],
               timeout: float = 60) -> AsyncIterator[T]:
    """``enter()`` entered and exited in a task of its own: the MCP clients are anyio task groups,
    which must be left by the task that entered them, while pytest-asyncio sets a fixture up
    and tears it down in different tasks."""
    value: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    leave = asyncio.Event()

    async def hold() -> None:
        try:
            async with enter() as entered:
                value.set_result(entered)
                await leave.wait()
        except BaseException as exc:
            if not value.done():
                value.set_exception(exc)
                return
            raise

    task = asyncio.create_task(hold())
    try:
        yield await asyncio.wait_for(asyncio.shield(value), timeout)
    finally:
        leave.set()
        await task


@contextlib.asynccontextmanager
async def _initialized(streams: Any) -> AsyncIterator[ClientSession]:
    read, write = streams
    async with ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def stdio_process_session(params: StdioServerParameters, errlog: Path) -> AsyncIterator[ClientSession]:
    """A session with the server process ``params`` starts (its stderr appended to ``errlog``)."""
    with errlog.open("a", encoding="utf-8") as err:
        async with stdio_client(params, errlog=err) as streams, _initialized(streams) as session:
            yield session


def stdio_session(settings: Settings, agent_id: str, errlog: Path) -> contextlib.AbstractAsyncContextManager[ClientSession]:
    """A session with ``blackboard mcp --stdio --as agent_id`` (a subprocess; its stderr to ``errlog``)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "blackboard", "mcp", "--stdio", "--as", agent_id],
                                   env=settings_env(settings), cwd=str(REPO))
    return stdio_process_session(params, errlog)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None, *, headers: dict[str, str] | None = None,
                       ) -> AsyncIterator[ClientSession]:
    """A session with the HTTP server at ``url``, sending ``token`` (None: no Authorization
    header) or the given ``headers``."""
    if headers is None:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client,
                streamable_http_client(url, http_client=client) as streams,
                _initialized(streams) as session):
        yield session


@pytest.fixture
def mcp_errlog() -> Iterator[Path]:
    """The stderr of the test's stdio servers; printed when the test fails (pytest shows it)."""
    fd, name = tempfile.mkstemp(prefix="bb-mcp-", suffix=".log")
    os.close(fd)
    path = Path(name)
    yield path
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.strip():
        print(f"--- stderr of the stdio MCP servers ({path}) ---\n{text[-4000:]}")
    path.unlink(missing_ok=True)


@pytest.fixture
def mcp_stdio(settings: Settings, mcp_errlog: Path) -> McpConnect:
    """``async with mcp_stdio(agent_id) as session``: a stdio server process acting as agent_id."""

    def connect(agent_id: str) -> contextlib.AbstractAsyncContextManager[ClientSession]:
        return held(lambda: stdio_session(settings, agent_id, mcp_errlog))

    return connect


@pytest_asyncio.fixture
async def mcp_http(settings: Settings, tmp_path: Path) -> AsyncIterator[HttpServer]:
    """The MCP server over HTTP, in process on a free port of 127.0.0.1, with an empty token file
    (``mcp_http_connect`` adds tokens)."""
    tokens = tmp_path / "mcp-tokens.json"
    TokenFile(tokens).ensure()
    async with running_http(settings, tokens=tokens, port=0) as server:
        yield server


@pytest.fixture
def mcp_http_connect(mcp_http: HttpServer) -> McpConnect:
    """``async with mcp_http_connect(agent_id) as session``: an HTTP client with a new token of agent_id."""

    def connect(agent_id: str) -> contextlib.AbstractAsyncContextManager[ClientSession]:
        token, _ = mcp_http.tokens.add(agent_id)
        return held(lambda: http_session(mcp_http.url, token))

    return connect


@pytest.fixture(params=["stdio", "http"])
def mcp_transport(request: pytest.FixtureRequest) -> str:
    """The transport a parametrized MCP test runs over."""
    return str(request.param)


@pytest.fixture
def mcp_connect(mcp_transport: str, request: pytest.FixtureRequest) -> McpConnect:
    """``async with mcp_connect(agent_id) as session`` over the test's transport (both, parametrized)."""
    name = "mcp_stdio" if mcp_transport == "stdio" else "mcp_http_connect"
    connect: McpConnect = request.getfixturevalue(name)
    return connect


@pytest.fixture
def mcp_agent_id(unique: str) -> str:
    """The identity ``mcp_session`` acts as (a member of every board under the test policy)."""
    return f"agent-{unique}"


@pytest_asyncio.fixture
async def mcp_session(mcp_connect: McpConnect, mcp_agent_id: str) -> AsyncIterator[ClientSession]:
    """An initialized session acting as ``mcp_agent_id``, over each transport."""
    async with mcp_connect(mcp_agent_id) as session:
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """Call ``tool``; its structured result (asserting it is not a tool error)."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}{arguments} failed: {result.content}"
    return result.structured_content


CallTool = Callable[..., Awaitable[Any]]
