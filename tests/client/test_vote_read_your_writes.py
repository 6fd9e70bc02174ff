"""A commit that finds the outcome (or its application) recorded reads it, and an agent's vote
and counts see its own ballot, when a replica behind answers their direct gets (404 or an older
message), against a real nats-server.

In an R3 cluster any replica answers a direct get of ``BB_VOTE``; one that has not applied
the outcome yet (a node restarted and catching up) answers 404 although the commit's own
write was just refused because the outcome is there. Here, on one server, the vote store's
direct gets of the outcome and applied subjects are answered with real 404s captured from
the server before either was stored (``VoteStore._request``, the one place it sends them).
The same seam answers an agent's direct gets of a proposal (and of the last message of its
subjects) with what the server answered before the proposal, or before this agent's ballot.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.msg import Msg

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import ProposalFollower, VoteStore
from blackboard.protocol.errors import ProposalNotFoundError
from blackboard.protocol.schemas import Ballot
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.settings import Settings
from tests.sdk.test_consensus import _decided_but_uncommitted, agents

pytestmark = pytest.mark.asyncio


async def test_a_second_commit_reads_the_recorded_outcome_when_a_replica_answers_404(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    nc = await connect_nats(settings.nats, name="second")
    try:
        second = VoteStore(nc, settings, name="second")  # another committer (the worker's identity)
        real = second._request
        gets = [Subjects.direct_get(VOTE_STREAM, Subjects.vote(unique, pid, kind)) for kind in ("outcome", "applied")]
        absent = {subject: await real(subject, b"", "test") for subject in gets}  # real 404s: nothing stored yet
        assert all((msg.headers or {}).get(Header.STATUS.value) == "404" for msg in absent.values())
        committed = await store.commit(decided)
        assert committed.revision is not None

        asked: Counter[str] = Counter()
        # A replica that has applied neither record yet.
        monkeypatch.setattr(second, "_request", _seam(second, absent, asked))
        # record: refused (the outcome is there), reads it; apply: finds the application;
        # mark applied: refused, reads it. Without reading again: "exists but cannot be read".
        assert await second.commit(decided) == committed
        assert second.stale_reads == 2
        assert [asked[subject] for subject in gets] == [3, 3]  # the first, one after each pause; then a consumer
    finally:
        await nc.close()
        await store.nc.close()


Request = Callable[[str, bytes, str], Coroutine[Any, Any, Msg]]


def _seam(store: VoteStore, answers: dict[str, Msg], asked: Counter[str]) -> Request:
    """A ``_request`` answering the direct gets in ``answers`` as captured (a replica behind),
    counting every direct get by subject."""
    real = store._request

    async def behind(subject: str, payload: bytes, what: str) -> Msg:
        asked[subject] += 1
        if subject in answers:
            return answers[subject]
        return await real(subject, payload, what)

    return behind


def _gets(board: str, pid: str) -> tuple[str, str]:
    """The direct gets of a proposal's message and of the last message of its subjects."""
    return (Subjects.direct_get(VOTE_STREAM, Subjects.vote(board, pid, "proposal")),
            Subjects.direct_get(VOTE_STREAM, Subjects.vote_filter(board, pid)))


async def _propose(proposer: Agent, board: str, pid: str, *voters: str) -> None:
    await proposer.board(board).propose("s", "k", ["x", "y"], voters=[*voters, "nobody"], proposal_id=pid)


async def test_a_vote_on_an_unknown_proposal_counts_when_a_replica_answers_404_after_the_ballot(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with agents(settings, unique, 2) as (proposer, voter):
        store = voter.voting.store
        gets = _gets(unique, "p1")
        absent = {subject: await store._request(subject, b"", "test") for subject in gets}  # real 404s
        assert all((msg.headers or {}).get(Header.STATUS.value) == "404" for msg in absent.values())
        await _propose(proposer, unique, "p1", proposer.id, voter.id)
        asked: Counter[str] = Counter()
        monkeypatch.setattr(store, "_request", _seam(store, absent, asked))
        # A replica that has applied neither the proposal nor the ballot: the first lookup's 404
        # is taken (nothing says otherwise), the one after the ballot is not.
        receipt = await voter.voting.vote(unique, "p1", "y")  # was: ProposalNotFoundError
        assert receipt.outcome is None and store.stale_reads == 1
        assert [asked[subject] for subject in gets] == [4, 3]  # then a one-shot consumer read it
        counts = await voter.voting.counts(unique, "p1")
        assert counts.ballots == 1 and store.stale_reads == 2  # the last answered 404: its ballot is waited for


async def test_a_vote_on_a_proposal_that_is_not_there_is_not_found_at_one_more_direct_get(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with agents(settings, unique, 1) as (voter,):
        store = voter.voting.store
        asked: Counter[str] = Counter()
        monkeypatch.setattr(store, "_request", _seam(store, {}, asked))
        with pytest.raises(ProposalNotFoundError):
            await voter.voting.vote(unique, "p1", "y")
        # The filter's answer (this very ballot) proves the 404 current: no pause, no consumer.
        assert [asked[subject] for subject in _gets(unique, "p1")] == [2, 1] and store.stale_reads == 0


async def test_counts_include_the_own_ballot_when_the_last_sequence_answers_older(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with agents(settings, unique, 2) as (proposer, voter):
        store = voter.voting.store
        await _propose(proposer, unique, "p1", proposer.id, voter.id)
        _, last = _gets(unique, "p1")
        older = {last: await store._request(last, b"", "test")}  # the proposal: before the ballot
        sequence = await store.publish_ballot(unique, Ballot(id="b1", proposal_id="p1", voter=voter.id, choice=1,
                                                             created_at=datetime.now(UTC)))
        assert int((older[last].headers or {})[Header.SEQUENCE.value]) < sequence
        asked: Counter[str] = Counter()
        monkeypatch.setattr(store, "_request", _seam(store, older, asked))
        on_message = ProposalFollower._on_message

        async def late(self: ProposalFollower, msg: Msg) -> None:
            if msg.metadata.sequence.stream == sequence:  # the ballot arrives after the proposal has been fed
                await asyncio.sleep(0.2)
            await on_message(self, msg)

        monkeypatch.setattr(ProposalFollower, "_on_message", late)
        counts = await voter.voting.counts(unique, "p1")
        assert counts.ballots == 1 and counts.votes == [0, 1]  # was: 0 ballots (caught up to the proposal)
        assert asked == Counter({last: 1}) and store.stale_reads == 1


async def test_a_current_answer_costs_one_direct_get(settings: Settings, unique: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async with agents(settings, unique, 2) as (proposer, voter):
        store = voter.voting.store
        await _propose(proposer, unique, "p1", proposer.id, voter.id)
        asked: Counter[str] = Counter()
        monkeypatch.setattr(store, "_request", _seam(store, {}, asked))
        await voter.voting.vote(unique, "p1", "y")
        assert asked == Counter({_gets(unique, "p1")[0]: 1})  # the lookup; the follower reads the rest
        asked.clear()
        assert (await voter.voting.counts(unique, "p1")).ballots == 1
        assert asked == Counter({_gets(unique, "p1")[1]: 1}) and store.stale_reads == 0
