"""Agent messages against a real nats-server: inboxes, broadcasts, topics, request/reply."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from agents_sdk import Agent, Message
from blackboard.client.connection import connect_nats
from blackboard.devstack import EmbeddedNats
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    InboxBusyError,
    InvalidKeyError,
    InvalidPayloadError,
    NoHandlerError,
    NoResponderError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
)
from blackboard.protocol.schemas import MessageEnvelope, validate_wire
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.security.source import RightsSource
from blackboard.settings import Settings
from blackboard.worker.inbox_admin import InboxAdmin
from tests._auth import operator_nats
from tests._lost_cancel import LostCancel
from tests._raw_signer import raw_signer
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def drain_inbox(agent: Agent, *, timeout: float = 0.5, ack: bool = True, **kw: Any) -> list[Message]:
    """Everything the inbox yields until ``timeout`` passes without a message."""
    out: list[Message] = []
    async for msg in agent.inbox(timeout=timeout, **kw):
        out.append(msg)
        if ack:
            await msg.ack()
    return out


async def take(agent: Agent, n: int, *, ack: bool = True, timeout: float = 5.0, **kw: Any) -> list[Message]:
    """The next ``n`` inbox messages (fails if they do not come within ``timeout`` each)."""
    out: list[Message] = []
    async for msg in agent.inbox(limit=n, timeout=timeout, **kw):
        out.append(msg)
        if ack:
            await msg.ack()
    assert len(out) == n, f"expected {n} messages, got {len(out)}: {out}"
    return out


# ------------------------------------------------------------------ direct / inbox
async def test_direct_message_is_received_with_its_envelope(settings: Settings, unique: str) -> None:
    a_id, b_id = f"{unique}-a", f"{unique}-b"
    async with Agent.connect(a_id, settings=settings) as a, Agent.connect(b_id, settings=settings) as b:
        sent = await a.send(b_id, "task.handoff", {"task": "t1", "n": [1, 2]}, board="proj",
                            metadata={"prio": "high"}, correlation_id="conv-1")
        assert sent.seq > 0 and sent.id
        [msg] = await take(b, 1)
    assert msg.id == sent.id and msg.seq == sent.seq
    assert msg.sender == a_id and msg.recipients == [b_id] and msg.kind == "direct"
    assert msg.type == "task.handoff" and msg.body == {"task": "t1", "n": [1, 2]}
    assert msg.board == "proj" and msg.metadata == {"prio": "high"} and msg.correlation_id == "conv-1"
    assert msg.subject == Subjects.direct(b_id)
    assert msg.created_at.tzinfo is not None and msg.stored_at is not None
    assert msg.delivered == 1 and msg.settled


async def test_offline_agent_receives_direct_messages_in_order_after_reconnecting(
        settings: Settings, unique: str) -> None:
    a_id, b_id = f"{unique}-a", f"{unique}-b"
    async with Agent.connect(b_id, settings=settings) as b:
        assert await drain_inbox(b, timeout=0.1) == []  # b has an inbox, then goes away
    async with Agent.connect(a_id, settings=settings) as a:
        sent = [await a.send(b_id, "step", i) for i in range(30)]
    async with Agent.connect(b_id, settings=settings) as b:
        got = await take(b, 30)
        assert await drain_inbox(b, timeout=0.2) == []
    assert [m.body for m in got] == list(range(30))
    assert [m.id for m in got] == [s.id for s in sent]
    assert [m.seq for m in got] == sorted(m.seq for m in got)


async def test_messages_sent_before_the_recipient_ever_connected_are_delivered(
        settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a:
        for i in range(5):
            await a.send(f"{unique}-new", "hello", i)
    async with Agent.connect(f"{unique}-new", settings=settings) as b:
        assert [m.body for m in await take(b, 5)] == [0, 1, 2, 3, 4]


async def test_unacked_messages_are_redelivered_after_a_crash_and_acked_ones_are_not(
        settings: Settings, unique: str) -> None:
    b_id = f"{unique}-b"
    async with Agent.connect(f"{unique}-a", settings=settings) as a:
        for i in range(6):
            await a.send(b_id, "job", i)
    b = await Agent.connect(b_id, settings=settings)
    got = await take(b, 4, ack=False)
    await got[0].ack(wait=True)
    await got[1].ack(wait=True)
    await b.nc.close()  # a crash: no drain, no ack for 2 and 3, 4 and 5 never seen
    async with Agent.connect(b_id, settings=settings) as b:
        again = await take(b, 4)
        assert await drain_inbox(b, timeout=0.2) == []
    assert [m.body for m in again] == [2, 3, 4, 5]
    assert [m.id for m in again[:2]] == [got[2].id, got[3].id]


async def test_reopening_the_inbox_in_the_same_process_redelivers_unacked_first(
        settings: Settings, unique: str) -> None:
    b_id = f"{unique}-b"
    async with Agent.connect(f"{unique}-a", settings=settings) as a, Agent.connect(b_id, settings=settings) as b:
        for i in range(4):
            await a.send(b_id, "job", i)
        async for msg in b.inbox(timeout=2):
            if msg.body == 1:
                break  # 1 stays unacknowledged
            await msg.ack()
        rest = await take(b, 3)
    assert [m.body for m in rest] == [1, 2, 3]
    assert rest[0].delivered == 1  # the consumer was rewound, not timed out


async def test_nak_redelivers_and_term_drops(settings: Settings, unique: str) -> None:
    b_id = f"{unique}-b"
    async with Agent.connect(f"{unique}-a", settings=settings) as a, Agent.connect(b_id, settings=settings) as b:
        for i in range(3):
            await a.send(b_id, "job", i)
        seen: list[int] = []
        async for msg in b.inbox(timeout=1):
            seen.append(msg.body)
            if msg.body == 0 and msg.delivered == 1:
                await msg.nak()
            elif msg.body == 1:
                await msg.term()
            else:
                await msg.ack()
        assert sorted(seen) == [0, 0, 1, 2]
        assert await drain_inbox(b, timeout=0.2) == []


async def test_send_to_several_recipients_stores_one_copy_each(settings: Settings, unique: str) -> None:
    ids = [f"{unique}-{n}" for n in ("b", "c")]
    async with Agent.connect(f"{unique}-a", settings=settings) as a:
        sent = await a.send(ids, "note", "hi")
    assert len(sent.sequences) == 2
    for agent_id, seq in zip(ids, sent.sequences, strict=True):
        async with Agent.connect(agent_id, settings=settings) as r:
            [msg] = await take(r, 1)
            assert msg.id == sent.id and msg.seq == seq and msg.recipients == ids


async def test_types_filter_yields_only_those_types_and_skips_the_rest(settings: Settings, unique: str) -> None:
    b_id = f"{unique}-b"
    async with Agent.connect(f"{unique}-a", settings=settings) as a, Agent.connect(b_id, settings=settings) as b:
        for i, t in enumerate(["x", "y", "x", "z"]):
            await a.send(b_id, t, i)
        got = await drain_inbox(b, types={"x"}, timeout=0.3)
        assert [m.body for m in got] == [0, 2]
        assert await drain_inbox(b, timeout=0.2) == []  # the others were skipped for good


async def test_a_second_concurrent_reader_is_refused(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-b", settings=settings) as b:
        first = b.inbox(timeout=1)
        task = asyncio.create_task(first.__anext__())
        await asyncio.sleep(0.2)  # the first reader is waiting inside __anext__
        with pytest.raises(InboxBusyError):
            await b.inbox(timeout=0.1).__anext__()
        with pytest.raises(StopAsyncIteration):
            await task
        # once the first is idle, a new reader takes over
        assert await drain_inbox(b, timeout=0.1) == []


async def test_json_envelopes_interoperate_with_raw_nats(settings: Settings, unique: str) -> None:
    b_id, cli = f"{unique}-b", f"{unique}-cli"
    nc, signer = await raw_signer(settings.nats.url, cli)  # another language's client, signing as itself
    try:
        js = nc.jetstream()
        doc = {"v": 1, "id": "raw-1", "sender": cli, "kind": "direct", "recipients": [b_id], "type": "ping",
               "body": {"x": 1}, "created_at": "2025-01-02T03:04:05Z"}
        subject = Subjects.direct(b_id)
        # JSON on the wire, signed over the envelope's canonical bytes
        headers = {"Bb-Encoding": "json", "Nats-Msg-Id": "raw-1"}
        signer.sign(subject, headers, validate_wire(MessageEnvelope, doc).canonical_bytes())
        await js.publish(subject, json.dumps(doc).encode(), headers=headers)
        unsigned = {**doc, "id": "raw-2"}
        await js.publish(subject, json.dumps(unsigned).encode(), headers={"Bb-Encoding": "json"})  # hidden
        await js.publish(subject, b"not an envelope")  # dropped, not blocking the inbox
        async with Agent.connect(b_id, settings=settings) as b:
            sent = await b.send(b_id, "self", ["json"], encoding="json")
            got = await drain_inbox(b, timeout=0.3)
            assert b.messaging.hidden == 1
        assert [(m.id, m.sender, m.body, m.verdict) for m in got] == [
            ("raw-1", cli, {"x": 1}, Verdict.VERIFIED), (sent.id, b_id, ["json"], Verdict.VERIFIED)]
    finally:
        await nc.close()
    nc = await operator_nats(settings.nats.url)  # the stored bytes: no agent may read the stream raw
    try:
        raw = await nc.jetstream().get_msg(MESSAGE_STREAM, sent.seq)
    finally:
        await nc.close()
    assert raw.headers and raw.headers["Bb-Encoding"] == "json" and raw.headers["Bb-Sig-Key"].startswith("U")
    assert json.loads(raw.data)["body"] == ["json"]


async def test_bad_input_is_refused_with_typed_errors(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a:
        with pytest.raises(InvalidKeyError):
            await a.send("not a valid id", "t", 1)
        with pytest.raises(InvalidKeyError):
            await a.send("x.y", "t", 1)
        with pytest.raises(InvalidKeyError):
            await a.send([], "t", 1)
        with pytest.raises(InvalidKeyError):
            await a.request("bad id", "t", 1)
        with pytest.raises(InvalidKeyError):
            await a.board("bad board!").broadcast("t", 1)
        with pytest.raises(InvalidKeyError):
            await a.join("a.b")
        with pytest.raises(InvalidKeyError):
            await a.publish("build.*", "t", 1)  # no wildcards when publishing
        with pytest.raises(InvalidKeyError):
            await a.subscribe("build..x")
        with pytest.raises(InvalidPayloadError):
            await a.send(f"{unique}-b", "", 1)
        with pytest.raises(InvalidPayloadError):
            await a.send(f"{unique}-b", "t", b"bytes", encoding="json")
        with pytest.raises(PayloadTooLargeError):
            await a.send(f"{unique}-b", "t", "x" * (settings.board.max_value_size + 1))
    with pytest.raises(InvalidKeyError):
        await Agent.connect("bad id", settings=settings)


# --------------------------------------------------------------- broadcast / topic
async def test_broadcast_reaches_every_joined_agent_and_no_other(settings: Settings, unique: str) -> None:
    board = f"{unique}-board"
    ids = [f"{unique}-{n}" for n in ("a", "b", "c", "d")]
    agents = [await Agent.connect(i, settings=settings) for i in ids]
    try:
        a, b, c, d = agents
        for agent in (a, b, c):
            await agent.join(board)
        await d.join(f"{unique}-other")
        sent = await a.board(board).broadcast("discovery", {"fact": 42})
        for agent in (b, c):
            [msg] = await take(agent, 1)
            assert (msg.id, msg.kind, msg.board, msg.body) == (sent.id, "broadcast", board, {"fact": 42})
            assert msg.subject == Subjects.broadcast(board)
        assert await drain_inbox(d, timeout=0.3) == []
        assert await drain_inbox(a, timeout=0.3) == []  # its own broadcast is skipped...
        await a.board(board).broadcast("discovery", 2)
        [own] = await take(a, 1, include_own=True)  # ...unless asked for
        assert own.sender == ids[0]
        assert (await b.subscriptions()).boards == (board,)
    finally:
        for agent in agents:
            await agent.close()


async def test_joining_does_not_replay_earlier_broadcasts_and_leaving_stops_them(
        settings: Settings, unique: str) -> None:
    board = f"{unique}-board"
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        await a.board(board).broadcast("old", 0)
        await b.join(board)
        await b.join(board)  # idempotent
        await a.board(board).broadcast("new", 1)
        await a.send(f"{unique}-b", "direct", 2)
        assert [m.body for m in await drain_inbox(b)] == [1, 2]
        await b.leave(board)
        await a.board(board).broadcast("after-leave", 3)
        assert await drain_inbox(b, timeout=0.3) == []
        assert (await b.subscriptions()).boards == ()


async def test_topic_messages_reach_matching_pattern_subscribers(settings: Settings, unique: str) -> None:
    ids = [f"{unique}-{n}" for n in ("pub", "star", "tail", "other")]
    agents = [await Agent.connect(i, settings=settings) for i in ids]
    try:
        pub, star, tail, other = agents
        await star.subscribe(f"{unique}.build.*")
        await tail.subscribe(f"{unique}.build.>")
        await other.subscribe(f"{unique}.deploy.*")
        await pub.publish(f"{unique}.build.failed", "ci", 1)
        await pub.publish(f"{unique}.build.x.y", "ci", 2)
        await pub.publish(f"{unique}.deploy.ok", "ci", 3)
        assert [m.body for m in await drain_inbox(star)] == [1]
        tail_msgs = await drain_inbox(tail)
        assert [m.body for m in tail_msgs] == [1, 2]
        assert tail_msgs[1].topic == f"{unique}.build.x.y" and tail_msgs[1].kind == "topic"
        assert [m.body for m in await drain_inbox(other)] == [3]
        assert await drain_inbox(pub, timeout=0.2) == []
    finally:
        for agent in agents:
            await agent.close()


async def test_topic_subscriptions_merge_covered_patterns_and_refuse_partial_overlap(
        settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-pub", settings=settings) as pub, \
            Agent.connect(f"{unique}-sub", settings=settings) as sub:
        await sub.subscribe(f"{unique}.build.failed")
        await pub.publish(f"{unique}.build.failed", "ci", 1)
        await sub.subscribe(f"{unique}.build.>")  # covers the first: one filter
        await pub.publish(f"{unique}.build.ok", "ci", 2)
        assert [m.body for m in await drain_inbox(sub)] == [1, 2]
        with pytest.raises(InvalidKeyError):
            await sub.subscribe(f"{unique}.*.failed")  # overlaps build.> partially
        await sub.unsubscribe(f"{unique}.build.>")
        assert (await sub.subscriptions()).topics == (f"{unique}.build.failed",)
        await pub.publish(f"{unique}.build.ok", "ci", 3)
        await pub.publish(f"{unique}.build.failed", "ci", 4)
        assert [m.body for m in await drain_inbox(sub)] == [4]
        info = await sub.nc.jetstream().consumer_info(MESSAGE_STREAM, Subjects.inbox_consumer(f"{unique}-sub"))
        assert sorted(info.config.filter_subjects or [info.config.filter_subject]) == sorted(
            [Subjects.direct(f"{unique}-sub"), Subjects.topic(f"{unique}.build.failed")])


# ------------------------------------------------------------------ request / reply
async def test_request_reply_with_concurrent_requests(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-calc", settings=settings) as calc:
        seen: list[Message] = []

        async def add(req: Message) -> int:
            seen.append(req)
            await asyncio.sleep(0.01)
            return int(sum(req.body))

        await calc.handle("add", add)
        await calc.handle("echo", lambda req: {"from": req.sender, "body": req.body})  # sync handlers too
        results = await asyncio.gather(*(a.request(f"{unique}-calc", "add", [i, i]) for i in range(20)))
        assert results == [2 * i for i in range(20)]
        assert await a.request(f"{unique}-calc", "echo", "hi", encoding="json") == {
            "from": f"{unique}-a", "body": "hi"}
    assert seen[0].sender == f"{unique}-a" and seen[0].reply_to and seen[0].kind == "direct"
    assert seen[0].recipients == [f"{unique}-calc"]


async def test_request_timeout_raises_request_timeout_error(settings: Settings, unique: str) -> None:
    release = asyncio.Event()
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-slow", settings=settings) as slow:
        async def wait(req: Message) -> str:
            await release.wait()
            return "late"

        await slow.handle("slow", wait)
        with pytest.raises(RequestTimeoutError) as info:
            await a.request(f"{unique}-slow", "slow", None, timeout=0.2)
        assert info.value.to == f"{unique}-slow" and info.value.timeout == 0.2
        release.set()


async def test_no_responder_and_no_handler_raise_typed_errors(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        with pytest.raises(NoResponderError) as info:
            await a.request(f"{unique}-nobody", "anything", 1, timeout=2)
        assert info.value.to == f"{unique}-nobody" and not isinstance(info.value, NoHandlerError)
        await b.handle("known", lambda req: 1)
        with pytest.raises(NoHandlerError) as nh:
            await a.request(f"{unique}-b", "unknown", 1, timeout=2)
        assert nh.value.type == "unknown" and isinstance(nh.value, NoResponderError)
        await b.handle("*", lambda req: f"fallback:{req.type}")
        assert await a.request(f"{unique}-b", "unknown", 1) == "fallback:unknown"


async def test_handler_exception_comes_back_as_remote_error(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        async def fail(req: Message) -> None:
            raise ValueError(f"cannot do {req.body}")

        await b.handle("fail", fail)
        await b.handle("bytes", lambda req: b"\x00\x01")
        with pytest.raises(RemoteError) as info:
            await a.request(f"{unique}-b", "fail", "that")
        assert (info.value.error, info.value.message, info.value.to, info.value.type) == (
            "ValueError", "cannot do that", f"{unique}-b", "fail")
        assert await a.request(f"{unique}-b", "bytes") == b"\x00\x01"
        with pytest.raises(RemoteError) as enc:  # a reply JSON cannot carry
            await a.request(f"{unique}-b", "bytes", encoding="json")
        assert enc.value.error == "InvalidPayloadError"


async def test_raw_nats_client_can_call_a_handler(settings: Settings, unique: str) -> None:
    cli = f"{unique}-cli"
    async with Agent.connect(f"{unique}-b", settings=settings) as b:
        await b.handle("double", lambda req: req.body * 2)
        nc, signer = await raw_signer(settings.nats.url, cli)
        try:
            doc = {"v": 1, "id": "r1", "sender": cli, "kind": "direct", "recipients": [f"{unique}-b"],
                   "type": "double", "body": 21, "created_at": "2025-01-02T03:04:05Z"}
            subject = Subjects.rpc(f"{unique}-b")
            headers = {"Bb-Encoding": "json", "Nats-Msg-Id": "r1"}
            signer.sign(subject, headers, validate_wire(MessageEnvelope, doc).canonical_bytes())
            reply = await nc.request(subject, json.dumps(doc).encode(), timeout=2, headers=headers)
            env = json.loads(reply.data)
            assert env["body"] == 42 and env["correlation_id"] == "r1" and env["recipients"] == [cli]
            assert reply.headers and reply.headers["Nats-Msg-Id"] == env["id"] and "Bb-Sig" in reply.headers
            # unsigned: refused before the handler sees it
            unsigned = await nc.request(subject, json.dumps(doc).encode(), timeout=2,
                                        headers={"Bb-Encoding": "json"})
            assert unsigned.headers and unsigned.headers["Bb-Error"] == "UnverifiedRecordError"
            bad = await nc.request(subject, b"\xc1garbage", timeout=2)
            assert bad.headers and bad.headers["Bb-Error"] == "InvalidPayloadError"
        finally:
            await nc.close()


async def test_pending_request_fails_when_the_agent_closes(settings: Settings, unique: str) -> None:
    a = await Agent.connect(f"{unique}-a", settings=settings)
    async with Agent.connect(f"{unique}-b", settings=settings) as b:
        await b.handle("never", lambda req: asyncio.sleep(10))
        task = asyncio.create_task(a.request(f"{unique}-b", "never", timeout=10))
        await asyncio.sleep(0.1)
        await a.close()
        with pytest.raises(Exception) as info:
            await task
        assert type(info.value).__name__ == "NotConnectedError"


async def test_codec_of_stored_message_is_the_documented_envelope(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a:
        sent = await a.send(f"{unique}-b", "t", {"k": "v"})
    nc = await operator_nats(settings.nats.url)  # the stored bytes: no agent may read the stream raw
    try:
        raw = await nc.jetstream().get_msg(MESSAGE_STREAM, sent.seq)
    finally:
        await nc.close()
    doc = codec.decode(raw.data)
    # the canonical encoding: every field of the schema, in its order (absent ones nil)
    assert list(doc) == list(MessageEnvelope.model_fields)
    assert raw.data == validate_wire(MessageEnvelope, doc).canonical_bytes()
    assert raw.headers and raw.headers["Nats-Msg-Id"] == f"{sent.id}:{unique}-b"
    assert {"Bb-Sig-Key", "Bb-Sig-Time", "Bb-Sig"} <= set(raw.headers) and "Bb-Encoding" not in raw.headers


@pytest.mark.slow
async def test_inbox_reader_keeps_receiving_in_order_across_a_server_kill(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    # A private server: its inboxes are administered by a system service of its own (the
    # session's serves the session server only), which reconnects across the kill as a worker's would.
    admin_nc = await connect_nats(settings.nats, name="inbox-admin")
    try:
        async with InboxAdmin(admin_nc, settings, rights=RightsSource.from_settings(settings)), \
                Agent.connect("restart-a", settings=settings) as a, \
                Agent.connect("restart-b", settings=settings) as b:
            got: list[int] = []
            first_ten = asyncio.Event()

            async def read() -> None:
                async for msg in b.inbox(timeout=20):
                    got.append(msg.body)
                    await msg.ack(wait=True)
                    if msg.body == 9:
                        first_ten.set()
                    if msg.body == 19:
                        return

            reader = asyncio.create_task(read())
            for i in range(10):
                await a.send("restart-b", "n", i)
            await asyncio.wait_for(first_ten.wait(), 10)
            server.kill()  # the reader's standing pull request dies with the server
            await asyncio.sleep(0.5)
            await asyncio.to_thread(server.start)
            for i in range(10, 20):
                await a.send("restart-b", "n", i)  # retried until the server is back
            await asyncio.wait_for(reader, 30)
    finally:
        await admin_nc.close()
    # Nothing lost, nothing out of order. A SIGKILLed server may forget the
    # last acks it had not yet written (consumer state is flushed
    # periodically), so a suffix of 0-9 can come again: at-least-once.
    assert list(dict.fromkeys(got)) == list(range(20))
    assert got[:10] == list(range(10)) and got[10:] == sorted(got[10:])


async def test_close_while_a_keepalive_cancel_is_lost_returns(settings: Settings, unique: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's keepalive sends in-progress for held messages; a cancel lost in one (Python
    3.11's ``asyncio.wait_for`` returns a result that is ready instead of raising it) must not
    keep it going: close() returns, and no in-progress is sent after it."""
    from nats.aio.msg import Msg

    s = settings.model_copy(update={"messaging": settings.messaging.model_copy(update={"inbox_ack_wait": 1.0})})
    in_progress = LostCancel()  # the server "answers" while close() cancels

    b_id = f"{unique}-b"
    async with Agent.connect(f"{unique}-a", settings=s) as a, Agent.connect(b_id, settings=s) as b:
        await a.send(b_id, "job", 1)
        inbox = b.inbox(timeout=5)
        msg = await inbox.__anext__()  # held, not acknowledged
        assert msg.body == 1
        monkeypatch.setattr(Msg, "in_progress", in_progress)
        await asyncio.wait_for(in_progress.entered.wait(), 5)  # within ack_wait / 3
        await asyncio.wait_for(inbox.close(), 5)
        await asyncio.sleep(1.0)  # three keepalive intervals
        assert in_progress.calls == 1
