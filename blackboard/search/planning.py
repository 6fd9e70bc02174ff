"""Query planning from ANALYZE's statistics (pure): which words generate keyword
candidates, how many items the filtered boards hold, and whether to scan them exactly;
and how many nearest vectors the semantic probe takes to keep ``top_k`` current memories
(:func:`probe_depth`, from the share the recent probes dropped: :class:`DropRate`).

The search engine reads the statistics (:func:`blackboard.db.search_sql.term_stats_query`,
:func:`~blackboard.db.search_sql.board_stats_query`) and caches them a while; the
decisions are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["EXACT_MAX_SHARE", "BoardStats", "DropRate", "TermStats", "board_rows", "board_share",
           "candidate_lexemes", "exact_scan", "probe_depth"]

#: Largest share of a table's items that the filtered boards may hold for an exact board scan: above
#: it, the HNSW scan keeps so many of the vectors it visits that it is the cheaper one (measured: a
#: board with half of 4,000 memories, 4.4 ms p50 through HNSW vs 8.7 ms exactly, including the model).
EXACT_MAX_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class TermStats:
    """How often lexemes occur in a table's ``tsv`` (ANALYZE's most common elements)."""

    freqs: Mapping[str, float]
    rows: float
    at: float = 0.0


def candidate_lexemes(lexemes: Sequence[str], stats: TermStats | None, max_rows: int,
                      budget: float | None = None, share: float = 1.0) -> list[str]:
    """The query lexemes that generate keyword candidates.

    A lexeme estimated to match more than ``max_rows`` items is left out when
    a rarer one remains (it would cost a scan of most of the table for an
    inverse document frequency near zero); when all are that frequent, the
    rarest one is kept. Of the others, the rarest are kept while their
    estimated matches add up to at most ``budget`` (the rarest one always):
    the candidates a query can score are bounded, and those left out match
    only commoner words, so they could score but little; a plain ``LIMIT`` on
    the candidates would drop arbitrary ones instead (the oldest rows come
    first), the best matches among them. Estimates are of the whole table
    times ``share`` (the filtered boards' part of it). Without statistics
    every lexeme is kept.
    """
    if stats is None or stats.rows <= 0:
        return list(lexemes)
    est = {lx: stats.freqs.get(lx, 0.0) * stats.rows * share for lx in lexemes}
    kept = [lx for lx in lexemes if est[lx] <= max_rows]
    if not kept:
        return [min(lexemes, key=lambda lx: est[lx])] if lexemes else []
    if budget is None:
        return kept
    chosen: set[str] = set()
    total = 0.0
    for lx in sorted(kept, key=lambda lx: est[lx]):
        if chosen and total + est[lx] > budget:
            break
        chosen.add(lx)
        total += est[lx]
    return [lx for lx in kept if lx in chosen]


@dataclass(frozen=True, slots=True)
class BoardStats:
    """How a table's items spread over boards (ANALYZE's statistics of its ``board`` column).

    ``freqs``: share of the rows of each most common board; ``n_distinct``:
    PostgreSQL's estimate of distinct boards (negative: a share of the rows;
    0: unknown); ``rows``: the table's estimated row count (negative: never
    counted).
    """

    freqs: Mapping[str, float]
    n_distinct: float
    rows: float
    at: float = 0.0


def board_rows(boards: Iterable[str], stats: BoardStats | None) -> float | None:
    """Estimated items of ``boards`` (the planner's formula), None if unknown.

    A board among the most common ones has its measured share; any other gets
    an equal part of what the common ones leave. Without column statistics
    every board may hold the whole table.
    """
    if stats is None or stats.rows < 0:
        return None
    rest = max(0.0, 1.0 - sum(stats.freqs.values())) * stats.rows
    distinct = stats.n_distinct if stats.n_distinct > 0 else -stats.n_distinct * stats.rows
    others = distinct - len(stats.freqs)
    per_other = rest / others if others >= 1 else rest
    total = sum(stats.freqs[b] * stats.rows if b in stats.freqs else per_other for b in set(boards))
    return min(total, stats.rows)


def exact_scan(boards: Sequence[str], stats: BoardStats | None, max_rows: int) -> bool:
    """Whether to scan the vectors of ``boards`` exactly rather than through the HNSW index:
    a board filter, estimated to hold at most ``max_rows`` items (0: never) and at most
    :data:`EXACT_MAX_SHARE` of the table (a filtered HNSW scan visits about 1 / share
    vectors for each one it keeps; a large share keeps most of them)."""
    if not boards or max_rows <= 0:
        return False
    rows = board_rows(boards, stats)
    return rows is not None and stats is not None and rows <= max_rows and rows <= EXACT_MAX_SHARE * stats.rows


def board_share(boards: Sequence[str], stats: BoardStats | None) -> float:
    """The estimated share of the items that ``boards`` hold (1.0 without a board filter or
    statistics)."""
    if not boards:
        return 1.0
    rows = board_rows(boards, stats)
    return 1.0 if rows is None or stats is None or stats.rows <= 0 else rows / stats.rows


#: Most nearest vectors the semantic probe takes, as a multiple of the rows asked for.
PROBE_MAX_FACTOR = 4


def probe_depth(limit: int, dropped: float) -> int:
    """How many nearest vectors the semantic probe of the common memory query takes to return
    ``limit`` current memories when a share ``dropped`` (0..1) of the nearest is not current
    (superseded, archived, contested): ``limit`` itself when none is, else enough for the
    expected losses with a quarter to spare, at most :data:`PROBE_MAX_FACTOR` times ``limit``.
    When the probe still comes back short the engine re-runs the query with the conditions in
    the scan, so this only makes that rarer."""
    if dropped <= 0.0:
        return limit
    kept = max(1.0 - min(dropped, 0.75), 0.25)
    return min(limit * PROBE_MAX_FACTOR, int(limit / kept * 1.25) + 1)


class DropRate:
    """The share of the nearest vectors that the semantic probe dropped, as an exponential moving
    average over recent searches (weight ``alpha`` for the newest); below ``floor`` it counts as 0,
    so a board without superseded or archived memories keeps the probe at ``limit``."""

    __slots__ = ("alpha", "floor", "value")

    def __init__(self, alpha: float = 0.1, floor: float = 0.002) -> None:
        self.alpha = alpha
        self.floor = floor
        self.value = 0.0

    def note(self, probed: int, dropped: int) -> None:
        """One probe: ``probed`` rows came back, ``dropped`` of them not current."""
        if probed > 0:
            self.value += self.alpha * (dropped / probed - self.value)
            if self.value < self.floor:
                self.value = 0.0
