"""Certificate lookups when a replica behind answers, against a real nats-server.

In an R3 cluster any replica answers a direct get of ``BB_KEYS``; one that has not applied a
certificate yet (a node restarted and catching up) answers 404 for a key whose records are
valid. Here, on one server, the key registry's certificate direct gets are answered the way
such a replica would, deterministically: :class:`LaggingRegistry` stands in the one place the
registry sends them (``KeyRegistry._request``) and answers a real 404 captured from the server
(a direct get of a certificate nobody published) a given number of times, then the real answer.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from nats.aio.msg import Msg

from agents_sdk import Agent
from blackboard.client.board_store import BoardStore
from blackboard.client.consumers import STALE_PAUSES
from blackboard.client.keys import FALLBACK_WINDOW, MAX_FALLBACK_MISSES, NEGATIVE_TTL, KeyRegistry
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.jwt import Credentials, encode, new_seed, public_key, user_claims
from blackboard.security.signer import Signer
from blackboard.security.verifier import Signed
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio


def _registry(store: BoardStore) -> KeyRegistry:
    verifier = store._verifier
    assert verifier is not None and isinstance(verifier.keys, KeyRegistry)
    return verifier.keys


def _made_up_credentials(principal: str) -> Credentials:
    """A key whose certificate nobody publishes (signed by an account nobody trusts either)."""
    seed = new_seed("user")
    claims = user_claims(public_key(seed), principal, issued_at=int(time.time()), pub_allow=[">"],
                         sub_allow=[">"], tags=["bb-kind:agent"])
    return Credentials(encode(claims, new_seed("account")), seed)


class LaggingRegistry:
    """Answers a registry's certificate direct gets like a replica behind: per key, ``times``
    real 404s (None: always), then the real answers; counts direct gets and consumer reads."""

    def __init__(self, registry: KeyRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
        self.registry = registry
        self.real_request = registry._request
        self.real_read_first = registry._read_first
        self.behind: dict[str, int | None] = {}
        self.absent: Msg | None = None
        self.direct_gets = 0
        self.consumer_reads = 0
        monkeypatch.setattr(registry, "_request", self.request)
        monkeypatch.setattr(registry, "_read_first", self.read_first)

    async def capture_404(self) -> None:
        """A real 404 of the server: the direct get of a certificate nobody published."""
        msg = await self.real_request(Subjects.key_certificate(_made_up_credentials("nobody").public_key))
        assert (msg.headers or {}).get(Header.STATUS.value) == "404"
        self.absent = msg

    def lag(self, public_key: str, times: int | None = 1) -> None:
        self.behind[Subjects.key_certificate(public_key)] = times

    async def request(self, subject: str) -> Msg:
        self.direct_gets += 1
        if subject in self.behind:
            left = self.behind[subject]
            if left is None or left > 0:
                if left is not None:
                    self.behind[subject] = left - 1
                assert self.absent is not None
                return self.absent
        return await self.real_request(subject)

    async def read_first(self, subject: str, public_key: str) -> Msg | None:
        self.consumer_reads += 1
        return await self.real_read_first(subject, public_key)


async def test_a_signed_entry_verifies_when_a_replica_behind_answers_404_once(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect(f"{unique}-w", settings=settings) as w, \
            Agent.connect(f"{unique}-r", settings=settings) as r:
        rev = await w.board(unique).put("s", "k", "signed")
        registry = _registry(r.store)
        replica = LaggingRegistry(registry, monkeypatch)
        await replica.capture_404()
        signer = w.store._signer
        assert signer is not None and registry.lookup(signer.public_key) is None  # not fetched yet
        replica.lag(signer.public_key)  # a follower a moment behind
        entry = await r.board(unique).get("s", "k")
        assert (entry.revision, entry.author, entry.verdict) == (rev, f"{unique}-w", Verdict.VERIFIED)
        assert registry.stale_reads == 1
        assert (replica.direct_gets, replica.consumer_reads) == (2, 0)  # asked again after a pause


async def test_a_signed_entry_verifies_through_a_consumer_when_a_replica_stays_behind(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect(f"{unique}-w", settings=settings) as w, \
            Agent.connect(f"{unique}-r", settings=settings) as r:
        rev = await w.board(unique).put("s", "k", {"n": 1})
        registry = _registry(r.store)
        replica = LaggingRegistry(registry, monkeypatch)
        await replica.capture_404()
        signer = w.store._signer
        assert signer is not None
        replica.lag(signer.public_key, times=None)  # a node restarted and catching up
        entry = await r.board(unique).get("s", "k")  # raises UnverifiedRecordError if taken as unknown
        assert (entry.revision, entry.value, entry.verdict) == (rev, {"n": 1}, Verdict.VERIFIED)
        assert registry.stale_reads == 1
        assert replica.consumer_reads == 1
        assert replica.direct_gets == 3  # the first, and one after each pause
        # kept: the next read asks nothing
        assert (await r.board(unique).get("s", "k")).verdict is Verdict.VERIFIED
        assert (replica.direct_gets, replica.consumer_reads) == (3, 1)


async def test_a_key_nobody_certified_stays_unknown_and_is_not_asked_again_at_once(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect(f"{unique}-r", settings=settings) as r:
        registry = _registry(r.store)
        verifier = r.store._verifier
        assert verifier is not None
        replica = LaggingRegistry(registry, monkeypatch)
        made_up = _made_up_credentials(f"{unique}-m")
        subject = Subjects.memory(unique, f"{unique}-m")
        record = b"\x81\xa1a\x01"
        headers = {Header.MSG_ID.value: "x1"}
        Signer(made_up).sign(subject, headers, record)
        item = Signed(subject, headers, record, datetime.now(UTC), f"{unique}-m")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await verifier.verify(item) is Verdict.UNKNOWN_KEY
        first = loop.time() - started
        assert (replica.direct_gets, replica.consumer_reads) == (3, 1)  # asked again, then read: nothing
        assert registry.stale_reads == 0
        assert first < settings.nats.request_timeout  # the consumer saw none pending: no wait
        started = loop.time()
        assert await verifier.verify(item) is Verdict.UNKNOWN_KEY  # within the negative-cache time
        again = loop.time() - started
        assert (replica.direct_gets, replica.consumer_reads) == (3, 1)
        assert again < sum(STALE_PAUSES) < NEGATIVE_TTL  # no pause either


async def test_made_up_key_ids_cannot_make_every_read_pay_the_fallback(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any writer can put a made-up key id in a header: past MAX_FALLBACK_MISSES reads again that
    found nothing within FALLBACK_WINDOW, a 404 is taken at once (one direct get, no pause, no
    consumer); once they age out, a replica behind is read through again."""
    async with Agent.connect(f"{unique}-w", settings=settings) as w, \
            Agent.connect(f"{unique}-r", settings=settings) as r:
        registry = _registry(r.store)
        verifier = r.store._verifier
        assert verifier is not None
        replica = LaggingRegistry(registry, monkeypatch)
        await replica.capture_404()
        window = 2.0  # shorter than FALLBACK_WINDOW, to see the misses age out
        assert window < FALLBACK_WINDOW
        monkeypatch.setattr("blackboard.client.keys.FALLBACK_WINDOW", window)

        def made_up_item(n: int) -> Signed:
            subject = Subjects.memory(unique, f"{unique}-m")
            record, headers = b"\x81\xa1a\x01", {Header.MSG_ID.value: f"x{n}"}
            Signer(_made_up_credentials(f"{unique}-m")).sign(subject, headers, record)
            return Signed(subject, headers, record, datetime.now(UTC), f"{unique}-m")

        for n in range(MAX_FALLBACK_MISSES):
            assert await verifier.verify(made_up_item(n)) is Verdict.UNKNOWN_KEY
        assert (replica.direct_gets, replica.consumer_reads) == (3 * MAX_FALLBACK_MISSES, MAX_FALLBACK_MISSES)
        started = asyncio.get_running_loop().time()
        for n in range(10):  # the next ones cost one direct get each
            assert await verifier.verify(made_up_item(100 + n)) is Verdict.UNKNOWN_KEY
        assert (replica.direct_gets, replica.consumer_reads) == (3 * MAX_FALLBACK_MISSES + 10, MAX_FALLBACK_MISSES)
        assert asyncio.get_running_loop().time() - started < 10 * sum(STALE_PAUSES)
        # The misses age out: a valid key behind a replica's 404 is read through again.
        await asyncio.sleep(window)
        rev = await w.board(unique).put("s", "k", "signed")
        signer = w.store._signer
        assert signer is not None
        replica.lag(signer.public_key, times=None)
        entry = await r.board(unique).get("s", "k")
        assert (entry.revision, entry.verdict) == (rev, Verdict.VERIFIED)
        assert registry.stale_reads == 1
