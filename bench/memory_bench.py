"""Short-term memory throughput next to the raw Python layer, in the same run.

For 10k and 100k items: ``add`` (filling, then at the bound where every add
evicts), ``recent(10)`` and tag-weighted retrieval (``best``, ``best_all`` over
a tier, ``rank(limit=10)``), each beside the plain-Python operation on the same
data (list append, deque append, list slice, dict lookup of a tag's newest
item) and as a ratio (raw ops/s / memory ops/s: how many times slower the
memory is than the bare container). A naive full scan computing the same
``best`` shows what the tag index saves.

Usage: ``python bench/memory_bench.py [--sizes 10000 100000]``. Runs in well
under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from agents_sdk.memory import MemoryItem, ShortTermMemory

TAGS = [f"tag{i:02d}" for i in range(32)]
QUERY = {"tag03": 1.0, "tag07": 0.5}


def rate(op: Callable[[], object], min_seconds: float = 0.25) -> float:
    """Operations per second of ``op``, repeated for at least ``min_seconds``."""
    n, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(n):
            op()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return n / elapsed
        n *= 2 if elapsed == 0 else max(2, min(10, int(min_seconds / elapsed) + 1))


def make_records(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "action": f"tool{i % 17}",
            "arguments": {"q": f"query {i}"},
            "observation": f"observation {i} " + "x" * rng.randrange(20, 80),
            "tags": rng.sample(TAGS, 2),
        }
        for i in range(n)
    ]


def timed_fill(records: list[dict[str, Any]], add: Callable[[dict[str, Any]], object]) -> float:
    start = time.perf_counter()
    for record in records:
        add(record)
    return len(records) / (time.perf_counter() - start)


def naive_best(items: list[MemoryItem], weights: dict[str, float]) -> MemoryItem | None:
    best: MemoryItem | None = None
    best_score = float("-inf")
    for item in items:  # oldest first, so ">=" keeps the newest on ties
        if not any(weights.get(t, 0.0) > 0 for t in item.tags):
            continue
        score = sum(weights.get(t, 0.0) for t in item.tags)
        if score >= best_score:
            best, best_score = item, score
    return best


def bench(n: int) -> list[tuple[str, float, float | None, str]]:
    records = make_records(n)
    extra = make_records(20_000, seed=11)
    rows: list[tuple[str, float, float | None, str]] = []

    mem = ShortTermMemory(max_items=n)
    mem_fill = timed_fill(records, lambda r: mem.add(**r))
    raw: list[dict[str, Any]] = []
    raw_fill = timed_fill(records, lambda r: raw.append(r))
    rows.append(("add (filling)", mem_fill, raw_fill, "list.append"))

    it = itertools.cycle(extra)
    mem_evict = rate(lambda: mem.add(**next(it)))
    ring: deque[dict[str, Any]] = deque(raw, maxlen=n)
    rit = itertools.cycle(extra)
    raw_evict = rate(lambda: ring.append(next(rit)))
    rows.append(("add (at bound, evicts)", mem_evict, raw_evict, "deque(maxlen).append"))

    rows.append(("recent(10)", rate(lambda: mem.recent(10)), rate(lambda: raw[-10:]), "list[-10:]"))

    by_tag: dict[str, list[MemoryItem]] = {}
    for item in mem:
        for tag in item.tags:
            by_tag.setdefault(tag, []).append(item)
    raw_lookup = rate(lambda: by_tag["tag03"][-1])
    rows.append(("best({2 tags})", rate(lambda: mem.best(QUERY)), raw_lookup, "dict[tag][-1]"))
    rows.append(
        ("rank(limit=10)", rate(lambda: mem.rank(QUERY, limit=10)), raw_lookup, "dict[tag][-1]")
    )
    tier = len(mem.best_all(QUERY))
    rows.append(
        (f"best_all ({tier} items)", rate(lambda: mem.best_all(QUERY)), raw_lookup, "dict[tag][-1]")
    )
    items = mem.items()
    assert naive_best(items, QUERY) is mem.best(QUERY)
    rows.append(
        ("naive scan for best", rate(lambda: naive_best(items, QUERY), 0.1), None, "(for scale)")
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    started = time.perf_counter()
    header = f"{'items':>7}  {'operation':<24} {'memory ops/s':>14} {'raw ops/s':>14} {'raw/mem':>8}  raw op"
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        for name, mem_rate, raw_rate, raw_name in bench(n):
            ratio = f"{raw_rate / mem_rate:8.1f}" if raw_rate else f"{'':>8}"
            raw_text = f"{raw_rate:14,.0f}" if raw_rate else f"{'':>14}"
            print(f"{n:>7,}  {name:<24} {mem_rate:14,.0f} {raw_text} {ratio}  {raw_name}")
    print(f"\n(total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
