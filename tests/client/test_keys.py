"""The key registry on a real server (stream BB_KEYS): each identity publishes its own
certificate at connect and may publish no other; readers fetch certificates, refuse those
an unknown account signed, and follow the operators' revocations live."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from blackboard.client.connection import connect_nats
from blackboard.client.keys import publish_certificate, publish_registry
from blackboard.client.signing import Signing, signing_of
from blackboard.devstack import EmbeddedNats
from blackboard.protocol import codec
from blackboard.protocol.entries import parse_server_time
from blackboard.protocol.errors import PermissionDeniedError
from blackboard.protocol.schemas import KeyRevocations, MemoryRecord, validate_wire
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import KEYS_STREAM, MEMORY_STREAM, Header, Subjects
from blackboard.security.credentials import find_credentials
from blackboard.security.jwt import Credentials, encode, new_seed, public_key, user_claims
from blackboard.security.signer import Signer
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from tests._auth import TestAuth, operator_nats

pytestmark = pytest.mark.asyncio

Connect = Callable[[str], Awaitable[NATS]]


@pytest_asyncio.fixture
async def connect(settings: Settings) -> AsyncIterator[Connect]:
    """Connect as a principal (issued its credential by the session authority), closed afterwards."""
    opened: list[NATS] = []

    async def open_(principal: str) -> NATS:
        nc = await connect_nats(settings, name=principal, credentials=find_credentials(principal, settings))
        opened.append(nc)
        return nc

    yield open_
    for nc in opened:
        await nc.close()


def _signing(nc: NATS) -> Signing:
    signing = signing_of(nc)
    assert signing.signer is not None and signing.verifier is not None and signing.registry is not None
    return signing


async def _write_memory(nc: NATS, signer: Signer, board: str, author: str, text: str) -> int:
    """Publish a signed memory (canonical msgpack) as ``signer``; its stream sequence."""
    record = MemoryRecord(id=f"m-{time.time_ns()}", board=board, agent=author, text=text,
                          created_at=datetime.now(UTC))
    subject = Subjects.memory(board, author)
    headers = {Header.MSG_ID.value: record.id}
    data = record.canonical_bytes()
    signer.sign(subject, headers, data)
    ack = await nc.jetstream(timeout=5).publish(subject, data, headers=headers)
    return ack.seq


async def _stored(nc: NATS, board: str, author: str) -> Signed:
    """The last memory of ``author`` on ``board`` as stored, to verify."""
    msg = await nc.request(Subjects.direct_get(MEMORY_STREAM, Subjects.memory(board, author)), b"", timeout=5)
    headers = msg.headers or {}
    assert Header.STATUS.value not in headers, headers
    return Signed(headers[Header.SUBJECT.value], headers, msg.data,
                  parse_server_time(headers[Header.TIMESTAMP.value]), author,
                  cache_key=(MEMORY_STREAM, int(headers[Header.SEQUENCE.value])))


async def test_the_stream_is_sealed_and_keeps_the_duplicate_window(nats_server: EmbeddedNats,
                                                                    settings: Settings) -> None:
    nc = await operator_nats(nats_server.url)
    try:
        cfg = (await nc.jetstream().stream_info(KEYS_STREAM)).config
    finally:
        await nc.close()
    assert cfg.subjects == [Subjects.keys_all()]
    assert cfg.allow_direct and cfg.deny_delete and cfg.deny_purge and not cfg.allow_rollup_hdrs
    assert cfg.duplicate_window == settings.nats.duplicate_window


async def test_a_certificate_is_published_at_connect_and_found_by_another_identity(
        connect: Connect, unique: str) -> None:
    alice_nc = await connect(f"alice-{unique}")
    alice = _signing(alice_nc)
    assert alice.signer is not None
    assert alice.signer.principal == f"alice-{unique}"
    bob_nc = await connect(f"bob-{unique}")
    bob = _signing(bob_nc)
    assert bob.registry is not None and bob.verifier is not None
    assert bob.registry.lookup(alice.signer.public_key) is None  # not fetched yet
    info = await bob.registry.ensure(alice.signer.public_key)
    assert info is not None and (info.principal, info.kind) == (f"alice-{unique}", "agent")
    # a record alice signed, as bob reads it from the stream
    await _write_memory(alice_nc, alice.signer, unique, f"alice-{unique}", "hello")
    item = await _stored(bob_nc, unique, f"alice-{unique}")
    assert await bob.verifier.verify(item) is Verdict.VERIFIED
    assert bob.verifier.stats["verified"] == 1
    # connecting again publishes nothing new (the registry holds the same certificate)
    again = await connect(f"alice-{unique}")
    assert _signing(again).signer.public_key == alice.signer.public_key  # type: ignore[union-attr]


async def test_a_certificate_signed_by_an_unknown_account_is_an_unknown_key(
        connect: Connect, nats_server: EmbeddedNats, unique: str) -> None:
    rogue = new_seed("account")
    seed = new_seed("user")
    forged = Credentials(encode(user_claims(public_key(seed), f"carol-{unique}", issued_at=int(time.time()),
                                            pub_allow=[">"], sub_allow=[">"], tags=["bb-kind:worker"]), rogue),
                         seed)
    op = await operator_nats(nats_server.url)
    try:  # whoever publishes it (here an operator, who may), the account's signature decides
        assert await publish_certificate(op, forged.public_key, forged.jwt, 5)
    finally:
        await op.close()
    reader_nc = await connect(f"reader-{unique}")
    reader = _signing(reader_nc)
    assert reader.verifier is not None and reader.registry is not None
    assert await reader.registry.ensure(forged.public_key) is None
    record = b"\x81\xa1a\x01"
    headers = {Header.MSG_ID.value: "x1"}
    Signer(forged).sign(Subjects.memory(unique, f"carol-{unique}"), headers, record)
    item = Signed(Subjects.memory(unique, f"carol-{unique}"), headers, record, datetime.now(UTC),
                  f"carol-{unique}")
    assert await reader.verifier.verify(item) is Verdict.UNKNOWN_KEY


async def test_an_identity_may_publish_neither_another_keys_certificate_nor_the_revocations(
        connect: Connect, nats_server: EmbeddedNats, unique: str) -> None:
    alice_nc = await connect(f"alice-{unique}")
    bob_nc = await connect(f"bob-{unique}")
    bob = _signing(bob_nc)
    assert bob.signer is not None
    alice = _signing(alice_nc).signer
    assert alice is not None
    js = alice_nc.jetstream(timeout=5)
    started = time.monotonic()
    with pytest.raises(PermissionDeniedError):
        await js.publish(Subjects.key_certificate(bob.signer.public_key), alice.certificate.encode(),
                         headers={Header.MSG_ID.value: f"steal-{unique}"})
    revocations = KeyRevocations(revoked={bob.signer.public_key: 1}, updated_at=datetime.now(UTC))
    with pytest.raises(PermissionDeniedError):
        await js.publish(Subjects.key_revocations(), revocations.canonical_bytes(),
                         headers={Header.MSG_ID.value: f"revoke-{unique}"})
    assert time.monotonic() - started < 4  # refused at once, not timed out
    # bob's certificate is still bob's
    op = await operator_nats(nats_server.url)
    try:
        msg = await op.request(Subjects.direct_get(KEYS_STREAM, Subjects.key_certificate(bob.signer.public_key)),
                               b"", timeout=5)
        last = await op.request(Subjects.direct_get(KEYS_STREAM, Subjects.key_revocations()), b"", timeout=5)
    finally:
        await op.close()
    assert msg.data.decode() == bob.signer.certificate
    if (last.headers or {}).get(Header.STATUS.value) != "404":
        record = validate_wire(KeyRevocations, codec.decode(last.data))
        assert bob.signer.public_key not in record.revoked


async def _publish_revocations(url: str, revoked: dict[str, int]) -> None:
    """As the operator: the current revocations plus ``revoked`` (the last record wins)."""
    op = await operator_nats(url)
    try:
        last = await op.request(Subjects.direct_get(KEYS_STREAM, Subjects.key_revocations()), b"", timeout=5)
        current: dict[str, int] = {}
        if (last.headers or {}).get(Header.STATUS.value) != "404":
            current = dict(validate_wire(KeyRevocations, codec.decode(last.data)).revoked)
        record = KeyRevocations(revoked=current | revoked, updated_at=datetime.now(UTC))
        await op.jetstream(timeout=5).publish(Subjects.key_revocations(), record.canonical_bytes(),
                                              headers={Header.MSG_ID.value: f"rev-{time.time_ns()}"})
    finally:
        await op.close()


async def test_revocations_are_followed_live(connect: Connect, nats_server: EmbeddedNats, unique: str) -> None:
    alice_id = f"alice-{unique}"
    alice_nc = await connect(alice_id)
    alice = _signing(alice_nc)
    assert alice.signer is not None
    bob_nc = await connect(f"bob-{unique}")
    bob = _signing(bob_nc)
    assert bob.verifier is not None and bob.registry is not None
    news = asyncio.Event()
    alice_key = alice.signer.public_key
    bob.registry.add_listener(lambda keys: news.set() if alice_key in keys else None)

    await _write_memory(alice_nc, alice.signer, unique, alice_id, "before")
    before = await _stored(bob_nc, unique, alice_id)
    assert before.stored_at is not None
    revoked_from = int(before.stored_at.timestamp()) + 1  # whole seconds: the next one
    # the clock passing a second is no event: the next record is stored at or after it
    await asyncio.sleep(max(0.0, revoked_from + 0.05 - time.time()))
    await _write_memory(alice_nc, alice.signer, unique, alice_id, "after")
    after = await _stored(bob_nc, unique, alice_id)
    assert await bob.verifier.verify(before) is Verdict.VERIFIED
    assert await bob.verifier.verify(after) is Verdict.VERIFIED  # kept for its (stream, seq)

    await _publish_revocations(nats_server.url, {alice.signer.public_key: revoked_from})
    await asyncio.wait_for(news.wait(), 5)
    assert bob.registry.revoked_at(alice.signer.public_key) == datetime.fromtimestamp(revoked_from, UTC)
    assert await bob.verifier.verify(after) is Verdict.REVOKED  # the kept verdict was forgotten
    assert await bob.verifier.verify(before) is Verdict.VERIFIED  # stored before the revocation
    # a connection made later reads the revocations at start
    carol_nc = await connect(f"carol-{unique}")
    carol = _signing(carol_nc)
    assert carol.verifier is not None
    assert await carol.verifier.verify(after) is Verdict.REVOKED
    assert await carol.verifier.verify(before) is Verdict.VERIFIED


async def test_revocations_read_at_start_from_a_replica_behind_are_read_again(
        connect: Connect, nats_server: EmbeddedNats, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start whose read of the revocations is answered by a replica behind (here: no record,
    as a node catching up would answer) learns them when it reads again after start."""
    import blackboard.client.keys as keys_module

    revoked_key = public_key(new_seed("user"))
    await _publish_revocations(nats_server.url, {revoked_key: int(time.time()) - 60})
    real = keys_module._direct_get
    behind = [1]

    async def replica_behind(nc: NATS, subject: str, timeout: float) -> object:
        if subject == Subjects.key_revocations() and behind[0] > 0:
            behind[0] -= 1
            return None  # the record is not there yet
        return await real(nc, subject, timeout)

    monkeypatch.setattr(keys_module, "_direct_get", replica_behind)
    monkeypatch.setattr(keys_module, "REVOCATIONS_REREAD", (0.3,))
    dave = _signing(await connect(f"dave-{unique}"))
    assert dave.registry is not None
    assert behind == [0] and dave.registry.revoked_at(revoked_key) is None  # the start read nothing
    deadline = time.monotonic() + 5
    while dave.registry.revoked_at(revoked_key) is None:
        assert time.monotonic() < deadline, "the revocations were not read again"
        await asyncio.sleep(0.05)


