"""The pure side of voting IO (blackboard.consensus.log): exact stream timestamps,
the proposal log fed in stream order, strict decoding, ballot fates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackboard.consensus.log import (
    BallotFate,
    ProposalLog,
    VoteKind,
    VoteMessage,
    classify_ballots,
    decode_ballot,
    jetstream_time,
    same_outcome,
)
from blackboard.consensus.tally import StampedBallot, tally
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import Ballot, Choice, Policy, Proposal, SourceRef
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, Subjects

T0 = datetime(2030, 1, 1, tzinfo=UTC)
VOTERS = ["a", "b", "c", "d", "e"]


def make_proposal(deadline: datetime | None = T0 + timedelta(seconds=100), voters: list[str] | None = VOTERS,
                  policy: Policy | None = None) -> Proposal:
    return Proposal(id="p1", board="b", section="s", key="k", candidates=["x", "y"], policy=policy or Policy(),
                    voters=voters, proposer="a", created_at=T0, deadline=deadline)


class Log:
    """Feeds a ProposalLog like a stream would: sequences 1, 2, ..., times T0 + seq s."""

    def __init__(self) -> None:
        self.log = ProposalLog("b", "p1")
        self.seq = 0

    def send(self, kind: VoteKind, payload: Any = None, *, at: datetime | None = None,
             headers: dict[str, str] | None = None, raw: bytes | None = None, voter: str | None = None,
             verdict: Verdict | None = None) -> int:
        """``voter`` is the one a ballot's subject names (default: the payload's); ``verdict``
        the reader's verdict on its signature (None: a reader that does not verify)."""
        self.seq += 1
        data = raw if raw is not None else (b"" if payload is None else codec.encode(payload))
        if kind == "ballot" and voter is None and isinstance(payload, dict):
            voter = payload.get("voter")
        self.log.feed(VoteMessage(kind, "b", "p1", self.seq, at or T0 + timedelta(seconds=self.seq), data,
                                  headers or {}, voter, verdict))
        return self.seq

    def propose(self, p: Proposal, **kw: Any) -> int:
        return self.send("proposal", p.model_dump(mode="json"), **kw)

    def vote(self, voter: str, choice: Choice, *, ballot_id: str | None = None, at: datetime | None = None,
             pid: str = "p1", **kw: Any) -> int:
        ballot = Ballot(id=ballot_id or f"{voter}-{self.seq + 1}", proposal_id=pid, voter=voter, choice=choice,
                        created_at=T0)
        return self.send("ballot", ballot.model_dump(mode="json"), at=at, **kw)


def sig(n: int) -> dict[str, str]:
    """Signature headers as a signed message carries them (the log copies, never checks, them)."""
    return {Header.SIG_KEY.value: "U" + "A" * 54 + str(n % 10), Header.SIG.value: f"{n:086d}"}


def test_jetstream_time_truncates_nanoseconds_exactly() -> None:
    ns = 1_893_456_000_123_456_999  # 2030-01-01T00:00:00.123456999Z
    v1 = f"$JS.ACK.BB_VOTE.c.1.42.7.{ns}.0"
    v2 = f"$JS.ACK.dom.acchash.BB_VOTE.c.1.42.7.{ns}.0.rand"
    expected = datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert jetstream_time(v1) == expected
    assert jetstream_time(v2) == expected
    # The float path of nats-py rounds this one up to ...457.
    assert datetime.fromtimestamp(ns / 1e9, UTC) != expected
    assert jetstream_time(None) is None
    assert jetstream_time("_INBOX.x.y") is None


def test_ballots_before_the_proposal_are_unknown_and_later_ones_count() -> None:
    s = Log()
    early = s.vote("a", 0)
    s.propose(make_proposal())
    counted = s.vote("a", 0)
    rejection = s.log.fates[early]
    assert rejection is not None and rejection.reason == "unknown_proposal"
    assert s.log.fates[counted] is None
    assert s.log.is_open


def test_any_message_after_the_deadline_closes_the_tally() -> None:
    s = Log()
    p = make_proposal(deadline=T0 + timedelta(seconds=5))
    s.propose(p)
    s.vote("a", 0)
    s.vote("b", 0)
    assert s.log.decided is None and not s.log.deadline_passed()
    s.send("close", at=T0 + timedelta(seconds=5))  # at the deadline: not after it
    assert s.log.decided is None
    s.send("close", at=T0 + timedelta(seconds=5, microseconds=1))
    decided = s.log.decided
    assert decided is not None and decided.closed_by == "deadline" and decided.status == "accepted"
    assert decided.decided_at == p.deadline
    late = s.vote("c", 1, at=T0 + timedelta(seconds=9))
    assert s.log.fates[late] is not None and s.log.fates[late].reason == "late"


