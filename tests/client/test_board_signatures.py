"""Signed board writes and verified board reads (issue 20), against a real nats-server.

Every write an agent makes is signed with its credential's key; every read
verifies: an entry carries its ``verdict``. What does not verify (unsigned, a
forged author, a stale signature) raises ``UnverifiedRecordError`` on a strict
read and is hidden from views, watches, histories and key listings, or, with
``security.unverified = "flag"``, returned with its verdict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from agents_sdk import Agent, Change, NotFoundError, Operation, UnverifiedRecordError
from blackboard.client.board_store import BoardStore, WriteOp
from blackboard.protocol.entries import encode_entry_record
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.signer import Signer
from blackboard.settings import Settings
from tests._auth import TestAuth, raw_connect

pytestmark = pytest.mark.asyncio


def _flagging(settings: Settings) -> Settings:
    return settings.model_copy(update={"security": settings.security.model_copy(update={"unverified": "flag"})})


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_an_entry_written_by_one_agent_verifies_in_anothers_reads(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        wb, rb = x.board(unique), y.board(unique)
        view = await rb.view("s")
        watch = rb.watch("s", start="new")
        await watch.start()
        rev = await wb.put("s", "k", {"n": 1.0, "b": [2.5]}, tags=["t"], metadata={"z": 1, "a": 2})
        entry = await rb.get("s", "k")
        assert (entry.revision, entry.author, entry.verdict) == (rev, f"{unique}-x", Verdict.VERIFIED)
        assert entry.value == {"n": 1, "b": [2.5]}  # the canonical form: an integral float is an integer
        assert (await rb.get("s", "k", revision=rev)).verdict is Verdict.VERIFIED
        assert [e.verdict for e in await rb.history("s", "k")] == [Verdict.VERIFIED]
        change = await watch.next(timeout=5)
        assert (change.revision, change.entry.verdict) == (rev, Verdict.VERIFIED)
        await view.wait_for(lambda v: ("s", "k") in v, timeout=5)
        assert view.get("s", "k").verdict is Verdict.VERIFIED
        assert await rb.keys("s") == ["k"]
        assert y.verification["verified"] >= 1 and y.verification["hidden"] == 0
        await watch.stop()
        await view.close()


async def test_json_writes_are_signed_over_their_canonical_bytes(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        await x.board(unique).put("s", "j", {"b": 1.0, "a": [1, "x"]}, encoding="json")
        entry = await y.board(unique).get("s", "j")
        assert entry.verdict is Verdict.VERIFIED and entry.value == {"a": [1, "x"], "b": 1.0}


async def test_cas_pipeline_and_delete_signatures_verify(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        wb, rb = x.board(unique), y.board(unique)
        first = await wb.create("s", "c", 1)
        second = await wb.update("s", "c", 2, expected_revision=first)
        await wb.put("s", "ttl", "soon", ttl=60)
        async with wb.pipeline() as pipe:
            for i in range(20):
                await pipe.put("p", f"k{i}", i)
            await pipe.delete("p", "k0")
        [many] = await wb.put_many([WriteOp("m", "a", {"x": 1.0})])
        await wb.delete("s", "c")
        await wb.purge("s", "ttl")
        history = await rb.history("s", "c")
        assert [(e.revision, e.operation, e.verdict) for e in history][:2] == [
            (first, Operation.PUT, Verdict.VERIFIED), (second, Operation.PUT, Verdict.VERIFIED)]
        assert [(e.operation, e.verdict) for e in history[2:]] == [(Operation.DELETE, Verdict.VERIFIED)]
        with pytest.raises(NotFoundError):  # a verified tombstone: deleted
            await rb.get("s", "c")
        assert [(e.operation, e.verdict) for e in await rb.history("s", "ttl")] == [
            (Operation.PUT, Verdict.VERIFIED), (Operation.PURGE, Verdict.VERIFIED)]
        assert await rb.keys("p") == sorted(f"k{i}" for i in range(1, 20))
        for i in (1, 19):
            assert (await rb.get("p", f"k{i}")).verdict is Verdict.VERIFIED
        assert (await rb.get("m", "a")).revision == many
        assert y.verification["hidden"] == 0 and y.verification["bad_signature"] == 0


async def test_a_forged_author_is_hidden_and_refused(settings: Settings, unique: str) -> None:
    victim, mallory = f"{unique}-victim", f"{unique}-mallory"
    async with Agent.connect(victim, settings=settings) as v, Agent.connect(mallory, settings=settings) as m, \
            Agent.connect(f"{unique}-reader", settings=settings) as r:
        rb = r.board(unique)
        good = await v.board(unique).put("s", "k", "the victim's")
        view = await rb.view("s")
        watch = rb.watch("s", start="new")
        await watch.start()
        # Mallory's SDK signs with Mallory's key an entry whose author field says the victim.
        forged = await m.store.put(unique, "s", "k", "forged", author=victim)
        with pytest.raises(UnverifiedRecordError) as caught:
            await rb.get("s", "k")
        err = caught.value
        assert (err.verdict, err.revision, err.signer) == (Verdict.WRONG_AUTHOR, forged, mallory)
        assert err.record is not None and err.record.value == "forged"  # type: ignore[attr-defined]
        with pytest.raises(UnverifiedRecordError):
            await rb.get("s", "k", revision=forged)
        assert (await rb.get("s", "k", revision=good)).value == "the victim's"
        # the view takes the key as absent at the forged revision (not the older value)
        await view.wait_for(lambda vw: ("s", "k") not in vw, timeout=5)
        assert view.hidden == 1 and view.revision == forged
        # the watch skips it: the next change it delivers is the victim's next write
        after = await v.board(unique).put("s", "k", "again")
        change = await watch.next(timeout=5)
        assert (change.revision, change.entry.value, watch.hidden) == (after, "again", 1)
        assert [e.revision for e in await rb.history("s", "k")] == [good, after]
        assert await rb.keys("s") == ["k"]
        await m.store.put(unique, "s", "k", "forged again", author=victim)
        assert await rb.keys("s") == []  # its latest revision does not verify: absent
        assert r.verification["wrong_author"] >= 1 and r.verification["hidden"] >= 4
        await watch.stop()
        await view.close()


async def test_a_raw_signed_forgery_and_an_unsigned_write_are_hidden(settings: Settings, test_auth: TestAuth,
                                                                     unique: str) -> None:
    mallory = f"{unique}-mallory"
    subjects = Subjects(settings.board.bucket)
    async with Agent.connect(mallory, settings=settings), Agent.connect(f"{unique}-r", settings=settings) as r:
        # (the SDK published Mallory's certificate at connect)
        nc = await raw_connect(settings.nats.url, test_auth, principal=mallory)
        try:
            signer = Signer(test_auth.authority.credentials_for(mallory))
            subject = subjects.entry(unique, "s", "raw")
            payload, record = encode_entry_record("forged", author="somebody-else")
            headers = {Header.MSG_ID.value: f"{unique}-1"}
            signer.sign(subject, headers, record)
            forged = (await nc.jetstream().publish(subject, payload, headers=headers)).seq
            unsigned = (await nc.jetstream().publish(subjects.entry(unique, "s", "unsigned"),
                                                     encode_entry_record("x", author=mallory)[0])).seq
        finally:
            await nc.close()
        rb = r.board(unique)
        with pytest.raises(UnverifiedRecordError) as caught:
            await rb.get("s", "raw")
        assert (caught.value.verdict, caught.value.revision) == (Verdict.WRONG_AUTHOR, forged)
        with pytest.raises(UnverifiedRecordError) as caught:
            await rb.get("s", "unsigned")
        assert (caught.value.verdict, caught.value.revision) == (Verdict.UNSIGNED, unsigned)
        async with rb.view("s") as view:
            assert len(view) == 0 and view.hidden == 2
        assert await rb.keys("s") == []


async def test_flag_mode_returns_what_does_not_verify_with_its_verdict(settings: Settings, unique: str) -> None:
    victim = f"{unique}-victim"
    async with Agent.connect(victim, settings=settings) as v, \
            Agent.connect(f"{unique}-mallory", settings=settings) as m, \
            Agent.connect(f"{unique}-r", settings=_flagging(settings)) as r:
        await v.board(unique).put("s", "k", "ok")
        forged = await m.store.put(unique, "s", "k", "forged", author=victim)
        rb = r.board(unique)
        entry = await rb.get("s", "k")
        assert (entry.value, entry.revision, entry.verdict) == ("forged", forged, Verdict.WRONG_AUTHOR)
        assert [e.verdict for e in await rb.history("s", "k")] == [Verdict.VERIFIED, Verdict.WRONG_AUTHOR]
        async with rb.view("s") as view:
            assert view.get("s", "k").verdict is Verdict.WRONG_AUTHOR  # type: ignore[union-attr]
            assert view.hidden == 0
        watch = rb.watch("s", start="all")
        async with watch:
            verdicts = [(await watch.next(timeout=5)).entry.verdict for _ in range(2)]
        assert verdicts == [Verdict.VERIFIED, Verdict.WRONG_AUTHOR]
        assert await rb.keys("s") == ["k"]
        assert r.verification["hidden"] == 0


async def test_a_write_resent_late_is_signed_again_and_verifies(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        store = x.store
        skew = settings.security.max_clock_skew
        old = time.time_ns() // 1000 - int(2 * skew * 1_000_000)
        # A write signed long ago and sent as it is: stale to its readers.
        prep = store._prepare(unique, "s", "late", 1, author=x.id, content_type=None, tags=(), metadata=None,
                              expected_revision=None, ttl=None, encoding="msgpack")
        signer = store.signing.signer
        assert signer is not None
        signer.sign(prep.subject, prep.headers, prep.record, now_us=old)
        ack = await store._publisher.publish(prep.subject, prep.payload, prep.headers, what="a late write")
        with pytest.raises(UnverifiedRecordError) as caught:
            await y.board(unique).get("s", "late")
        assert (caught.value.verdict, caught.value.revision) == (Verdict.STALE, ack.seq)
        # The publisher signs each (re)send afresh: the same write re-sent late verifies.
        prep = store._prepare(unique, "s", "late", 2, author=x.id, content_type=None, tags=(), metadata=None,
                              expected_revision=ack.seq, ttl=None, encoding="msgpack")
        signer.sign(prep.subject, prep.headers, prep.record, now_us=old)  # its first attempt, long ago
        first = await store._publish_prepared(prep, resend=True)
        again = await store._publish_prepared(prep, resend=True)  # the same Msg-Id: the same write
        assert again == first
        entry = await y.board(unique).get("s", "late")
        assert (entry.revision, entry.value, entry.verdict) == (first, 2, Verdict.VERIFIED)


async def test_many_watches_of_one_agent_verify_a_revision_once(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        rb = y.board(unique)
        watches = [rb.watch(start="new") for _ in range(20)]
        for w in watches:
            await w.start()
        verifier = y.store.signing.verifier
        assert verifier is not None
        before = dict(verifier.stats)
        revisions = [await x.board(unique).put("s", f"k{i}", i) for i in range(5)]
        for w in watches:
            got = [(await w.next(timeout=5)) for _ in revisions]
            assert [(c.revision, c.entry.verdict) for c in got] == [(r, Verdict.VERIFIED) for r in revisions]
            await w.stop()
        assert verifier.stats["verified"] - before["verified"] == len(revisions)


async def test_own_writes_show_in_views_with_their_verdict(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x:
        board = x.board(unique)
        async with board.view() as view:
            rev = await board.put("s", "k", "mine")
            entry = view.get("s", "k")
            assert entry is not None and (entry.revision, entry.verdict) == (rev, Verdict.VERIFIED)
            changes: list[Change] = []
            view.on_change(changes.append)
            await x.store.put(unique, "s", "k", "not mine", author="someone-else")
            await _until(lambda: ("s", "k") not in view)  # hidden, once the watch delivers it
            assert changes[-1].entry.verdict is Verdict.WRONG_AUTHOR and changes[-1].entry.value is None


async def test_an_unsigning_store_writes_what_verifying_readers_hide(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-x", settings=settings) as x, \
            Agent.connect(f"{unique}-y", settings=settings) as y:
        plain = BoardStore(x.nc, settings, signing=type(x.store.signing).off())
        rev = await plain.put(unique, "s", "k", 1, author=x.id)
        entry = await plain.get(unique, "s", "k")  # it does not verify either
        assert (entry.revision, entry.verdict) == (rev, Verdict.UNSIGNED)
        with pytest.raises(UnverifiedRecordError) as caught:
            await y.board(unique).get("s", "k")
        assert caught.value.verdict is Verdict.UNSIGNED
        await x.board(unique).put("s", "k", 2)
        assert (await y.board(unique).get("s", "k")).verdict is Verdict.VERIFIED
        await plain.close()
