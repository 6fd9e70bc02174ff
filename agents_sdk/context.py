"""What the parts of one agent share: its id, settings, connection, board store and live views.

:class:`~agents_sdk.agent.Agent` builds one :class:`AgentContext` when it
connects and hands it down; the board handles, views, voting and long-term
memory depend on the context, never on ``Agent`` itself, so the SDK's modules
import downwards only::

    agent ──> board ──> view ──> context
      │         └─────> consensus, objects, search, messaging ──> context
      └─────> memory.longterm ──> context

No IO happens here: the NATS client is already connected, and the publisher
subscribes to its ack inbox on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from blackboard.client.board_store import BoardStore
from blackboard.client.publisher import Publisher
from blackboard.protocol.entries import Entry
from blackboard.settings import Settings

__all__ = ["AgentContext", "LiveView", "ViewRegistry"]


class LiveView(Protocol):
    """What the registry needs of a live view (:class:`agents_sdk.view.View` is one)."""

    def own_write(self, entry: Entry) -> None:
        """Apply an acknowledged write of this agent at once (read-your-own-writes)."""

    async def close(self) -> None:
        """Stop following changes."""


class ViewRegistry:
    """The open live views of one agent, by board.

    A view registers itself when it starts and leaves when it closes; the
    board handles report each acknowledged write here (:meth:`written`), so
    every view of that board shows it before the watch delivers it.
    """

    def __init__(self) -> None:
        self._by_board: dict[str, list[LiveView]] = {}

    def add(self, board: str, view: LiveView) -> None:
        views = self._by_board.setdefault(board, [])
        if view not in views:
            views.append(view)

    def discard(self, board: str, view: LiveView) -> None:
        views = self._by_board.get(board)
        if views and view in views:
            views.remove(view)
            if not views:
                del self._by_board[board]

    def watching(self, board: str) -> bool:
        """Whether some view of ``board`` is open (then a write is worth reporting)."""
        return bool(self._by_board.get(board))

    def written(self, entry: Entry) -> None:
        """Show an acknowledged write of this agent in the views of its board."""
        for view in list(self._by_board.get(entry.board, ())):
            view.own_write(entry)

    async def close_all(self) -> None:
        """Close every registered view."""
        for views in list(self._by_board.values()):
            for view in list(views):
                await view.close()


@dataclass(frozen=True, eq=False)
class AgentContext:
    """The state one agent's parts share. Built by ``Agent``; no IO.

    Attributes:
        agent_id: the agent's id, the author of every write.
        settings: the deployment's settings.
        nc: the agent's connected NATS client.
        js: a JetStream context on ``nc`` (request timeout from the settings).
        store: the board store (every board) on ``nc``.
        publisher: acknowledged JetStream publishing shared by the agent's
            long-term memory (its ack inbox is made on first use).
        views: the agent's open live views.
    """

    agent_id: str
    settings: Settings
    nc: NATS
    js: JetStreamContext
    store: BoardStore
    publisher: Publisher
    views: ViewRegistry = field(default_factory=ViewRegistry)

    @classmethod
    def build(cls, agent_id: str, nc: NATS, settings: Settings) -> AgentContext:
        """The context of agent ``agent_id`` on the connected client ``nc`` (the id is not validated here)."""
        js = nc.jetstream(timeout=settings.nats.request_timeout,
                          publish_async_max_pending=settings.nats.max_pending_writes)
        return cls(agent_id=agent_id, settings=settings, nc=nc, js=js, store=BoardStore(nc, settings),
                   publisher=Publisher(nc, js, settings.nats))
