"""Pure parts of search: rank fusion, planning, the filters value, rows by name, the SDK's error-reply
mapping, the vector index's DDL."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg import ProgrammingError, pq
from pydantic import ValidationError

from agents_sdk.search import raise_for_error, search_filters
from blackboard.db import search_sql as q
from blackboard.db.spaces import Space, ann_order, hnsw_index
from blackboard.protocol import codec
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, SearchError
from blackboard.protocol.schemas.search import (
    EntrySearchRequest,
    ErrorReply,
    MemorySearchRequest,
    SearchFilters,
)
from blackboard.protocol.signing import Verdict
from blackboard.search.fusion import (
    cut,
    fuse_convex,
    fuse_hybrid,
    neighbour_map,
    rrf,
    smooth_neighbours,
)
from blackboard.search.hits import entry_hit, memory_hit
from blackboard.search.messages import message_hit
from blackboard.search.planning import BoardStats, board_share, exact_scan
from blackboard.settings import EmbeddingSettings


def test_rrf_fuses_and_normalises() -> None:
    fused = rrf({"semantic": [(1, 0.9), (2, 0.8)], "keyword": [(2, 3.0), (3, 1.0)]})
    assert [f.item for f in fused] == [2, 1, 3]
    assert fused[0].parts == {"semantic": 0.8, "keyword": 3.0}
    top = rrf({"semantic": [(7, 1.0)], "keyword": [(7, 1.0)]})
    assert top[0].score == pytest.approx(1.0)


def test_raise_for_error_maps_classes() -> None:
    body = codec.encode(ErrorReply(error="SearchError", message="boom").model_dump())
    with pytest.raises(SearchError, match="boom"):
        raise_for_error({"Bb-Error": "SearchError"}, body)
    raise_for_error({}, b"")


def test_spaces_index_up_to_4000_dimensions_and_settings_refuse_more() -> None:
    """The HNSW index is on halfvec (pgvector: at most 4,000 dimensions, where vector stops at 2,000)."""
    big = Space(1, "text-embedding-3-large", 3072)
    assert "halfvec(3072)" in hnsw_index(big, "memory").as_string()
    assert ann_order(3072, "v.embedding") == "(v.embedding::halfvec(3072) <=> %s::vector::halfvec(3072))"
    with pytest.raises(ConfigurationError, match="4000"):
        hnsw_index(Space(2, "huge", 4001), "memory")
    assert EmbeddingSettings(dimensions=4000).dimensions == 4000
    with pytest.raises(ValidationError):
        EmbeddingSettings(dimensions=4001)


# ---------------------------------------------------------------- the filters, one value everywhere

_AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_search_requests_keep_their_wire_bytes() -> None:
    """The request's fields are declared through SearchFilters' base: the encoded request is
    byte for byte what it was (field order included), however it is built."""
    memory = MemorySearchRequest(query="disk alerts", mode="keyword", top_k=5, boards=["ops"], kinds=["episodic"],
                                 tags_any=["a"], since=_AT, metadata={"team": "sre"})
    assert codec.encode(memory.model_dump(exclude_none=True)).hex() == (
        "8aa17601a57175657279ab6469736b20616c65727473a46d6f6465a76b6579776f7264a5746f705f6b05a6626f6172647391a36f"
        "7073a8746167735f616e7991a161a8746167735f616c6c90a573696e6365b9323032342d30352d30315431323a30303a30302b30"
        "303a3030a86d6574616461746181a47465616da3737265a56b696e647391a8657069736f646963")
    entry = EntrySearchRequest(query="pgvector", boards=["b"], sections=["facts"], author="carol", until=_AT)
    assert codec.encode(entry.model_dump(exclude_none=True), "json") == (
        b'{"v":1,"query":"pgvector","mode":"hybrid","top_k":10,"boards":["b"],"author":"carol","tags_any":[],'
        b'"tags_all":[],"until":"2024-05-01T12:00:00+00:00","metadata":{},"sections":["facts"]}')
    rebuilt = MemorySearchRequest.of("disk alerts", memory.filters, mode="keyword", top_k=5)
    assert codec.encode(rebuilt.model_dump(exclude_none=True)) == codec.encode(memory.model_dump(exclude_none=True))
    assert "filters" not in memory.model_dump()


def test_a_request_carries_its_filters_and_refuses_the_other_targets() -> None:
    req = EntrySearchRequest(query="q", boards=["b"], sections=["s"], tags_all=["t"])
    assert req.filters == SearchFilters(boards=["b"], sections=["s"], tags_all=["t"])
    assert req.filters is req.filters  # built once
    assert MemorySearchRequest(query="q", kinds=["semantic"]).filters.kinds == ["semantic"]
    with pytest.raises(ValueError, match="sections do not filter memory"):
        MemorySearchRequest.of("q", SearchFilters(sections=["s"]))
    with pytest.raises(ValueError, match="kinds do not filter entry"):
        EntrySearchRequest.of("q", SearchFilters(kinds=["semantic"]))


def test_search_filters_are_frozen_typed_and_refuse_unknown_fields() -> None:
    f = SearchFilters(boards=["b"], kinds=["procedural"])
    with pytest.raises(ValidationError):
        f.boards = ["other"]  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SearchFilters(board="b")  # type: ignore[call-arg]  # a misspelt filter must not widen the search
    with pytest.raises(ValidationError):
        SearchFilters(boards=["not a token!"])
    with pytest.raises(ValidationError):
        SearchFilters(kinds=["dreamt"])


def test_the_sdk_keywords_refine_a_filters_value() -> None:
    base = SearchFilters(boards=["x"], author="ann", tags_any=["t"])
    assert search_filters(None, {}) == SearchFilters()
    assert search_filters(base, {}) is base
    # A keyword replaces its field; board goes in front of the boards (given, else the value's).
    assert search_filters(base, {"board": "y"}).boards == ["y", "x"]
    assert search_filters(base, {"board": "y", "boards": ["z"]}).boards == ["y", "z"]
    assert search_filters(base, {"author": "bob", "tags_any": ()}) == SearchFilters(boards=["x"], author="bob")
    assert search_filters(None, {"kind": "semantic", "kinds": ["episodic"], "metadata": {"k": 1}}) == SearchFilters(
        kinds=["semantic", "episodic"], metadata={"k": 1})
    assert search_filters(base, {"author": None, "top_k": 3, "mode": "keyword"}) is base  # None leaves it
    with pytest.raises(TypeError, match="nonsense"):
        search_filters(None, {"nonsense": 1})
    with pytest.raises(InvalidPayloadError):
        search_filters(None, {"board": "not a token!"})


def test_sql_filters_take_the_value_and_apply_each_targets_own() -> None:
    f = SearchFilters(boards=["b"], kinds=["semantic"], sections=["s"], author="ann", tags_any=["t"],
                      since=_AT, metadata={"k": 1})
    conds, params = q.filters("memory", f)
    assert conds == ["m.board = ANY(%s)", "m.kind = ANY(%s)", "m.agent = %s", "m.tags && %s::text[]",
                     "m.created_at >= %s", "m.metadata @> %s", q.LIVE_MEMORY, q.CURRENT_MEMORY]
    assert params[:5] == [["b"], ["semantic"], "ann", ["t"], _AT]
    conds, params = q.filters("entry", f, boards=False)
    assert conds[0].startswith("NOT e.deleted") and "e.section = ANY(%s)" in conds and "e.author = %s" in conds
    assert not any("kind" in c or "board" in c for c in conds)
    assert q.filters("memory", SearchFilters()) == ([q.LIVE_MEMORY, q.CURRENT_MEMORY], [])
    assert q.filters("memory", SearchFilters(include_superseded=True, include_archived=True)) == ([], [])


# ---------------------------------------------------------------- rows by column name

@dataclass
class _Result:
    names: tuple[str, ...]
    status: pq.ExecStatus = pq.ExecStatus.TUPLES_OK

    @property
    def nfields(self) -> int:
        return len(self.names)

    def fname(self, i: int) -> bytes:
        return self.names[i].encode()


@dataclass
class _Cursor:
    pgresult: _Result | None


def _cursor(*names: str) -> _Cursor:
    return _Cursor(_Result(names))


def test_named_rows_check_the_columns_and_fill_trailing_defaults() -> None:
    make = q.named_rows(q.MemoryRow)(_cursor(*q.MemoryRow._fields))
    values = tuple(range(len(q.MemoryRow._fields)))
    row = make(values)
    assert isinstance(row, q.MemoryRow) and row.revision == values[15] and row.next == values[-1]
    short = q.named_rows(q.MemoryRow)(_cursor(*q.MemoryRow._fields[:-2]))(values[:-2])
    assert (short.prev, short.next) == (None, None)
    with pytest.raises(ProgrammingError, match="MemoryRow"):
        q.named_rows(q.MemoryRow)(_cursor("item", "score", "flag", "id"))  # a column out of place
    with pytest.raises(ProgrammingError):
        q.named_rows(q.MemoryRow)(_cursor(*q.MemoryRow._fields[:5]))  # missing fields without a default
    for empty in (_Cursor(None), _Cursor(_Result((), pq.ExecStatus.COMMAND_OK))):
        with pytest.raises(ProgrammingError, match="no rows"):
            q.named_rows(q.MemoryRow)(empty)(())


@pytest.mark.parametrize(("target", "row", "linked"), [("memory", q.MemoryRow, 0), ("memory", q.MemoryRow, 3),
                                                      ("entry", q.EntryRow, 0)])
def test_retriever_statements_name_their_columns_after_the_row_type(
        target: str, row: type[q.MemoryRow] | type[q.EntryRow], linked: int) -> None:
    """The select list is built from the row type: the column names are its fields, in order."""
    text = q.with_rows("SELECT 1, 2.0, true", target, linked=linked)
    select = text[len("SELECT "):text.index(" FROM (")]
    names = [re.split(r"\.| AS ", col.strip())[-1] for col in _top_level_commas(select)]
    fields = list(row._fields)
    assert names == (fields if linked or target == "entry" else fields[:-2])


def _top_level_commas(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def test_revision_statements_name_their_columns_after_the_row_type() -> None:
    for statement, fields in ((q.HISTORY, q.RevisionRow._fields[:-1]), (q.AS_OF_AT, q.RevisionRow._fields)):
        select = statement[len("SELECT "):statement.index(" FROM ")]
        assert [re.split(r"\.| AS ", c.strip())[-1] for c in select.split(",")] == list(fields)


def test_hits_are_built_from_rows_by_name() -> None:
    row = q.MemoryRow(item=7, score=0.5, flag=True, mid=7, id="m7", board="b", agent="a", kind="semantic",
                      text="t", tags=["x"], metadata='{"k": [1, 2]}', importance=0.3, source=None,
                      created_at=_AT, updated_at=_AT, revision=42, verdict="verified", key="price:1",
                      occurred_at=None, valid_from=_AT, valid_to=None, superseded_by=None, confidence=0.75,
                      seen_count=3, hits=5, archived_at=None, archive_reason=None, merged_into=None,
                      contested_by=None)
    hit = memory_hit(row, 0.9, {"semantic": 0.5})
    assert (hit.id, hit.metadata, hit.revision, hit.score, hit.scores) == ("m7", {"k": [1, 2]}, 42, 0.9,
                                                                            {"semantic": 0.5})
    assert hit.verdict is Verdict.VERIFIED
    assert (hit.key, hit.valid_from, hit.confidence, hit.seen_count, hit.hits) == ("price:1", _AT, 0.75, 3, 5)
    entry = q.EntryRow(item=1, score=1.0, flag=None, eid=1, board="b", section="s", key="k", revision=3,
                       value=None, value_raw=codec.encode(b"\x00raw"), content_type=None, tags=[], metadata="{}",
                       author=None, created_at=None, updated_at=_AT, verdict="unsigned")
    assert entry_hit(entry, 1.0, {}).value == b"\x00raw"
    assert entry_hit(entry, 1.0, {}).verdict is Verdict.UNSIGNED
    message = message_hit(id="i", seq=4, sender="a", recipients=None, kind="direct", board=None, topic=None,
                          type="note", body=None, body_raw=codec.encode(b"\x01"), correlation_id=None,
                          reply_to=None, metadata=None, created_at=None, stored_at=_AT, verdict="verified", score=0)
    assert (message.body, message.recipients, message.metadata, message.score) == (b"\x01", [], {}, 0.0)
    assert message.verdict is Verdict.VERIFIED


# ---------------------------------------------------------------- fusion of the retrievers' rows

@dataclass
class _Candidate:
    item: int
    score: float
    flag: Any


def test_fuse_hybrid_is_convex_fusion_then_neighbour_smoothing_then_the_cut() -> None:
    semantic = [_Candidate(1, 0.9, True), _Candidate(2, 0.5, True), _Candidate(3, 0.1, True)]
    keyword = [_Candidate(3, 8.0, 0.1), _Candidate(4, 2.0, None), _Candidate(2, 1.0, 0.5)]
    weights = {"semantic": 1.0, "keyword": 1.0}
    sem = {1: 0.9, 2: 0.5, 3: 0.1, 4: 0.1}  # item 4 has no vector: the lowest cosine
    kw = {1: 0.0, 2: 1.0, 3: 8.0, 4: 2.0}
    expected = fuse_convex({"semantic": sem, "keyword": kw}, weights)
    got = fuse_hybrid(semantic, keyword, weights=weights)
    assert [f.item for f in got] == [f.item for f in expected]
    assert [f.score for f in got] == pytest.approx([f.score for f in expected])
    parts = {f.item: f.parts for f in got}
    assert parts[3] == {"semantic": 0.1, "keyword": 8.0} and parts[4] == {"keyword": 2.0}  # the raw scores
    links = [(4, None, 1)]
    smoothed = smooth_neighbours(expected, neighbour_map(links), 0.5)
    got = fuse_hybrid(semantic, keyword, weights=weights, links=links, neighbour_weight=0.5, limit=2)
    assert [(f.item, round(f.score, 9)) for f in got] == [(f.item, round(f.score, 9)) for f in smoothed[:2]]
    assert [f.item for f in fuse_hybrid(semantic, keyword, weights=weights, min_score=0.6)] == [
        f.item for f in expected if f.score >= 0.6]


def test_fuse_hybrid_with_reciprocal_ranks_uses_the_nearest_and_the_keyword_order() -> None:
    semantic = [_Candidate(1, 0.9, True), _Candidate(5, 0.8, False), _Candidate(2, 0.5, True)]
    keyword = [_Candidate(2, 3.0, 0.5), _Candidate(3, 1.0, None)]
    got = fuse_hybrid(semantic, keyword, weights={"semantic": 1.0, "keyword": 1.0}, reciprocal_rank=True,
                      links=[(3, 1, None)], neighbour_weight=1.0)
    expected = rrf({"semantic": [(1, 0.9), (2, 0.5)], "keyword": [(2, 3.0), (3, 1.0)]},
                   {"semantic": 1.0, "keyword": 1.0})
    assert got == expected  # item 5 is not among the nearest; no smoothing under rrf
    assert list(cut(iter(expected), lambda f: f.score, 1, None)) == expected[:1]
    assert list(cut(expected, lambda f: f.score, None, 2.0)) == []


def test_planning_decides_the_exact_scan_and_the_board_share_from_statistics() -> None:
    stats = BoardStats({"big": 0.5, "small": 0.01}, n_distinct=10, rows=10_000)
    assert exact_scan(["small"], stats, max_rows=1000)  # 100 rows, 1% of the table
    assert not exact_scan(["small"], stats, max_rows=50)
    assert not exact_scan(["big"], stats, max_rows=100_000)  # half the table: the index is cheaper
    assert not exact_scan([], stats, max_rows=1000) and not exact_scan(["small"], None, max_rows=1000)
    assert not exact_scan(["small"], stats, max_rows=0)
    assert board_share(["big"], stats) == pytest.approx(0.5)
    assert board_share([], stats) == board_share(["x"], None) == 1.0


def test_a_lone_hybrid_candidate_keeps_its_score_so_min_score_keeps_it() -> None:
    # One candidate, found by both retrievers: the best of each, so it scores 1.0 (min-max over a
    # single value used to give 0.0, and min_score dropped the only hit).
    semantic = [_Candidate(7, 0.62, True)]
    keyword = [_Candidate(7, 3.5, 0.62)]
    weights = {"semantic": 1.0, "keyword": 1.0}
    got = fuse_hybrid(semantic, keyword, weights=weights, min_score=0.5)
    assert [(f.item, f.score) for f in got] == [(7, 1.0)]
    # Found by the nearest neighbours only: the keyword retriever found nothing and adds nothing.
    got = fuse_hybrid(semantic, [], weights=weights, min_score=0.5)
    assert [(f.item, f.score) for f in got] == [(7, 0.5)]
    # A tie is not a lone candidate, but the same case: each tied item is a retriever's best.
    tied = fuse_convex({"semantic": {1: 0.4, 2: 0.4}, "keyword": {1: 2.0, 2: 0.0}}, weights)
    assert [(f.item, f.score) for f in tied] == [(1, 1.0), (2, 0.5)]
    # Scores of 0 (or below) are what a retriever gives items it did not find: never its best.
    assert [f.score for f in fuse_convex({"keyword": {1: 0.0, 2: 0.0}})] == [0.0, 0.0]
