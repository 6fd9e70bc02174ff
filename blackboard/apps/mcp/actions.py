"""The agent's memory actions as MCP tools: ``memory_write``, ``memory_read``,
``memory_search``, ``memory_summarize`` and ``memory_prune``.

The same actions as ``agent.memory.tools()`` / ``agent.memory.call()`` in the SDK
(:mod:`agents_sdk.memory.actions`): same names, the same argument models (their JSON
Schema is the tool's input schema, unknown fields refused) and the same results: the
structured content is the :class:`~agents_sdk.memory.actions.ActionResult` (``ok``,
``name``, ``content``, ``data``, ``error``), the text its ``content``, and a result with
``ok=False`` is a tool error. Each call acts on ``agent.memory`` of the request's identity,
with that identity's rights (its short-term and working layers live in this server's
process, one set per agent).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from agents_sdk.memory.actions import (
    ACTION_NAMES,
    ActionResult,
    action_description,
    action_schema,
    call_action,
)
from blackboard.apps.mcp.results import error_result, log
from blackboard.protocol.errors import BlackboardError

if TYPE_CHECKING:
    from blackboard.apps.mcp.server import AgentSource, BlackboardMCP

__all__ = ["ActionOut", "action_tool_result", "register_memory_actions", "run_memory_action"]

_TITLES = {"memory_write": "Write to your memory", "memory_read": "Read one memory",
           "memory_search": "Search your memory across layers", "memory_summarize": "Summarize memories",
           "memory_prune": "Prune stale memories"}
_ANNOTATIONS = {
    "memory_write": ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    "memory_read": ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    "memory_search": ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    "memory_summarize": ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    "memory_prune": ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
}


class ActionOut(BaseModel):
    """A memory action's result (``ActionResult`` as JSON)."""

    ok: bool = Field(description="The action ran.")
    name: str = Field(description="The tool called.")
    content: str = Field(description="The result in words (or 'error: ...').")
    data: dict[str, Any] | None = Field(default=None, description="The result as JSON (null on failure).")
    error: str | None = Field(default=None, description="What went wrong (null when ok).")


def action_tool_result(result: ActionResult) -> CallToolResult:
    """The MCP tool result of ``result``: its content as text, itself as structured content,
    a tool error when not ``ok``."""
    return CallToolResult(content=[TextContent(type="text", text=result.content)],
                          structured_content=result.as_dict(), is_error=not result.ok)


async def run_memory_action(source: AgentSource, request: ServerRequestContext[Any, Any], name: str,
                            arguments: dict[str, Any]) -> CallToolResult:
    """Run the memory action ``name`` with the raw ``arguments`` as the request's agent.

    An identity the source refuses is a tool error (as for every tool)."""
    try:
        agent = await source.agent_for(request)
    except BlackboardError as exc:
        log.info("tool %s: %s: %s", name, type(exc).__name__, exc)
        return error_result(exc)
    result = await call_action(agent.memory, {"name": name, "arguments": arguments})
    if not result.ok:
        log.info("tool %s: %s", name, result.error)
    return action_tool_result(result)


def register_memory_actions(server: BlackboardMCP, source: AgentSource) -> None:
    """Register the memory actions on ``server`` with their argument models' schemas.

    ``BlackboardMCP.call_tool`` hands their calls, with the raw arguments, to
    :func:`run_memory_action` (the SDK's models validate them, refusing unknown fields); the
    registered function serves a call that bypasses it, as one without arguments."""
    for name in ACTION_NAMES:
        server.add_tool(_bypass(source, name), name=name, title=_TITLES[name], annotations=_ANNOTATIONS[name],
                        description=action_description(name))
        tool = server._tool_manager.get_tool(name)
        assert tool is not None
        tool.parameters = action_schema(name)


def _bypass(source: AgentSource, name: str) -> Any:
    async def action(ctx: Context[Any, Any]) -> Annotated[CallToolResult, ActionOut]:
        return await run_memory_action(source, ctx.request_context, name, {})

    action.__name__ = name
    return action
