"""The store's pure core (agents_sdk/langgraph/_items.py): locations, metadata, filters,
namespace matching and listing order."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.store.base import MatchCondition
from langgraph.store.memory import _does_match

from agents_sdk.langgraph._items import (
    item_metadata,
    item_of,
    listing_order,
    location,
    namespace_matches,
    prefix_metadata,
    section_of,
    ttl_seconds,
    where_of,
)
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.subjects import encode_key, validate_name

labels = st.text(st.characters(blacklist_characters=".\x00", blacklist_categories=["Cs"]), min_size=1, max_size=80)
namespaces = st.lists(labels, min_size=1, max_size=5).map(tuple)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@given(labels, labels)
def test_sections_are_tokens_and_tell_labels_apart(a: str, b: str) -> None:
    assert validate_name(section_of(a), "section")
    assert (section_of(a) == section_of(b)) == (a == b)


def test_section_escapes() -> None:
    assert section_of("users") == "users"
    assert section_of("a-b c") == "a-2db-20c"
    assert section_of("é") == "-c3-a9"
    long = section_of("x" * 200)
    assert long.startswith("--") and len(long) == 66 and not re.search(r"-[^-0-9a-f]", long[2:])


@given(namespaces, st.text(min_size=1, max_size=40), namespaces, st.text(min_size=1, max_size=40))
def test_locations_are_keys_and_tell_items_apart(ns: tuple[str, ...], key: str, ns2: tuple[str, ...],
                                                 key2: str) -> None:
    where = location(ns, key)
    assert validate_name(where.section, "section") and encode_key(where.key)
    assert (where == location(ns2, key2)) == ((ns, key) == (ns2, key2))


def test_a_location_too_long_for_a_key_is_hashed_and_still_verified() -> None:
    ns, key = ("docs", "y" * 900), "k"
    where = location(ns, key)
    assert where.key.startswith("#") and len(where.key) == 65
    meta = item_metadata(ns, key, created_at=T0, updated_at=T0, ttl_minutes=None, index=True)
    record = item_of(where.section, where.key, 7, {"a": 1}, meta)
    assert record is not None and record.item.namespace == ns and record.item.key == key


def test_item_of_reads_only_items_at_their_own_location() -> None:
    ns, key = ("users", "u1"), "prefs"
    where = location(ns, key)
    meta = item_metadata(ns, key, created_at=T0, updated_at=T0 + timedelta(seconds=1), ttl_minutes=0.5,
                         index=False)
    record = item_of(where.section, where.key, 3, {"theme": "dark"}, meta)
    assert record is not None
    assert (record.item.namespace, record.item.key, record.item.value) == (ns, key, {"theme": "dark"})
    assert record.item.created_at == T0 and record.item.updated_at == T0 + timedelta(seconds=1)
    assert record.revision == 3 and record.ttl == 30 and record.metadata is meta
    assert meta["langgraph"]["prefixes"] == ["users", "users.u1"]
    assert item_of(where.section, '["u2","prefs"]', 3, {}, meta) is None  # moved: not its location
    assert item_of(where.section, where.key, 3, "not an object", meta) is None
    assert item_of(where.section, where.key, 3, {}, {"other": 1}) is None
    assert item_of(where.section, where.key, 3, {}, {"langgraph": {**meta["langgraph"], "v": 2}}) is None


def test_prefix_metadata_is_contained_in_the_items_under_it() -> None:
    meta = item_metadata(("a", "b", "c"), "k", created_at=T0, updated_at=T0, ttl_minutes=None, index=True)

    def contains(outer: object, inner: object) -> bool:  # jsonb @>, enough for these shapes
        if isinstance(inner, dict):
            return isinstance(outer, dict) and all(k in outer and contains(outer[k], v) for k, v in inner.items())
        if isinstance(inner, list):
            return isinstance(outer, list) and all(any(contains(o, i) for o in outer) for i in inner)
        return outer == inner

    for prefix in [(), ("a",), ("a", "b"), ("a", "b", "c")]:
        assert contains(meta, prefix_metadata(prefix, indexed_only=True))
    assert not contains(meta, prefix_metadata(("a", "c")))
    assert not contains(meta, prefix_metadata(("a", "b", "c", "d")))
    hidden = item_metadata(("a",), "k", created_at=T0, updated_at=T0, ttl_minutes=None, index=False)
    assert contains(hidden, prefix_metadata(("a",))) and not contains(hidden, prefix_metadata(("a",), indexed_only=True))


def test_ttl_seconds() -> None:
    assert ttl_seconds(None) is None
    assert ttl_seconds(1) == 60 and ttl_seconds(0.5) == 30 and ttl_seconds(0.001) == 1 and ttl_seconds(0.021) == 2
    for bad in (0, -1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="positive number of minutes"):
            ttl_seconds(bad)  # type: ignore[arg-type]


def test_filters_become_where_on_the_value() -> None:
    assert where_of(None) == where_of({}) == {}
    assert where_of({"status": "open", "score": {"$gt": 4.5, "$lte": 9}, "tags": ("a", "b")}) == {
        "value.status": "open", "value.score": {"$gt": 4.5, "$lte": 9}, "value.tags": ["a", "b"]}
    assert where_of({"a": {"b": {"c": 1, "d": {"$ne": 2}}}}) == {"value.a.b.c": 1, "value.a.b.d": {"$ne": 2}}
    assert where_of({"k": {"$in": ["x", "y"]}, "j": {"$exists": False}}) == {
        "value.k": {"$in": ["x", "y"]}, "value.j": {"$exists": False}}


@pytest.mark.parametrize(("filter", "message"), [
    ({"a.b": 1}, "without '.'"),
    ({"": 1}, "non-empty"),
    ({"a": {}}, "empty object"),
    ({"a": {"$gt": 1, "b": 2}}, "mixes operators"),
    ({"a": {"$regex": "x"}}, r"\$regex"),
    ({"a": {"$gt": [1]}}, r"\$gt"),
    ({"a": {"$in": "xy"}}, r"\$in"),
])
def test_bad_filters_are_refused(filter: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        where_of(filter)


def test_a_filter_beyond_the_where_limits_is_refused() -> None:
    with pytest.raises(InvalidPayloadError):
        where_of({f"k{i}": i for i in range(33)})


wild = st.lists(st.sampled_from(["a", "b", "c", "*"]), max_size=4).map(tuple)
small_ns = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(tuple)


@given(small_ns, st.lists(st.tuples(st.sampled_from(["prefix", "suffix"]), wild), max_size=2))
def test_namespace_matching_is_the_in_memory_stores(ns: tuple[str, ...], conds: list[tuple[str, tuple[str, ...]]]) -> None:
    conditions = [MatchCondition(match_type=t, path=p) for t, p in conds]  # type: ignore[arg-type]
    assert namespace_matches(ns, conditions) == all(_does_match(c, ns) for c in conditions)


def test_listing_order_is_insertion_order_by_namespace() -> None:
    from langgraph.store.base import Item

    def item(ns: tuple[str, ...], key: str, minute: int) -> Item:
        t = T0 + timedelta(minutes=minute)
        return Item(value={}, key=key, namespace=ns, created_at=t, updated_at=t)

    items = [item(("b",), "x", 5), item(("a",), "y", 3), item(("b",), "w", 1), item(("a",), "z", 2),
             item(("c",), "v", 2)]
    ordered = listing_order(items, lambda i: i)
    assert [(i.namespace, i.key) for i in ordered] == [
        (("b",), "w"), (("b",), "x"), (("a",), "z"), (("a",), "y"), (("c",), "v")]
