"""Running a worker stage's tasks, as one task group, until it is told to stop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from blackboard.client.lifecycle import first_error

__all__ = ["first_of", "run_until_stopped"]


class _Stopped(Exception):
    """Raised in the group's body when ``stop`` is set: the group then cancels its tasks."""


async def run_until_stopped(stop: asyncio.Event, work: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` (task name -> coroutine) in a task group until ``stop`` is set or a task fails.

    Either way every task is cancelled and awaited before this returns.

    Raises:
        the failed task's exception (the first one, if several failed at once).
    """
    try:
        async with asyncio.TaskGroup() as group:
            for name, coro in work.items():
                group.create_task(coro, name=name)
            await stop.wait()
            raise _Stopped
    except BaseExceptionGroup as group_error:
        _, errors = group_error.split(_Stopped)
        if errors is not None:
            raise first_error(errors) from None



async def first_of(*events: asyncio.Event) -> None:
    """Return when any of the events is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
