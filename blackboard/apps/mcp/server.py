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

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resources import ResourceSecurity
from mcp.types import (
    CallToolResult,
    InputRequiredResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    TextContent,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from agents_sdk import Agent
from agents_sdk.memory.actions import ACTION_NAMES
from blackboard.apps.mcp.actions import register_memory_actions, run_memory_action
from blackboard.apps.mcp.resources import Subscriptions, register_resources
from blackboard.apps.mcp.results import validation_message
from blackboard.apps.mcp.tools import register_tools
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


INSTRUCTIONS = """\
A shared blackboard for agents. You act as one agent identity; what you may read and write is
that identity's permissions. Boards hold entries addressed board/section/key, each a JSON value with a
revision. Read with board_get / board_entries / board_search; write with board_put, or safely with
board_update(expected_revision=<the revision you read>) - a ConflictError tells the current revision:
read again and retry. Coordinate with task_claim / task_release, messages (message_send, inbox_read then
inbox_ack, message_reply) and votes (vote_propose, vote_cast, vote_outcome). Long-term memory:
memory_remember and memory_recall; your own layered memory (this episode's steps, working notes by key,
your long-term memory, the boards you joined): memory_write, memory_read, memory_search, memory_summarize,
memory_prune (your own memories; others' only with admin rights on the board). Resources:
blackboard://{board}, blackboard://{board}/{section}, blackboard://{board}/{section}/{key} (JSON; subscribe
to be told of changes)."""


class BlackboardMCP(MCPServer[Any]):
    """The blackboard MCP server (an ``MCPServer``); build it with :func:`create_server`."""

    def __init__(self, source: AgentSource, settings: Settings, *, name: str = "blackboard",
                 token_verifier: TokenVerifier | None = None, auth: AuthSettings | None = None) -> None:
        # Resource parameters are board names and keys, never file paths: no path checks on them.
        security = ResourceSecurity(reject_path_traversal=False, reject_absolute_paths=False)
        super().__init__(name, instructions=INSTRUCTIONS, version=_version(), token_verifier=token_verifier,
                         auth=auth, resource_security=security, lifespan=_lifespan)
        self.source = source
        self.blackboard_settings = settings
        self.subscriptions = Subscriptions(source)
        register_tools(self, source)
        register_memory_actions(self, source)
        register_resources(self, source)
        # Resource subscriptions: served here (each a watch as the subscriber's identity)
        # for both eras, instead of the SDK's shared in-process bus.
        low = self._lowlevel_server
        low.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, self.subscriptions.listen)
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self.subscriptions.subscribe)
        low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self.subscriptions.unsubscribe)


    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> CallToolResult | InputRequiredResult:
        """Call a tool; arguments that do not fit its schema are a tool error naming each field.

        A memory action gets its raw arguments, validated by the SDK's argument model
        (``agents_sdk.memory.actions``), and answers its ``ActionResult``."""
        if name in ACTION_NAMES and context is not None:
            return await run_memory_action(self.source, context.request_context, name, arguments)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            text = f"invalid arguments for {name}: {validation_message(exc.__cause__)}"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True,
                                  structured_content={"error": "InvalidArguments", "message": text})


@asynccontextmanager
async def _lifespan(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
    """Stop the ``resources/subscribe`` watches when the server (over stdio: the connection) ends."""
    try:
        yield {}
    finally:
        if isinstance(server, BlackboardMCP):
            await server.subscriptions.close()


def _version() -> str:
    from blackboard import __version__
    return __version__


def create_server(source: AgentSource, settings: Settings, *, name: str = "blackboard",
                  token_verifier: TokenVerifier | None = None, auth: AuthSettings | None = None) -> BlackboardMCP:
    """The MCP server with the blackboard's tools and resources, each call acting as
    ``await source.agent_for(request context)``.

    Serve it with ``await server.run_stdio_async()`` (see :func:`run_stdio`) or
    ``server.streamable_http_app(...)``; ``token_verifier``/``auth`` are passed to
    ``MCPServer`` for the SDK's own bearer-token checks (optional).
    """
    return BlackboardMCP(source, settings, name=name, token_verifier=token_verifier, auth=auth)
