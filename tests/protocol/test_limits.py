"""The protocol's limits (``docs/protocol.md``, "Limits"): every decoder refuses what
goes beyond them with a typed error, never a RecursionError; every writer refuses
the same, so nothing a writer sends is refused by a reader, and nothing a reader
takes breaks a later read (a reply carrying it, PostgreSQL, a datetime)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_sdk.messaging.envelope import decode_envelope, new_envelope
from blackboard.protocol import codec, limits, records
from blackboard.protocol.entries import decode_entry, encode_entry
from blackboard.protocol.errors import InvalidPayloadError, LimitExceededError
from blackboard.protocol.schemas import (
    EntryEnvelope,
    EntryHit,
    EntrySearchResponse,
    MemoryRecord,
    Proposal,
    validate_wire,
)
from blackboard.protocol.subjects import KeyParts

T0 = datetime(2026, 5, 4, 3, 2, 1, tzinfo=UTC)
PARTS = KeyParts("b", "s", "k")


def nested(levels: int, leaf: Any = 1) -> Any:
    """``levels`` arrays, one in the other, around ``leaf``."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def deep_json(levels: int) -> bytes:
    return b'{"v":1,"author":"a","created_at":"2026-01-01T00:00:00+00:00","value":' + (
        b"[" * levels + b"]" * levels + b"}")


# --------------------------------------------------------------- nesting
@pytest.mark.parametrize("levels", [limits.MAX_DEPTH + 1, 600, 5_000, 100_000])
def test_deep_json_is_refused_with_a_typed_error_not_a_recursion_error(levels: int) -> None:
    with pytest.raises(LimitExceededError) as info:
        codec.decode(deep_json(levels), "json")
    assert info.value.limit == "MAX_DEPTH"


@pytest.mark.parametrize("levels", [limits.MAX_DEPTH + 1, 600, 1_023, 5_000])
def test_deep_msgpack_is_refused_with_a_typed_error(levels: int) -> None:
    data = b"\x81\xa5value" + b"\x91" * levels + b"\x01"
    with pytest.raises(LimitExceededError):
        codec.decode(data)


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_the_deepest_record_is_taken_and_one_level_more_is_refused_by_writer_and_reader(
        encoding: codec.Encoding) -> None:
    ok = {"v": 1, "value": nested(limits.MAX_DEPTH - 1), "author": "a", "created_at": T0.isoformat()}
    assert codec.decode(codec.encode(ok, encoding), encoding) == ok
    too_deep = {**ok, "value": nested(limits.MAX_DEPTH)}
    with pytest.raises(LimitExceededError):
        codec.encode(too_deep, encoding)
    raw = json.dumps(too_deep).encode() if encoding == "json" else msgpack.packb(too_deep)
    with pytest.raises(LimitExceededError):
        codec.decode(raw, encoding)


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[" * 500 + "{" * 500 + '"\\"]'
    data = json.dumps({"value": text, "list": nested(10)}).encode()
    assert codec.decode(data, "json")["value"] == text


def test_a_wide_record_with_many_containers_is_not_deep() -> None:
    value = {"rows": [{"a": i, "b": [i, {"c": "é中"}]} for i in range(500)]}
    for encoding in ("msgpack", "json"):
        assert codec.decode(codec.encode(value, encoding), encoding) == value  # type: ignore[arg-type]


def test_a_value_holding_itself_is_refused_not_looped_on() -> None:
    loop: list[Any] = []
    loop.append(loop)
    for encoding in ("msgpack", "json"):
        with pytest.raises(LimitExceededError):
            codec.encode({"value": loop}, encoding)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3 * limits.MAX_DEPTH), st.sampled_from(["msgpack", "json"]))
def test_depth_is_judged_exactly(levels: int, encoding: codec.Encoding) -> None:
    value = {"pad": [{"k": "x" * 40}] * 80, "deep": nested(levels - 1, {})}  # many containers, one deep branch
    depth = levels + 1
    raw = json.dumps(value).encode() if encoding == "json" else msgpack.packb(value)
    if depth <= limits.MAX_DEPTH:
        assert codec.decode(raw, encoding) == value
        assert codec.decode(codec.encode(value, encoding), encoding) == value
    else:
        with pytest.raises(LimitExceededError):
            codec.decode(raw, encoding)
        with pytest.raises(LimitExceededError):
            codec.encode(value, encoding)


