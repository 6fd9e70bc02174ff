"""Hypothesis strategies of wire records, valid and spoilt, and an exact comparison of decoded values.

Shared by the tests of the records' fast paths (tests/protocol/test_records.py),
of the worker's two decoding paths (tests/worker/test_decode_paths.py) and the
fuzz suite (tests/fuzz/), which adds hostile values: deep nesting, odd numbers,
odd text, timestamps out of range (:data:`hostile_values` and the helpers below it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

from hypothesis import strategies as st
from pydantic import BaseModel

from blackboard.protocol.schemas import MemoryKind

__all__ = [
    "BAD",
    "BAD_TIMESTAMPS",
    "ODD_NUMBERS",
    "ODD_TEXTS",
    "aware",
    "bad_values",
    "deep_value",
    "deep_wire",
    "entry_payloads",
    "exact",
    "hostile_values",
    "json_values",
    "memory_payloads",
    "mutated",
    "names",
    "subject_keys",
    "texts",
    "timestamps",
]


# -- comparing records exactly (types included: 1 == 1.0 == True for ==) --------
def exact(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return (type(value).__name__, tuple((k, exact(v)) for k, v in sorted(value.__dict__.items())),
                frozenset(value.model_fields_set))
    if isinstance(value, datetime):
        return ("datetime", value.isoformat(), value.utcoffset())
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, dict):
        return ("dict", tuple((exact(k), exact(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(exact(v) for v in value))
    return (type(value).__name__, value)


# -- generated values ---------------------------------------------------------
names = st.from_regex(r"\A[A-Za-z0-9_-]{1,24}\Z")
texts = st.text(max_size=40)
json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | texts | st.binary(max_size=8)
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=8)
#: Subject keys (``MemoryRecord.key``): 1-256 characters, no control characters.
subject_keys = st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1, max_size=256)
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
    if draw(st.integers(0, 2)) == 2:  # version 2: a subject key, an event time, a confidence (or none)
        obj["v"] = 2
        v2 = {"key": subject_keys, "occurred_at": timestamps, "confidence": st.floats(0.0, 1.0) | st.sampled_from([0, 1])}
        for key in draw(st.lists(st.sampled_from(sorted(v2)), unique=True)):
            obj[key] = draw(st.none() | v2[key]) if draw(st.booleans()) else draw(v2[key])
        if draw(st.booleans()):  # the writer's order of the metadata's keys
            obj["metadata_order"] = draw(st.permutations(list(obj.get("metadata", {}))))
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


def lengths(*sizes: int) -> st.SearchStrategy[str]:
    return st.sampled_from(sizes).map(lambda n: "x" * n)


wrong_types = st.sampled_from([None, b"bytes", 1, 1.5, True, [], {}, ("t",)])
#: For each field, values of a wrong type, out of range, oversize or otherwise odd.
BAD: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([0, 2, "1", True, 1.0, None]),
    "id": lengths(0, 127, 128, 129, 1000) | wrong_types,
    "board": names.map(lambda n: n + "!") | lengths(128, 129) | st.just("") | wrong_types,
    "agent": names.map(lambda n: "." + n) | lengths(128, 129) | wrong_types,
    "kind": texts | st.sampled_from([b"episodic", "Episodic", 1]),
    "text": st.sampled_from(["", " "]) | wrong_types,
    "tags": st.lists(st.one_of(texts, st.binary(max_size=3), st.integers()), max_size=3) | texts | wrong_types,
    "metadata": st.dictionaries(st.one_of(texts, st.integers(), st.binary(max_size=3)), json_values, max_size=3)
    | st.lists(texts, max_size=2) | wrong_types,
    "importance": st.floats() | st.sampled_from([-1e-12, 1 + 1e-12, 2, -1, "0.5", True, False]) | wrong_types,
    "source": st.integers() | st.binary(max_size=3) | wrong_types,
    "read_only": st.sampled_from([0, 1, 2, "true", "false", "maybe", None, 1.0, b"1"]),
    "created_at": st.one_of(
        aware.map(lambda dt: dt.replace(tzinfo=None).isoformat()), aware, texts,
        st.sampled_from(["2026-01-01T00:00:00", "2026-13-01T00:00:00+00:00", "2026-01-01", "1700000000", 1700000000])),
    "value": json_values,
    "content_type": wrong_types,
    "author": wrong_types,
    "op": st.sampled_from(["forget", "x", None, 1]),
    "key": st.sampled_from(["", "x" * 257, "a\nb", "a\x00", "\x7f", "a\x85", "k\n", 1, b"k", ["k"]]) | wrong_types,
    "occurred_at": st.sampled_from(["2026-01-01T00:00:00", "2026-13-01T00:00:00+00:00", "x", 1700000000, b"t"]),
    "confidence": st.floats() | st.sampled_from([-1e-12, 1 + 1e-12, 2, -1, "0.5", True, False]) | wrong_types,
    "metadata_order": st.sampled_from([["not-a-key"], ["a", "a"], [1], "a", {}, [None], ["x"] * 257]) | wrong_types,
    "provenance": st.sampled_from([[{"stream": "BB_MEM"}], [{"stream": "", "seq": 1}], [{"stream": "S", "seq": 0}],
                                   [{"stream": "S", "seq": 1}] * 65, "x", [1], {}]) | wrong_types,
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
            obj[f] = draw(BAD[f] | bad_values if draw(st.integers(0, 4)) == 4 else BAD[f])
    return obj




# -- hostile values (the fuzz suite) -------------------------------------------
#: Numbers a reader or PostgreSQL may choke on: NaN, infinities, beyond 64 bits, subnormal.
ODD_NUMBERS: list[Any] = [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308,
                          2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**40)]
#: Timestamps out of range, with odd offsets, or not timestamps at all.
BAD_TIMESTAMPS: list[Any] = [
    "9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59.999999+00:00", "0001-01-01T00:00:00+23:59",
    "0001-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:00:00+24:00",
    "2026-01-01T00:00:00+99:99", "2026-01-01T00:00:00-00:01", "+10000-01-01T00:00:00Z", "-0001-01-01T00:00:00Z",
    "2026-01-01T00:00:00.9999999999Z", "1970-01-01T00:00:00Z", "NaN", "", "now", 0, -1, 2**63, 1e20, -1e20,
    float("nan"), float("inf"), [], {}, True,
]
#: Text a database or a terminal may choke on: NUL, lone surrogates, controls, bidi, long words.
ODD_TEXTS: list[str] = [
    "\x00", "a\x00b", "\ud800", "x\udfff", "\u202eevil", "\r\n\t\x1b[2J", "\ufeff", "\U0001f600" * 50, "é" * 300,
    "x" * 10_000, " ", "null", "-- DROP TABLE bb_entries; --", "%s %(x)s {0}", "$KV.a.b.c", "bb.mem.>", "*", ">",
]


def deep_value(depth: int, kind: str = "list") -> Any:
    """A Python value nested ``depth`` levels (built without recursion)."""
    value: Any = 1
    for i in range(depth):
        value = [value] if kind == "list" else {f"k{i % 7}": value}
    return value


def deep_wire(depth: int, encoding: str, kind: str = "list") -> bytes:
    """The encoded bytes of a value nested ``depth`` levels, written directly (encoders
    refuse to build what a hostile writer can send)."""
    if encoding == "json":
        if kind == "list":
            return b"[" * depth + b"1" + b"]" * depth
        return b'{"k":' * depth + b"1" + b"}" * depth
    if kind == "list":
        return b"\x91" * depth + b"\x01"  # fixarray of one element
    return b"\x81\xa1k" * depth + b"\x01"  # fixmap of one entry


#: One hostile value of any kind (small enough to draw often, and shallow enough for hypothesis to
#: print; deeper values and huge sizes come from the callers).
hostile_values = st.one_of(
    bad_values, st.sampled_from(ODD_NUMBERS), st.sampled_from(BAD_TIMESTAMPS), st.sampled_from(ODD_TEXTS),
    st.binary(max_size=16), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.sampled_from([30, 150]).map(deep_value), json_values,
)
