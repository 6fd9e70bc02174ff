"""Stand-ins for an awaited call whose cancel is lost.

Python 3.11's ``asyncio.wait_for`` (under nats-py's and psycopg's requests) returns an
answer that is ready instead of raising a cancel that arrives in the same iteration. A
background loop must end anyway (a stop flag checked on each turn): these stand-ins
reproduce the lost cancel deterministically, so tests can check that it does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any


async def lose_a_cancel(hold: float = 0.5) -> None:
    """Wait ``hold`` seconds (the server "answers" meanwhile) and swallow a cancel that
    arrives then, as ``wait_for`` does."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(hold)


class LostCancel:
    """A call (or method: it takes any arguments) whose ``at``-th call sets ``entered`` and
    loses a cancel arriving within ``hold`` seconds, then returns ``result``; every other call
    returns ``then(*args, **kwargs)`` when given, else ``result``. ``calls`` counts them."""

    def __init__(self, at: int = 1, *, hold: float = 0.5, result: Any = None,
                 then: Callable[..., Awaitable[Any]] | None = None) -> None:
        self.at = at
        self.hold = hold
        self.result = result
        self.then = then
        self.calls = 0
        self.entered = asyncio.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            self.entered.set()
            await lose_a_cancel(self.hold)
            return self.result
        if self.then is not None:
            return await self.then(*args, **kwargs)
        return self.result


async def closes_for_good(close: Awaitable[object], stand_in: LostCancel, *, timeout: float = 5.0,
                          quiet: float = 0.3) -> None:
    """Check that ``close`` returns within ``timeout`` seconds and that ``stand_in`` is not called
    again within ``quiet`` seconds after.

    Awaited with ``asyncio.wait``, not ``wait_for``: a ``close()`` that suppresses the cancel
    ``wait_for`` sends on its timeout would return then and hide the hang.
    """
    done, _ = await asyncio.wait([asyncio.ensure_future(close)], timeout=timeout)
    assert done, "close() did not return"
    calls = stand_in.calls
    await asyncio.sleep(quiet)
    assert stand_in.calls == calls, "called again after close() returned"
