"""The blackboard's MCP server: board, memory, messaging and voting tools and
board resources for MCP hosts (Claude Desktop, IDEs, agent frameworks).

Each MCP session acts as one agent identity: an :class:`AgentSource` gives the
tools the :class:`agents_sdk.Agent` of the request's identity (a
:class:`SingleAgent` over stdio; one agent per bearer token over HTTP), so
NATS enforces that identity's permissions on every call. See docs/mcp.md.
"""

from blackboard.apps.mcp.server import AgentSource, BlackboardMCP, SingleAgent, create_server
from blackboard.apps.mcp.stdio import run_stdio

__all__ = ["AgentSource", "BlackboardMCP", "SingleAgent", "create_server", "run_stdio"]
