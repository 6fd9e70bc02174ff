"""Live local views: a mapping of board entries kept current by a KV watch.

Reads never wait on a server. The view starts from a snapshot of the current
values, then applies every change in stream order; a deleted or purged key
disappears. Each key keeps the highest revision seen, so a change replayed
after a reconnect, or a revision the agent already applied locally
(read-your-own-writes), is ignored: the view converges without gaps or
duplicates.

Only entries that verify are shown (docs/security.md, "Signatures"): a
revision that does not verify makes its key absent from the view at that
revision (the watch delivers it as the key's removal, carrying its
``verdict``; counted in :attr:`View.hidden`), rather than leaving an older
value in place. With ``security.unverified = "flag"`` it is shown, its entry's
``verdict`` telling why it did not verify.

An entry written with a TTL disappears when it expires: the view's watch
delivers a ``PURGE`` change at the entry's stored time plus its TTL (one timer
for the watch, whatever the number of entries), carrying the expired revision
itself, as the server writes nothing then (no expiry markers by default). The
view takes a removal at the revision it holds for a key as that expiry.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from agents_sdk.lifecycle import TaskHost, TaskStatus
from blackboard.protocol.entries import Change, Entry, Operation
from blackboard.protocol.errors import NotConnectedError, OperationTimeoutError

if TYPE_CHECKING:
    from agents_sdk.context import AgentContext
    from blackboard.client.board_store import Hidden, Watch, WatchStart

__all__ = ["ChangeCallback", "View", "ViewSource"]

log = logging.getLogger("agents_sdk.view")

ChangeCallback = Callable[[Change], Awaitable[None] | None]


class ViewSource(Protocol):
    """What a view needs of its board (:class:`agents_sdk.board.Board` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def context(self) -> AgentContext: ...

    def watch(self, section: str | None = None, key: str | None = None, *, start: WatchStart = "new",
              hidden: Hidden = "skip") -> Watch: ...


class View:
    """A live, read-only local copy of a board, a section or one key.

    Get one with ``await board.view(section=None, key=None)`` (or use it as
    ``async with board.view(...) as view``). Keys of the mapping are
    ``(section, key)`` tuples; ``view.get(section, key)`` reads one entry.

    One bad entry never stops a view: a stored entry that cannot be decoded is
    skipped (logged, counted in :attr:`skipped`), and a change callback that
    raises is logged and counted in :attr:`callback_errors`. Closing the view
    unsubscribes; the server removes its consumer a few seconds later (its
    inactivity threshold: an agent may not delete consumers).
    """

    def __init__(self, board: ViewSource, section: str | None = None, key: str | None = None) -> None:
        self.board = board
        self.section = section
        self.key = key
        self._entries: dict[tuple[str, str], Entry] = {}
        #: highest revision seen per key, deletes included (tombstones).
        self._revs: dict[tuple[str, str], int] = {}
        self._callbacks: list[ChangeCallback] = []
        self._subscribers: list[asyncio.Queue[Change | None]] = []
        self._tasks: TaskHost | None = None
        self._watch: Watch | None = None
        self.ready = asyncio.Event()
        #: Highest revision applied to this view.
        self.revision = 0
        #: Change callbacks that raised (each logged; the view went on).
        self.callback_errors = 0

    @property
    def skipped(self) -> int:
        """Stored entries the view's watch skipped because they cannot be decoded (each logged;
        the view goes on without them)."""
        return self._watch.skipped if self._watch is not None else 0

    @property
    def hidden(self) -> int:
        """Revisions the view hid because they do not verify (their keys read as absent)."""
        return self._watch.hidden if self._watch is not None else 0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> View:
        """Take the snapshot and start following changes; returns once the snapshot is in.

        The view's tasks (the watch it follows, change callbacks of its own
        writes) run in one task group, closed by :meth:`close`.

        Raises:
            NotConnectedError: NATS is unreachable.
        """
        if self._tasks is not None:
            await self.ready.wait()
            return self
        self._tasks = tasks = TaskHost(f"view:{self.board.name}")
        await tasks.open()
        self.board.context.views.add(self.board.name, self)
        try:
            await tasks.start(self._follow, name=f"view:{self.board.name}")
        except BaseException:
            await self.close()
            raise
        self.ready.set()
        return self

    def __await__(self) -> Any:
        return self.start().__await__()

    async def __aenter__(self) -> View:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop following changes (the local copy stays readable)."""
        self.board.context.views.discard(self.board.name, self)
        tasks, self._tasks = self._tasks, None
        try:
            if tasks is not None:
                await tasks.aclose()
        finally:
            for q in self._subscribers:
                q.put_nowait(None)

    async def _follow(self, status: TaskStatus[None]) -> None:
        """Apply the watch's changes in order; report up once the snapshot is applied.

        Ends at the next change once the view's tasks stop, even if the cancel did
        not reach it (a change callback's request may swallow it: Python 3.11's
        ``asyncio.wait_for``); otherwise ``close()`` would wait for ever.
        """
        tasks = self._tasks
        assert tasks is not None
        async with self.board.watch(self.section, self.key, start="current", hidden="remove") as watch:
            self._watch = watch
            if watch.caught_up.is_set():  # an empty snapshot
                status.started()
            async for change in watch:
                if tasks.stopping:
                    return
                await self._apply(change)
                if tasks.stopping:
                    return
                if watch.caught_up.is_set():  # the snapshot's last change is applied
                    status.started()
            if not watch.caught_up.is_set():
                raise NotConnectedError("the view's watch ended before its snapshot")

    # ------------------------------------------------------------------ updates
    def _matches(self, entry: Entry) -> bool:
        if entry.board != self.board.name:
            return False
        if self.section is not None and entry.section != self.section:
            return False
        return self.key is None or entry.key == self.key

    async def _apply(self, change: Change) -> None:
        if not self._apply_local(change.entry):
            return
        for q in self._subscribers:
            q.put_nowait(change)
        for cb in self._callbacks:
            try:
                result = cb(change)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # a faulty callback must not stop the view
                self.callback_errors += 1
                log.exception("view change callback failed")

    def _apply_local(self, entry: Entry) -> bool:
        """Apply an entry if it is newer than what the view has; True if applied."""
        if not self._matches(entry):
            return False
        k = (entry.section, entry.key)
        seen = self._revs.get(k, 0)
        if entry.revision <= seen:
            if entry.revision < seen or entry.operation is Operation.PUT:
                return False
            # A removal at the revision the view holds: that revision's TTL ran out.
            current = self._entries.get(k)
            if current is None or current.revision != entry.revision:
                return False
            del self._entries[k]
            return True
        self._revs[k] = entry.revision
        if entry.operation is Operation.PUT:
            self._entries[k] = entry
        else:
            self._entries.pop(k, None)
        self.revision = max(self.revision, entry.revision)
        return True

    def own_write(self, entry: Entry) -> None:
        """Read-your-own-writes: apply the agent's acknowledged write at once.

        Called by the agent's :class:`~agents_sdk.context.ViewRegistry` for
        every write of this view's board; a write the view already has (or a
        newer one) is ignored. A coroutine change callback runs in the view's
        task group.
        """
        if not self._apply_local(entry):
            return
        change = Change(entry)
        for q in self._subscribers:
            q.put_nowait(change)
        for cb in self._callbacks:
            try:
                result = cb(change)
                if inspect.isawaitable(result):
                    if self._tasks is not None and self._tasks.running:
                        self._tasks.spawn(self._callback(result))
                    elif inspect.iscoroutine(result):
                        result.close()  # the view is closing: its callbacks no longer run
            except Exception:
                self.callback_errors += 1
                log.exception("view change callback failed")

    async def _callback(self, result: Awaitable[None]) -> None:
        try:
            await result
        except Exception:  # a faulty callback must not stop the view
            self.callback_errors += 1
            log.exception("view change callback failed")

    # -------------------------------------------------------------------- reads
    def get(self, section: str, key: str, default: Entry | None = None) -> Entry | None:
        return self._entries.get((section, key), default)

    def value(self, section: str, key: str, default: Any = None) -> Any:
        entry = self._entries.get((section, key))
        return default if entry is None else entry.value

    def __getitem__(self, item: tuple[str, str]) -> Entry:
        return self._entries[item]

    def __contains__(self, item: object) -> bool:
        return item in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(sorted(self._entries))

    def entries(self) -> list[Entry]:
        """Entries sorted by (section, key)."""
        return [self._entries[k] for k in sorted(self._entries)]

    def keys(self) -> list[tuple[str, str]]:
        return sorted(self._entries)

    def snapshot(self) -> dict[tuple[str, str], Any]:
        """A plain dict of ``(section, key) -> value``."""
        return {k: e.value for k, e in sorted(self._entries.items())}

    # ---------------------------------------------------------------- listening
    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(change)`` after each applied change; returns an unsubscribe function."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    async def changes(self) -> AsyncIterator[Change]:
        """Iterate over changes applied from now on (ends when the view closes)."""
        q: asyncio.Queue[Change | None] = asyncio.Queue()
        self._subscribers.append(q)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                yield item
        finally:
            self._subscribers.remove(q)

    async def wait_for(self, predicate: Callable[[View], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(view)`` holds (checked after every change).

        Raises:
            OperationTimeoutError: it did not hold within ``timeout`` seconds.
        """
        if predicate(self):
            return
        event = asyncio.Event()

        def check(_: Change) -> None:
            if predicate(self):
                event.set()

        remove = self.on_change(check)
        try:
            if predicate(self):
                return
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError as exc:
            raise OperationTimeoutError(f"view condition not met within {timeout}s") from exc
        finally:
            remove()
