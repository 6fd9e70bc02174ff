"""The fast paths of blackboard.protocol.records agree with their schemas.

For every fast decoder: on generated valid payloads it returns what the schema
returns (same values, same types) or nothing, and on generated invalid
payloads (wrong types, out of range, missing fields, oversize, unknown fields)
it never returns a record the schema refuses; the decoder built on it raises
``InvalidPayloadError`` exactly when the schema does. The fast encoder of
memories lays out what the schema makes of its arguments and refuses what the
schema refuses. The shapes our writers produce take the fast paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from blackboard.protocol import codec, records
from blackboard.protocol.entries import decode_entry, encode_entry
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import (
    EntryEnvelope,
    MemoryForget,
    MemoryKind,
    MemoryRecord,
    validate_wire,
)
from blackboard.protocol.subjects import KeyParts

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_MISSING = object()


# -- comparing records exactly (types included: 1 == 1.0 == True for ==) --------
def _exact(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return (type(value).__name__, tuple((k, _exact(v)) for k, v in sorted(value.__dict__.items())),
                frozenset(value.model_fields_set))
    if isinstance(value, datetime):
        return ("datetime", value.isoformat(), value.utcoffset())
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, dict):
        return ("dict", tuple((_exact(k), _exact(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_exact(v) for v in value))
    return (type(value).__name__, value)


def _schema(model: type[BaseModel], obj: Any) -> Any:
    """What the schema makes of ``obj``: the record, or the error class."""
    try:
        return validate_wire(model, obj)  # type: ignore[type-var]
    except InvalidPayloadError as exc:
        return type(exc)


def _decoder(decode: Callable[[Any], Any], obj: Any) -> Any:
    try:
        return decode(obj)
    except Exception as exc:  # the class is what is compared
        return type(exc)


def _check_fast(fast: Callable[[Any], Any], decode: Callable[[Any], Any], model: type[BaseModel], obj: Any) -> Any:
    """The agreement property, on ``obj`` as given and as a msgpack round trip would give it."""
    expected = _schema(model, obj)
    got = fast(obj)
    if got is not None:
        assert not isinstance(expected, type), f"fast path accepted what the schema refuses: {obj!r}"
        assert _exact(got) == _exact(expected)
    full = _decoder(decode, obj)
    if isinstance(expected, type):
        assert full is InvalidPayloadError, f"decoder gave {full!r} where the schema refuses {obj!r}"
    else:
        assert _exact(full) == _exact(expected)
    return got


# -- generated values ---------------------------------------------------------
names = st.from_regex(r"\A[A-Za-z0-9_-]{1,24}\Z")
texts = st.text(max_size=40)
json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | texts | st.binary(max_size=8)
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=8)
offsets = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))])
aware = st.builds(lambda dt, tz: dt.replace(tzinfo=tz),
                  st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)), offsets)
timestamps = aware.map(lambda dt: dt.isoformat()) | aware.map(
    lambda dt: dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
#: Values of the wrong type, out of range or oversize for some field.
bad_values = st.sampled_from([
    None, b"bytes", 0, 1, 2, -1, 1.5, -0.1, 1.0000001, float("nan"), float("inf"), True, False, "", " ", "x" * 129,
    "x" * 1000, "not a time", "2026-01-01T00:00:00", "2026-01-01T00:00:00+00:00", "bad name!", "a.b", [], {},
    ["a", 1], ["ok", b"b"], {1: "int key"}, {b"k": "bytes key"}, {"k": "v"}, ("t",), "episodic", "nonsense",
])


@st.composite
def memory_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A valid memory record as a writer may send it: defaults absent or present, unknown fields."""
    obj: dict[str, Any] = {
        "id": draw(st.text(min_size=1, max_size=128)), "board": draw(names), "agent": draw(names),
        "text": draw(st.text(min_size=1, max_size=60)), "created_at": draw(timestamps),
    }
    optional = {
        "v": st.just(1),
        "kind": st.sampled_from(get_args(MemoryKind)),
        "tags": st.lists(texts, max_size=4),
        "metadata": st.dictionaries(texts, json_values, max_size=4),
        "importance": st.floats(0.0, 1.0) | st.sampled_from([0, 1]),
        "source": st.none() | texts,
        "read_only": st.booleans(),
        "unknown": json_values,
        "later_field": json_values,
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        obj[key] = draw(optional[key])
    return obj


@st.composite
def entry_payloads(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {"value": draw(json_values), "author": draw(texts), "created_at": draw(timestamps)}
    optional = {
        "v": st.just(1),
        "content_type": st.sampled_from(["application/json", "text/plain", "image/png", ""]),
        "tags": st.lists(texts, max_size=4),
        "metadata": st.dictionaries(texts, json_values, max_size=4),
        "unknown": json_values,
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        obj[key] = draw(optional[key])
    return obj


def _lengths(*sizes: int) -> st.SearchStrategy[str]:
    return st.sampled_from(sizes).map(lambda n: "x" * n)


_wrong_types = st.sampled_from([None, b"bytes", 1, 1.5, True, [], {}, ("t",)])
#: For each field, values of a wrong type, out of range, oversize or otherwise odd.
_BAD: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([0, 2, "1", True, 1.0, None]),
    "id": _lengths(0, 127, 128, 129, 1000) | _wrong_types,
    "board": names.map(lambda n: n + "!") | _lengths(128, 129) | st.just("") | _wrong_types,
    "agent": names.map(lambda n: "." + n) | _lengths(128, 129) | _wrong_types,
    "kind": texts | st.sampled_from([b"episodic", "Episodic", 1]),
    "text": st.sampled_from(["", " "]) | _wrong_types,
    "tags": st.lists(st.one_of(texts, st.binary(max_size=3), st.integers()), max_size=3) | texts | _wrong_types,
    "metadata": st.dictionaries(st.one_of(texts, st.integers(), st.binary(max_size=3)), json_values, max_size=3)
    | st.lists(texts, max_size=2) | _wrong_types,
    "importance": st.floats() | st.sampled_from([-1e-12, 1 + 1e-12, 2, -1, "0.5", True, False]) | _wrong_types,
    "source": st.integers() | st.binary(max_size=3) | _wrong_types,
    "read_only": st.sampled_from([0, 1, 2, "true", "false", "maybe", None, 1.0, b"1"]),
    "created_at": st.one_of(
        aware.map(lambda dt: dt.replace(tzinfo=None).isoformat()), aware, texts,
        st.sampled_from(["2026-01-01T00:00:00", "2026-13-01T00:00:00+00:00", "2026-01-01", "1700000000", 1700000000])),
    "value": json_values,
    "content_type": _wrong_types,
    "author": _wrong_types,
    "op": st.sampled_from(["forget", "x", None, 1]),
}


@st.composite
def mutated(draw: st.DrawFn, payloads: st.SearchStrategy[dict[str, Any]], field: str,
            fields: list[str]) -> dict[str, Any]:
    """A payload with ``field`` removed or given a bad value, and maybe one more field spoilt."""
    obj = dict(draw(payloads))
    spoilt = [field]
    if draw(st.integers(0, 3)) == 3:
        spoilt.append(draw(st.sampled_from([*fields, "op"])))
    for f in spoilt:
        if draw(st.sampled_from(["bad", "bad", "any", "delete"])) == "delete":
            obj.pop(f, None)
        else:
            obj[f] = draw(_BAD[f] | bad_values if draw(st.integers(0, 4)) == 4 else _BAD[f])
    return obj


_INVALID = settings(SETTINGS, max_examples=40)


def _round_trip(obj: Any) -> Any:
    """``obj`` as the worker receives it from msgpack (tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, strict_map_key=False)


# -- memories -----------------------------------------------------------------
_MEM_FIELDS = list(MemoryRecord.model_fields)


@SETTINGS
@given(memory_payloads())
def test_fast_memory_decoder_agrees_with_the_schema_on_valid_records(obj: dict[str, Any]) -> None:
    got = _check_fast(records.fast_memory, records.decode_memory, MemoryRecord, obj)
    assert got is not None  # every valid shape generated here is one the fast path vouches for
    _check_fast(records.fast_memory, records.decode_memory, MemoryRecord, _round_trip(obj))


@pytest.mark.parametrize("field", [*_MEM_FIELDS, "op"])
@_INVALID
@given(data=st.data())
def test_fast_memory_decoder_agrees_with_the_schema_on_invalid_records(field: str, data: st.DataObject) -> None:
    obj = data.draw(mutated(memory_payloads(), field, _MEM_FIELDS))
    if obj.get("op") == "forget":  # a forget, not a record: decode_memory reads it as one
        assert records.fast_memory(obj) is None
        assert _exact(_decoder(records.decode_memory, obj)) == _exact(_schema(MemoryForget, obj))
        return
    _check_fast(records.fast_memory, records.decode_memory, MemoryRecord, obj)


def test_fast_memory_decoder_defers_what_it_cannot_vouch_for() -> None:
    base = {"id": "m1", "board": "b", "agent": "a", "text": "t", "created_at": "2026-01-01T00:00:00+00:00"}
    assert records.fast_memory(base) is not None
    for odd in ({"importance": True}, {"read_only": 1}, {"tags": [b"x"]}, {"metadata": {b"k": 1}},
                {"created_at": datetime(2026, 1, 1, tzinfo=UTC)}, {"op": "x"}, {"id": "x" * 129},
                {"board": "bad name"}, {"v": 2}, {"kind": "nonsense"}, {"importance": 1.5}):
        assert records.fast_memory({**base, **odd}) is None, odd


@pytest.mark.parametrize("obj", [
    {"op": "forget", "board": "b", "agent": "a", "ids": ["m1"], "created_at": "2026-01-01T00:00:00+00:00"},
    {"op": "forget", "board": "b", "agent": "a", "ids": [], "created_at": "2026-01-01T00:00:00+00:00"},
    {"op": "forget", "board": "b", "agent": "a", "ids": ["m1"]},
])
def test_a_forget_decodes_through_its_schema(obj: dict[str, Any]) -> None:
    assert _exact(_decoder(records.decode_memory, obj)) == _exact(_schema(MemoryForget, obj))


# -- the memory encoder ---------------------------------------------------------
@st.composite
def memory_arguments(draw: st.DrawFn, spoil: str | None = None) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "id": draw(st.text(min_size=1, max_size=128)), "board": draw(names), "agent": draw(names),
        "text": draw(st.text(min_size=1, max_size=60)), "created_at": draw(aware),
        "kind": draw(st.sampled_from(get_args(MemoryKind))),
        "tags": draw(st.lists(texts, max_size=4) | st.tuples(texts)),
        "metadata": draw(st.none() | st.dictionaries(texts, json_values, max_size=4)),
        "importance": draw(st.floats(0.0, 1.0) | st.sampled_from([0, 1])),
        "source": draw(st.none() | texts), "read_only": draw(st.booleans()),
    }
    if spoil is not None:
        bad = _BAD[spoil] | bad_values if draw(st.integers(0, 4)) == 4 else _BAD[spoil]
        kw[spoil] = draw(bad if spoil != "created_at" else bad | aware.map(lambda dt: dt.replace(tzinfo=None)))
    return kw


def _check_encoder(kw: dict[str, Any]) -> dict[str, Any] | None:
    raw = dict(kw, metadata={} if kw["metadata"] is None else kw["metadata"])  # None: no metadata
    expected = _schema(MemoryRecord, raw)
    try:
        wire = records.memory_wire(**kw)
    except InvalidPayloadError:
        assert isinstance(expected, type), f"the encoder refused what the schema accepts: {kw!r}"
        return None
    assert not isinstance(expected, type), f"the encoder wrote what the schema refuses: {kw!r}"
    assert list(wire) == _MEM_FIELDS  # every field, in the schema's order
    back = validate_wire(MemoryRecord, codec.decode(codec.encode(wire)), strict=True)
    assert back.created_at == expected.created_at
    assert _exact({f: getattr(back, f) for f in _MEM_FIELDS if f != "created_at"}) == _exact(
        {f: getattr(expected, f) for f in _MEM_FIELDS if f != "created_at"})
    return wire


@SETTINGS
@given(memory_arguments())
def test_memory_encoder_writes_what_the_schema_reads(kw: dict[str, Any]) -> None:
    assert _check_encoder(kw) is not None


@pytest.mark.parametrize("field", [f for f in _MEM_FIELDS if f != "v"])
@_INVALID
@given(data=st.data())
def test_memory_encoder_refuses_what_the_schema_refuses(field: str, data: st.DataObject) -> None:
    _check_encoder(data.draw(memory_arguments(field)))


@SETTINGS
@given(memory_arguments())
def test_typed_memories_take_the_encoders_fast_path_and_its_output_the_decoders(
        kw: dict[str, Any]) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the schema path was taken")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(records, "validate_wire", refuse)
        wire = records.memory_wire(**kw)
        payload = codec.decode(codec.encode(wire))
        # what the SDK writes is what the worker's fast path reads
        assert records.fast_memory(msgpack.unpackb(codec.encode(wire), raw=False, strict_map_key=True)) is not None
    assert _exact(records.fast_memory(payload)) == _exact(validate_wire(MemoryRecord, payload))


# -- entries ------------------------------------------------------------------
_ENTRY_FIELDS = list(EntryEnvelope.model_fields)


@SETTINGS
@given(entry_payloads())
def test_fast_entry_decoder_agrees_with_the_schema_on_valid_envelopes(obj: dict[str, Any]) -> None:
    assert _check_fast(records.fast_entry, records.decode_entry_envelope, EntryEnvelope, obj) is not None
    _check_fast(records.fast_entry, records.decode_entry_envelope, EntryEnvelope, _round_trip(obj))


@pytest.mark.parametrize("field", _ENTRY_FIELDS)
@_INVALID
@given(data=st.data())
def test_fast_entry_decoder_agrees_with_the_schema_on_invalid_envelopes(field: str, data: st.DataObject) -> None:
    obj = data.draw(mutated(entry_payloads(), field, _ENTRY_FIELDS))
    _check_fast(records.fast_entry, records.decode_entry_envelope, EntryEnvelope, obj)


@SETTINGS
@given(value=json_values, author=texts, tags=st.lists(texts, max_size=3),
       metadata=st.dictionaries(texts, json_values, max_size=3), created=aware,
       content_type=st.none() | st.sampled_from(["text/plain", "application/json"]))
def test_encoded_entries_are_what_the_schema_and_the_sdk_decoder_read(
        value: Any, author: str, tags: list[str], metadata: dict[str, Any], created: datetime,
        content_type: str | None) -> None:
    data = encode_entry(value, author=author, tags=tags, metadata=metadata, created_at=created,
                        content_type=content_type)
    obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    env = validate_wire(EntryEnvelope, obj, strict=True)
    assert list(obj) == _ENTRY_FIELDS
    assert _exact(env.value) == _exact(_round_trip(value)) and env.author == author and env.tags == tags
    assert env.created_at == created
    fast = records.fast_entry(obj)
    assert fast is not None and _exact(fast) == _exact(validate_wire(EntryEnvelope, obj))
    entry = decode_entry(KeyParts("b", "s", "k"), 7, data, None)
    assert _exact((entry.value, entry.author, entry.tags, dict(entry.metadata), entry.created_at,
                   entry.content_type)) == _exact(
        (env.value, env.author, tuple(env.tags), env.metadata, env.created_at, env.content_type))


@pytest.mark.parametrize("field", _ENTRY_FIELDS)
@settings(_INVALID, max_examples=20)
@given(data=st.data())
def test_the_sdk_entry_decoder_refuses_what_the_schema_refuses(field: str, data: st.DataObject) -> None:
    obj = data.draw(mutated(entry_payloads(), field, _ENTRY_FIELDS))
    try:
        data = codec.encode(obj)
    except InvalidPayloadError:
        return
    expected = _schema(EntryEnvelope, codec.decode(data))
    got = _decoder(lambda d: decode_entry(KeyParts("b", "s", "k"), 7, d, None), data)
    if isinstance(expected, type):
        assert got is InvalidPayloadError
    else:
        assert _exact((got.value, got.author, got.created_at)) == _exact(
            (expected.value, expected.author, expected.created_at))


# -- limits come from the schemas --------------------------------------------------
def test_fast_path_limits_are_the_schemas() -> None:
    id_field = MemoryRecord.model_fields["id"]
    assert (records._MEM_ID_MIN, records._MEM_ID_MAX) == tuple(
        getattr(m, a) for a in ("min_length", "max_length") for m in id_field.metadata if hasattr(m, a))
    assert (records._MEM_IMPORTANCE_MIN, records._MEM_IMPORTANCE_MAX) == (0.0, 1.0)
    assert records._MEM_KINDS == {"episodic", "semantic", "procedural", "knowledge", "summary"}
    with pytest.raises(LookupError):
        records._constraint(MemoryRecord, "board", "max_length")
    assert math.isclose(records._MEM_IMPORTANCE, MemoryRecord.model_fields["importance"].default)
