"""Rank fusion (pure): how the candidates of the retrievers become one ranked, cut list.

* :func:`fuse_convex`: each retriever's scores min-max normalised over the
  candidates, then their weighted mean (a convex combination, which keeps how
  far apart the scores are);
* :func:`rrf`: weighted reciprocal-rank fusion (``settings.search.fusion =
  "rrf"``), which keeps only the order;
* :func:`smooth_neighbours`: a memory borrows part of the score of its
  neighbours on its board (:func:`neighbour_map` gives them);
* :func:`boost_threads`: a memory borrows part of its thread's best score
  (thread-level relevance: the conversation or document that matches best);
* :func:`fuse_hybrid`: all of it over the retrievers' rows, as hybrid search
  runs it; :func:`cut`: how every result list is cut (``top_k``, ``min_score``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["RRF_K", "Fused", "Scored", "boost_threads", "cut", "fuse_convex", "fuse_hybrid", "neighbour_map",
           "rrf", "smooth_neighbours"]

_T = TypeVar("_T")

#: Rank constant of reciprocal-rank fusion (Cormack et al. 2009).
RRF_K = 60


@dataclass(frozen=True, slots=True)
class Fused:
    """One fused result: the item, its fused score and each retriever's score."""

    item: int
    score: float
    parts: dict[str, float]


class Scored(Protocol):
    """A retriever's candidate: the item, its score, and ``flag`` (semantic: whether it is one
    of the nearest; keyword: its cosine, None without a vector)."""

    @property
    def item(self) -> int: ...

    @property
    def score(self) -> float: ...

    @property
    def flag(self) -> Any: ...


def rrf(ranked: dict[str, Sequence[tuple[int, float]]], weights: dict[str, float] | None = None,
        k: int = RRF_K) -> list[Fused]:
    """Weighted reciprocal-rank fusion of ranked ``(item, score)`` lists.

    The fused score is normalised by its maximum (an item ranked first by every
    retriever scores 1.0). Ties keep the order of first appearance.
    """
    weights = weights or {}
    total: dict[int, float] = {}
    parts: dict[int, dict[str, float]] = {}
    for name, hits in ranked.items():
        w = weights.get(name, 1.0)
        for rank, (item, score) in enumerate(hits):
            total[item] = total.get(item, 0.0) + w / (k + rank + 1)
            parts.setdefault(item, {})[name] = float(score)
    best = sum(weights.get(name, 1.0) for name in ranked) / (k + 1) or 1.0
    out = [Fused(i, s / best, parts[i]) for i, s in total.items()]
    out.sort(key=lambda f: -f.score)
    return out


def fuse_convex(scores: Mapping[str, Mapping[int, float]], weights: Mapping[str, float] | None = None,
                parts: Mapping[str, Mapping[int, float]] | None = None) -> list[Fused]:
    """Convex combination of min-max normalised scores.

    Args:
        scores: per retriever, the score of every candidate (give each
            retriever a score for the same items; an item a retriever lacks
            counts as that retriever's lowest score).
        weights: per retriever (default 1.0); normalised to sum to 1.
        parts: the raw scores to report per item (default: ``scores``).

    Returns:
        Items best first, scores in 0..1 (1.0: best of every retriever). A
        retriever whose scores are all equal (a lone candidate, or a tie) gives
        each 1.0 when the score is positive (each is its best) and nothing when
        it is 0 or below (it found none of them). Ties keep the order of first
        appearance.
    """
    fused = _convex_scores(scores, weights)
    return _ranked(fused, _best_first(fused), parts if parts is not None else scores)


def _convex_scores(scores: Mapping[str, Mapping[int, float]],
                   weights: Mapping[str, float] | None = None) -> dict[int, float]:
    """The fused score of every item (:func:`fuse_convex` without the ranking), in order of
    first appearance."""
    weights = weights or {}
    total_w = sum(weights.get(name, 1.0) for name in scores) or 1.0
    fused: dict[int, float] = {}
    for s in scores.values():
        fused.update(dict.fromkeys(s, 0.0))
    for name, s in scores.items():
        if not s:
            continue
        lo, hi = min(s.values()), max(s.values())
        w = weights.get(name, 1.0) / total_w
        get = s.get
        if hi <= lo:
            # One candidate, or a tie: each is the retriever's best (1.0), unless the common
            # score is what it gives items it did not find (0 or below). Min-max over one
            # value would give 0.0, and min_score would drop a lone hit.
            if hi > 0:
                for item in s:
                    fused[item] += w
            continue
        for item in fused:
            fused[item] += w * (get(item, lo) - lo) / (hi - lo)
    return fused


def _best_first(score: Mapping[int, float]) -> list[int]:
    """Items by descending score; ties keep their order."""
    return sorted(score, key=score.__getitem__, reverse=True)


def cut(items: Iterable[_T], score: Callable[[_T], float], limit: int | None,
        min_score: float | None) -> Iterator[_T]:
    """The first ``limit`` of ``items`` (in their order) scoring at least ``min_score``: how
    every result list is cut."""
    kept = items if min_score is None else (item for item in items if score(item) >= min_score)
    return itertools.islice(kept, limit)


def _ranked(score: Mapping[int, float], order: Sequence[int], parts: Mapping[str, Mapping[int, float]],
            limit: int | None = None, min_score: float | None = None) -> list[Fused]:
    """:class:`Fused` results for the items of ``order`` that :func:`cut` keeps, each with
    its retrievers' scores from ``parts`` (built only for those)."""
    return [Fused(item, score[item], {n: float(p[item]) for n, p in parts.items() if item in p})
            for item in cut(order, score.__getitem__, limit, min_score)]


