"""Consensus voting on real servers: propose, vote, typed errors, outcome
commits, watches, the exactly-once commit under races and crashes.

Agents do not commit outcomes: the worker's committer does (here a
``VoteCommitter`` of the test's board, :mod:`tests._committer`). The tests that
take ``bus`` run twice: with the committer, and on an insecure open bus with no
committer at all, where the agents commit themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import CONSENSUS_METADATA, ProposalFollower, VoteStore
from blackboard.client.signing import signing_of
from blackboard.consensus.log import VoteMessage, same_outcome
from blackboard.devstack import EmbeddedNats
from blackboard.protocol import codec
from blackboard.protocol.entries import encode_entry
from blackboard.protocol.errors import (
    ConflictError,
    DeadlinePassedError,
    IneligibleVoterError,
    InvalidBallotError,
    InvalidPayloadError,
    NotFoundError,
    OutcomeTimeoutError,
    ProposalClosedError,
    ProposalNotFoundError,
)
from blackboard.protocol.schemas import Ballot, Outcome, Policy, validate_wire
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.committer import VoteCommitter
from tests._committer import committer_settings, connect_agent, running_committer
from tests.conftest import make_open_settings

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def committer(settings: Settings, unique: str) -> AsyncIterator[VoteCommitter]:
    """The worker's committer, following the test's board."""
    async with running_committer(committer_settings(settings), board=unique) as c:
        yield c


@pytest_asyncio.fixture(params=["committer", "open_bus"])
async def bus(request: pytest.FixtureRequest, settings: Settings, unique: str,
              open_nats_server: EmbeddedNats) -> AsyncIterator[Settings]:
    """The agents' settings: with a committer running, or an open bus (a server without
    authorization) where agents commit themselves."""
    if request.param == "open_bus":
        yield make_open_settings(open_nats_server.url)
        return
    async with running_committer(committer_settings(settings), board=unique):
        yield settings


async def until_past(deadline: datetime | None, margin: float = 0.05) -> None:
    """Sleep until this machine's clock is past ``deadline``."""
    assert deadline is not None
    await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + margin)


@contextlib.asynccontextmanager
async def agents(settings: Settings, prefix: str, n: int) -> AsyncIterator[list[Agent]]:
    opened = [await connect_agent(f"{prefix}-{i}", settings) for i in range(n)]
    try:
        yield opened
    finally:
        for a in opened:
            await a.close()


async def stored_messages(store: VoteStore, board: str, pid: str) -> list[VoteMessage]:
    """Every message stored on a proposal's subjects, in order."""
    msgs: list[VoteMessage] = []
    follower = store.follow(Subjects.vote_filter(board, pid), msgs.append)
    async with follower:
        await follower.ready.wait()
    return msgs


async def stored_kinds(store: VoteStore, board: str, pid: str) -> list[str]:
    """The kinds of every message stored on a proposal's subjects, in order."""
    return [msg.kind for msg in await stored_messages(store, board, pid)]


async def applications(agent: Agent, board: str, section: str, key: str, pid: str) -> list[int]:
    """Revisions of the entry written by the commit of ``pid``."""
    return [e.revision for e in await agent.board(board).history(section, key)
            if not e.deleted and (e.metadata.get(CONSENSUS_METADATA) or {}).get("proposal_id") == pid]


async def test_majority_vote_decides_commits_and_writes_the_entry_once(bus: Settings, unique: str) -> None:
    async with agents(bus, unique, 3) as (a, b, c):
        board = a.board(unique)
        await board.put("facts", "capital", "Lyon")
        p = await board.propose("facts", "capital", ["Paris", "Lyon"], voters=[a.id, b.id, c.id],
                                question="capital of France?")
        async with board.watch("facts", "capital") as watch:
            first = await b.board(unique).vote(p.id, "Paris", reason="atlas")
            assert first.outcome is None and not first.decided
            decisive = await c.board(unique).vote(p.id, "Paris")
            assert decisive.outcome is not None and decisive.outcome.status == "accepted"
            change = await watch.next(timeout=5)
        outcome = await p.outcome(timeout=5)
        assert outcome == decisive.outcome
        assert outcome.value == "Paris" and outcome.candidate == 0 and outcome.closed_by == "decision"
        assert outcome.deciding_sequence == decisive.sequence and outcome.revision == change.revision
        entry = await board.get("facts", "capital")
        assert entry.value == "Paris" and entry.revision == outcome.revision
        assert entry.metadata[CONSENSUS_METADATA]["proposal_id"] == p.id
        assert [cb.voter for cb in outcome.counted_ballots] == [b.id, c.id]
        # Committing again (anyone, any time) changes nothing.
        assert await p.commit() == outcome
        assert await applications(a, unique, "facts", "capital", p.id) == [outcome.revision]
        stored = await stored_messages(a.voting.store, unique, p.id)
        assert [m.kind for m in stored] == ["proposal", "ballot", "ballot", "outcome", "applied"]
        assert [m.voter for m in stored if m.kind == "ballot"] == [b.id, c.id]  # each on its own subject


