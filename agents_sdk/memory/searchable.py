"""Waiting until memories are searchable by every mode (``remember(..., wait="searchable")``).

``remember`` returns once JetStream has a memory; a worker then stores it
(keyword search finds it) and embeds it (semantic search finds it). This module
polls the system service's ``searchable`` endpoint (``bb.search.<principal>.searchable``,
docs/protocol.md §11), which answers from PostgreSQL which of the memories are not
stored yet and which have no vector yet, with a backoff from 20 ms to 0.5 s, only
about the memories still missing, until none is or the time is up. Nothing is
paid on the write path unless a caller asks to wait; one poll is one indexed
query for at most 1,000 memories of one board.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Literal

from agents_sdk.search import SearchClient
from blackboard.protocol.errors import NotSearchableError
from blackboard.protocol.schemas.search import MAX_SEARCHABLE_ITEMS

__all__ = ["DEFAULT_SEARCHABLE_TIMEOUT", "WaitFor", "wait_searchable"]

#: What ``remember`` waits for: ``"stored"`` (JetStream has it durably: the default, as None)
#: or ``"searchable"`` (a worker stored and embedded it: every search mode finds it).
WaitFor = Literal["stored", "searchable"]
#: How long ``wait="searchable"`` waits by default, in seconds.
DEFAULT_SEARCHABLE_TIMEOUT = 30.0

_FIRST_POLL = 0.02
_MAX_POLL = 0.5


async def wait_searchable(search: SearchClient, memories: Iterable[tuple[str, str, int]], *,
                          timeout: float = DEFAULT_SEARCHABLE_TIMEOUT) -> None:
    """Return once every memory ``(board, id, seq)`` is stored at version ``seq`` or later and
    embedded (``seq`` 0: any version).

    Raises:
        NotSearchableError: some were still not stored or not embedded after ``timeout``
            seconds (it lists them; the memories themselves are written).
        PermissionDeniedError: this principal may not read one of the boards.
        SearchError: no worker serves search, or it has no embedding provider (no memory would
            ever be searchable by every mode).
    """
    pending: dict[str, dict[str, int]] = {}
    for board, mid, seq in memories:
        on_board = pending.setdefault(board, {})
        on_board[mid] = max(seq, on_board.get(mid, 0))
    deadline = time.monotonic() + timeout
    pause = _FIRST_POLL
    while True:
        unstored: list[str] = []
        unembedded: list[str] = []
        for board, items in list(pending.items()):
            listed = list(items.items())
            missing: set[str] = set()
            for start in range(0, len(listed), MAX_SEARCHABLE_ITEMS):
                reply = await search.searchable(board, listed[start:start + MAX_SEARCHABLE_ITEMS])
                unstored += reply.unstored
                unembedded += reply.unembedded
                missing.update(reply.unstored, reply.unembedded)
            if missing:
                pending[board] = {m: n for m, n in items.items() if m in missing}
            else:
                del pending[board]
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotSearchableError(sorted(unstored), sorted(unembedded), timeout)
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, _MAX_POLL)
