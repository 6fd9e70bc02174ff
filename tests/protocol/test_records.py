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
from datetime import UTC, datetime
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
from tests._records_strategies import (
    BAD,
    aware,
    bad_values,
    entry_payloads,
    exact,
    json_values,
    memory_payloads,
    mutated,
    names,
    subject_keys,
    texts,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
        assert exact(got) == exact(expected)
    full = _decoder(decode, obj)
    if isinstance(expected, type):
        # InvalidPayloadError or one of its kinds (LimitExceededError: a protocol limit, issue 18)
        assert isinstance(full, type) and issubclass(full, InvalidPayloadError), (
            f"decoder gave {full!r} where the schema refuses {obj!r}")
    else:
        assert exact(full) == exact(expected)
    return got


_INVALID = settings(SETTINGS, max_examples=40)


def _round_trip(obj: Any) -> Any:
    """``obj`` as the worker receives it from msgpack (tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, strict_map_key=False)


# -- memories -----------------------------------------------------------------
_MEM_FIELDS = list(MemoryRecord.model_fields)
_MEM_V2_FIELDS = ("key", "occurred_at", "confidence", "provenance", "metadata_order")


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
        assert exact(_decoder(records.decode_memory, obj)) == exact(_schema(MemoryForget, obj))
        return
    _check_fast(records.fast_memory, records.decode_memory, MemoryRecord, obj)


def test_fast_memory_decoder_defers_what_it_cannot_vouch_for() -> None:
    base = {"id": "m1", "board": "b", "agent": "a", "text": "t", "created_at": "2026-01-01T00:00:00+00:00"}
    assert records.fast_memory(base) is not None
    for odd in ({"importance": True}, {"read_only": 1}, {"tags": [b"x"]}, {"metadata": {b"k": 1}},
                {"created_at": datetime(2026, 1, 1, tzinfo=UTC)}, {"op": "x"}, {"id": "x" * 129},
                {"board": "bad name"}, {"v": 3}, {"kind": "nonsense"}, {"importance": 1.5},
                {"key": "k"}, {"v": 2, "key": "a\nb"}, {"v": 2, "key": "k\n"}, {"v": 2, "confidence": True},
                {"v": 2, "confidence": 1.5}, {"v": 2, "occurred_at": "2026-01-01T00:00:00"},
                {"v": 2, "provenance": [{"stream": "BB_MEM", "seq": 1}]}):
        assert records.fast_memory({**base, **odd}) is None, odd
    v2 = {**base, "v": 2, "key": "price:sku-1", "occurred_at": "2025-06-01T12:00:00+02:00", "confidence": 1}
    fast = records.fast_memory(v2)
    assert fast is not None and exact(fast) == exact(validate_wire(MemoryRecord, v2))


def test_version_2_fields_need_version_2() -> None:
    base = {"id": "m1", "board": "b", "agent": "a", "text": "t", "created_at": "2026-01-01T00:00:00+00:00"}
    for field, value in (("key", "k"), ("occurred_at", "2026-01-01T00:00:00Z"), ("confidence", 0.5),
                         ("provenance", [{"stream": "BB_MEM", "seq": 3}])):
        with pytest.raises(InvalidPayloadError, match="need v 2"):
            records.decode_memory({**base, field: value})
        assert getattr(records.decode_memory({**base, "v": 2, field: value}), field) is not None
    rec = records.decode_memory({**base, "v": 2, "provenance": [{"stream": "BB_MEM", "seq": 3, "key": "K"}]})
    assert isinstance(rec, MemoryRecord) and rec.provenance is not None and rec.provenance[0].seq == 3
    with pytest.raises(InvalidPayloadError):  # at most 64 sources
        records.decode_memory({**base, "v": 2, "provenance": [{"stream": "S", "seq": 1}] * 65})


@pytest.mark.parametrize("obj", [
    {"op": "forget", "board": "b", "agent": "a", "ids": ["m1"], "created_at": "2026-01-01T00:00:00+00:00"},
    {"op": "forget", "board": "b", "agent": "a", "ids": [], "created_at": "2026-01-01T00:00:00+00:00"},
    {"op": "forget", "board": "b", "agent": "a", "ids": ["m1"]},
])
def test_a_forget_decodes_through_its_schema(obj: dict[str, Any]) -> None:
    assert exact(_decoder(records.decode_memory, obj)) == exact(_schema(MemoryForget, obj))


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
    v2 = {"key": subject_keys, "occurred_at": aware, "confidence": st.floats(0.0, 1.0) | st.sampled_from([0, 1])}
    for name in draw(st.lists(st.sampled_from(sorted(v2)), unique=True)):
        kw[name] = draw(st.none() | v2[name])
    if draw(st.booleans()):  # the writer's order of the metadata's keys (a list or a tuple)
        order = draw(st.permutations(list(kw["metadata"] or {})))
        kw["metadata_order"] = tuple(order) if draw(st.booleans()) else order
    if spoil is not None:
        bad = BAD[spoil] | bad_values if draw(st.integers(0, 4)) == 4 else BAD[spoil]
        naive = aware.map(lambda dt: dt.replace(tzinfo=None))
        kw[spoil] = draw(bad | naive if spoil in ("created_at", "occurred_at") else bad)
    return kw


def _check_encoder(kw: dict[str, Any]) -> dict[str, Any] | None:
    raw = dict(kw, metadata={} if kw["metadata"] is None else kw["metadata"])  # None: no metadata
    if any(raw.get(f) is not None for f in _MEM_V2_FIELDS):
        raw["v"] = 2  # the encoder writes version 2 when a version-2 field is set
    expected = _schema(MemoryRecord, raw)
    try:
        wire = records.memory_wire(**kw)
    except InvalidPayloadError:
        assert isinstance(expected, type), f"the encoder refused what the schema accepts: {kw!r}"
        return None
    assert not isinstance(expected, type), f"the encoder wrote what the schema refuses: {kw!r}"
    # every field, in the schema's order; the version-2 fields only when set (as in the canonical encoding)
    assert list(wire) == [f for f in _MEM_FIELDS if f not in _MEM_V2_FIELDS or getattr(expected, f) is not None]
    assert wire["v"] == (2 if any(getattr(expected, f) is not None for f in _MEM_V2_FIELDS) else 1)
    back = validate_wire(MemoryRecord, codec.decode(codec.encode(wire)), strict=True)
    assert back.created_at == expected.created_at and back.occurred_at == expected.occurred_at
    times = ("created_at", "occurred_at")
    assert exact({f: getattr(back, f) for f in _MEM_FIELDS if f not in times}) == exact(
        {f: getattr(expected, f) for f in _MEM_FIELDS if f not in times})
    assert back.canonical_bytes() == expected.canonical_bytes()
    return wire


@SETTINGS
@given(memory_arguments())
def test_memory_encoder_writes_what_the_schema_reads(kw: dict[str, Any]) -> None:
    assert _check_encoder(kw) is not None


@pytest.mark.parametrize("field", [f for f in _MEM_FIELDS if f not in ("v", "provenance")])
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
    assert exact(records.fast_memory(payload)) == exact(validate_wire(MemoryRecord, payload))


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
    # the value as given, in its canonical form (maps sorted, integral floats as integers): the payload
    # is the record's canonical encoding
    given_value = validate_wire(EntryEnvelope, {**obj, "value": _round_trip(value), "metadata": metadata})
    assert given_value.canonical_bytes() == env.canonical_bytes() == data
    assert env.author == author and env.tags == tags
    assert env.created_at == created
    fast = records.fast_entry(obj)
    assert fast is not None and exact(fast) == exact(validate_wire(EntryEnvelope, obj))
    entry = decode_entry(KeyParts("b", "s", "k"), 7, data, None)
    assert exact((entry.value, entry.author, entry.tags, dict(entry.metadata), entry.created_at,
                   entry.content_type)) == exact(
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
        assert isinstance(got, type) and issubclass(got, InvalidPayloadError), got
    else:
        assert exact((got.value, got.author, got.created_at)) == exact(
            (expected.value, expected.author, expected.created_at))


# -- the entry encoder ----------------------------------------------------------
@st.composite
def entry_arguments(draw: st.DrawFn, spoil: str | None = None) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "value": draw(json_values), "author": draw(texts), "content_type": draw(texts),
        "tags": draw(st.lists(texts, max_size=4) | st.tuples(texts)),
        "metadata": draw(st.none() | st.dictionaries(texts, json_values, max_size=4)),
        "created_at": draw(st.none() | aware),
    }
    if spoil is not None:
        bad = BAD[spoil] | bad_values if draw(st.integers(0, 4)) == 4 else BAD[spoil]
        kw[spoil] = draw(bad if spoil != "created_at" else bad | aware.map(lambda dt: dt.replace(tzinfo=None)))
    return kw


def _check_entry_encoder(kw: dict[str, Any]) -> dict[str, Any] | None:
    raw = dict(kw, metadata={} if kw["metadata"] is None else kw["metadata"],
               created_at=datetime.now(UTC) if kw["created_at"] is None else kw["created_at"])
    expected = _schema(EntryEnvelope, raw)
    try:
        wire = records.entry_wire(**kw)
    except InvalidPayloadError:
        assert isinstance(expected, type), f"the encoder refused what the schema accepts: {kw!r}"
        return None
    assert not isinstance(expected, type), f"the encoder wrote what the schema refuses: {kw!r}"
    assert list(wire) == _ENTRY_FIELDS
    back = validate_wire(EntryEnvelope, codec.decode(codec.encode(wire)), strict=True)
    if kw["created_at"] is not None:
        assert back.created_at == expected.created_at
    fields = [f for f in _ENTRY_FIELDS if f != "created_at"]
    assert exact({f: getattr(back, f) for f in fields}) == exact(
        {f: _round_trip(getattr(expected, f)) for f in fields})
    return wire


@SETTINGS
@given(entry_arguments())
def test_entry_encoder_writes_what_the_schema_reads(kw: dict[str, Any]) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the schema path was taken")

    with pytest.MonkeyPatch.context() as m:  # typed arguments take the fast path
        m.setattr(records, "validate_wire", refuse)
        records.entry_wire(**kw)
    assert _check_entry_encoder(kw) is not None


@pytest.mark.parametrize("field", ["author", "content_type", "tags", "metadata", "created_at"])
@_INVALID
@given(data=st.data())
def test_entry_encoder_refuses_what_the_schema_refuses(field: str, data: st.DataObject) -> None:
    _check_entry_encoder(data.draw(entry_arguments(field)))


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


# -- consensus records: the schema alone, types not coerced -------------------------
def test_consensus_records_decode_without_coercion_and_with_unknown_fields() -> None:
    from blackboard.consensus.log import decode_ballot

    ballot = {"id": "b1", "proposal_id": "p1", "voter": "v1", "choice": 2, "created_at": "2026-01-01T00:00:00+00:00"}
    assert decode_ballot(codec.encode({**ballot, "later_field": [1]})).choice == 2
    for coerced in ({"choice": "2"}, {"choice": True}, {"choice": 2.0}, {"voter": b"v1"}):
        with pytest.raises(InvalidPayloadError):
            decode_ballot(codec.encode({**ballot, **coerced}))
        with pytest.raises(InvalidPayloadError):
            validate_wire(type(decode_ballot(codec.encode(ballot))), {**ballot, **coerced}, coerce=False)
