"""``run_stdio``: serve the MCP server over stdin/stdout as one agent identity."""

from __future__ import annotations

from agents_sdk import Agent
from blackboard.apps.mcp.server import SingleAgent, create_server
from blackboard.settings import Settings

__all__ = ["run_stdio"]


async def run_stdio(settings: Settings, agent_id: str) -> None:
    """Connect agent ``agent_id`` and serve MCP over stdin/stdout until the host closes stdin.

    Every tool call acts as ``agent_id`` (its credential is found as
    :meth:`Agent.connect` finds it). Nothing but MCP messages is written to stdout.

    Raises:
        AuthenticationError, NotConnectedError, ConfigurationError, InvalidKeyError:
            the agent could not connect (before anything is served).
    """
    async with Agent.connect(agent_id, settings=settings) as agent:
        server = create_server(SingleAgent(agent), settings)
        await server.run_stdio_async()
