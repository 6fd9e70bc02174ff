"""The tally of a vote (blackboard.consensus.tally): rules of docs/voting.md, checked
example by example and, with hypothesis, against a brute-force reference."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard.consensus.tally import (
    StampedBallot,
    Tally,
    check_ballot,
    choice_for,
    rejection_error,
    tally,
)
from blackboard.protocol.errors import (
    DeadlinePassedError,
    IneligibleVoterError,
    InvalidBallotError,
    ProposalClosedError,
    ProposalNotFoundError,
)
from blackboard.protocol.schemas import Ballot, BallotRejection, Choice, Outcome, Policy, Proposal

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DEADLINE = T0 + timedelta(seconds=1000)
VOTERS = ["a", "b", "c", "d"]


def proposal(
    candidates: list[Any] | None = None,
    policy: Policy | None = None,
    voters: list[str] | None = VOTERS,
    deadline: datetime | None = DEADLINE,
    pid: str = "p1",
) -> Proposal:
    return Proposal(
        id=pid,
        board="b",
        section="s",
        key="k",
        candidates=candidates if candidates is not None else ["x", "y"],
        policy=policy or Policy(),
        voters=voters,
        proposer="a",
        created_at=T0,
        deadline=deadline,
    )


class Stream:
    """Builds a ballot stream: sequences 1, 2, ... and timestamps T0 + seq s."""

    def __init__(self) -> None:
        self.items: list[StampedBallot] = []
        self._ids = itertools.count(1)

    def vote(
        self,
        voter: str,
        choice: Choice,
        *,
        at: datetime | None = None,
        pid: str = "p1",
        ballot_id: str | None = None,
    ) -> Stream:
        seq = len(self.items) + 1
        ballot = Ballot(
            id=ballot_id or f"ballot-{next(self._ids)}",
            proposal_id=pid,
            voter=voter,
            choice=choice,
            created_at=T0,
        )
        self.items.append(StampedBallot(seq, at or T0 + timedelta(seconds=seq), ballot))
        return self


def restamp(ballots: list[Ballot], at: datetime | None = None) -> list[StampedBallot]:
    """Give ballots consecutive sequences in this order."""
    return [
        StampedBallot(i + 1, at or T0 + timedelta(seconds=i + 1), b) for i, b in enumerate(ballots)
    ]


def closed(p: Proposal, items: list[StampedBallot]) -> Outcome:
    """The outcome, closing at the deadline if no ballot decided it."""
    outcome = tally(p, items, DEADLINE + timedelta(seconds=1)).outcome
    assert outcome is not None
    return outcome


def decision(outcome: Outcome) -> tuple[Any, ...]:
    """What an outcome decided, independent of stream positions."""
    return (outcome.status, outcome.candidate, outcome.value, outcome.counts, outcome.closed_by)


# -- reference: the rules of docs/voting.md, written out naively -----------


def ref_final(p: Proposal, votes: dict[str, Choice]) -> tuple[str, int | None]:
    """Status and candidate of a proposal closed with these counted ballots."""
    policy = p.policy
    if len(votes) < (policy.quorum or 1):
        return ("no_quorum", None)

    def weight(voter: str) -> Fraction:
        if policy.kind != "weighted":
            return Fraction(1)
        return Fraction(str(policy.weights.get(voter, 1.0)))

    cast = sum((weight(v) for v, c in votes.items() if c != "abstain"), Fraction(0))
    support = [
        sum((weight(v) for v, c in votes.items() if c == i), Fraction(0))
        for i in range(len(p.candidates))
    ]

    def wins(s: Fraction) -> bool:
        if s <= 0:
            return False
        if policy.kind == "unanimous":
            return s == cast
        if policy.threshold is None:
            return 2 * s > cast
        return s >= Fraction(str(policy.threshold)) * cast

    qualifying = [i for i in range(len(support)) if wins(support[i])]
    if not qualifying:
        return ("rejected", None)
    return ("accepted", max(qualifying, key=lambda i: (support[i], -i)))


def ref_fixed(p: Proposal, votes: dict[str, Choice]) -> bool:
    """Whether every way the voters who have not voted could act gives one result."""
    assert p.voters is not None
    remaining = [v for v in p.voters if v not in votes]
    options: list[Choice | None] = [None, "abstain", "reject", *range(len(p.candidates))]
    results = set()
    for combo in itertools.product(options, repeat=len(remaining)):
        final = dict(votes)
        final.update({v: c for v, c in zip(remaining, combo, strict=True) if c is not None})
        results.add(ref_final(p, final))
        if len(results) > 1:
            return False
    return True


# -- strategies --------------------------------------------------------------

thresholds = st.sampled_from([0.25, 0.5, 0.6, 2 / 3, 0.75, 0.9, 1.0])
weights = st.dictionaries(st.sampled_from(VOTERS), st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
policies = st.one_of(
    st.builds(Policy, kind=st.just("majority")),
    st.builds(Policy, kind=st.just("threshold"), threshold=thresholds),
    st.builds(Policy, kind=st.just("unanimous")),
    st.builds(Policy, kind=st.just("weighted"), weights=weights, threshold=st.none() | thresholds),
)


@st.composite
def fixed_proposals(draw: st.DrawFn) -> Proposal:
    n = draw(st.integers(1, 4))
    policy = draw(policies)
    quorum = draw(st.none() | st.integers(1, n))
    policy = policy.model_copy(update={"quorum": quorum})
    k = draw(st.integers(1, 2))
    return proposal(candidates=["x", "y"][:k], policy=policy, voters=VOTERS[:n])


def choices(p: Proposal) -> st.SearchStrategy[Choice]:
    return st.sampled_from([*range(len(p.candidates)), "reject", "abstain"])


@st.composite
def distinct_votes(draw: st.DrawFn, p: Proposal) -> list[Ballot]:
    """One valid ballot from each of some eligible voters, in a random order."""
    assert p.voters is not None
    voters = draw(st.permutations(p.voters))
    voters = voters[: draw(st.integers(0, len(voters)))]
    return [
        Ballot(id=f"id-{v}", proposal_id=p.id, voter=v, choice=draw(choices(p)), created_at=T0)
        for v in voters
    ]


fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- properties ----------------------------------------------------------------


@fast
@given(st.data())
def test_deciding_ballot_is_the_first_at_which_the_outcome_is_fixed(data: st.DataObject) -> None:
    p = data.draw(fixed_proposals())
    voter = st.sampled_from([*(p.voters or []), "outsider"])
    choice = st.sampled_from([*range(len(p.candidates)), "reject", "abstain", 7])
    raw = data.draw(st.lists(st.tuples(voter, choice), max_size=8))
    stream = Stream()
    for v, c in raw:
        stream.vote(v, c)

    votes: dict[str, Choice] = {}
    expected_deciding = None
    for item in stream.items:
        b = item.ballot
        if b.voter not in (p.voters or []) or (
            isinstance(b.choice, int) and b.choice >= len(p.candidates)
        ):
            continue
        votes[b.voter] = b.choice
        if ref_fixed(p, votes):
            expected_deciding = item.sequence
            break

    result = tally(p, stream.items)
    if expected_deciding is None:
        assert result.outcome is None
        outcome = result.expire(DEADLINE + timedelta(microseconds=1))
        assert outcome is not None and outcome.closed_by == "deadline"
    else:
        outcome = result.outcome
        assert outcome is not None and outcome.closed_by == "decision"
        assert outcome.deciding_sequence == expected_deciding
    assert (outcome.status, outcome.candidate) == ref_final(p, votes)


@fast
@given(st.data())
def test_permuting_non_deciding_ballots_keeps_the_outcome(data: st.DataObject) -> None:
    p = data.draw(fixed_proposals())
    ballots = data.draw(distinct_votes(p))
    first = closed(p, restamp(ballots))
    if first.deciding_sequence is None:
        before, after = ballots, []  # nothing decided: every ballot is non-deciding
    else:
        before, after = (
            ballots[: first.deciding_sequence - 1],
            ballots[first.deciding_sequence - 1 :],
        )
    shuffled = data.draw(st.permutations(before))
    second = closed(p, restamp([*shuffled, *after]))
    assert decision(second) == decision(first)
    assert second.deciding_sequence == first.deciding_sequence


@fast
@given(st.data())
def test_permuting_ballots_of_an_open_electorate_keeps_the_outcome(data: st.DataObject) -> None:
    policy = data.draw(
        policies.filter(lambda pol: pol.kind != "unanimous" and pol.threshold != 1.0)
    )
    p = proposal(policy=policy, voters=None)
    fixed = proposal(policy=policy)  # same choices, used to draw ballots
    ballots = data.draw(distinct_votes(fixed))
    first = closed(p, restamp(ballots))
    second = closed(p, restamp(data.draw(st.permutations(ballots))))
    assert first.closed_by == "deadline"  # only unanimity can close an open electorate early
    assert decision(second) == decision(first)
    assert (first.status, first.candidate) == ref_final(p, {b.voter: b.choice for b in ballots})


@fast
@given(st.data())
def test_tally_is_deterministic(data: st.DataObject) -> None:
    p = data.draw(fixed_proposals())
    items = restamp(data.draw(distinct_votes(p)))
    one, two = (
        tally(p, items, DEADLINE + timedelta(seconds=1)),
        tally(p, list(reversed(items)), DEADLINE + timedelta(seconds=1)),
    )
    assert one.outcome == two.outcome
    assert one.rejected == two.rejected


@fast
@given(st.data())
def test_resent_ballots_count_once(data: st.DataObject) -> None:
    p = data.draw(fixed_proposals())
    ballots = data.draw(distinct_votes(p))
    copies = data.draw(st.lists(st.sampled_from(ballots), max_size=4)) if ballots else []
    mixed = list(ballots)
    for copy in copies:  # insert each copy somewhere after its original
        start = mixed.index(copy) + 1
        mixed.insert(data.draw(st.integers(start, len(mixed))), copy)
    base, noisy = closed(p, restamp(ballots)), closed(p, restamp(mixed))
    assert decision(noisy) == decision(base)
    assert noisy.counts.ballots == len({c.voter for c in noisy.counted_ballots})
    assert all(r.reason in ("duplicate", "closed") for r in tally(p, restamp(mixed)).rejected)


@fast
@given(st.data())
def test_ineligible_late_and_invalid_ballots_never_change_the_outcome(data: st.DataObject) -> None:
    p = data.draw(fixed_proposals())
    ballots = data.draw(distinct_votes(p))
    base = closed(p, restamp(ballots))

    late = DEADLINE + timedelta(seconds=5)
    noise_kinds = st.sampled_from(["ineligible", "late", "invalid", "other_proposal"])
    items: list[tuple[Ballot, datetime | None]] = [(b, None) for b in ballots]
    for i, kind in enumerate(data.draw(st.lists(noise_kinds, max_size=5))):
        voter = data.draw(st.sampled_from(p.voters or VOTERS))
        fields: dict[str, Any] = {
            "voter": voter,
            "choice": data.draw(choices(p)),
            "proposal_id": p.id,
        }
        when = None
        if kind == "ineligible":
            fields["voter"] = "outsider"
        elif kind == "late":
            when = late
        elif kind == "invalid":
            fields["choice"] = len(p.candidates) + 3
        else:
            fields["proposal_id"] = "p2"
        noise = Ballot(id=f"noise-{i}", created_at=T0, **fields)
        items.insert(data.draw(st.integers(0, len(items))), (noise, when))
    stamped = [
        StampedBallot(i + 1, when or T0 + timedelta(seconds=i + 1), b)
        for i, (b, when) in enumerate(items)
    ]
    noisy = closed(p, stamped)
    assert decision(noisy) == decision(base)
    assert [c.ballot_id for c in noisy.counted_ballots] == [
        c.ballot_id for c in base.counted_ballots
    ]


@fast
@given(st.data())
def test_ties_go_to_the_lowest_candidate_index(data: st.DataObject) -> None:
    threshold = data.draw(st.sampled_from([0.25, 1 / 3, 0.5]))
    k = 3
    p = proposal(
        candidates=["x", "y", "z"],
        policy=Policy(kind="threshold", threshold=threshold),
        voters=None,
    )
    votes = data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=9))
    ballots = [
        Ballot(id=f"id{i}", proposal_id="p1", voter=f"v{i}", choice=c, created_at=T0)
        for i, c in enumerate(votes)
    ]
    outcome = closed(p, restamp(ballots))
    support = [votes.count(i) for i in range(k)]
    qualifying = [
        i
        for i in range(k)
        if support[i] > 0 and support[i] >= Fraction(str(threshold)) * len(votes)
    ]
    if qualifying:
        top = max(support[i] for i in qualifying)
        assert outcome.candidate == min(i for i in qualifying if support[i] == top)
    else:
        assert outcome.status == "rejected"


# -- rules, example by example ---------------------------------------------


def test_majority_needs_more_than_half_of_the_cast_ballots() -> None:
    p = proposal(voters=None)
    half = Stream().vote("a", 0).vote("b", 1).vote("c", 0).vote("d", "reject")
    assert closed(p, half.items).status == "rejected"  # 2 of 4 is not more than half
    more = Stream().vote("a", 0).vote("b", 1).vote("c", 0)
    assert closed(p, more.items).candidate == 0  # 2 of 3


def test_abstentions_count_for_the_quorum_but_not_in_the_fraction() -> None:
    p = proposal(policy=Policy(quorum=3), voters=None)
    items = Stream().vote("a", 0).vote("b", "abstain").vote("c", "abstain").items
    outcome = closed(p, items)
    assert (outcome.status, outcome.candidate) == ("accepted", 0)  # 1 of 1 cast, 3 ballots present
    assert outcome.counts.abstain == 2 and outcome.counts.ballots == 3


def test_quorum_boundary() -> None:
    p = proposal(policy=Policy(quorum=3), voters=None)
    assert closed(p, Stream().vote("a", 0).vote("b", 0).items).status == "no_quorum"
    assert closed(p, Stream().vote("a", 0).vote("b", 0).vote("c", 1).items).status == "accepted"
    assert closed(p, []).status == "no_quorum"  # no quorum given means at least one ballot
    assert closed(proposal(voters=None), []).status == "no_quorum"


@pytest.mark.parametrize(
    ("threshold", "yes", "total", "status"),
    [
        (2 / 3, 2, 3, "accepted"),  # exactly two thirds
        (2 / 3, 3, 5, "rejected"),
        (0.9, 9, 10, "accepted"),  # 0.9 is 9/10 exactly, not the double just above it
        (0.9, 8, 10, "rejected"),
        (0.7, 7, 10, "accepted"),
        (0.1, 1, 10, "accepted"),
        (1.0, 3, 3, "accepted"),
        (1.0, 2, 3, "rejected"),
    ],
)
def test_threshold_boundaries(threshold: float, yes: int, total: int, status: str) -> None:
    p = proposal(
        candidates=["x"], policy=Policy(kind="threshold", threshold=threshold), voters=None
    )
    stream = Stream()
    for i in range(total):
        stream.vote(f"v{i}", 0 if i < yes else "reject")
    assert closed(p, stream.items).status == status


def test_unanimous_is_broken_by_one_dissent_and_decides_at_it() -> None:
    p = proposal(policy=Policy(kind="unanimous"), voters=None)
    t = Tally(p)
    t.add(Stream().vote("a", 0).items[0])
    assert t.is_open
    t.add(
        StampedBallot(
            2, T0, Ballot(id="z", proposal_id="p1", voter="b", choice="reject", created_at=T0)
        )
    )
    assert t.outcome is not None
    assert (t.outcome.status, t.outcome.deciding_sequence, t.outcome.closed_by) == (
        "rejected",
        2,
        "decision",
    )


def test_unanimous_accepts_with_abstentions_once_everyone_voted() -> None:
    p = proposal(policy=Policy(kind="unanimous"), voters=["a", "b", "c"])
    t = tally(p, Stream().vote("a", 1).vote("b", "abstain").items)
    assert t.is_open
    t.add(Stream().vote("a", 1).vote("b", "abstain").vote("c", 1).items[2])
    assert t.outcome is not None and (t.outcome.status, t.outcome.candidate) == ("accepted", 1)


def test_fixed_majority_decides_as_soon_as_more_than_half_of_the_voters_agree() -> None:
    p = proposal(voters=["a", "b", "c", "d", "e"])
    items = Stream().vote("a", 0).vote("b", 1).vote("c", 0).vote("d", 0).vote("e", 1).items
    result = tally(p, items)
    assert result.outcome is not None
    assert (result.outcome.candidate, result.outcome.deciding_sequence) == (0, 4)
    assert result.outcome.decided_at == items[3].timestamp
    assert [r.reason for r in result.rejected] == ["closed"]  # e voted after the close
    assert result.outcome.rejected_ballots == []  # the record stops at the deciding ballot


def test_open_majority_closes_only_at_the_deadline() -> None:
    p = proposal(voters=None)
    stream = Stream()
    for i in range(10):
        stream.vote(f"v{i}", 0)
    result = tally(p, stream.items)
    assert result.is_open
    assert result.expire(DEADLINE) is None  # a ballot stamped at the deadline is still on time
    outcome = result.expire(DEADLINE + timedelta(microseconds=1))
    assert outcome is not None
    assert (outcome.status, outcome.closed_by, outcome.decided_at) == (
        "accepted",
        "deadline",
        DEADLINE,
    )
    assert outcome.deciding_sequence is None


def test_weights_change_the_outcome() -> None:
    items = Stream().vote("b", 1).vote("c", 1).vote("a", 0).items
    voters = ["a", "b", "c"]
    assert closed(proposal(voters=voters), items).candidate == 1
    heavy = Policy(kind="weighted", weights={"a": 3.0})
    outcome = closed(proposal(policy=heavy, voters=voters), items)
    assert (outcome.candidate, outcome.deciding_sequence) == (0, 3)
    assert outcome.counts.support == [3.0, 2.0]
    assert outcome.counts.votes == [1, 2]
    assert {c.voter: c.weight for c in outcome.counted_ballots} == {"a": 3.0, "b": 1.0, "c": 1.0}
    zero = Policy(kind="weighted", weights={"b": 0.0, "c": 0.0})
    assert closed(proposal(policy=zero, voters=voters), items).candidate == 0  # 1 of 1
    # a weighted majority decides early once the rest cannot outweigh it
    first = Stream().vote("a", 0).vote("b", 1).items
    decided = tally(proposal(policy=heavy, voters=voters), first)
    assert decided.outcome is not None and decided.outcome.deciding_sequence == 1
    assert [r.reason for r in decided.rejected] == ["closed"]


def test_weighted_threshold_uses_weights() -> None:
    policy = Policy(kind="weighted", weights={"a": 2.0, "b": 1.0}, threshold=2 / 3)
    p = proposal(candidates=["x"], policy=policy, voters=["a", "b"])
    assert closed(p, Stream().vote("a", 0).vote("b", "reject").items).status == "accepted"  # 2 of 3
    p2 = p.model_copy(update={"policy": policy.model_copy(update={"threshold": 0.7})})
    assert closed(p2, Stream().vote("a", 0).vote("b", "reject").items).status == "rejected"


def test_a_later_ballot_replaces_the_earlier_one_while_open() -> None:
    p = proposal(voters=None)
    items = Stream().vote("a", 0).vote("b", 1).vote("a", 1).items
    outcome = closed(p, items)
    assert outcome.candidate == 1
    assert outcome.superseded_ballots == [1]
    assert [(c.sequence, c.voter, c.choice) for c in outcome.counted_ballots] == [
        (2, "b", 1),
        (3, "a", 1),
    ]


def test_a_ballot_after_the_close_is_rejected_as_closed() -> None:
    p = proposal(voters=["a", "b"])
    result = tally(p, Stream().vote("a", 0).vote("b", 0).vote("a", 1).items)
    assert result.outcome is not None and result.outcome.candidate == 0
    assert [r.reason for r in result.rejected] == ["closed"]


def test_a_resent_ballot_id_is_a_duplicate_even_after_a_change_of_mind() -> None:
    p = proposal(voters=None)
    stream = Stream().vote("a", 0, ballot_id="first").vote("a", 1, ballot_id="second")
    stream.vote("a", 0, ballot_id="first")  # a retry of the first ballot must not undo the second
    result = tally(p, stream.items, DEADLINE + timedelta(seconds=1))
    assert result.outcome is not None and result.outcome.candidate == 1
    assert [(r.sequence, r.reason) for r in result.rejected] == [(3, "duplicate")]


def test_rejection_reasons() -> None:
    p = proposal(voters=["a", "b", "c"])
    stream = (
        Stream()
        .vote("a", 0, pid="p9")
        .vote("z", 0)
        .vote("a", 5)
        .vote("a", 0, at=DEADLINE + timedelta(seconds=1))
    )
    result = tally(p, stream.items, DEADLINE + timedelta(seconds=2))
    assert [r.reason for r in result.rejected] == [
        "unknown_proposal",
        "ineligible",
        "invalid_choice",
        "late",
    ]
    assert result.outcome is not None and result.outcome.status == "no_quorum"
    # the deadline record holds the ballots stamped up to the deadline
    assert [r.reason for r in result.outcome.rejected_ballots] == [
        "unknown_proposal",
        "ineligible",
        "invalid_choice",
    ]
    stream.vote("b", 0, at=DEADLINE + timedelta(seconds=3))
    stream.vote("c", 0, at=DEADLINE)  # stored after the close with an earlier stamp (clock step)
    result.add(stream.items[4])
    result.add(stream.items[5])
    assert [r.reason for r in result.rejected][-2:] == ["late", "closed"]


def test_ballots_stored_before_the_proposal_are_not_its_ballots() -> None:
    p = proposal(voters=None)
    items = Stream().vote("a", 1).vote("b", 0).vote("c", 0).items
    result = tally(p, items, DEADLINE + timedelta(seconds=1), proposal_sequence=1)
    assert [(r.sequence, r.reason) for r in result.rejected] == [(1, "unknown_proposal")]
    assert result.outcome is not None and result.outcome.counts.votes == [2, 0]


def test_rejection_errors_are_typed() -> None:
    def rej(reason: Any) -> BallotRejection:
        return BallotRejection(sequence=1, ballot_id="x", voter="z", reason=reason)

    assert isinstance(rejection_error("p", rej("unknown_proposal")), ProposalNotFoundError)
    assert isinstance(rejection_error("p", rej("closed")), ProposalClosedError)
    assert isinstance(rejection_error("p", rej("late")), DeadlinePassedError)
    err = rejection_error("p", rej("ineligible"))
    assert isinstance(err, IneligibleVoterError) and err.voter == "z"
    assert isinstance(rejection_error("p", rej("invalid_choice")), InvalidBallotError)
    assert isinstance(rejection_error("p", rej("duplicate")), InvalidBallotError)


def test_check_ballot_is_the_stream_independent_part() -> None:
    p = proposal(voters=["a"])

    def b(**kw: Any) -> Ballot:
        return Ballot(
            **{"id": "i", "proposal_id": "p1", "voter": "a", "choice": 0, "created_at": T0, **kw}
        )

    assert check_ballot(p, b()) is None
    assert check_ballot(p, b(voter="z")) == "ineligible"
    assert check_ballot(p, b(choice=2)) == "invalid_choice"
    assert check_ballot(p, b(proposal_id="q")) == "unknown_proposal"


def test_choice_for_maps_values_to_wire_choices() -> None:
    p = proposal(candidates=[{"b": 1, "a": [1, 2]}, "reject", 3])
    assert choice_for(p, {"a": [1, 2], "b": 1}) == 0
    assert choice_for(p, "reject") == 1  # a candidate wins over the word
    assert choice_for(p, 3) == 2
    assert choice_for(p, "abstain") == "abstain"
    with pytest.raises(InvalidBallotError):
        choice_for(p, 3.5)
    with pytest.raises(InvalidBallotError):
        choice_for(p, "accept")  # only for a proposal of one value
    single = proposal(candidates=[42])
    assert (choice_for(single, "accept"), choice_for(single, "reject")) == (0, "reject")
    with pytest.raises(InvalidBallotError):
        choice_for(single, object())


def test_ballots_must_come_in_stream_order() -> None:
    p = proposal()
    items = Stream().vote("a", 0).vote("b", 0).items
    t = Tally(p)
    t.add(items[1])
    with pytest.raises(ValueError):
        t.add(items[0])
    assert tally(p, list(reversed(items))).counts().ballots == 2  # tally() sorts


def test_stamped_ballot_refuses_naive_timestamps() -> None:
    ballot = Ballot(id="i", proposal_id="p1", voter="a", choice=0, created_at=T0)
    with pytest.raises(ValueError):
        StampedBallot(1, datetime(2030, 1, 1), ballot)
    with pytest.raises(ValueError):
        StampedBallot(0, T0, ballot)


def test_a_proposal_without_deadline_never_expires() -> None:
    p = proposal(voters=["a", "b"], deadline=None)
    result = tally(p, Stream().vote("a", 0).items, T0 + timedelta(days=365))
    assert result.is_open and result.outcome is None
