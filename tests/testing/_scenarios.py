"""The checks a stack must pass, whatever runs it: tests/testing/test_stacks.py runs them on
embedded stacks, tests/containers/test_stack.py on containers (the same suite against both,
as FastStream runs one suite against its in-memory and real brokers).

* the SDK writes and reads;
* the worker persists and search answers;
* the KV stream's leader of a 3-node cluster is killed under writes: every acknowledged write
  is read back, and again once the restarted node caught up and another node went;
* the worker is killed (SIGKILL) mid-ingest and started again: every memory and entry is a
  row exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import psycopg
from nats.js.errors import NoStreamResponseError

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.protocol.errors import BlackboardError
from blackboard.settings import Settings
from blackboard.testing import Stack

__all__ = ["killed_nats_node_loses_nothing", "killed_worker_rows_exactly_once", "quick_redelivery",
           "sdk_writes_and_reads", "worker_persists_and_search_answers"]


def quick_redelivery(settings: Settings, ack_wait: float = 5.0) -> Settings:
    """``settings`` whose worker consumers redeliver what a killed worker held after
    ``ack_wait`` seconds (default 30: a test would wait that long)."""
    return settings.model_copy(update={"worker": settings.worker.model_copy(update={"ack_wait": ack_wait})})


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def rows(stack: Stack, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(stack.postgres_dsn) as conn:
        return conn.execute(query, params).fetchall()


async def wait_count(stack: Stack, query: str, params: tuple[object, ...], count: int, within: float) -> int:
    """Poll until ``query``'s single count reaches ``count`` (or ``within`` s pass); returns it."""
    deadline = time.monotonic() + within
    while True:
        found = int(str((await asyncio.to_thread(rows, stack, query, *params))[0][0]))
        if found >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.25)


class Progress:
    """A count that tasks wait on: ``await progress.reached(n)``."""

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[tuple[int, asyncio.Event]] = []

    def add(self) -> None:
        self.count += 1
        for target, event in self._waiters:
            if self.count >= target:
                event.set()

    async def reached(self, target: int, within: float = 60.0) -> None:
        event = asyncio.Event()
        self._waiters.append((target, event))
        if self.count >= target:
            event.set()
        await asyncio.wait_for(event.wait(), within)


async def sdk_writes_and_reads(stack: Stack) -> None:
    board = unique("rw")
    async with stack.agent("alice") as alice, stack.agent("bob") as bob:
        revision = await alice.board(board).put("notes", "plan", {"step": 1})
        entry = await bob.board(board).get("notes", "plan")
        assert (entry.value, entry.revision, entry.author) == ({"step": 1}, revision, "alice")
        await bob.board(board).update("notes", "plan", {"step": 2}, expected_revision=revision)
        assert (await alice.board(board).get("notes", "plan")).value == {"step": 2}


async def worker_persists_and_search_answers(stack: Stack) -> None:
    board = unique("search")
    async with stack.agent() as agent:
        await agent.board(board).put("notes", "release", {"text": "the release train leaves on tuesday"})
        mid = await agent.remember("the deploy window is friday at noon", board=board, wait="searchable")
        other = await agent.remember("lunch is served in the atrium", board=board, wait="searchable")
        hits = await agent.recall("when is the deploy window", board=board)
        assert hits and hits[0].id == mid
        assert {hit.id for hit in hits} <= {mid, other}
    assert rows(stack, "SELECT text FROM bb_memories WHERE id = %s", mid) == [("the deploy window is friday at noon",)]
    assert await wait_count(stack, "SELECT count(*) FROM bb_entries WHERE board = %s", (board,), 1, 30) == 1


async def _cluster_state(settings: Settings, stream: str) -> tuple[str, list[tuple[str, bool]]]:
    """The stream's leader ("" while it elects one) and its other replicas with whether each
    is current."""
    nc = await connect_nats(settings, name="test-cluster-state")
    try:
        info = await nc.jetstream().stream_info(stream)
        cluster = info.cluster
        if cluster is None:
            return "", []
        return cluster.leader or "", [(str(p.name), bool(p.current) and not p.offline)
                                      for p in cluster.replicas or []]
    finally:
        await nc.close()


