"""Worker ingest throughput next to the raw layers, measured in one run.

Rounds alternate between the raw layer and the worker (fresh boards each
round, the same message count and batch size), so that drift on a noisy
machine hits both; the ratio is taken per round and the median printed.

* raw pull-consume: nats-py's durable pull consumer, ``fetch(batch)`` and
  ``ack()`` each message (what a client does with nothing to store);
* worker: the ingest loop of the entries stream (lean fetch, decode, binary
  COPY into the revisions, current-state upsert + embedding queue, commit,
  ack), timed from its first fetch to zero lag;
* raw COPY: the same decoded rows written by the worker's writer alone (no
  NATS), one batch after the other;
* embeddings: the local model's own batch throughput on the memory texts,
  then the worker's memory stream -> rows -> queue -> model -> vectors in the
  HNSW-indexed table, timed to an empty queue.

Each phase also records the CPU time spent per message by each process (this
one, nats-server, PostgreSQL's processes; from /proc): on a small machine the
three share the cores, so the sum is what bounds the rate.

Usage: python bench/ingest_bench.py [--entries 20000] [--memories 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from _common import add_bus_option, embedded_stack, process_tree_cpu

from blackboard.client.connection import connect_nats
from blackboard.db import open_pool
from blackboard.protocol import codec
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings, WorkerSettings
from blackboard.worker import Worker
from blackboard.worker.entries import write_entries
from blackboard.worker.handlers import StreamHandler, default_handlers
from blackboard.worker.ingest import IngestLoop, to_raw


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


async def raw_consume(settings: Settings, board: str, n: int, batch: int) -> tuple[float, list[Any]]:
    """nats-py pull consumer: fetch ``batch``, ack each; messages/s."""
    nc = await connect_nats(settings.nats, name="bench-raw")
    js = nc.jetstream()
    subj = Subjects(settings.board.bucket)
    psub = await js.pull_subscribe(subj.entry_filter(board), durable=f"raw-{board}", stream=subj.kv_stream)
    got: list[Any] = []
    t0 = time.perf_counter()
    while len(got) < n:
        try:
            msgs = await psub.fetch(batch, timeout=1)
        except TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        got.extend(msgs)
    dt = time.perf_counter() - t0
    await nc.close()
    return n / dt, got


async def worker_ingest(settings: Settings, board: str, n: int) -> float:
    """The worker's ingest loop on one board's entries, from its first fetch to zero lag; rows/s."""
    subj = Subjects(settings.board.bucket)
    base = default_handlers(settings)[0]
    handler = StreamHandler(base.name, base.stream, subj.entry_filter(board), base.decode, base.write,
                            base.embeds, base.concurrent_writes)
    ws = settings.model_copy(update={"worker": settings.worker.model_copy(update={"name": f"w-{board}", "group": f"w-{board}"})})
    nc = await connect_nats(settings.nats, name="bench-worker")
    try:
        async with open_pool(settings.postgres, name="bench-worker") as pool:
            done = asyncio.Event()
            loop: IngestLoop

            def written() -> None:  # called after each committed and acknowledged batch
                if loop.stats.messages >= n:
                    done.set()

            loop = IngestLoop(handler, nc.jetstream(), pool, ws, on_written=written)
            await loop.setup()
            stop = asyncio.Event()
            t0 = time.perf_counter()
            task = asyncio.create_task(loop.run(stop))
            await done.wait()
            dt = time.perf_counter() - t0
            stop.set()
            await task
            await nc.flush()
            for _ in range(100):  # the last acks reach the server
                lag = await loop.lag()
                if lag.total == 0:
                    break
                await asyncio.sleep(0.05)
            assert lag.total == 0, lag
    finally:
        await nc.close()
    return n / dt


async def raw_copy(settings: Settings, msgs: list[Any], batch: int) -> float:
    """The worker's writer alone on the decoded rows (new stream sequences, so nothing is skipped)."""
    decode = default_handlers(settings)[0].decode
    rows = [decode(to_raw(m)) for m in msgs]
    rows = [r.__class__(*(("KV_rawcopy" if f == "stream" else getattr(r, f)) for f in r.__slots__))
            for r in rows]
    async with open_pool(settings.postgres, name="bench-copy") as pool, pool.connection() as conn:
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch):
            async with conn.transaction():
                await write_entries(conn, rows[i:i + batch])
        return len(rows) / (time.perf_counter() - t0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    add_bus_option(ap)
    args = ap.parse_args()
    async with embedded_stack("bb-ingest-bench-", open_bus=args.insecure_open_bus, worker=WorkerSettings(
            embed=False, serve_search=False, lag_interval=600)) as (s, bus, pg):
        ns = bus.server
        print(f"ingest_bench: {bus.label}" + ("" if bus.open_bus else
                                              " (publishers, consumers and the worker connect as the worker)"))
        n, batch = args.entries, s.worker.batch_size
        raws, works, copies, ratios = [], [], [], []
        cpu: dict[str, list[tuple[float, float, float]]] = {"raw": [], "worker": []}

        def cpu_now() -> tuple[float, float, float]:
            return (time.process_time(), process_tree_cpu(ns.pid), process_tree_cpu(pg.pid))

        for r in range(args.rounds):
            await _publish(s, f"raw{r}", n)
            await _publish(s, f"wrk{r}", n)
            order = ("raw", "worker") if r % 2 == 0 else ("worker", "raw")
            for what in order:
                c0 = cpu_now()
                if what == "raw":
                    raw_rate, msgs = await raw_consume(s, f"raw{r}", n, batch)
                else:
                    work_rate = await worker_ingest(s, f"wrk{r}", n)
                await asyncio.sleep(0.5)  # closed connections' processes are reaped (their CPU counted)
                c1 = cpu_now()
                cpu[what].append(tuple((b - a) / n * 1e6 for a, b in zip(c0, c1, strict=True)))  # type: ignore[arg-type]
            copies.append(await raw_copy(s, msgs, batch))
            raws.append(raw_rate)
            works.append(work_rate)
            ratios.append(work_rate / raw_rate)
            print(f"  round {r + 1}: raw {raw_rate:8.0f} msg/s, worker {work_rate:8.0f} rows/s "
                  f"({work_rate / raw_rate:.2f}x), raw COPY {copies[-1]:8.0f} rows/s")
        med = statistics.median
        print(f"entries: {n} per round, batch {batch}, {s.worker.ingest_writers} write transactions in flight, "
              f"{args.rounds} rounds (medians)")
        print(f"  raw pull-consume (nats-py fetch, ack each): {med(raws):9.0f} msg/s")
        print(f"  raw COPY of the decoded rows (writer only): {med(copies):9.0f} rows/s")
        print(f"  worker JetStream -> committed rows:         {med(works):9.0f} rows/s"
              f"   = {med(ratios):.2f}x raw consume (target >= 0.8x), {med(works) / med(copies):.2f}x raw COPY")
        print("  CPU per message (µs; client = this process):  client  nats-server  PostgreSQL  total")
        for what in ("raw", "worker"):
            c = [med(x) for x in zip(*cpu[what], strict=True)]
            print(f"    {'raw pull-consume' if what == 'raw' else 'worker':16s}"
                  f"                          {c[0]:6.1f}  {c[1]:11.1f}  {c[2]:10.1f}  {sum(c):5.1f}")
        if args.memories:
            await _embed_bench(s, args.memories)


async def _embed_bench(s: Settings, n: int) -> None:
    from blackboard.embeddings import provider_from_settings

    texts = [f"memory {i}: the team discussed topic {i % 37} and decided to revisit item {i % 11} next week"
             for i in range(n)]
    bs = s.worker.embed_batch_size or s.embedding.batch_size
    async with provider_from_settings(s.embedding) as prov:
        await prov.embed(texts[:8])  # load the model

        async def model_alone() -> float:
            t0 = time.perf_counter()
            for i in range(0, n, bs):
                await prov.embed(texts[i:i + bs])
            return n / (time.perf_counter() - t0)

        before = await model_alone()
        nc = await connect_nats(s.nats, name="bench-mem")
        js = nc.jetstream()
        board = "embedboard"
        futs = [await js.publish_async(Subjects.memory(board, "a"), codec.encode(
            {"v": 1, "id": f"m{i}", "board": board, "agent": "a", "text": t, "created_at": datetime.now(UTC)}))
            for i, t in enumerate(texts)]
        await asyncio.gather(*futs)
        await nc.close()
        ws = s.model_copy(update={"worker": s.worker.model_copy(update={"embed": True, "name": "embedworker",
                                                                 "group": "embedworker"})})
        # Only this phase's items: drop the entries queued by the ingest rounds.
        async with open_pool(s.postgres) as pool, pool.connection() as conn:
            await conn.execute("DELETE FROM bb_embed_queue")
            await conn.execute("DELETE FROM bb_embed_inbox")
            await conn.commit()
        t0 = time.perf_counter()
        async with Worker(ws, provider=prov, handlers=default_handlers(ws)[1:2]) as w:
            await w.wait_caught_up(3600, embedded=True, poll=0.05)
            rate = n / (time.perf_counter() - t0)
            assert w.embedder is not None
            st = w.embedder.stats
        after = await model_alone()
    model_rate = (before + after) / 2
    print(f"memories with embeddings: {n} ({prov.model}, batch {bs})")
    print(f"  model alone (embed batches, before/after):  {model_rate:9.1f} texts/s ({before:.1f} / {after:.1f})")
    print(f"  worker JetStream -> rows -> vectors (HNSW): {rate:9.1f} items/s   = {rate / model_rate:.2f}x model"
          f" (target >= 0.8x); model busy {st.model_seconds:.1f}s, idle between batches {st.idle_seconds:.1f}s,"
          f" vector writes {st.write_seconds:.1f}s (overlapped)")


if __name__ == "__main__":
    asyncio.run(main())
