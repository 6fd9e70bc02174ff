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

* memories, deduplication on and off (``--dedup N``): the worker's ingest loop
  of the memory stream on N memories (``--dup-ratio`` of them repeating an
  earlier text, written in other case and spacing, first written at least
  ``--dup-lag`` memories before), with ``memory.dedup`` on and off, rounds
  alternating as above; the ratio on / off per round, median printed (target
  >= 0.9x). Signatures are not checked in this phase (the same cost either
  way, it would only hide the difference). ``--dup-lag 0`` lets a repeat follow
  its first copy closely, while that is still being written by the other
  ingest writer: the repeat's batch then waits for that one to commit
  (docs/memory-lifecycle.md, "Deduplication and consolidation").

Each phase also records the CPU time spent per message by each process (this
one, nats-server, PostgreSQL's processes; from /proc): on a small machine the
three share the cores, so the sum is what bounds the rate.

Usage: python bench/ingest_bench.py [--entries 20000] [--memories 1000] [--rounds 3]
                                    [--verify-threads 2] [--batch-size 512] [--writers 2]
                                    [--dedup 0] [--dup-ratio 0.2] [--dup-lag 2048]
(``--entries 0`` and ``--memories 0`` skip those phases: ``--entries 0 --memories 0
--dedup 20000`` measures deduplication alone.)
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


async def _publish_memories(bus: Bus, board: str, n: int, dup_ratio: float, dup_lag: int = 0,
                            sign_batch: int = 1) -> None:
    """``n`` memories of ``board`` as the agent writes them (signed canonical records); a share
    ``dup_ratio`` of them repeats an earlier text (in upper case, with doubled spaces: the same
    after normalisation), spread through the stream, each a text first written at least
    ``dup_lag`` memories before (0: any earlier one, also one in a batch still being written)."""
    nc = await (bus.connect_as(AUTHOR, "bench-mem-pub") if not bus.open_bus
                else connect_nats(bus.settings.nats, name="bench-mem-pub"))
    signer = signing_of(nc).signer
    subject = Subjects.memory(board, AUTHOR)
    period = round(1 / dup_ratio) if dup_ratio > 0 else 0
    texts: list[str] = []
    writes = []
    for i in range(n):
        older = len(texts) - dup_lag if dup_lag else len(texts)  # texts first written >= dup_lag before
        if period and older > 0 and i % period == period - 1:  # a repeat of an earlier text
            text = texts[(i * 7919) % older].upper().replace(" ", "  ")
        else:
            j = len(texts)
            text = f"memory {j}: the team discussed topic {j % 37} and decided to revisit item {j % 11} next week"
            texts.append(text)
        record = MemoryRecord(id=f"{board}-{i}", board=board, agent=AUTHOR, text=text,
                              created_at=datetime.now(UTC)).canonical_bytes()
        writes.append((record, {Header.MSG_ID.value: uuid.uuid4().hex}))
    if signer is not None:
        for i in range(0, n, sign_batch):
            signer.sign_batch([(subject, headers, record) for record, headers in writes[i:i + sign_batch]])
    js = nc.jetstream()
    futs = [await js.publish_async(subject, record, headers=headers) for record, headers in writes]
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


async def worker_ingest(settings: Settings, board: str, n: int, *, verify: bool,
                        dedup: bool | None = None) -> IngestRun:
    """The worker's ingest loop on one board's entries, from its first fetch to zero lag, with
    its signature checks (``verify``, as ``worker.verify``) or without; with ``dedup`` set, on
    the board's memories instead, with ``memory.dedup`` on or off."""
    subj = Subjects(settings.board.bucket)
    ws = settings.model_copy(update={"worker": settings.worker.model_copy(update={
        "name": f"w-{board}", "group": f"w-{board}", "verify": verify})})
    if dedup is None:
        handler = dataclasses.replace(default_handlers(ws)[0], filter_subject=subj.entry_filter(board))
    else:
        ws = ws.model_copy(update={"memory": ws.memory.model_copy(update={"dedup": dedup})})
        handler = dataclasses.replace(default_handlers(ws)[1], filter_subject=Subjects.memory_board(board))
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


async def _entries_bench(s: Settings, bus: Bus, pg: Any, args: argparse.Namespace) -> None:
    """The entries' rounds: raw pull-consume, the worker with and without signature checks, raw COPY."""
    ns = bus.server
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
    ap.add_argument("--dedup", type=int, default=0, metavar="N",
                    help="memories per round of the deduplication phase (memory.dedup on and off; 0: skip)")
    ap.add_argument("--dup-ratio", type=float, default=0.2,
                    help="share of the deduplication phase's memories that repeat an earlier text")
    ap.add_argument("--dup-lag", type=int, default=2048,
                    help="a repeated text was first written at least this many memories before (0: any "
                         "earlier one, also one in a batch still in flight, which the repeat's batch waits for)")
    add_bus_option(ap)
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    async with embedded_stack("bb-ingest-bench-", open_bus=args.insecure_open_bus, worker=WorkerSettings(
            embed=False, serve_search=False, lag_interval=600, verify_threads=args.verify_threads,
            batch_size=args.batch_size, ingest_writers=args.writers)) as (s, bus, pg):
        print(f"ingest_bench: {bus.label}" + ("; entries unsigned, nothing to verify" if bus.open_bus else
                                              f"; entries signed by the agent {AUTHOR!r}, consumers and the "
                                              "worker connect as the worker"))
        if args.entries:
            await _entries_bench(s, bus, pg, args)
        if args.dedup:
            await _dedup_bench(s, bus, pg, args.dedup, args.rounds, args.dup_ratio, args.dup_lag, args.sign_batch)
        if args.memories:
            await _embed_bench(s, bus, args.memories)


async def _settle(s: Settings) -> None:
    """The same start for each phase: the memory tables vacuumed and analysed (else the
    autovacuum that the previous phase's rows set off runs during the next one)."""
    async with open_pool(s.postgres, name="bench-vacuum", autocommit=True) as pool, pool.connection() as conn:
        await conn.execute("VACUUM (ANALYZE) bb_memories")
        await conn.execute("VACUUM (ANALYZE) bb_memory_sources")


#: The phases of a deduplication round, rotated from round to round.
DEDUP_PHASES = ("dedup off", "dedup on")


async def _dedup_bench(s: Settings, bus: Bus, pg: Any, n: int, rounds: int, dup_ratio: float, dup_lag: int,
                       sign_batch: int) -> None:
    """The memory stream's ingest with exact deduplication on and off, rounds alternating."""
    rates: dict[str, list[float]] = {p: [] for p in DEDUP_PHASES}
    cpu: dict[str, list[tuple[float, float]]] = {p: [] for p in DEDUP_PHASES}
    stored: list[int] = []
    for r in range(rounds):
        boards = {p: f"dd{p.split()[1]}{r}" for p in DEDUP_PHASES}
        order = DEDUP_PHASES[r % 2:] + DEDUP_PHASES[:r % 2]
        for what in order:  # each phase's memories published just before it (the same start for both)
            await _publish_memories(bus, boards[what], n, dup_ratio, dup_lag, sign_batch)
            await _settle(s)
            c0 = (time.process_time(), process_tree_cpu(pg.pid))
            run = await worker_ingest(s, boards[what], n, verify=False, dedup=what == "dedup on")
            c1 = (time.process_time(), process_tree_cpu(pg.pid))
            rates[what].append(run.rate)
            cpu[what].append((
                (c1[0] - c0[0]) / n * 1e6, (c1[1] - c0[1]) / n * 1e6))
        async with open_pool(s.postgres, name="bench-dedup") as pool, pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM bb_memories WHERE board = %s", (boards["dedup on"],))
            row = await cur.fetchone()
            stored.append(int(row[0]) if row else 0)
        off, on = (rates[p][-1] for p in DEDUP_PHASES)
        print(f"  round {r + 1} ({', '.join(order)}): dedup off {off:8.0f} rows/s, dedup on {on:8.0f} rows/s "
              f"({on / off:.2f}x off; {stored[-1]} of {n} memories stored as rows)")
    med = statistics.median
    ratio = med([a / b for a, b in zip(rates["dedup on"], rates["dedup off"], strict=True)])
    print(f"memories with exact deduplication: {n} per round, {dup_ratio:.0%} repeating an earlier text "
          f"(first written {dup_lag}+ memories before), "
          f"batch {s.worker.batch_size}, {s.worker.ingest_writers} write transactions in flight, signatures "
          f"not checked, {rounds} rounds (medians)")
    print(f"  worker (dedup off) JetStream -> rows: {med(rates['dedup off']):9.0f} rows/s")
    print(f"  worker (dedup on)  JetStream -> rows: {med(rates['dedup on']):9.0f} rows/s   = {ratio:.2f}x dedup "
          f"off (target >= 0.9x){'' if ratio >= 0.9 else ' MISSED'}; {med(stored)} rows stored of {n}")
    for p in DEDUP_PHASES:
        print(f"  CPU per memory, {p:9s}: worker {med([c[0] for c in cpu[p]]):6.1f} µs, PostgreSQL "
              f"{med([c[1] for c in cpu[p]]):6.1f} µs")


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
