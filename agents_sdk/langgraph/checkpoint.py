"""``BlackboardSaver``: a LangGraph checkpointer on a board, so that several processes
can run and resume one graph thread, with its history (docs/langgraph.md).

Every read and write goes through the SDK's :class:`~agents_sdk.Board` of one
agent: writes are signed by that agent and allowed by its rights, reads are
verified; the index of a thread's checkpoints is appended by compare-and-set,
and so are a checkpoint's pending writes (parallel tasks, several processes).
Where each thing lives: :mod:`agents_sdk.langgraph._checkpoint_layout`.

Values go through the saver's ``serde`` (``dumps_typed``/``loads_typed``); a
serialised value larger than ``inline_limit`` bytes is stored in the
deployment's object store and referenced from its entry.

The async methods run on the agent's event loop (called from another loop, they
hop onto it); the sync ones run them there through a
:class:`~agents_sdk.langgraph._bridge.LoopBridge` and raise ``RuntimeError`` when
called on that loop itself.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agents_sdk.agent import Agent
from agents_sdk.board import Board
from agents_sdk.langgraph._bridge import LoopBridge
from agents_sdk.langgraph._checkpoint_admin import CheckpointBoard
from agents_sdk.langgraph._checkpoint_layout import thread_id_of
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.settings import Settings

__all__ = ["DEFAULT_BOARD", "DEFAULT_INLINE_LIMIT", "BlackboardSaver"]

#: The board a saver writes to unless told otherwise.
DEFAULT_BOARD = "langgraph-checkpoints"
#: Serialised values larger than this (bytes) go to the object store.
DEFAULT_INLINE_LIMIT = 256 * 1024
#: Room kept in an entry for everything but the values (keys, ids, msgpack, the envelope).
_ENTRY_MARGIN = 16 * 1024
_STRATEGIES = ("keep_latest", "delete")

T = TypeVar("T")
_DONE: Any = object()


async def _next(gen: AsyncIterator[T]) -> T | Any:
    """The next item of ``gen``, or :data:`_DONE` at its end (an item per bridged call)."""
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return _DONE


def _strategy(strategy: str) -> str:
    if strategy not in _STRATEGIES:
        raise InvalidPayloadError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
    return strategy


class BlackboardSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer storing threads on a board (sync and async API).

    Build it in async code from a connected agent::

        async with Agent.connect("planner", settings=settings) as agent:
            saver = BlackboardSaver(agent)                  # board "langgraph-checkpoints"
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})

    or, in a program without an event loop, with :meth:`connect_sync` (then
    :meth:`close` it). The agent needs ``read`` and ``write`` on the board, and
    the object store's ``write`` for values over ``inline_limit``.

    Args:
        agent: the connected agent every write is signed by.
        board: the board holding the checkpoints.
        serde: LangGraph's serializer (default: its ``JsonPlusSerializer``).
        inline_limit: serialised values larger than this many bytes go to the
            object store (at most the board's ``max_value_size`` less 16 KiB).
        bridge: the loop bridge of the sync API (default: the running loop's).

    Raises:
        RuntimeError: built outside a running event loop without a ``bridge``
            (use :meth:`connect_sync`).
        InvalidKeyError: an invalid board name.
        ValueError: ``inline_limit`` out of range.
    """

    def __init__(self, agent: Agent, *, board: str = DEFAULT_BOARD, serde: SerializerProtocol | None = None,
                 inline_limit: int = DEFAULT_INLINE_LIMIT, bridge: LoopBridge | None = None) -> None:
        super().__init__(serde=serde)
        if bridge is None:
            try:
                bridge = LoopBridge.current()
            except RuntimeError as exc:
                raise RuntimeError("BlackboardSaver(agent) is built in async code (on the agent's event loop); "
                                   "without one, use BlackboardSaver.connect_sync(agent_id, ...)") from exc
        self.agent = agent
        self.board: Board = agent.board(board)
        budget = agent.settings.board.max_value_size - _ENTRY_MARGIN
        if not 0 <= inline_limit <= budget:
            raise ValueError(f"inline_limit must be between 0 and {budget} bytes, not {inline_limit}")
        self.inline_limit = inline_limit
        self._bridge = bridge
        self._owns_agent = False
        self._owns_loop = False
        self._store = CheckpointBoard(agent, self.board, self.serde, inline_limit, budget)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    async def connect(cls, agent_id: str, *, settings: Settings | None = None, board: str = DEFAULT_BOARD,
                      serde: SerializerProtocol | None = None,
                      inline_limit: int = DEFAULT_INLINE_LIMIT) -> BlackboardSaver:
        """Connect agent ``agent_id`` and build a saver on it, which owns it: :meth:`aclose`
        (or ``async with``) closes it.

        Raises:
            The errors of :meth:`agents_sdk.Agent.connect` (AuthenticationError, NotConnectedError...).
        """
        agent = await Agent.connect(agent_id, settings=settings)
        try:
            saver = cls(agent, board=board, serde=serde, inline_limit=inline_limit)
        except BaseException:
            await agent.close()
            raise
        saver._owns_agent = True
        return saver

    @classmethod
    def connect_sync(cls, agent_id: str, *, settings: Settings | None = None, board: str = DEFAULT_BOARD,
                     serde: SerializerProtocol | None = None,
                     inline_limit: int = DEFAULT_INLINE_LIMIT) -> BlackboardSaver:
        """A saver for a program without an event loop: starts a loop in a thread of its own,
        connects agent ``agent_id`` on it (``Agent.connect(agent_id, settings=settings)``).
        :meth:`close` closes the agent and stops the loop.

        Raises:
            The errors of :meth:`agents_sdk.Agent.connect` (AuthenticationError, NotConnectedError...).
        """
        bridge = LoopBridge.start(name=f"blackboard-saver-{agent_id}")

        async def connect() -> Agent:
            return await Agent.connect(agent_id, settings=settings)

        try:
            agent = bridge.run(connect(), method="connect_sync")
            saver = cls(agent, board=board, serde=serde, inline_limit=inline_limit, bridge=bridge)
        except BaseException:
            bridge.close()
            raise
        saver._owns_agent = saver._owns_loop = True
        return saver

    def close(self) -> None:
        """Close what :meth:`connect_sync` opened (the agent, its loop); a no-op otherwise."""
        if self._owns_agent:
            self._owns_agent = False
            try:
                self._bridge.run(self.agent.close(), method="close")
            finally:
                self._bridge.close()

    async def aclose(self) -> None:
        """Close the agent :meth:`connect` (or :meth:`connect_sync`, from another loop) opened;
        a no-op for a saver built on an agent of the caller's."""
        if not self._owns_agent:
            return
        if self._owns_loop:
            await asyncio.to_thread(self.close)
            return
        self._owns_agent = False
        await self.agent.close()

    async def __aenter__(self) -> BlackboardSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> BlackboardSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ async API
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's newest in the
        namespace), with its pending writes and parent; None when there is none.

        Raises:
            InvalidKeyError: a config without a thread id.
            InvalidPayloadError: a stored record that is not one of this saver's.
        """
        return await self._bridge.arun(self._store.get_tuple(config), method="aget_tuple")

    async def aget_author(self, config: RunnableConfig) -> str | None:
        """The agent that wrote the config's checkpoint (its id, else the namespace's newest):
        the record's author, whose signature the read verified. None when there is none.

        Raises:
            InvalidKeyError: a config without a thread id.
        """
        return await self._bridge.arun(self._store.author(config), method="aget_author")

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id): of the config's thread (and namespace,
        when it names one; of every thread for ``None``), whose metadata holds every
        ``filter`` item, older than ``before``'s checkpoint, at most ``limit``."""
        gen = self._store.list_tuples(config, filter, before, limit)
        try:
            while (item := await self._bridge.arun(_next(gen), method="alist")) is not _DONE:
                yield item
        finally:
            await self._bridge.arun(gen.aclose(), method="alist")

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint (its new channel values, its record, its place in the index);
        returns the config naming it.

        Raises:
            InvalidKeyError, InvalidPayloadError: a bad config or checkpoint.
            PayloadTooLargeError: the checkpoint's record does not fit an entry even with its
                values in the object store.
        """
        return await self._bridge.arun(self._store.put(config, checkpoint, metadata, new_versions), method="aput")

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """Store a task's writes as pending writes of the config's checkpoint (a retried call
        adds nothing; a special write, e.g. an error or interrupt, replaces the stored one).

        Raises:
            InvalidKeyError: no checkpoint id in the config, or a task id that is not a string.
            PayloadTooLargeError: the checkpoint's writes no longer fit one entry.
        """
        await self._bridge.arun(self._store.put_writes(config, writes, task_id, task_path), method="aput_writes")

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and value of a thread (each namespace), and the
        objects they referenced. The board's history (and the worker's stored history)
        keeps what was written: deleted keys read as absent."""
        await self._bridge.arun(self._store.delete_thread(thread_id_of(thread_id)), method="adelete_thread")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is one of
        ``run_ids``, in every thread, and the channel values only they used. Reads the
        index of every thread of the board."""
        await self._bridge.arun(self._store.delete_for_runs({str(r) for r in run_ids}), method="adelete_for_runs")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (same ids, metadata, parents), its writes and values of one
        thread to another; the source is unchanged. Copied into a thread that has
        checkpoints of its own, they join them in its index."""
        await self._bridge.arun(self._store.copy_thread(thread_id_of(source_thread_id), thread_id_of(target_thread_id)),
                                method="acopy_thread")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps each namespace's newest checkpoint (with its
        writes and values), ``"delete"`` deletes the threads.

        Raises:
            InvalidPayloadError: an unknown strategy.
            NotImplementedError: ``keep_latest`` on a thread whose graph uses a DeltaChannel
                (its state needs the older checkpoints; LangGraph's Postgres saver refuses too).
        """
        await self._bridge.arun(self._store.prune([thread_id_of(t) for t in thread_ids], _strategy(strategy)),
                                method="aprune")

    # ------------------------------------------------------------ sync API
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`aget_tuple`, from sync code (not on the agent's loop: RuntimeError)."""
        return self._bridge.run(self._store.get_tuple(config), method="get_tuple")

    def get_author(self, config: RunnableConfig) -> str | None:
        """:meth:`aget_author`, from sync code."""
        return self._bridge.run(self._store.author(config), method="get_author")

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """:meth:`alist`, from sync code (not on the agent's loop: RuntimeError)."""
        gen = self._store.list_tuples(config, filter, before, limit)
        try:
            while (item := self._bridge.run(_next(gen), method="list")) is not _DONE:
                yield item
        finally:
            if not self._bridge.loop.is_closed():
                self._bridge.run(gen.aclose(), method="list")

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """:meth:`aput`, from sync code."""
        return self._bridge.run(self._store.put(config, checkpoint, metadata, new_versions), method="put")

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """:meth:`aput_writes`, from sync code."""
        self._bridge.run(self._store.put_writes(config, writes, task_id, task_path), method="put_writes")

    def delete_thread(self, thread_id: str) -> None:
        """:meth:`adelete_thread`, from sync code."""
        self._bridge.run(self._store.delete_thread(thread_id_of(thread_id)), method="delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`adelete_for_runs`, from sync code."""
        self._bridge.run(self._store.delete_for_runs({str(r) for r in run_ids}), method="delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`acopy_thread`, from sync code."""
        self._bridge.run(self._store.copy_thread(thread_id_of(source_thread_id), thread_id_of(target_thread_id)),
                         method="copy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`aprune`, from sync code."""
        self._bridge.run(self._store.prune([thread_id_of(t) for t in thread_ids], _strategy(strategy)),
                         method="prune")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """``<32-digit counter>.<random>``, as LangGraph's own savers: increasing, and two
        processes that write the same channel never make the same version."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

