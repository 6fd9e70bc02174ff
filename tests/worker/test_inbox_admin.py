"""Inbox administration (``bb.inbox.<agent>``): the system service creates and changes agents'
inbox consumers, checking every filter against the agent's rights (issue 19).

Against the unauthenticated test server: the agent is whoever the subject
names (the server's permissions bind it under authorization, tests/security).
The SDK's end-to-end tests run its messaging with ``insecure_open_bus`` off, so
every inbox change goes through the service.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js import api

from agents_sdk.messaging.inbox import InboxConsumer, Message
from agents_sdk.messaging.messenger import Messenger
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidKeyError, NoResponderError, PermissionDeniedError
from blackboard.protocol.schemas.inbox import InboxReply
from blackboard.protocol.subjects import MESSAGE_STREAM, Header, Subjects
from blackboard.security.policy import AccessPolicy, Right, Rights
from blackboard.settings import Settings
from blackboard.worker.inbox_admin import InboxAdmin, check_filter, wanted_grants
from tests.conftest import make_settings

READ = frozenset({Right.READ})


def _rights(principal: str = "alice") -> Rights:
    return Rights(principal, "agent", {"open": READ, "both": frozenset(Right)}, ("ops.>", "alerts.*"))


# ------------------------------------------------------------------ pure
@pytest.mark.parametrize("subject", [
    Subjects.direct("alice"), Subjects.broadcast("open"), Subjects.broadcast("both"), Subjects.topic("ops.>"),
    Subjects.topic("ops.deploy.failed"), Subjects.topic("alerts.disk"), Subjects.topic("alerts.*"),
])
def test_filters_within_the_rights_pass(subject: str) -> None:
    check_filter(_rights(), subject)


@pytest.mark.parametrize("subject", [
    Subjects.direct("bob"),  # someone else's direct messages
    Subjects.broadcast("secret"),  # a board it may not read
    Subjects.topic("secret.>"), Subjects.topic(">"), Subjects.topic("alerts.>"),  # beyond its topic patterns
])
def test_filters_outside_the_rights_are_refused(subject: str) -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        check_filter(_rights(), subject)
    assert caught.value.operation == f"inbox filter {subject}"


@pytest.mark.parametrize("subject", [
    "bb.msg.>", "bb.msg.agent.*", "bb.msg.board.*", "bb.msg.agent.alice.x", "bb.vote.open.>", "bb.msg.topic",
    "$JS.API.>", "",
])
def test_filters_that_are_not_one_agent_board_or_topic_are_invalid(subject: str) -> None:
    with pytest.raises(InvalidKeyError):
        check_filter(Rights("root", "worker"), subject)


def test_a_system_principal_may_hold_any_board_and_topic() -> None:
    system = Rights("w1", "worker")
    check_filter(system, Subjects.broadcast("anything"))
    check_filter(system, Subjects.topic(">"))
    with pytest.raises(PermissionDeniedError):  # its own direct subject only, still
        check_filter(system, Subjects.direct("alice"))


def test_wanted_grants_fill_in_from_now_and_keep_existing_starts() -> None:
    direct, board, topic = Subjects.direct("alice"), Subjects.broadcast("open"), Subjects.topic("ops.>")
    current = {direct: 0, board: 7}
    assert wanted_grants("alice", {board: None, topic: None}, current, 42) == {direct: 0, board: 7, topic: 42}
    assert wanted_grants("alice", {direct: 3, topic: 5}, current, 42) == {direct: 3, topic: 5}
    assert wanted_grants("alice", {}, {}, 9) == {direct: 0}


# ------------------------------------------------------------------ against nats-server
@dataclass
class Bus:
    nc: NATS
    settings: Settings  # insecure_open_bus off: the SDK asks the service
    admin: InboxAdmin
    tag: str
    alice: str
    bob: str
    a: str  # alice may read
    b: str  # alice may not

    def agent(self, name: str) -> str:
        """A fresh agent with alice's rights (the policy declares ``alice<tag>*``)."""
        return f"{self.alice}-{name}"

    def messenger(self, agent: str, nc: NATS | None = None) -> Messenger:
        return Messenger(agent, nc or self.nc, self.settings)

    async def ask(self, agent: str, grants: dict[str, Any], **fields: Any) -> tuple[dict[str, str], Any]:
        msg = await self.nc.request(Subjects.inbox_admin(agent), codec.encode({"v": 1, "grants": grants, **fields}),
                                    timeout=5)
        return dict(msg.headers or {}), codec.decode(msg.data, codec.encoding_of(msg.headers))


