"""The MCP server object: ``create_server(source, settings)``.

Contract (used by the HTTP transport and the ``blackboard mcp`` command):

- :class:`AgentSource`: how a tool gets the :class:`agents_sdk.Agent` of the
  request's identity, from the request's low-level context
  (``mcp.server.context.ServerRequestContext``: ``ctx.request`` is the
  Starlette request over HTTP, None over stdio).
- :class:`SingleAgent`: the source of a one-identity server (stdio).
- :func:`create_server`: the server (a :class:`BlackboardMCP`, an ``MCPServer``
  of the official SDK) with every tool and resource registered.
"""

from __future__ import annotations

from typing import Any, Protocol

from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer

from agents_sdk import Agent
from blackboard.settings import Settings

__all__ = ["AgentSource", "BlackboardMCP", "SingleAgent", "create_server"]


class AgentSource(Protocol):
    """Gives the agent a request acts as. Implementations: :class:`SingleAgent` (stdio) and
    the HTTP transport's per-token source."""

    async def agent_for(self, ctx: ServerRequestContext[Any, Any]) -> Agent:
        """The connected agent of the identity that made this request.

        Raises:
            PermissionDeniedError (or any ``BlackboardError``): no identity for this
                request; the caller answers it as a tool error, never a fallback identity.
        """
        ...


class SingleAgent:
    """An :class:`AgentSource` that always answers the same connected agent (stdio)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def agent_for(self, ctx: ServerRequestContext[Any, Any]) -> Agent:
        """This source's agent, whatever the request."""
        return self.agent


class BlackboardMCP(MCPServer[Any]):
    """The blackboard MCP server (an ``MCPServer``); build it with :func:`create_server`."""

    def __init__(self, source: AgentSource, settings: Settings, *, name: str = "blackboard",
                 token_verifier: TokenVerifier | None = None, auth: AuthSettings | None = None) -> None:
        super().__init__(name, token_verifier=token_verifier, auth=auth)
        self.source = source
        self.blackboard_settings = settings


def create_server(source: AgentSource, settings: Settings, *, name: str = "blackboard",
                  token_verifier: TokenVerifier | None = None, auth: AuthSettings | None = None) -> BlackboardMCP:
    """The MCP server with the blackboard's tools and resources, each call acting as
    ``await source.agent_for(request context)``.

    Serve it with ``await server.run_stdio_async()`` (see :func:`run_stdio`) or
    ``server.streamable_http_app(...)``; ``token_verifier``/``auth`` are passed to
    ``MCPServer`` for the SDK's own bearer-token checks (optional).
    """
    return BlackboardMCP(source, settings, name=name, token_verifier=token_verifier, auth=auth)
