"""Signed messages against a real nats-server: what one agent sends verifies in another's
reader; a message, request or reply that does not verify (another agent's sender, a
tampered payload, no signature) is hidden and counted, refused, or flagged."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from agents_sdk import Agent, Message
from blackboard.protocol.errors import RemoteError, UnverifiedRecordError
from blackboard.protocol.schemas import MessageEnvelope
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects
from blackboard.security.signer import Signer
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests._raw_signer import raw_signer

pytestmark = pytest.mark.asyncio


def flagging(settings: Settings) -> Settings:
    """The same settings with ``security.unverified = "flag"``."""
    return settings.model_copy(update={"security": settings.security.model_copy(update={"unverified": "flag"})})


async def drain(agent: Agent, timeout: float = 0.5) -> list[Message]:
    out: list[Message] = []
    async for msg in agent.inbox(timeout=timeout):
        out.append(msg)
        await msg.ack()
    return out


def envelope(sender: str, *, id: str, kind: str = "direct", recipients: list[str] | None = None,
             board: str | None = None, body: Any = "hi") -> MessageEnvelope:
    return MessageEnvelope.model_validate({
        "id": id, "sender": sender, "kind": kind, "recipients": recipients or [], "board": board, "type": "t",
        "body": body, "created_at": "2025-01-02T03:04:05Z"})


def signed(signer: Signer, subject: str, env: MessageEnvelope, *, msg_id: str | None = None,
           tamper: bool = False) -> tuple[bytes, dict[str, str]]:
    """The payload and headers of ``env`` on ``subject``, signed by ``signer`` (``tamper``:
    the body changed after signing)."""
    headers = {"Nats-Msg-Id": msg_id or env.id}
    signer.sign(subject, headers, env.canonical_bytes())
    payload = env.model_copy(update={"body": "tampered"}).canonical_bytes() if tamper else env.canonical_bytes()
    return payload, headers


async def test_direct_broadcast_and_topic_messages_verify_in_another_agents_inbox(settings: Settings,
                                                                                  unique: str) -> None:
    board = f"{unique}-board"
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        await b.join(board)
        await b.subscribe(f"{unique}.>")
        await a.send(b.id, "direct", {"n": 1})
        await a.send([b.id, a.id], "multi", 2)
        await a.board(board).broadcast("broadcast", 3)
        await a.publish(f"{unique}.news", "topic", 4.0)
        got = await drain(b)
        assert [(m.type, m.sender, m.verdict) for m in got] == [
            ("direct", a.id, Verdict.VERIFIED), ("multi", a.id, Verdict.VERIFIED),
            ("broadcast", a.id, Verdict.VERIFIED), ("topic", a.id, Verdict.VERIFIED)]
        assert got[3].body == 4  # the canonical encoding: an integral float is an integer
        assert b.messaging.hidden == 0


async def test_a_message_with_another_agents_sender_or_tampered_is_hidden_and_counted(
        settings: Settings, unique: str) -> None:
    victim, board = f"{unique}-victim", f"{unique}-board"
    nc, mallory = await raw_signer(settings.nats.url, f"{unique}-mallory")  # may write: signs as itself
    try:
        async with Agent.connect(f"{unique}-b", settings=settings) as b:
            await b.join(board)
            js = nc.jetstream()
            direct = Subjects.direct(b.id)
            forged = envelope(victim, id="forged", recipients=[b.id])
            await publish(js, direct, signed(mallory, direct, forged))
            own = envelope(mallory.principal, id="tampered", recipients=[b.id])
            await publish(js, direct, signed(mallory, direct, own, tamper=True))
            await js.publish(direct, own.model_copy(update={"id": "unsigned"}).canonical_bytes(),
                             headers={"Nats-Msg-Id": "unsigned"})
            cast = envelope(victim, id="cast", kind="broadcast", board=board)
            await publish(js, Subjects.broadcast(board), signed(mallory, Subjects.broadcast(board), cast))
            honest = envelope(mallory.principal, id="honest", recipients=[b.id])
            await publish(js, direct, signed(mallory, direct, honest))
            got = await drain(b)
            assert [(m.id, m.sender, m.verdict) for m in got] == [("honest", mallory.principal, Verdict.VERIFIED)]
            assert b.messaging.hidden == 4 and b.verification["hidden"] == 4
            # A signed copy replayed to another recipient's inbox (with a new Msg-Id: the same one
            # would be dropped by the server as a duplicate) does not verify either.
            payload, headers = signed(mallory, direct, honest)
            await publish(js, Subjects.direct(f"{unique}-c"), (payload, {**headers, "Nats-Msg-Id": "replay"}))
        async with Agent.connect(f"{unique}-c", settings=flagging(settings)) as c:
            (replayed,) = await drain(c)  # flagged, not hidden
            assert replayed.verdict is Verdict.BAD_SIGNATURE and c.messaging.hidden == 0
    finally:
        await nc.close()


async def test_flag_mode_passes_what_does_not_verify_with_its_verdict(settings: Settings, unique: str) -> None:
    nc, mallory = await raw_signer(settings.nats.url, f"{unique}-mallory")
    try:
        async with Agent.connect(f"{unique}-b", settings=flagging(settings)) as b:
            direct = Subjects.direct(b.id)
            js = nc.jetstream()
            await publish(js, direct, signed(mallory, direct, envelope(f"{unique}-a", id="x", recipients=[b.id])))
            await js.publish(direct, envelope(f"{unique}-a", id="y", recipients=[b.id]).canonical_bytes(),
                             headers={"Nats-Msg-Id": "y"})
            got = await drain(b)
            assert [(m.id, m.verdict) for m in got] == [("x", Verdict.WRONG_AUTHOR), ("y", Verdict.UNSIGNED)]
    finally:
        await nc.close()


async def test_requests_and_replies_are_signed_and_verified(settings: Settings, unique: str) -> None:
    seen: list[Verdict] = []

    def double(req: Message) -> Any:
        seen.append(req.verdict)
        return req.body * 2

    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        await b.handle("double", double)
        assert await a.request(b.id, "double", 21) == 42
        assert await a.request(b.id, "double", "ab", encoding="json") == "abab"
        assert seen == [Verdict.VERIFIED, Verdict.VERIFIED] and a.messaging.hidden == b.messaging.hidden == 0


async def test_a_request_with_another_agents_sender_is_refused_before_the_handler(
        settings: Settings, unique: str) -> None:
    called: list[Message] = []
    nc, mallory = await raw_signer(settings.nats.url, f"{unique}-mallory")
    try:
        async with Agent.connect(f"{unique}-b", settings=settings) as b:
            await b.handle("*", called.append)
            subject = Subjects.rpc(b.id)
            forged = envelope(f"{unique}-a", id="rq", recipients=[b.id])
            payload, headers = signed(mallory, subject, forged)
            reply = await nc.request(subject, payload, timeout=2, headers=headers)
            assert reply.headers and reply.headers["Bb-Error"] == "UnverifiedRecordError"
            assert called == [] and b.messaging.hidden == 1
    finally:
        await nc.close()


async def test_a_reply_that_does_not_verify_is_hidden_and_raises(settings: Settings, unique: str) -> None:
    """Someone answering for ``b`` without b's signature (here a raw client with b's own
    credential, replying unsigned or as another sender): the caller ignores the answer and
    raises UnverifiedRecordError when no reply that verifies came in time."""
    b_id = f"{unique}-b"
    nc, b_signer = await raw_signer(settings.nats.url, b_id)

    async def answer(msg: Msg) -> None:
        env = envelope(f"{unique}-other", id="reply", recipients=[f"{unique}-a"])
        payload, headers = signed(b_signer, msg.reply, env)  # signed by b's key, naming another sender
        await nc.publish(msg.reply, payload, headers=headers)

    try:
        await nc.subscribe(Subjects.rpc(b_id), queue="bb-rpc", cb=answer)
        await nc.flush()
        async with Agent.connect(f"{unique}-a", settings=settings) as a:
            with pytest.raises(UnverifiedRecordError) as err:
                await a.request(b_id, "t", 1, timeout=0.5)
            assert err.value.verdict == "wrong_author" and a.messaging.hidden == 1
    finally:
        await nc.close()


async def test_an_unsigned_reply_is_hidden(settings: Settings, unique: str) -> None:
    b_id = f"{unique}-b"
    nc = await operator_nats(settings.nats.url, b_id)

    async def answer(msg: Msg) -> None:
        env = envelope(b_id, id="reply", recipients=[f"{unique}-a"])
        await nc.publish(msg.reply, env.canonical_bytes(), headers={"Nats-Msg-Id": "reply"})

    try:
        await nc.subscribe(Subjects.rpc(b_id), queue="bb-rpc", cb=answer)
        await nc.flush()
        async with Agent.connect(f"{unique}-a", settings=settings) as a:
            with pytest.raises(UnverifiedRecordError) as err:
                await a.request(b_id, "t", 1, timeout=0.5)
            assert err.value.verdict == "unsigned"
        async with Agent.connect(f"{unique}-a", settings=flagging(settings)) as a:
            assert await a.request(b_id, "t", 1, timeout=2) == "hi"  # flagged: passed on
    finally:
        await nc.close()


async def test_a_handler_error_reply_is_signed_too(settings: Settings, unique: str) -> None:
    async def fail(req: Message) -> None:
        raise ValueError("no")

    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        await b.handle("fail", fail)
        with pytest.raises(RemoteError) as err:
            await a.request(b.id, "fail", None)
        assert err.value.error == "ValueError" and a.messaging.hidden == 0


async def publish(js: JetStreamContext, subject: str, pair: tuple[bytes, dict[str, str]]) -> int:
    """Publish ``(payload, headers)`` on ``subject``; returns the stream sequence."""
    payload, headers = pair
    return (await js.publish(subject, payload, headers=headers)).seq
