"""Stopping a command's long-running work on SIGINT or SIGTERM (``blackboard dev``, ``worker``,
``mcp``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal

__all__ = ["stop_on_signal"]


def stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM from now on (installed at once, not when awaited: a
    signal that comes right after a "ready" line must not find Python's default handler)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
