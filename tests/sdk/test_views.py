"""Live shared views on a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agents_sdk import Agent, Change, Operation
from blackboard.devstack import EmbeddedNats
from blackboard.settings import Settings
from tests._lost_cancel import LostCancel
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_view_snapshot_then_follows_another_agent(settings: Settings, unique: str) -> None:
    async with Agent.connect("writer", settings=settings) as w, Agent.connect("reader", settings=settings) as r:
        wb = w.board(unique)
        await wb.put("tasks", "t1", "one")
        await wb.put("tasks", "t2", "two")
        await wb.put("other", "x", "not in view")
        view = await r.board(unique).view("tasks")
        assert view.snapshot() == {("tasks", "t1"): "one", ("tasks", "t2"): "two"}
        rev = await wb.put("tasks", "t3", "three")
        await wb.delete("tasks", "t1")
        await view.wait_for(lambda v: ("tasks", "t3") in v and ("tasks", "t1") not in v, timeout=5)
        assert view.get("tasks", "t3").revision == rev  # type: ignore[union-attr]
        assert view.keys() == [("tasks", "t2"), ("tasks", "t3")]
        await view.close()


async def test_view_reads_own_writes_immediately(settings: Settings, unique: str) -> None:
    async with Agent.connect("me", settings=settings) as agent:
        board = agent.board(unique)
        async with board.view() as view:
            for i in range(50):
                rev = await board.put("s", f"k{i}", i)
                entry = view.get("s", f"k{i}")
                assert entry is not None and entry.revision == rev and entry.value == i
            await board.delete("s", "k0")
            assert ("s", "k0") not in view
            await asyncio.sleep(0.2)  # the watch echoes of our own writes are ignored
            assert len(view) == 49


async def test_view_callbacks_and_async_iteration(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as w, Agent.connect("r", settings=settings) as r:
        view = await r.board(unique).view("s")
        seen: list[Change] = []
        view.on_change(seen.append)
        received: list[Change] = []

        async def consume() -> None:
            async for change in view.changes():
                received.append(change)
                if len(received) == 3:
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        await w.board(unique).put("s", "a", 1)
        await w.board(unique).put("s", "b", 2)
        await w.board(unique).delete("s", "a")
        await asyncio.wait_for(task, 5)
        assert [c.operation for c in received] == [Operation.PUT, Operation.PUT, Operation.DELETE]
        assert [c.revision for c in seen] == [c.revision for c in received]
        await view.close()


async def test_view_drops_entries_when_their_ttl_expires(settings: Settings, unique: str) -> None:
    """No expiry markers (the default): each view removes an entry at its stored time plus its
    TTL and tells its listeners with a PURGE change at the expired revision; a key written
    again without TTL stays. One timer per view: many expiring entries start no task each."""
    async with Agent.connect("w", settings=settings) as w, Agent.connect("r", settings=settings) as r:
        wb = w.board(unique)
        early = await wb.put("s", "early", 1, ttl=1)
        await wb.put("s", "rewritten", 1, ttl=1)
        view = await r.board(unique).view("s")  # the snapshot carries the TTLs too
        own = await wb.view("s")
        removed: list[Change] = []
        view.on_change(lambda c: removed.append(c) if c.operation is not Operation.PUT else None)
        tasks = len(asyncio.all_tasks())
        late = {await wb.put("s", f"late{i}", i, ttl=2) for i in range(50)}
        await wb.put("s", "rewritten", 2)  # its latest revision has no TTL: it stays
        await wb.put("s", "durable", 3)
        await view.wait_for(lambda v: len(v) == 53, timeout=5)
        assert len(asyncio.all_tasks()) - tasks < 5
        await view.wait_for(lambda v: ("s", "early") not in v, timeout=5)
        assert len(view) == 52  # the others expire a second later
        await view.wait_for(lambda v: v.keys() == [("s", "durable"), ("s", "rewritten")], timeout=5)
        await own.wait_for(lambda v: v.keys() == [("s", "durable"), ("s", "rewritten")], timeout=5)
        assert view.value("s", "rewritten") == 2
        assert {c.operation for c in removed} == {Operation.PURGE}
        assert [c.revision for c in removed] == [early, *sorted(late)]  # the expired revisions, in order
        await view.close()
        await own.close()


@pytest.mark.slow
async def test_view_converges_after_server_restart(nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = await asyncio.to_thread(nats_factory)  # the factory sets the streams up with a loop of its own
    settings = make_settings(server.url)
    async with Agent.connect("w", settings=settings) as w, Agent.connect("r", settings=settings) as r:
        wb = w.board("restart-view")
        for i in range(10):
            await wb.put("s", f"k{i}", i)
        view = await r.board("restart-view").view()
        applied: list[int] = []
        view.on_change(lambda c: applied.append(c.revision))
        server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
        for i in range(10, 20):
            await wb.put("s", f"k{i}", i)
        await wb.delete("s", "k0")
        await wb.put("s", "k1", "changed")
        await view.wait_for(lambda v: len(v) == 19 and v.value("s", "k1") == "changed", timeout=20)
        expected = {("s", f"k{i}"): i for i in range(1, 20)} | {("s", "k1"): "changed"}
        assert view.snapshot() == expected
        assert len(applied) == len(set(applied))  # no change applied twice
        assert applied == sorted(applied)
        await view.close()


async def test_close_during_a_change_callback_whose_cancel_is_lost_returns(settings: Settings, unique: str) -> None:
    """Python 3.11's ``asyncio.wait_for`` (under nats-py's requests, e.g. a board read in a
    change callback) returns an answer that is ready instead of raising a cancel that arrives
    at the same time. close() must still return, and the view follow nothing after it."""
    async with Agent.connect("w", settings=settings) as w, Agent.connect("r", settings=settings) as r:
        view = await r.board(unique).view("s")
        callback = LostCancel()  # a request "answered" while close() cancels
        view.on_change(callback)
        await w.board(unique).put("s", "k1", 1)
        await asyncio.wait_for(callback.entered.wait(), 10)
        await asyncio.wait_for(view.close(), 5)
        await w.board(unique).put("s", "k2", 2)
        await asyncio.sleep(0.5)
        assert callback.calls == 1 and ("s", "k2") not in view
