"""Pure parts of messaging: subject patterns, inbox grants, envelopes, exports."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agents_sdk
from agents_sdk.messaging.envelope import (
    decode_envelope,
    encode_envelope,
    error_body,
    new_envelope,
    reply_envelope,
)
from agents_sdk.messaging.inbox import (
    admitted,
    consumer_filters,
    grants_from_metadata,
    metadata_from_grants,
    pattern_covers,
    patterns_overlap,
    subject_matches,
    with_grant,
    without_grant,
)
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import MessageEnvelope, validate_wire
from blackboard.protocol.subjects import Subjects

# A small universe: patterns use a, b, * and a trailing >; subjects also use c,
# which no pattern names, so "*" and ">" are told apart from literals.
_SUBJECTS = [".".join(t) for n in range(1, 6) for t in itertools.product("abc", repeat=n)]
_token = st.sampled_from(["a", "b", "*"])
patterns = st.builds(
    lambda toks, tail: ".".join([*toks, ">"] if tail else toks),
    st.lists(_token, min_size=1, max_size=4), st.booleans())


@given(patterns, patterns)
def test_pattern_covers_agrees_with_matching_over_the_universe(outer: str, inner: str) -> None:
    expected = all(subject_matches(s, outer) for s in _SUBJECTS if subject_matches(s, inner))
    assert pattern_covers(outer, inner) == expected


@given(patterns, patterns)
def test_patterns_overlap_agrees_with_matching_over_the_universe(a: str, b: str) -> None:
    expected = any(subject_matches(s, a) and subject_matches(s, b) for s in _SUBJECTS)
    assert patterns_overlap(a, b) == expected
    assert patterns_overlap(b, a) == expected


def test_subject_matches_nats_rules() -> None:
    assert subject_matches("a.b", "a.*")
    assert subject_matches("a.b.c", "a.>")
    assert not subject_matches("a", "a.>")
    assert not subject_matches("a.b.c", "a.*")
    assert subject_matches("a.b", "a.b")
    assert not subject_matches("a.b", "a.b.c")


@given(st.dictionaries(patterns, st.integers(0, 100), min_size=1, max_size=5))
def test_consumer_filters_cover_every_grant_without_overlap(grants: dict[str, int]) -> None:
    try:
        filters = consumer_filters(grants)
    except InvalidKeyError:
        # refused only when two maximal patterns overlap partially
        assert any(patterns_overlap(p, q) and not pattern_covers(p, q) and not pattern_covers(q, p)
                   for p, q in itertools.combinations(grants, 2))
        return
    for p in grants:
        assert any(pattern_covers(f, p) for f in filters)
    for f, g in itertools.combinations(filters, 2):
        assert not patterns_overlap(f, g)
    assert set(filters) <= set(grants)


def test_grants_admit_only_after_their_start() -> None:
    direct = Subjects.direct("me")
    board = Subjects.broadcast("b1")
    grants = with_grant({direct: 0}, board, 10)
    assert admitted(direct, 1, grants)
    assert not admitted(board, 10, grants) and admitted(board, 11, grants)
    assert not admitted(Subjects.broadcast("b2"), 50, grants)
    assert with_grant(grants, board, 99)[board] == 10  # re-joining keeps the first start
    assert without_grant(grants, board) == {direct: 0}
    # a covered pattern keeps its own, earlier start under the covering one
    topics = with_grant(with_grant(grants, Subjects.topic("x.y"), 5), Subjects.topic("x.>"), 20)
    assert admitted(Subjects.topic("x.y"), 6, topics) and not admitted(Subjects.topic("x.z"), 6, topics)
    assert consumer_filters(topics) == sorted([direct, board, Subjects.topic("x.>")])
    with pytest.raises(InvalidKeyError):
        with_grant(with_grant({}, "t.a.*", 0), "t.*.b", 0)


def test_grants_roundtrip_through_consumer_metadata() -> None:
    grants = {Subjects.direct("me"): 0, Subjects.broadcast("b"): 7, Subjects.topic("x.>"): 9}
    meta = metadata_from_grants(grants)
    assert all(k.startswith("bb.start:") for k in meta)
    meta["_nats.ver"] = "2.15.1"  # server-set entries are ignored
    assert grants_from_metadata(meta, consumer_filters(grants)) == grants
    # a filter set by another client without metadata starts at 0
    assert grants_from_metadata({}, ["bb.msg.agent.x"]) == {"bb.msg.agent.x": 0}


def test_envelopes_validate_and_roundtrip_in_both_encodings() -> None:
    env = new_envelope(id="m1", sender="a", kind="direct", recipients=["b"], type="t", body={"x": [1, 2]},
                       created_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))
    for encoding in ("msgpack", "json"):
        data = encode_envelope(env, encoding)
        assert decode_envelope(data, codec.headers_for(encoding)) == env
    strict = validate_wire(MessageEnvelope, codec.decode(encode_envelope(env)), strict=True)
    assert strict == env
    reply = reply_envelope(env, id="m2", sender="b", body=error_body("ValueError", "no"))
    assert (reply.recipients, reply.correlation_id, reply.type) == (["a"], "m1", "t")
    with pytest.raises(InvalidKeyError):
        new_envelope(id="m", sender="a b", kind="direct", recipients=["b"], type="t")
    with pytest.raises(InvalidPayloadError):
        new_envelope(id="m", sender="a", kind="broadcast", type="t")  # a broadcast needs a board
    with pytest.raises(InvalidPayloadError):
        decode_envelope(b"\x93\x01\x02\x03", None)


def test_public_names_are_exported() -> None:
    for name in ("Message", "Inbox", "Messenger", "Sent", "Subscriptions", "Handler", "NoResponderError",
                 "NoHandlerError", "RequestTimeoutError", "RemoteError", "InboxBusyError", "MessagingError"):
        assert name in agents_sdk.__all__
        assert hasattr(agents_sdk, name)
