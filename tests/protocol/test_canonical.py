"""The canonical encoding (docs/protocol.md §13): deterministic, independent of how a record was written."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard.protocol import codec
from blackboard.protocol.canonical import MAX_DEPTH, canonical_bytes, canonical_timestamp
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import (
    Ballot,
    EntryEnvelope,
    MemoryForget,
    MemoryRecord,
    MessageEnvelope,
    Outcome,
    Proposal,
    WireModel,
    validate_wire,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def _entry(**fields: Any) -> EntryEnvelope:
    return EntryEnvelope(**{"value": None, "author": "a1", "created_at": T0, **fields})


def _shuffled(value: Any, rnd: random.Random) -> Any:
    """The same value with every map rebuilt in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


# --------------------------------------------------------------- an independent oracle
def _oracle_value(value: Any) -> Any:
    """The canonical form of a str-keyed user value, built for msgpack-python to pack.

    Written from the rules, not from the implementation: a msgpack string key
    starts with a header growing with its length, so ordering encoded keys is
    ordering by (UTF-8 length, UTF-8 bytes) for every key under 2**32 bytes.
    """
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _oracle_value(value[k]) for k in keys}
    if isinstance(value, list):
        return [_oracle_value(v) for v in value]
    if isinstance(value, float) and not isinstance(value, bool) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


#: The fields docs/protocol.md §13.2 lists as left out when null.
_EXTENSIONS = {"MemoryRecord": ("key", "occurred_at", "confidence", "provenance", "metadata_order")}


def _oracle(record: WireModel) -> bytes:
    """Canonical bytes of a record whose user values hold no NaN, packed by msgpack-python."""
    out: dict[str, Any] = {}
    for name in type(record).model_fields:
        v = getattr(record, name)
        if v is None and name in _EXTENSIONS.get(type(record).__name__, ()):
            continue  # a version-2 field, left out when null (rule 2)
        if isinstance(v, datetime):
            utc = v.astimezone(UTC)
            out[name] = utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond:06d}+00:00"
        elif isinstance(v, WireModel):
            out[name] = msgpack.unpackb(_oracle(v), raw=False)
        elif isinstance(v, list) and v and isinstance(v[0], WireModel):
            out[name] = [msgpack.unpackb(_oracle(x), raw=False) for x in v]
        else:
            out[name] = _oracle_value(v)
    return msgpack.packb(out, use_bin_type=True)  # type: ignore[no-any-return]


# --------------------------------------------------------------- determinism
def test_maps_in_different_insertion_orders_give_identical_bytes() -> None:
    a = _entry(value={"b": 1, "aa": {"y": [1, 2], "x": None}}, metadata={"k2": "v", "k1": {"z": 1, "a": 2}})
    b = _entry(value={"aa": {"x": None, "y": [1, 2]}, "b": 1}, metadata={"k1": {"a": 2, "z": 1}, "k2": "v"})
    assert a.value == b.value and list(a.value) != list(b.value)
    assert a.canonical_bytes() == b.canonical_bytes()
    assert a.canonical_bytes() == canonical_bytes(a)


def test_two_encodes_of_one_record_are_byte_identical() -> None:
    rec = MemoryRecord(id="m1", board="b", agent="a", text="hi", metadata={"x": [1, 2.5]}, created_at=T0)
    assert rec.canonical_bytes() == rec.canonical_bytes()
    copy = MemoryRecord.model_validate(rec.model_dump())
    assert copy.canonical_bytes() == rec.canonical_bytes()


def test_user_map_keys_sort_by_their_encoded_bytes() -> None:
    got = msgpack.unpackb(_entry(value={"ab": 1, "aa": 2, "b": 3, "c" * 40: 4, "": 5}).canonical_bytes())
    assert list(got["value"]) == ["", "b", "aa", "ab", "c" * 40]
    # non-string keys (msgpack only): ordered by their encodings too
    value = {"a": 0, 300: 1, -1: 2, 5: 3, b"k": 4, None: 5}
    got = msgpack.unpackb(_entry(value=value).canonical_bytes(), strict_map_key=False)
    assert list(got["value"]) == [5, "a", None, b"k", 300, -1]  # 05, a1.., c0, c4.., cd.., ff