async def _wait_cluster(settings: Settings, stream: str, *, all_current: bool,
                        within: float = 60.0) -> str:
    """Wait until the stream has a leader (and, ``all_current``, both other replicas are
    current); returns the leader."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(BlackboardError, TimeoutError, NoStreamResponseError):
            leader, replicas = await _cluster_state(settings, stream)
            if leader and (not all_current or (len(replicas) == 2 and all(current for _, current in replicas))):
                return leader
        assert time.monotonic() < deadline, f"{stream} has no leader or its replicas did not catch up " \
                                            f"within {within:g}s"
        await asyncio.sleep(0.25)


async def _put_until(agent: Agent, board: str, stop: asyncio.Event, acked: dict[str, int],
                     progress: Progress) -> None:
    """Write new keys one after another until ``stop``; record each acknowledged one."""
    i = 0
    while not stop.is_set():
        key = f"k{i:05d}"
        i += 1
        with contextlib.suppress(BlackboardError, TimeoutError, NoStreamResponseError):
            acked[key] = await agent.board(board).put("load", key, {"i": i})
            progress.add()


async def killed_nats_node_loses_nothing(cluster: Stack) -> None:
    """Writes go on while the KV stream's leader is killed; every acknowledged write is read
    back from the survivors, and again after the killed node came back, caught up, and another
    node was killed (so the restarted node's copy counts)."""
    assert cluster.nats_nodes == 3
    operator = cluster.settings("operator")
    stream = f"KV_{cluster.base_settings.board.bucket}"
    board = unique("ha")
    acked: dict[str, int] = {}
    progress = Progress()
    async with cluster.agent("writer") as writer:
        stop = asyncio.Event()
        load = asyncio.create_task(_put_until(writer, board, stop, acked, progress))
        await progress.reached(50)
        leader = await _wait_cluster(operator, stream, all_current=True)
        killed = int(leader.removeprefix("nats-")) - 1
        await asyncio.to_thread(cluster.kill_nats, killed)
        await progress.reached(progress.count + 50)  # writes go on, acknowledged by the survivors
        stop.set()
        await load

    async def read_all() -> dict[str, int]:
        async with cluster.agent("reader") as reader:
            return {key: (await reader.board(board).get("load", key)).revision for key in acked}

    assert await read_all() == acked
    await asyncio.to_thread(cluster.start_nats, killed)
    await _wait_cluster(operator, stream, all_current=True)
    await asyncio.to_thread(cluster.kill_nats, (killed + 1) % 3)
    assert await read_all() == acked


async def killed_worker_rows_exactly_once(stack: Stack, total: int = 400) -> None:
    """Memories and entries are written while the worker is killed (SIGKILL, mid batch) and
    started again: each is one row, none missing, none twice, no dead letter."""
    board = unique("once")
    mids: list[str] = []
    progress = Progress()
    async with stack.agent("writer") as writer:
        async def write() -> None:
            for i in range(total):
                mids.append(await writer.remember(f"observation {i} of the exactly-once run", board=board))
                await writer.board(board).put("facts", f"f{i:04d}", {"i": i})
                progress.add()

        task = asyncio.create_task(write())
        await progress.reached(total // 4)
        await asyncio.to_thread(stack.kill_worker)
        await task
        await asyncio.to_thread(stack.start_worker)
    memories = await wait_count(stack, "SELECT count(*) FROM bb_memories WHERE board = %s", (board,), total, 120)
    entries = await wait_count(stack, "SELECT count(*) FROM bb_entries WHERE board = %s", (board,), total, 120)
    await asyncio.sleep(2)  # anything redelivered after catching up would land now
    assert (memories, entries) == (total, total)
    per_id = rows(stack, "SELECT id, count(*) FROM bb_memories WHERE board = %s GROUP BY id", board)
    assert sorted(str(r[0]) for r in per_id) == sorted(mids)
    assert all(r[1] == 1 for r in per_id)
    assert rows(stack, "SELECT count(*) FROM bb_entry_revisions WHERE board = %s", board) == [(total,)]
    assert rows(stack, "SELECT count(*) FROM bb_dead_letters") == [(0,)]
