"""Recall and latency of the HNSW index per ``ef_search``, against the exact answer, at 100k vectors.

What the ``search.ef_search`` (semantic search, default 100) and
``search.hybrid_ef_search`` (the vector half of hybrid search, default 64, which
asks for 50 candidates) settings trade: the share of the true nearest
neighbours an index scan finds, for its time.

The vectors are those of ``bench/search_bench.py``: pseudo-natural sentences
made from the LoCoMo dialogs, embedded with the local model (cached in
``~/.cache/blackboard/bench``; the first run embeds them, ~9 minutes for 100k
on 2 vCPUs), in the model's embedding space table with the index the worker
builds (pgvector's HNSW on the vectors cast to ``halfvec``, ``m`` 16, ``ef_construction`` 64,
cosine). The queries
are real questions (LoCoMo's), embedded by the search service's query model
(``embedding.quantized_queries``). The exact answer (the raw layer): the top k
by cosine over all vectors, computed with numpy.

Usage: python bench/hnsw_recall.py [--n 100000] [--queries 500] [--ef 40,64,100,200] [--k 10,50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np
from _common import (
    Sentences,
    add_bus_option,
    embedded_stack,
    load_vectors,
    locomo_dialogs,
    model_vectors,
    percentile,
)
from psycopg import sql

from blackboard.db import open_pool
from blackboard.db.spaces import ann_order, ensure_space
from blackboard.embeddings import provider_from_settings
from blackboard.settings import SearchSettings, WorkerSettings


def _exact_top(vecs: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    """Item ids (1-based, as stored) of each query's ``k`` nearest vectors by cosine (unit vectors)."""
    out: list[set[int]] = []
    for i in range(0, len(queries), 64):
        sims = queries[i:i + 64] @ vecs.T
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        out += [{int(j) + 1 for j in row} for row in top]
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--ef", default="40,64,100,200", help="ef_search values, comma-separated")
    ap.add_argument("--k", default="10,50", help="result counts (LIMIT), comma-separated")
    add_bus_option(ap)
    args = ap.parse_args()
    efs = [int(x) for x in args.ef.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    turns, questions = locomo_dialogs()
    if not turns:
        raise SystemExit("needs the LoCoMo data in ../shared/data/locomo")
    texts = Sentences(turns).distinct(args.n, random.Random(11))
    questions = list(dict.fromkeys(questions))[: args.queries]
    async with embedded_stack("bb-hnsw-recall-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(lag_interval=600)) as (s, _, _):
        async with provider_from_settings(s.embedding) as prov, \
                provider_from_settings(s.embedding, queries=True) as qprov:
            vecs = await model_vectors(prov, texts)
            queries = np.stack([(await qprov.embed([q]))[0] for q in questions]).astype(np.float32)
        truth = {k: _exact_top(vecs, queries, k) for k in ks}
        async with open_pool(s.postgres) as pool, pool.connection() as conn:
            space = await ensure_space(conn, prov.model, prov.dimensions)
            table = space.table("memory")
            built = await load_vectors(conn, space, vecs, ["b"])
            await conn.set_autocommit(True)
            print(f"{len(vecs)} vectors ({prov.model}), HNSW built in {built:.0f}s; "
                  f"{len(queries)} LoCoMo questions (query model)")
            query = sql.SQL("SELECT item FROM {} ORDER BY " + ann_order(space.dims) + " LIMIT %s").format(table)
            defaults = SearchSettings()
            print(f"{'ef_search':>9s} {'k':>4s} {'recall':>8s} {'p5':>6s} {'p50 ms':>8s} {'p95 ms':>8s}")
            for ef in efs:
                await conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
                for k in ks:
                    recall: list[float] = []
                    lat: list[float] = []
                    for qi in range(len(queries)):
                        t = time.perf_counter()
                        rows = await (await conn.execute(query, (queries[qi], k))).fetchall()
                        lat.append((time.perf_counter() - t) * 1000)
                        recall.append(len({int(r[0]) for r in rows} & truth[k][qi]) / k)
                    mark = ("  <- search.ef_search" if ef == defaults.ef_search and k == 10 else
                            "  <- search.hybrid_ef_search" if ef == defaults.hybrid_ef_search and k == 50 else "")
                    print(f"{ef:9d} {k:4d} {np.mean(recall):8.4f} {percentile(recall, 5):6.2f} "
                          f"{percentile(lat, 50):8.2f} {percentile(lat, 95):8.2f}{mark}")
            print("raw layer: the exact top k (numpy, all vectors): recall 1 by definition")


if __name__ == "__main__":
    asyncio.run(main())
