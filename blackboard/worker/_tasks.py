"""Running a worker stage's tasks, as one task group, until it is told to stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from blackboard.client.lifecycle import first_error

__all__ = ["first_of", "run_until_stopped"]


class _Stopped(Exception):
    """Raised in the group's body when ``stop`` is set: the group then cancels its tasks."""


async def run_until_stopped(stop: asyncio.Event,
                            work: Mapping[str, Callable[[asyncio.Event], Coroutine[Any, Any, None]]]) -> None:
    """Run ``work`` (task name -> ``fn(halt)``) in a task group until ``stop`` is set or a task fails.

    Either way every task is cancelled and awaited before this returns. ``halt`` is set
    before the tasks are cancelled (``stop`` set, this cancelled, or a task failed): a
    task's loop checks it on every turn, and ends there even if its cancel was lost
    (Python 3.11's ``asyncio.wait_for``, under nats-py's and psycopg's waits, returns a
    result that is ready instead of raising a cancel that arrives at the same time).

    Raises:
        the failed task's exception (the first one, if several failed at once).
    """
    halt = asyncio.Event()

    async def halting(fn: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
        try:
            await fn(halt)
        except Exception:
            halt.set()  # before the group cancels the others
            raise

    try:
        async with asyncio.TaskGroup() as group:
            for name, fn in work.items():
                group.create_task(halting(fn), name=name)
            try:
                await stop.wait()
            finally:
                halt.set()
            raise _Stopped
    except BaseExceptionGroup as group_error:
        _, errors = group_error.split(_Stopped)
        if errors is not None:
            raise first_error(errors) from None


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return when any of the events is set, or after ``timeout`` seconds (None: no limit).

    What an idle loop of the worker waits on: its wake-up and ``stop``, so that a loop whose
    cancel was lost (Python 3.11's ``asyncio.wait_for``) still ends at once on ``stop``.
    """
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