def test_a_late_ballot_closes_the_proposal_like_a_close_request() -> None:
    s = Log()
    s.propose(make_proposal(deadline=T0 + timedelta(seconds=3)))
    s.vote("a", 0)
    late = s.vote("b", 1, at=T0 + timedelta(seconds=60))
    rejection = s.log.fates[late]
    assert rejection is not None and rejection.reason == "late"
    decided = s.log.decided
    assert decided is not None and decided.closed_by == "deadline" and decided.counts.votes == [1, 0]


def test_recorded_and_applied_outcomes_make_it_committed() -> None:
    s = Log()
    s.propose(make_proposal(deadline=None))
    for v in ("a", "b", "c"):
        s.vote(v, 1)
    decided = s.log.decided
    assert decided is not None and decided.status == "accepted" and decided.value == "y"
    assert s.log.committed is None
    s.send("outcome", decided.model_dump(mode="json"), headers={Header.BASE_REVISION.value: "17"})
    assert s.log.recorded is not None and s.log.recorded.base_revision == 17
    assert s.log.committed is None  # accepted: committed once applied
    applied = decided.model_copy(update={"revision": 99})
    s.send("applied", applied.model_dump(mode="json"))
    assert s.log.committed == applied and not s.log.diverged
    # A second record is ignored: the first one stands.
    s.send("outcome", decided.model_copy(update={"status": "rejected", "candidate": None, "value": None})
           .model_dump(mode="json"))
    assert s.log.recorded.outcome.status == "accepted"


def test_a_rejected_outcome_is_committed_once_recorded_and_divergence_is_flagged() -> None:
    s = Log()
    s.propose(make_proposal(deadline=None))
    for v in ("a", "b", "c"):
        s.vote(v, "reject")
    decided = s.log.decided
    assert decided is not None and decided.status == "rejected"
    wrong = decided.model_copy(update={"counts": decided.counts.model_copy(update={"reject": 2})})
    s.send("outcome", wrong.model_dump(mode="json"))
    assert s.log.committed == wrong and s.log.diverged


def test_ballots_decode_strictly_but_tolerate_unknown_fields() -> None:
    good = {"v": 1, "id": "x", "proposal_id": "p1", "voter": "a", "choice": 1, "created_at": T0.isoformat()}
    assert decode_ballot(codec.encode({**good, "future": True})).choice == 1
    with pytest.raises(InvalidPayloadError):
        decode_ballot(codec.encode({**good, "choice": "1"}))  # no coercion of "1" to 1
    with pytest.raises(InvalidPayloadError):
        decode_ballot(codec.encode({**good, "choice": True}))
    s = Log()
    s.propose(make_proposal())
    seq = s.send("ballot", {**good, "choice": "1"})
    assert seq not in s.log.fates  # not a ballot: ignored by every observer


def test_a_proposal_for_another_subject_is_ignored() -> None:
    s = Log()
    other = make_proposal().model_copy(update={"id": "p2"})
    s.send("proposal", other.model_dump(mode="json"))
    assert s.log.proposal is None


def test_classify_marks_counted_superseded_and_rejected() -> None:
    p = make_proposal(deadline=T0 + timedelta(seconds=100))
    ballots = [
        StampedBallot(2, T0 + timedelta(seconds=2), Ballot(id="1", proposal_id="p1", voter="a", choice=0,
                                                           created_at=T0)),
        StampedBallot(3, T0 + timedelta(seconds=3), Ballot(id="2", proposal_id="p1", voter="zz", choice=0,
                                                           created_at=T0)),
        StampedBallot(4, T0 + timedelta(seconds=4), Ballot(id="3", proposal_id="p1", voter="a", choice=1,
                                                           created_at=T0)),
        StampedBallot(5, T0 + timedelta(seconds=5), Ballot(id="3", proposal_id="p1", voter="a", choice=1,
                                                           created_at=T0)),
        StampedBallot(6, T0 + timedelta(seconds=500), Ballot(id="4", proposal_id="p1", voter="b", choice=1,
                                                             created_at=T0)),
    ]
    fates = classify_ballots(p, 1, ballots)
    assert fates == {
        2: BallotFate("superseded"), 3: BallotFate("rejected", "ineligible"), 4: BallotFate("counted"),
        5: BallotFate("rejected", "duplicate"), 6: BallotFate("rejected", "late"),
    }
    assert classify_ballots(None, 0, ballots[:1]) == {2: BallotFate("rejected", "unknown_proposal")}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([*VOTERS, "z"]), st.sampled_from([0, 1, "reject", "abstain"]),
                          st.integers(min_value=1, max_value=200)), max_size=25),
       st.sampled_from(["majority", "unanimous", "threshold"]))
