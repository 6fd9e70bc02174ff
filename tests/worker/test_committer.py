"""The vote committer (NATS only, no PostgreSQL): commits decisions at once, closes
proposals at their deadline, recovers from a restart mid-vote, and races other
committers to one outcome per proposal."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import CONSENSUS_METADATA, ProposalFollower, VoteStore
from blackboard.client.signing import signing_of
from blackboard.consensus.log import VoteKind, VoteMessage
from blackboard.protocol.errors import ProposalNotFoundError, UnverifiedRecordError
from blackboard.protocol.schemas import Ballot, Outcome, Policy, Proposal, TallyCounts
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects
from blackboard.security.signer import Signer, now_us
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.committer import retry_wait
from tests._committer import committer_settings, connect_agent, running_committer
from tests._raw_signer import raw_signer

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def store(settings: Settings) -> AsyncIterator[VoteStore]:
    """A raw vote store as the worker identity (reads, and records when a test says so)."""
    nc = await connect_nats(settings.nats, name="raw")
    s = VoteStore(nc, settings, name="raw")
    try:
        yield s
    finally:
        await s.close()
        await nc.close()


@pytest_asyncio.fixture
async def agent(settings: Settings, unique: str) -> AsyncIterator[Agent]:
    a = await connect_agent(unique, settings)  # commits nothing itself
    try:
        yield a
    finally:
        await a.close()


async def until_past(deadline: datetime | None, margin: float = 0.05) -> None:
    assert deadline is not None
    await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + margin)


class Voters:
    """Voting agents of one test (``<unique>-<name>``), connected on first use: each publishes
    its own ballots, signed by its key, without waiting for their fate or a commit."""

    def __init__(self, settings: Settings, prefix: str) -> None:
        self._settings = settings
        self._prefix = prefix
        self._agents: dict[str, Agent] = {}
        self._lock = asyncio.Lock()

    def __call__(self, *names: str) -> list[str]:
        """The agent ids of these voters."""
        return [f"{self._prefix}-{n}" for n in names]

    async def agent(self, name: str) -> Agent:
        async with self._lock:
            if name not in self._agents:
                self._agents[name] = await connect_agent(self(name)[0], self._settings)
            return self._agents[name]

    async def connect(self, *names: str) -> None:
        """Connect these voters now (before a deadline starts to run)."""
        for name in names:
            await self.agent(name)

    async def close(self) -> None:
        for a in self._agents.values():
            await a.close()


@pytest_asyncio.fixture
async def voters(settings: Settings, unique: str) -> AsyncIterator[Voters]:
    v = Voters(settings, unique)
    try:
        yield v
    finally:
        await v.close()


async def ballot(voters: Voters, board: str, pid: str, voter: str, choice: int | str) -> int:
    agent = await voters.agent(voter)
    b = Ballot.model_validate({"id": f"{voter}-{pid}-{choice}", "proposal_id": pid, "voter": agent.id,
                               "choice": choice, "created_at": datetime.now(UTC)})
    return await agent.voting.store.publish_ballot(board, b)


async def stored(store: VoteStore, board: str, pid: str) -> list[VoteMessage]:
    msgs: list[VoteMessage] = []
    async with store.follow(Subjects.vote_filter(board, pid), msgs.append) as f:
        await f.ready.wait()
    return msgs


async def committed(store: VoteStore, board: str, pid: str, timeout: float = 10.0) -> Outcome:
    """The committed outcome, once the stream shows it."""
    async with ProposalFollower(store, board, pid) as f:
        await f.wait_for(lambda log: log.committed is not None, timeout)
        assert f.log.committed is not None
        return f.log.committed


async def assert_committed_once(store: VoteStore, agent: Agent, board: str, pid: str, key: str) -> Outcome:
    outcome = await committed(store, board, pid)
    kinds = [m.kind for m in await stored(store, board, pid)]
    assert kinds.count("outcome") == 1, kinds
    assert kinds.count("applied") == (1 if outcome.status == "accepted" else 0), kinds
    history = await agent.board(board).history("s", key)
    applications = [e.revision for e in history
                    if (e.metadata.get(CONSENSUS_METADATA) or {}).get("proposal_id") == pid]
    assert applications == ([outcome.revision] if outcome.status == "accepted" else [])
    return outcome


async def test_the_committer_commits_a_decision_as_soon_as_it_is_decided(
        settings: Settings, unique: str, agent: Agent, store: VoteStore,
        voters: Voters) -> None:
    s = committer_settings(settings, vote_commit_grace=30.0)  # the grace is for open buses and half commits
    async with running_committer(s, board=unique, name=f"c-{unique}") as c:
        p = await agent.board(unique).propose("s", "k", ["x", "y"], voters=voters("v0", "v1", "v2"))
        await ballot(voters, unique, p.id, "v0", 1)
        started = time.monotonic()
        await ballot(voters, unique, p.id, "v1", 1)
        outcome = await committed(store, unique, p.id)
        assert time.monotonic() - started < 5
        assert outcome.status == "accepted" and outcome.value == "y" and outcome.revision is not None
        entry = await agent.board(unique).get("s", "k")
        # the committer applied it, as the worker identity it signs with (not the name it was given)
        assert entry.value == "y" and entry.author == "worker" and entry.verdict is Verdict.VERIFIED
        assert c.stats.commits == 1 and c.open_proposals == 0


async def test_the_committer_closes_a_proposal_at_its_deadline(settings: Settings, unique: str,
                                                               agent: Agent) -> None:
    # A long check interval: the close must come from the deadline itself, not the next check.
    async with running_committer(committer_settings(settings, deadline_interval=30.0), board=unique) as c:
        p = await agent.board(unique).propose("s", "k", ["x"], voters=[agent.id, "other"], policy=Policy(quorum=2),
                                              deadline=timedelta(seconds=0.5))
        await agent.board(unique).vote(p.id, "x")
        outcome = await p.outcome(timeout=5)
        assert datetime.now(UTC) - (p.proposal.deadline or datetime.now(UTC)) < timedelta(seconds=3)
        assert outcome.status == "no_quorum" and outcome.closed_by == "deadline"
        assert outcome.decided_at == p.proposal.deadline and outcome.counts.ballots == 1
        assert c.stats.close_requests >= 1
        assert await p.close(timeout=1) == outcome  # the handle just reads it


async def test_a_committer_restarted_mid_vote_commits_exactly_one_outcome(
        settings: Settings, unique: str, agent: Agent, store: VoteStore,
        voters: Voters) -> None:
    s = committer_settings(settings, vote_commit_grace=0.0)
    board = agent.board(unique)
    await voters.connect("v0", "v1")
    decided = await board.propose("s", "decided", ["x", "y"], voters=voters("v0", "v1", "v2"))
    timed = await board.propose("s", "timed", ["x"], deadline=timedelta(seconds=1))
    half = await board.propose("s", "half", ["x", "y"], voters=voters("v0", "v1", "v2"))
    async with running_committer(s, board=unique, name="first") as first:
        await ballot(voters, unique, decided.id, "v0", 0)
        await ballot(voters, unique, timed.id, "v0", 0)
        await first.ready.wait()
        assert first.open_proposals == 3
    # While no committer runs: the decision, the deadline, and a commit that crashed
    # after recording (an outcome recorded by someone, never applied).
    await ballot(voters, unique, decided.id, "v1", 0)
    for voter in ("v0", "v1"):
        await ballot(voters, unique, half.id, voter, 1)
    await until_past(timed.proposal.deadline, 0.1)
    assert await store.read_recorded(unique, decided.id) is None  # nobody committed meanwhile
    async with ProposalFollower(store, unique, half.id) as f:
        await f.wait_for(lambda log: log.decided is not None, 5)
        assert f.log.decided is not None
        await store.record(f.log.decided)
    async with running_committer(s, board=unique, name="second") as second:
        outcomes = [await assert_committed_once(store, agent, unique, pid, key)
                    for pid, key in ((decided.id, "decided"), (timed.id, "timed"), (half.id, "half"))]
        assert second.stats.commits >= 3 and second.stats.close_requests >= 1
    assert [o.value for o in outcomes] == ["x", "x", "y"]
    assert outcomes[1].closed_by == "deadline" and outcomes[1].decided_at == timed.proposal.deadline


async def test_two_committers_racing_commit_one_outcome_per_proposal(
        settings: Settings, unique: str, agent: Agent, store: VoteStore,
        voters: Voters) -> None:
    s = committer_settings(settings, vote_commit_grace=0.0)
    board = agent.board(unique)
    async with running_committer(s, board=unique, name="c1") as c1, \
            running_committer(s, board=unique, name="c2") as c2:
        await voters.connect("v0", "v1")
        proposals = [await board.propose("s", f"k{i}", ["x", "y"], voters=voters("v0", "v1", "v2")) for i in range(8)]
        # The timed proposals' ballots first, well before their deadline (on a loaded machine
        # the ballots below can take longer than a short deadline).
        timed = [await board.propose("s", f"t{i}", ["x"], deadline=timedelta(seconds=2)) for i in range(4)]
        for t in timed:
            await ballot(voters, unique, t.id, "v0", "reject")
        # Ballots of many proposals, published together: both committers decide at once.
        await asyncio.gather(*[ballot(voters, unique, p.id, v, i % 2) for i, p in enumerate(proposals)
                               for v in ("v0", "v1")])
        await until_past(timed[-1].proposal.deadline)
        outcomes = [await assert_committed_once(store, agent, unique, p.id, f"k{i}")
                    for i, p in enumerate(proposals)]
        outcomes += [await assert_committed_once(store, agent, unique, t.id, f"t{i}") for i, t in enumerate(timed)]
        assert [o.value for o in outcomes[:8]] == ["x", "y"] * 4
        assert all(o.status == "rejected" and o.closed_by == "deadline" for o in outcomes[8:])
        assert c1.stats.commits + c2.stats.commits >= 12


async def test_the_committer_needs_no_postgres_and_recovers_from_the_stream(settings: Settings,
                                                                             unique: str) -> None:
    """Only NATS is configured (the settings' PostgreSQL is never reached); a committer that
    starts after a proposal was decided and committed has nothing left to do for it."""
    async with await connect_agent(unique, settings) as a:
        async with running_committer(committer_settings(settings), board=unique):
            p = await a.board(unique).propose("s", "k", ["x"], voters=[a.id])
            receipt = await a.board(unique).vote(p.id, "x")
            assert receipt.outcome is not None and receipt.outcome.revision is not None
        async with running_committer(committer_settings(settings), board=unique) as late:
            assert late.ready.is_set() and late.open_proposals == 0
            await asyncio.sleep(0.3)
            assert late.stats.commits == 0 and late.stats.messages == 4


async def test_a_proposal_that_keeps_failing_to_commit_waits_longer_each_time() -> None:
    # A garbage outcome published first occupies a proposal's outcome subject, so its commit
    # fails until an operator steps in: the committer must not try again every second for ever.
    waits = [retry_wait(n, 1.0) for n in range(1, 10)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert retry_wait(1, 2.5) == 2.5 and retry_wait(40, 2.5) == 60.0


# ------------------------------------------------------------------ signatures
async def test_an_outcome_is_signed_by_the_worker_and_its_sources_are_the_signed_messages(
        settings: Settings, unique: str, agent: Agent, store: VoteStore, voters: Voters) -> None:
    async with running_committer(committer_settings(settings), board=unique):
        p = await agent.board(unique).propose("s", "k", ["x", "y"], voters=voters("v0", "v1", "v2"))
        seqs = [await ballot(voters, unique, p.id, v, 1) for v in ("v0", "v1")]
        outcome = await committed(store, unique, p.id)
    kinds: tuple[VoteKind, ...] = ("outcome", "applied")
    for kind in kinds:
        msg = await store.read(unique, p.id, kind)
        assert msg is not None and msg.verdict is Verdict.VERIFIED  # signed by a worker identity
    # The proposal and the counted ballots, in stream order, with the signatures they were stored with.
    assert [(s.stream, s.seq) for s in outcome.sources] == [("BB_VOTE", p.sequence), *(("BB_VOTE", q) for q in seqs)]
    verifier = signing_of(store.nc).verifier
    assert verifier is not None
    js = store.nc.jetstream()
    for src, author in zip(outcome.sources, [agent.id, *voters("v0", "v1")], strict=True):
        raw = await js.get_msg("BB_VOTE", src.seq)
        assert raw.subject and raw.data and raw.headers is not None
        assert (raw.headers["Bb-Sig-Key"], raw.headers["Bb-Sig"]) == (src.key, src.sig)
        verdict = await verifier.verify(Signed(raw.subject, raw.headers, raw.data, author=author))
        assert verdict is Verdict.VERIFIED
    # The board entry that applies it names the outcome record as its provenance, and verifies.
    entry = await agent.board(unique).get("s", "k")
    assert entry.verdict is Verdict.VERIFIED and entry.author == "worker"
    (provenance,) = entry.metadata[CONSENSUS_METADATA]["provenance"]
    recorded = await js.get_msg("BB_VOTE", provenance["seq"])
    assert recorded.subject == Subjects.vote(unique, p.id, "outcome") and recorded.headers is not None
    assert (provenance["key"], provenance["sig"]) == (recorded.headers["Bb-Sig-Key"], recorded.headers["Bb-Sig"])


async def test_proposals_and_ballots_that_do_not_verify_are_not_counted(
        settings: Settings, unique: str, agent: Agent, store: VoteStore, voters: Voters) -> None:
    async with running_committer(committer_settings(settings), board=unique) as c:
        v0 = await voters.agent("v0")
        p = await agent.board(unique).propose("s", "k", ["x", "y"], voters=voters("v0", "v1"))
        subject = Subjects.vote(unique, p.id, "ballot", v0.id)
        signer = signing_of(v0.nc).signer
        assert signer is not None
        js = v0.nc.jetstream()

        async def publish(bid: str, *, sign: bool = True, tamper: bool = False, age: float = 0.0) -> int:
            b = Ballot(id=bid, proposal_id=p.id, voter=v0.id, choice=1, created_at=datetime.now(UTC))
            headers = {"Nats-Msg-Id": bid}
            if sign:
                signer.sign(subject, headers, b.canonical_bytes(), now_us=now_us() - int(age * 1e6))
            payload = b.model_copy(update={"choice": 0}).canonical_bytes() if tamper else b.canonical_bytes()
            return (await js.publish(subject, payload, headers=headers)).seq

        # v0's ballots for y that do not verify: unsigned, tampered with after signing, signed long ago
        bad = {await publish("unsigned", sign=False): Verdict.UNSIGNED,
               await publish("tampered", tamper=True): Verdict.BAD_SIGNATURE,
               await publish("old", age=120.0): Verdict.STALE}
        await ballot(voters, unique, p.id, "v1", 1)  # had v0's counted, y would have both voters
        async with ProposalFollower(store, unique, p.id) as f:
            await f.catch_up()
            assert f.log.decided is None and f.log.tally is not None and f.log.tally.counts().ballots == 1
            assert {seq: f.log.unverified[seq] for seq in bad} == bad
            assert all(f.log.fates[seq] is not None and f.log.fates[seq].reason == "unverified"  # type: ignore[union-attr]
                       for seq in bad)
        assert c.stats.commits == 0 and c.log_of(unique, p.id) is not None
        receipt = await v0.board(unique).vote(p.id, "y")  # a ballot that verifies decides it
        assert receipt.outcome is not None and receipt.outcome.value == "y"
        counted = [cb.sequence for cb in receipt.outcome.counted_ballots]
        assert not set(counted) & set(bad) and [s.seq for s in receipt.outcome.sources][1:] == counted

        # A proposal that does not verify (unsigned) is no proposal: not found, never tracked.
        forged = Proposal(id=f"{p.id}-2", board=unique, section="s", key="k2", candidates=["x"],
                          voters=[v0.id], proposer=v0.id, created_at=datetime.now(UTC))
        await js.publish(Subjects.vote(unique, forged.id, "proposal"), forged.canonical_bytes(),
                         headers={"Nats-Msg-Id": forged.id})
        with pytest.raises(ProposalNotFoundError):
            await agent.board(unique).proposal(forged.id)
        await asyncio.sleep(0.2)
        assert c.log_of(unique, forged.id) is None


async def test_an_outcome_not_signed_by_a_worker_is_not_the_outcome(
        settings: Settings, unique: str, agent: Agent) -> None:
    """Only a worker identity's outcome counts: one signed by another identity (here an
    operator, who may publish it) is ignored by every reader, as if it were not there."""
    p = await agent.board(unique).propose("s", "k", ["x"], voters=[agent.id, "other"])
    nc, operator = await raw_signer(settings.nats.url, "operator")
    try:
        forged = Outcome(proposal_id=p.id, board=unique, section="s", key="k", status="rejected", candidate=None,
                         closed_by="decision", deciding_sequence=None, decided_at=datetime.now(UTC),
                         counts=TallyCounts(ballots=0, votes=[0], reject=0, abstain=0, support=[0.0],
                                            reject_support=0.0),
                         counted_ballots=[])
        subject = Subjects.vote(unique, p.id, "outcome")
        headers = {"Nats-Msg-Id": f"forged-{p.id}"}
        operator.sign(subject, headers, forged.canonical_bytes())
        seq = (await nc.jetstream().publish(subject, forged.canonical_bytes(), headers=headers)).seq
    finally:
        await nc.close()
    async with ProposalFollower(agent.voting.store, unique, p.id) as f:
        await f.catch_up()
        assert f.log.recorded is None and f.log.committed is None
        assert f.log.unverified == {seq: Verdict.WRONG_AUTHOR}
    assert await agent.voting.store.read_recorded(unique, p.id) is None
    assert await p.commit() is None  # still open


async def test_a_ballot_of_the_agent_that_does_not_verify_raises(settings: Settings, unique: str,
                                                                 agent: Agent) -> None:
    """The voter learns that its own stored ballot does not verify (here: signed with a clock
    two minutes behind), and it is not counted."""
    p = await agent.board(unique).propose("s", "k", ["x"], voters=[agent.id, "other"])
    store = agent.voting.store
    real = store.signing
    assert real.signer is not None
    signer: Signer = real.signer

    class Late:
        principal = signer.principal

        def sign(self, subject: str, headers: dict[str, str], record: bytes) -> None:
            signer.sign(subject, headers, record, now_us=now_us() - 120_000_000)

    store.signing = dataclasses.replace(real, signer=Late())  # type: ignore[arg-type]
    with pytest.raises(UnverifiedRecordError) as err:
        await p.vote("x")
    assert err.value.verdict == "stale" and err.value.sequence is not None
    store.signing = real
    assert (await p.counts()).ballots == 0
