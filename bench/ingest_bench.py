"""Worker ingest throughput next to the raw layers, measured in one run.

* raw pull-consume: a durable pull consumer fetching 512 and acking each message;
* worker: JetStream -> committed rows (decode, COPY, move, ack), embeddings off;
* raw COPY: the same decoded rows written by the worker's writer, no NATS;
* embeddings: the local model's raw batch throughput, then the worker's
  queue -> model -> vectors-in-HNSW-table path on the same texts.

Usage: python bench/ingest_bench.py [--entries 20000] [--memories 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from blackboard import codec
from blackboard.connection import connect_nats
from blackboard.db import migrate, open_pool
from blackboard.embedded import EmbeddedNats, EmbeddedPostgres
from blackboard.settings import NatsSettings, PostgresSettings, Settings, WorkerSettings
from blackboard.streams import ensure_streams
from blackboard.subjects import Subjects
from blackboard.worker import Worker
from blackboard.worker.handlers import write_entries
from blackboard.worker.ingest import to_raw


def _entry(i: int) -> bytes:
    return codec.encode({"v": 1, "value": {"i": i, "text": f"entry number {i} of the ingest benchmark"},
                         "content_type": "application/json", "tags": ["bench"], "metadata": {"n": i},
                         "author": "bench", "created_at": datetime.now(UTC)})


async def _publish(settings: Settings, board: str, n: int) -> None:
    nc = await connect_nats(settings.nats, name="bench-pub")
    js = nc.jetstream()
    subj = Subjects(settings.board.bucket)
    futs = [await js.publish_async(subj.entry(board, "s", f"k{i}"), _entry(i)) for i in range(n)]
    await asyncio.gather(*futs)
    await nc.close()


async def raw_consume(settings: Settings, board: str, n: int) -> tuple[float, list[object]]:
    nc = await connect_nats(settings.nats, name="bench-raw")
    js = nc.jetstream()
    subj = Subjects(settings.board.bucket)
    psub = await js.pull_subscribe(subj.entry_filter(board), durable="raw-bench", stream=subj.kv_stream)
    got: list[object] = []
    t0 = time.perf_counter()
    while len(got) < n:
        msgs = await psub.fetch(512, timeout=1)
        for m in msgs:
            await m.ack()
        got.extend(msgs)
    dt = time.perf_counter() - t0
    await nc.close()
    return n / dt, got


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--memories", type=int, default=1000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bb-ingest-bench-"))
    os.chmod(root, 0o755)
    ns = EmbeddedNats(root / "nats", port=0, sync_interval="1s")
    pg = EmbeddedPostgres(root / "pg", port=0)
    ns.start()
    pg.start()
    try:
        s = Settings().model_copy(update={
            "nats": NatsSettings(url=ns.url), "postgres": PostgresSettings(dsn=pg.dsn),  # type: ignore[arg-type]
            "worker": WorkerSettings(embed=False, serve_search=False, lag_interval=600)})
        await migrate(s)
        nc = await connect_nats(s.nats, name="setup")
        await ensure_streams(nc.jetstream(), s)
        await nc.close()
        n = args.entries
        # 1. raw pull-consume
        await _publish(s, "rawboard", n)
        raw_rate, msgs = await raw_consume(s, "rawboard", n)
        # 2. raw COPY of the same rows (decoded once, outside the timing)
        from blackboard.worker.handlers import default_handlers
        decode = default_handlers(s)[0].decode
        rows = [decode(to_raw(m)) for m in msgs]  # type: ignore[arg-type]
        async with open_pool(s.postgres) as pool:
            t0 = time.perf_counter()
            for i in range(0, len(rows), 512):
                async with pool.connection() as conn, conn.transaction():
                    await write_entries(conn, rows[i:i + 512])
            copy_rate = n / (time.perf_counter() - t0)
        # 3. the worker, JetStream -> committed rows
        await _publish(s, "workerboard", n)
        t0 = time.perf_counter()
        async with Worker(s) as w:
            await w.wait_caught_up(600, poll=0.01)
            worker_rate = (2 * n) / (time.perf_counter() - t0)  # it also re-reads rawboard's n entries
        print(f"entries: {n} (worker consumes both boards: {2 * n} messages)")
        print(f"  raw pull-consume (fetch 512, ack each): {raw_rate:9.0f} msg/s")
        print(f"  raw COPY of decoded rows (writer only): {copy_rate:9.0f} rows/s")
        print(f"  worker JetStream -> committed rows:     {worker_rate:9.0f} rows/s"
              f"   = {worker_rate / raw_rate:.2f}x raw consume (target >= 0.8x),"
              f" {worker_rate / copy_rate:.2f}x raw COPY")
        if args.memories:
            await _embed_bench(s, args.memories)
    finally:
        pg.stop()
        ns.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _embed_bench(s: Settings, n: int) -> None:
    from blackboard.embeddings import provider_from_settings

    texts = [f"memory {i}: the team discussed topic {i % 37} and decided to revisit item {i % 11} next week"
             for i in range(n)]
    async with provider_from_settings(s.embedding) as prov:
        await prov.embed(texts[:8])  # load the model
        t0 = time.perf_counter()
        for i in range(0, n, s.embedding.batch_size):
            await prov.embed(texts[i:i + s.embedding.batch_size])
        model_rate = n / (time.perf_counter() - t0)
        nc = await connect_nats(s.nats, name="bench-mem")
        js = nc.jetstream()
        board = "embedboard"
        futs = [await js.publish_async(Subjects.memory(board, "a"), codec.encode(
            {"v": 1, "id": f"m{i}", "board": board, "agent": "a", "text": t, "created_at": datetime.now(UTC)}))
            for i, t in enumerate(texts)]
        await asyncio.gather(*futs)
        await nc.close()
        ws = s.model_copy(update={"worker": s.worker.model_copy(update={"embed": True, "name": "embedworker"})})
        # Only this phase's items: drop the entries queued by the first phase
        # and consume the memory stream only.
        async with open_pool(s.postgres) as pool, pool.connection() as conn:
            await conn.execute("DELETE FROM bb_embed_queue")
            await conn.commit()
        from blackboard.worker.handlers import default_handlers
        t0 = time.perf_counter()
        async with Worker(ws, provider=prov, handlers=default_handlers(ws)[1:]) as w:
            await w.wait_caught_up(3600, embedded=True, poll=0.05)
            rate = n / (time.perf_counter() - t0)
            assert w.embedder is not None
            st = w.embedder.stats
        print(f"memories with embeddings: {n} ({prov.model}, batch {s.embedding.batch_size})")
        print(f"  model alone (embed batches):            {model_rate:9.1f} texts/s")
        print(f"  worker JetStream -> rows -> vectors:    {rate:9.1f} items/s   = {rate / model_rate:.2f}x model"
              f" (target >= 0.8x); model {st.model_seconds:.1f}s, vector writes {st.write_seconds:.1f}s")


if __name__ == "__main__":
    asyncio.run(main())
