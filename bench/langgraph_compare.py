"""The same put-then-search workload through LangGraph's AsyncPostgresStore and through our SDK.

Both systems run against the same embedded PostgreSQL (pgvector, HNSW cosine
index) and embed with the same local model (all-MiniLM-L6-v2 on onnxruntime,
the same provider objects, wrapped as LangGraph's async embed function: the
worker's model for what is stored, and for queries the query provider our
worker makes for its search service (``embedding.quantized_queries``: the
local model's quantised copy), so each system embeds the same texts with the
same model). The texts
are LoCoMo dialogue turns, the queries LoCoMo questions (``../shared/data``),
each query asked once per system and mode; our search service's query cache
is off, so every query pays its embedding on both sides.

* LangGraph: ``store.aput`` one by one (it embeds inline, so a put returns
  once the item is searchable: acknowledged = searchable), then the same with
  ``store.abatch`` of 64 puts (one model call per batch, its best case).
* Ours: ``agent.remember`` one by one (returns once JetStream has it), then
  ``agent.remember_many``; the worker (started before the writes) persists and
  embeds them meanwhile. Searchable = the time until every item is embedded
  and a semantic ``agent.recall`` of the last one finds it.
* Search latency: ``store.asearch(limit=10)`` vs ``agent.recall(top_k=10)``
  (hybrid, the default; semantic, the same kind of search as LangGraph's;
  keyword for reference), both embedding the query (keyword needs none);
  asked after both systems' writes and an ``ANALYZE`` of the database (the
  statistics autovacuum gathers a minute or so after the writes), each query
  of every system and mode one after the other, the order reversed every
  other query, so that drift and noise on a shared machine hit all alike.

Needs the ``bench`` extra (``pip install -e '.[bench]'``).

Usage: python bench/langgraph_compare.py [--items 2000] [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from _common import add_bus_option, alternate, embedded_stack, locomo_dialogs, percentile

from agents_sdk import Agent, MemoryInput
from blackboard.embeddings import EmbeddingProvider, provider_from_settings
from blackboard.settings import (
    SearchSettings,
    WorkerSettings,
)
from blackboard.worker import Worker

_BATCH = 64
#: True while LangGraph searches: its embed function then uses the query model. (A plain
#: flag, not a context variable: the store embeds in a background task of its own; the
#: searches run one at a time.)
_QUERYING = [False]


def load_workload(n_items: int, n_queries: int) -> tuple[list[str], list[str]]:
    """LoCoMo turn texts and questions (synthetic sentences if the data is missing)."""
    texts, queries = locomo_dialogs()
    if len(texts) < n_items:
        texts += [f"note {i}: the team discussed topic {i % 37} and will revisit item {i % 11} next week"
                  for i in range(n_items - len(texts))]
    if len(queries) < n_queries:
        queries += [f"what did the team decide about topic {i % 37}?" for i in range(n_queries - len(queries))]
    # Distinct queries only: each is asked once per system.
    return texts[:n_items], list(dict.fromkeys(queries))[:n_queries]


@asynccontextmanager
async def langgraph_store(dsn: str, provider: EmbeddingProvider,
                          query_provider: EmbeddingProvider) -> AsyncIterator[Any]:
    """LangGraph's AsyncPostgresStore with a pgvector HNSW index, embedding with our model."""
    from langgraph.store.postgres import AsyncPostgresStore

    async def embed(batch: Sequence[str]) -> list[list[float]]:
        one = query_provider if _QUERYING[0] else provider  # a search's query, or what a put stores
        return (await one.embed(list(batch))).tolist()  # type: ignore[no-any-return]

    index = {"dims": provider.dimensions, "embed": embed, "fields": ["text"],
             "ann_index_config": {"kind": "hnsw", "vector_type": "vector"}, "distance_type": "cosine"}
    async with AsyncPostgresStore.from_conn_string(dsn, index=index) as store:  # type: ignore[arg-type]
        await store.setup()
        yield store


async def langgraph_writes(store: Any, texts: Sequence[str]) -> dict[str, float]:
    """``aput`` one by one into ("bench", "one"), then ``abatch`` of 64 into ("bench", "batch")."""
    from langgraph.store.base import PutOp

    out: dict[str, float] = {}
    ns = ("bench", "one")
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        await store.aput(ns, f"k{i}", {"text": text})
    dt = time.perf_counter() - t0
    found = await store.asearch(ns, query=texts[-1], limit=10)
    assert any(item.key == f"k{len(texts) - 1}" for item in found), "LangGraph: last put not found"
    out["one_ack"] = out["one_searchable"] = len(texts) / dt
    ns_b = ("bench", "batch")
    t0 = time.perf_counter()
    for i in range(0, len(texts), _BATCH):
        await store.abatch([PutOp(ns_b, f"k{j}", {"text": texts[j]})
                            for j in range(i, min(i + _BATCH, len(texts)))])
    out["batch_ack"] = out["batch_searchable"] = len(texts) / (time.perf_counter() - t0)
    return out


async def _searchable(agent: Agent, worker: Worker, board: str, last_text: str, last_id: str) -> None:
    await worker.wait_caught_up(3600, embedded=True, poll=0.05)
    while True:
        hits = await agent.recall(last_text, board=board, top_k=10, mode="semantic")
        if any(h.id == last_id for h in hits):
            return
        await asyncio.sleep(0.05)