def test_the_log_and_a_recount_agree(votes: list[tuple[str, Choice, int]], kind: str) -> None:
    """Feeding messages one by one gives the outcome and fates of a one-shot recount."""
    policy = Policy(kind="threshold", threshold=0.6) if kind == "threshold" else Policy.model_validate({"kind": kind})
    p = make_proposal(deadline=T0 + timedelta(seconds=100), policy=policy)
    s = Log()
    s.propose(p)
    stamped: list[StampedBallot] = []
    at = T0
    for i, (voter, choice, gap) in enumerate(votes):
        at += timedelta(seconds=gap / 10)
        seq = s.vote(voter, choice, ballot_id=f"b{i}", at=at)
        stamped.append(StampedBallot(seq, at, Ballot(id=f"b{i}", proposal_id="p1", voter=voter, choice=choice,
                                                     created_at=T0)))
    s.send("close", at=max(at, p.deadline or at) + timedelta(seconds=1))
    recount = tally(p, stamped, T0 + timedelta(days=1), proposal_sequence=1).outcome
    assert recount is not None and s.log.decided is not None
    assert same_outcome(recount, s.log.decided)
    fates = classify_ballots(p, 1, stamped)
    for seq, rejection in s.log.fates.items():
        assert (fates[seq].status == "rejected") == (rejection is not None)
        if rejection is not None:
            assert fates[seq].reason == rejection.reason


def test_subjects_of_a_proposal_parse_back() -> None:
    for kind in ("proposal", "close", "outcome", "applied"):
        assert Subjects.parse_vote(Subjects.vote("b", "p1", kind)) == ("b", "p1", kind, None)
    ballot = Subjects.vote("b", "p1", "ballot", "alice")
    assert ballot == "bb.vote.b.p1.ballot.alice"
    parsed = Subjects.parse_vote(ballot)
    assert parsed == ("b", "p1", "ballot", "alice") and parsed.voter == "alice" and parsed.kind == "ballot"


@pytest.mark.parametrize("subject", [
    "bb.vote.b.p1.ballot",  # the version 1 ballot subject: no voter
    "bb.vote.b.p1.outcome.alice",  # only a ballot names a voter
    "bb.vote.b.p1.ballot.alice.x",
    "bb.vote.b.p1.ballot.al!ce",
    "bb.vote.b.p1",
])
def test_vote_subjects_without_their_voter_or_with_a_stray_one_do_not_parse(subject: str) -> None:
    with pytest.raises(InvalidKeyError):
        Subjects.parse_vote(subject)


def test_a_ballot_subject_needs_its_voter_and_only_a_ballot_has_one() -> None:
    with pytest.raises(InvalidKeyError):
        Subjects.vote("b", "p1", "ballot")
    with pytest.raises(InvalidKeyError):
        Subjects.vote("b", "p1", "outcome", "alice")
    with pytest.raises(InvalidKeyError):
        Subjects.vote("b", "p1", "ballot", "a.b")
    # A proposal's filter takes its 6-token ballots too.
    assert Subjects.vote_filter("b", "p1") == "bb.vote.b.p1.>"


def test_a_ballot_whose_payload_names_another_voter_than_its_subject_is_not_a_ballot() -> None:
    s = Log()
    s.propose(make_proposal())
    own = s.vote("a", 0)
    assert s.log.fates[own] is None  # a's own ballot counts
    ballot = Ballot(id="x1", proposal_id="p1", voter="b", choice=1, created_at=T0)
    seq = s.send("ballot", ballot.model_dump(mode="json"), voter="mallory")  # b's payload on mallory's subject
    assert seq not in s.log.fates
    assert s.log.tally is not None and s.log.tally.counts().votes == [1, 0]


