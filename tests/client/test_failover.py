"""Fast failover of the write path (issue 18, finding 6).

A write whose ack died with the server (or with a stream leader) is sent again
with the same ``Nats-Msg-Id`` as soon as its connection is replaced, or after
``nats.write_attempt_timeout`` seconds of connected silence, never after a
whole request timeout; the server's duplicate window stores it once, and a
re-sent compare-and-set write that had landed reports its own revision.

The tests assert outcomes (every write acknowledged, nothing lost, nothing
applied twice), not times: the request timeout is set longer than the write
timeout, so a write that only came back after a request timeout fails.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.client.publisher import Publisher
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import ConflictError
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header
from blackboard.security.certificates import KeyInfo
from blackboard.security.signer import Signer
from blackboard.security.verifier import Signed, Verifier
from blackboard.settings import NatsSettings, Settings
from tests._auth import TestAuth, operator_nats
from tests._write_load import KV_HISTORY, WriteLoad
from tests.conftest import make_settings

pytestmark = [pytest.mark.asyncio]

#: A request timeout no write may wait out: longer than the write timeout.
_PATIENT = {"request_timeout": 60.0, "write_timeout": 15.0}


# ------------------------------------------------------------- a fake connection
@dataclass
class _Reply:
    subject: str
    data: bytes
    headers: dict[str, str] | None = None


@dataclass
class _FakeNats:
    """Just what the Publisher uses of a nats-py client; ``answers`` says what
    each publish gets back (``None``: nothing, as when the server dies)."""

    answers: list[dict[str, Any] | None]
    stats: dict[str, int] = field(default_factory=lambda: {"reconnects": 0})
    is_connected: bool = True
    max_payload: int = 1 << 20
    sent: list[dict[str, str]] = field(default_factory=list)
    published: asyncio.Event = field(default_factory=asyncio.Event)
    _cb: Any = None

    def new_inbox(self) -> str:
        return "_INBOX.fake"

    async def subscribe(self, subject: str, cb: Any) -> Any:
        self._cb = cb
        return self

    async def unsubscribe(self) -> None:
        pass

    async def publish(self, subject: str, payload: bytes, reply: str, headers: dict[str, str]) -> None:
        self.sent.append(dict(headers))
        self.published.set()
        answer = self.answers.pop(0) if self.answers else {"stream": "S", "seq": 1}
        if answer is not None:
            asyncio.get_running_loop().call_soon(
                lambda: asyncio.ensure_future(self._cb(_Reply(reply, json.dumps(answer).encode()))))


def _publisher(nc: _FakeNats, **nats: float) -> Publisher:
    return Publisher(nc, None, NatsSettings(**{**_PATIENT, **nats}))  # type: ignore[arg-type]


async def test_a_write_whose_ack_was_lost_is_sent_again_after_the_attempt_timeout() -> None:
    nc = _FakeNats([None, {"stream": "S", "seq": 7, "duplicate": True}])
    ack = await asyncio.wait_for(
        _publisher(nc, write_attempt_timeout=0.2).publish("s", b"x", {"Nats-Msg-Id": "m1"}, what="w"), 10)
    assert (ack.seq, ack.duplicate) == (7, True)
    assert [h["Nats-Msg-Id"] for h in nc.sent] == ["m1", "m1"]  # the same id: stored once


async def test_each_attempt_of_a_signed_write_is_signed_afresh(test_auth: TestAuth) -> None:
    """The same Msg-Id, a fresh signed time: a write that went through only late is not stale."""
    signer = Signer(test_auth.authority.credentials_for("resigner"))
    nc = _FakeNats([None, {"stream": "S", "seq": 7, "duplicate": True}])
    headers = {"Nats-Msg-Id": "m1"}
    ack = await asyncio.wait_for(_publisher(nc, write_attempt_timeout=0.2).publish(
        "s", b"x", headers, what="w", sign=functools.partial(signer.sign, "s", headers, b"x")), 10)
    assert ack.seq == 7 and [h["Nats-Msg-Id"] for h in nc.sent] == ["m1", "m1"]
    times = [int(h[Header.SIG_TIME.value]) for h in nc.sent]
    assert times[1] - times[0] >= 200_000  # signed again when sent again
    info = KeyInfo(signer.public_key, "resigner", "agent", datetime.now(UTC))
    verifier = Verifier(_OneKey(info), max_skew=1.0, cache_size=0)
    for sent, at in zip(nc.sent, times, strict=True):
        item = Signed("s", sent, b"x", datetime.fromtimestamp(at / 1e6, UTC), author="resigner")
        assert verifier.check(item) is Verdict.VERIFIED


@dataclass
class _OneKey:
    info: KeyInfo

    def lookup(self, public_key: str) -> KeyInfo | None:
        return self.info if public_key == self.info.public_key else None

    def revoked_at(self, public_key: str) -> datetime | None:
        return None

    async def ensure(self, public_key: str) -> KeyInfo | None:
        return self.lookup(public_key)


async def test_a_write_in_flight_on_a_replaced_connection_is_sent_again_on_reconnect() -> None:
    # The attempt timeout is longer than the write timeout: only the reconnect can save this write.
    nc = _FakeNats([None])
    publish = asyncio.ensure_future(
        _publisher(nc, write_attempt_timeout=60.0).publish("s", b"x", {"Nats-Msg-Id": "m1"}, what="w"))
    await asyncio.wait_for(nc.published.wait(), 10)
    nc.is_connected = False  # the server died: the client reconnects
    await asyncio.sleep(0.3)
    assert len(nc.sent) == 1  # nothing is sent again while there is no connection
    nc.stats["reconnects"] += 1
    nc.is_connected = True
    ack = await asyncio.wait_for(publish, 10)
    assert ack.seq == 1 and [h["Nats-Msg-Id"] for h in nc.sent] == ["m1", "m1"]


async def test_a_duplicate_still_in_process_is_waited_for_not_reported() -> None:
    """A clustered stream answers a copy whose first copy is still being
    replicated with 10158 ("duplicate message id is in process"), and a
    compare-and-set write behind another write on its subject with 10164:
    both become a definite answer a moment later."""
    in_process = {"error": {"code": 409, "err_code": 10158, "description": "duplicate message id is in process"}}
    busy = {"error": {"code": 400, "err_code": 10164, "description": "wrong last sequence"}}
    nc = _FakeNats([in_process, busy, {"stream": "S", "seq": 3, "duplicate": True}])
    ack = await asyncio.wait_for(_publisher(nc).publish("s", b"x", {"Nats-Msg-Id": "m1"}, what="w"), 10)
    assert (ack.seq, len(nc.sent)) == (3, 3)


async def test_pipelined_acks_stop_waiting_when_the_connection_is_replaced() -> None:
    nc = _FakeNats([None, None])
    publisher = _publisher(nc, write_attempt_timeout=60.0)
    futs = [await publisher.send("s", b"x", {"Nats-Msg-Id": f"m{i}"}) for i in range(2)]
    waiting = asyncio.ensure_future(publisher.wait_acks(futs))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    nc.stats["reconnects"] += 1
    await asyncio.wait_for(waiting, 10)  # the flush sends them again
    assert not any(f.done() for f in futs)


# ------------------------------------------------------------- a real server
async def test_a_resent_cas_write_that_landed_is_no_conflict_after_later_writes(
        settings: Settings, unique: str) -> None:
    """nats-server 2.15 (one server) checks the expected revision before it
    deduplicates: a re-sent compare-and-set write that had landed is answered
    "wrong last sequence", with the key's current revision. Ours is the first
    revision after the expected one, whatever was written since."""
    async with Agent.connect("cas", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        rev = await board.put("s", "counter", 1)
        prep = store._prepare(unique, "s", "counter", 2, author="cas", content_type=None, tags=(),
                              metadata=None, expected_revision=rev, ttl=None, encoding="msgpack")
        first = await store._publish(prep)  # applied; pretend its ack was lost
        later = await board.put("s", "counter", 3)  # another writer, before the re-send
        assert await store._publish_prepared(prep, resend=True) == first
        stale = store._prepare(unique, "s", "counter", 4, author="cas", content_type=None, tags=(),
                               metadata=None, expected_revision=rev, ttl=None, encoding="msgpack")
        with pytest.raises(ConflictError) as info:
            await store._publish_prepared(stale, resend=True)
        assert info.value.current_revision == later
        assert [e.value for e in await board.history("s", "counter")] == [1, 2, 3]


async def _restarts(server: EmbeddedNats, times: int, stop: asyncio.Event) -> None:
    for _ in range(times):
        await asyncio.sleep(0.4)
        server.kill()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.start)
    stop.set()


@pytest.mark.slow
async def test_writes_in_flight_through_server_restarts_are_all_acknowledged_once(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    settings = settings.model_copy(update={"nats": settings.nats.model_copy(update=_PATIENT)})
    async with Agent.connect("restarts", settings=settings) as agent:
        stop = asyncio.Event()
        load = WriteLoad(agent.board("failover"), stop, settle=30)
        await load.run(_restarts(server, 2, stop), puts=6, cas=3)
        assert server.running
        admin = await operator_nats(server.url)  # stream info is the operator's (an agent holds no STREAM.*)
        try:
            counts = await load.check(admin.jetstream(), agent.store.subjects)
        finally:
            await admin.close()
        assert sum(counts.values()) == len(load.plain) + sum(min(len(revs), KV_HISTORY) for revs in load.cas.values())
