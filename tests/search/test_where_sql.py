"""The SQL of ``where`` (``search_sql.filters``) and the pure evaluator (``filters.matches``) agree,
on generated documents and filters, in a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard.db import search_sql as q
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.filters import OPERATORS, matches, parse_where
from blackboard.protocol.schemas.search import SearchFilters

#: Keys that walk objects and arrays the ways PostgreSQL's #> reads a segment.
_KEYS = ["a", "b", "0", "1", "-1", " 1", "+0", "é"]
_STRINGS = ["", "a", "b", "B", "é", "z", "\U0001f600", "ａ", "ab"]
_numbers = (st.integers(-3, 3) | st.sampled_from([2**53 + 1, 10**300, -(2**63), 10**20, 0.5, -0.0, 1.0, 2.5, 1e300, 1e-7,
                                                  0.1, 9007199254740993.0]))
_scalars = st.none() | st.booleans() | _numbers | st.sampled_from(_STRINGS)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3), max_leaves=8)
_docs = st.dictionaries(st.sampled_from(_KEYS), _json, max_size=4)


def _leaves(node: Any, keys: tuple[str, ...], out: list[tuple[tuple[str, ...], Any]]) -> None:
    """Every (path, value) of a document, arrays read by index from either end."""
    out.append((keys, node))
    if len(keys) >= 4:
        return
    if isinstance(node, dict):
        for k, v in node.items():
            _leaves(v, (*keys, k), out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _leaves(v, (*keys, str(i)), out)
            _leaves(v, (*keys, str(i - len(node))), out)


@st.composite
def _case(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]:
    """Rows (metadata, value) and a ``where`` whose paths and operands are mostly taken from them,
    so that the filters often select some rows and not others."""
    rows = draw(st.lists(st.tuples(_docs, _json), min_size=1, max_size=8))
    found: list[tuple[tuple[str, ...], Any]] = []
    for m, v in rows:
        _leaves(m, ("metadata",), found)
        _leaves(v, ("value",), found)
    seen = st.sampled_from(found)
    where: dict[str, Any] = {}
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 3)):
            path = draw(seen)[0]
        else:
            path = (draw(st.sampled_from(["metadata", "value"])), *draw(st.lists(st.sampled_from(_KEYS), max_size=3)))
        here = [v for p, v in found if p == path]
        operand = (st.sampled_from(here) if here else _json) | _json
        scalar = operand.filter(lambda x: not isinstance(x, dict | list)) | _scalars
        ordered = scalar.filter(lambda x: isinstance(x, int | float | str) and not isinstance(x, bool)) \
            | _numbers | st.sampled_from(_STRINGS)
        conds: dict[str, Any] = {}
        for op in draw(st.lists(st.sampled_from(OPERATORS), min_size=1, max_size=3, unique=True)):
            if op in ("$gt", "$gte", "$lt", "$lte"):
                conds[op] = draw(ordered)
            elif op == "$exists":
                conds[op] = draw(st.booleans())
            elif op in ("$in", "$nin"):
                conds[op] = draw(st.lists(scalar, max_size=4))
            else:
                conds[op] = draw(operand)
        where[".".join(path)] = conds if draw(st.integers(0, 3)) else draw(operand)
    return where, rows


@pytest.fixture(scope="module")
def conn(postgres_server: EmbeddedPostgres) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_server.dsn, autocommit=True) as c:
        yield c


def _selected(conn: psycopg.Connection[Any], where: Any, rows: list[tuple[dict[str, Any], Any]]) -> list[int]:
    """The rows the SQL of ``where`` keeps (as an entry search applies it)."""
    conds, params = q.filters("entry", SearchFilters(where=where))
    docs = json.dumps([{"m": m, "v": v} for m, v in rows])
    sql = ("SELECT e.i FROM (SELECT (d.ord - 1)::int AS i, d.doc -> 'm' AS metadata, d.doc -> 'v' AS value, "
           "false AS deleted, NULL::timestamptz AS expires_at "
           "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS d(doc, ord)) e "
           f"WHERE {' AND '.join(conds)} ORDER BY 1")
    return [r[0] for r in conn.execute(sql, [docs, *params]).fetchall()]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_case())
def test_sql_and_matches_agree(conn: psycopg.Connection[Any],
                               case: tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]) -> None:
    where, rows = case
    w = parse_where(where)
    expected = [i for i, (m, v) in enumerate(rows) if matches(w, metadata=m, value=v)]
    assert _selected(conn, w, rows) == expected


def test_each_operator_selects_in_sql_as_documented(conn: psycopg.Connection[Any]) -> None:
    rows: list[tuple[dict[str, Any], Any]] = [
        ({"c": 0.9, "s": "open", "l": [1, {"k": "v"}]}, {"status": "open", "n": 1}),
        ({"c": 0.5, "s": "beta", "t": True}, {"status": "blocked", "n": 1.0}),
        ({"c": None, "s": 3}, {"status": "done"}),
        ({}, "scalar"),
    ]
    cases: list[tuple[dict[str, Any], list[int]]] = [  # (where, the rows it keeps)
        ({"metadata.c": {"$gt": 0.8}}, [0]),
        ({"metadata.c": {"$gte": 0.5, "$lt": 0.9}}, [1]),
        ({"metadata.c": {"$lte": 0.5}}, [1]),
        ({"metadata.c": None}, [2]),
        ({"metadata.c": {"$ne": 0.9}}, [1, 2, 3]),
        ({"metadata.c": {"$exists": True}}, [0, 1, 2]),
        ({"metadata.c": {"$exists": False}}, [3]),
        ({"metadata.s": {"$in": ["open", 3]}}, [0, 2]),
        ({"metadata.s": {"$nin": ["open", 3]}}, [1, 3]),
        ({"metadata.s": {"$gt": "b"}}, [0, 1]),
        ({"metadata.t": 1}, []),
        ({"metadata.l.1.k": "v"}, [0]),
        ({"value.status": {"$in": ["open", "blocked"]}}, [0, 1]),
        ({"value.n": 1}, [0, 1]),
        ({"value": "scalar"}, [3]),
        ({"value.status": {"$ne": "open"}, "metadata.c": {"$exists": True}}, [1, 2]),
    ]
    for where, expected in cases:
        assert _selected(conn, where, rows) == expected, where
        assert [i for i, (m, v) in enumerate(rows) if matches(where, metadata=m, value=v)] == expected, where


def test_memory_filters_refuse_value_paths() -> None:
    with pytest.raises(ValueError, match="memories have no value"):
        q.filters("memory", SearchFilters(where={"value.a": 1}))


def test_statement_text_depends_on_the_operators_only() -> None:
    a, pa = q.filters("memory", SearchFilters(where={"metadata.x": {"$gt": 1}}))
    b, pb = q.filters("memory", SearchFilters(where={"metadata.y.z": {"$gt": 2.5}}))
    assert a == b and pa != pb


def test_numbers_compare_by_their_json_text_in_both(conn: psycopg.Connection[Any]) -> None:
    # jsonb keeps a number's decimal text: 1e300 (a float, not 10**300 in binary) equals 10**300.
    rows: list[tuple[dict[str, Any], Any]] = [({"h": 1e300, "b": 2**60 + 1}, None), ({"h": 1e299, "b": 2**60}, None)]
    cases: list[tuple[dict[str, Any], list[int]]] = [({"metadata.h": 10**300}, [0]), ({"metadata.h": {"$lt": 10**300}}, [1]),
                            ({"metadata.b": {"$gt": 2**60}}, [0]),
                            # float(2**60)'s text is 1.152921504606847e+18: above 2**60 + 1
                            ({"metadata.b": float(2**60)}, []), ({"metadata.b": {"$lt": float(2**60)}}, [0, 1])]
    for where, expected in cases:
        assert _selected(conn, where, rows) == expected, where
        assert [i for i, (m, v) in enumerate(rows) if matches(where, metadata=m, value=v)] == expected, where