async def test_a_connection_without_a_credential_signs_and_verifies_nothing(settings: Settings) -> None:
    nc = await operator_nats(settings.nats.url)  # a plain nats-py client
    try:
        signing = signing_of(nc)
        assert not signing.signs and not signing.verifies
    finally:
        await nc.close()
    off = settings.model_copy(update={"security": settings.security.model_copy(update={"sign": False,
                                                                                       "verify": False})})
    conn = await connect_nats(off, name="quiet", credentials=find_credentials("quiet", off))
    try:
        assert not signing_of(conn).signs and not signing_of(conn).verifies
    finally:
        await conn.close()


async def test_an_operator_publishes_every_active_identitys_certificate_and_the_revocations(
        connect: Connect, nats_server: EmbeddedNats, test_auth: TestAuth, unique: str) -> None:
    worker = Credentials.parse(test_auth.creds("worker").read_text())
    op = await operator_nats(nats_server.url)
    try:
        first = await publish_registry(op, test_auth.authority, timeout=5)
        assert "worker" in first.published + first.unchanged
        again = await publish_registry(op, test_auth.authority, timeout=5)
        assert again.published == [] and not again.revocations  # nothing changed since
        assert set(again.unchanged) == set(first.published + first.unchanged)
    finally:
        await op.close()
    reader = _signing(await connect(f"reader-{unique}"))
    assert reader.registry is not None
    info = await reader.registry.ensure(worker.public_key)
    assert info is not None and (info.principal, info.kind) == ("worker", "worker")
    for key, seconds in test_auth.authority.revocations().items():
        assert reader.registry.revoked_at(key) == datetime.fromtimestamp(seconds, UTC)