async def our_writes(agent: Agent, worker: Worker, texts: Sequence[str]) -> dict[str, float]:
    """``agent.remember`` one by one onto board "one", then ``remember_many`` of 64 onto "batch"."""
    out: dict[str, float] = {}
    board = "one"
    t0 = time.perf_counter()
    last = ""
    for text in texts:
        last = await agent.remember(text, board=board)
    t_ack = time.perf_counter()
    await _searchable(agent, worker, board, texts[-1], last)
    t_found = time.perf_counter()
    out["one_ack"] = len(texts) / (t_ack - t0)
    out["one_searchable"] = len(texts) / (t_found - t0)
    board = "batch"
    t0 = time.perf_counter()
    ids: list[str] = []
    for i in range(0, len(texts), _BATCH):
        ids += await agent.remember_many(MemoryInput(text=t, board=board) for t in texts[i:i + _BATCH])
    t_ack = time.perf_counter()
    await _searchable(agent, worker, board, texts[-1], ids[-1])
    t_found = time.perf_counter()
    out["batch_ack"] = len(texts) / (t_ack - t0)
    out["batch_searchable"] = len(texts) / (t_found - t0)
    return out


async def searches(store: Any, agent: Agent, queries: Sequence[str]) -> dict[str, list[float]]:
    """Each query asked of LangGraph and of ours in each mode, one after the other, the order
    reversed every other query (drift and noise hit all four alike); seconds per search."""

    def timed(call: Callable[[str], Awaitable[object]]) -> Callable[[int], Awaitable[float]]:
        async def run(r: int) -> float:
            t = time.perf_counter()
            await call(queries[r])
            return time.perf_counter() - t

        return run

    def ours(mode: str) -> Callable[[str], Awaitable[object]]:
        return lambda q: agent.recall(q, board="one", top_k=10, mode=mode)  # type: ignore[arg-type]

    async def langgraph_search(q: str) -> object:
        _QUERYING[0] = True  # LangGraph embeds the query with the query model
        try:
            return await store.asearch(("bench", "one"), query=q, limit=10)
        finally:
            _QUERYING[0] = False

    return await alternate(len(queries), {
        "langgraph": timed(langgraph_search),
        "hybrid": timed(ours("hybrid")), "semantic": timed(ours("semantic")), "keyword": timed(ours("keyword")),
    })


async def model_rate(provider: EmbeddingProvider, texts: Sequence[str], batch: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        await provider.embed(list(texts[i:i + batch]))
    return len(texts) / (time.perf_counter() - t0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    add_bus_option(ap)
    args = ap.parse_args()
    texts, queries = load_workload(args.items, args.queries)
    # Every query pays its embedding, as in LangGraph (which has no query
    # cache): the same queries are asked once per mode.
    async with embedded_stack("bb-lg-bench-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(name="lgbench", lag_interval=600),
                              search=SearchSettings(query_cache_size=0)) as (s, bus, pg):
        print(f"langgraph_compare: {bus.label}")
        async with provider_from_settings(s.embedding) as provider, \
                provider_from_settings(s.embedding, queries=True) as query_provider:
            await provider.embed(texts[:8])  # load the models outside the timings
            await query_provider.embed(texts[:1])
            raw_model = await model_rate(provider, texts[: min(len(texts), 512)], s.embedding.batch_size)
            async with langgraph_store(pg.dsn, provider, query_provider) as store:
                lg = await langgraph_writes(store, texts)
                async with Worker(s, provider=provider, query_provider=query_provider) as worker, \
                        Agent.connect("bench", settings=s) as agent:
                    ours = await our_writes(agent, worker, texts)
                    # The statistics autovacuum gathers within a minute or so of the
                    # writes, for both systems' tables: the searches measure the steady
                    # state, not the race between autovacuum and the first searches.
                    async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
                        await conn.execute("ANALYZE")
                    lat = await searches(store, agent, queries)
        print(f"items: {len(texts)} LoCoMo turns, queries: {len(queries)}; model {provider.model} "
              f"alone: {raw_model:.1f} texts/s (batch {s.embedding.batch_size})")
        print(f"{'':34s}{'LangGraph':>12s}{'ours':>12s}{'ours/LG':>10s}")

        def line(label: str, a: float, b: float, unit: str) -> None:
            print(f"  {label:32s}{a:10.1f}{unit}{b:10.1f}{unit}{b / a:9.1f}x")

        line("one by one, acknowledged/s", lg["one_ack"], ours["one_ack"], "  ")
        line("one by one, searchable/s", lg["one_searchable"], ours["one_searchable"], "  ")
        line("batches of 64, acknowledged/s", lg["batch_ack"], ours["batch_ack"], "  ")
        line("batches of 64, searchable/s", lg["batch_searchable"], ours["batch_searchable"], "  ")
        for mode in ("hybrid", "semantic", "keyword"):
            for p in (50, 95):
                a = percentile(lat["langgraph"], p) * 1000
                b = percentile(lat[mode], p) * 1000
                verdict = f"{a / b:8.2f}x faster" if b < a else f"{b / a:8.2f}x slower"
                print(f"  search p{p} ms (ours {mode:8s})     {a:10.2f}  {b:10.2f}  {verdict}")
        print("  targets: writes >= 10x (acknowledged), search faster than LangGraph")


if __name__ == "__main__":
    asyncio.run(main())