def test_record_maps_keep_the_schema_order_and_every_field() -> None:
    got = msgpack.unpackb(MessageEnvelope(id="m", sender="s", kind="broadcast", board="b", type="t",
                                          created_at=T0).canonical_bytes())
    assert list(got) == list(MessageEnvelope.model_fields)
    assert got["topic"] is None and got["body"] is None and got["recipients"] == [] and got["metadata"] == {}


def test_an_absent_optional_field_a_null_and_the_default_are_one_record() -> None:
    base = {"v": 1, "id": "m1", "board": "b", "agent": "a", "text": "hi", "created_at": "2025-01-02T03:04:05Z"}
    full = {**base, "kind": "episodic", "tags": [], "metadata": {}, "importance": 0.5, "source": None,
            "read_only": False}
    a = validate_wire(MemoryRecord, base)
    b = validate_wire(MemoryRecord, full, strict=True)
    assert a.canonical_bytes() == b.canonical_bytes()
    c = validate_wire(MemoryRecord, {**full, "source": "notes.md"})
    assert c.canonical_bytes() != a.canonical_bytes()


def test_unknown_fields_are_not_covered() -> None:
    base = {"value": 1, "author": "a", "created_at": "2025-01-02T03:04:05+00:00"}
    assert (validate_wire(EntryEnvelope, {**base, "future": "x"}).canonical_bytes()
            == validate_wire(EntryEnvelope, base).canonical_bytes())


def test_msgpack_and_json_writers_give_the_same_canonical_bytes() -> None:
    wire = {"v": 1, "id": "b1", "proposal_id": "p", "voter": "v1", "choice": 2, "reason": "why not",
            "created_at": "2025-01-02T03:04:05.5Z"}
    records = [validate_wire(Ballot, codec.decode(codec.encode(wire, enc), enc), strict=True)
               for enc in ("msgpack", "json")]
    assert records[0].canonical_bytes() == records[1].canonical_bytes()


# --------------------------------------------------------------- timestamps
@pytest.mark.parametrize("text", [
    "2025-01-02T03:04:05+00:00", "2025-01-02T03:04:05Z", "2025-01-02T03:04:05.000Z",
    "2025-01-02T05:04:05+02:00", "2025-01-01T22:04:05.000000-05:00", "2025-01-02T03:04:05.000000999Z",
])
def test_timestamps_are_utc_with_six_fraction_digits(text: str) -> None:
    rec = validate_wire(EntryEnvelope, {"value": 1, "author": "a", "created_at": text})
    assert msgpack.unpackb(rec.canonical_bytes())["created_at"] == "2025-01-02T03:04:05.000000+00:00"


def test_a_timestamp_inside_a_user_value_is_the_codec_string() -> None:
    when = datetime(2025, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    got = msgpack.unpackb(_entry(value={"when": when}).canonical_bytes())
    assert got["value"] == {"when": when.isoformat()}
    assert got["created_at"] == "2025-01-02T03:04:05.123456+00:00"


def test_canonical_timestamp_refuses_a_naive_datetime() -> None:
    with pytest.raises(InvalidPayloadError):
        canonical_timestamp(datetime(2025, 1, 2))
    assert canonical_timestamp(T0) == "2025-01-02T03:04:05.123456+00:00"


# --------------------------------------------------------------- numbers
@pytest.mark.parametrize("n", [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1,
                               -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)])
def test_integers_take_their_smallest_msgpack_form(n: int) -> None:
    data = _entry(value=n).canonical_bytes()
    assert msgpack.packb(n) in data
    assert msgpack.unpackb(data)["value"] == n


