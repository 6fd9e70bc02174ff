"""The entry writer's fast canonical path gives the reference canonical bytes.

``records.canonical_entry`` (sorted user maps, integral floats as integers, one
NaN) must answer exactly ``canonical_bytes`` of the record a reader decodes, or
not answer; ``encode_entry_record`` publishes those bytes with msgpack and, with
JSON, signs them while publishing JSON text that decodes to the same canonical
bytes. Checked on listed odd values and on generated ones.
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum, StrEnum
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard.protocol import codec, records
from blackboard.protocol.canonical import canonical_bytes
from blackboard.protocol.entries import encode_entry, encode_entry_record, entry_record_bytes
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import EntryEnvelope, validate_wire
from tests._records_strategies import ODD_NUMBERS, aware, hostile_values, json_values, texts

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = datetime(2025, 1, 2, 3, 4, 5, 600, tzinfo=UTC)


class Colour(StrEnum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


def _reference(payload: bytes, encoding: codec.Encoding = "msgpack") -> bytes:
    """The canonical bytes a reader computes of a payload (decode, validate, canonical_bytes)."""
    return canonical_bytes(validate_wire(EntryEnvelope, codec.decode(payload, encoding)))


def _check(value: Any, metadata: dict[str, Any] | None = None, created: datetime | None = T0) -> None:
    wire = records.entry_wire(value, author="w", content_type="application/json", tags=["t"],
                              metadata=metadata, created_at=created)
    try:
        reference = _reference(codec.encode(wire))
    except InvalidPayloadError:
        with pytest.raises(InvalidPayloadError):
            encode_entry_record(value, author="w", tags=["t"], metadata=metadata, created_at=created)
        return
    fast = records.canonical_entry(wire)
    assert fast is None or fast == reference
    payload, record = encode_entry_record(value, author="w", content_type="application/json", tags=["t"],
                                          metadata=metadata, created_at=created)
    assert payload == record == reference  # msgpack: the payload is the canonical encoding
    assert _reference(payload) == payload  # ... and a reader computes the same bytes of it
    if not _holds_bytes(value) and not _holds_bytes(metadata):
        text, signed = encode_entry_record(value, author="w", content_type="application/json", tags=["t"],
                                           metadata=metadata, created_at=created, encoding="json")
        assert _reference(text, "json") == signed  # what a reader of the JSON computes is what was signed
        assert fast is None or signed == reference  # (JSON itself turns an int map key into text)
    env = validate_wire(EntryEnvelope, codec.decode(payload))
    assert entry_record_bytes(env) == reference


def _holds_bytes(value: Any) -> bool:
    if isinstance(value, bytes | bytearray | memoryview):
        return True
    if isinstance(value, dict):
        return any(_holds_bytes(k) or _holds_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_bytes(v) for v in value)
    return False


ODD_VALUES: list[Any] = [
    *ODD_NUMBERS, 0.0, 1.0, 2.0**53, 2.0**53 + 2, -(2.0**53), 1e300, 0.1, True, False, None, "", "é", b"\x00",
    struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0],  # a NaN with a sign and a payload
    {"b": 1, "aa": 2, "ab": 3, "é": 4, "z" * 32: 5, "y" * 31: 6, "x" * 256: 7},
    {"zz": {"b": 1.0, "a": [2.0, {"d": 0.5, "c": float("nan")}]}},
    [1.0, (2.0, 3), {"k": datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=2)))}],
    (1, 2), {1: "int key", "s": 2}, {b"k": 1}, {"\U0001f600": 1, "\uffff": 2, "\u00e9": 3},
    Colour.RED, Level.HIGH, {Colour.RED: 1}, {"set": {3, 1}}, {"frozen": frozenset({"a"})},
    "\ud800", {"\udfff": 1}, 2**64, -(2**63) - 1, [[[[[[[[[[1.0]]]]]]]]]],
]


@pytest.mark.parametrize("value", ODD_VALUES, ids=range(len(ODD_VALUES)))
def test_fast_canonical_entry_is_the_reference_on_odd_values(value: Any) -> None:
    _check(value)
    _check("v", metadata={"m": value} if not isinstance(value, set) else None)


def test_deep_values_take_the_reference_path_within_the_limits() -> None:
    deep: Any = 1.0
    for _ in range(100):
        deep = [deep]
    wire = records.entry_wire(deep, author="w", content_type="application/json", created_at=T0)
    assert records.canonical_entry(wire) is None  # beyond the fast path's depth
    _check(deep)
    for _ in range(200):
        deep = [deep]
    _check(deep)  # beyond MAX_DEPTH: refused by both


def test_the_sdk_clock_and_given_times_are_written_canonically() -> None:
    payload = encode_entry({"b": 1, "aa": 2.0}, author="w")
    assert _reference(payload) == payload
    odd = datetime(2025, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))  # zero microseconds, an offset
    payload = encode_entry("x", author="w", created_at=odd)
    assert b"2025-01-02T03:04:05.000000+00:00" in payload and _reference(payload) == payload


def test_the_one_nan_is_the_canonical_one() -> None:
    assert struct.pack(">d", records._NAN) == bytes.fromhex("7ff8000000000000")
    assert math.isnan(records._NAN)


@SETTINGS
@given(value=json_values, metadata=st.none() | st.dictionaries(texts, json_values, max_size=4), created=aware)
def test_fast_canonical_entry_is_the_reference_on_generated_values(value: Any, metadata: dict[str, Any] | None,
                                                                   created: datetime) -> None:
    _check(value, metadata, created)


@SETTINGS
@given(value=hostile_values, key=st.one_of(texts, st.integers(-5, 5), st.binary(max_size=2)))
def test_fast_canonical_entry_is_the_reference_on_hostile_values(value: Any, key: Any) -> None:
    _check(value)
    _check({key: value, "k": [value]})
