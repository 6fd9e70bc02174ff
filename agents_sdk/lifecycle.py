"""Background work of the SDK: task groups that outlive the call that opens them.

A view follows its watch, a messenger answers requests, an inbox keeps its
messages alive: each runs tasks for as long as the object is open, not for
one ``async with`` block of its caller. :class:`TaskHost` gives such an object
an :class:`asyncio.TaskGroup` held by a supervisor task of its own, so

* every task of the object is a child of one group: closing the host cancels
  and awaits all of them, and a child that fails cancels its siblings;
* a service is started with a readiness handshake (:meth:`TaskHost.start`,
  after anyio's ``task_status.started()``): the call returns once the service
  reports it is up, or raises the error it failed with, never in between.

::

    async with TaskHost("view:tasks") as host:
        snapshot = await host.start(follow)      # follow(status) calls status.started(x)
        host.spawn(some_coroutine())
    # every task is cancelled and awaited here; a failure is raised here

The host is opened with ``async with`` (or :meth:`open` / :meth:`aclose`, for
objects whose own ``close`` ends it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from blackboard.protocol.errors import NotConnectedError

__all__ = ["TaskHost", "TaskStatus"]

log = logging.getLogger("agents_sdk.lifecycle")

T = TypeVar("T")


class TaskStatus(Generic[T]):
    """Handed to a service started with :meth:`TaskHost.start`; it calls :meth:`started` once up."""

    def __init__(self) -> None:
        self._future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def started(self, value: T = None) -> None:  # type: ignore[assignment]
        """Report the service up; :meth:`TaskHost.start` returns ``value``. Later calls do nothing."""
        if not self._future.done():
            self._future.set_result(value)


class TaskHost:
    """An :class:`asyncio.TaskGroup` kept open by a supervisor task until :meth:`aclose`.

    No IO and no task in ``__init__``. Child failures are logged when they
    happen and raised by :meth:`aclose` (except one already raised by
    :meth:`start`, which reported it to its caller).

    Args:
        name: names the supervisor task and the log lines.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._group: asyncio.TaskGroup | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reported: set[int] = set()  # ids of errors start() already raised
        self._closed = False
        self._failed = False  # a task failed: the group cancels the others

    @property
    def running(self) -> bool:
        """Open and not closing (tasks can be spawned)."""
        return self._group is not None and not self._closed and not self._supervisor_done()

    @property
    def stopping(self) -> bool:
        """:meth:`aclose` began, or a task failed: the group cancels (or has cancelled) every task.

        A service's loop checks it on every turn, and after an await that may have
        swallowed its cancel (Python 3.11's ``asyncio.wait_for``, under nats-py's
        requests, returns a result that is ready instead of raising a cancel that
        arrives at the same time): the cancel is then lost, this is not.
        """
        return self._closed or self._failed

    def _supervisor_done(self) -> bool:
        return self._supervisor is not None and self._supervisor.done()

    async def open(self) -> TaskHost:
        """Start the supervisor and its task group; returns once the group is open (idempotent)."""
        if self._closed:
            raise NotConnectedError(f"{self.name} is closed")
        if self._supervisor is None:
            opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._supervisor = asyncio.create_task(self._supervise(opened, self._stop), name=self.name)
            await opened
        return self

    async def _supervise(self, opened: asyncio.Future[None], stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            opened.set_result(None)
            await stop.wait()
            for task in list(self._tasks):  # a stop ends the children; a failure already cancelled them
                task.cancel()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a child of the group.

        Raises:
            NotConnectedError: the host is not open, or closing.
        """
        if not self.running:
            coro.close()
            raise NotConnectedError(f"{self.name} is not running")
        assert self._group is not None
        child = self._logged(coro)
        try:
            task = self._group.create_task(child, name=name)
        except RuntimeError as exc:  # the group is shutting down after a child failed
            child.close()
            coro.close()
            raise NotConnectedError(f"{self.name} is not running") from exc
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _logged(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return await coro
        except Exception as exc:
            self._failed = True
            if id(exc) not in self._reported:
                log.error("%s: a background task failed", self.name, exc_info=exc)
            raise

    async def start(self, fn: Callable[[TaskStatus[T]], Coroutine[Any, Any, None]], *,
                    name: str | None = None) -> T:
        """Run the service ``fn(status)`` in the group; return once it calls ``status.started(value)``.

        Returns:
            The value given to ``status.started``.

        Raises:
            the exception ``fn`` raised before it was up (the host then closes);
            NotConnectedError: ``fn`` returned, or the host closed, before it was up.
        """
        status: TaskStatus[T] = TaskStatus()
        task = self.spawn(self._reporting(fn(status), status), name=name)
        either: set[asyncio.Future[Any]] = {status._future, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if status._future.done():
            return status._future.result()
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            assert error is not None
            raise error
        raise NotConnectedError(f"{name or self.name} ended before it was up")

    async def _reporting(self, coro: Awaitable[None], status: TaskStatus[Any]) -> None:
        try:
            await coro
        except Exception as exc:
            if not status._future.done():
                self._reported.add(id(exc))  # start() raises it to the caller
            raise

    async def aclose(self) -> None:
        """Cancel and await every task; the host cannot be reopened.

        Raises:
            the failure of a task (an :class:`ExceptionGroup` for several), unless
            :meth:`start` already raised it.
        """
        self._closed = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is None:
            return
        assert self._stop is not None
        self._stop.set()
        try:
            await asyncio.shield(supervisor)
        except BaseExceptionGroup as group:
            rest = group.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and id(e) not in self._reported)
            if rest is not None:
                raise (rest.exceptions[0] if len(rest.exceptions) == 1 else rest) from None
        finally:
            self._group = None

    async def __aenter__(self) -> TaskHost:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