async def test_outcome_returns_rejected_and_no_quorum(bus: Settings, unique: str) -> None:
    async with agents(bus, unique, 3) as (a, b, c):
        board = a.board(unique)
        rejected = await board.propose("facts", "k1", value=42, voters=[a.id, b.id, c.id])
        await board.vote(rejected.id, "reject")
        receipt = await b.board(unique).vote(rejected.id, "reject")
        assert receipt.outcome is not None and receipt.outcome.status == "rejected"
        out = await rejected.outcome(timeout=5)
        assert out.status == "rejected" and out.value is None and out.revision is None
        with pytest.raises(NotFoundError):
            await board.get("facts", "k1")  # a rejected value is never written

        quorum = await board.propose("facts", "k2", value=1, policy=Policy(quorum=3), voters=[a.id, b.id, c.id],
                                     deadline=timedelta(seconds=1))
        await board.vote(quorum.id, "accept")
        assert await quorum.close() is None  # the deadline has not passed
        with pytest.raises(OutcomeTimeoutError):
            await quorum.outcome(timeout=0.1)
        await until_past(quorum.proposal.deadline)
        closed = await quorum.close(timeout=5)
        assert closed is not None and closed.status == "no_quorum" and closed.closed_by == "deadline"
        assert closed.decided_at == quorum.proposal.deadline and closed.counts.ballots == 1
        assert await quorum.outcome(timeout=1) == closed


async def test_rejected_ballots_raise_typed_errors_and_do_not_change_the_outcome(
        settings: Settings, unique: str, committer: VoteCommitter) -> None:
    async with agents(settings, unique, 5) as (a, b, c, d, outsider):
        board = a.board(unique)
        voters = [a.id, b.id, c.id, d.id]
        p = await board.propose("facts", "color", ["red", "blue"], voters=voters, deadline=timedelta(seconds=30))
        with pytest.raises(IneligibleVoterError) as inel:
            await outsider.board(unique).vote(p.id, "red")
        assert inel.value.voter == outsider.id and inel.value.proposal_id == p.id
        with pytest.raises(InvalidBallotError):
            await board.vote(p.id, "green")  # not a candidate: refused before publishing
        first = await board.vote(p.id, "blue", ballot_id=f"{unique}-once")
        with pytest.raises(InvalidBallotError) as dup:
            await board.vote(p.id, "red", ballot_id=f"{unique}-once")
        assert "already cast" in str(dup.value)
        with pytest.raises(ProposalNotFoundError):
            await board.vote("no-such-proposal", "red")
        with pytest.raises(InvalidBallotError):
            await board.vote(p.id, 7, index=True)  # stored, rejected as invalid_choice
        await b.board(unique).vote(p.id, "red")
        changed = await a.board(unique).vote(p.id, "red")  # a changes its mind: replaces "blue"
        decisive = await c.board(unique).vote(p.id, "red")
        assert decisive.outcome is not None and decisive.outcome.value == "red"
        with pytest.raises(ProposalClosedError):
            await d.board(unique).vote(p.id, "blue")
        outcome = await p.outcome(timeout=5)
        assert outcome.counts.votes == [3, 0] and outcome.superseded_ballots == [first.sequence]
        reasons = {(r.voter, r.reason) for r in outcome.rejected_ballots}
        assert reasons == {(outsider.id, "ineligible"), (a.id, "duplicate"), (a.id, "invalid_choice")}
        assert changed.sequence in [cb.sequence for cb in outcome.counted_ballots]


