"""When board entries written with a TTL expire, for the watches (and so the views) that hold them.

An entry written with ``ttl`` carries ``Nats-TTL``; the server removes its
message at its stored time (the server's clock) plus that TTL. The board
stream places no subject delete marker by default
(``settings.board.expiry_marker_ttl = 0``: nats-server turns rollups and
purges back on for a stream with markers), so no reader is told: a watch
removes such a key itself. :class:`ExpiryTimer` keeps the deadlines of the
keys' latest revisions in one heap under one timer (not a task per entry) and
calls back for each deadline that passes while its revision is still the
key's latest one the watch has seen.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ExpiryTimer"]

K = TypeVar("K", bound=Hashable)

#: Stale heap items (a key written again, or without TTL) tolerated before the heap is rebuilt.
_SLACK = 64


class ExpiryTimer(Generic[K]):
    """Deadlines of the keys' latest revisions, one ``loop.call_later`` armed for the nearest.

    No IO. Call :meth:`seen` for every revision of a key as it arrives (with its
    deadline, or None when it has no TTL: a later revision replaces the key's
    pending expiry); ``on_expire(key, revision, deadline)`` is called from the
    event loop once ``deadline`` (epoch seconds) has passed and ``revision`` is
    still the key's latest. :meth:`close` stops it.

    Args:
        on_expire: called for each expiry, in deadline order.
        clock: the wall clock the deadlines are on (the server's timestamps are wall-clock).
    """

    def __init__(self, on_expire: Callable[[K, int, float], None], *,
                 clock: Callable[[], float] = time.time) -> None:
        self._on_expire = on_expire
        self._clock = clock
        #: key -> (revision, deadline) of its latest revision, when that one has a TTL.
        self._latest: dict[K, tuple[int, float]] = {}
        #: (deadline, order, revision, key); items whose key moved on stay until popped.
        self._heap: list[tuple[float, int, int, K]] = []
        self._order = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Keys whose latest revision will expire."""
        return len(self._latest)

    def seen(self, key: K, revision: int, deadline: float | None) -> None:
        """``revision`` is now ``key``'s latest; it expires at ``deadline`` (None: never)."""
        if self._closed:
            return
        if deadline is None:
            self._latest.pop(key, None)
            return
        self._latest[key] = (revision, deadline)
        heapq.heappush(self._heap, (deadline, next(self._order), revision, key))
        if len(self._heap) > 2 * len(self._latest) + _SLACK:
            self._compact()
        if self._armed_for is None or deadline < self._armed_for:
            self._arm()

    def close(self) -> None:
        """Stop the timer; nothing expires any more (idempotent)."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._armed_for = None
        self._heap.clear()
        self._latest.clear()

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if self._latest.get(item[3]) == (item[2], item[0])]
        heapq.heapify(self._heap)

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = self._armed_for = None
        if not self._heap:
            return
        deadline = self._heap[0][0]
        self._armed_for = deadline
        self._handle = asyncio.get_running_loop().call_later(max(0.0, deadline - self._clock()), self._fire)

    def _fire(self) -> None:
        self._handle = self._armed_for = None
        now = self._clock()
        heap = self._heap
        while heap and heap[0][0] <= now and not self._closed:
            deadline, _, revision, key = heapq.heappop(heap)
            if self._latest.get(key) == (revision, deadline):
                del self._latest[key]
                self._on_expire(key, revision, deadline)
        if not self._closed:
            self._arm()