@pytest.mark.parametrize("n", [2**64, -(2**63) - 1])
def test_integers_beyond_64_bits_have_no_canonical_encoding(n: int) -> None:
    with pytest.raises(InvalidPayloadError):
        _entry(value=n).canonical_bytes()


def test_integral_floats_are_integers_and_other_floats_are_float64() -> None:
    assert _entry(value=2.0).canonical_bytes() == _entry(value=2).canonical_bytes()
    assert _entry(value=-0.0).canonical_bytes() == _entry(value=0).canonical_bytes()
    assert _entry(value=float(2**53)).canonical_bytes() == _entry(value=2**53).canonical_bytes()
    big = msgpack.unpackb(_entry(value=float(2**53 + 2)).canonical_bytes())["value"]
    assert isinstance(big, float) and big == 2**53 + 2
    data = _entry(value=0.1).canonical_bytes()
    assert b"\xcb" + bytes.fromhex("3fb999999999999a") in data
    assert msgpack.unpackb(data)["value"] == 0.1
    # a schema float field follows the same rule
    one = MemoryRecord(id="m", board="b", agent="a", text="t", importance=1.0, created_at=T0)
    assert msgpack.unpackb(one.canonical_bytes())["importance"] == 1
    assert type(msgpack.unpackb(one.canonical_bytes())["importance"]) is int


def test_nan_has_one_encoding() -> None:
    other_nan = msgpack.unpackb(b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x01")
    assert math.isnan(other_nan)
    a, b = _entry(value=[other_nan]).canonical_bytes(), _entry(value=[float("nan")]).canonical_bytes()
    assert a == b and b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00" in a
    assert b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00" in _entry(value=math.inf).canonical_bytes()


# --------------------------------------------------------------- what has no encoding
@pytest.mark.parametrize("value", [{1, 2}, "\ud800", object(), {"k": "\udfff"}])
def test_values_without_a_canonical_encoding_are_refused(value: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        _entry(value=value).canonical_bytes()


def test_nesting_is_bounded() -> None:
    ok: Any = "x"
    for _ in range(MAX_DEPTH - 2):
        ok = [ok]
    assert msgpack.unpackb(_entry(value=ok).canonical_bytes())["value"] == ok
    too_deep: Any = "x"
    for _ in range(MAX_DEPTH + 1):
        too_deep = {"a": too_deep}
    with pytest.raises(InvalidPayloadError):
        _entry(value=too_deep).canonical_bytes()


def test_two_keys_with_one_encoding_are_refused() -> None:
    with pytest.raises(InvalidPayloadError):
        _entry(value={float("nan"): 1, float("nan"): 2}).canonical_bytes()


def test_bytes_are_bin_and_every_change_of_a_field_changes_the_bytes() -> None:
    rec = _entry(value=b"\x00\x01", content_type="application/octet-stream", tags=["x"])
    assert msgpack.unpackb(rec.canonical_bytes())["value"] == b"\x00\x01"
    variants = [rec.model_copy(update={name: value}) for name, value in [
        ("value", b"\x00\x02"), ("content_type", "image/png"), ("tags", ["y"]), ("tags", ["x", "x"]),
        ("metadata", {"a": 1}), ("author", "a2"), ("created_at", T0 + timedelta(microseconds=1))]]
    encodings = {rec.canonical_bytes(), *(v.canonical_bytes() for v in variants)}
    assert len(encodings) == len(variants) + 1


# --------------------------------------------------------------- generated records
_names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_text = st.text(max_size=20)
_leaf = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
         | st.floats(allow_nan=False) | _text)
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
                     max_leaves=12)
_finite_leaf = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | _text)
_finite_json = st.recursive(_finite_leaf, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(_text, inner, max_size=4), max_leaves=12)
_zones = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))])
_instants = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=_zones)
_stamps = st.builds(lambda dt, z: dt.isoformat().replace("+00:00", "Z") if z else dt.isoformat(),
                    _instants, st.booleans())
