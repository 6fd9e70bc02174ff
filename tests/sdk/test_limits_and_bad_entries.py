"""Limits that speak, and readers isolated from bad entries (issue 18, build items 2 and 4;
findings 4 and 5).

* At the server's consumer limit, views, watches and inboxes fail with one typed error,
  ``ConsumerLimitError``, naming the limit and the setting that raises it (before: nats-py's
  ``BadRequestError`` for a view, ``TransportError`` for an inbox).
* Closed views and watches leave their consumers to the server, which removes them after their
  inactivity threshold (``INACTIVE_THRESHOLD``, 5 s): an agent has no right to delete consumers
  (issue 19). Issue 18 had them deleted at once.
* ``Agent.close()`` with the server gone raises nothing of nats-py's (before:
  ``ConnectionReconnectingError``).
* A view or watch never dies because of one entry: undecodable entries are skipped and
  counted (``watch.skipped``, ``view.skipped``), failing callbacks counted
  (``view.callback_errors``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from nats.js import JetStreamContext

from agents_sdk import Agent, Change, ConsumerLimitError, TransportError, View, Watch
from blackboard.client.connection import connect_nats
from blackboard.client.consumers import INACTIVE_THRESHOLD
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.settings import Settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


def _own_bucket(settings: Settings, unique: str) -> Settings:
    """``settings`` with a board bucket of the test's own (its stream's consumers are the test's)."""
    return settings.model_copy(update={"board": settings.board.model_copy(update={"bucket": f"b{unique}"})})


async def _set_max_consumers(js: JetStreamContext, stream: str, limit: int) -> None:
    config = (await js.stream_info(stream)).config
    config.max_consumers = limit
    await js.update_stream(config)


async def _consumers(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.consumer_count)


async def _count_reaches(js: JetStreamContext, stream: str, want: int, within: float) -> int:
    """The stream's consumer count once it is ``want``, or the last count after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        count = await _consumers(js, stream)
        if count == want or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.02)


async def test_views_watches_and_inboxes_at_the_consumer_limit_raise_one_typed_error(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()  # private: the message stream's limit is lowered
    s = make_settings(server.url)
    nc = await connect_nats(s.nats, name="limits")
    js = nc.jetstream()
    await ensure_streams(js, s)
    kv = Subjects(s.board.bucket).kv_stream
    await _set_max_consumers(js, kv, 2)
    await _set_max_consumers(js, MESSAGE_STREAM, 2)
    try:
        async with Agent.connect("viewer", settings=s) as agent:
            board = agent.board("limited")
            first, second = await board.view(), await board.view()
            with pytest.raises(ConsumerLimitError) as raised:
                await board.view()
            err = raised.value
            assert isinstance(err, TransportError)
            assert (err.stream, err.limit) == (kv, 2)
            assert "max_consumers" in err.setting and kv in err.setting
            assert "2 consumers" in str(err)
            with pytest.raises(ConsumerLimitError) as raised:
                await board.watch().start()
            assert (raised.value.stream, raised.value.limit) == (kv, 2)
            # Closing a view frees its consumer once the server removes it (its inactivity
            # threshold): then a new one fits.
            await first.close()
            assert await _count_reaches(js, kv, 1, within=INACTIVE_THRESHOLD + 3) == 1
            third = await board.view()
            await second.close()
            await third.close()
        for name in ("a1", "a2"):
            async with Agent.connect(name, settings=s) as agent:
                await agent.inbox().open()  # a durable consumer each, kept after close
        async with Agent.connect("a3", settings=s) as agent:
            with pytest.raises(ConsumerLimitError) as raised:
                await agent.inbox().open()
            assert (raised.value.stream, raised.value.limit) == (MESSAGE_STREAM, 2)
            assert "max_consumers" in raised.value.setting
    finally:
        await nc.close()


async def test_closed_views_and_watches_consumers_are_removed_after_the_inactive_threshold(
        settings: Settings, unique: str) -> None:
    s = _own_bucket(settings, unique)
    nc = await connect_nats(s.nats, name="count")
    js = nc.jetstream()
    kv = Subjects(s.board.bucket).kv_stream
    try:
        async with Agent.connect("counter", settings=s) as agent:
            board = agent.board(unique)
            await board.put("s", "k", 1)
            views: list[View] = [await board.view() for _ in range(10)]
            watches: list[Watch] = []
            for _ in range(10):
                watch = board.watch(start="current")
                await watch.start()
                watches.append(watch)
            assert await _consumers(js, kv) == 20
            for view in views:
                await view.close()
            for watch in watches:
                await watch.stop()
            # Not deleted by the close (an agent may not): the server removes each once nobody
            # has listened on its deliver subject for INACTIVE_THRESHOLD seconds.
            closed = time.monotonic()
            assert await _count_reaches(js, kv, 0, within=INACTIVE_THRESHOLD + 3) == 0
            assert time.monotonic() - closed >= INACTIVE_THRESHOLD - 1
    finally:
        await nc.close()


async def test_agent_close_with_the_server_gone_raises_nothing_of_nats(
        nats_factory: Callable[[], EmbeddedNats], unique: str) -> None:
    server = nats_factory()
    s = make_settings(server.url)
    agent = await Agent.connect("leaver", settings=s)
    board = agent.board(unique)
    await board.put("s", "k", 1)
    await board.view()
    await board.watch(start="current").start()
    await agent.inbox().open()
    server.stop()
    for _ in range(500):  # until the client noticed (it reconnects: drain is refused then)
        if agent.nc.is_reconnecting:
            break
        await asyncio.sleep(0.01)
    assert agent.nc.is_reconnecting
    await asyncio.wait_for(agent.close(), 15)  # raised nats.errors.ConnectionReconnectingError
    assert agent.nc.is_closed


async def test_a_view_and_a_watch_skip_and_count_entries_they_cannot_decode(settings: Settings,
                                                                            unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    nc = await connect_nats(settings.nats, name="bad-entries")
    js = nc.jetstream()
    try:
        async with Agent.connect("reader", settings=settings) as agent:
            board = agent.board(unique)
            await board.put("s", "before", 1)
            view = await board.view()
            watch = board.watch(start="current")
            await watch.start()
            failures = 0

            def failing(change: Change) -> None:
                nonlocal failures
                failures += 1
                raise RuntimeError("a faulty callback")

            view.on_change(failing)
            # Not msgpack; JSON nested past any parser's depth (written around the SDK).
            await js.publish(subjects.entry(unique, "s", "bad1"), b"\xc1")
            await js.publish(subjects.entry(unique, "s", "bad2"), ("[" * 5000 + "]" * 5000).encode(),
                             headers={"Bb-Encoding": "json"})
            await js.publish(subjects.entry(unique, "s", "bad3"), json.dumps({"v": 1, "value": "x",
                             "created_at": "not a time"}).encode(), headers={"Bb-Encoding": "json"})
            rev = await board.put("s", "after", 2)
            await view.wait_for(lambda v: ("s", "after") in v, timeout=5)
            assert view.keys() == [("s", "after"), ("s", "before")]
            assert view.skipped == 3
            assert view.callback_errors == failures == 1  # the view went on after it
            changes = [await watch.next(timeout=5) for _ in range(2)]
            assert [(c.entry.key, c.entry.revision) for c in changes][-1] == ("after", rev)
            assert watch.skipped == 3
            await watch.stop()
    finally:
        await nc.close()
