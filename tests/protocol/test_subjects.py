"""The protocol's names: subscription pattern algebra, memory and ack-reply parsers, API subjects, ids."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from blackboard.protocol import subjects
from blackboard.protocol.errors import InvalidKeyError
from blackboard.protocol.subjects import (
    Subjects,
    decode_key,
    encode_key,
    pattern_covers,
    patterns_overlap,
    subject_matches,
    validate_name,
)

# -- subscription patterns, against a brute-force matcher -------------------------------


def _brute_matches(subject: str, pattern: str) -> bool:
    """NATS wildcard matching written independently: the pattern as a regular expression."""
    parts = []
    toks = pattern.split(".")
    for i, tok in enumerate(toks):
        if tok == ">" and i == len(toks) - 1:
            parts.append(r"[^.]+(?:\.[^.]+)*")
        elif tok == "*":
            parts.append(r"[^.]+")
        else:
            parts.append(re.escape(tok))
    return re.fullmatch(r"\.".join(parts), subject) is not None


# Patterns name a and b; subjects also use c, which no pattern names, so a
# wildcard is told apart from a literal. Patterns have at most 5 tokens, so
# subjects of up to 6 tokens hold a witness of every difference.
_UNIVERSE = [".".join(t) for n in range(1, 7) for t in itertools.product("abc", repeat=n)]
_token = st.sampled_from(["a", "b", "*"])
patterns = st.builds(lambda toks, tail: ".".join([*toks, ">"] if tail else toks),
                     st.lists(_token, min_size=1, max_size=4), st.booleans())
concrete = st.lists(st.sampled_from("abc"), min_size=1, max_size=7).map(".".join)


@given(concrete, patterns)
def test_subject_matches_agrees_with_a_brute_force_matcher(subject: str, pattern: str) -> None:
    assert subject_matches(subject, pattern) == _brute_matches(subject, pattern)


@given(patterns, patterns)
def test_pattern_covers_is_inclusion_of_matched_sets(outer: str, inner: str) -> None:
    expected = all(_brute_matches(s, outer) for s in _UNIVERSE if _brute_matches(s, inner))
    assert pattern_covers(outer, inner) == expected


@given(patterns, patterns)
def test_patterns_overlap_is_a_common_subject(a: str, b: str) -> None:
    expected = any(_brute_matches(s, a) and _brute_matches(s, b) for s in _UNIVERSE)
    assert patterns_overlap(a, b) == expected
    assert patterns_overlap(b, a) == expected


def test_pattern_algebra_on_named_cases() -> None:
    assert subject_matches("bb.msg.topic.build.failed", "bb.msg.topic.build.>")
    assert not subject_matches("bb.msg.topic.build", "bb.msg.topic.build.>")
    assert not subject_matches("a.b.c", "a.*")
    assert pattern_covers("a.>", "a.*.c")
    assert not pattern_covers("a.*", "a.>")
    assert not pattern_covers("a.*.c", "a.b.*")
    assert patterns_overlap("a.*.c", "a.b.*")
    assert not patterns_overlap("a.b", "a.b.c")


def test_pattern_algebra_is_public_in_the_protocol_module() -> None:
    for name in ("subject_matches", "pattern_covers", "patterns_overlap"):
        assert name in subjects.__all__


# -- names -----------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)


@pytest.mark.parametrize("bad", ["b\n", "b\r\n", "", "a.b", "a b", "x" * 129, "é"])
def test_validate_name_refuses_bad_tokens_including_a_trailing_newline(bad: str) -> None:
    with pytest.raises(InvalidKeyError):
        validate_name(bad)


def test_a_key_with_a_trailing_newline_is_encoded_not_kept_plain() -> None:
    token = encode_key("notes\n")
    assert token.startswith("=") and "\n" not in token
    assert decode_key(token) == "notes\n"
    with pytest.raises(InvalidKeyError):
        decode_key("notes\n")


# -- memory subjects ---------------------------------------------------------------------


@given(names, names)
def test_parse_memory_inverts_memory(board: str, agent: str) -> None:
    assert Subjects.parse_memory(Subjects.memory(board, agent)) == (board, agent)


@pytest.mark.parametrize("bad", [
    "bb.mem.b", "bb.mem.b.a.x", "bb.msg.b.a", "xb.mem.b.a", "bb.mem.b.", "bb.mem..a", "bb.mem.b.a\n",
    "bb.mem.b!.a", "bb.mem.b.*", "bb.mem.b.>", "bb.mem." + "x" * 129 + ".a", "bbxmem.b.a",
])
def test_parse_memory_refuses_anything_else(bad: str) -> None:
    with pytest.raises(InvalidKeyError):
        Subjects.parse_memory(bad)


# -- JetStream ack reply subjects --------------------------------------------------------

_NS = 1_893_456_000_123_456_999  # 2030-01-01T00:00:00.123456999Z


@pytest.mark.parametrize("reply", [
    f"$JS.ACK.BB_VOTE.c-1.3.42.7.{_NS}.5",
    f"$JS.ACK.dom.acchash.BB_VOTE.c-1.3.42.7.{_NS}.5",
    f"$JS.ACK.dom.acchash.BB_VOTE.c-1.3.42.7.{_NS}.5.randtok",
])
def test_parse_ack_reads_both_forms_and_agrees_with_nats_py(reply: str) -> None:
    stream, seq, stamp = Subjects.parse_ack(reply)
    assert (stream, seq, stamp) == ("BB_VOTE", 42, datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC))
    md = Msg(None, subject="x", reply=reply).metadata  # type: ignore[arg-type]
    assert (md.stream, md.sequence.stream) == (stream, seq)
    assert abs(md.timestamp - stamp) <= timedelta(microseconds=1)  # nats-py goes through a float


@given(st.integers(min_value=0, max_value=4_000_000_000_000_000_000), st.integers(min_value=1, max_value=2**63))
def test_parse_ack_truncates_nanoseconds_exactly(ns: int, seq: int) -> None:
    _, got_seq, stamp = Subjects.parse_ack(f"$JS.ACK.S.c.1.{seq}.1.{ns}.0")
    assert got_seq == seq
    assert stamp == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)


@pytest.mark.parametrize("bad", [
    "", "_INBOX.x.y", "$JS.ACK.a.b.c", "$JS.API.a.b.c.d.e.f.g", "$JS.ACK.d.h.S.c.1.2.3.4",  # 10 tokens
    "$JS.ACK.S.c.1.x.3.4.0", "$JS.ACK.S.c.1.2.3.y.0", "$js.ack.S.c.1.2.3.4.0",
])
def test_parse_ack_refuses_other_subjects(bad: str) -> None:
    with pytest.raises(InvalidKeyError):
        Subjects.parse_ack(bad)


# -- API subjects, consumer names, message ids (pinned: they are the wire) ------------


def test_api_subjects_consumer_names_and_message_ids() -> None:
    assert Subjects.direct_get("KV_blackboard") == "$JS.API.DIRECT.GET.KV_blackboard"
    assert Subjects.direct_get("KV_b", last_by_subject="$KV.b.x.y.k") == "$JS.API.DIRECT.GET.KV_b.$KV.b.x.y.k"
    assert Subjects.worker_consumer("worker", "entries") == "worker-entries"
    assert Subjects.close_msg_id("b", "p1", 1_700_000_000) == "bb-close:b.p1:1700000000"
    assert Subjects.apply_msg_id("b", "p1") == "bb-apply:b.p1"
    for bad in ("a.b", "", "x y"):
        with pytest.raises(InvalidKeyError):
            Subjects.worker_consumer(bad, "entries")
        with pytest.raises(InvalidKeyError):
            Subjects.apply_msg_id("b", bad)


def test_a_topic_or_filter_token_nested_too_deep_to_print_is_refused_with_a_typed_error() -> None:
    # str() of a list nested 100,000 deep raises RecursionError; the refusal must not call it.
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidKeyError, match="<list>"):
        Subjects.topic(deep)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError, match="<list>"):
        Subjects().entry_filter(None, deep)  # type: ignore[arg-type]
