"""The pure parts of agent.memory's layers: relevance per layer, the merged ranking, the
long-term search cache (cache_ttl, cache_size)."""

from __future__ import annotations

from datetime import UTC, datetime

from agents_sdk.memory.layers import (
    HitCache,
    LayerHit,
    hit_of_memory,
    lexical_score,
    merge_hits,
    normalise_scores,
    query_terms,
)
from blackboard.protocol.schemas.search import MemoryHit

_NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _hit(layer: str, id: str, score: float) -> LayerHit:
    return LayerHit(layer=layer, id=id, text=id, score=score, kind="note", source=layer, provenance={})


def _memory(id: str, score: float) -> MemoryHit:
    return MemoryHit(id=id, board="b", agent="a", kind="semantic", text=f"text {id}", tags=["t"], metadata={"m": 1},
                     importance=0.5, created_at=_NOW, updated_at=_NOW, revision=3, score=score, key="k:1",
                     confidence=0.7)


def test_lexical_score_is_the_share_of_meaningful_query_words() -> None:
    terms = query_terms("Where is the PRICE selector?")
    assert terms == {"price", "selector"}  # stop words and case out
    assert lexical_score(terms, "the price is in span.price") == 0.5
    assert lexical_score(terms, "price selector: span.price") == 1.0
    assert lexical_score(terms, "nothing here") == 0.0
    assert lexical_score(frozenset(), "anything") == 0.0


def test_long_term_scores_are_clamped_or_scaled_to_the_best() -> None:
    hits = [_memory("a", 1.2), _memory("b", 0.4), _memory("c", -0.1)]
    assert normalise_scores(hits, "hybrid") == [1.0, 0.4, 0.0]
    assert normalise_scores(hits, "semantic") == [1.0, 0.4, 0.0]
    assert normalise_scores([_memory("a", 8.0), _memory("b", 2.0)], "keyword") == [1.0, 0.25]
    assert normalise_scores([_memory("a", 0.0)], "keyword") == [0.0]
    hit = hit_of_memory(_memory("a", 0.9), layer="shared")
    assert (hit.layer, hit.id, hit.score, hit.source, hit.kind) == ("shared", "a", 0.9, "b", "semantic")
    assert hit.provenance["agent"] == "a" and hit.provenance["key"] == "k:1" and hit.provenance["confidence"] == 0.7
    assert hit.metadata == {"m": 1} and hit.created_at == _NOW
    assert hit.as_dict()["created_at"] == _NOW.isoformat()


def test_merged_hits_rank_by_score_then_layer_and_keep_an_id_once() -> None:
    merged = merge_hits([
        [_hit("shared", "m1", 0.9), _hit("shared", "m2", 0.5)],
        [_hit("long_term", "m1", 0.9), _hit("long_term", "m3", 0.5)],
        [_hit("short_term", "st:e:1", 0.5), _hit("short_term", "st:e:2", 0.5)],
        [_hit("store:notes", "n1", 0.95)],
    ], top_k=10)
    assert [(h.layer, h.id) for h in merged] == [
        ("store:notes", "n1"), ("long_term", "m1"),  # m1 once, as long_term
        ("short_term", "st:e:1"), ("short_term", "st:e:2"), ("long_term", "m3"), ("shared", "m2")]
    assert len(merge_hits([[_hit("working", f"wm:{i}", 0.1) for i in range(5)]], top_k=3)) == 3


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_keeps_results_for_ttl_seconds_and_at_most_size() -> None:
    clock = _Clock()
    cache = HitCache(30.0, 2, clock=clock)
    hits = [_hit("long_term", "m1", 0.5)]
    assert cache.get("q1") is None
    cache.put("q1", hits)
    clock.now += 29.9
    assert cache.get("q1") == hits
    clock.now += 0.2  # expired
    assert cache.get("q1") is None and len(cache) == 0
    cache.put("a", hits)
    cache.put("b", hits)
    assert cache.get("a") == hits  # a used: b is the least recently used
    cache.put("c", hits)
    assert cache.get("b") is None and cache.get("a") == hits and cache.get("c") == hits
    assert (cache.hits, cache.misses) == (4, 3)
    cache.clear()
    assert cache.get("a") is None
    off = HitCache(0.0, 10, clock=clock)
    off.put("a", hits)
    assert off.get("a") is None and (off.hits, off.misses) == (0, 0) and not off.enabled
    assert not HitCache(30.0, 0).enabled