@pytest_asyncio.fixture(scope="module")
async def bus(stack_dir: Path) -> AsyncIterator[Bus]:
    # A private server without authorization: the session server's own system service
    # answers bb.inbox.* with the test policy, which would race this module's admin.
    nats_server = EmbeddedNats(stack_dir / f"inbox-admin-{uuid.uuid4().hex[:8]}", port=0)
    nats_server.start()
    tag = uuid.uuid4().hex[:10]
    alice, bob, a, b = f"alice{tag}", f"bob{tag}", f"ia{tag}", f"ib{tag}"
    policy = AccessPolicy.parse(f"""
version = 1
[agents."{alice}*"]
boards = {{ "{a}" = ["read"] }}
topics = ["ops{tag}.>"]
[agents.{bob}]
boards = {{ "{b}" = ["read", "write"] }}
""")
    s = make_settings(nats_server.url)
    s = s.model_copy(update={"nats": s.nats.model_copy(update={"insecure_open_bus": False, "creds_file": None,
                                                                 "tls_ca_file": None})})
    open_bus = s.model_copy(update={"nats": s.nats.model_copy(update={"insecure_open_bus": True})})
    nc = await connect_nats(open_bus.nats, name="test-inbox-admin")  # (the test server has no authorization)
    await ensure_streams(nc.jetstream(), open_bus)
    try:
        async with InboxAdmin(nc, s, rights=policy) as admin:
            yield Bus(nc, s, admin, tag, alice, bob, a, b)
    finally:
        await nc.close()
        nats_server.stop()


async def _consumer(nc: NATS, agent: str) -> api.ConsumerInfo | None:
    try:
        return await nc.jetstream().consumer_info(MESSAGE_STREAM, Subjects.inbox_consumer(agent))
    except Exception:
        return None


async def _take(m: Messenger, n: int, *, ack: bool = True, timeout: float = 5.0) -> list[Message]:
    out: list[Message] = []
    async for msg in m.inbox(limit=n, timeout=timeout):
        out.append(msg)
        if ack:
            await msg.ack()
    assert len(out) == n, f"expected {n} messages, got {out}"
    return out


@pytest.mark.asyncio
async def test_the_service_creates_an_inbox_with_the_grants_it_may_hold(bus: Bus) -> None:
    agent = bus.agent("created")
    last = int((await bus.nc.jetstream().stream_info(MESSAGE_STREAM)).state.last_seq)
    direct, board, topic = Subjects.direct(agent), Subjects.broadcast(bus.a), Subjects.topic(f"ops{bus.tag}.>")
    headers, body = await bus.ask(agent, {direct: 0, board: None, topic: 3})
    assert Header.ERROR.value not in headers, body
    reply = InboxReply.model_validate(body)
    assert reply.consumer == Subjects.inbox_consumer(agent)
    assert reply.grants[direct] == 0 and reply.grants[board] >= last and reply.grants[topic] == 3
    info = await _consumer(bus.nc, agent)
    assert info is not None and sorted(info.config.filter_subjects or []) == sorted([direct, board, topic])
    assert info.config.ack_policy == api.AckPolicy.EXPLICIT


