"""Consensus voting on the wire: proposals, ballots and outcomes.

Published on ``bb.vote.<board>.<proposal>.proposal|ballot|outcome`` (stream
``BB_VOTE``). The rules that turn a proposal and its ballot stream into an
outcome are in :mod:`blackboard.consensus.tally` and ``docs/voting.md``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from blackboard.protocol.limits import MAX_DEPTH, MAX_ID_CHARS, check_value
from blackboard.protocol.schemas._base import Name, Timestamp, WireModel
from blackboard.protocol.schemas.provenance import SourceRef

__all__ = [
    "Ballot",
    "BallotRejection",
    "Choice",
    "CountedBallot",
    "Outcome",
    "OutcomeStatus",
    "Policy",
    "PolicyKind",
    "Proposal",
    "RejectReason",
    "TallyCounts",
    "canonical_json",
]

PolicyKind = Literal["majority", "threshold", "unanimous", "weighted"]
OutcomeStatus = Literal["accepted", "rejected", "no_quorum"]
#: Why a ballot is not counted. The tally gives the first six; ``unverified`` is
#: an observer's (a ballot message whose signature does not verify is not a
#: ballot: no tally sees it, and no outcome lists it).
RejectReason = Literal[
    "ineligible", "unknown_proposal", "closed", "late", "invalid_choice", "duplicate", "unverified"
]
#: A candidate's index in ``Proposal.candidates``, or one of the two choices
#: every proposal has: ``"reject"`` (none of the candidates) and ``"abstain"``
#: (present for the quorum, counts for nobody).
Choice = Annotated[int, Field(ge=0)] | Literal["reject", "abstain"]

_Weight = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


#: Floats with an integral value up to this magnitude are integers (as in the canonical encoding).
_MAX_EXACT = 2**53


def _integral(value: Any) -> Any:
    """``value`` with every float of integral value within ±2**53 as that integer."""
    if type(value) is float and value.is_integer() and abs(value) <= _MAX_EXACT:
        return int(value)
    if isinstance(value, list | tuple):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value: sorted keys, no spaces, UTF-8, and a number
    of integral value written as an integer (``1.0`` is ``1``: the canonical encoding a
    proposal is published in, docs/protocol.md, writes it so).

    Two candidates are the same candidate when their canonical texts are equal.

    Raises:
        TypeError: the value is not a JSON value.
        ValueError: the value holds NaN or an infinity.
    """
    return json.dumps(
        _integral(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


class Policy(WireModel):
    """How ballots decide a proposal.

    ``majority``: a candidate needs more than half of the cast ballots.
    ``threshold``: a candidate needs at least ``threshold`` of the cast ballots.
    ``unanimous``: every cast ballot must be for the same candidate.
    ``weighted``: like majority (or threshold, when given) with per-voter weights.
    Abstentions are never cast ballots; they count for the quorum only.
    Part of ``Proposal``, versioned by it.
    """

    kind: PolicyKind = Field(default="majority", description="The decision rule.")
    threshold: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Fraction of the cast (weighted) support a candidate needs, in (0, 1]. "
        "Required for 'threshold', optional for 'weighted' (default: more than half), "
        "not allowed otherwise. Read as the exact decimal it is written as.",
    )
    weights: dict[Name, _Weight] = Field(
        default_factory=dict,
        description="Per-voter weights ('weighted' only); a voter not listed weighs 1.",
    )
    quorum: int | None = Field(
        default=None,
        ge=1,
        description="Minimum number of counted ballots (abstentions included) for an outcome "
        "other than no_quorum. Absent means 1.",
    )

    @model_validator(mode="after")
    def _check(self) -> Policy:
        if self.kind == "threshold" and self.threshold is None:
            raise ValueError("a threshold policy needs a threshold")
        if self.kind in ("majority", "unanimous") and self.threshold is not None:
            raise ValueError(f"a {self.kind} policy takes no threshold")
        if self.kind != "weighted" and self.weights:
            raise ValueError("only a weighted policy takes weights")
        return self


class Proposal(WireModel):
    """A question about one board entry, put to a vote.

    A proposal of one value (``board.propose(..., value=v)``) is a proposal
    with ``candidates=[v]``: a ballot for candidate 0 accepts it, ``"reject"``
    rejects it.
    """

    v: Literal[1] = Field(default=1, description="Schema version.")
    id: Name = Field(description="Proposal id, unique on its board (a subject token).")
    board: Name = Field(description="Board of the target entry.")
    section: Name = Field(description="Section of the target entry.")
    key: str = Field(min_length=1, description="Key of the target entry (any string).")
    question: str = Field(default="", description="What is being decided, for humans and LLMs.")
    candidates: list[Any] = Field(
        min_length=1,
        description="The values to choose from (JSON values, pairwise distinct). "
        "Ballots name a candidate by its index.",
    )
    policy: Policy = Field(default_factory=lambda: Policy(), description="The decision rule.")
    voters: list[Name] | None = Field(
        default=None,
        description="Eligible voters (distinct agent ids), or null for any agent. "
        "An open electorate needs a deadline.",
    )
    proposer: Name = Field(description="Agent id of the proposer.")
    created_at: Timestamp = Field(description="Proposer's clock, RFC 3339 in UTC.")
    deadline: Timestamp | None = Field(
        default=None,
        description="Ballots stamped by the server after this instant are late; "
        "the proposal closes at it if not decided before.",
    )

    @model_validator(mode="after")
    def _check(self) -> Proposal:
        # Bounded first: canonical_json recurses (a decoded payload is already
        # bounded by the codec; this bounds a proposal built in Python).
        check_value(self.candidates, MAX_DEPTH - 1)
        try:
            texts = [canonical_json(c) for c in self.candidates]
        except (TypeError, ValueError) as exc:
            # bytes, NaN, a map with non-string keys: candidates are JSON values
            # (docs/voting.md), stored and compared as JSON by every reader.
            raise ValueError(f"candidates must be JSON values: {exc}") from exc
        if len(set(texts)) != len(texts):
            raise ValueError("candidates must be pairwise distinct")
        if self.voters is None:
            if self.deadline is None:
                raise ValueError("a proposal open to any agent needs a deadline")
        else:
            if not self.voters:
                raise ValueError("voters must not be empty (use null for any agent)")
            if len(set(self.voters)) != len(self.voters):
                raise ValueError("voters must be distinct")
            if self.policy.quorum is not None and self.policy.quorum > len(self.voters):
                raise ValueError("the quorum is larger than the number of voters")
        return self


class Ballot(WireModel):
    """One agent's vote on a proposal. A later ballot of the same voter replaces
    the earlier one while the proposal is open."""

    v: Literal[1] = Field(default=1, description="Schema version.")
    id: str = Field(
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="Unique ballot id chosen by the voter (idempotency key: a ballot "
        "repeating an id already seen is a duplicate and ignored).",
    )
    proposal_id: Name = Field(description="The proposal voted on.")
    voter: Name = Field(description="Agent id of the voter.")
    choice: Choice = Field(description="A candidate index, 'reject' or 'abstain'.")
    reason: str | None = Field(default=None, description="Why, in the voter's words.")
    created_at: Timestamp = Field(
        description="Voter's clock (the server's timestamp decides lateness)."
    )


class BallotRejection(WireModel):
    """A ballot that was not counted, and why."""

    v: Literal[1] = Field(default=1, description="Schema version.")
    sequence: int = Field(ge=1, description="Stream sequence of the ballot.")
    ballot_id: str = Field(description="The ballot's id.")
    voter: str = Field(description="The ballot's voter.")
    reason: RejectReason = Field(description="Why it was not counted.")


class CountedBallot(WireModel):
    """A ballot that counts in an outcome (part of ``Outcome``, versioned by it)."""

    sequence: int = Field(ge=1, description="Stream sequence of the ballot.")
    ballot_id: str = Field(description="The ballot's id.")
    voter: str = Field(description="The ballot's voter.")
    choice: Choice = Field(description="A candidate index, 'reject' or 'abstain'.")
    weight: float = Field(description="The voter's weight (1 unless the policy is weighted).")


class TallyCounts(WireModel):
    """The counted ballots, summed per choice (part of ``Outcome``, versioned by it)."""

    ballots: int = Field(
        description="Counted ballots, abstentions included (compared with the quorum)."
    )
    votes: list[int] = Field(description="Counted ballots per candidate index.")
    reject: int = Field(description="Counted 'reject' ballots.")
    abstain: int = Field(description="Counted 'abstain' ballots.")
    support: list[float] = Field(
        description="Weighted support per candidate index (equals votes unless weighted; "
        "informational: the decision uses exact arithmetic)."
    )
    reject_support: float = Field(description="Weighted support of 'reject'.")


class Outcome(WireModel):
    """The result of a closed proposal: what it decided and the full tally.

    Version 2 added ``sources`` (a version 1 outcome reads with none).
    """

    v: Literal[1, 2] = Field(default=2, description="Schema version (2: with sources).")
    proposal_id: Name = Field(description="The proposal.")
    board: Name = Field(description="Board of the target entry.")
    section: Name = Field(description="Section of the target entry.")
    key: str = Field(description="Key of the target entry.")
    status: OutcomeStatus = Field(description="accepted, rejected, or no_quorum.")
    candidate: int | None = Field(
        description="Index of the accepted candidate (null unless accepted)."
    )
    value: Any = Field(
        default=None, description="The accepted candidate's value (null unless accepted)."
    )
    closed_by: Literal["decision", "deadline"] = Field(
        description="'decision': a ballot settled the outcome before the deadline; "
        "'deadline': the deadline passed."
    )
    deciding_sequence: int | None = Field(
        description="Stream sequence of the ballot that settled the outcome (null at a deadline)."
    )
    decided_at: Timestamp = Field(
        description="Server timestamp of the deciding ballot, or the deadline."
    )
    counts: TallyCounts = Field(description="The counted ballots, summed per choice.")
    counted_ballots: list[CountedBallot] = Field(
        description="The ballots that count, in stream order."
    )
    superseded_ballots: list[int] = Field(
        default_factory=list,
        description="Sequences of ballots replaced by a later ballot of the same voter.",
    )
    rejected_ballots: list[BallotRejection] = Field(
        default_factory=list,
        description="Ballots not counted, up to the close, in stream order.",
    )
    revision: int | None = Field(
        default=None,
        description="Revision of the board entry the outcome was committed at "
        "(set by the committer; null in a computed tally).",
    )
    sources: list[SourceRef] = Field(
        default_factory=list,
        description="Provenance: the proposal and every counted ballot, in stream order, with "
        "the signing key and signature each was stored with (empty in a bare tally).",
    )
