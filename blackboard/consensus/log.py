"""A proposal's message log, read in stream order: pure state, no IO.

Every message on ``bb.vote.<board>.<proposal>.>`` (the proposal, ballots,
deadline close requests, the recorded outcome and its application) is fed to
a :class:`ProposalLog` in stream order with its server timestamp. The log runs
the pure tally (:mod:`blackboard.consensus.tally`), keeps the fate of every ballot, and
knows what has been committed. The SDK, the worker and a recount from
PostgreSQL all use it, so they agree. The IO around it is
:mod:`blackboard.client.consensus`; the protocol is in ``docs/voting.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

from blackboard.consensus.tally import StampedBallot, Tally
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import (
    Ballot,
    BallotRejection,
    Outcome,
    Proposal,
    RejectReason,
    WireModel,
    validate_wire,
)
from blackboard.protocol.schemas.provenance import SourceRef, source_ref
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects

__all__ = [
    "BallotFate",
    "FateStatus",
    "ProposalLog",
    "RecordedOutcome",
    "VoteKind",
    "VoteMessage",
    "classify_ballots",
    "decode_ballot",
    "decode_outcome",
    "decode_proposal",
    "jetstream_time",
    "same_outcome",
]

VoteKind = Literal["proposal", "ballot", "close", "outcome", "applied"]
FateStatus = Literal["counted", "superseded", "rejected"]
M = TypeVar("M", bound=WireModel)


def jetstream_time(reply: str | None) -> datetime | None:
    """The exact server timestamp of a JetStream message, from its ack subject.

    JetStream stamps messages in nanoseconds; this truncates to microseconds
    with integer arithmetic (nats-py's ``metadata.timestamp`` goes through a
    float and may be 1 µs off), as ``docs/voting.md`` requires. ``None`` when
    ``reply`` is not a JetStream ack subject (parsed by :meth:`Subjects.parse_ack`).
    """
    if not reply:
        return None
    try:
        return Subjects.parse_ack(reply)[2]
    except InvalidKeyError:
        return None


def _decode(model: type[M], data: bytes, headers: Mapping[str, str] | None) -> M:
    """Strict types (no coercion, so every language reads the same message the
    same way), unknown fields ignored (forward compatibility).

    Raises:
        InvalidPayloadError: not a valid message of this model.
    """
    return validate_wire(model, codec.decode(data, codec.encoding_of(headers)), coerce=False)


def decode_proposal(data: bytes, headers: Mapping[str, str] | None = None) -> Proposal:
    """Decode a proposal message. Raises ``InvalidPayloadError``."""
    return _decode(Proposal, data, headers)


def decode_ballot(data: bytes, headers: Mapping[str, str] | None = None) -> Ballot:
    """Decode a ballot message. Raises ``InvalidPayloadError`` (then it is not a ballot)."""
    return _decode(Ballot, data, headers)


def decode_outcome(data: bytes, headers: Mapping[str, str] | None = None) -> Outcome:
    """Decode an outcome (recorded or applied). Raises ``InvalidPayloadError``."""
    return _decode(Outcome, data, headers)


#: What is not part of an outcome's decision: where it was committed, its provenance, and the
#: schema version it was written in.
_NOT_DECISION = frozenset({"v", "revision", "sources"})


def same_outcome(a: Outcome, b: Outcome) -> bool:
    """Whether two outcomes are the same decision (``v``, ``revision`` and ``sources`` aside)."""
    return a.model_dump(exclude=set(_NOT_DECISION)) == b.model_dump(exclude=set(_NOT_DECISION))


@dataclass(frozen=True, slots=True)
class VoteMessage:
    """One message of a proposal's subjects, as the server stored it.

    ``voter`` is the voter named by a ballot's subject
    (``bb.vote.<board>.<proposal>.ballot.<voter>``), ``None`` for other kinds.
    The subject's voter is authoritative: the server's permissions let only
    that voter publish there, so a ballot whose payload names someone else
    is not a ballot.

    ``verdict`` is the reader's verdict on its signature (for an outcome or
    applied record, ``wrong_author`` unless a worker identity signed it);
    ``None`` when the reader does not verify (an open bus, ``security.verify``
    off), and then every message is taken as it is.
    """

    kind: VoteKind
    board: str
    proposal_id: str
    sequence: int
    timestamp: datetime
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    voter: str | None = None
    verdict: Verdict | None = None

    @property
    def trusted(self) -> bool:
        """Whether its signature verified, or the reader does not verify."""
        return self.verdict is None or self.verdict is Verdict.VERIFIED

    def source(self) -> SourceRef:
        """Its :class:`SourceRef` (``BB_VOTE``, its sequence, its signature headers)."""
        return source_ref(VOTE_STREAM, self.sequence, self.headers)


@dataclass(frozen=True, slots=True)
class RecordedOutcome:
    """The outcome message that was stored first (the decision, exactly once).

    ``base_revision`` is the target entry's revision when it was recorded (0:
    absent); the accepted value is written after it. ``source`` is the outcome
    message's own reference (its signature), the provenance of the board
    entry that applies it.
    """

    outcome: Outcome
    sequence: int
    timestamp: datetime
    base_revision: int
    source: SourceRef | None = None


@dataclass(frozen=True, slots=True)
class BallotFate:
    """What became of a ballot: counted, superseded by a later ballot of the
    same voter, or rejected (with the reason)."""

    status: FateStatus
    reason: RejectReason | None = None


class ProposalLog:
    """The state of one proposal, fed its messages in stream order.

    Args:
        board: the proposal's board.
        proposal_id: the proposal's id.
    """

    def __init__(self, board: str, proposal_id: str) -> None:
        self.board = board
        self.proposal_id = proposal_id
        self.proposal: Proposal | None = None
        self.proposal_sequence = 0
        self.tally: Tally | None = None
        #: Fate of every ballot message by sequence: ``None`` = counted (when
        #: it was added), else its rejection (``unverified``: its signature did
        #: not verify, so no tally saw it). Undecodable ballots are absent.
        self.fates: dict[int, BallotRejection | None] = {}
        #: References of the proposal and of every ballot the tally took (by sequence).
        self.sources: dict[int, SourceRef] = {}
        #: Messages ignored because their signature did not verify (by sequence: the verdict).
        self.unverified: dict[int, Verdict] = {}
        self._decided: Outcome | None = None
        self.recorded: RecordedOutcome | None = None
        self.applied: Outcome | None = None
        #: The recorded outcome differs from the one computed here (a bug or a
        #: dishonest committer); the recorded one stands.
        self.diverged = False
        self.last_sequence = 0
        self.last_timestamp: datetime | None = None

    # -- state ------------------------------------------------------------
    @property
    def decided(self) -> Outcome | None:
        """The outcome the tally reached (by decision or deadline), if closed, with its
        ``sources``: the proposal and the counted ballots, in stream order."""
        outcome = None if self.tally is None else self.tally.outcome
        if outcome is None:
            return None
        if self._decided is None:
            seqs = [self.proposal_sequence, *(b.sequence for b in outcome.counted_ballots)]
            self._decided = outcome.model_copy(
                update={"sources": [self.sources[s] for s in seqs if s in self.sources]})
        return self._decided

    @property
    def committed(self) -> Outcome | None:
        """The committed outcome: the applied one when accepted, else the recorded one."""
        if self.applied is not None:
            return self.applied
        if self.recorded is not None and self.recorded.outcome.status != "accepted":
            return self.recorded.outcome
        return None

    @property
    def is_open(self) -> bool:
        """The proposal exists and neither the tally nor a record has closed it."""
        return self.proposal is not None and self.decided is None and self.recorded is None

    def deadline_passed(self) -> bool:
        """Whether a stored message already proves that the server passed the deadline."""
        p = self.proposal
        return (p is not None and p.deadline is not None and self.last_timestamp is not None
                and self.last_timestamp > p.deadline)

    # -- feeding ------------------------------------------------------------
    def feed(self, msg: VoteMessage) -> None:
        """Apply one message (in stream order; a sequence seen before is ignored).

        Messages that do not decode are ignored (they are not proposals, ballots
        or outcomes), and so is a ballot whose payload voter is not the
        subject's (``msg.voter``); so are a second proposal and second records,
        and every message whose signature did not verify (``msg.trusted``; an
        unverified ballot that decodes gets the fate ``unverified``). Any
        message's server timestamp still closes the tally at the deadline.
        """
        if msg.sequence <= self.last_sequence:
            return
        self.last_sequence = msg.sequence
        self.last_timestamp = msg.timestamp
        handler = getattr(self, f"_on_{msg.kind}", None)
        if handler is not None:
            if msg.trusted:
                handler(msg)
            else:
                self._untrusted(msg)
        if self.tally is not None and self.tally.is_open:
            # Any stored message stamped after the deadline proves the server
            # passed it, and every ballot before it has been added.
            self.tally.expire(msg.timestamp)

    def _on_proposal(self, msg: VoteMessage) -> None:
        if self.proposal is not None:
            return
        try:
            proposal = decode_proposal(msg.data, msg.headers)
        except InvalidPayloadError:
            return
        if proposal.board != self.board or proposal.id != self.proposal_id:
            return
        self.proposal = proposal
        self.proposal_sequence = msg.sequence
        self.sources[msg.sequence] = msg.source()
        self.tally = Tally(proposal, msg.sequence)

    def _untrusted(self, msg: VoteMessage) -> None:
        assert msg.verdict is not None
        self.unverified[msg.sequence] = msg.verdict
        if msg.kind != "ballot":
            return
        try:
            ballot = decode_ballot(msg.data, msg.headers)
        except InvalidPayloadError:
            return
        if ballot.voter == msg.voter:  # its fate, for the voter that wrote it (not part of any tally)
            self.fates[msg.sequence] = BallotRejection(
                sequence=msg.sequence, ballot_id=ballot.id, voter=ballot.voter, reason="unverified")

    def _on_ballot(self, msg: VoteMessage) -> None:
        try:
            ballot = decode_ballot(msg.data, msg.headers)
        except InvalidPayloadError:
            return
        if ballot.voter != msg.voter:
            return  # the payload claims another voter than the subject: not a ballot (docs/voting.md)
        if self.tally is None:
            self.fates[msg.sequence] = BallotRejection(
                sequence=msg.sequence, ballot_id=ballot.id, voter=ballot.voter, reason="unknown_proposal")
            return
        fate = self.fates[msg.sequence] = self.tally.add(StampedBallot(msg.sequence, msg.timestamp, ballot))
        if fate is None:
            self.sources[msg.sequence] = msg.source()

    def _outcome_of(self, msg: VoteMessage) -> Outcome | None:
        try:
            outcome = decode_outcome(msg.data, msg.headers)
        except InvalidPayloadError:
            return None
        if outcome.board != self.board or outcome.proposal_id != self.proposal_id:
            return None
        return outcome

    def _on_outcome(self, msg: VoteMessage) -> None:
        if self.recorded is not None:
            return
        outcome = self._outcome_of(msg)
        if outcome is None:
            return
        try:
            base = int(msg.headers.get(Header.BASE_REVISION.value, "0"))
        except ValueError:
            base = 0
        self.recorded = RecordedOutcome(outcome.model_copy(update={"revision": None}), msg.sequence,
                                        msg.timestamp, max(0, base), msg.source())
        decided = self.decided
        if decided is not None and not same_outcome(decided, outcome):
            self.diverged = True

    def _on_applied(self, msg: VoteMessage) -> None:
        if self.applied is not None:
            return
        outcome = self._outcome_of(msg)
        if outcome is not None and outcome.revision is not None and outcome.status == "accepted":
            self.applied = outcome


def classify_ballots(proposal: Proposal | None, proposal_sequence: int,
                     ballots: Iterable[StampedBallot]) -> dict[int, BallotFate]:
    """The fate of every ballot of a proposal (a recount; pure).

    ``proposal`` is ``None`` when no proposal message was stored: every ballot
    is then rejected as ``unknown_proposal``. Ballots counted while the
    proposal is open are ``counted`` until a later ballot of the same voter
    supersedes them.

    Raises:
        ValueError: two ballots have the same sequence.
    """
    fates: dict[int, BallotFate] = {}
    items = sorted(ballots, key=lambda b: b.sequence)
    if proposal is None:
        return {b.sequence: BallotFate("rejected", "unknown_proposal") for b in items}
    t = Tally(proposal, proposal_sequence)
    latest: dict[str, int] = {}
    for item in items:
        rejection = t.add(item)
        if rejection is not None:
            fates[item.sequence] = BallotFate("rejected", rejection.reason)
            continue
        previous = latest.get(item.ballot.voter)
        if previous is not None:
            fates[previous] = BallotFate("superseded")
        latest[item.ballot.voter] = item.sequence
        fates[item.sequence] = BallotFate("counted")
    return fates
