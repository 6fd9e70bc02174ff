"""Contradictions settled by a vote (blackboard/worker/contradictions.py, memory.contradictions = "vote").

The proposal a contest makes and how an outcome picks the winner (pure), then the whole way on real
servers: two agents remember contradicting versions of a key, the worker opens a proposal as its own
identity, agents vote, the committer records the outcome at the deadline, and the worker settles the
memories in the transaction that stores it; recall shows the winner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from nats.aio.client import Client as NATS

from agents_sdk import Agent
from blackboard.db import migrate, open_pool
from blackboard.protocol.schemas import Outcome, Proposal, TallyCounts
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects
from blackboard.settings import MemorySettings, Settings
from blackboard.worker.contradictions import (
    CONTRADICTION_SECTION,
    ContestRow,
    ContradictionPublisher,
    contest_proposal,
    entry_key,
    settle_outcomes,
    winner_of,
)
from blackboard.worker.handlers import default_handlers
from blackboard.worker.supersession import (
    ContradictionPolicy,
    contest_id,
    keys_before_write,
    settle_written,
)
from tests._worker_helpers import HashProvider, StartWorker, board_memories_handler

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _row(**kw: object) -> ContestRow:
    base: dict[str, object] = dict(
        board="b", proposal_id="contradiction-abc", subject_key="price:sku-1", challenger="m2", challenger_seq=9,
        incumbent="m1", incumbent_seq=4, challenger_text="SKU-1 costs 12 EUR", challenger_agent="bob",
        challenger_from=NOW, incumbent_text="SKU-1 costs 10 EUR", incumbent_agent="alice",
        incumbent_from=NOW - timedelta(days=1))
    return ContestRow(**{**base, **kw})  # type: ignore[arg-type]


def test_a_contest_proposes_the_two_memories_incumbent_first_open_to_any_agent_until_the_deadline() -> None:
    p = contest_proposal(_row(), proposer="worker-1", now=NOW, deadline=300)
    assert isinstance(p, Proposal)
    assert (p.id, p.board, p.section, p.key) == ("contradiction-abc", "b", CONTRADICTION_SECTION, "price:sku-1")
    assert p.candidates == ["m1", "m2"] and p.voters is None and p.policy.kind == "majority"
    assert p.proposer == "worker-1" and p.deadline == NOW + timedelta(seconds=300)
    assert "SKU-1 costs 10 EUR" in p.question and "SKU-1 costs 12 EUR" in p.question
    assert "alice" in p.question and "bob" in p.question
    # Long texts are quoted in part; another id when the contest's own was taken.
    long = contest_proposal(_row(challenger_text="x" * 5000), proposer="w", now=NOW, deadline=1, proposal_id="p-1")
    assert long.id == "p-1" and len(long.question) < 2500
    with pytest.raises(ValueError, match="gone"):
        contest_proposal(_row(incumbent_text=None), proposer="w", now=NOW, deadline=1)


def test_the_target_entry_is_the_subject_key_unless_too_long_for_a_board_key() -> None:
    assert entry_key("price:shop.example.com:sku-1") == "price:shop.example.com:sku-1"
    huge = "価" * 256  # 256 characters, 768 bytes: too long for a board key once encoded
    assert entry_key(huge).startswith("sha256-") and entry_key(huge) == entry_key(huge)
    p = contest_proposal(_row(subject_key=huge), proposer="w", now=NOW, deadline=1)
    assert p.key == entry_key(huge) and huge in p.question


@pytest.mark.parametrize(("status", "value", "winner"), [
    ("accepted", "m2", "m2"),
    ("accepted", "m1", "m1"),
    ("rejected", None, "m1"),  # nothing accepted: the status quo stays
    ("no_quorum", None, "m1"),
    ("accepted", "somebody else", "m1"),
])
def test_the_winner_is_the_accepted_candidate_else_the_incumbent(status: str, value: object, winner: str) -> None:
    assert winner_of(status, value, "m1", "m2") == winner


# -- on real servers --------------------------------------------------------------------------

async def _rows(settings: Settings, board: str) -> dict[str, tuple[Any, ...]]:
    """(valid_from, valid_to, superseded_by, contested_by) of the board's memories by id."""
    async with await psycopg.AsyncConnection.connect(settings.postgres.dsn.get_secret_value()) as conn:
        cur = await conn.execute("SELECT id, valid_from, valid_to, superseded_by, contested_by FROM bb_memories "
                                 "WHERE board = %s", (board,))
        return {r[0]: tuple(r[1:]) for r in await cur.fetchall()}


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_contradiction_is_settled_by_a_vote_and_the_winner_supersedes(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    settings = pg_settings.model_copy(update={"memory": MemorySettings(
        contradictions="vote", vote_boards=[f"{unique}*"], vote_deadline=3.0)})
    votes = dataclasses.replace(default_handlers(settings)[3], filter_subject=Subjects.vote_filter(unique))
    worker = await start_worker(settings, name=f"w{unique}", embed=False, deadline_interval=0.1,
                                handlers=[board_memories_handler(settings, unique), votes], provider=HashProvider())
    price, stock = "price:shop.example.com:sku-1", "stock:sku-1"
    async with contextlib.AsyncExitStack() as stack:
        alice, bob, carol, dave = [await stack.enter_async_context(Agent.connect(f"{unique}-{n}", settings=settings))
                                   for n in ("alice", "bob", "carol", "dave")]
        watch = await stack.enter_async_context(carol.board(unique).watch_votes(start="all"))
        old_price = await alice.remember("SKU-1 costs 10 EUR", board=unique, key=price)
        old_stock = await alice.remember("12 units of SKU-1 in stock", board=unique, key=stock)
        new_price = await bob.remember("SKU-1 costs 12 EUR", board=unique, key=price)
        new_stock = await bob.remember("SKU-1 is out of stock", board=unique, key=stock)
        # The worker puts each contradiction to a vote, as its own identity (the watch shows only
        # what verifies): the incumbent first, both texts in the question.
        proposals: dict[str, Proposal] = {}
        while len(proposals) < 2:
            event = await watch.next(timeout=30)
            if event.kind == "proposal":
                assert isinstance(event.message, Proposal) and event.verdict is Verdict.VERIFIED
                proposals[event.message.key] = event.message
        assert proposals[price].candidates == [old_price, new_price]
        assert proposals[stock].candidates == [old_stock, new_stock]
        assert proposals[price].section == CONTRADICTION_SECTION and worker.committer is not None
        assert proposals[price].proposer == worker.committer.store.name  # the worker's identity
        assert "SKU-1 costs 10 EUR" in proposals[price].question and "SKU-1 costs 12 EUR" in proposals[price].question
        # Meanwhile the challengers are contested, the incumbents current: recall finds these.
        rows = await _rows(settings, unique)
        assert rows[new_price][3] == proposals[price].id and rows[new_stock][3] == proposals[stock].id
        assert rows[old_price][1:] == (None, None, None) and rows[old_stock][1:] == (None, None, None)

        async def recalled(**filters: Any) -> set[str]:
            return {h.id for h in await carol.recall("SKU-1", board=unique, mode="keyword", top_k=20, **filters)}

        assert await recalled() == {old_price, old_stock}
        assert await recalled(include_superseded=True) == {old_price, old_stock, new_price, new_stock}
        # Two votes for the new price, two for the old stock.
        for voter in (carol, dave):
            await voter.board(unique).vote(proposals[price].id, new_price)
            await voter.board(unique).vote(proposals[stock].id, old_stock)
        outcome = await alice.board(unique).proposal(proposals[price].id)
        assert (await outcome.outcome(timeout=30)).value == new_price
        assert (await (await alice.board(unique).proposal(proposals[stock].id)).outcome(timeout=30)).status == "accepted"

        async def settled() -> bool:
            r = await _rows(settings, unique)
            return r[new_price][3] is None and r[new_stock][1] is not None

        await _until(settled)
        rows = await _rows(settings, unique)
        # The winning challenger supersedes the incumbent (closed at its valid_from) and is current.
        assert rows[old_price][1:] == (rows[new_price][0], new_price, None)
        assert rows[new_price][1:] == (None, None, None)
        # The losing challenger was never valid: closed at its own valid_from, superseded by the
        # incumbent, contested by the vote that rejected it; the incumbent stays current.
        assert rows[new_stock][1:] == (rows[new_stock][0], old_stock, proposals[stock].id)
        assert rows[old_stock][1:] == (None, None, None)
        assert await recalled() == {new_price, old_stock}
        lost = (await carol.memory(new_stock, board=unique)).memory
        assert (lost.contested_by, lost.superseded_by) == (proposals[stock].id, old_stock)
        # The accepted value is the winner's id, on the board entry the proposal targets.
        assert (await alice.board(unique).get(CONTRADICTION_SECTION, price)).value == new_price
        # A later version of the stock by its author is no contradiction: it supersedes at once.
        newer = await alice.remember("3 units of SKU-1 in stock", board=unique, key=stock)

        async def superseded() -> bool:
            return bool((await _rows(settings, unique))[old_stock][2] == newer)

        await _until(superseded)


@pytest.mark.asyncio
async def test_the_publisher_is_idempotent_and_never_adopts_a_proposal_another_identity_took_its_id_for(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """Contests are an outbox: publishing one twice stores one proposal; a proposal id someone else
    used first (an agent guessing it) is not the contest's: it moves to the next free id. An outcome
    settles a contest once, however often it is stored again (a replay)."""
    await migrate(pg_settings)
    dsn = pg_settings.postgres.dsn.get_secret_value()
    vote = ContradictionPolicy("vote")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for mid, seq, agent, text in ((f"{unique}-a", 1, "alice", "price 10"), (f"{unique}-b", 2, "bob", "price 12")):
            async with conn.transaction():
                changes = await keys_before_write(conn, [mid], [(unique, "k", (NOW + timedelta(minutes=seq), seq))])
                await conn.execute(
                    "INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq, "
                    "subject_key, valid_from, content_hash) VALUES (%s, %s, %s, 'semantic', %s, now(), now(), %s, %s, "
                    "'k', %s, %s)", (mid, unique, agent, text, unique, seq, NOW + timedelta(minutes=seq), text.encode()))
                await settle_written(conn, changes, [(mid, seq, "k")], vote)
    pid = contest_id(unique, f"{unique}-b", 2)
    async with Agent.connect(f"{unique}-mallory", settings=pg_settings) as mallory, \
            open_pool(pg_settings.postgres, name="test-contests") as pool:
        # Mallory takes the contest's proposal id first, with herself as the only voter.
        await mallory.board(unique).propose(CONTRADICTION_SECTION, "k", [f"{unique}-b", f"{unique}-a"],
                                            voters=[f"{unique}-mallory"], proposal_id=pid)
        publisher = ContradictionPublisher(pool, nc, pg_settings)
        try:
            assert await publisher.publish_once() == 1
            assert await publisher.publish_once() == 0  # nothing pending any more
            moved = f"{pid}-1"
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT proposal_id, proposed_at IS NOT NULL FROM bb_memory_contests "
                                         "WHERE board = %s", (unique,))
                assert await cur.fetchall() == [(moved, True)]
                # Published again (a worker that crashed before marking it): the proposal found is the
                # worker's, with these candidates: adopted, not renamed.
                await conn.execute("UPDATE bb_memory_contests SET proposed_at = NULL WHERE board = %s", (unique,))
                await conn.commit()
            assert await publisher.publish_once() == 1
            assert publisher.published == 2
        finally:
            await publisher.store.close()
        handle = await mallory.board(unique).proposal(moved)
        assert handle.proposal.candidates == [f"{unique}-a", f"{unique}-b"] and handle.proposal.voters is None
        assert (await _rows(pg_settings, unique))[f"{unique}-b"][3] == moved
        # The outcome (stored by the votes handler; here by hand) settles it, once.
        outcome = Outcome(proposal_id=moved, board=unique, section=CONTRADICTION_SECTION, key="k",
                          status="accepted", candidate=1, value=f"{unique}-b", closed_by="deadline", deciding_sequence=None,
                          counted_ballots=[],
                          decided_at=NOW + timedelta(hours=1), counts=TallyCounts(ballots=0, votes=[0, 0], reject=0, abstain=0, support=[0.0, 0.0],
                                                             reject_support=0.0))
        async with pool.connection() as conn:
            assert await settle_outcomes(conn, [outcome]) == 1
            await conn.commit()
        settled = await _rows(pg_settings, unique)
        assert settled[f"{unique}-a"][1:] == (NOW + timedelta(minutes=2), f"{unique}-b", None)
        assert settled[f"{unique}-b"][1:] == (None, None, None)
        async with pool.connection() as conn:
            await settle_outcomes(conn, [outcome])  # replayed
            await conn.commit()
        assert await _rows(pg_settings, unique) == settled
