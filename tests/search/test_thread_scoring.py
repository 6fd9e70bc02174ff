"""Thread-level scoring of hybrid memory search (search.thread_weight): each memory borrows part of
its thread's best fused score (blackboard/search/fusion.py boost_threads, the engine's threads)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from blackboard.db.search_sql import MemoryRow
from blackboard.search.engine import _threads
from blackboard.search.fusion import boost_threads, fuse_convex, fuse_hybrid


class _Candidate:
    def __init__(self, item: int, score: float, flag: Any) -> None:
        self.item, self.score, self.flag = item, score, flag


def test_boost_threads_blends_each_score_with_its_threads_best() -> None:
    score = {1: 1.0, 2: 0.3, 3: 0.4, 4: 0.35, 5: 0.5}
    threads = {1: "a", 2: "a", 3: "b", 4: "b"}  # 5 has no thread: its own
    out = boost_threads(score, threads, 0.5)
    assert out[1] == pytest.approx((1.0 + 0.5 * 1.0) / 1.5)
    assert out[2] == pytest.approx((0.3 + 0.5 * 1.0) / 1.5)  # thread a's best lifts it ...
    assert out[3] == pytest.approx((0.4 + 0.5 * 0.4) / 1.5)  # ... above 3, better alone
    assert out[5] == pytest.approx((0.5 + 0.5 * 0.5) / 1.5)
    assert out[2] > out[3] and score[2] < score[3]
    assert list(out) == list(score)
    assert all(0.0 <= v <= 1.0 for v in out.values())
    # relative to the best candidate: scores that are all low stay comparable
    half = boost_threads({k: v / 2 for k, v in score.items()}, threads, 0.5)
    assert half[2] == pytest.approx((0.15 + 0.5 * 1.0) / 1.5)
    assert boost_threads(score, threads, 0.0) == score
    assert boost_threads({}, threads, 0.5) == {}


def test_fuse_hybrid_boosts_threads_after_the_neighbours_and_before_the_cut() -> None:
    semantic = [_Candidate(1, 0.9, True), _Candidate(2, 0.5, True), _Candidate(3, 0.55, True)]
    keyword = [_Candidate(1, 5.0, 0.9), _Candidate(3, 1.0, 0.55)]
    weights = {"semantic": 1.0, "keyword": 1.0}
    plain = fuse_hybrid(semantic, keyword, weights=weights)
    assert [f.item for f in plain] == [1, 3, 2]
    threads = {1: ("b", "t1"), 2: ("b", "t1"), 3: ("b", "t2")}
    got = fuse_hybrid(semantic, keyword, weights=weights, threads=threads, thread_weight=1.0, limit=2)
    assert [f.item for f in got] == [1, 2]  # 2 shares the best memory's thread
    convex = {f.item: f.score for f in fuse_convex({"semantic": {1: 0.9, 2: 0.5, 3: 0.55},
                                                    "keyword": {1: 5.0, 2: 0.0, 3: 1.0}}, weights)}
    assert got[1].score == pytest.approx(boost_threads(convex, threads, 1.0)[2])
    # reciprocal-rank fusion does not use threads
    rrf = fuse_hybrid(semantic, keyword, weights=weights, reciprocal_rank=True, threads=threads, thread_weight=1.0)
    assert [f.item for f in rrf] == [f.item for f in fuse_hybrid(semantic, keyword, weights=weights,
                                                                  reciprocal_rank=True)]


def _row(item: int, board: str, metadata: dict[str, Any] | None) -> MemoryRow:
    now = datetime.now(UTC)
    fields: dict[str, Any] = dict.fromkeys(MemoryRow._fields)
    fields.update(item=item, score=1.0, flag=True, mid=item, id=f"m{item}", board=board, agent="alice",
                  kind="episodic", text="text", tags=[], importance=0.5, created_at=now, updated_at=now,
                  revision=1, verdict="verified", metadata=None if metadata is None else json.dumps(metadata))
    return MemoryRow(**fields)


def test_the_engine_reads_threads_from_the_candidates_metadata_per_board_as_json() -> None:
    rows = [_row(1, "b1", {"thread": "s1"}), _row(2, "b1", {"speaker": "x", "thread": "s1"}),
            _row(3, "b2", {"thread": "s1"}), _row(4, "b1", {"thread": 7}), _row(5, "b1", {"thread": "7"}),
            _row(6, "b1", {"speaker": "thread"}), _row(7, "b1", None), _row(8, "b1", {"thread": None}),
            _row(9, "b1", {"thread": {"a": 1, "b": [2]}}), _row(10, "b1", {"thread": {"b": [2], "a": 1}})]
    threads = _threads(rows)
    assert threads[1] == threads[2] != threads[3]  # the same thread on another board is another
    assert threads[4] != threads[5]  # compared as JSON: 7 is not "7"
    assert threads[9] == threads[10]  # ... and a map's key order does not matter
    assert set(threads) == {1, 2, 3, 4, 5, 9, 10}