def smooth_neighbours(fused: Sequence[Fused], neighbours: Mapping[int, Sequence[int | None]],
                      weight: float) -> list[Fused]:
    """Let each item borrow ``weight`` times the score of its best-scoring neighbour.

    A memory right before or after a strongly matching one on the same board
    (the reply to a question, the next chunk of a document) is often what
    the query is after, though its own words do not say so. Neighbours that
    are not among ``fused`` add nothing. Scores are divided by ``1 + weight``
    (so they stay within 0..1); ties keep their order.
    """
    if weight <= 0 or not fused:
        return list(fused)
    smoothed = _smoothed_scores({f.item: f.score for f in fused}, neighbours, weight)
    out = [Fused(f.item, smoothed[f.item], f.parts) for f in fused]
    out.sort(key=lambda f: -f.score)
    return out


def _smoothed_scores(score: Mapping[int, float], neighbours: Mapping[int, Sequence[int | None]],
                     weight: float) -> dict[int, float]:
    """The scores of :func:`smooth_neighbours` (same order as ``score``)."""
    get = score.get
    out: dict[int, float] = {}
    for item, value in score.items():
        near = max((get(n, 0.0) for n in neighbours.get(item, ()) if n is not None), default=0.0)
        out[item] = (value + weight * near) / (1 + weight)
    return out


def boost_threads(score: Mapping[int, float], threads: Mapping[int, Hashable], weight: float) -> dict[int, float]:
    """Each item's score blended with its thread's best score, relative to the best of all:
    ``(score + weight * thread_best / best) / (1 + weight)`` (same order as ``score``).

    Thread-level relevance, as document-level scores help passage retrieval: the
    conversation (or document) whose turns match a query best is likely where the other
    turns it asks about are too, though their own words match less. The thread of an item
    is ``threads[item]``; an item without one is a thread of its own (its own score).
    Scores stay within 0..1.
    """
    if weight <= 0 or not score:
        return dict(score)
    best_of: dict[Hashable, float] = {}
    for item, value in score.items():
        t = threads.get(item)
        if t is not None and value > best_of.get(t, float("-inf")):
            best_of[t] = value
    top = max(score.values())
    scale = 1.0 / top if top > 0 else 0.0
    out: dict[int, float] = {}
    for item, value in score.items():
        t = threads.get(item)
        thread_best = best_of[t] if t is not None else value
        out[item] = (value + weight * thread_best * scale) / (1 + weight)
    return out


def neighbour_map(links: Iterable[tuple[int, int | None, int | None]]) -> dict[int, list[int]]:
    """Both directions of ``(item, previous, next)`` links: each item's known neighbours."""
    out: dict[int, list[int]] = {}
    for item, prev, nxt in links:
        for other in (prev, nxt):
            if other is not None:
                out.setdefault(item, []).append(other)
                out.setdefault(other, []).append(item)
    return out


def fuse_hybrid(semantic: Iterable[Scored], keyword: Iterable[Scored], *, weights: Mapping[str, float],
                reciprocal_rank: bool = False, links: Iterable[tuple[int, int | None, int | None]] | None = None,
                neighbour_weight: float = 0.0, threads: Mapping[int, Hashable] | None = None,
                thread_weight: float = 0.0, limit: int | None = None,
                min_score: float | None = None) -> list[Fused]:
    """The results of a hybrid search, from both retrievers' candidates.

    Args:
        semantic: ``(item, cosine, nearest)`` candidates, best first.
        keyword: ``(item, BM25, cosine)`` candidates, best first; the cosine is None for an
            item without a vector (it ranks last on the semantic side).
        weights: ``"semantic"`` and ``"keyword"`` weights.
        reciprocal_rank: fuse with :func:`rrf` rather than :func:`fuse_convex` (the
            neighbours then lend nothing).
        links: ``(item, previous, next)`` of the candidates whose neighbours are known: each
            borrows ``neighbour_weight`` of its best neighbour's score
            (:func:`smooth_neighbours`; only strong items lend much, and the fused lead is
            almost always among the linked ones).
        threads: the thread of the candidates that have one: each then borrows
            ``thread_weight`` of its thread's best score (:func:`boost_threads`, after the
            neighbours; convex fusion only).
        limit, min_score: the cut (:func:`cut`).

    Returns:
        The cut results, best first; only they become :class:`Fused` objects.
    """
    ann = [(c.item, float(c.score)) for c in semantic if c.flag]
    kw: dict[int, float] = {}
    sem = dict(ann)
    for c in keyword:
        kw[c.item] = float(c.score)
        if not reciprocal_rank and c.flag is not None:
            sem.setdefault(c.item, float(c.flag))
    if reciprocal_rank:
        return list(cut(rrf({"semantic": ann, "keyword": list(kw.items())}, dict(weights)),
                        lambda f: f.score, limit, min_score))
    items = list(dict.fromkeys([*(i for i, _ in ann), *kw]))
    floor = min(sem.values(), default=0.0)  # an item not embedded yet ranks last here
    fused = _convex_scores({"semantic": {i: sem.get(i, floor) for i in items},
                            "keyword": {i: kw.get(i, 0.0) for i in items}}, weights)
    order = _best_first(fused)
    if links is not None:
        fused = _smoothed_scores(fused, neighbour_map(links), neighbour_weight)
        order.sort(key=fused.__getitem__, reverse=True)  # stable: ties keep the fused order
    if threads and thread_weight > 0:
        fused = boost_threads(fused, threads, thread_weight)
        order.sort(key=fused.__getitem__, reverse=True)
    return _ranked(fused, order, {"semantic": sem, "keyword": kw}, limit, min_score)
