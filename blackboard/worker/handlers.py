"""What the worker consumes: the table of stream handlers, one per stream.

Each stream's persistence (its decoder, its rows and its writer) lives in a
module of its own: :mod:`.entries` (the board's KV stream), :mod:`.memories`
(``BB_MEM``), :mod:`.messages` (``BB_MSG``) and :mod:`.votes` (``BB_VOTE``).
This module only assembles them. The table is the extension point: a stream
is added with a module holding a pure decoder (raising
``InvalidPayloadError`` for dead letters) and a writer that stores a batch of
decoded rows inside the transaction it is given (idempotent on the stream
sequence), and its :class:`~blackboard.worker.stream_handler.StreamHandler`
appended in :func:`default_handlers`.
"""

from __future__ import annotations

from blackboard.settings import Settings
from blackboard.worker.entries import entry_handler
from blackboard.worker.memories import memory_handler
from blackboard.worker.messages import message_handler
from blackboard.worker.stream_handler import StreamHandler
from blackboard.worker.votes import vote_handler

__all__ = ["StreamHandler", "default_handlers"]


def default_handlers(settings: Settings) -> list[StreamHandler]:
    """The streams every worker persists: board entries (KV), memories, agent messages and votes."""
    return [entry_handler(settings), memory_handler(settings), message_handler(settings), vote_handler(settings)]