@pytest.mark.asyncio
@pytest.mark.parametrize("which", ["someone else's direct subject", "an unreadable board", "a foreign topic"])
async def test_one_filter_outside_the_rights_refuses_the_whole_request(bus: Bus, which: str) -> None:
    bad = {"someone else's direct subject": Subjects.direct(bus.bob),
           "an unreadable board": Subjects.broadcast(bus.b),
           "a foreign topic": Subjects.topic(f"secret{bus.tag}.>")}[which]
    agent = bus.agent("refused")
    await bus.ask(agent, {Subjects.direct(agent): 0})
    before = await _consumer(bus.nc, agent)
    assert before is not None
    headers, body = await bus.ask(agent, {Subjects.direct(agent): 0, Subjects.broadcast(bus.a): None, bad: None})
    assert headers[Header.ERROR.value] == "PermissionDeniedError"
    assert headers[Header.SERVICE_ERROR_CODE.value] == "403"
    assert body["key"] == f"inbox filter {bad}"
    after = await _consumer(bus.nc, agent)  # untouched
    assert after is not None and after.config.filter_subjects == before.config.filter_subjects
    assert after.config.metadata == before.config.metadata
    fresh = bus.agent(f"refused{len(which)}")
    headers, _ = await bus.ask(fresh, {Subjects.direct(fresh): 0, bad: None})
    assert headers[Header.ERROR.value] == "PermissionDeniedError"
    assert await _consumer(bus.nc, fresh) is None  # not created either


@pytest.mark.asyncio
async def test_an_undeclared_agent_and_an_invalid_filter_are_refused(bus: Bus) -> None:
    stranger = f"mallory{bus.tag}"
    headers, _ = await bus.ask(stranger, {Subjects.direct(stranger): 0})
    assert headers[Header.ERROR.value] == "PermissionDeniedError"
    assert await _consumer(bus.nc, stranger) is None
    headers, _ = await bus.ask(bus.agent("invalid"), {"bb.msg.>": 0})
    assert headers[Header.ERROR.value] == "InvalidKeyError"
    assert headers[Header.SERVICE_ERROR_CODE.value] == "400"


@pytest.mark.asyncio
async def test_the_sdk_inbox_works_end_to_end_through_the_service(bus: Bus, nats_server: EmbeddedNats) -> None:
    alice, bob = bus.agent("e2e"), bus.bob
    before = bus.admin.answered
    me = bus.messenger(alice)
    assert await me.subscriptions() is not None  # creates the inbox through the service
    await me.join(bus.a)
    await me.subscribe(f"ops{bus.tag}.>")
    subs = await me.subscriptions()
    assert subs.boards == (bus.a,) and subs.topics == (f"ops{bus.tag}.>",)
    assert bus.admin.answered >= before + 3
    sender = bus.messenger(bob)
    await sender.send(alice, "direct", 1)
    await sender.broadcast(bus.a, "broadcast", 2)
    await sender.publish(f"ops{bus.tag}.deploy", "topic", 3)
    await sender.publish(f"other{bus.tag}.deploy", "topic", 4)  # not subscribed
    got = await _take(me, 3)
    assert [(m.kind, m.body) for m in got] == [("direct", 1), ("broadcast", 2), ("topic", 3)]
    await sender.send(alice, "direct", 5)
    [unacked] = await _take(me, 1, ack=False)
    await me.close()
    # Durable across a reconnect: a new connection and messenger find the grants and the unacked message.
    nc2 = await connect_nats(bus.settings.nats.model_copy(update={"insecure_open_bus": True}), name="alice-again")
    try:
        again = bus.messenger(alice, nc2)
        assert (await again.subscriptions()).boards == (bus.a,)
        await sender.broadcast(bus.a, "broadcast", 6)
        got = await _take(again, 2)
        assert [m.body for m in got] == [5, 6] and got[0].id == unacked.id
        await again.leave(bus.a)
        await again.unsubscribe(f"ops{bus.tag}.>")
        assert await again.subscriptions() == type(subs)(boards=(), topics=())
        await again.close()
    finally:
        await nc2.close()
        await sender.close()


