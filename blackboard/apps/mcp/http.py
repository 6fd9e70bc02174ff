"""The MCP server over streamable HTTP: one agent identity per bearer token (docs/mcp.md).

Every HTTP request must carry ``Authorization: Bearer <token>`` with a token of the token file
(:mod:`blackboard.apps.mcp.tokens`); the token names the agent the request acts as, and the
tools run as that agent (:class:`TokenAgents`: one :class:`agents_sdk.Agent` per identity,
connected with that identity's own credential on its first request). No token, or one the file
does not hold (malformed, unknown, revoked), is answered 401 before the MCP layer sees the
request: there is no anonymous or fallback identity, so NATS enforces each identity's
permissions on every call, as for an agent of its own. A session is bound to the identity
that opened it (the SDK answers another identity's request for it 404).

Where it listens: 127.0.0.1 by default. A non-loopback address needs TLS (``tls_cert`` and
``tls_key``), since a bearer token sent in clear text on a network is an identity given away
(a reverse proxy on the same host reaches the loopback address, so it needs no exception);
binding there is logged as a warning. DNS-rebinding protection (the SDK's transport security:
the ``Host`` and ``Origin`` headers must name this server) is on for every address.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings

from agents_sdk import Agent
from blackboard.apps._serving import QuietServer, Started, listen
from blackboard.apps.mcp.server import create_server
from blackboard.apps.mcp.tokens import TokenFile
from blackboard.protocol.errors import AuthenticationError, BlackboardError, ConfigurationError
from blackboard.settings import Settings

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MCP_PATH",
    "FileTokenVerifier",
    "HttpServer",
    "TokenAgents",
    "identity_of",
    "is_loopback",
    "running_http",
    "serve_http",
]

log = logging.getLogger("blackboard.apps.mcp.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: The MCP endpoint's path.
MCP_PATH = "/mcp"


def identity_of(request: Any) -> str | None:
    """The agent id the bearer token of ``request`` (a Starlette request or connection, as the
    SDK hands tools in ``ctx.request``) authenticated, or None."""
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if isinstance(user, AuthenticatedUser):
        return user.access_token.client_id
    return None


class FileTokenVerifier:
    """The SDK's ``TokenVerifier`` over a :class:`~blackboard.apps.mcp.tokens.TokenFile`: a token
    the file holds becomes an ``AccessToken`` whose ``client_id`` (and ``subject``) is its
    agent id; any other token is refused (None: the SDK answers 401)."""

    def __init__(self, tokens: TokenFile) -> None:
        self.tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            agent_id = self.tokens.identify(token)
        except ConfigurationError as exc:  # the file became invalid while serving: refuse everyone
            log.error("refusing the request: %s", exc)
            return None
        if agent_id is None:
            log.info("refused a bearer token the token file does not hold")
            return None
        # `token` is not kept: the session's owner is (client_id, subject), the identity.
        return AccessToken(token="", client_id=agent_id, subject=agent_id, scopes=[])


class TokenAgents:
    """The HTTP transport's :class:`~blackboard.apps.mcp.server.AgentSource`: the agent of the
    identity the request's bearer token authenticated, one connected :class:`Agent` per
    identity, connected on its first request with that identity's credential
    (``Agent.connect(agent_id, settings=settings)``) and closed by :meth:`aclose`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._agents: dict[str, Agent] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    async def agent_for(self, ctx: ServerRequestContext[Any, Any]) -> Agent:
        """The connected agent of the request's identity.

        Raises:
            AuthenticationError: the request carries no authenticated identity (never served
                by a fallback identity).
            AuthenticationError, NotConnectedError, ConfigurationError: the identity's agent
                could not connect (no credential for it, the server refused it or is down).
        """
        agent_id = identity_of(ctx.request)
        if agent_id is None:
            raise AuthenticationError("this MCP request carries no authenticated identity")
        return await self.agent(agent_id)

    async def agent(self, agent_id: str) -> Agent:
        """The connected agent ``agent_id`` (connected now if it is not yet).

        Raises:
            ConfigurationError: closed already; as :meth:`Agent.connect` raises otherwise.
        """
        agent = self._agents.get(agent_id)
        if agent is not None:
            return agent
        lock = self._locks.setdefault(agent_id, asyncio.Lock())
        async with lock:
            if self._closed:
                raise ConfigurationError("the MCP server is shutting down")
            agent = self._agents.get(agent_id)
            if agent is None:
                agent = await Agent.connect(agent_id, settings=self.settings)
                self._agents[agent_id] = agent
                log.info("connected agent %r for its MCP clients", agent_id)
            return agent

    @property
    def connected(self) -> list[str]:
        """The identities connected so far."""
        return sorted(self._agents)

    async def aclose(self) -> None:
        """Close every connected agent (each even when another fails to)."""
        self._closed = True
        agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            try:
                await agent.close()
            except (BlackboardError, OSError) as exc:
                log.warning("closing agent %r: %s", agent.id, exc)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _security(host: str, scheme: str, allowed_hosts: Sequence[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection: the Host (and, when a browser sends one, Origin) header must
    name this server, any port."""
    names: list[str] = []
    if is_loopback(host):
        names += ["127.0.0.1", "localhost", "[::1]"]
    elif not _is_wildcard(host):
        names.append(f"[{host}]" if ":" in host else host)
    names += [name for name in allowed_hosts if name not in names]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in names] + names,
        allowed_origins=[f"{scheme}://{name}:*" for name in names] + [f"{scheme}://{name}" for name in names])


def _is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "[::]", "")


@dataclass(frozen=True)
class HttpServer:
    """A running HTTP MCP server: where clients reach it, and the identities' agents."""

    host: str
    port: int
    scheme: str
    agents: TokenAgents
    tokens: TokenFile

    @property
    def url(self) -> str:
        """The MCP endpoint (``http://127.0.0.1:8765/mcp``)."""
        return f"{_origin(self.scheme, self.host, self.port)}{MCP_PATH}"


def _origin(scheme: str, host: str, port: int) -> str:
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{host}:{port}"


def _check_options(host: str, tls_cert: Path | None, tls_key: Path | None,
                   allowed_hosts: Sequence[str]) -> str:
    """The scheme (http or https); refuses a non-loopback address without TLS.

    Raises:
        ConfigurationError: one TLS file without the other; a non-loopback address without
            TLS; a wildcard address without ``allowed_hosts``.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ConfigurationError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
    scheme = "https" if tls_cert is not None else "http"
    if not is_loopback(host):
        if scheme == "http":
            raise ConfigurationError(
                f"refusing to serve MCP on {host!r} without TLS: bearer tokens would cross the network "
                "in clear text. Give --tls-cert and --tls-key, or keep the default 127.0.0.1 "
                "(a reverse proxy on this host reaches it there)")
        if _is_wildcard(host) and not allowed_hosts:
            raise ConfigurationError(
                f"listening on every address ({host!r}): name the host names clients use with "
                "--allowed-host (DNS-rebinding protection checks the Host header against them)")
    return scheme


def _load_tokens(path: Path) -> TokenFile:
    """The token file, checked readable and valid.

    Raises:
        ConfigurationError: no such file, or it is invalid.
    """
    tokens = TokenFile(path)
    if not tokens.exists:
        raise ConfigurationError(
            f"no MCP token file at {path}: make one with `blackboard mcp token add AGENT --tokens {path}` "
            "(it prints the token a client sends as 'Authorization: Bearer <token>')")
    if not tokens.records():
        log.warning("the MCP token file %s holds no token: every request is refused until one is "
                    "added (`blackboard mcp token add AGENT`)", path)
    return tokens


@contextlib.asynccontextmanager
async def running_http(settings: Settings, *, tokens: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                       tls_cert: Path | None = None, tls_key: Path | None = None,
                       allowed_hosts: Sequence[str] = (), session_idle_timeout: float = 1800.0,
                       ) -> AsyncIterator[HttpServer]:
    """The MCP server on HTTP, listening and ready in the body of the ``async with`` (``port=0``:
    a free port, see :attr:`HttpServer.port`); stopped, and every agent closed, after it.

    Raises:
        ConfigurationError: the token file is missing or invalid; the address cannot be listened
            on; a non-loopback address without TLS (see the module doc); the server did not start.
    """
    token_file = _load_tokens(tokens)
    scheme = _check_options(host, tls_cert, tls_key, allowed_hosts)
    if not is_loopback(host):
        log.warning("SERVING MCP ON %s (not loopback), TLS on: any host that reaches this port may "
                    "try tokens; only bearers of a token of %s are served", host, tokens)
    sock = listen(host, port)
    bound_port = int(sock.getsockname()[1])
    agents = TokenAgents(settings)
    try:
        mcp = create_server(agents, settings, token_verifier=FileTokenVerifier(token_file),
                            auth=AuthSettings(issuer_url=_origin(scheme, host, bound_port),
                                              resource_server_url=None, required_scopes=[]))
        # One JSON response a request (about 1 ms less a call than an event stream, bench/mcp_bench.py);
        # subscription updates still stream: listen responses and the GET stream are always SSE.
        app = Started(mcp.streamable_http_app(
            streamable_http_path=MCP_PATH, host=host, session_idle_timeout=session_idle_timeout, json_response=True,
            transport_security=_security(host, scheme, allowed_hosts)))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                ssl_certfile=str(tls_cert) if tls_cert else None,
                                ssl_keyfile=str(tls_key) if tls_key else None)
        server = QuietServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        started = asyncio.create_task(app.done.wait())
        try:
            await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
            if app.failed is not None or task.done():
                raise ConfigurationError(f"the MCP HTTP server did not start: {app.failed or _ended(task)}")
            yield HttpServer(host, bound_port, scheme, agents, token_file)
        finally:
            started.cancel()
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await task
    finally:
        await agents.aclose()
        sock.close()


def _ended(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return f"{type(exc).__name__}: {exc}" if exc is not None else "it stopped"


async def serve_http(settings: Settings, *, tokens: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                     tls_cert: Path | None = None, tls_key: Path | None = None,
                     allowed_hosts: Sequence[str] = (), stop: asyncio.Event | None = None,
                     ready: asyncio.Event | None = None,
                     on_ready: Callable[[HttpServer], None] | None = None) -> None:
    """Serve MCP on HTTP (see :func:`running_http`) until ``stop`` is set (None: forever).
    ``ready`` is set, and ``on_ready(server)`` called, once it listens.

    Raises:
        ConfigurationError: as :func:`running_http`.
    """
    async with running_http(settings, tokens=tokens, host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                            allowed_hosts=allowed_hosts) as server:
        if on_ready is not None:
            on_ready(server)
        if ready is not None:
            ready.set()
        await (stop or asyncio.Event()).wait()
