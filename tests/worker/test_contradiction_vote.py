"""Contradictions settled by a vote (blackboard/worker/contradictions.py, memory.contradictions = "vote").

The proposal a contest makes and how an outcome picks the winner (pure), then the whole way on real
servers: two agents remember contradicting versions of a key, the worker opens a proposal as its own
identity, agents vote, the committer records the outcome at the deadline, and the worker settles the
memories in the transaction that stores it; recall shows the winner.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from blackboard.protocol.schemas import Proposal
from blackboard.worker.contradictions import (
    CONTRADICTION_SECTION,
    ContestRow,
    contest_proposal,
    winner_of,
)

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


@pytest.mark.parametrize(("status", "value", "winner"), [
    ("accepted", "m2", "m2"),
    ("accepted", "m1", "m1"),
    ("rejected", None, "m1"),  # nothing accepted: the status quo stays
    ("no_quorum", None, "m1"),
    ("accepted", "somebody else", "m1"),
])
def test_the_winner_is_the_accepted_candidate_else_the_incumbent(status: str, value: object, winner: str) -> None:
    assert winner_of(status, value, "m1", "m2") == winner
