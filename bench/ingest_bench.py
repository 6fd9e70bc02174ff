"""Worker ingest throughput next to the raw layers, measured in one run.

Rounds alternate between the raw layer and the worker (fresh boards each
round, the same message count and batch size), so that drift on a noisy
machine hits both; the ratio is taken per round and the median printed.

The entries are written as an agent writes them: the canonical encoding of the
record, signed with the agent's credential (``bench``, its certificate in the key
registry), the signatures made before anything is timed.

* raw pull-consume: nats-py's durable pull consumer, ``fetch(batch)`` and
  ``ack()`` each message (what a client does with nothing to store);
* worker: the ingest loop of the entries stream (lean fetch, decode, signature
  check, binary COPY into the revisions, current-state upsert + embedding
  queue, commit, ack), timed from its first fetch to zero lag, twice per round:
  with ``worker.verify`` on (every signature checked in ``worker.verify_threads``
  threads; each row ``verified``) and off (rows ``unsigned``, the baseline);
* raw COPY: the same decoded rows written by the worker's writer alone (no
  NATS), one batch after the other;
* embeddings: the local model's own batch throughput on the memory texts,
  then the worker's memory stream -> rows -> queue -> model -> vectors in the
  HNSW-indexed table, timed to an empty queue.

Each phase also records the CPU time spent per message by each process (this
one, nats-server, PostgreSQL's processes; from /proc): on a small machine the
three share the cores, so the sum is what bounds the rate.

Usage: python bench/ingest_bench.py [--entries 20000] [--memories 1000] [--rounds 3]
                                    [--verify-threads 2] [--batch-size 512] [--writers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from _common import Bus, add_bus_option, embedded_stack, process_tree_cpu

from blackboard.client.connection import connect_nats
from blackboard.client.signing import signing_of
from blackboard.db import open_pool
from blackboard.protocol.entries import encode_entry_record
from blackboard.protocol.schemas import MemoryRecord
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.verifier import Verifier
from blackboard.settings import Settings, WorkerSettings
from blackboard.worker import Worker
from blackboard.worker.entries import write_entries
from blackboard.worker.handlers import default_handlers
from blackboard.worker.ingest import IngestLoop, to_raw

#: The agent that writes the entries.
AUTHOR = "bench"


async def _publish(bus: Bus, board: str, n: int, sign_batch: int = 1) -> None:
    """``n`` entries of ``board`` as the agent writes them: canonical records, signed with its
    credential (all signed before the first is published; on the open bus, unsigned): each
    alone (``sign_batch`` 1, as single puts are), or ``sign_batch`` records under one
    signature (``Signer.sign_batch``, as the SDK's pipelined writes are, 32 at most)."""
    nc = await (bus.connect_as(AUTHOR, "bench-pub") if not bus.open_bus
                else connect_nats(bus.settings.nats, name="bench-pub"))
    signer = signing_of(nc).signer
    subj = Subjects(bus.settings.board.bucket)
    writes = []
    for i in range(n):
        subject = subj.entry(board, "s", f"k{i}")
        payload, record = encode_entry_record({"i": i, "text": f"entry number {i} of the ingest benchmark"},
                                              author=AUTHOR, content_type="application/json", tags=["bench"],
                                              metadata={"n": i})
        writes.append((subject, payload, {Header.MSG_ID.value: uuid.uuid4().hex}, record))
    if signer is not None:
        for i in range(0, n, sign_batch):
            signer.sign_batch([(subject, headers, record) for subject, _, headers, record in writes[i:i + sign_batch]])
    js = nc.jetstream()
    futs = [await js.publish_async(subject, payload, headers=headers) for subject, payload, headers, _ in writes]
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


@dataclasses.dataclass
class IngestRun:
    """One timed run of the worker's ingest loop."""

    rate: float
    #: Seconds the batches waited for their signature checks (0 without verification).
    verify_seconds: float = 0.0
    #: The verifier's verdict counts (None without verification).
    verdicts: dict[str, int] | None = None


async def worker_ingest(settings: Settings, board: str, n: int, *, verify: bool) -> IngestRun:
    """The worker's ingest loop on one board's entries, from its first fetch to zero lag, with
    its signature checks (``verify``, as ``worker.verify``) or without."""
    subj = Subjects(settings.board.bucket)
    handler = dataclasses.replace(default_handlers(settings)[0], filter_subject=subj.entry_filter(board))
    ws = settings.model_copy(update={"worker": settings.worker.model_copy(update={
        "name": f"w-{board}", "group": f"w-{board}", "verify": verify})})
    nc = await connect_nats(ws, name="bench-worker")
    verifier: Verifier | None = None
    registry = signing_of(nc).registry
    if verify and registry is not None:  # as Worker does (worker/runner.py): the connection's key registry
        verifier = Verifier(registry, max_skew=ws.security.max_clock_skew, cache_size=0,
                            threads=ws.worker.verify_threads)
    try:
        async with open_pool(settings.postgres, name="bench-worker") as pool:
            done = asyncio.Event()
            loop: IngestLoop

            def written() -> None:  # called after each committed and acknowledged batch
                if loop.stats.messages >= n:
                    done.set()

            loop = IngestLoop(handler, nc.jetstream(), pool, ws, on_written=written, verifier=verifier)
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
            assert loop.stats.written == n, (loop.stats, loop.stats.rejected)
    finally:
        if verifier is not None:
            verifier.close()
        await nc.close()
    stats = dict(verifier.stats) if verifier is not None else None
    if stats is not None:
        assert stats["verified"] == n, stats
    return IngestRun(n / dt, loop.stats.verify_seconds, stats)


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


#: The phases of a round, rotated from round to round.
PHASES = ("raw", "verify off", "verify on")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verify-threads", type=int, default=WorkerSettings().verify_threads,
                    help="worker.verify_threads (0: the checks run in the event loop's thread)")
    ap.add_argument("--batch-size", type=int, default=WorkerSettings().batch_size, help="worker.batch_size")
    ap.add_argument("--writers", type=int, default=WorkerSettings().ingest_writers, help="worker.ingest_writers")
    ap.add_argument("--sign-batch", type=int, default=1,
                    help="records per signature (1: each signed alone, as single puts; 32: as the SDK's "
                         "pipelined writes, one Ed25519 signature over a Merkle root)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval (seconds) of this process: how long a thread waits for "
                         "the GIL at most before the running thread is made to give it up (default 0.005)")
    add_bus_option(ap)
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    async with embedded_stack("bb-ingest-bench-", open_bus=args.insecure_open_bus, worker=WorkerSettings(
            embed=False, serve_search=False, lag_interval=600, verify_threads=args.verify_threads,
            batch_size=args.batch_size, ingest_writers=args.writers)) as (s, bus, pg):
        ns = bus.server
        print(f"ingest_bench: {bus.label}" + ("; entries unsigned, nothing to verify" if bus.open_bus else
                                              f"; entries signed by the agent {AUTHOR!r}, consumers and the "
                                              "worker connect as the worker"))
        n, batch = args.entries, s.worker.batch_size
        rates: dict[str, list[float]] = {p: [] for p in PHASES}
        copies: list[float] = []
        waits: list[float] = []
        cpu: dict[str, list[tuple[float, float, float]]] = {p: [] for p in PHASES}

        def cpu_now() -> tuple[float, float, float]:
            return (time.process_time(), process_tree_cpu(ns.pid), process_tree_cpu(pg.pid))

        for r in range(args.rounds):
            boards = {p: f"{p.replace(' ', '')}{r}" for p in PHASES}
            for board in boards.values():
                await _publish(bus, board, n, args.sign_batch)
            order = PHASES[r % 3:] + PHASES[:r % 3]
            for what in order:
                c0 = cpu_now()
                if what == "raw":
                    rate, msgs = await raw_consume(s, boards[what], n, batch)
                else:
                    run = await worker_ingest(s, boards[what], n, verify=what == "verify on")
                    rate = run.rate
                    if what == "verify on":
                        waits.append(run.verify_seconds)
                await asyncio.sleep(0.5)  # closed connections' processes are reaped (their CPU counted)
                c1 = cpu_now()
                cpu[what].append(tuple((b - a) / n * 1e6 for a, b in zip(c0, c1, strict=True)))
                rates[what].append(rate)
            copies.append(await raw_copy(s, msgs, batch))
            raw, off, on = (rates[p][-1] for p in PHASES)
            print(f"  round {r + 1} ({', '.join(order)}): raw {raw:8.0f} msg/s, worker verify off {off:8.0f} "
                  f"rows/s ({off / raw:.2f}x), verify on {on:8.0f} rows/s ({on / raw:.2f}x raw, {on / off:.2f}x "
                  f"off), raw COPY {copies[-1]:8.0f} rows/s")
        med = statistics.median
        ratio = {p: med([w / rw for w, rw in zip(rates[p], rates["raw"], strict=True)]) for p in PHASES}
        on_off = med([a / b for a, b in zip(rates["verify on"], rates["verify off"], strict=True)])
        print(f"entries: {n} per round, batch {batch}, {s.worker.ingest_writers} write transactions in flight, "
              f"verify_threads {s.worker.verify_threads}, switch interval {sys.getswitchinterval() * 1e3:g} ms, "
              f"{args.sign_batch} record(s) per signature, {args.rounds} rounds (medians)")
        print(f"  raw pull-consume (nats-py fetch, ack each): {med(rates['raw']):9.0f} msg/s")
        print(f"  raw COPY of the decoded rows (writer only): {med(copies):9.0f} rows/s")
        for p in ("verify off", "verify on"):
            print(f"  worker ({p:10s}) JetStream -> rows:    {med(rates[p]):9.0f} rows/s   = {ratio[p]:.2f}x raw "
                  f"consume (target >= 0.8x){'' if ratio[p] >= 0.8 else ' MISSED'}, "
                  f"{med(rates[p]) / med(copies):.2f}x raw COPY")
        print(f"  signature checks: verify on = {on_off:.2f}x verify off (target >= 0.8x)"
              f"{'' if on_off >= 0.8 else ' MISSED'}; batches waited {med(waits):.2f}s in all for their checks "
              f"({med(waits) / n * 1e6:.1f} µs a message, overlapped with the other writer's)")
        print("  CPU per message (µs; client = this process):  client  nats-server  PostgreSQL  total")
        for p in PHASES:
            c = [med(x) for x in zip(*cpu[p], strict=True)]
            label = "raw pull-consume" if p == "raw" else f"worker {p}"
            print(f"    {label:22s}                    {c[0]:6.1f}  {c[1]:11.1f}  {c[2]:10.1f}  {sum(c):5.1f}")
        if args.memories:
            await _embed_bench(s, bus, args.memories)


async def _embed_bench(s: Settings, bus: Bus, n: int) -> None:
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
        # Written as the agent "a" writes them: canonical records, signed with its credential.
        nc = await (bus.connect_as("a", "bench-mem") if not bus.open_bus
                    else connect_nats(s.nats, name="bench-mem"))
        signer = signing_of(nc).signer
        js = nc.jetstream()
        board = "embedboard"
        futs = []
        for i, t in enumerate(texts):
            subject = Subjects.memory(board, "a")
            record = MemoryRecord(id=f"m{i}", board=board, agent="a", text=t,
                                  created_at=datetime.now(UTC)).canonical_bytes()
            headers = {Header.MSG_ID.value: uuid.uuid4().hex}
            if signer is not None:
                signer.sign(subject, headers, record)
            futs.append(await js.publish_async(subject, record, headers=headers))
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
