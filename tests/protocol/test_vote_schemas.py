"""Wire schemas of messaging and voting: round trips through the codec, strict
decoding, and the validation rules of each model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import blackboard.protocol.schemas as schemas
from blackboard.consensus.tally import StampedBallot, tally
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import (
    Ballot,
    MessageEnvelope,
    Outcome,
    Policy,
    Proposal,
    WireModel,
    json_schemas,
    validate_wire,
)

T0 = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _proposal(**kw: Any) -> Proposal:
    fields: dict[str, Any] = {
        "id": "p1",
        "board": "b",
        "section": "facts",
        "key": "capital of France?",
        "question": "What is the capital of France?",
        "candidates": ["Paris", {"city": "Lyon", "n": [1, 2.5]}, None],
        "policy": Policy(kind="weighted", weights={"a": 2.5, "b": 0.0}, threshold=2 / 3, quorum=2),
        "voters": ["a", "b", "c"],
        "proposer": "a",
        "created_at": T0,
        "deadline": T0 + timedelta(minutes=5),
    }
    fields.update(kw)
    return Proposal(**fields)


def _outcome() -> Outcome:
    p = _proposal(voters=None, policy=Policy(quorum=2))
    ballots = [
        Ballot(id="1", proposal_id="p1", voter="a", choice=1, created_at=T0),
        Ballot(
            id="2", proposal_id="p1", voter="b", choice="abstain", reason="unsure", created_at=T0
        ),
        Ballot(id="3", proposal_id="p1", voter="a", choice=0, created_at=T0),
        Ballot(id="4", proposal_id="p9", voter="c", choice=0, created_at=T0),
    ]
    stamped = [StampedBallot(i + 1, T0 + timedelta(seconds=i), b) for i, b in enumerate(ballots)]
    outcome = tally(p, stamped, T0 + timedelta(hours=1)).outcome
    assert outcome is not None
    return outcome.model_copy(update={"revision": 42})


SAMPLES: list[WireModel] = [
    MessageEnvelope(
        id="m1",
        sender="a",
        kind="direct",
        recipients=["b", "c"],
        type="task.handoff",
        body={"task": "summarise", "files": ["x.py"], "n": 3, "ok": True, "x": None},
        correlation_id="c-1",
        reply_to="_INBOX.abc.1",
        created_at=T0,
        metadata={"priority": 2},
    ),
    MessageEnvelope(id="m2", sender="a", kind="broadcast", board="b", type="found", created_at=T0),
    MessageEnvelope(
        id="m3",
        sender="a",
        kind="topic",
        topic="build.failed",
        type="alert",
        body=[1],
        created_at=T0,
    ),
    _proposal(),
    _proposal(
        candidates=[42], policy=Policy(), voters=None, deadline=T0 + timedelta(seconds=30)
    ),  # a proposal of one value
    _proposal(policy=Policy(kind="threshold", threshold=0.9), deadline=None),
    _proposal(policy=Policy(kind="unanimous")),
    Ballot(id="b1", proposal_id="p1", voter="a", choice=2, reason="because", created_at=T0),
    Ballot(id="b2", proposal_id="p1", voter="a", choice="reject", created_at=T0),
    Ballot(id="b3", proposal_id="p1", voter="a", choice="abstain", created_at=T0),
    _outcome(),
]


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_round_trip_through_the_codec_and_strict_decoding(obj: WireModel, encoding: Any) -> None:
    data = codec.decode(codec.encode(obj.model_dump(), encoding), encoding)
    assert validate_wire(type(obj), data, strict=True) == obj
    json_mode = codec.decode(codec.encode(obj.model_dump(mode="json"), encoding), encoding)
    assert validate_wire(type(obj), json_mode, strict=True) == obj


def test_msgpack_carries_bytes_in_a_message_body() -> None:
    msg = MessageEnvelope(
        id="m",
        sender="a",
        kind="direct",
        recipients=["b"],
        type="blob",
        body=b"\x00\xff",
        created_at=T0,
    )
    data = codec.decode(codec.encode(msg.model_dump()))
    assert validate_wire(MessageEnvelope, data, strict=True).body == b"\x00\xff"


def test_strict_decoding_refuses_unknown_fields_and_coercion_tolerant_decoding_does_not() -> None:
    data = codec.decode(codec.encode(SAMPLES[-4].model_dump()))  # a ballot
    with pytest.raises(InvalidPayloadError):
        validate_wire(Ballot, {**data, "extra": 1}, strict=True)
    assert validate_wire(Ballot, {**data, "extra": 1}) == SAMPLES[-4]
    with pytest.raises(InvalidPayloadError):
        validate_wire(Ballot, {**data, "choice": "2"}, strict=True)
    with pytest.raises(InvalidPayloadError):
        validate_wire(Ballot, {**data, "choice": True}, strict=True)


def test_timestamps_from_other_clients_decode_strictly_and_must_be_aware() -> None:
    data = codec.decode(codec.encode(SAMPLES[-4].model_dump(mode="json")), "msgpack")
    zulu = validate_wire(Ballot, {**data, "created_at": "2030-01-01T12:00:00Z"}, strict=True)
    assert zulu.created_at == datetime(2030, 1, 1, 12, tzinfo=UTC)
    for bad in ("2030-01-01T12:00:00", "yesterday", 17):
        with pytest.raises(InvalidPayloadError):
            validate_wire(Ballot, {**data, "created_at": bad}, strict=True)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"policy": {"kind": "threshold"}}, "needs a threshold"),
        ({"policy": {"kind": "majority", "threshold": 0.5}}, "takes no threshold"),
        ({"policy": {"kind": "threshold", "threshold": 0.0}}, "threshold"),
        ({"policy": {"kind": "threshold", "threshold": 1.5}}, "threshold"),
        ({"policy": {"kind": "majority", "weights": {"a": 2}}}, "only a weighted"),
        ({"policy": {"kind": "weighted", "weights": {"a": -1}}}, "weights"),
        ({"policy": {"quorum": 0}}, "quorum"),
        ({"policy": {"quorum": 4}}, "larger than the number of voters"),
        ({"voters": None, "deadline": None}, "needs a deadline"),
        ({"voters": []}, "must not be empty"),
        ({"voters": ["a", "a"]}, "distinct"),
        ({"voters": ["a b"]}, "voters"),
        ({"candidates": []}, "candidates"),
        ({"candidates": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]}, "pairwise distinct"),
        ({"id": "has.dot"}, "id"),
        ({"key": ""}, "key"),
    ],
)
def test_invalid_proposals_are_refused(fields: dict[str, Any], fragment: str) -> None:
    data = {**_proposal(policy=Policy()).model_dump(mode="json"), **fields}
    with pytest.raises(InvalidPayloadError, match=fragment):
        validate_wire(Proposal, data)


def test_candidates_of_different_json_types_are_distinct() -> None:
    assert len(_proposal(candidates=[1, "1", True, 1.5, None, [1]]).candidates) == 6


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"kind": "direct", "recipients": []}, "at least one recipient"),
        ({"kind": "broadcast", "recipients": ["b"], "board": "b"}, "takes no recipients"),
        ({"kind": "broadcast", "recipients": []}, "needs a board"),
        ({"kind": "topic", "recipients": []}, "needs a topic"),
        ({"kind": "topic", "recipients": [], "topic": "build.*"}, "topic token"),
        ({"topic": "x"}, "takes no topic"),
        ({"kind": "shout"}, "kind"),
        ({"sender": "a.b"}, "sender"),
        ({"type": ""}, "type"),
    ],
)
def test_invalid_messages_are_refused(fields: dict[str, Any], fragment: str) -> None:
    data = {**SAMPLES[0].model_dump(mode="json"), **fields}
    with pytest.raises(InvalidPayloadError, match=fragment):
        validate_wire(MessageEnvelope, data)


def test_json_schemas_list_the_messaging_and_voting_models() -> None:
    found = json_schemas()
    for name in ("MessageEnvelope", "Proposal", "Ballot", "Outcome"):
        assert found[name]["type"] == "object"  # type: ignore[index]
    ballot = found["Ballot"]["properties"]["choice"]  # type: ignore[index]
    assert {"minimum": 0, "type": "integer"} in ballot["anyOf"]


def test_schemas_package_exports_the_new_models() -> None:
    names = {
        "Ballot",
        "BallotRejection",
        "Choice",
        "CountedBallot",
        "MessageEnvelope",
        "MessageKind",
        "Name",
        "Outcome",
        "OutcomeStatus",
        "Policy",
        "PolicyKind",
        "Proposal",
        "RejectReason",
        "TallyCounts",
        "Timestamp",
        "canonical_json",
    }
    assert names <= set(schemas.__all__)
    assert all(hasattr(schemas, n) for n in names)