async def test_late_ballots_raise_deadline_passed_and_do_not_count(bus: Settings, unique: str) -> None:
    async with agents(bus, unique, 2) as (a, b):
        board = a.board(unique)
        p = await board.propose("facts", "late", value="v", deadline=timedelta(seconds=0.5))  # any agent
        await board.vote(p.id, "accept")
        await until_past(p.proposal.deadline)
        with pytest.raises(DeadlinePassedError):
            await b.board(unique).vote(p.id, "reject")
        outcome = await p.close(timeout=5)
        assert outcome is not None and outcome.status == "accepted" and outcome.counts.ballots == 1
        with pytest.raises(DeadlinePassedError):
            await b.board(unique).vote(p.id, "reject")  # after the close too: still late
        assert outcome.rejected_ballots == []  # the record ends at the deadline


async def test_proposals_are_validated_and_ids_unique(settings: Settings, unique: str) -> None:
    async with agents(settings, unique, 1) as (a,):
        board = a.board(unique)
        with pytest.raises(InvalidPayloadError):
            await board.propose("s", "k", ["x", "x"], voters=[a.id])
        with pytest.raises(InvalidPayloadError):
            await board.propose("s", "k", ["x"])  # open electorate without a deadline
        with pytest.raises(InvalidPayloadError):
            await board.propose("s", "k", ["x"], value="y", voters=[a.id])
        with pytest.raises(InvalidPayloadError):
            await board.propose("s", "k", ["x"], voters=[a.id], deadline=-1)
        await board.propose("s", "k", ["x"], voters=[a.id], proposal_id="same")
        with pytest.raises(ConflictError):
            await board.propose("s", "k", ["y"], voters=[a.id], proposal_id="same")
        with pytest.raises(ProposalNotFoundError):
            await board.proposal("missing")
        handle = await board.proposal("same")
        assert handle.proposal.candidates == ["x"] and (await handle.counts()).ballots == 0


async def test_watch_votes_shows_proposal_ballots_and_outcome(bus: Settings, unique: str) -> None:
    async with agents(bus, unique, 2) as (a, b):
        board = a.board(unique)
        async with board.watch_votes() as watch:
            p = await board.propose("s", "k", ["x", "y"], voters=[a.id, b.id])
            await board.vote(p.id, "x")
            await b.board(unique).vote(p.id, "x")
            events = [await watch.next(timeout=5) for _ in range(5)]
        assert [e.kind for e in events] == ["proposal", "ballot", "ballot", "outcome", "applied"]
        assert all(e.proposal_id == p.id for e in events)
        assert isinstance(events[1].message, Ballot) and events[1].message.voter == a.id
        assert isinstance(events[4].message, Outcome) and events[4].message.revision is not None


async def _decided_but_uncommitted(settings: Settings, board: str, section: str, key: str,
                                   voters: int = 3) -> tuple[VoteStore, str, Outcome]:
    """A proposal whose deciding ballot is stored but nobody committed (a crashed voter)."""
    nc = await connect_nats(settings.nats, name="raw")
    store = VoteStore(nc, settings, name="raw")  # the worker's identity
    async with agents(settings, board, 1) as (proposer,), agents(settings, f"{board}v", voters) as voting:
        names = [v.id for v in voting]
        p = await proposer.board(board).propose(section, key, ["x", "y"], voters=names)
        for voter in voting:  # each ballot signed by its voter, published without waiting for a commit
            await voter.voting.store.publish_ballot(board, Ballot(id=f"{voter.id}-1", proposal_id=p.id,
                                                                  voter=voter.id, choice=1,
                                                                  created_at=datetime.now(UTC)))
    async with ProposalFollower(store, board, p.id) as f:
        await f.wait_for(lambda log: log.decided is not None, timeout=5)
        decided = f.log.decided
    assert decided is not None
    return store, p.id, decided


async def test_racing_committers_commit_exactly_once(settings: Settings, unique: str) -> None:
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    async with agents(settings, unique + "r", 6) as racers:
        handles = [await r.board(unique).proposal(pid) for r in racers]
        # Committers race under the worker's identity (agents may not record outcomes: their
        # commit() waits for one); the agents' handles race to read it.
        conns = [await connect_nats(settings.nats, name=f"committer-{i}") for i in range(3)]
        others = [VoteStore(nc, settings, name=f"committer-{i}") for i, nc in enumerate(conns)]
        try:
            results = await asyncio.gather(*[h.commit() for h in handles], *[s.commit(decided) for s in others],
                                           store.commit(decided), *[h.outcome(timeout=5) for h in handles])
        finally:
            for nc in conns:
                await nc.close()
        assert all(r is not None and r == results[0] for r in results)
        committed = results[0]
        assert committed is not None and committed.value == "y" and committed.revision is not None
        kinds = await stored_kinds(store, unique, pid)
        assert kinds.count("outcome") == 1 and kinds.count("applied") == 1
        assert await applications(racers[0], unique, "s", "k", pid) == [committed.revision]
    await store.nc.close()


