"""Limits that speak, and readers isolated from bad entries (issue 18, build items 2 and 4;
findings 4 and 5).

* At the server's consumer limit, views, watches and inboxes fail with one typed error,
  ``ConsumerLimitError``, naming the setting that raises it (before: nats-py's
  ``BadRequestError`` for a view, ``TransportError`` for an inbox), and the limit when it is
  the account's: an agent may not read a stream's configuration (issue 19).
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

import nats.errors
import pytest
from nats.js import JetStreamContext, api

from agents_sdk import Agent, Change, ConsumerLimitError, TransportError, View, Watch
from blackboard.client.connection import connect_nats, permission_violations
from blackboard.client.consumers import INACTIVE_THRESHOLD, consumer_limit_error
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.settings import Settings
from tests._worker_helpers import running_worker, worker_settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def _private_server(nats_factory: Callable[[], EmbeddedNats]) -> EmbeddedNats:
    """A private nats-server (with the session's authorization and streams): its consumers are
    the test's. Started in a thread: the factory sets the streams up with a loop of its own."""
    return await asyncio.to_thread(nats_factory)


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


def _asked_stream_info(agent: Agent, stream: str) -> bool:
    """Whether the server refused the agent a ``$JS.API.STREAM.INFO`` of ``stream`` (no right to)."""
    violations = permission_violations(agent.nc)
    assert violations is not None
    return violations.refused("publish", f"$JS.API.STREAM.INFO.{stream}")


async def test_views_watches_and_inboxes_at_the_consumer_limit_raise_one_typed_error(
        nats_factory: Callable[[], EmbeddedNats], postgres_server: EmbeddedPostgres, unique: str) -> None:
    server = await _private_server(nats_factory)  # private: the streams' limits are lowered
    s = worker_settings(make_settings(server.url, postgres_server.dsn), name=f"w{unique}", batch_wait=0.02)
    nc = await connect_nats(s.nats, name="limits")  # the worker's identity: it may read the streams
    js = nc.jetstream()
    kv = Subjects(s.board.bucket).kv_stream
    try:
        # The system service creates inboxes for agents with a credential (bb.inbox.<agent>).
        async with running_worker(s):
            # The worker's own consumers stay; two more fit on each stream.
            kv_limit = await _consumers(js, kv) + 2
            msg_limit = await _consumers(js, MESSAGE_STREAM) + 2
            await _set_max_consumers(js, kv, kv_limit)
            await _set_max_consumers(js, MESSAGE_STREAM, msg_limit)
            async with Agent.connect("viewer", settings=s) as agent:
                board = agent.board("limited")
                first, second = await board.view(), await board.view()
                with pytest.raises(ConsumerLimitError) as raised:
                    await board.view()
                err = raised.value
                assert isinstance(err, TransportError)
                # The refusal does not give the stream's limit, and an agent may not read the
                # stream's configuration: the error names the setting, not its value.
                assert (err.stream, err.limit) == (kv, None)
                assert err.setting == f"the max_consumers of stream {kv}"
                assert "limit of consumers" in str(err) and "max_consumers" in str(err)
                with pytest.raises(ConsumerLimitError) as raised:
                    await board.watch().start()
                assert (raised.value.stream, raised.value.limit) == (kv, None)
                assert not _asked_stream_info(agent, kv)
                # Closing a view frees its consumer once the server removes it (its inactivity
                # threshold): then a new one fits.
                await first.close()
                assert await _count_reaches(js, kv, kv_limit - 1, within=INACTIVE_THRESHOLD + 3) == kv_limit - 1
                third = await board.view()
                await second.close()
                await third.close()
            for name in ("a1", "a2"):
                async with Agent.connect(name, settings=s) as agent:
                    await agent.inbox().open()  # a durable consumer each, kept after close
            async with Agent.connect("a3", settings=s) as agent:
                with pytest.raises(ConsumerLimitError) as raised:
                    await agent.inbox().open()
                assert raised.value.stream == MESSAGE_STREAM
                assert "max_consumers" in raised.value.setting
                assert not _asked_stream_info(agent, MESSAGE_STREAM)
    finally:
        await nc.close()


async def test_consumer_limit_error_names_the_account_limit_when_it_is_reached() -> None:
    """The account's JetStream info ($JS.API.INFO, every identity's right) tells a reached account
    limit, with its value; otherwise the stream's setting is named, its value unknown."""

    class _Js:
        def __init__(self, info: dict[str, object]) -> None:
            self.info = info

        async def account_info(self) -> api.AccountInfo:
            return api.AccountInfo.from_response(dict(self.info))

    def info(consumers: int, limit: int) -> dict[str, object]:
        return {"memory": 0, "storage": 0, "streams": 3, "consumers": consumers,
                "limits": {"max_memory": -1, "max_storage": -1, "max_streams": -1, "max_consumers": limit,
                           "max_ack_pending": -1, "memory_max_stream_bytes": -1,
                           "storage_max_stream_bytes": -1, "max_bytes_required": False},
                "api": {"total": 1, "errors": 0}}

    reached = await consumer_limit_error(_Js(info(7, 7)), "KV_x", "open a view")  # type: ignore[arg-type]
    assert (reached.limit, reached.setting) == (7, "the account's JetStream max_consumers")
    assert "limit of 7 consumers" in str(reached) and "open a view" in str(reached)
    stream = await consumer_limit_error(_Js(info(3, -1)), "KV_x", "open a view")  # type: ignore[arg-type]
    assert (stream.limit, stream.setting) == (None, "the max_consumers of stream KV_x")

    class _Silent:
        async def account_info(self) -> api.AccountInfo:
            raise nats.errors.TimeoutError

    unknown = await consumer_limit_error(_Silent(), "KV_x", "open a view")  # type: ignore[arg-type]
    assert unknown.limit is None and "KV_x" in unknown.setting and "account" in unknown.setting


async def test_closed_views_and_watches_consumers_are_removed_after_the_inactive_threshold(
        nats_factory: Callable[[], EmbeddedNats], unique: str) -> None:
    server = await _private_server(nats_factory)  # private: the stream's consumers are the test's
    s = make_settings(server.url)
    nc = await connect_nats(s.nats, name="count")
    js = nc.jetstream()
    kv = Subjects(s.board.bucket).kv_stream
    try:
        async with Agent.connect("counter", settings=s) as agent:
            board = agent.board(unique)
            await board.put("s", "k", 1)
            before = await _consumers(js, kv)
            views: list[View] = [await board.view() for _ in range(10)]
            watches: list[Watch] = []
            for _ in range(10):
                watch = board.watch(start="current")
                await watch.start()
                watches.append(watch)
            assert await _consumers(js, kv) == before + 20
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
        nats_factory: Callable[[], EmbeddedNats], postgres_server: EmbeddedPostgres, unique: str) -> None:
    server = await _private_server(nats_factory)
    s = worker_settings(make_settings(server.url, postgres_server.dsn), name=f"w{unique}", batch_wait=0.02)
    agent = await Agent.connect("leaver", settings=s)
    board = agent.board(unique)
    await board.put("s", "k", 1)
    await board.view()
    await board.watch(start="current").start()
    async with running_worker(s):  # the system service creates the inbox consumer
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
