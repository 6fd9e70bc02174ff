"""The ordered follower under watches and vote following: start positions,
readiness, callback errors and the errors of a failed start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import nats
import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from blackboard.client.consumers import INACTIVE_THRESHOLD
from blackboard.client.follower import OrderedFollower, deliver_policy, start_error
from blackboard.client.streams import ensure_streams
from blackboard.protocol.errors import ConfigurationError, NotConnectedError, TransportError
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests._lost_cancel import lose_a_cancel


# ------------------------------------------------------------------- pure
def test_start_positions_map_to_deliver_policies() -> None:
    assert deliver_policy("new") == (api.DeliverPolicy.NEW, None)
    assert deliver_policy("current") == (api.DeliverPolicy.LAST_PER_SUBJECT, None)
    assert deliver_policy("all") == (api.DeliverPolicy.ALL, None)
    assert deliver_policy("new", 7) == (api.DeliverPolicy.BY_START_SEQUENCE, 7)
    assert deliver_policy("all", 0) == (api.DeliverPolicy.BY_START_SEQUENCE, 1)
    with pytest.raises(ValueError, match="start position"):
        deliver_policy("latest")  # type: ignore[arg-type]


def test_start_errors_map_to_our_error_classes() -> None:
    closed = start_error(nats.errors.ConnectionClosedError(), "S", "follow x")
    assert isinstance(closed, NotConnectedError)
    timeout = start_error(nats.errors.TimeoutError(), "S", "follow x")
    assert isinstance(timeout, NotConnectedError) and "cannot follow x" in str(timeout)
    missing = start_error(nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found"),
                          "KV_gone", "follow x")
    assert isinstance(missing, ConfigurationError) and "KV_gone" in str(missing)
    refused = start_error(nats.js.errors.BadRequestError(code=400, err_code=10084, description="bad filter"),
                          "S", "follow x")
    assert isinstance(refused, TransportError) and not isinstance(refused, NotConnectedError)
    assert "bad filter" in str(refused) and "10084" in str(refused)


# ------------------------------------------------------------ real server
@pytest_asyncio.fixture
async def nc(settings: Settings) -> AsyncIterator[NATS]:
    conn = await operator_nats(settings.nats.url)
    await ensure_streams(conn.jetstream(), settings)
    try:
        yield conn
    finally:
        await conn.close()


class Seen:
    """Collects (subject, payload, stream sequence) of delivered messages."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.items: list[tuple[str, bytes, int]] = []
        self.fail_on = fail_on
        self.changed = asyncio.Event()

    def __call__(self, msg: Msg) -> None:
        if msg.data == self.fail_on:
            raise RuntimeError("bad message")
        self.items.append((msg.subject, msg.data, msg.metadata.sequence.stream))
        self.changed.set()

    async def until(self, n: int, timeout: float = 5.0) -> None:
        async def wait() -> None:
            while len(self.items) < n:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), timeout)

    @property
    def payloads(self) -> list[bytes]:
        return [data for _, data, _ in self.items]


async def _write(nc: NATS, subject: str, data: bytes) -> int:
    return int((await nc.jetstream().publish(subject, data)).seq)


