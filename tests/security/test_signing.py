"""Record signatures: the signing input, the signer, certificates and the verifier (pure)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
from nacl.signing import VerifyKey
from pydantic import ValidationError

from blackboard.protocol.errors import InvalidPayloadError, UnverifiedRecordError
from blackboard.protocol.schemas import KeyRevocations, MemoryRecord
from blackboard.protocol.signing import (
    SCHEME,
    SignatureHeaders,
    Verdict,
    batch_message,
    encode_path,
    encode_signature,
    fold_path,
    leaf_hash,
    merkle_tree,
    node_hash,
    parse_path,
    parse_signature,
    signing_input,
)
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.certificates import KeyInfo, Revocations, read_certificate
from blackboard.security.jwt import Credentials, encode, new_seed, public_key, user_claims
from blackboard.security.signer import Signer
from blackboard.security.verifier import Signed, Verifier
from blackboard.settings import Settings

ACCOUNT = new_seed("account")
ACCOUNT_KEY = public_key(ACCOUNT)


def _creds(name: str, *, kind: str = "agent", account: str = ACCOUNT, tags: list[str] | None = None) -> Credentials:
    seed = new_seed("user")
    claims = user_claims(public_key(seed), name, issued_at=int(time.time()), pub_allow=[">"], sub_allow=[">"],
                         tags=[f"bb-kind:{kind}"] if tags is None else tags)
    return Credentials(encode(claims, account), seed)


class Keys:
    """A KeyLookup over certificates given in the test (no IO)."""

    def __init__(self, *creds: Credentials, trusted: tuple[str, ...] = (ACCOUNT_KEY,)) -> None:
        self.certs = {c.public_key: c.jwt for c in creds}
        self.known: dict[str, KeyInfo] = {}
        self.trusted = trusted
        self.revocations = Revocations()
        self.ensured: list[str] = []

    def lookup(self, pk: str) -> KeyInfo | None:
        return self.known.get(pk)

    def revoked_at(self, pk: str) -> datetime | None:
        return self.revocations.revoked_at(pk)

    async def ensure(self, pk: str) -> KeyInfo | None:
        self.ensured.append(pk)
        jwt = self.certs.get(pk)
        info = read_certificate(pk, jwt, self.trusted) if jwt else None
        if info is not None:
            self.known[pk] = info
        return info


SUBJECT = "$KV.blackboard.b1.notes.k1"


def _signed(signer: Signer, record: bytes = b"\x81\xa1a\x01", *, subject: str = SUBJECT,
            at: datetime | None = None, extra: dict[str, str] | None = None) -> tuple[dict[str, str], bytes]:
    headers = {Header.MSG_ID.value: "m-1", **(extra or {})}
    signer.sign(subject, headers, record, now_us=None if at is None else (at - datetime(1970, 1, 1, tzinfo=UTC))
                // timedelta(microseconds=1))
    return headers, record


# -- the signing input --------------------------------------------------------
def test_signing_input_is_eight_lines_then_the_record() -> None:
    headers = {Header.MSG_ID.value: "id-1", Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: "7",
               Header.KV_OPERATION.value: "DEL", Header.MSG_TTL.value: "90s", "Other": "ignored"}
    out = signing_input("$KV.b.x.y.z", headers, 1_700_000_000_123_456, "U" + "A" * 55, b"\x00rec\n")
    assert out == (b"bb-sig/1\n$KV.b.x.y.z\nid-1\n1700000000123456\n7\nDEL\n90s\n" + b"U" + b"A" * 55
                   + b"\n\x00rec\n")
    bare = signing_input("bb.mem.b.a", {Header.MSG_ID.value: "m"}, 5, "UK", b"")
    assert bare == b"bb-sig/1\nbb.mem.b.a\nm\n5\n\n\n\nUK\n"
    assert SCHEME == "bb-sig/1"


def test_signing_input_needs_a_msg_id_and_refuses_line_breaks() -> None:
    with pytest.raises(InvalidPayloadError, match="Nats-Msg-Id"):
        signing_input("s", {}, 1, "U", b"")
    with pytest.raises(InvalidPayloadError, match="line break"):
        signing_input("s", {Header.MSG_ID.value: "a\nb"}, 1, "U", b"")
    with pytest.raises(InvalidPayloadError, match="line break"):
        signing_input("s", {Header.MSG_ID.value: "a", Header.MSG_TTL.value: "1\n"}, 1, "U", b"")


def test_parse_signature_forms() -> None:
    signer = Signer(_creds("alice"))
    headers, _ = _signed(signer)
    parsed = parse_signature(headers)
    assert isinstance(parsed, SignatureHeaders)
    assert parsed.public_key == signer.public_key and len(parsed.signature) == 64
    assert encode_signature(parsed.signature) == headers[Header.SIG.value]
    assert len(headers[Header.SIG.value]) == 86 and len(headers[Header.SIG_KEY.value]) == 56
    assert parse_signature(None) is None and parse_signature({Header.MSG_ID.value: "x"}) is None
    bad = [
        {k: v for k, v in headers.items() if k != Header.SIG.value},
        {**headers, Header.SIG_TIME.value: "-5"},
        {**headers, Header.SIG_TIME.value: "01"},
        {**headers, Header.SIG_TIME.value: "1" * 20},
        {**headers, Header.SIG_KEY.value: "A" + headers[Header.SIG_KEY.value][1:]},
        {**headers, Header.SIG.value: headers[Header.SIG.value][:-1]},
        {**headers, Header.SIG.value: headers[Header.SIG.value] + "="},
        {**headers, Header.SIG.value: headers[Header.SIG.value][:-1] + "B"},  # non-zero padding bits
        {k: v for k, v in headers.items() if k != Header.MSG_ID.value},
    ]
    for h in bad:
        with pytest.raises(InvalidPayloadError):
            parse_signature(h)


# -- the signer ---------------------------------------------------------------
def test_sign_adds_three_headers_that_verify_with_the_public_key() -> None:
    creds = _creds("alice")
    signer = Signer(creds)
    assert signer.principal == "alice" and signer.public_key == creds.public_key
    assert signer.certificate == creds.jwt
    before = time.time_ns() // 1000
    headers, record = _signed(signer, b"payload", extra={Header.MSG_TTL.value: "60"})
    at = int(headers[Header.SIG_TIME.value])
    assert before <= at <= time.time_ns() // 1000
    raw_key = base64.b32decode(signer.public_key)[1:33]
    sig = base64.urlsafe_b64decode(headers[Header.SIG.value] + "==")
    VerifyKey(raw_key).verify(signing_input(SUBJECT, headers, at, signer.public_key, record), sig)
    with pytest.raises(InvalidPayloadError):
        signer.sign(SUBJECT, {}, b"")


def test_signer_refuses_a_non_user_seed() -> None:
    creds = _creds("alice")
    with pytest.raises(Exception, match="user nkey seed"):
        Signer(Credentials(creds.jwt, new_seed("account")))


# -- certificates -------------------------------------------------------------
def test_read_certificate() -> None:
    creds = _creds("w1", kind="worker")
    info = read_certificate(creds.public_key, creds.jwt, [ACCOUNT_KEY])
    assert info is not None and (info.principal, info.kind) == ("w1", "worker")
    assert abs((datetime.now(UTC) - info.issued_at).total_seconds()) < 5
    untagged = _creds("a1", tags=[])
    assert read_certificate(untagged.public_key, untagged.jwt, [ACCOUNT_KEY]).kind == "agent"  # type: ignore[union-attr]
    assert read_certificate(creds.public_key, creds.jwt, [public_key(new_seed("account"))]) is None  # untrusted
    other = _creds("w2")
    assert read_certificate(other.public_key, creds.jwt, [ACCOUNT_KEY]) is None  # another key's JWT
    assert read_certificate(creds.public_key, creds.jwt[:-3] + "AAA", [ACCOUNT_KEY]) is None  # bad signature
    assert read_certificate(creds.public_key, "garbage", [ACCOUNT_KEY]) is None
    odd = _creds("x", tags=["bb-kind:emperor"])
    assert read_certificate(odd.public_key, odd.jwt, [ACCOUNT_KEY]) is None
    seed = new_seed("user")
    expired = encode(user_claims(public_key(seed), "old", issued_at=1, pub_allow=[], sub_allow=[], expires=2),
                     ACCOUNT)
    assert read_certificate(public_key(seed), expired, [ACCOUNT_KEY]) is None
    nameless = encode(user_claims(public_key(seed), "bad name!", issued_at=1, pub_allow=[], sub_allow=[]), ACCOUNT)
    assert read_certificate(public_key(seed), nameless, [ACCOUNT_KEY]) is None


def test_revocations() -> None:
    record = KeyRevocations(revoked={"UK1": 1_700_000_000}, updated_at=datetime.now(UTC))
    revs = Revocations.from_record(record)
    assert revs.revoked_at("UK1") == datetime.fromtimestamp(1_700_000_000, UTC)
    assert revs.revoked_at("UK2") is None and len(revs) == 1
    assert Revocations({"UK1": 1_700_000_000, "UK2": 5}).changed(revs) == {"UK2"}
    assert Revocations({"UK1": 1}).changed(revs) == {"UK1"}
    assert Revocations().changed(revs) == {"UK1"}
    decoded = KeyRevocations.model_validate(msgpack.unpackb(msgpack.packb(
        {"v": 1, "revoked": {"UK": 3}, "updated_at": "2024-01-01T00:00:00+00:00"})))
    assert decoded.revoked == {"UK": 3}


# -- settings -----------------------------------------------------------------
def test_clock_skew_must_be_less_than_half_the_duplicate_window() -> None:
    settings = Settings()
    assert 2 * settings.security.max_clock_skew < settings.nats.duplicate_window
    assert (settings.security.sign, settings.security.verify, settings.security.unverified) == (True, True, "hide")
    with pytest.raises(ValidationError, match="max_clock_skew"):
        Settings(security={"max_clock_skew": 120}, nats={"duplicate_window": 120})
    with pytest.raises(ValidationError, match="max_clock_skew"):  # stored 30 s late, replayed at 50 s: 20 s off
        Settings(security={"max_clock_skew": 30}, nats={"duplicate_window": 50, "write_timeout": 10})
    assert Settings(security={"max_clock_skew": 24}, nats={"duplicate_window": 50, "write_timeout": 10})
    with pytest.raises(ValidationError, match="write_timeout"):
        Settings(nats={"duplicate_window": 20, "write_timeout": 30},
                 security={"max_clock_skew": 5})
    with pytest.raises(ValidationError, match="account public key"):
        Settings(security={"trusted_accounts": ["Unot"]})
    ok = Settings(security={"trusted_accounts": [ACCOUNT_KEY]})
    assert ok.security.trusted_accounts == [ACCOUNT_KEY]


def test_unverified_record_error_fields() -> None:
    err = UnverifiedRecordError(Verdict.REVOKED, SUBJECT, revision=4, signer="alice", record={"x": 1})
    assert (err.verdict, err.subject, err.revision, err.sequence, err.signer) == ("revoked", SUBJECT, 4, None, "alice")
    assert "revoked" in str(err) and "revision 4" in str(err)


# -- the verifier ---------------------------------------------------------------
def _verifier(keys: Keys, *, threads: int = 0, cache: int = 1000, skew: float = 30.0) -> Verifier:
    return Verifier(keys, max_skew=skew, cache_size=cache, threads=threads)


@pytest.mark.asyncio
async def test_every_verdict() -> None:
    alice, bob, worker = _creds("alice"), _creds("bob"), _creds("w1", kind="worker")
    stranger = _creds("alice", account=new_seed("account"))  # same name, an untrusted account
    keys = Keys(alice, bob, worker, stranger)
    v = _verifier(keys)
    sa = Signer(alice)
    now = datetime.now(UTC)

    headers, record = _signed(sa)
    assert await v.verify(Signed(SUBJECT, headers, record, now, "alice")) is Verdict.VERIFIED
    assert Verdict.VERIFIED.ok and not Verdict.STALE.ok
    assert await v.verify(Signed(SUBJECT, {Header.MSG_ID.value: "m"}, record, now, "alice")) is Verdict.UNSIGNED
    assert await v.verify(Signed(SUBJECT, {**headers, Header.SIG_TIME.value: "x"}, record, now)) is Verdict.MALFORMED
    h2, _ = _signed(Signer(stranger))
    assert await v.verify(Signed(SUBJECT, h2, record, now, "alice")) is Verdict.UNKNOWN_KEY
    # the subject, the payload, a covered header changed: the signature does not cover it
    assert await v.verify(Signed(SUBJECT + "x", headers, record, now, "alice")) is Verdict.BAD_SIGNATURE
    assert await v.verify(Signed(SUBJECT, headers, record + b"!", now, "alice")) is Verdict.BAD_SIGNATURE
    tampered = {**headers, Header.KV_OPERATION.value: "PURGE"}
    assert await v.verify(Signed(SUBJECT, tampered, record, now, "alice")) is Verdict.BAD_SIGNATURE
    # signed by bob's key, claiming alice as author; a derived record not signed by a worker
    hb, _ = _signed(Signer(bob))
    assert await v.verify(Signed(SUBJECT, hb, record, now, "alice")) is Verdict.WRONG_AUTHOR
    assert await v.verify(Signed(SUBJECT, hb, record, now)) is Verdict.VERIFIED  # tombstone: the signer is the author
    assert await v.verify(Signed(SUBJECT, hb, record, now, "bob", kind="worker")) is Verdict.WRONG_AUTHOR
    hw, _ = _signed(Signer(worker))
    assert await v.verify(Signed(SUBJECT, hw, record, now, "w1", kind="worker")) is Verdict.VERIFIED
    # stored long after (a replay) or before the signed time
    assert await v.verify(Signed(SUBJECT, headers, record, now + timedelta(seconds=31), "alice")) is Verdict.STALE
    assert await v.verify(Signed(SUBJECT, headers, record, now - timedelta(seconds=31), "alice")) is Verdict.STALE
    assert await v.verify(Signed(SUBJECT, headers, record, now + timedelta(seconds=29), "alice")) is Verdict.VERIFIED
    # revoked at or before the stored time; earlier records still verify
    keys.revocations = Revocations({alice.public_key: int(now.timestamp()) + 10})
    assert await v.verify(Signed(SUBJECT, headers, record, now, "alice")) is Verdict.VERIFIED
    assert await v.verify(Signed(SUBJECT, headers, record, now + timedelta(seconds=11), "alice")) is Verdict.REVOKED
    assert v.stats["verified"] >= 4 and v.stats["unknown_key"] == 1 and v.stats["malformed"] == 1
    # a stored time of None is the receiver's clock
    fresh, _ = _signed(sa)
    assert v.check(Signed(SUBJECT, fresh, record, None, "alice")) is Verdict.VERIFIED


@pytest.mark.asyncio
async def test_check_does_no_io_and_verify_fetches_the_certificate_once() -> None:
    alice = _creds("alice")
    keys = Keys(alice)
    v = _verifier(keys)
    headers, record = _signed(Signer(alice))
    item = Signed(SUBJECT, headers, record, datetime.now(UTC), "alice")
    assert v.check(item) is Verdict.UNKNOWN_KEY and keys.ensured == []
    assert await v.verify(item) is Verdict.VERIFIED and keys.ensured == [alice.public_key]
    assert await v.verify(item) is Verdict.VERIFIED and keys.ensured == [alice.public_key]


@pytest.mark.asyncio
async def test_verdicts_are_cached_per_stream_sequence_and_forgotten_on_revocation() -> None:
    alice = _creds("alice")
    keys = Keys(alice)
    v = _verifier(keys, cache=2)
    sa = Signer(alice)
    now = datetime.now(UTC)
    headers, record = _signed(sa)
    item = Signed(SUBJECT, headers, record, now, "alice", cache_key=("KV_blackboard", 7))
    assert await v.verify(item) is Verdict.VERIFIED
    # the same (stream, seq) is the same stored message: the verdict is reused
    assert v.check(Signed(SUBJECT, headers, b"other", now, "alice", cache_key=("KV_blackboard", 7))) \
        is Verdict.VERIFIED
    assert v.stats["cache_hits"] == 1
    assert v.check(Signed(SUBJECT, headers, b"other", now, "alice", cache_key=("KV_blackboard", 8))) \
        is Verdict.BAD_SIGNATURE
    # unknown_key is not kept (the certificate may come later)
    unknown = _creds("zed")
    hz, _ = _signed(Signer(unknown))
    assert v.check(Signed(SUBJECT, hz, record, now, cache_key=("S", 1))) is Verdict.UNKNOWN_KEY
    keys.certs[unknown.public_key] = unknown.jwt
    assert await v.verify(Signed(SUBJECT, hz, record, now, cache_key=("S", 1))) is Verdict.VERIFIED
    # LRU of 2: seq 7 fell out
    assert v.check(Signed(SUBJECT, headers, b"other", now, "alice", cache_key=("KV_blackboard", 7))) \
        is Verdict.BAD_SIGNATURE
    # revocation news forgets the key's verdicts (both kept ones are alice's: seq 7 and 9)
    item9 = Signed(SUBJECT, headers, record, now, "alice", cache_key=("KV_blackboard", 9))
    assert v.check(item9) is Verdict.VERIFIED
    keys.revocations = Revocations({alice.public_key: int(now.timestamp()) - 1})
    assert v.check(item9) is Verdict.VERIFIED  # still the kept verdict
    assert v.forget([alice.public_key]) == 2
    assert v.check(item9) is Verdict.REVOKED


@pytest.mark.asyncio
async def test_canonical_fallback_for_a_json_payload() -> None:
    alice = _creds("alice")
    keys = Keys(alice)
    v = _verifier(keys)
    record = MemoryRecord(id="m1", board="b1", agent="alice", kind="semantic", text="hello",
                          created_at=datetime.now(UTC))
    canonical = record.canonical_bytes()
    subject = Subjects.memory("b1", "alice")
    headers = {Header.MSG_ID.value: "mem-1"}
    Signer(alice).sign(subject, headers, canonical)
    as_json = json.dumps(record.model_dump(mode="json")).encode()
    headers[Header.ENCODING.value] = "json"

    def recanonical() -> bytes:
        return MemoryRecord.model_validate_json(as_json).canonical_bytes()

    now = datetime.now(UTC)
    assert await v.verify(Signed(subject, headers, as_json, now, "alice", recanonical)) is Verdict.VERIFIED
    assert await v.verify(Signed(subject, headers, as_json, now, "alice")) is Verdict.BAD_SIGNATURE
    changed = json.dumps({**record.model_dump(mode="json"), "text": "bye"}).encode()
    assert await v.verify(Signed(subject, headers, changed, now, "alice",
                                 lambda: MemoryRecord.model_validate_json(changed).canonical_bytes())) \
        is Verdict.BAD_SIGNATURE

    def broken() -> bytes:
        raise InvalidPayloadError("nope")

    assert await v.verify(Signed(subject, headers, as_json, now, "alice", broken)) is Verdict.BAD_SIGNATURE


@pytest.mark.asyncio
@pytest.mark.parametrize("threads", [0, 2])
async def test_verify_many_in_threads_keeps_the_order(threads: int) -> None:
    alice, bob = _creds("alice"), _creds("bob")
    keys = Keys(alice, bob)
    v = _verifier(keys, threads=threads, cache=2000)
    now = datetime.now(UTC)
    items: list[Signed] = []
    expected: list[Verdict] = []
    for i in range(1500):
        signer = Signer(alice) if i % 2 else Signer(bob)
        headers, record = _signed(signer, f"rec{i}".encode())
        author = "alice" if i % 2 else "bob"
        if i % 7 == 0:
            items.append(Signed(SUBJECT, headers, record + b"x", now, author, cache_key=("S", i)))
            expected.append(Verdict.BAD_SIGNATURE)
        elif i % 11 == 0:
            items.append(Signed(SUBJECT, {Header.MSG_ID.value: "u"}, record, now, author, cache_key=("S", i)))
            expected.append(Verdict.UNSIGNED)
        elif i % 13 == 0:
            items.append(Signed(SUBJECT, headers, record, now, "carol", cache_key=("S", i)))
            expected.append(Verdict.WRONG_AUTHOR)
        else:
            items.append(Signed(SUBJECT, headers, record, now, author, cache_key=("S", i)))
            expected.append(Verdict.VERIFIED)
    try:
        assert await v.verify_many(items) == expected
        assert sorted(keys.ensured) == sorted([alice.public_key, bob.public_key])
        assert v.stats["verified"] == expected.count(Verdict.VERIFIED)
        # again: every stored verdict but unsigned comes from the cache
        assert await v.verify_many(items) == expected
        assert v.stats["cache_hits"] == len(items) - expected.count(Verdict.UNSIGNED)
    finally:
        v.close()


@pytest.mark.asyncio
async def test_verify_many_runs_concurrently_with_the_loop() -> None:
    alice = _creds("alice")
    keys = Keys(alice)
    v = _verifier(keys, threads=2)
    headers, record = _signed(Signer(alice))
    items = [Signed(SUBJECT, headers, record, datetime.now(UTC), "alice") for _ in range(2000)]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        assert set(await v.verify_many(items)) == {Verdict.VERIFIED}
    finally:
        task.cancel()
        v.close()
    assert ticks > 1  # the loop ran while the pool checked signatures


# -- batch signatures ---------------------------------------------------------------
def test_merkle_tree_paths_lead_every_leaf_to_the_root() -> None:
    for n in (1, 2, 3, 5, 8, 13, 32, 33):
        leaves = [leaf_hash(bytes([i]) * 7) for i in range(n)]
        root, paths = merkle_tree(leaves)
        assert all(fold_path(leaf, path) == root for leaf, path in zip(leaves, paths, strict=True))
        assert max(len(p) for p in paths) == (n - 1).bit_length()
        for path in paths:
            if path:
                assert parse_path(encode_path(path)) == path
    # leaves and inner nodes are hashed apart: a leaf of two leaves' bytes is not their parent
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) != leaf_hash(a + b)
    assert batch_message(b"\x00" * 32) == b"bb-sig/1 batch\n" + b"\x00" * 32
    for bad in ("", "X" + "A" * 43, "L" + "A" * 42, "L" + "A" * 43 + ".", ".".join(["L" + "A" * 43] * 33)):
        with pytest.raises(InvalidPayloadError):
            parse_path(bad)


@pytest.mark.asyncio
async def test_a_batch_verifies_record_by_record_with_one_signature_check(monkeypatch: pytest.MonkeyPatch) -> None:
    alice = _creds("alice")
    keys = Keys(alice)
    v = _verifier(keys)
    signer = Signer(alice)
    writes = [(f"{SUBJECT}{i}", {Header.MSG_ID.value: f"m-{i}"}, f"record {i}".encode()) for i in range(20)]
    signer.sign_batch(writes)
    sigs = {h[Header.SIG.value] for _, h, _ in writes}
    assert len(sigs) == 1 and all(Header.SIG_PATH.value in h for _, h, _ in writes)
    now = datetime.now(UTC)
    import blackboard.security.verifier as verifier_module

    calls = 0
    real_open = verifier_module.crypto_sign_open

    def counting_open(signed: bytes, key: bytes) -> bytes:
        nonlocal calls
        calls += 1
        return real_open(signed, key)

    monkeypatch.setattr(verifier_module, "crypto_sign_open", counting_open)
    for subject, headers, record in writes:
        assert await v.verify(Signed(subject, headers, record, now, "alice")) is Verdict.VERIFIED
    assert calls == 1  # the root's signature, checked once for the whole batch
    # a record of the batch changed, moved to another subject, or given another record's path
    subject, headers, record = writes[3]
    assert await v.verify(Signed(subject, headers, record + b"!", now, "alice")) is Verdict.BAD_SIGNATURE
    assert await v.verify(Signed(writes[4][0], headers, record, now, "alice")) is Verdict.BAD_SIGNATURE
    swapped = {**headers, Header.SIG_PATH.value: writes[4][1][Header.SIG_PATH.value]}
    assert await v.verify(Signed(subject, swapped, record, now, "alice")) is Verdict.BAD_SIGNATURE
    assert await v.verify(Signed(subject, {**headers, Header.SIG_PATH.value: "L"}, record, now, "alice")) \
        is Verdict.MALFORMED
    # signed again alone (a re-send), the path goes
    signer.sign(subject, headers, record)
    assert Header.SIG_PATH.value not in headers
    assert await v.verify(Signed(subject, headers, record, now, "alice")) is Verdict.VERIFIED
    # one write alone is signed as by sign()
    single = [(SUBJECT, {Header.MSG_ID.value: "solo"}, b"solo")]
    signer.sign_batch(single)
    assert Header.SIG_PATH.value not in single[0][1]
    assert await v.verify(Signed(SUBJECT, single[0][1], b"solo", now, "alice")) is Verdict.VERIFIED


def test_signatures_made_with_nonces_made_ahead_verify_and_never_share_a_nonce(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The signer's nonces (r, R = r·B) are made ahead in a thread; each signature still
    verifies with libsodium, every R differs, and a forked child does not use its parent's."""
    import os

    from nacl.bindings import crypto_sign_open

    import blackboard.security.signer as signer_module

    creds = _creds("alice")
    signer = Signer(creds)
    point = base64.b32decode(signer.public_key)[1:33]
    nonces = signer._nonces
    signer._signature(b"first")  # (none ready yet: signed as libsodium does; starts the refill)
    deadline = time.monotonic() + 10
    while len(nonces._pool) < 32 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(nonces._pool) >= 32
    seen: set[bytes] = set()
    for i in range(500):
        message = bytes([i % 251]) * (i % 300)
        signature = signer._signature(message)
        crypto_sign_open(signature + message, point)
        assert signature[:32] not in seen
        seen.add(signature[:32])
    # in a forked child (another pid) the pairs made for the parent are dropped, not used
    while len(nonces._pool) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    parents = set(nonces._pool)
    real_pid = os.getpid()
    monkeypatch.setattr(signer_module.os, "getpid", lambda: real_pid + 1)
    child = signer._signature(b"in the child")
    crypto_sign_open(child + b"in the child", point)
    assert all(child[:32] != R for _, R in parents)