def test_a_reply_carrying_the_deepest_value_is_within_the_reply_limit() -> None:
    """A search hit carries an entry's value two levels deeper than the entry did: the
    reply limit leaves room for it, so a stored value never breaks a search."""
    value = nested(limits.MAX_DEPTH - 1)
    hit = EntryHit(board="b", section="s", key="k", revision=1, score=1.0, value=value, content_type="x",
                   tags=[], metadata={}, author="a", updated_at=T0, snippet=None)
    reply = EntrySearchResponse(hits=[hit]).model_dump(mode="json")
    data = codec.encode(reply, max_depth=limits.MAX_REPLY_DEPTH)
    assert codec.decode(data, max_depth=limits.MAX_REPLY_DEPTH)["hits"][0]["value"] == value


# --------------------------------------------------------------- numbers, sizes, extensions
@pytest.mark.parametrize("n", [2**64, -(2**63) - 1, 10**30])
def test_integers_beyond_64_bits_are_refused_in_json_and_by_writers(n: int) -> None:
    with pytest.raises(LimitExceededError) as info:
        codec.decode(b'{"value": [1, %d]}' % n, "json")
    assert info.value.limit == "MAX_INT"
    for encoding in ("msgpack", "json"):
        with pytest.raises(LimitExceededError):
            codec.encode({"value": {"n": n}}, encoding)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [2**64 - 1, -(2**63), 12345678901234567890])
def test_64_bit_integers_are_taken(n: int) -> None:
    assert codec.decode(b'{"value": %d}' % n, "json") == {"value": n}
    assert codec.decode(codec.encode({"value": n})) == {"value": n}


def test_nan_and_infinities_are_carried_in_free_values() -> None:
    """Allowed where the schema says "any value" (docs/protocol.md: stored as msgpack),
    refused by every numeric field."""
    back = codec.decode(codec.encode({"value": [float("nan"), float("inf")]}))["value"]
    assert back[0] != back[0] and back[1] == float("inf")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InvalidPayloadError):
            validate_wire(MemoryRecord, {"id": "m", "board": "b", "agent": "a", "text": "t", "importance": bad,
                                         "created_at": T0.isoformat()})


