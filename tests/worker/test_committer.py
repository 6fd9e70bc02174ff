"""The vote committer (NATS only, no PostgreSQL): commits decisions at once, closes
proposals at their deadline, recovers from a restart mid-vote, and races other
committers to one outcome per proposal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import CONSENSUS_METADATA, ProposalFollower, VoteStore
from blackboard.consensus.log import VoteMessage
from blackboard.protocol.schemas import Ballot, Outcome, Policy
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.committer import retry_wait
from tests._committer import committer_settings, connect_agent, running_committer

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def store(settings: Settings) -> AsyncIterator[VoteStore]:
    """A raw vote store (publishes ballots of any voter, as a test may; commits nothing)."""
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


async def ballot(store: VoteStore, board: str, pid: str, voter: str, choice: int | str) -> int:
    b = Ballot.model_validate({"id": f"{voter}-{pid}-{choice}", "proposal_id": pid, "voter": voter,
                               "choice": choice, "created_at": datetime.now(UTC)})
    return await store.publish_ballot(board, b)


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
        settings: Settings, unique: str, agent: Agent, store: VoteStore) -> None:
    s = committer_settings(settings, vote_commit_grace=30.0)  # the grace is for open buses and half commits
    async with running_committer(s, board=unique, name=f"c-{unique}") as c:
        p = await agent.board(unique).propose("s", "k", ["x", "y"], voters=["v0", "v1", "v2"])
        await ballot(store, unique, p.id, "v0", 1)
        started = time.monotonic()
        await ballot(store, unique, p.id, "v1", 1)
        outcome = await committed(store, unique, p.id)
        assert time.monotonic() - started < 5
        assert outcome.status == "accepted" and outcome.value == "y" and outcome.revision is not None
        entry = await agent.board(unique).get("s", "k")
        assert entry.value == "y" and entry.author == f"c-{unique}"  # the committer applied it
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
        settings: Settings, unique: str, agent: Agent, store: VoteStore) -> None:
    s = committer_settings(settings, vote_commit_grace=0.0)
    board = agent.board(unique)
    decided = await board.propose("s", "decided", ["x", "y"], voters=["v0", "v1", "v2"])
    timed = await board.propose("s", "timed", ["x"], deadline=timedelta(seconds=1))
    half = await board.propose("s", "half", ["x", "y"], voters=["v0", "v1", "v2"])
    async with running_committer(s, board=unique, name="first") as first:
        await ballot(store, unique, decided.id, "v0", 0)
        await ballot(store, unique, timed.id, "v0", 0)
        await first.ready.wait()
        assert first.open_proposals == 3
    # While no committer runs: the decision, the deadline, and a commit that crashed
    # after recording (an outcome recorded by someone, never applied).
    await ballot(store, unique, decided.id, "v1", 0)
    for voter in ("v0", "v1"):
        await ballot(store, unique, half.id, voter, 1)
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
        settings: Settings, unique: str, agent: Agent, store: VoteStore) -> None:
    s = committer_settings(settings, vote_commit_grace=0.0)
    board = agent.board(unique)
    async with running_committer(s, board=unique, name="c1") as c1, \
            running_committer(s, board=unique, name="c2") as c2:
        proposals = [await board.propose("s", f"k{i}", ["x", "y"], voters=["v0", "v1", "v2"]) for i in range(8)]
        timed = [await board.propose("s", f"t{i}", ["x"], deadline=timedelta(seconds=0.5)) for i in range(4)]
        # Ballots of many proposals, published together: both committers decide at once.
        await asyncio.gather(*[ballot(store, unique, p.id, v, i % 2) for i, p in enumerate(proposals)
                               for v in ("v0", "v1")])
        for t in timed:
            await ballot(store, unique, t.id, "v0", "reject")
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