def _follower(nc: NATS, settings: Settings, filter_subject: str, seen: Seen, **kwargs: object) -> OrderedFollower:
    stream = Subjects(settings.board.bucket).kv_stream
    return OrderedFollower(nc.jetstream(), stream, filter_subject, seen, nc=nc, **kwargs)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_all_replays_in_order_and_is_ready_after_the_stored_ones(
        nc: NATS, settings: Settings, unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    revs = [await _write(nc, subjects.entry(unique, "s", k), v) for k, v in
            [("a", b"a1"), ("b", b"b1"), ("a", b"a2")]]
    seen = Seen()
    readied: list[int] = []
    follower = _follower(nc, settings, subjects.entry_filter(unique), seen,
                         on_ready=lambda: readied.append(len(seen.items)))
    async with follower:
        assert follower.started
        await asyncio.wait_for(follower.ready.wait(), 5)
        # ready (and on_ready, once) only after every stored message went through the callback
        assert readied == [3]
        assert seen.payloads == [b"a1", b"b1", b"a2"]
        assert [seq for *_, seq in seen.items] == revs
        assert follower.last_sequence == revs[-1]
        await _write(nc, subjects.entry(unique, "s", "c"), b"c1")
        await seen.until(4)
        assert seen.payloads[-1] == b"c1"
        assert readied == [3]
    assert not follower.started


@pytest.mark.asyncio
async def test_current_new_and_from_sequence_start_positions(nc: NATS, settings: Settings, unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    scope = subjects.entry_filter(unique)
    first = await _write(nc, subjects.entry(unique, "s", "a"), b"a1")
    await _write(nc, subjects.entry(unique, "s", "b"), b"b1")
    await _write(nc, subjects.entry(unique, "s", "a"), b"a2")

    current = Seen()
    async with _follower(nc, settings, scope, current, start="current") as f:
        await asyncio.wait_for(f.ready.wait(), 5)
        assert sorted(current.payloads) == [b"a2", b"b1"]  # the last of each subject

    replay = Seen()
    async with _follower(nc, settings, scope, replay, start="new", from_sequence=first + 1) as f:
        await asyncio.wait_for(f.ready.wait(), 5)
        assert replay.payloads == [b"b1", b"a2"]  # from_sequence overrides start

    new = Seen()
    async with _follower(nc, settings, scope, new, start="new") as f:
        assert f.ready.is_set()  # nothing stored before counts: ready at once
        await _write(nc, subjects.entry(unique, "s", "b"), b"b2")
        await new.until(1)
        assert new.payloads == [b"b2"]


@pytest.mark.asyncio
async def test_empty_scope_is_ready_at_once(nc: NATS, settings: Settings, unique: str) -> None:
    async with _follower(nc, settings, Subjects(settings.board.bucket).entry_filter(unique), Seen()) as f:
        await asyncio.wait_for(f.ready.wait(), 5)
        assert f.last_sequence == 0


@pytest.mark.asyncio
async def test_a_failing_callback_loses_only_its_message(nc: NATS, settings: Settings, unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    for v in (b"1", b"bad", b"3"):
        await _write(nc, subjects.entry(unique, "s", "k"), v)
    seen = Seen(fail_on=b"bad")
    async with _follower(nc, settings, subjects.entry_filter(unique), seen) as f:
        await asyncio.wait_for(f.ready.wait(), 5)
        assert seen.payloads == [b"1", b"3"]
        assert isinstance(f.error, RuntimeError)
        await _write(nc, subjects.entry(unique, "s", "k"), b"4")
        await seen.until(3)


@pytest.mark.asyncio
async def test_stop_ends_delivery(nc: NATS, settings: Settings, unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    seen = Seen()
    follower = _follower(nc, settings, subjects.entry_filter(unique), seen, start="new")
    await follower.start()
    await follower.start()  # idempotent: one consumer
    await _write(nc, subjects.entry(unique, "s", "k"), b"1")
    await seen.until(1)
    await follower.stop()
    await follower.stop()
    await _write(nc, subjects.entry(unique, "s", "k"), b"2")
    await nc.flush()
    await asyncio.sleep(0.2)  # a delivery after stop would have arrived by now
    assert seen.payloads == [b"1"]


@pytest.mark.asyncio
async def test_missing_stream_raises_configuration_error_and_stays_unstarted(
        nc: NATS, unique: str) -> None:
    follower = OrderedFollower(nc.jetstream(), f"NO_{unique}", f"{unique}.>", Seen(), nc=nc)
    for _ in range(2):  # a failed start leaves nothing that makes the next one pass
        with pytest.raises(ConfigurationError, match=f"NO_{unique}") as info:
            await follower.start()
        assert isinstance(info.value.__cause__, nats.js.errors.NotFoundError)
        assert not follower.started and not follower.ready.is_set()


@pytest.mark.asyncio
async def test_closed_connection_raises_not_connected(settings: Settings, unique: str) -> None:
    conn = await operator_nats(settings.nats.url)
    js = conn.jetstream()
    await conn.close()
    follower = OrderedFollower(js, Subjects(settings.board.bucket).kv_stream, f"{unique}.>", Seen(), nc=conn)
    with pytest.raises(NotConnectedError):
        await follower.start()
    assert not follower.started


# ------------------------------------------------------- lost deliveries
async def _until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_a_gap_in_consumer_sequences_recreates_the_consumer_after_the_last_handled(
        nc: NATS, settings: Settings, unique: str) -> None:
    """A delivery whose consumer sequence skips one (a message lost on the way) is not
    handed on: a new consumer, with a new name, starts after the last message handled."""
    subjects = Subjects(settings.board.bucket)
    revs = [await _write(nc, subjects.entry(unique, "s", "k"), v) for v in (b"1", b"2")]
    seen = Seen()
    async with _follower(nc, settings, subjects.entry_filter(unique), seen) as f:
        await asyncio.wait_for(f.ready.wait(), 5)
        first = f.consumer
        # A delivery whose consumer sequence is 5 where 3 is next (3 and 4 were lost), handed
        # to the follower's handler as its subscription would (the server refuses a client
        # publish with a $JS.ACK reply, so it cannot be sent for real).
        ack = f"$JS.ACK.{subjects.kv_stream}.{first}.1.{revs[-1] + 10}.5.{time.time_ns()}.0"
        await f._on_delivery(Msg(nc, subject=subjects.entry(unique, "s", "k"), reply=ack, data=b"lost"))
        assert seen.payloads == [b"1", b"2"]  # not handed on
        await _until(lambda: f.created == 2, 5)
        assert f.consumer != first
        third = await _write(nc, subjects.entry(unique, "s", "k"), b"3")
        await seen.until(3)
        await asyncio.sleep(0.2)  # a repeat of 1 or 2 would have come by now
        assert seen.payloads == [b"1", b"2", b"3"]
        assert [seq for *_, seq in seen.items] == [*revs, third]


@pytest.mark.asyncio
async def test_a_consumer_lost_on_the_server_is_recreated_after_missed_heartbeats(
        nc: NATS, settings: Settings, unique: str) -> None:
    subjects = Subjects(settings.board.bucket)
    seen = Seen()
    async with _follower(nc, settings, subjects.entry_filter(unique), seen, start="new") as f:
        await _write(nc, subjects.entry(unique, "s", "k"), b"1")
        await seen.until(1)
        await nc.jetstream().delete_consumer(subjects.kv_stream, f.consumer)  # an admin, or a restart
        written = await _write(nc, subjects.entry(unique, "s", "k"), b"2")  # while no consumer exists
        await seen.until(2, timeout=10)  # two missed heartbeats (2 s), then a new consumer from 2 on
        # The new consumer's first delivery may be handled before the answer to its creation.
        await _until(lambda: f.created == 2, 5)
        assert seen.payloads == [b"1", b"2"] and seen.items[-1][2] == written


@pytest.mark.asyncio
async def test_stop_during_a_re_creation_whose_cancel_is_lost_leaves_nothing_running(
        nc: NATS, settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's ``asyncio.wait_for`` (under nats-py's request) returns an answer that
    is ready instead of raising a cancel that arrives at the same time. A stop() during a
    re-creation must still return, and the consumer created meanwhile must not be followed."""
    from blackboard.client.consumers import create_consumer as real

    answering = asyncio.Event()
    calls = 0

    async def swallowing(*args: object, **kwargs: object) -> api.ConsumerInfo:
        nonlocal calls
        calls += 1
        inner = asyncio.ensure_future(real(*args, **kwargs))  # type: ignore[arg-type]
        if calls == 1:  # the first creation, by start()
            return await inner
        answering.set()
        await lose_a_cancel()  # the server "answers" while stop() cancels
        return await inner

    monkeypatch.setattr("blackboard.client.follower.create_consumer", swallowing)
    subjects = Subjects(settings.board.bucket)
    seen = Seen()
    f = _follower(nc, settings, subjects.entry_filter(unique), seen, start="new")
    await f.start()
    assert f.consumer is not None
    await nc.jetstream().delete_consumer(subjects.kv_stream, f.consumer)
    await asyncio.wait_for(answering.wait(), 10)  # the watchdog is re-creating it
    await asyncio.wait_for(f.stop(), 5)
    assert not f.started
    await _write(nc, subjects.entry(unique, "s", "k"), b"after stop")
    await asyncio.sleep(0.5)
    assert seen.payloads == []  # the consumer created after stop() delivers to nobody
    assert f.created == 1


@pytest.mark.asyncio
async def test_stop_leaves_the_consumer_to_the_servers_inactive_threshold(
        nc: NATS, settings: Settings, unique: str) -> None:
    """An agent may not delete consumers: stop only unsubscribes, and the server removes the
    consumer once nobody listened for INACTIVE_THRESHOLD seconds."""
    subjects = Subjects(settings.board.bucket)
    js = nc.jetstream()
    follower = _follower(nc, settings, subjects.entry_filter(unique), Seen(), start="new")
    await follower.start()
    name = follower.consumer
    assert name is not None
    info = await js.consumer_info(subjects.kv_stream, name)
    assert info.config.inactive_threshold == INACTIVE_THRESHOLD
    assert info.config.filter_subject == subjects.entry_filter(unique)
    await follower.stop()
    await js.consumer_info(subjects.kv_stream, name)  # still there right after stop
    deadline = time.monotonic() + INACTIVE_THRESHOLD + 5
    while True:
        try:
            await js.consumer_info(subjects.kv_stream, name)
        except nats.js.errors.NotFoundError:
            break
        assert time.monotonic() < deadline, "the server did not remove the consumer"
        await asyncio.sleep(0.1)