@pytest.mark.parametrize("ext", [msgpack.ExtType(5, b"xy"), msgpack.Timestamp(1, 0)])
def test_msgpack_extension_types_are_refused(ext: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        codec.decode(msgpack.packb({"value": ext}))


def test_a_length_prefix_beyond_the_payload_allocates_nothing() -> None:
    # array32 of 2**32-1 elements, map32 of as many pairs, str32 and bin32 of 4 GiB, in a few bytes
    for head in (b"\xdd", b"\xdf", b"\xdb", b"\xc6"):
        with pytest.raises(InvalidPayloadError):
            codec.decode(head + b"\xff\xff\xff\xff")


def test_oversized_collections_in_large_json_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_ITEMS", 10)
    with pytest.raises(LimitExceededError) as info:
        limits.check_value({"value": list(range(11))})
    assert info.value.limit == "MAX_ITEMS"
    limits.check_value({"value": list(range(10))})


# --------------------------------------------------------------- timestamps
FAR_FUTURE = "9999-12-31T23:59:59-23:59"  # the finding: stored, then every search over it failed


@pytest.mark.parametrize(("stamp", "limit"), [
    (FAR_FUTURE, "MAX_UTC_OFFSET"),
    ("9999-12-31T23:59:59-00:01", "MAX_TIMESTAMP"),
    ("9999-12-31T20:00:00-18:00", "MAX_TIMESTAMP"),
    ("1969-12-31T23:59:59+00:00", "MIN_TIMESTAMP"),
    ("1970-01-01T00:30:00+01:00", "MIN_TIMESTAMP"),
    ("0001-01-01T00:00:00+00:00", "MIN_TIMESTAMP"),
    ("2026-01-01T00:00:00+18:01", "MAX_UTC_OFFSET"),
    ("2026-01-01T00:00:00+05:30:15", "MAX_UTC_OFFSET"),
])
def test_timestamps_beyond_the_range_or_offsets_are_refused_by_both_paths(stamp: str, limit: str) -> None:
    payload = {"v": 1, "value": 1, "author": "a", "created_at": stamp}
    assert records.fast_entry(payload) is None  # not vouched for by the fast path...
    with pytest.raises(LimitExceededError) as info:  # ...and refused by the schema, with the limit's name
        records.decode_entry_envelope(payload)
    assert info.value.limit == limit
    with pytest.raises(LimitExceededError):
        decode_entry(PARTS, 1, codec.encode(payload), None)
    memory = {"v": 1, "id": "m", "board": "b", "agent": "a", "text": "t", "created_at": stamp}
    assert records.fast_memory(memory) is None
    with pytest.raises(LimitExceededError):
        records.decode_memory(memory)


@pytest.mark.parametrize("stamp", [
    "1970-01-01T00:00:00+00:00", "1970-01-01T00:00:00-18:00", "9999-12-31T23:59:59.999999+00:00",
    "9999-12-31T23:59:59+18:00", "2026-01-01T00:00:00-18:00", "2026-01-01T00:00:00Z", "2026-06-01T12:00:00+05:45",
])
def test_timestamps_at_the_bounds_are_taken_by_both_paths(stamp: str) -> None:
    payload = {"v": 1, "value": 1, "author": "a", "created_at": stamp}
    fast = records.fast_entry(payload)
    assert fast is not None and fast == validate_wire(EntryEnvelope, payload)
    assert fast.created_at.astimezone(UTC)  # representable in UTC: no OverflowError


def test_writers_refuse_an_out_of_range_timestamp_with_the_typed_error() -> None:
    odd = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(-timedelta(hours=23, minutes=59)))
    with pytest.raises(LimitExceededError):
        encode_entry(1, author="a", created_at=odd)
    with pytest.raises(LimitExceededError):
        records.memory_wire(id="m", board="b", agent="a", text="t", created_at=odd)
    with pytest.raises(InvalidPayloadError):
        new_envelope(id="x", sender="a", kind="direct", type="t", recipients=["b"], created_at=odd)


# --------------------------------------------------------------- the SDK's readers and writers
def test_the_sdk_entry_reader_raises_the_typed_error_on_a_poison_pill() -> None:
    with pytest.raises(InvalidPayloadError):
        decode_entry(PARTS, 7, deep_json(5_000), {"Bb-Encoding": "json"})


def test_the_sdk_message_reader_raises_the_typed_error_on_a_poison_pill() -> None:
    data = (b'{"v":1,"id":"x","sender":"a","kind":"direct","recipients":["b"],"type":"t",'
            b'"created_at":"2026-01-01T00:00:00+00:00","body":' + b"[" * 5_000 + b"]" * 5_000 + b"}")
    with pytest.raises(InvalidPayloadError):
        decode_envelope(data, {"Bb-Encoding": "json"})


@pytest.mark.parametrize("levels", [limits.MAX_DEPTH, 300, 5_000])
def test_sdk_writers_refuse_deep_values_with_the_typed_error(levels: int) -> None:
    value = nested(levels)
    with pytest.raises(LimitExceededError):
        encode_entry(value, author="a")
    with pytest.raises(LimitExceededError):
        encode_entry(value, author="a", encoding="json")
    with pytest.raises(LimitExceededError):
        encode_entry(1, author="a", metadata={"m": value}, tags=("t",))
    with pytest.raises(LimitExceededError):
        codec.encode(records.memory_wire(id="m", board="b", agent="a", text="t", created_at=T0,
                                         metadata={"m": value}))
    with pytest.raises(InvalidPayloadError):  # typed, where a RecursionError or pydantic's own error escaped
        new_envelope(id="x", sender="a", kind="direct", type="t", recipients=["b"], body=value)
    with pytest.raises(LimitExceededError):
        validate_wire(Proposal, {"id": "p", "board": "b", "section": "s", "key": "k", "candidates": [value],
                                 "voters": ["a"], "proposer": "a", "created_at": T0.isoformat()})
