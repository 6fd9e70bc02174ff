"""The stack in containers, through testcontainers (blackboard.testing.ContainerStack) with the
images of ``Settings.containers`` (CI: the locally built ones, ``scripts/containers``): the SDK
writes and reads, the worker persists and search answers, a NATS node of a 3-node cluster is
killed and nothing acknowledged is lost, the worker container is killed and started again and
every record is a row exactly once.

No Docker engine, or an image missing: the tests fail with the reason (never a skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from nats.js.errors import NoStreamResponseError

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.protocol.errors import BlackboardError
from blackboard.settings import Settings
from blackboard.testing import ContainerStack, Stack, sweep_containers

pytestmark = [pytest.mark.containers, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(900)]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def stack() -> Iterator[ContainerStack]:
    """One NATS node, PostgreSQL + pgvector and the worker, in containers."""
    sweep_containers()
    with ContainerStack(settings=Settings()) as started:
        yield started


def _rows(stack: Stack, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(stack.postgres_dsn) as conn:
        return conn.execute(query, params).fetchall()


async def _wait_rows(stack: Stack, query: str, params: tuple[object, ...], count: int, within: float) -> int:
    """Poll until ``query``'s single count reaches ``count`` (or ``within`` s pass); returns it."""
    deadline = time.monotonic() + within
    while True:
        rows = await asyncio.to_thread(_rows, stack, query, *params)
        found = int(str(rows[0][0]))
        if found >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.25)


async def test_sdk_writes_and_reads(stack: Stack) -> None:
    board = _unique("rw")
    async with stack.agent("alice") as alice, stack.agent("bob") as bob:
        revision = await alice.board(board).put("notes", "plan", {"step": 1})
        entry = await bob.board(board).get("notes", "plan")
        assert (entry.value, entry.revision, entry.author) == ({"step": 1}, revision, "alice")
        await bob.board(board).update("notes", "plan", {"step": 2}, expected_revision=revision)
        assert (await alice.board(board).get("notes", "plan")).value == {"step": 2}


async def test_worker_persists_and_search_answers(stack: Stack) -> None:
    board = _unique("search")
    async with stack.agent() as agent:
        await agent.board(board).put("notes", "release", {"text": "the release train leaves on tuesday"})
        mid = await agent.remember("the deploy window is friday at noon", board=board, wait="searchable")
        other = await agent.remember("lunch is served in the atrium", board=board, wait="searchable")
        hits = await agent.recall("when is the deploy window", board=board)
        assert hits and hits[0].id == mid
        assert {hit.id for hit in hits} <= {mid, other}
    assert _rows(stack, "SELECT text FROM bb_memories WHERE id = %s", mid) == [("the deploy window is friday at noon",)]
    assert await _wait_rows(stack, "SELECT count(*) FROM bb_entries WHERE board = %s", (board,), 1, 30) == 1


async def _stream_leader(settings: Settings, stream: str) -> str:
    nc = await connect_nats(settings, name="test-leader")
    try:
        info = await nc.jetstream().stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await nc.close()


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


@pytest.mark.slow
async def test_a_killed_nats_node_loses_nothing_acknowledged() -> None:
    """Writes go on while the KV stream's leader is killed; every acknowledged write is read
    back from the survivors, and again from a cluster whose other node is killed after the
    first came back (so the restarted node must have caught up)."""
    with ContainerStack(settings=Settings(), nats_nodes=3, worker=False) as cluster:
        bucket_stream = f"KV_{cluster.base_settings.board.bucket}"
        board = _unique("ha")
        acked: dict[str, int] = {}
        async with cluster.agent("writer") as writer:
            stop = asyncio.Event()
            progress = Progress()
            load = asyncio.create_task(_put_until(writer, board, stop, acked, progress))
            await progress.reached(50)
            leader = await _stream_leader(cluster.settings("operator"), bucket_stream)
            killed = int(leader.removeprefix("nats-")) - 1
            await asyncio.to_thread(cluster.kill_nats, killed)
            # Writes go on: 50 more are acknowledged by the two survivors.
            await progress.reached(progress.count + 50)
            stop.set()
            await load

        async def read_all(reader: Agent) -> dict[str, int]:
            return {key: (await reader.board(board).get("load", key)).revision for key in acked}

        async with cluster.agent("reader") as reader:
            assert await read_all(reader) == acked
        await asyncio.to_thread(cluster.start_nats, killed)
        # The restarted node catches up, then another node goes: reads must still find everything.
        await asyncio.sleep(3)
        await asyncio.to_thread(cluster.kill_nats, (killed + 1) % 3)
        async with cluster.agent("reader") as reader:
            assert await read_all(reader) == acked


@pytest.mark.slow
async def test_a_killed_worker_container_restarts_with_rows_exactly_once() -> None:
    """Memories and entries are written while the worker container is killed (SIGKILL, mid
    batch) and started again: each is one row, none missing, none twice."""
    with ContainerStack(settings=Settings()) as stack:
        board = _unique("once")
        total = 400
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
        memories = await _wait_rows(stack, "SELECT count(*) FROM bb_memories WHERE board = %s", (board,), total, 120)
        entries = await _wait_rows(stack, "SELECT count(*) FROM bb_entries WHERE board = %s", (board,), total, 120)
        await asyncio.sleep(2)  # anything redelivered after catching up would land now
        assert (memories, entries) == (total, total)
        rows = _rows(stack, "SELECT id, count(*) FROM bb_memories WHERE board = %s GROUP BY id", board)
        assert sorted(str(r[0]) for r in rows) == sorted(mids)
        assert all(r[1] == 1 for r in rows)
        revisions = _rows(stack, "SELECT count(*) FROM bb_entry_revisions WHERE board = %s", board)
        assert revisions == [(total,)]
        assert _rows(stack, "SELECT count(*) FROM bb_dead_letters") == [(0,)]


async def test_stacks_leave_no_containers(stack: ContainerStack) -> None:
    """The private stacks above removed their containers and networks; only the module's
    stack (still up) has some."""
    from blackboard.testing.containers import LABEL, docker_client

    client = docker_client()
    left = [c.name for c in client.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(f"{LABEL}.stack") != stack.stack_id]
    networks = [n.name for n in client.networks.list(filters={"label": LABEL})
                if (n.attrs.get("Labels") or {}).get(f"{LABEL}.stack") != stack.stack_id]
    assert (left, networks) == ([], [])