async def test_a_commit_interrupted_after_recording_is_finished_by_the_next_committer(
        settings: Settings, unique: str) -> None:
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    recorded = await store.record(decided)  # the committer "crashes" here
    async with agents(settings, unique + "w", 1) as (writer,):
        # Someone writes the entry meanwhile: the application goes after it.
        unrelated = await writer.board(unique).put("s", "k", "meanwhile")
        assert unrelated > recorded.base_revision
        handle = await writer.board(unique).proposal(pid)
        with pytest.raises(OutcomeTimeoutError):
            await handle.outcome(timeout=0.3)  # an agent does not finish it (no open bus)
        async with running_committer(committer_settings(settings, vote_commit_grace=0.0), board=unique):
            outcome = await handle.outcome(timeout=5)
        assert outcome.revision is not None and outcome.revision > unrelated
        assert (await writer.board(unique).get("s", "k")).value == "y"
        # Crash after applying but before marking: the scan finds the write.
        assert await store.apply(recorded) == outcome.revision
        assert await applications(writer, unique, "s", "k", pid) == [outcome.revision]
    await store.nc.close()


async def test_applying_again_finds_the_first_application_without_writing(
        settings: Settings, unique: str) -> None:
    """The scan after the base revision (not the Msg-Id window) makes re-application a no-op."""
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    recorded = await store.record(decided)
    assert same_outcome(recorded.outcome, decided)
    first = await store.apply(recorded)
    async with agents(settings, unique + "w", 1) as (writer,):
        later = await writer.board(unique).put("s", "k", "overwritten later")
        nc = await connect_nats(settings.nats, name="second")
        try:
            assert await VoteStore(nc, settings, name="second").apply(recorded) == first
        finally:
            await nc.close()
        assert (await writer.board(unique).get("s", "k")).revision == later  # nothing written again
        assert await applications(writer, unique, "s", "k", pid) == [first]
    await store.nc.close()


async def test_the_application_keeps_its_wire_bytes_and_author(settings: Settings, unique: str) -> None:
    """Applied through the board store, the entry write carries the same headers and
    envelope as the vote store's own write did: the derived Msg-Id, the CAS on the
    base revision, no other header of ours, the committer as author and the marker."""
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    recorded = await store.record(decided)
    revision = await store.apply(recorded)
    subject = store.subjects.entry(unique, "s", "k")
    msg = await store.nc.request(Subjects.direct_get(store.subjects.kv_stream, subject), b"", timeout=5)
    headers = dict(msg.headers or {})
    assert int(headers["Nats-Sequence"]) == revision
    assert headers["Nats-Msg-Id"] == f"bb-apply:{unique}.{pid}"
    assert headers["Nats-Expected-Last-Subject-Sequence"] == str(recorded.base_revision)
    ours = {k for k in headers if not k.startswith("Nats-")}
    assert ours == {"Bb-Sig-Key", "Bb-Sig-Time", "Bb-Sig"}  # no Bb-Encoding (msgpack), no TTL, nothing else
    envelope = codec.decode(msg.data, "msgpack")
    assert store.name == "worker" and envelope["author"] == "worker"  # the signing identity, not the name given
    assert recorded.source is not None and recorded.source.key == headers["Bb-Sig-Key"]
    assert envelope["metadata"] == {CONSENSUS_METADATA: {"proposal_id": pid, "outcome_sequence": recorded.sequence,
                                                         "provenance": [recorded.source.model_dump()]}}
    created_at = datetime.fromisoformat(envelope["created_at"])
    assert msg.data == encode_entry("y", author="worker", metadata=envelope["metadata"], created_at=created_at)
    assert (await store.board.get(unique, "s", "k")).verdict is Verdict.VERIFIED
    await store.close()
    await store.nc.close()