def test_public_voting_names_are_exported() -> None:
    import agents_sdk

    for name in ("ProposalHandle", "BallotReceipt", "VoteWatch", "VoteEvent", "Voting", "Policy", "Outcome",
                 "ProposalNotFoundError", "IneligibleVoterError", "ProposalClosedError", "DeadlinePassedError",
                 "InvalidBallotError", "OutcomeTimeoutError", "VoteError"):
        assert name in agents_sdk.__all__
        assert hasattr(agents_sdk, name)


# ------------------------------------------------------------------ signatures
def test_messages_that_do_not_verify_are_not_proposals_ballots_or_outcomes() -> None:
    s = Log()
    forged_proposal = s.propose(make_proposal(deadline=T0 + timedelta(seconds=50)), verdict=Verdict.UNSIGNED)
    assert s.log.proposal is None and s.log.unverified == {forged_proposal: Verdict.UNSIGNED}
    s.propose(make_proposal(deadline=T0 + timedelta(seconds=50)), verdict=Verdict.VERIFIED)
    forged = [s.vote(v, 1, verdict=Verdict.WRONG_AUTHOR) for v in ("a", "b", "c")]  # would decide y
    assert s.log.decided is None and s.log.tally is not None and s.log.tally.counts().ballots == 0
    assert all(s.log.fates[q] is not None and s.log.fates[q].reason == "unverified" for q in forged)  # type: ignore[union-attr]
    for v in ("a", "b", "c"):
        s.vote(v, 0, verdict=Verdict.VERIFIED)
    decided = s.log.decided
    assert decided is not None and decided.value == "x"
    assert all(cb.sequence not in forged for cb in decided.counted_ballots)
    assert not any(r.sequence in forged for r in decided.rejected_ballots)  # not ballots at all
    # An outcome a worker did not sign is not the record; the one it signed is.
    s.send("outcome", decided.model_dump(mode="json"), verdict=Verdict.WRONG_AUTHOR)
    assert s.log.recorded is None
    s.send("outcome", decided.model_dump(mode="json"), verdict=Verdict.VERIFIED)
    assert s.log.recorded is not None and s.log.committed is None


def test_an_unverified_message_still_proves_the_deadline_passed() -> None:
    s = Log()
    s.propose(make_proposal(deadline=T0 + timedelta(seconds=5)))
    s.vote("a", 0)
    s.send("close", at=T0 + timedelta(seconds=6), verdict=Verdict.UNSIGNED)  # the server stamped it
    decided = s.log.decided
    assert decided is not None and decided.closed_by == "deadline" and decided.counts.ballots == 1


def test_the_decided_outcome_names_its_sources_with_their_signatures() -> None:
    s = Log()
    pseq = s.send("proposal", make_proposal(deadline=None).model_dump(mode="json"), headers=sig(0))
    seqs = []
    for n, (v, c) in enumerate([("a", 1), ("b", 0), ("a", 0), ("c", 0)], start=1):  # a's first is superseded
        seqs.append(s.send("ballot", Ballot(id=f"{v}{n}", proposal_id="p1", voter=v, choice=c, created_at=T0)
                           .model_dump(mode="json"), headers=sig(n)))
    decided = s.log.decided  # c's ballot decides: x has 3 of the 5 voters
    assert decided is not None and decided.deciding_sequence == seqs[-1]
    counted = [cb.sequence for cb in decided.counted_ballots]
    assert [src.seq for src in decided.sources] == [pseq, *counted] == [pseq, *seqs[1:]]  # a's first: superseded
    assert decided.sources[0] == SourceRef(stream="BB_VOTE", seq=pseq, key=sig(0)[Header.SIG_KEY.value],
                                           sig=sig(0)[Header.SIG.value])
    assert [(src.key, src.sig) for src in decided.sources[1:]] == [
        (sig(n)[Header.SIG_KEY.value], sig(n)[Header.SIG.value]) for n in (2, 3, 4)]
    assert same_outcome(decided, decided.model_copy(update={"sources": []}))
    late = s.vote("d", 0)
    assert s.log.decided is decided and s.log.fates[late] is not None  # closed: no new source


def test_an_unsigned_source_has_no_key() -> None:
    s = Log()
    s.propose(make_proposal(voters=["a"], deadline=None))
    s.vote("a", 0)
    decided = s.log.decided
    assert decided is not None and [(src.key, src.sig) for src in decided.sources] == [(None, None)] * 2