@pytest.mark.asyncio
async def test_the_sdk_gets_permission_denied_for_a_board_it_may_not_read(bus: Bus) -> None:
    me = bus.messenger(bus.agent("denied"))
    try:
        with pytest.raises(PermissionDeniedError, match=bus.b):
            await me.join(bus.b)
        with pytest.raises(PermissionDeniedError):
            await me.subscribe(f"secret{bus.tag}.>")
        assert bus.b not in (await me.subscriptions()).boards
    finally:
        await me.close()


@pytest.mark.asyncio
async def test_without_a_system_service_the_sdk_says_a_worker_must_run(
        nats_factory: Callable[[], EmbeddedNats], unique: str) -> None:
    server = nats_factory()
    s = make_settings(server.url)
    s = s.model_copy(update={"nats": s.nats.model_copy(update={"insecure_open_bus": False})})
    open_bus = s.nats.model_copy(update={"insecure_open_bus": True})
    nc = await connect_nats(open_bus, name="no-admin")
    try:
        await ensure_streams(nc.jetstream(), s.model_copy(update={"nats": open_bus}))
        consumer = InboxConsumer(nc, nc.jetstream(), s, unique)
        with pytest.raises(NoResponderError, match="worker must run"):
            await consumer.ensure()
        # On an open bus the SDK manages its own inbox when no service answers.
        own = InboxConsumer(nc, nc.jetstream(), s.model_copy(update={"nats": open_bus}), unique)
        assert (await own.ensure()).grants == {Subjects.direct(unique): 0}
        assert (await own.add(Subjects.broadcast("anyboard"))).keys() == {Subjects.direct(unique),
                                                                           Subjects.broadcast("anyboard")}
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_on_an_open_bus_the_sdk_uses_the_service_when_one_answers(bus: Bus) -> None:
    agent = bus.agent("open")
    open_bus = bus.settings.model_copy(update={"nats": bus.settings.nats.model_copy(
        update={"insecure_open_bus": True})})
    me = Messenger(agent, bus.nc, open_bus)
    before = bus.admin.answered
    try:
        with pytest.raises(PermissionDeniedError):  # the service's rights still apply
            await me.join(bus.b)
        await me.join(bus.a)  # (creating the inbox and joining: two requests)
        assert bus.admin.answered == before + 2 and await _consumer(bus.nc, agent) is not None
    finally:
        await me.close()


@pytest.mark.asyncio
async def test_rewind_recreates_the_inbox_above_its_ack_floor(bus: Bus) -> None:
    # For servers before 2.14 (no CONSUMER.RESET), which agents cannot use: the service re-creates
    # the consumer just above its ack floor, so what an earlier reader left unacknowledged comes again.
    agent = bus.agent("rewind")
    sender = bus.messenger(bus.bob)
    try:
        headers, _ = await bus.ask(agent, {Subjects.direct(agent): 0})
        assert Header.ERROR.value not in headers
        m = bus.messenger(agent)
        await _drain(m)
        for i in range(3):
            await sender.send(agent, "job", i)
        first = await _take(m, 2, ack=False)
        await first[0].ack(wait=True)
        await m.close()
        info = await _consumer(bus.nc, agent)
        assert info is not None and info.num_ack_pending == 2  # 1 yielded, 2 fetched: neither acked
        headers, body = await bus.ask(agent, {Subjects.direct(agent): 0}, rewind=True)
        assert Header.ERROR.value not in headers, body
        reply = InboxReply.model_validate(body)
        assert reply.num_ack_pending == 0 and reply.num_pending == 2 and not reply.created
        m = bus.messenger(agent)
        again = await _take(m, 2)
        assert [x.body for x in again] == [1, 2] and again[0].id == first[1].id
        await m.close()
    finally:
        await sender.close()


async def _drain(m: Messenger) -> None:
    async for msg in m.inbox(timeout=0.3):
        await msg.ack()