async def test_weighted_proposal_and_raw_json_ballot_interoperate(settings: Settings, unique: str,
                                                                   committer: VoteCommitter) -> None:
    """A ballot written as JSON by another client (signed over its canonical bytes) counts like
    the SDK's; the same ballot unsigned does not count."""
    async with agents(settings, unique, 3) as (a, b, c):
        board = a.board(unique)
        p = await board.propose("s", "k", ["x", "y"], voters=[a.id, b.id, c.id],
                                policy=Policy(kind="weighted", weights={a.id: 3}))
        await b.board(unique).vote(p.id, "y")
        await c.board(unique).vote(p.id, "y")
        subject = Subjects.vote(unique, p.id, "ballot", a.id)
        ballot = {"v": 1, "id": "json-1", "proposal_id": p.id, "voter": a.id, "choice": 0,
                  "created_at": datetime.now(UTC).isoformat()}
        js = a.nc.jetstream()
        await js.publish(subject, codec.encode(ballot, "json"), headers={"Bb-Encoding": "json"})  # unsigned
        assert await p.commit() is None  # not counted: still open
        headers = {"Bb-Encoding": "json", "Nats-Msg-Id": "json-1"}
        signer = signing_of(a.nc).signer
        assert signer is not None
        signer.sign(subject, headers, validate_wire(Ballot, ballot).canonical_bytes())
        await js.publish(subject, codec.encode(ballot, "json"), headers=headers)
        outcome = await p.outcome(timeout=5)
        assert outcome.status == "accepted" and outcome.value == "x" and outcome.counts.support == [3.0, 2.0]
        assert [cb.ballot_id for cb in outcome.counted_ballots if cb.voter == a.id] == ["json-1"]


async def test_a_ballot_whose_payload_names_another_voter_than_its_subject_does_not_count(
        settings: Settings, unique: str, committer: VoteCommitter) -> None:
    """The subject's voter is authoritative (the server lets only that voter publish there):
    a payload claiming another voter is not a ballot, for the SDK and the committer alike."""
    async with agents(settings, unique, 4) as (a, b, c, mallory):
        board = a.board(unique)
        p = await board.propose("s", "k", ["x", "y"], voters=[a.id, b.id, c.id])
        js = mallory.nc.jetstream()
        for victim in (b.id, c.id):  # had they counted, y would have 2 of 3: decided at once
            forged = {"v": 1, "id": f"forged-{victim}", "proposal_id": p.id, "voter": victim, "choice": 1,
                      "created_at": datetime.now(UTC).isoformat()}
            await js.publish(Subjects.vote(unique, p.id, "ballot", mallory.id), codec.encode(forged))
        assert (await p.counts()).ballots == 0 and await p.commit() is None  # open: nothing counted
        await board.vote(p.id, "x")
        receipt = await b.board(unique).vote(p.id, "x")
        assert receipt.outcome is not None and receipt.outcome.value == "x"
        outcome = await p.outcome(timeout=5)
        assert [cb.voter for cb in outcome.counted_ballots] == [a.id, b.id]
        assert outcome.rejected_ballots == []  # not ballots at all: not even rejected ones
        # (the committer counts a commit once it has also applied it, after the outcome shows)
        for _ in range(100):
            if committer.stats.commits >= 1:
                break
            await asyncio.sleep(0.05)
        assert committer.stats.commits >= 1


async def test_without_a_committer_agents_do_not_commit_outside_an_open_bus(settings: Settings,
                                                                            unique: str) -> None:
    """Agents publish proposals and their own ballots only: the deciding voter waits for the
    worker's outcome, and no agent records, closes or applies anything."""
    quick = settings.model_copy(update={"nats": settings.nats.model_copy(update={"write_timeout": 0.5})})
    async with agents(quick, unique, 2) as (a, b):
        board = a.board(unique)
        p = await board.propose("s", "k", ["x"], voters=[a.id, b.id])
        timed = await board.propose("s", "t", ["x"], deadline=timedelta(seconds=0.3))
        await board.vote(p.id, "x")
        with pytest.raises(OutcomeTimeoutError):
            await b.board(unique).vote(p.id, "x")  # decided by this ballot, committed by nobody
        with pytest.raises(OutcomeTimeoutError):
            await p.outcome(timeout=0.3)
        with pytest.raises(OutcomeTimeoutError):
            await p.commit()
        await until_past(timed.proposal.deadline)
        with pytest.raises(OutcomeTimeoutError):
            await timed.close(timeout=0.3)
        assert await stored_kinds(a.voting.store, unique, p.id) == ["proposal", "ballot", "ballot"]
        assert await stored_kinds(a.voting.store, unique, timed.id) == ["proposal"]
        with pytest.raises(NotFoundError):
            await board.get("s", "k")
        # The committer, started late, commits both from the stream.
        async with running_committer(committer_settings(settings), board=unique):
            assert (await p.outcome(timeout=5)).value == "x"
            assert (await timed.outcome(timeout=5)).status == "no_quorum"
