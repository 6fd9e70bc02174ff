"""The worker verifies every record's signature once, at ingest (docs/security.md, "Signatures").

A record that verifies is stored with the verdict ``verified``, which search hits and the
stored history carry; one that does not (signed by another identity than its author, altered
after signing, signed by a key the registry does not vouch for, unsigned where signatures are
required) is a dead letter whose reason starts with ``signature <verdict>:``, and no search
finds it. Each test publishes the way an attacker would: raw nats-py, signing with the
credential it holds.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from agents_sdk.messaging.envelope import envelope_wire, new_envelope
from agents_sdk.search import SearchClient, search_request
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.protocol import codec, records
from blackboard.protocol.schemas.message_search import MessageSearchRequest, MessageSearchResponse
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import MESSAGE_STREAM, Header, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.ingest import signature_reason
from tests._worker_helpers import (
    HashProvider,
    certify,
    dead_letters,
    delete_entry,
    entry_payload,
    fresh_db,
    memory_payload,
    publish_signed,
    put_entry,
    remember,
    rows,
    running_worker,
    signed_headers,
    signer,
    worker_settings,
)

#: How long a healthy worker needs, at most, to catch up here.
CATCH_UP = 30.0


def _settings(settings: Settings, unique: str, **kw: Any) -> Settings:
    return worker_settings(settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0, **kw)


async def _send_message(js: JetStreamContext, signed_by: str | None, sender: str, recipient: str, text: str,
                        *, mid: str | None = None) -> int:
    """A direct message from ``sender`` (its envelope) signed by ``signed_by`` (None: unsigned)."""
    env = new_envelope(id=mid or uuid.uuid4().hex, sender=sender, kind="direct", type="note", body={"text": text},
                       recipients=[recipient])
    payload, _ = envelope_wire(env)
    subject = Subjects.direct(recipient)
    if signed_by is None:
        return int((await js.publish(subject, payload, headers={Header.MSG_ID.value: env.id})).seq)
    return await publish_signed(js, signed_by, subject, payload)


def _verdicts(s: Settings, table: str, where: str, *params: Any) -> dict[int, str]:
    return {int(seq): verdict for seq, verdict in rows(s, f"SELECT seq, verdict FROM {table} WHERE {where}", *params)}


@pytest.mark.asyncio
async def test_verified_records_are_stored_verified_and_search_and_history_say_so(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    s = _settings(pg_settings, unique)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    alice, bob = f"{unique}-alice", f"{unique}-bob"
    put = await put_entry(js, subjects, unique, "notes", "plan", {"text": "rotate the signing keys"}, author=alice)
    # A JSON payload: the signature covers the record's canonical bytes, not the JSON text (the
    # verifier's fallback re-encodes the decoded record).
    subject = subjects.entry(unique, "notes", "json")
    payload = codec.encode(codec.decode(entry_payload("verified through the canonical bytes", author=alice)),
                           "json")
    canonical = records.decode_entry_envelope(codec.decode(payload, "json")).canonical_bytes()
    assert canonical != payload
    await certify(js, alice)
    json_seq = int((await js.publish(subject, payload, headers=signed_headers(
        alice, subject, canonical, {Header.ENCODING.value: "json"}))).seq)
    gone = await put_entry(js, subjects, unique, "notes", "gone", "soon deleted", author=alice)
    tomb = await delete_entry(js, subjects, unique, "notes", "gone", by=bob)
    mem = await remember(js, unique, alice, f"{unique}-m1", "the signing keys rotate on friday")
    msg = await _send_message(js, alice, alice, bob, "rotate the signing keys")

    async with running_worker(s, provider=HashProvider()) as w:
        await w.wait_caught_up(CATCH_UP, embedded=True)
        assert dead_letters(s, subjects.entry(unique, "notes", "plan")) == {}
        assert _verdicts(s, "bb_entry_revisions", "board = %s", unique) == {
            put: "verified", json_seq: "verified", gone: "verified", tomb: "verified"}
        assert {k: v for k, v in rows(s, "SELECT key, verdict FROM bb_entries WHERE board = %s", unique)} == {
            "plan": "verified", "json": "verified", "gone": "verified"}
        assert _verdicts(s, "bb_memories", "board = %s", unique) == {mem: "verified"}
        assert _verdicts(s, "bb_messages", "stream = %s AND seq = %s", MESSAGE_STREAM, msg) == {msg: "verified"}
        assert w.verifier is not None and w.verifier.stats["verified"] >= 6

        client = SearchClient(nc, s, "tester")
        entries = await client.search_entries("signing keys", board=unique, mode="keyword")
        assert [(h.key, h.verdict) for h in entries] == [("plan", Verdict.VERIFIED)]
        memories = await client.recall("signing keys", board=unique, mode="keyword")
        assert [(h.id, h.verdict) for h in memories] == [(f"{unique}-m1", Verdict.VERIFIED)]
        history = await client.history(unique, "notes", "gone")
        assert [(r.revision, r.op, r.verdict) for r in history] == [(gone, "PUT", Verdict.VERIFIED),
                                                                    (tomb, "DEL", Verdict.VERIFIED)]
        assert (await client.as_of(unique, "notes", "json", revision=json_seq)).verdict is Verdict.VERIFIED
        found = await search_request(nc, "messages", MessageSearchRequest(query="signing keys", senders=[alice]),
                                     MessageSearchResponse, principal=bob, timeout=10)
        assert [(h.seq, h.verdict) for h in found.hits] == [(msg, Verdict.VERIFIED)]


@pytest.mark.asyncio
async def test_forged_and_tampered_records_are_dead_letters_that_no_search_finds(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    s = _settings(pg_settings, unique)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    alice, bob, mallory = f"{unique}-alice", f"{unique}-bob", f"{unique}-mallory"
    mallory_key = signer(mallory).public_key
    # Forged: the record names alice as its author; mallory signs it with her own key.
    forged_entry = await publish_signed(js, mallory, subjects.entry(unique, "s", "forged"),
                                        entry_payload("forged words of alice", author=alice))
    forged_memory = await publish_signed(js, mallory, Subjects.memory(unique, alice), memory_payload(
        f"{unique}-forged", unique, alice, "forged memory of alice"))
    forged_message = await _send_message(js, mallory, alice, bob, "forged message from alice")
    # Tampered: alice signed it, then the payload was altered on its way.
    subject = subjects.entry(unique, "s", "tampered")
    original = entry_payload("the original words", author=alice)
    await certify(js, alice)
    headers = signed_headers(alice, subject, original)
    tampered = int((await js.publish(subject, entry_payload("tampered words", author=alice), headers=headers)).seq)
    # Replayed onto another key: alice's signature is for another subject.
    other = subjects.entry(unique, "s", "elsewhere")
    moved = int((await js.publish(other, original, headers=signed_headers(alice, subject, original))).seq)
    # Signed by a key that has no certificate in the registry (never published).
    stranger = f"{unique}-stranger"
    unknown = int((await js.publish(subjects.entry(unique, "s", "unknown"), entry_payload("who?", author=stranger),
                                    headers=signed_headers(stranger, subjects.entry(unique, "s", "unknown"),
                                                           entry_payload("who?", author=stranger)))).seq)
    # Signed an hour before it was stored (a replay after the duplicate window).
    stale_subject = subjects.entry(unique, "s", "stale")
    stale_payload = entry_payload("old news", author=alice)
    stale = int((await js.publish(stale_subject, stale_payload, headers=signed_headers(
        alice, stale_subject, stale_payload, now_us=time.time_ns() // 1000 - 3600 * 10**6))).seq)
    good = await put_entry(js, subjects, unique, "s", "good", "genuine words", author=alice)

    async with running_worker(s, provider=HashProvider()) as w:
        await w.wait_caught_up(CATCH_UP, embedded=True)
        entry_dead = {seq: reason for subj in ("forged", "tampered", "elsewhere", "unknown", "stale")
                      for seq, reason in dead_letters(s, subjects.entry(unique, "s", subj)).items()}
        assert entry_dead[forged_entry].startswith("signature wrong_author: signed by ")
        assert mallory in entry_dead[forged_entry] and mallory_key in entry_dead[forged_entry]
        assert f"author is {alice!r}" in entry_dead[forged_entry]
        assert entry_dead[tampered].startswith("signature bad_signature:")
        assert entry_dead[moved].startswith("signature bad_signature:")
        assert entry_dead[unknown].startswith("signature unknown_key:")
        assert signer(stranger).public_key in entry_dead[unknown]
        assert entry_dead[stale].startswith("signature stale:")
        memory_reason = dead_letters(s, Subjects.memory(unique, alice))[forged_memory]
        assert memory_reason.startswith("signature wrong_author:") and f"author is {alice!r}" in memory_reason
        message_reason = dead_letters(s, Subjects.direct(bob))[forged_message]
        assert message_reason.startswith("signature wrong_author:") and mallory in message_reason

        assert _verdicts(s, "bb_entry_revisions", "board = %s", unique) == {good: "verified"}
        assert rows(s, "SELECT count(*) FROM bb_memories WHERE board = %s", unique) == [(0,)]
        assert rows(s, "SELECT count(*) FROM bb_messages WHERE stream = %s AND seq = %s",
                    MESSAGE_STREAM, forged_message) == [(0,)]
        # (The worker's consumers read the whole shared stream: other tests' rejects count too.)
        entries = {loop.handler.name: loop.stats.rejected for loop in w.loops}["entries"]
        for verdict, count in {"wrong_author": 1, "bad_signature": 2, "unknown_key": 1, "stale": 1}.items():
            assert entries.get(verdict, 0) >= count, entries

        client = SearchClient(nc, s, "tester")
        words = "forged words alice tampered original news who genuine"
        assert [h.key for h in await client.search_entries(words, board=unique, mode="keyword")] == ["good"]
        assert await client.recall("forged memory of alice", board=unique, mode="keyword") == []
        found = await search_request(nc, "messages", MessageSearchRequest(query="forged message", senders=[alice]),
                                     MessageSearchResponse, principal=bob, timeout=10)
        assert found.hits == []


@pytest.mark.asyncio
async def test_unsigned_records_are_dead_letters_unless_signatures_are_not_required(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    js = nc.jetstream()
    subjects = Subjects(pg_settings.board.bucket)
    alice, bob = f"{unique}-alice", f"{unique}-bob"
    subject = subjects.entry(unique, "s", "plain")
    plain = int((await js.publish(subject, entry_payload("no signature", author=alice),
                                  headers={Header.MSG_ID.value: uuid.uuid4().hex})).seq)
    message = await _send_message(js, None, alice, bob, "an unsigned note")

    strict = _settings(pg_settings, unique)
    async with running_worker(strict, serve_search=False, embed=False) as w:
        await w.wait_caught_up(CATCH_UP)
    assert dead_letters(strict, subject)[plain].startswith("signature unsigned:")
    assert dead_letters(strict, Subjects.direct(bob))[message].startswith("signature unsigned:")
    assert rows(strict, "SELECT count(*) FROM bb_entry_revisions WHERE board = %s", unique) == [(0,)]

    # Another worker group (its own consumers: every message again), signatures not required;
    # the dead letters of the first group stay (one per stream sequence), so the rows are counted.
    lenient = _settings(pg_settings, f"{unique}x", require_signatures=False)
    async with running_worker(lenient, serve_search=False, embed=False) as w:
        await w.wait_caught_up(CATCH_UP)
    assert _verdicts(lenient, "bb_entry_revisions", "board = %s", unique) == {plain: "unsigned"}
    assert _verdicts(lenient, "bb_messages", "stream = %s AND seq = %s", MESSAGE_STREAM, message) == {
        message: "unsigned"}


@pytest.mark.asyncio
async def test_verification_off_stores_every_record_unsigned(pg_settings: Settings, nc: NATS, unique: str) -> None:
    """``worker.verify = false`` (the ingest benchmark's baseline): nothing is checked, no row is
    ``verified``, and a forgery is stored like anything else."""
    s = _settings(pg_settings, unique, verify=False)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    alice = f"{unique}-alice"
    good = await put_entry(js, subjects, unique, "s", "good", "genuine", author=alice)
    forged = await publish_signed(js, f"{unique}-mallory", subjects.entry(unique, "s", "forged"),
                                  entry_payload("forged", author=alice))
    async with running_worker(s, serve_search=False, embed=False) as w:
        await w.wait_caught_up(CATCH_UP)
        assert w.verifier is None
    assert _verdicts(s, "bb_entry_revisions", "board = %s", unique) == {good: "unsigned", forged: "unsigned"}


@pytest.mark.asyncio
async def test_vote_records_are_bound_to_their_author_or_to_a_worker_identity(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """A ballot must be signed by its voter, a proposal by its proposer; a recorded outcome,
    its application and a close request by a worker identity, never by an agent."""
    s = _settings(pg_settings, unique, serve_search=False, embed=False)
    js = nc.jetstream()
    alice, mallory = f"{unique}-alice", f"{unique}-mallory"
    now = datetime.now(UTC).isoformat()
    proposal = {"v": 1, "id": "p1", "board": unique, "section": "s", "key": "k", "candidates": ["x", "y"],
                "voters": [alice, mallory], "proposer": alice, "created_at": now,
                "deadline": datetime.fromtimestamp(time.time() + 3600, UTC).isoformat()}
    p_seq = await publish_signed(js, alice, Subjects.vote(unique, "p1", "proposal"), codec.encode(proposal))
    ballot = {"v": 1, "id": "b1", "proposal_id": "p1", "voter": alice, "choice": 0, "created_at": now}
    forged_ballot = await publish_signed(js, mallory, Subjects.vote(unique, "p1", "ballot", alice),
                                         codec.encode(ballot))
    close = await publish_signed(js, mallory, Subjects.vote(unique, "p1", "close"), b"")
    async with running_worker(s) as w:
        await w.wait_caught_up(CATCH_UP)
    assert _verdicts(s, "bb_proposals", "board = %s", unique) == {p_seq: "verified"}
    assert dead_letters(s, Subjects.vote(unique, "p1", "ballot", alice))[forged_ballot].startswith(
        "signature wrong_author:")
    reason = dead_letters(s, Subjects.vote(unique, "p1", "close"))[close]
    assert reason.startswith("signature wrong_author:") and "only a worker identity" in reason


@pytest.mark.asyncio
async def test_the_worker_keeps_up_with_a_mix_of_good_and_bad_signatures(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """Batches mixing verified, forged, tampered and unsigned records: every message is
    stored or dead-lettered, in batches large enough for the thread pool, with no stall."""
    s = _settings(pg_settings, unique, serve_search=False, embed=False, verify_threads=2, batch_size=600)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    alice, mallory = f"{unique}-alice", f"{unique}-mallory"
    await certify(js, alice, mallory)
    n = 2400
    futures = []
    expect: dict[str, int] = {"verified": 0, "wrong_author": 0, "bad_signature": 0, "unsigned": 0}
    for i in range(n):
        subject = subjects.entry(unique, "s", f"k{i % 300}")
        payload = entry_payload({"i": i}, author=alice)
        kind = ("verified", "verified", "wrong_author", "bad_signature", "unsigned")[i % 5]
        expect[kind] += 1
        if kind == "verified":
            headers = signed_headers(alice, subject, payload)
        elif kind == "wrong_author":
            headers = signed_headers(mallory, subject, payload)
        elif kind == "bad_signature":
            headers = signed_headers(alice, subject, payload)
            payload = entry_payload({"i": -i}, author=alice)
        else:
            headers = {Header.MSG_ID.value: uuid.uuid4().hex}
        futures.append(await js.publish_async(subject, payload, headers=headers))
    for f in futures:
        await f
    started = time.monotonic()
    async with running_worker(s) as w:
        await w.wait_caught_up(60)
        took = time.monotonic() - started
        (loop,) = [lp for lp in w.loops if lp.handler.name == "entries"]
        assert loop.stats.unexpected == 0 and all(not t.done() for t in w.tasks)
    stored = rows(s, "SELECT verdict, count(*) FROM bb_entry_revisions WHERE board = %s GROUP BY verdict", unique)
    assert dict(stored) == {"verified": expect["verified"]}
    reasons = rows(s, "SELECT split_part(reason, ':', 1), count(*) FROM bb_dead_letters WHERE subject LIKE %s "
                      "GROUP BY 1", subjects.entry(unique, "s", "k0").removesuffix("k0") + "%")
    assert dict(reasons) == {f"signature {k}": v for k, v in expect.items() if k != "verified"}
    assert took < 60


def test_a_dead_letter_reason_names_the_signer_and_the_claim() -> None:
    """The reason is built from what the registry knows (pure)."""
    mallory = signer("reason-mallory")

    class Keys:
        def lookup(self, public_key: str) -> None:
            return None

        def revoked_at(self, public_key: str) -> None:
            return None

        async def ensure(self, public_key: str) -> None:
            return None

    headers = signed_headers("reason-mallory", "bb.mem.b.alice", b"x")
    item = Signed("bb.mem.b.alice", headers, b"x", datetime.now(UTC), "alice")
    text = signature_reason(Verdict.UNKNOWN_KEY, item, Keys())
    assert text.startswith("signature unknown_key: signed by key " + mallory.public_key)
    assert "author is 'alice'" in text
    assert signature_reason(Verdict.MALFORMED, Signed("s", {"Bb-Sig": "x"}, b""), Keys()).startswith(
        "signature malformed: ")
    worker_only = Signed("bb.vote.b.p.close", headers, b"", None, None, kind="worker")
    assert "only a worker identity" in signature_reason(Verdict.WRONG_AUTHOR, worker_only, Keys())


@pytest.mark.asyncio
async def test_a_worker_on_the_open_bus_stores_unsigned_rows(open_settings: Settings, postgres_server: Any,
                                                             unique: str) -> None:
    """Without a credential (the insecure open bus) nothing can be verified: rows are stored
    ``unsigned``, none is dead-lettered for its signature. (A database of its own: the open
    server's stream sequences are not the session server's.)"""
    from blackboard.settings import PostgresSettings

    dsn = fresh_db(postgres_server, unique)
    s = _settings(open_settings.model_copy(update={"postgres": PostgresSettings(dsn=dsn)}), unique,
                  serve_search=False, embed=False)
    nc = await connect_nats(s, name="test-open-bus")
    try:
        js = nc.jetstream()
        await ensure_streams(js, s)
        subjects = Subjects(s.board.bucket)
        subject = subjects.entry(unique, "s", "k")
        seq = int((await js.publish(subject, entry_payload("open", author=f"{unique}-alice"))).seq)
        async with running_worker(s) as w:
            await w.wait_caught_up(CATCH_UP)
            assert w.verifier is None
    finally:
        await nc.close()
    assert _verdicts(s, "bb_entry_revisions", "board = %s", unique) == {seq: "unsigned"}
    assert dead_letters(s, subject) == {}
