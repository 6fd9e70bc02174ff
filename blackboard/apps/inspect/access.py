"""What the inspector's identity may read: the boards it lists, and the check every board
route makes before it reads (403 for any other board).

The list is the SDK's (``agent.boards()``: with a credential, the boards the system service
says this identity may read; on an open bus, every board). It is kept for a short time
(:data:`BOARDS_TTL`) so that a page polling several routes costs one listing; a board not
in the kept list is looked up once more before it is refused, so a board that got its first
key a moment ago is not refused. The refusal does not tell a board that does not exist from
one the identity may not read. NATS enforces the identity's permissions on every read the
inspector makes anyway: this check only answers early and alike.
"""

from __future__ import annotations

import asyncio
import time

from agents_sdk import Agent
from blackboard.protocol.errors import PermissionDeniedError
from blackboard.protocol.subjects import validate_name

__all__ = ["BOARDS_TTL", "BoardAccess"]

#: Seconds a listing of the readable boards is kept.
BOARDS_TTL = 2.0


class BoardAccess:
    """The boards ``agent`` may read, listed through the SDK and kept :data:`BOARDS_TTL` s."""

    def __init__(self, agent: Agent, *, ttl: float = BOARDS_TTL) -> None:
        self.agent = agent
        self.ttl = ttl
        self._boards: list[str] = []
        self._at = -1e18
        self._lock = asyncio.Lock()

    async def boards(self, *, fresh: bool = False) -> list[str]:
        """The readable boards (that hold a live key), sorted.

        Raises:
            SearchError: with a credential, no worker answered the listing.
        """
        async with self._lock:
            if fresh or time.monotonic() - self._at > self.ttl:
                self._boards = await self.agent.boards()
                self._at = time.monotonic()
            return list(self._boards)

    async def check(self, board: str) -> str:
        """``board``, if this identity may read it.

        Raises:
            InvalidKeyError: not a valid board name.
            PermissionDeniedError: not among the boards it may read (or no such board).
            SearchError: the listing failed.
        """
        validate_name(board, "board")
        if board in await self.boards():
            return board
        if board in await self.boards(fresh=True):
            return board
        raise PermissionDeniedError(f"agent {self.agent.id!r} may not read board {board!r} (or it holds no entry)")
