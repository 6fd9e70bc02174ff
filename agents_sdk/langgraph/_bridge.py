"""Synchronous calls into an agent's event loop (LangGraph's sync store and checkpointer API).

An :class:`~agents_sdk.Agent` lives on one event loop. LangGraph calls the
sync methods (``store.put``, ``saver.get_tuple``) from worker threads of its
sync runner or from plain sync code; they run the async method on the agent's
loop and wait. Called on that loop itself they would wait for themselves: they
raise instead, naming the async method to use.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopBridge"]

T = TypeVar("T")


class LoopBridge:
    """Runs coroutines on one event loop from any other thread.

    ``LoopBridge(loop)`` uses a running loop (the agent's); :meth:`start` makes a
    loop of its own in a daemon thread (for programs with no event loop), which
    :meth:`close` stops.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, owned: threading.Thread | None = None) -> None:
        self.loop = loop
        self._thread = owned

    @classmethod
    def start(cls, name: str = "blackboard-langgraph") -> LoopBridge:
        """A bridge to a new event loop running in a daemon thread of its own."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
        thread.start()
        return cls(loop, owned=thread)

    @classmethod
    def current(cls) -> LoopBridge:
        """A bridge to the running loop (call from async code, e.g. where the agent was connected)."""
        return cls(asyncio.get_running_loop())

    def run(self, coro: Coroutine[Any, Any, T], *, method: str) -> T:
        """Run ``coro`` on the bridged loop and return its result (or raise its error).

        Raises:
            RuntimeError: called from the bridged loop's own thread (it would wait for
                itself forever); the message names ``a<method>``, the async method to await.
        """
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError(f"the synchronous {method}() was called on the event loop the agent runs on, "
                               f"where it would wait for itself: await a{method}() instead")
        self._check_running(coro, method)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def arun(self, coro: Coroutine[Any, Any, T], *, method: str) -> T:
        """Await ``coro`` on the bridged loop from any event loop (at once on that loop itself).

        Raises:
            RuntimeError: the bridged loop is not running (closed?).
        """
        if asyncio.get_running_loop() is self.loop:
            return await coro
        self._check_running(coro, method)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def _check_running(self, coro: Coroutine[Any, Any, Any], method: str) -> None:
        """Raise (closing ``coro``) when the bridged loop would never run it."""
        if self.loop.is_closed() or not self.loop.is_running():
            coro.close()
            raise RuntimeError(f"{method}(): the agent's event loop is not running (closed?)")

    def close(self) -> None:
        """Stop the loop this bridge started (a no-op for a borrowed loop)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        thread.join(10)
        if not thread.is_alive():
            self.loop.close()
