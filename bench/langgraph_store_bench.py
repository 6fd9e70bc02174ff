"""LangGraph's store API on both backends: our BlackboardStore next to LangGraph's AsyncPostgresStore.

Both run against the same embedded PostgreSQL (pgvector, HNSW cosine index) and embed with
the same local model (all-MiniLM-L6-v2 on onnxruntime: the same provider objects, wrapped as
LangGraph's async embed function; our worker embeds what is stored with it, and queries with
the query provider its search service uses, which LangGraph's searches use too). Texts are
LoCoMo dialogue turns, queries LoCoMo questions (``../shared/data``; synthetic ones if missing).

* put: ``store.aput(("bench", "one"), key, {"text": ...})`` one by one, alternating the two
  stores put by put (drift and noise hit both); LangGraph embeds inline, so its put returns
  once the item is searchable; ours returns once JetStream acknowledged it, and the worker
  embeds it meanwhile. "Searchable": ours alone puts every text into ("bench", "solo") one by
  one, until every item is embedded and a query of the last one finds it, scored.
* update: the same keys put again (ours: compare-and-set on the revision it remembers).
* batch: ``store.abatch`` of 64 puts (LangGraph: one model call per batch, its best case).
* get: ``store.aget`` of random keys.
* search: ``store.asearch(("bench", "one"), query=q, limit=10)``, each query asked of every
  variant one after the other, the order reversed every other query (ours: semantic, the same
  kind of search as LangGraph's, and hybrid); after an ``ANALYZE`` of the database.

Needs the ``bench`` and ``langgraph`` extras (``pip install -e '.[bench,langgraph]'``).

Usage: python bench/langgraph_store_bench.py [--items 1000] [--queries 100] [--gets 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from _common import add_bus_option, alternate, embedded_stack, percentile
from langgraph.store.base import BaseStore, PutOp
from langgraph_compare import _QUERYING, langgraph_store, load_workload

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardStore
from blackboard.embeddings import provider_from_settings
from blackboard.settings import SearchSettings, WorkerSettings
from blackboard.worker import Worker

_BATCH = 64
_NS = ("bench", "one")


def timed(call: Callable[[int], Awaitable[object]]) -> Callable[[int], Awaitable[float]]:
    async def run(r: int) -> float:
        t = time.perf_counter()
        await call(r)
        return time.perf_counter() - t

    return run


async def puts(lg: BaseStore, ours: BaseStore, texts: Sequence[str], tag: str) -> dict[str, list[float]]:
    """Every text put into both stores, alternating; seconds per put."""
    return await alternate(len(texts), {
        "langgraph": timed(lambda i: lg.aput(_NS, f"k{i}", {"text": texts[i], "v": tag})),
        "ours": timed(lambda i: ours.aput(_NS, f"k{i}", {"text": texts[i], "v": tag})),
    })


async def batches(store: BaseStore, texts: Sequence[str]) -> float:
    """Items per second through ``abatch`` of 64 puts into ("bench", "batch")."""
    t0 = time.perf_counter()
    for i in range(0, len(texts), _BATCH):
        await store.abatch([PutOp(("bench", "batch"), f"k{j}", {"text": texts[j]})
                            for j in range(i, min(i + _BATCH, len(texts)))])
    return len(texts) / (time.perf_counter() - t0)


async def searchable(store: BaseStore, worker: Worker, texts: Sequence[str]) -> float:
    """Items per second put one by one into ("bench", "solo") (this store alone) until every
    one is embedded and a query of the last one finds it, scored."""
    ns = ("bench", "solo")
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        await store.aput(ns, f"k{i}", {"text": text})
    await worker.wait_caught_up(3600, embedded=True, poll=0.05)
    last = f"k{len(texts) - 1}"
    while True:  # polling: the worker signals nothing a client could wait on
        if any(i.key == last and i.score is not None for i in await store.asearch(ns, query=texts[-1], limit=10)):
            break
        await asyncio.sleep(0.05)
    return len(texts) / (time.perf_counter() - t0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--gets", type=int, default=200)
    add_bus_option(ap)
    args = ap.parse_args()
    texts, queries = load_workload(args.items, args.queries)
    async with embedded_stack("bb-lg-store-bench-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(name="lgstore", lag_interval=600),
                              search=SearchSettings(query_cache_size=0)) as (s, bus, pg):
        print(f"langgraph_store_bench: {bus.label}")
        async with provider_from_settings(s.embedding) as provider, \
                provider_from_settings(s.embedding, queries=True) as query_provider:
            await provider.embed(texts[:8])  # load the models outside the timings
            await query_provider.embed(texts[:1])
            async with langgraph_store(pg.dsn, provider, query_provider) as lg, \
                    Worker(s, provider=provider, query_provider=query_provider) as worker, \
                    Agent.connect("bench", settings=s) as agent:
                ours = BlackboardStore(agent, board="langgraph")
                put = await puts(lg, ours, texts, "1")
                await worker.wait_caught_up(3600, embedded=True, poll=0.05)
                ours_searchable = await searchable(ours, worker, texts)
                update = await puts(lg, ours, texts, "2")
                await worker.wait_caught_up(3600, embedded=True, poll=0.05)
                batch = {"langgraph": await batches(lg, texts), "ours": await batches(ours, texts)}
                await worker.wait_caught_up(3600, embedded=True, poll=0.05)
                keys = [f"k{random.randrange(len(texts))}" for _ in range(args.gets)]
                gets = await alternate(len(keys), {
                    "langgraph": timed(lambda i: lg.aget(_NS, keys[i])),
                    "ours": timed(lambda i: ours.aget(_NS, keys[i]))})
                async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
                    await conn.execute("ANALYZE")

                async def lg_search(i: int) -> Any:
                    _QUERYING[0] = True  # LangGraph embeds the query with the query model
                    try:
                        return await lg.asearch(_NS, query=queries[i], limit=10)
                    finally:
                        _QUERYING[0] = False

                hybrid = BlackboardStore(agent, board="langgraph", search_mode="hybrid")
                search = await alternate(len(queries), {
                    "langgraph": timed(lg_search),
                    "ours": timed(lambda i: ours.asearch(_NS, query=queries[i], limit=10)),
                    "ours hybrid": timed(lambda i: hybrid.asearch(_NS, query=queries[i], limit=10))})

        print(f"items: {len(texts)}, queries: {len(queries)}, gets: {len(keys)}; model {provider.model}")
        print(f"{'':36s}{'LangGraph':>11s}{'ours':>11s}{'ours/LG':>10s}")

        def line(label: str, a: float, b: float) -> None:
            print(f"  {label:34s}{a:11.2f}{b:11.2f}{b / a:9.2f}x")

        for name, lat in (("put", put), ("update (put again)", update), ("get", gets)):
            for p in (50, 95):
                line(f"{name} p{p} ms", percentile(lat["langgraph"], p) * 1000, percentile(lat["ours"], p) * 1000)
        lg_rate = len(texts) / sum(put["langgraph"])
        line("one by one, acknowledged/s", lg_rate, len(texts) / sum(put["ours"]))
        line("one by one, searchable/s", lg_rate, ours_searchable)
        line("batches of 64, acknowledged/s", batch["langgraph"], batch["ours"])
        for mode in ("ours", "ours hybrid"):
            for p in (50, 95):
                line(f"search p{p} ms ({mode})", percentile(search["langgraph"], p) * 1000,
                     percentile(search[mode], p) * 1000)
        print("  (put/get/search: lower is better; per second: higher is better. LangGraph's put is searchable")
        print("   when acknowledged; ours once the worker embedded it: 'searchable/s' is ours alone,")
        print("   from its first put until a query finds the last one.)")


if __name__ == "__main__":
    asyncio.run(main())
