"""Comparison filters (``where``): parsing, its bounds and messages, and the evaluator's semantics."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.filters import (
    EMPTY_WHERE,
    MAX_IN,
    MAX_PATH_CHARS,
    MAX_PATH_DEPTH,
    MAX_PATHS,
    Condition,
    PathFilter,
    Where,
    matches,
    parse_where,
)
from blackboard.protocol.schemas import validate_wire
from blackboard.protocol.schemas.search import (
    EntrySearchRequest,
    MemorySearchRequest,
    SearchFilters,
)

META: dict[str, Any] = {
    "confidence": 0.9, "score": 3, "name": "beta", "flag": True, "none": None, "tags": ["a", "b"],
    "nested": {"deep": {"x": 1}}, "list": [10, {"k": "v"}, None], "big": 2**60, "huge": 1e300,
}


def test_parse_gives_the_parsed_form() -> None:
    w = parse_where({"metadata.score": {"$gte": 0.5, "$lt": 0.9}, "value.status": "open"})
    assert w == Where((
        PathFilter("metadata.score", "metadata", ("score",), (Condition("$gte", 0.5), Condition("$lt", 0.9))),
        PathFilter("value.status", "value", ("status",), (Condition("$eq", "open"),)),
    ))
    assert w.reads_value and not parse_where({"metadata.a": 1}).reads_value
    assert parse_where(None) is EMPTY_WHERE and parse_where({}) is EMPTY_WHERE and not EMPTY_WHERE
    assert parse_where(w) is w


def test_to_json_round_trips() -> None:
    w = parse_where({"metadata.a": {"$in": (1, "x")}, "metadata.b": {"c": 1}, "value": {"$eq": {"$gt": 1}},
                     "metadata.d": {"$exists": False, "$ne": None}})
    assert w.to_json() == {"metadata.a": {"$in": [1, "x"]}, "metadata.b": {"$eq": {"c": 1}},
                           "value": {"$eq": {"$gt": 1}}, "metadata.d": {"$exists": False, "$ne": None}}
    assert parse_where(w.to_json()) == w


@pytest.mark.parametrize(("where", "message"), [
    ({"metadata.a": {"$foo": 1}}, "unknown operator '$foo' on 'metadata.a'"),
    ({"metadata.a": {"$gt": True}}, "$gt on 'metadata.a' takes a number or a string, not a boolean"),
    ({"metadata.a": {"$lte": [1]}}, "$lte on 'metadata.a' takes a number or a string, not a list"),
    ({"metadata.a": {"$lt": None}}, "$lt on 'metadata.a' takes a number or a string, not null"),
    ({"metadata.a": {"$in": 3}}, "$in on 'metadata.a' takes a list, not int"),
    ({"metadata.a": {"$in": "ab"}}, "$in on 'metadata.a' takes a list, not str"),
    ({"metadata.a": {"$nin": [[1]]}}, "$nin on 'metadata.a' takes JSON scalars, not a list"),
    ({"metadata.a": {"$in": list(range(MAX_IN + 1))}}, f"at most {MAX_IN}"),
    ({"metadata.a": {"$exists": 1}}, "$exists on 'metadata.a' takes true or false, not int"),
    ({"metadata.a": {"$eq": float("nan")}}, "takes finite numbers"),
    ({"metadata.a": {"$gt": float("inf")}}, "takes finite numbers"),
    ({"metadata.a": {"$eq": b"x"}}, "takes JSON values, not bytes"),
    ({"metadata.a": {"$eq": "a\x00b"}}, "without NUL"),
    ({"metadata.a": {"$eq": {1: 2}}}, "a key that is not text"),
    ({"metadata.a": {"$gt": 1, "b": 2}}, "mixes operators and fields"),
    ({"meta.a": 1}, "path 'meta.a' must start with 'metadata.' or 'value.'"),
    ({"": 1}, "must start with 'metadata.' or 'value.'"),
    ({"metadata..a": 1}, "path 'metadata..a' has an empty segment"),
    ({"metadata.a.": 1}, "has an empty segment"),
    ({"metadata." + ".".join("k" * (MAX_PATH_DEPTH + 1)): 1}, f"more than {MAX_PATH_DEPTH} levels deep"),
    ({"metadata." + "k" * MAX_PATH_CHARS: 1}, f"longer than {MAX_PATH_CHARS} characters"),
    ({"metadata.a\x00": 1}, "holds NUL"),
    ({f"metadata.k{i}": 1 for i in range(MAX_PATHS + 1)}, f"at most {MAX_PATHS}"),
    ({1: 1}, "a path must be a string, not int"),
    ([("metadata.a", 1)], "where must be an object"),
])
def test_bad_input_is_refused_naming_the_problem(where: Any, message: str) -> None:
    with pytest.raises(InvalidPayloadError) as info:
        parse_where(where)
    assert message in str(info.value)


def test_bounds_are_inclusive() -> None:
    deepest = "metadata." + ".".join("k" * MAX_PATH_DEPTH)
    assert parse_where({deepest: 1}).paths[0].keys == ("k",) * MAX_PATH_DEPTH
    assert len(parse_where({f"metadata.k{i}": 1 for i in range(MAX_PATHS)}).paths) == MAX_PATHS
    parse_where({"metadata.a": {"$nin": list(range(MAX_IN))}})
    parse_where({"metadata." + "k" * (MAX_PATH_CHARS - len("metadata.")): 1})


def test_the_wire_refuses_bad_where_and_value_paths_on_memories() -> None:
    with pytest.raises(InvalidPayloadError, match=r"where: unknown operator '\$regex' on 'value.a'"):
        validate_wire(EntrySearchRequest, {"query": "x", "where": {"value.a": {"$regex": "x"}}})
    with pytest.raises(InvalidPayloadError, match="memories have no value"):
        validate_wire(MemorySearchRequest, {"query": "x", "where": {"value.a": 1}})
    with pytest.raises(ValueError, match="memories have no value"):
        MemorySearchRequest.of("x", SearchFilters(where={"value.a": 1}))
    with pytest.raises(ValidationError):
        SearchFilters(where={"metadata.a": {"$in": 1}})
    req = validate_wire(EntrySearchRequest, {"query": "x", "where": {"value.a": {"$in": [1, 2]}}}, strict=True)
    assert req.filters.where is req.where and req.where.paths[0].conditions == (Condition("$in", (1, 2)),)
    assert req.model_dump()["where"] == {"value.a": {"$in": [1, 2]}}
    assert "where" not in EntrySearchRequest(query="x").model_dump()  # the wire as before where existed


@pytest.mark.parametrize(("where", "expected"), [
    ({"metadata.confidence": {"$gt": 0.8}}, True),
    ({"metadata.confidence": {"$gt": 0.9}}, False),
    ({"metadata.confidence": {"$gte": 0.9, "$lt": 1}}, True),
    ({"metadata.score": 3.0}, True),  # 1 == 1.0
    ({"metadata.score": {"$in": [1, 3.0]}}, True),
    ({"metadata.flag": 1}, False),  # booleans are not numbers
    ({"metadata.flag": {"$gt": 0}}, False),
    ({"metadata.flag": {"$in": [1]}}, False),
    ({"metadata.flag": True}, True),
    ({"metadata.score": True}, False),
    ({"metadata.name": {"$gt": "alpha", "$lt": "gamma"}}, True),
    ({"metadata.name": {"$gt": 1}}, False),  # ordered comparisons need the operand's type
    ({"metadata.score": {"$lt": "z"}}, False),
    ({"metadata.name": {"$lt": "Z"}}, False),  # by code point: "b" > "Z"
    ({"metadata.missing": {"$ne": 1}}, True),  # $ne and $nin hold for a missing path
    ({"metadata.missing": {"$nin": [1]}}, True),
    ({"metadata.missing": {"$eq": None}}, False),  # $eq and $in need it present
    ({"metadata.missing": {"$in": [None]}}, False),
    ({"metadata.none": None}, True),
    ({"metadata.none": {"$exists": True}}, True),  # a present JSON null exists
    ({"metadata.missing": {"$exists": False}}, True),
    ({"metadata.none": {"$ne": None}}, False),
    ({"metadata.tags": ["a", "b"]}, True),  # equality of arrays: in order
    ({"metadata.tags": ["b", "a"]}, False),
    ({"metadata.tags": "a"}, False),  # no array-contains-scalar
    ({"metadata.nested": {"deep": {"x": 1.0}}}, True),
    ({"metadata.nested.deep.x": 1}, True),
    ({"metadata.nested.deep.x.y": {"$exists": True}}, False),
    ({"metadata.list.0": 10}, True),  # an integer segment indexes an array (as PostgreSQL's #>)
    ({"metadata.list.1.k": "v"}, True),
    ({"metadata.list.-1": {"$exists": True}}, True),
    ({"metadata.list.-1": None}, True),
    ({"metadata.list.-4": {"$exists": True}}, False),
    ({"metadata.list.3": {"$exists": True}}, False),
    ({"metadata.list.x": {"$exists": True}}, False),
    ({"metadata.big": {"$gt": 2**60 - 1, "$lt": 2**60 + 1}}, True),  # exact integers
    ({"metadata.huge": 10**300}, True),  # numbers compare by their JSON text, as jsonb does
    ({"metadata.huge": {"$gt": 10**300}}, False),
    ({"metadata": {"$exists": True}}, True),
    ({"metadata.confidence": {"$gt": 0.8}, "metadata.name": "nope"}, False),  # paths are ANDed
], ids=str)
def test_semantics(where: dict[str, Any], expected: bool) -> None:
    assert matches(where, metadata=META) is expected
    assert matches(parse_where(where), metadata=META) is expected


def test_value_paths_read_the_entry_value() -> None:
    assert matches({"value.status": {"$in": ["open", "blocked"]}}, metadata={}, value={"status": "open"})
    assert not matches({"value.status": "open"}, metadata={}, value="open")
    assert matches({"value": "open"}, metadata=None, value="open")
    # A value JSON cannot hold is stored as msgpack, its JSON column null: it reads as null.
    assert matches({"value": None}, metadata={}, value=b"\x00raw")
    assert not matches({"value.a": {"$exists": True}}, metadata={}, value={"a": b"x"})
    assert matches({"value.a": {"$exists": True}}, metadata={}, value={"a": "x"})


def test_the_empty_where_matches_everything() -> None:
    assert matches({}, metadata=None, value=None) and matches(EMPTY_WHERE, metadata={"a": 1})


_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from([0.5, 1.0, -2.5]) \
    | st.sampled_from(["a", "b", "é"])
_docs = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), inner,
                                                                           max_size=2), max_leaves=6), max_size=3)
_paths = st.lists(st.sampled_from(["a", "b", "c", "0"]), min_size=1, max_size=3).map(
    lambda ks: "metadata." + ".".join(ks))


@given(_docs, _paths, _scalars)
def test_ne_is_not_eq_and_nin_is_not_in(doc: dict[str, Any], path: str, x: Any) -> None:
    assert matches({path: {"$ne": x}}, metadata=doc) is not matches({path: {"$eq": x}}, metadata=doc)
    assert matches({path: {"$nin": [x]}}, metadata=doc) is not matches({path: {"$in": [x]}}, metadata=doc)
    assert matches({path: {"$exists": True}}, metadata=doc) is not matches({path: {"$exists": False}},
                                                                             metadata=doc)


@given(_docs, _paths, st.integers(-5, 5) | st.sampled_from([0.5, 1.0, "a", "é"]))
def test_ordered_comparisons_are_consistent(doc: dict[str, Any], path: str, x: Any) -> None:
    gt, eq, lt = (matches({path: {op: x}}, metadata=doc) for op in ("$gt", "$eq", "$lt"))
    assert matches({path: {"$gte": x}}, metadata=doc) is (gt or eq)
    assert matches({path: {"$lte": x}}, metadata=doc) is (lt or eq)
    assert not (gt and lt)


def test_a_request_with_where_is_schema_version_2_and_one_without_stays_1() -> None:
    from blackboard.protocol import codec
    from blackboard.protocol.schemas.search import (
        EntrySearchRequest,
        MemorySearchRequest,
        SearchFilters,
    )

    with_where = MemorySearchRequest.of("q", SearchFilters(where={"metadata.score": {"$gt": 0.8}}))
    without = EntrySearchRequest.of("q", SearchFilters())
    # As the SDK encodes a request (agents_sdk/search.py).
    wire = codec.decode(codec.encode(with_where.model_dump(exclude_none=True)))
    assert wire["v"] == 2 and wire["where"] == {"metadata.score": {"$gt": 0.8}}
    assert codec.decode(codec.encode(without.model_dump(exclude_none=True)))["v"] == 1
    # The service reads both versions, and where under either.
    assert MemorySearchRequest.model_validate(wire).where == with_where.where
    assert MemorySearchRequest.model_validate({**wire, "v": 1}).where == with_where.where
    with pytest.raises(ValueError, match="v"):  # a version the service does not know (3: lifecycle filters)
        MemorySearchRequest.model_validate({**wire, "v": 4})
