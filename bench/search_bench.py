"""Search latency p50/p95 per mode at 100k memories, through the SDK and the NATS service.

The memories are COPYed straight into ``bb_memories``, their vectors into the
local model's space; the HNSW index is built once afterwards and the tables are
ANALYZEd (as autovacuum would). Their texts are pseudo-natural sentences, a
random walk on the word bigrams of the LoCoMo dialogs (``bench/_common.py``:
:class:`Sentences`; a Zipf-distributed made-up vocabulary if the data is
missing), and so are the queries (4-12 words, each query new).

``--vectors model`` (the default): every memory's vector is its text embedded
with the local model, as the worker would. That takes ~9 minutes for 100k texts
on 2 vCPUs, so the vectors are kept in ``~/.cache/blackboard/bench`` (keyed by
model and texts) for the next runs. ``--vectors random``: random unit vectors,
no embedding; an HNSW scan of those is about twice as slow as of real
embeddings at the same ``ef_search`` (no structure to follow), so they
overstate the vector side.

Each (mode, filter) pair is asked two rounds of the same fresh queries: the
first round pays for the query embedding (what a user asking something new
waits for), the second finds the embedding in the search service's query
cache (what the search itself costs; the figure for a repeated query). Raw
layers next to them: a core NATS request/reply round trip, the bare ANN query
in SQL, and one query embedding with the search service's query model alone
(``embedding.quantized_queries``: the local model's quantised copy).

Usage: python bench/search_bench.py [--n 100000] [--queries 300] [--vectors model|random]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from datetime import UTC, datetime, timedelta

import numpy as np
from _common import (
    Sentences,
    add_bus_option,
    embedded_stack,
    load_vectors,
    locomo_dialogs,
    model_vectors,
)
from nats.aio.msg import Msg
from psycopg import sql
from psycopg.types.json import Jsonb

from agents_sdk.search import SearchClient
from blackboard.client.connection import connect_nats
from blackboard.db import open_pool
from blackboard.db.spaces import ann_order, ensure_space
from blackboard.embeddings import provider_from_settings
from blackboard.settings import WorkerSettings
from blackboard.worker import Worker


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _vocab(rng: random.Random, n: int = 3000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--vectors", choices=("model", "random"), default="model",
                    help="the memories' vectors: their texts embedded with the local model (cached), or random")
    add_bus_option(ap)
    args = ap.parse_args()
    rng = random.Random(7)
    turns, _ = locomo_dialogs()
    sentences = Sentences(turns) if turns else None
    if sentences is not None:
        texts = sentences.distinct(args.n, random.Random(11))
    else:
        vocab = _vocab(rng)
        weights = [1 / (i + 1) for i in range(len(vocab))]
        texts = [" ".join(rng.choices(vocab, weights, k=14)) for _ in range(args.n)]
    print(f"texts: {'LoCoMo word bigrams' if sentences else 'made-up Zipf vocabulary (no LoCoMo data)'}; "
          f"vectors: {args.vectors}")
    async with embedded_stack("bb-search-bench-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(lag_interval=600)) as (s, bus, _):
        print(f"search_bench: {bus.label}; the search client is the agent 'bench' (its credential), the raw "
              "request/reply the worker's connection")
        prov = provider_from_settings(s.embedding)
        boards = [f"b{i}" for i in range(20)]
        kinds = ["episodic", "semantic", "procedural", "knowledge"]
        t0 = time.perf_counter()
        async with open_pool(s.postgres) as pool:
            async with pool.connection() as conn:
                space = await ensure_space(conn, prov.model, prov.dimensions)
                now = datetime.now(UTC)
                async with conn.cursor() as cur, cur.copy(
                        "COPY bb_memories (id, board, agent, kind, text, tags, metadata, created_at, updated_at, "
                        "stream, seq, search_text) FROM STDIN") as copy:
                    for i, text in enumerate(texts):
                        at = now - timedelta(milliseconds=args.n - i)  # one a millisecond, oldest first
                        await copy.write_row((f"m{i}", boards[i % 20], f"agent{i % 50}", kinds[(i // 7) % 4], text,
                                              [f"t{(i // 20) % 10}"], Jsonb({"n": i % 100}), at, at, "BB_MEMORY",
                                              i + 1, text))
                await conn.commit()
                if args.vectors == "model":
                    vecs = await model_vectors(prov, texts)
                else:
                    vecs = np.random.default_rng(1).standard_normal((args.n, prov.dimensions)).astype(np.float32)
                    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                index_s = await load_vectors(conn, space, vecs, boards)
                load_s = time.perf_counter() - t0 - index_s
                await conn.execute("ANALYZE bb_memories")
                await conn.commit()
                print(f"{args.n} memories loaded in {load_s:.1f}s, HNSW built in {index_s:.1f}s")
                # raw ANN query
                raw: list[float] = []
                for _ in range(100):
                    q = vecs[rng.randrange(args.n)]
                    t = time.perf_counter()
                    await (await conn.execute(sql.SQL("SELECT item FROM {} ORDER BY " + ann_order(space.dims)
                                                      + " LIMIT 10").format(space.table("memory")),
                                              (q,))).fetchall()
                    raw.append((time.perf_counter() - t) * 1000)
                await conn.rollback()
        asked: set[str] = set()

        def fresh_queries() -> list[str]:
            """Queries not asked before: 4-12 word sentences (5 of the 800 commonest made-up words)."""
            out: list[str] = []
            while len(out) < args.queries:
                if sentences is not None:
                    words = sentences.sentence(rng, max_words=12)
                    q = " ".join(words) if len(words) >= 4 else ""
                else:
                    q = " ".join(rng.choices(vocab[:800], k=5))
                if q and q not in asked:
                    asked.add(q)
                    out.append(q)
            return out

        nc = await connect_nats(s.nats, name="bench-raw")  # the worker's identity (raw request/reply)
        agent_nc = await bus.connect_as("bench", "bench")
        # The search service's own query provider, as a worker makes it (the
        # local model's quantised copy, one text per call).
        qprov = provider_from_settings(s.embedding, queries=True)
        async with prov, qprov, Worker(s, provider=prov, query_provider=qprov):
            emb: list[float] = []
            for qtext in fresh_queries()[:100]:
                t = time.perf_counter()
                await qprov.embed([qtext])
                emb.append((time.perf_counter() - t) * 1000)
            rtt: list[float] = []
            async def echo(msg: Msg) -> None:
                await msg.respond(b"x")

            sub = await nc.subscribe("bench.echo", cb=echo)
            for _ in range(200):
                t = time.perf_counter()
                await nc.request("bench.echo", b"x", timeout=2)
                rtt.append((time.perf_counter() - t) * 1000)
            await sub.unsubscribe()
            client = SearchClient(agent_nc, s, "bench")
            ann95 = _pct(raw, 95)
            print(f"raw: NATS request/reply p50 {_pct(rtt, 50):.2f} ms; ANN top-10 SQL p50 {_pct(raw, 50):.2f} / "
                  f"p95 {ann95:.2f} ms; one query embedding (model alone) p50 {_pct(emb, 50):.2f} / "
                  f"p95 {_pct(emb, 95):.2f} ms")
            print("mode     filter          new query (model + search)      repeated query (search only)")
            for mode in ("keyword", "semantic", "hybrid"):
                for label, kw in (("no filter", {}), ("board filter", {"board": "b3"}),
                                  # ~125 memories of 100k: a selective filter
                                  ("board+tag+kind", {"board": "b3", "tags_any": ["t3"], "kind": "semantic"})):
                    queries = fresh_queries()
                    rounds: list[list[float]] = []
                    for _ in range(2):
                        lat: list[float] = []
                        for qtext in queries:
                            t = time.perf_counter()
                            await client.recall(qtext, mode=mode, top_k=10, **kw)
                            lat.append((time.perf_counter() - t) * 1000)
                        rounds.append(lat)
                    cold, warm = rounds
                    print(f"{mode:8s} {label:15s} p50 {_pct(cold, 50):6.2f} p95 {_pct(cold, 95):6.2f} ms"
                          f"          p50 {_pct(warm, 50):6.2f} p95 {_pct(warm, 95):6.2f} ms"
                          f"   (p95 / raw ANN p95: {_pct(cold, 95) / ann95:.1f}x, {_pct(warm, 95) / ann95:.1f}x)")
            print("target: hybrid p95 <= 10 ms at 100k memories")
        await nc.close()
        await agent_nc.close()


if __name__ == "__main__":
    asyncio.run(main())
