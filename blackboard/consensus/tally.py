"""The tally of a vote: a pure function of a proposal and its ballot stream.

Every observer (the worker, an agent waiting for an outcome, a recount from
Postgres, a client in another language) feeds the same ballots, in stream
order, with the server's timestamps, and gets the same outcome. No IO, no
clock: "now" is always passed in. The rules are specified in ``docs/voting.md``.

Usage::

    t = Tally(proposal)
    for item in stamped_ballots:     # in stream order
        t.add(item)                  # -> BallotRejection | None
    t.expire(now)                    # closes at the deadline if now > deadline
    t.outcome                        # Outcome | None while open

or in one call: ``tally(proposal, stamped_ballots, now).outcome``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any, Literal

from blackboard.protocol.errors import (
    DeadlinePassedError,
    IneligibleVoterError,
    InvalidBallotError,
    ProposalClosedError,
    ProposalNotFoundError,
    VoteError,
)
from blackboard.protocol.schemas.vote import (
    Ballot,
    BallotRejection,
    Choice,
    CountedBallot,
    Outcome,
    OutcomeStatus,
    Proposal,
    RejectReason,
    TallyCounts,
    canonical_json,
)

__all__ = ["StampedBallot", "Tally", "check_ballot", "choice_for", "rejection_error", "tally"]

_ONE = Fraction(1)
_HALF = Fraction(1, 2)


def _exact(x: float) -> Fraction:
    # A float is read as the decimal it is written as (its shortest round-trip
    # text, which is what JSON carries): 0.9 means 9/10, not the nearest double.
    return Fraction(repr(float(x)))


@dataclass(frozen=True, slots=True)
class StampedBallot:
    """A ballot as stored in the stream: its sequence and the server's timestamp.

    Raises:
        ValueError: the sequence is not positive or the timestamp is naive.
    """

    sequence: int
    timestamp: datetime
    ballot: Ballot

    def __post_init__(self) -> None:
        if self.sequence < 1:
            raise ValueError("a stream sequence starts at 1")
        if self.timestamp.tzinfo is None:
            raise ValueError("the server timestamp must be timezone-aware")


def check_ballot(proposal: Proposal, ballot: Ballot) -> RejectReason | None:
    """The checks of a ballot that do not depend on the stream (for a voter's
    early refusal): proposal id, eligibility, choice. ``None`` means it passes."""
    if ballot.proposal_id != proposal.id:
        return "unknown_proposal"
    if proposal.voters is not None and ballot.voter not in proposal.voters:
        return "ineligible"
    if isinstance(ballot.choice, int) and ballot.choice >= len(proposal.candidates):
        return "invalid_choice"
    return None


def choice_for(proposal: Proposal, value: Any) -> Choice:
    """The wire choice of a value: the index of the candidate equal to it
    (canonical JSON equality), else ``"reject"``, ``"abstain"``, or ``"accept"``
    for a proposal of one value (meaning candidate 0). A candidate wins over
    these three words when it equals one of them.

    Raises:
        InvalidBallotError: the value is none of these.
    """
    try:
        text = canonical_json(value)
    except (TypeError, ValueError):
        text = None
    for index, candidate in enumerate(proposal.candidates):
        if text is not None and canonical_json(candidate) == text:
            return index
    if value in ("reject", "abstain"):
        return "reject" if value == "reject" else "abstain"
    if value == "accept" and len(proposal.candidates) == 1:
        return 0
    raise InvalidBallotError(proposal.id, f"{value!r} is not a candidate, 'reject' or 'abstain'")


def rejection_error(proposal_id: str, rejection: BallotRejection) -> VoteError:
    """The typed error that tells a voter why its ballot was not counted."""
    reason = rejection.reason
    if reason == "unknown_proposal":
        return ProposalNotFoundError(proposal_id)
    if reason == "closed":
        return ProposalClosedError(proposal_id)
    if reason == "late":
        return DeadlinePassedError(proposal_id)
    if reason == "ineligible":
        return IneligibleVoterError(proposal_id, rejection.voter)
    if reason == "invalid_choice":
        return InvalidBallotError(proposal_id, "the choice is not a candidate index")
    if reason == "unverified":
        return InvalidBallotError(proposal_id, f"ballot {rejection.ballot_id!r} does not verify (its signature): "
                                  "it is not counted")
    return InvalidBallotError(proposal_id, f"ballot {rejection.ballot_id!r} was already cast")


class Tally:
    """The running tally of one proposal, fed ballots in stream order.

    Args:
        proposal: the proposal.
        proposal_sequence: stream sequence of the proposal message; a ballot
            stored before it is not a ballot of this proposal (``unknown_proposal``).
    """

    def __init__(self, proposal: Proposal, proposal_sequence: int = 0) -> None:
        self.proposal = proposal
        self.proposal_sequence = proposal_sequence
        policy = proposal.policy
        self._threshold = None if policy.threshold is None else _exact(policy.threshold)
        self._weights = {v: _exact(w) for v, w in policy.weights.items()}
        self._quorum = policy.quorum or 1
        self._counted: dict[str, StampedBallot] = {}  # voter -> the ballot that counts
        self._accepted_ids: set[str] = set()  # ids of ballots counted (even if superseded)
        self._superseded: list[int] = []
        self._rejected: list[tuple[StampedBallot, BallotRejection]] = []
        self._last_sequence = 0
        self._outcome: Outcome | None = None

    # -- public ---------------------------------------------------------
    @property
    def outcome(self) -> Outcome | None:
        """The outcome once closed (by a deciding ballot or the deadline), else ``None``."""
        return self._outcome

    @property
    def is_open(self) -> bool:
        return self._outcome is None

    @property
    def rejected(self) -> list[BallotRejection]:
        """Every ballot not counted so far, in stream order (including after the close)."""
        return [r for _, r in self._rejected]

    def counts(self) -> TallyCounts:
        """The counted ballots so far, summed per choice."""
        n = len(self.proposal.candidates)
        votes, support = [0] * n, [Fraction(0)] * n
        reject = abstain = 0
        reject_support = Fraction(0)
        for item in self._counted.values():
            choice, weight = item.ballot.choice, self._weight(item.ballot.voter)
            if choice == "abstain":
                abstain += 1
            elif choice == "reject":
                reject += 1
                reject_support += weight
            else:
                votes[choice] += 1
                support[choice] += weight
        return TallyCounts(
            ballots=len(self._counted),
            votes=votes,
            reject=reject,
            abstain=abstain,
            support=[float(s) for s in support],
            reject_support=float(reject_support),
        )

    def add(self, item: StampedBallot) -> BallotRejection | None:
        """Count one ballot; closes the proposal if it settles the outcome.

        Returns:
            ``None`` if the ballot counts, else its rejection.

        Raises:
            ValueError: the ballot's sequence is not after the previous one.
        """
        if item.sequence <= self._last_sequence:
            raise ValueError(f"ballot sequence {item.sequence} is not after {self._last_sequence}")
        self._last_sequence = item.sequence
        ballot = item.ballot
        reason = self._reason(item)
        if reason is not None:
            rejection = BallotRejection(
                sequence=item.sequence, ballot_id=ballot.id, voter=ballot.voter, reason=reason
            )
            self._rejected.append((item, rejection))
            return rejection
        self._accepted_ids.add(ballot.id)
        previous = self._counted.pop(ballot.voter, None)
        if previous is not None:
            self._superseded.append(previous.sequence)
        self._counted[ballot.voter] = item
        if self._settled():
            self._outcome = self._close("decision", item)
        return None

    def expire(self, now: datetime) -> Outcome | None:
        """Close the proposal at its deadline if ``now`` (server time, after every
        ballot already added) is past it. Returns the outcome if closed."""
        deadline = self.proposal.deadline
        if self._outcome is None and deadline is not None and now > deadline:
            self._outcome = self._close("deadline", None)
        return self._outcome

    # -- rules ----------------------------------------------------------
    def _reason(self, item: StampedBallot) -> RejectReason | None:
        ballot, deadline = item.ballot, self.proposal.deadline
        late = deadline is not None and item.timestamp > deadline
        if ballot.proposal_id != self.proposal.id or item.sequence <= self.proposal_sequence:
            return "unknown_proposal"
        if ballot.id in self._accepted_ids:
            return "duplicate"
        if self._outcome is not None and (self._outcome.closed_by == "decision" or not late):
            return "closed"
        if late:
            return "late"
        return check_ballot(self.proposal, ballot)

    def _weight(self, voter: str) -> Fraction:
        return self._weights.get(voter, _ONE) if self.proposal.policy.kind == "weighted" else _ONE

    def _qualifies(self, support: Fraction, cast: Fraction) -> bool:
        """Whether a candidate with this support wins under the policy."""
        if support <= 0:
            return False
        if self.proposal.policy.kind == "unanimous":
            return support == cast
        if self._threshold is None:  # majority, or weighted without a threshold
            return support > cast * _HALF
        return support >= cast * self._threshold

    def _winner(self, support: list[Fraction], cast: Fraction) -> int | None:
        """The qualifying candidate with the most support; ties go to the lowest index."""
        best: int | None = None
        for i, s in enumerate(support):
            if self._qualifies(s, cast) and (best is None or s > support[best]):
                best = i
        return best

    def _sums(self) -> tuple[list[Fraction], Fraction]:
        support = [Fraction(0)] * len(self.proposal.candidates)
        cast = Fraction(0)
        for item in self._counted.values():
            choice = item.ballot.choice
            if choice == "abstain":
                continue
            weight = self._weight(item.ballot.voter)
            cast += weight
            if choice != "reject":
                support[choice] += weight
        return support, cast

    def _settled(self) -> bool:
        """Whether the counted ballots fix the outcome, whatever the eligible
        voters who have not voted yet do (vote anything, abstain, or not vote)."""
        if len(self._counted) < self._quorum:
            return False  # if nobody else votes it is no_quorum, if enough do it is not
        support, cast = self._sums()
        extra: Fraction | None  # weight still to come; None: unbounded (any agent)
        if self.proposal.voters is None:
            extra = None
        else:
            remaining = [v for v in self.proposal.voters if v not in self._counted]
            if not remaining:
                return True
            extra = sum((self._weight(v) for v in remaining), Fraction(0))
        winner = self._winner(support, cast)
        if winner is None:
            # Settled as rejected when no candidate could qualify even if all
            # the weight still to come went to it.
            return not any(self._could_qualify(s, cast, extra) for s in support)
        if extra is None or not self._qualifies(support[winner], cast + extra):
            return False  # the rest could vote 'reject' and unseat it
        for d, s in enumerate(support):
            best = s + extra  # everything still to come goes to d
            if d != winner and self._qualifies(best, cast + extra):
                if best > support[winner] or (best == support[winner] and d < winner):
                    return False
        return True

    def _could_qualify(self, support: Fraction, cast: Fraction, extra: Fraction | None) -> bool:
        if extra is not None:
            return self._qualifies(support + extra, cast + extra)
        # Unboundedly many voters of weight 1 to come: any fraction below 1 can
        # be reached; unanimity (or a threshold of 1) needs no dissent so far.
        policy = self.proposal.policy
        if policy.kind == "unanimous" or self._threshold == _ONE:
            return support == cast
        return True

    def _close(
        self, closed_by: Literal["decision", "deadline"], deciding: StampedBallot | None
    ) -> Outcome:
        proposal = self.proposal
        support, cast = self._sums()
        winner = self._winner(support, cast) if len(self._counted) >= self._quorum else None
        status: OutcomeStatus = "accepted" if winner is not None else "rejected"
        if len(self._counted) < self._quorum:
            status = "no_quorum"
        rejected = [r for _, r in self._rejected]
        if deciding is not None:
            decided_at = deciding.timestamp
        else:
            assert proposal.deadline is not None  # only a proposal with a deadline expires
            decided_at = proposal.deadline
            # The record covers the ballots stamped up to the deadline, so it does
            # not depend on when the closer ran.
            rejected = [r for item, r in self._rejected if item.timestamp <= decided_at]
        counted = sorted(self._counted.values(), key=lambda item: item.sequence)
        return Outcome(
            proposal_id=proposal.id,
            board=proposal.board,
            section=proposal.section,
            key=proposal.key,
            status=status,
            candidate=winner,
            value=None if winner is None else proposal.candidates[winner],
            closed_by=closed_by,
            deciding_sequence=None if deciding is None else deciding.sequence,
            decided_at=decided_at,
            counts=self.counts(),
            counted_ballots=[
                CountedBallot(
                    sequence=item.sequence,
                    ballot_id=item.ballot.id,
                    voter=item.ballot.voter,
                    choice=item.ballot.choice,
                    weight=float(self._weight(item.ballot.voter)),
                )
                for item in counted
            ],
            superseded_ballots=sorted(self._superseded),
            rejected_ballots=rejected,
        )


def tally(
    proposal: Proposal,
    ballots: Iterable[StampedBallot],
    now: datetime | None = None,
    *,
    proposal_sequence: int = 0,
) -> Tally:
    """Tally a proposal's ballots (sorted here by stream sequence) and, if
    ``now`` (server time) is given, close it at its deadline when past.
    ``proposal_sequence`` is as for :class:`Tally`.

    ``tally(p, ballots, now).outcome`` is the outcome, or ``None`` while open.

    Raises:
        ValueError: two ballots have the same sequence.
    """
    result = Tally(proposal, proposal_sequence)
    for item in sorted(ballots, key=lambda b: b.sequence):
        result.add(item)
    if now is not None:
        result.expire(now)
    return result
