"""What ``agent.memory.metrics()`` reports: retrieval latency, the search cache, how often
recalled memories were used, sizes and pruned counts (docs/memory.md, "Settings and metrics").

:class:`MetricsRecorder` is the mutable tally the facade feeds; :class:`MemoryMetrics` is
its frozen snapshot. Pure: no clock of its own (the facade measures the latencies).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LatencyStats", "MemoryMetrics", "MetricsRecorder", "percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ascending values; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Retrieval latencies in milliseconds over the last ``metrics_window`` retrievals."""

    count: int = 0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Iterable[float]) -> LatencyStats:
        ordered = sorted(values)
        if not ordered:
            return cls()
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 95), percentile(ordered, 99),
                   ordered[-1])

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "p50": round(self.p50, 3), "p95": round(self.p95, 3),
                "p99": round(self.p99, 3), "max": round(self.max, 3)}


@dataclass(frozen=True, slots=True)
class MemoryMetrics:
    """A snapshot of ``agent.memory``'s metrics.

    Attributes:
        latency: every retrieval (``search``, ``context``), in ms.
        latency_by_layer: per layer (and ``store:<name>``), in ms.
        cache_hits, cache_misses: the long_term/shared search cache (``cache_ttl``,
            ``cache_size``); ``cache_hit_rate`` hits / lookups (0.0 before any).
        recalled: distinct ids returned by ``search`` or rendered by ``context``.
        used: the recalled ids marked used (``mark_used``, or rendered by ``context``
            then ``mark_step(success=True)``); ``used_rate`` used / recalled.
        sizes: ``short_term_items``, ``short_term_bytes``, ``working_items``, and
            ``store:<name>`` per attached store.
        pruned: memories or items pruned (or replaced by a summary), by layer.
        router_fallbacks: times the LLM router fell back to the rules.
    """

    latency: LatencyStats = LatencyStats()
    latency_by_layer: Mapping[str, LatencyStats] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_rate: float = 0.0
    recalled: int = 0
    used: int = 0
    used_rate: float = 0.0
    sizes: Mapping[str, int] = field(default_factory=dict)
    pruned: Mapping[str, int] = field(default_factory=dict)
    router_fallbacks: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The metrics as JSON-ready values."""
        return {"latency_ms": self.latency.as_dict(),
                "latency_ms_by_layer": {k: v.as_dict() for k, v in self.latency_by_layer.items()},
                "cache": {"hits": self.cache_hits, "misses": self.cache_misses,
                          "hit_rate": round(self.cache_hit_rate, 4)},
                "recalled": self.recalled, "used": self.used, "used_rate": round(self.used_rate, 4),
                "sizes": dict(self.sizes), "pruned": dict(self.pruned), "router_fallbacks": self.router_fallbacks}


class MetricsRecorder:
    """The tally behind :class:`MemoryMetrics` (one per ``agent.memory``).

    Args:
        window: latencies kept for the percentiles (the newest).
    """

    #: Distinct recalled ids remembered (the oldest are forgotten past it, so an agent that
    #: runs for weeks holds a bounded set; the counts keep growing).
    MAX_IDS = 65536

    def __init__(self, window: int = 2048, *, max_ids: int = MAX_IDS) -> None:
        self._window = window
        self._max_ids = max_ids
        self._latency: deque[float] = deque(maxlen=window)
        self._by_layer: dict[str, deque[float]] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        #: recalled id -> whether it was used (insertion order: the oldest first).
        self._recalled: OrderedDict[str, bool] = OrderedDict()
        self._recalled_count = 0
        self._used_count = 0
        #: Ids rendered by ``context`` since the last ``mark_step``.
        self._rendered: set[str] = set()
        self._pruned: Counter[str] = Counter()

    def retrieval(self, ms: float, layer: str | None = None) -> None:
        """One retrieval took ``ms`` (overall when ``layer`` is None, else for that layer)."""
        if layer is None:
            self._latency.append(ms)
            return
        values = self._by_layer.get(layer)
        if values is None:
            values = self._by_layer[layer] = deque(maxlen=self._window)
        values.append(ms)

    def cache(self, hit: bool) -> None:
        if hit:
            self.cache_hits += 1
        else:
            self.cache_misses += 1

    def recalled(self, ids: Iterable[str]) -> None:
        for i in ids:
            if i not in self._recalled:
                self._recalled[i] = False
                self._recalled_count += 1
                if len(self._recalled) > self._max_ids:
                    self._recalled.popitem(last=False)

    def rendered(self, ids: Iterable[str]) -> None:
        """Ids put into a prompt by ``context``: recalled, and used if the step succeeds."""
        ids = list(ids)
        self.recalled(ids)
        self._rendered.update(ids)

    def used(self, ids: Iterable[str]) -> None:
        """Ids the agent used (counted only when they were recalled, once each)."""
        for i in ids:
            if self._recalled.get(i) is False:
                self._recalled[i] = True
                self._used_count += 1

    def step(self, success: bool) -> None:
        """The step ended: on success what was rendered since the last step counts as used."""
        if success:
            self.used(self._rendered)
        self._rendered.clear()

    def pruned(self, layer: str, count: int) -> None:
        if count:
            self._pruned[layer] += count

    def snapshot(self, sizes: Mapping[str, int], router_fallbacks: int = 0,
                 cache: tuple[int, int] | None = None) -> MemoryMetrics:
        """The metrics now; ``cache`` (hits, misses) adds a cache's own counts to those of :meth:`cache`."""
        hits, misses = cache or (0, 0)
        hits, misses = hits + self.cache_hits, misses + self.cache_misses
        lookups = hits + misses
        recalled, used = self._recalled_count, self._used_count
        return MemoryMetrics(
            latency=LatencyStats.of(self._latency),
            latency_by_layer={k: LatencyStats.of(v) for k, v in sorted(self._by_layer.items())},
            cache_hits=hits, cache_misses=misses, cache_hit_rate=hits / lookups if lookups else 0.0,
            recalled=recalled, used=used, used_rate=used / recalled if recalled else 0.0,
            sizes=dict(sizes), pruned=dict(self._pruned), router_fallbacks=router_fallbacks)