_ids = st.text(min_size=1, max_size=20)


def _optional(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Wire dicts with the required fields and any subset of the optional ones."""
    return st.fixed_dictionaries(required, optional=optional)


_entries = _optional({"value": _json, "author": _names, "created_at": _stamps},
                     {"v": st.just(1), "content_type": _text, "tags": st.lists(_text, max_size=3),
                      "metadata": st.dictionaries(_text, _json, max_size=4)})
_memories = _optional(
    {"id": _ids, "board": _names, "agent": _names, "text": st.text(min_size=1, max_size=20), "created_at": _stamps},
    {"v": st.just(1), "kind": st.sampled_from(["episodic", "semantic", "procedural", "knowledge", "summary"]),
     "tags": st.lists(_text, max_size=3), "metadata": st.dictionaries(_text, _json, max_size=4),
     "importance": st.floats(min_value=0, max_value=1) | st.sampled_from([0, 1]),
     "source": st.none() | _text, "read_only": st.booleans()})
_memories_v2 = _optional(
    {"v": st.just(2), "id": _ids, "board": _names, "agent": _names, "text": st.text(min_size=1, max_size=20),
     "created_at": _stamps},
    {"kind": st.sampled_from(["episodic", "semantic"]), "metadata": st.dictionaries(_text, _json, max_size=3),
     "key": st.none() | st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1, max_size=30),
     "occurred_at": st.none() | _stamps, "confidence": st.none() | st.floats(0, 1) | st.sampled_from([0, 1]),
     "provenance": st.none() | st.lists(st.fixed_dictionaries(
         {"stream": st.just("BB_MEM"), "seq": st.integers(1, 10**9)},
         optional={"key": st.none() | _text, "sig": st.none() | _text}), max_size=3)})
_forgets = _optional({"op": st.just("forget"), "board": _names, "agent": _names,
                      "ids": st.lists(_ids, min_size=1, max_size=4), "created_at": _stamps}, {"v": st.just(1)})
_message_common = {"id": _ids, "sender": _names, "type": st.text(min_size=1, max_size=10), "created_at": _stamps}
_message_optional = {"v": st.just(1), "body": _json, "correlation_id": st.none() | _text,
                     "reply_to": st.none() | _text, "metadata": st.dictionaries(_text, _json, max_size=3)}
_messages = (
    _optional({**_message_common, "kind": st.just("direct"), "recipients": st.lists(_names, min_size=1, max_size=3)},
              {**_message_optional, "board": st.none() | _names})
    | _optional({**_message_common, "kind": st.just("broadcast"), "board": _names}, _message_optional)
    | _optional({**_message_common, "kind": st.just("topic"),
                 "topic": st.lists(_names, min_size=1, max_size=3).map(".".join)},
                {**_message_optional, "board": st.none() | _names})
)
_policies = (st.fixed_dictionaries({"kind": st.sampled_from(["majority", "unanimous"])},
                                   optional={"quorum": st.just(1)})
             | st.fixed_dictionaries({"kind": st.just("threshold"),
                                      "threshold": st.floats(min_value=0.01, max_value=1)})
             | st.fixed_dictionaries({"kind": st.just("weighted")},
                                     optional={"weights": st.dictionaries(
                                         _names, st.floats(min_value=0, max_value=10) | st.integers(0, 10),
                                         max_size=3)}))
_proposals = _optional(
    {"id": _names, "board": _names, "section": _names, "key": _ids,
     # distinct once canonical (2 and 2.0 are one canonical number, see docs/protocol.md §13.1)
     "candidates": st.lists(_finite_json, min_size=1, max_size=3, unique_by=lambda c: _entry(value=c).canonical_bytes()),
     "proposer": _names, "created_at": _stamps, "deadline": _stamps},
    {"v": st.just(1), "question": _text, "policy": _policies})
_ballots = _optional({"id": _ids, "proposal_id": _names, "voter": _names,
                      "choice": st.integers(0, 5) | st.sampled_from(["reject", "abstain"]), "created_at": _stamps},
                     {"v": st.just(1), "reason": st.none() | _text})
_counted = st.fixed_dictionaries({"sequence": st.integers(1, 10**6), "ballot_id": _ids, "voter": _names,
                                  "choice": st.integers(0, 3) | st.just("reject"),
                                  "weight": st.floats(min_value=0, max_value=5)})
_rejected = st.fixed_dictionaries({"sequence": st.integers(1, 10**6), "ballot_id": _ids, "voter": _names,
                                   "reason": st.sampled_from(["late", "duplicate", "ineligible"])})
_outcomes = _optional(
    {"proposal_id": _names, "board": _names, "section": _names, "key": _ids,
     "status": st.sampled_from(["accepted", "rejected", "no_quorum"]), "candidate": st.none() | st.integers(0, 3),
     "closed_by": st.sampled_from(["decision", "deadline"]), "deciding_sequence": st.none() | st.integers(1, 10**6),
     "decided_at": _stamps,
     "counts": st.fixed_dictionaries({"ballots": st.integers(0, 9), "votes": st.lists(st.integers(0, 9), max_size=3),
                                      "reject": st.integers(0, 9), "abstain": st.integers(0, 9),
                                      "support": st.lists(st.floats(0, 9) | st.integers(0, 9), max_size=3),
                                      "reject_support": st.floats(0, 9)}),
     "counted_ballots": st.lists(_counted, max_size=3)},
    {"v": st.just(1), "value": _json, "superseded_ballots": st.lists(st.integers(1, 99), max_size=3),
     "rejected_ballots": st.lists(_rejected, max_size=2), "revision": st.none() | st.integers(1, 10**6)})

RECORDS: list[tuple[type[WireModel], st.SearchStrategy[dict[str, Any]]]] = [
    (EntryEnvelope, _entries), (MemoryRecord, _memories), (MemoryRecord, _memories_v2), (MemoryForget, _forgets), (MessageEnvelope, _messages),
    (Proposal, _proposals), (Ballot, _ballots), (Outcome, _outcomes),
]


@pytest.mark.parametrize(("model", "records"), RECORDS,
                         ids=[m.__name__ + ("-v2" if r is _memories_v2 else "") for m, r in RECORDS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_records_have_one_canonical_encoding(
        model: type[WireModel], records: st.SearchStrategy[dict[str, Any]], data: st.DataObject) -> None:
    wire = data.draw(records)
    rnd = data.draw(st.randoms(use_true_random=False))
    record = validate_wire(model, wire, strict=True)
    canonical = record.canonical_bytes()
    # written by another writer: maps in another order, msgpack or JSON, decoded again
    encoding: codec.Encoding = data.draw(st.sampled_from(["msgpack", "json"]))
    again = validate_wire(model, codec.decode(codec.encode(_shuffled(wire, rnd), encoding), encoding), strict=True)
    assert again.canonical_bytes() == canonical
    # the canonical bytes are a valid payload of the same record (a fixed point)
    decoded = validate_wire(model, codec.decode(canonical), strict=True)
    assert decoded.canonical_bytes() == canonical
    # and they are what the rules say, packed independently by msgpack-python
    assert canonical == _oracle(record)


@settings(max_examples=100, deadline=None)
@given(value=_json, rnd=st.randoms(use_true_random=False))
def test_generated_user_values_match_the_oracle(value: Any, rnd: random.Random) -> None:
    a, b = _entry(value=value), _entry(value=_shuffled(value, rnd))
    assert a.canonical_bytes() == b.canonical_bytes() == _oracle(a)
    json_copy = _entry(value=json.loads(json.dumps(value)))
    assert json_copy.canonical_bytes() == a.canonical_bytes()
