"""Short-term memory throughput next to the raw Python layer, in the same run.

For 10k and 100k items: ``add`` (filling, then at the bound where every add
evicts), ``recent(10)`` and tag-weighted retrieval (``best``, ``best_all`` over
a tier, ``rank(limit=10)``), each beside the plain-Python operation on the same
data (list append, deque append, list slice, dict lookup of a tag's newest
item) and as a ratio (raw ops/s / memory ops/s: how many times slower the
memory is than the bare container). A naive full scan computing the same
``best`` shows what the tag index saves.

The ``facade`` section measures ``agent.memory`` (docs/memory.md, "The memory toolkit")
against a real stack (an embedded nats-server and PostgreSQL with a worker embedding with
the local model, as ``blackboard dev`` runs them), each figure next to the raw layer beneath
it, measured in the same run, query by query in alternating order (``_common.alternate``):

* ``memory.search`` of the local layers (short_term + working, lexical) next to
  ``ShortTermMemory.rank`` (the tag index the layer has) and a plain scan scoring the same
  words over the same items (what the facade adds to the work itself);
* ``memory.search`` with the long_term layer (short_term + working + long_term, and
  long_term alone) next to ``agent.recall`` with the same query and filters (board, author):
  p50/p99 with and without the long_term layer; the search cache off (``cache_ttl=0``), then
  on with repeated queries (its hit rate);
* ``memory.context`` rendering (a conversation store on the same board attached for the
  stage, its hits rendered within the token budget) next to the store's own search, and
  next to that search followed by ``attachments.render_related`` of its hits; the rendering
  alone next to the search.

Usage: ``python bench/memory_bench.py [--sizes 10000 100000] [--sections short_term facade]
[--long-term 2000] [--short-term 1000] [--queries 200]``. The short_term section runs in
well under a minute on 2 cores; the facade section embeds ``--long-term`` texts first.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from _common import Table, add_bus_option, alternate, embedded_stack, locomo_dialogs, percentile

from agents_sdk import Agent
from agents_sdk.memory import MemoryItem, ShortTermMemory
from agents_sdk.memory.longterm import MemoryInput
from blackboard.embeddings import provider_from_settings
from blackboard.settings import AgentMemorySettings, SearchSettings, WorkerSettings
from blackboard.worker import Worker

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


# ------------------------------------------------------------------ the facade
BOARD = "membench"
STORE = "notes"
_WORD = re.compile(r"[a-z]{4,}")


def workload(n_long: int, n_short: int, n_queries: int) -> tuple[list[str], list[str], list[str]]:
    """Long-term texts, short-term observations (LoCoMo turns; synthetic when the data is
    missing) and distinct queries (LoCoMo questions)."""
    texts, questions = locomo_dialogs()
    need = n_long + n_short
    if len(texts) < need:
        texts += [f"note {i}: the team discussed topic {i % 37} and will revisit item {i % 11} next week"
                  for i in range(need - len(texts))]
    if len(questions) < n_queries:
        questions += [f"what did the team decide about topic {i % 37}?" for i in range(n_queries - len(questions))]
    return texts[:n_long], texts[n_long:need], list(dict.fromkeys(questions))[:n_queries]


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def timed(call: Callable[[int], Awaitable[object] | object]) -> Callable[[int], Awaitable[float]]:
    """Seconds one call takes (awaited when it returns an awaitable)."""
    async def run(i: int) -> float:
        t = time.perf_counter()
        result = call(i)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result
        return time.perf_counter() - t

    return run


def scan(items: Sequence[MemoryItem], terms: set[str], limit: int = 10) -> list[tuple[int, MemoryItem]]:
    """The plain loop beneath the facade's short-term search: every item's text, the query's
    words it holds, the best ``limit``."""
    scored = []
    for item in items:
        hit = len(terms.intersection(words_of(str(item.observation))))
        if hit:
            scored.append((hit, item))
    scored.sort(key=lambda pair: -pair[0])
    return scored[:limit]


async def facade_bench(args: argparse.Namespace) -> None:
    from agents_sdk.memory import AgentMemory
    from agents_sdk.memory.attachments import render_related
    from agents_sdk.memory.stores import ConversationOptions, ConversationStore

    long_texts, short_texts, queries = workload(args.long_term, args.short_term, args.queries)
    async with embedded_stack("bb-memory-bench-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(name="membench", lag_interval=600),
                              search=SearchSettings(query_cache_size=0)) as (s, bus, _pg):
        print(f"\nagent.memory (facade) on a real stack: {bus.label}")
        async with provider_from_settings(s.embedding) as provider, \
                provider_from_settings(s.embedding, queries=True) as query_provider:
            await provider.embed(long_texts[:8])  # load the models outside the timings
            await query_provider.embed(queries[:1])
            async with Worker(s, provider=provider, query_provider=query_provider) as worker, \
                    Agent.connect("bench-memory", settings=s) as agent:
                t0 = time.perf_counter()
                await agent.remember_many(
                    (MemoryInput(text, board=BOARD, tags=[f"store:{STORE}"], metadata={"store": STORE})
                     for text in long_texts), wait="searchable", timeout=3600)
                await worker.wait_caught_up(3600, embedded=True, poll=0.05)
                print(f"{len(long_texts)} long-term memories stored and embedded in "
                      f"{time.perf_counter() - t0:.1f} s ({provider.model})")
                base = AgentMemorySettings(long_term_board=BOARD, shared_boards=[], cache_ttl=0.0,
                                           short_term_max_items=max(len(short_texts), 16), auto_summarize=False)
                memory = AgentMemory(agent, base)
                rng = random.Random(5)
                for i, text in enumerate(short_texts):
                    memory.short_term.add(action=f"tool{i % 17}", observation=text, tags=rng.sample(TAGS, 2))
                for i in range(min(50, len(short_texts))):
                    memory.working.set(f"note{i}", short_texts[i])
                items = memory.short_term.items()
                store = ConversationStore(agent, STORE, ConversationOptions(board=BOARD, own_only=True))
                memory.attach(store, stages=("pre",), top_k=10)
                cached = AgentMemory(agent, base.model_copy(update={"cache_ttl": 60.0}))
                weights = [dict.fromkeys(rng.sample(TAGS, 2), 1.0) for _ in queries]
                terms = [set(words_of(q)) for q in queries]
                local = ["short_term", "working"]
                hits = [await store.search(q, 10, 0.0) for q in queries[:1]]  # warm the search path

                async def context_render(i: int) -> object:
                    hits[0] = await store.search(queries[i], 10, 0.0)
                    return render_related(hits[0], budget=base.context_budget, counter=memory.counter)

                lat = await alternate(len(queries), {
                    "search local": timed(lambda i: memory.search(queries[i], layers=local)),  # type: ignore[arg-type]
                    "rank": timed(lambda i: memory.short_term.rank(weights[i], limit=10)),
                    "scan": timed(lambda i: scan(items, terms[i])),
                    "search local+lt": timed(lambda i: memory.search(
                        queries[i], layers=[*local, "long_term"])),  # type: ignore[list-item]
                    "search lt": timed(lambda i: memory.search(queries[i], layers=["long_term"])),
                    "recall": timed(lambda i: agent.recall(queries[i], board=BOARD, author=agent.id, top_k=10)),
                    "context": timed(lambda i: memory.context("pre", queries[i])),
                    "store search": timed(lambda i: store.search(queries[i], 10, 0.0)),
                    "store search + render": timed(context_render),
                })
                # the cache: each of 10 queries asked 1 + repeats times
                repeats = max(1, len(queries) // 10)
                cache_lat = await alternate(10 * repeats, {
                    "search lt cached": timed(lambda i: cached.search(queries[i % 10], layers=["long_term"])),
                    "recall": timed(lambda i: agent.recall(queries[i % 10], board=BOARD, author=agent.id,
                                                           top_k=10)),
                })
                render = await alternate(len(queries), {
                    "render_related": timed(lambda i: render_related(hits[0], budget=base.context_budget,
                                                                     counter=memory.counter)),
                    "join": timed(lambda i: "\n".join(["## Related memories", *(f"- [{h.source}] {h.text}"
                                                                                for h in hits[0])])),
                })
                metrics = cached.metrics()
                await memory.close()
                await cached.close()

    table = Table(f"{len(queries)} queries; {len(short_texts)} short-term items, "
                  f"{min(50, len(short_texts))} working notes, {len(long_texts)} long-term memories; "
                  "p50 / p99 of each, in alternating order", measured_label="agent.memory",
                  baseline_label="raw layer")

    def pair(name: str, measured: list[float], baseline: list[float], raw: str, unit: str = "ms") -> None:
        for p in (50, 99):
            table.add(f"{name} p{p}", percentile(measured, p), percentile(baseline, p), unit, note=raw)

    pair("search short_term+working", lat["search local"], lat["rank"], "ShortTermMemory.rank(2 tags, 10)", "us")
    pair("search short_term+working", lat["search local"], lat["scan"], "plain word scan of the items", "us")
    pair("search st+wm+long_term", lat["search local+lt"], lat["recall"], "agent.recall (board, author)")
    pair("search long_term", lat["search lt"], lat["recall"], "agent.recall (board, author)")
    pair("search long_term, cached", cache_lat["search lt cached"], cache_lat["recall"],
         f"agent.recall; cache hit rate {metrics.cache_hit_rate:.2f}")
    pair("context('pre') render", lat["context"], lat["store search"], "the store's search alone")
    pair("context('pre') render", lat["context"], lat["store search + render"], "store search + render_related")
    pair("render_related (10 hits)", render["render_related"], render["join"],
         "str.join of the same lines, no budget", "us")
    print(table.render())
    print("(ratio = agent.memory / raw layer: how many times the raw layer's latency)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--sections", nargs="+", choices=["short_term", "facade"], default=["short_term", "facade"])
    parser.add_argument("--long-term", type=int, default=2000, help="long-term memories (facade section)")
    parser.add_argument("--short-term", type=int, default=1000, help="short-term items (facade section)")
    parser.add_argument("--queries", type=int, default=200, help="queries (facade section)")
    add_bus_option(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    if "short_term" in args.sections:
        header = f"{'items':>7}  {'operation':<24} {'memory ops/s':>14} {'raw ops/s':>14} {'raw/mem':>8}  raw op"
        print(header)
        print("-" * len(header))
        for n in args.sizes:
            for name, mem_rate, raw_rate, raw_name in bench(n):
                ratio = f"{raw_rate / mem_rate:8.1f}" if raw_rate else f"{'':>8}"
                raw_text = f"{raw_rate:14,.0f}" if raw_rate else f"{'':>14}"
                print(f"{n:>7,}  {name:<24} {mem_rate:14,.0f} {raw_text} {ratio}  {raw_name}")
    if "facade" in args.sections:
        asyncio.run(facade_bench(args))
    print(f"\n(total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
