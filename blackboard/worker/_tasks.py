"""Running a worker stage's tasks until it is told to stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

__all__ = ["run_until_stopped"]


async def run_until_stopped(stop: asyncio.Event, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Wait until ``stop`` is set or a task fails; then cancel and await them all.

    Raises:
        the first task's exception, if a task failed.
    """
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped and not task.cancelled():
                error = task.exception()
                if error is not None:
                    raise error
    finally:
        for task in (stopped, *tasks):
            task.cancel()
        for task in (stopped, *tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
