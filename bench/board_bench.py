"""Board benchmark: the SDK next to raw nats-py on the same embedded server.

Measures, in one run on a nats-server it starts itself (JetStream, temporary
directory, ``sync_interval`` from the settings default unless
``--sync-interval`` is given). The server runs with authorization as
``blackboard dev`` runs it (operator-mode JWT identities and TLS): the SDK
agent ``bench-sdk`` is issued its credential, and the raw nats-py baseline
connects with that same ``.creds``, the same CA and the inbox prefix
``_INBOX.bench-sdk``, so both pay the same authorization and TLS, and the raw
side uses only what the agent may (no stream info, no bare consumer create).
``--insecure-open-bus`` measures the open bus instead; ``--with-open-bus``
measures both in the same run, variants of both servers alternating, and
adds what authorization costs (figures on the authorized bus / the open bus).
The header line says which bus each table is of.

The SDK runs as agents run it: it signs every write (Ed25519 over the
record's canonical encoding, docs/security.md "Signatures") and verifies what
it reads. What the get and fan-out phases read is written by another identity
(``bench-writer``), so the reader verifies it; a process keeps the verdict of
each stored revision, so a second read of one is not checked again. The same
phases also run the SDK with ``security.sign``/``verify`` false (the same
agent, a second connection: "signatures off"), which shows what signatures cost
the SDK in the same run.

* put, get and compare-and-set update: throughput and p50/p99 latency of
  ``Board.put`` / ``Board.get`` / ``Board.update`` next to nats-py's
  ``kv.put`` / ``kv.get`` / ``kv.update`` on the same bucket. The raw calls
  send the same bytes the SDK sends (an envelope encoded once, beforehand,
  unsigned), so the SDK's figure includes encoding the envelope, signing it,
  validating the names and keys, the ``Nats-Msg-Id`` header and decoding and
  verifying on reads. Gets cycle over ``--keys`` keys (each revision verified on
  its first read); "get, each read a new revision" reads ``--ops`` revisions
  once each, written by the writer's pipeline (signed in batches: one signature
  check per batch of 32), and "signed alone" the same written by single puts
  (one signature check per read);
* the pipelined write path (``async with board.pipeline() as p``) next to raw
  ``js.publish_async`` + ``gather``, with the same bound on pending acks;
* watch fan-out: one writer at a fixed rate, 20 watchers, delivery latency
  (write call to a watcher's ``async for`` step), SDK ``Board.watch`` next to
  what ``kv.watch`` does (an ordered push consumer, ``js.subscribe``), with the
  consumer created by name with its filter as an agent must (``kv.watch``
  itself uses the bare create subject and consumer info, refused to agents).

Raw and SDK rounds alternate (order reversed every round) and every figure is
the median over rounds; ratios are medians of the per-round ratios. Targets:
SDK >= 0.85x raw for put/get/CAS and pipelined >= 0.75x raw with signatures
(0.9x and 0.8x with them off), fan-out p99 <= 1.25x raw. ``--profile`` prints where the SDK spends its time (cProfile).

Run: ``python bench/board_bench.py`` (60-90 s on 2 cores; twice that with
``--with-open-bus``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import itertools
import json
import math
import platform
import pstats
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from importlib.metadata import version as _version

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from agents_sdk import Agent, Board, Watch
from bench._common import (
    Bus,
    LatencyStats,
    RawKvWatch,
    Table,
    add_bus_option,
    alternate,
    embedded_nats,
    interleaved_ops,
    median,
    paced_writes,
    percentile,
    raw_kv_watch,
)
from blackboard.protocol.entries import encode_entry
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings

BOARD = "bench"
#: The SDK agent; the raw baseline connects with its credential.
AGENT = "bench-sdk"
#: Variant-name suffix of the open bus's variants in a ``--with-open-bus`` run.
OPEN = "@open"
#: Targets of the SDK as agents run it, signing every write and verifying what it reads (issue 20).
TARGET_SEQ = 0.85
TARGET_PIPE = 0.75
TARGET_FANOUT_P99 = 1.25
#: Targets of the SDK with signatures off (``security.sign``/``verify`` false), as before signatures.
TARGET_SEQ_PLAIN = 0.9
TARGET_PIPE_PLAIN = 0.8
#: Who writes what the get and fan-out phases read: another identity than the reader, so that the
#: reader verifies what it reads (a process does not check its own writes again).
WRITER = "bench-writer"


@dataclass(frozen=True, slots=True)
class FanoutStats:
    """Delivery latencies of one fan-out run (seconds)."""

    deliveries: int
    p50: float
    p99: float
    all_p50: float
    all_p99: float


@dataclass(slots=True)
class Ctx:
    args: argparse.Namespace
    bus: Bus
    settings: Settings
    agent: Agent
    board: Board
    #: The reader's board handle with signatures off (``security.sign``/``verify`` false).
    plain: Board
    #: Another identity's board handle: the writer of what the get and fan-out phases read.
    writer: Board
    raw_nc: NATS
    js: JetStreamContext
    kv: KeyValue
    value: dict[str, Any]
    payload: bytes
    msg_ids: Iterator[int] = field(default_factory=itertools.count)

    def msg_id(self) -> dict[str, str]:
        """A ``Nats-Msg-Id`` header like the SDK's (16 hex digits and a counter)."""
        return {"Nats-Msg-Id": f"0123456789abcdef{next(self.msg_ids):x}"}


# ----------------------------------------------------------------- sequential
# Each function sets a variant up for round ``r`` (outside the timing) and
# returns the operation to time; ``interleaved_ops`` runs SDK and raw
# operations in alternating blocks.
Op = Callable[[int], Awaitable[Any]]


async def sdk_put(ctx: Ctx, r: int) -> Op:
    section, keys, value, board = f"put-sdk-{r}", ctx.args.keys, ctx.value, ctx.board
    return lambda i: board.put(section, f"k{i % keys}", value)


async def raw_put(ctx: Ctx, r: int) -> Op:
    prefix, keys, payload, kv = f"{BOARD}.put-raw-{r}.k", ctx.args.keys, ctx.payload, ctx.kv
    return lambda i: kv.put(f"{prefix}{i % keys}", payload)


async def raw_put_id(ctx: Ctx, r: int) -> Op:
    """kv.put's publish plus the SDK's Nats-Msg-Id header: the protocol's cost without the SDK."""
    prefix, keys, payload, js = f"$KV.{ctx.settings.board.bucket}.{BOARD}.put-id-{r}.k", ctx.args.keys, \
        ctx.payload, ctx.js
    return lambda i: js.publish(f"{prefix}{i % keys}", payload, headers=ctx.msg_id())


async def plain_put(ctx: Ctx, r: int) -> Op:
    section, keys, value, board = f"put-plain-{r}", ctx.args.keys, ctx.value, ctx.plain
    return lambda i: board.put(section, f"k{i % keys}", value)


async def _prefill(ctx: Ctx, section: str, keys: int | None = None, *, alone: bool = False) -> None:
    """``keys`` keys (default ``--keys``) written by the writer identity, signed: by its
    pipeline (in batches, one signature for up to 32 writes) or, ``alone``, each by a put
    of its own (one signature each, as many agents' single writes)."""
    n = ctx.args.keys if keys is None else keys
    if alone:
        for first in range(0, n, 64):
            await asyncio.gather(*(ctx.writer.put(section, f"k{i}", ctx.value) for i in range(first, min(n, first + 64))))
        return
    async with ctx.writer.pipeline() as p:
        for i in range(n):
            await p.put(section, f"k{i}", ctx.value)


def _get(board: Board, section: str, keys: int) -> Op:
    return lambda i: board.get(section, f"k{i % keys}")


async def sdk_get(ctx: Ctx, r: int) -> Op:
    """Gets cycling over ``--keys`` keys another identity wrote: each revision is verified on
    its first read, later reads find the verdict the process keeps."""
    section = f"get-sdk-{r}"
    await _prefill(ctx, section)
    return _get(ctx.board, section, ctx.args.keys)


async def plain_get(ctx: Ctx, r: int) -> Op:
    section = f"get-plain-{r}"
    await _prefill(ctx, section)
    return _get(ctx.plain, section, ctx.args.keys)


async def raw_get(ctx: Ctx, r: int) -> Op:
    section, keys, kv = f"get-raw-{r}", ctx.args.keys, ctx.kv
    await _prefill(ctx, section)  # the same envelopes, written by the SDK
    prefix = f"{BOARD}.{section}.k"
    return lambda i: kv.get(f"{prefix}{i % keys}")


async def sdk_get_new(ctx: Ctx, r: int) -> Op:
    """Every get reads a revision this process never read: each one is verified."""
    section = f"new-sdk-{r}"
    await _prefill(ctx, section, ctx.args.ops)
    return _get(ctx.board, section, ctx.args.ops)


async def raw_get_new(ctx: Ctx, r: int) -> Op:
    section, kv = f"new-raw-{r}", ctx.kv
    await _prefill(ctx, section, ctx.args.ops)
    prefix = f"{BOARD}.{section}.k"
    return lambda i: kv.get(f"{prefix}{i}")


async def sdk_get_alone(ctx: Ctx, r: int) -> Op:
    """Every get reads a revision never read, each signed alone: one signature check per read."""
    section = f"alone-sdk-{r}"
    await _prefill(ctx, section, ctx.args.ops, alone=True)
    return _get(ctx.board, section, ctx.args.ops)


async def raw_get_alone(ctx: Ctx, r: int) -> Op:
    section, kv = f"alone-raw-{r}", ctx.kv
    await _prefill(ctx, section, ctx.args.ops, alone=True)
    prefix = f"{BOARD}.{section}.k"
    return lambda i: kv.get(f"{prefix}{i}")


async def _cas(board: Board, section: str, keys: int, value: Any) -> Op:
    revs = [await board.put(section, f"k{i}", value) for i in range(keys)]

    async def op(i: int) -> None:
        j = i % keys
        revs[j] = await board.update(section, f"k{j}", value, expected_revision=revs[j])

    return op


async def sdk_cas(ctx: Ctx, r: int) -> Op:
    return await _cas(ctx.board, f"cas-sdk-{r}", ctx.args.keys, ctx.value)


async def plain_cas(ctx: Ctx, r: int) -> Op:
    return await _cas(ctx.plain, f"cas-plain-{r}", ctx.args.keys, ctx.value)


async def raw_cas(ctx: Ctx, r: int) -> Op:
    keys, payload, kv = ctx.args.keys, ctx.payload, ctx.kv
    names = [f"{BOARD}.cas-raw-{r}.k{i}" for i in range(keys)]
    revs = [await kv.put(name, payload) for name in names]

    async def op(i: int) -> None:
        j = i % keys
        revs[j] = await kv.update(names[j], payload, last=revs[j])

    return op


# ------------------------------------------------------------------ pipelined
async def sdk_pipeline(ctx: Ctx, r: int) -> LatencyStats:
    return await _sdk_pipeline(ctx.board, ctx, f"pipe-sdk-{r}")


async def plain_pipeline(ctx: Ctx, r: int) -> LatencyStats:
    return await _sdk_pipeline(ctx.plain, ctx, f"pipe-plain-{r}")


async def _sdk_pipeline(board: Board, ctx: Ctx, section: str) -> LatencyStats:
    keys, value, n = ctx.args.keys, ctx.value, ctx.args.pipeline_ops
    start = time.perf_counter()
    async with board.pipeline() as p:
        for i in range(n):
            await p.put(section, f"k{i % keys}", value)
    elapsed = time.perf_counter() - start
    return LatencyStats(n, elapsed, math.nan, math.nan, elapsed / n)


async def _raw_pipeline(ctx: Ctx, section: str, with_id: bool) -> LatencyStats:
    js = ctx.raw_nc.jetstream(timeout=ctx.settings.nats.request_timeout,
                              publish_async_max_pending=ctx.settings.nats.max_pending_writes)
    prefix = f"$KV.{ctx.settings.board.bucket}.{BOARD}.{section}.k"
    keys, payload, n = ctx.args.keys, ctx.payload, ctx.args.pipeline_ops
    start = time.perf_counter()
    if with_id:
        futures = [await js.publish_async(f"{prefix}{i % keys}", payload, headers=ctx.msg_id()) for i in range(n)]
    else:
        futures = [await js.publish_async(f"{prefix}{i % keys}", payload) for i in range(n)]
    acks = await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    assert len(acks) == n
    return LatencyStats(n, elapsed, math.nan, math.nan, elapsed / n)


async def raw_pipeline(ctx: Ctx, r: int) -> LatencyStats:
    return await _raw_pipeline(ctx, f"pipe-raw-{r}", False)


async def raw_pipeline_id(ctx: Ctx, r: int) -> LatencyStats:
    return await _raw_pipeline(ctx, f"pipe-id-{r}", True)


# -------------------------------------------------------------------- fan-out
class _Sink:
    """Arrival times of the fan-out messages, per watcher; ``done`` when all arrived."""

    def __init__(self, watchers: int, count: int) -> None:
        self.count = count
        self.received: list[list[tuple[int, float]]] = [[] for _ in range(watchers)]
        self.done = asyncio.Event()
        self._complete = 0

    def record(self, watcher: int, key: str) -> None:
        out = self.received[watcher]
        out.append((int(key[key.rindex("m") + 1:]), time.perf_counter()))
        if len(out) == self.count:
            self._complete += 1
            if self._complete == len(self.received):
                self.done.set()


#: Starts the watchers feeding a sink; returns their tasks and a stop function.
_StartWatchers = Callable[[_Sink], Awaitable[tuple[list[asyncio.Task[None]], Callable[[], Awaitable[None]]]]]


async def _fanout(ctx: Ctx, start_watchers: _StartWatchers, write: Callable[[int], Awaitable[Any]]) -> FanoutStats:
    rate = ctx.args.rate
    count = int(rate * ctx.args.fanout_seconds)
    sink = _Sink(ctx.args.watchers, count)
    tasks, stop = await start_watchers(sink)
    _, sent = await paced_writes(count, rate, write)
    try:
        await asyncio.wait_for(sink.done.wait(), 10.0)
    except TimeoutError:
        missing = sum(count - len(r) for r in sink.received)
        raise RuntimeError(f"fan-out: {missing} deliveries missing 10 s after the last write") from None
    finally:
        await stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    per_delivery = [t - sent[i] for r in sink.received for i, t in r]
    last_arrival = [0.0] * count
    for r in sink.received:
        for i, t in r:
            last_arrival[i] = max(last_arrival[i], t)
    all_got = [last_arrival[i] - sent[i] for i in range(count)]
    return FanoutStats(len(per_delivery), percentile(per_delivery, 50), percentile(per_delivery, 99),
                       percentile(all_got, 50), percentile(all_got, 99))


async def sdk_fanout(ctx: Ctx, r: int) -> FanoutStats:
    section, board, value = f"fan-sdk-{r}", ctx.board, ctx.value

    async def start(sink: _Sink) -> tuple[list[asyncio.Task[None]], Callable[[], Awaitable[None]]]:
        watches = [board.watch(section) for _ in sink.received]
        for w in watches:
            await w.start()

        async def consume(n: int, w: Watch) -> None:
            async for change in w:
                sink.record(n, change.entry.key)

        async def stop() -> None:
            for w in watches:
                await w.stop()

        return [asyncio.create_task(consume(n, w)) for n, w in enumerate(watches)], stop

    # written by another identity (signed), read and verified by the watchers' agent
    return await _fanout(ctx, start, lambda i: ctx.writer.put(section, f"m{i}", value))


async def raw_fanout(ctx: Ctx, r: int) -> FanoutStats:
    kv, payload, prefix = ctx.kv, ctx.payload, f"{BOARD}.fan-raw-{r}."

    async def start(sink: _Sink) -> tuple[list[asyncio.Task[None]], Callable[[], Awaitable[None]]]:
        watchers = [await raw_kv_watch(ctx.js, ctx.settings.board.bucket, prefix + "*") for _ in sink.received]

        async def consume(n: int, w: RawKvWatch) -> None:
            async for entry in w:
                if entry is not None:  # nats-py's "initial values done" marker
                    sink.record(n, entry.key)

        async def stop() -> None:
            for w in watchers:
                await w.stop()

        return [asyncio.create_task(consume(n, w)) for n, w in enumerate(watchers)], stop

    return await _fanout(ctx, start, lambda i: kv.put(f"{prefix}m{i}", payload))


# ---------------------------------------------------------------------- main
async def _between() -> None:
    gc.collect()
    await asyncio.sleep(0.05)


def _ratio_median(sdk: list[float], raw: list[float]) -> float:
    return median([s / r for s, r in zip(sdk, raw, strict=True) if r > 0])


_PROFILED: dict[str, Callable[[Ctx, int], Awaitable[Any]]] = {
    "put": sdk_put, "get": sdk_get, "cas": sdk_cas, "pipeline": sdk_pipeline, "fanout": sdk_fanout,
}


async def _profile(ctx: Ctx, which: list[str], top: int) -> str:
    """cProfile of one SDK round of each phase in ``which``, one report per phase."""
    out = io.StringIO()
    for n, name in enumerate(which):
        prof = cProfile.Profile()
        if name in ("put", "get", "cas"):
            op = await _PROFILED[name](ctx, 900 + n)
            prof.enable()
            for i in range(ctx.args.ops):
                await op(i)
        else:
            prof.enable()
            await _PROFILED[name](ctx, 900 + n)
        prof.disable()
        print(f"==== cProfile: SDK {name} (one round) ====", file=out)
        stats = pstats.Stats(prof, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _report(ctx: Ctx, seq: dict[str, dict[str, list[LatencyStats]]],
            fan: dict[str, list[FanoutStats]], suffix: str = "") -> tuple[Table, dict[str, Any]]:
    """The result table of one bus (its variants end with ``suffix``; medians over rounds, ratios
    = medians of per-round ratios) and a summary."""
    table = Table(f"board_bench, {ctx.bus.label} (median of rounds; ratio = SDK / raw, median of the "
                  "per-round ratios)", measured_label="SDK", baseline_label="raw nats-py")
    summary: dict[str, Any] = {"envelope_bytes": len(ctx.payload), "bus": ctx.bus.label}
    sdk_v, raw_v, rid_v = f"sdk{suffix}", f"raw{suffix}", f"raw+id{suffix}"

    def med(stats: list[LatencyStats], attr: str) -> float:
        return median([getattr(x, attr) for x in stats])

    labels = {"put": "put", "get": "get (direct)", "cas": "CAS update"}
    for name in ("put", "get", "cas"):
        sdk, raw = seq[name][sdk_v], seq[name][raw_v]
        ratio = _ratio_median([x.rate for x in sdk], [x.rate for x in raw])
        table.add(f"{labels[name]} throughput", med(sdk, "rate"), med(raw, "rate"), "/s", min_ratio=TARGET_SEQ,
                  ratio=ratio, note="raw: kv.put" if name == "put" else
                  "raw: kv.get (direct)" if name == "get" else "raw: kv.update")
        table.add(f"{labels[name]} p50", med(sdk, "p50"), med(raw, "p50"), "us")
        table.add(f"{labels[name]} p99", med(sdk, "p99"), med(raw, "p99"), "us")
        summary[name] = {"sdk_rate": med(sdk, "rate"), "raw_rate": med(raw, "rate"), "ratio": ratio,
                         "sdk_p50_us": med(sdk, "p50") * 1e6, "raw_p50_us": med(raw, "p50") * 1e6,
                         "sdk_p99_us": med(sdk, "p99") * 1e6, "raw_p99_us": med(raw, "p99") * 1e6}
        plain_v = f"plain{suffix}"
        if plain_v in seq[name]:
            plain = seq[name][plain_v]
            plain_ratio = _ratio_median([x.rate for x in plain], [x.rate for x in raw])
            cost = _ratio_median([x.rate for x in sdk], [x.rate for x in plain])
            table.add(f"{labels[name]} throughput, signatures off", med(plain, "rate"), med(raw, "rate"), "/s",
                      min_ratio=TARGET_SEQ_PLAIN, ratio=plain_ratio, note="SDK with security.sign/verify false")
            table.add(f"{labels[name]}: signatures on / off", med(sdk, "rate"), med(plain, "rate"), "/s",
                      ratio=cost, note="what signing/verifying costs the SDK")
            summary[name].update(plain_rate=med(plain, "rate"), plain_ratio=plain_ratio, signature_cost=cost)
        if name == "get" and f"new-sdk{suffix}" in seq.get("get-new", {}):
            for phase, variant, label, note in (
                    ("get-new", "new", "get, each read a new revision", "pipelined writes: a check per batch of 32"),
                    ("get-alone", "alone", "get, new revision signed alone", "single puts: a signature check per read")):
                first, first_raw = seq[phase][f"{variant}-sdk{suffix}"], seq[phase][f"{variant}-raw{suffix}"]
                first_ratio = _ratio_median([x.rate for x in first], [x.rate for x in first_raw])
                table.add(label, med(first, "rate"), med(first_raw, "rate"), "/s", min_ratio=TARGET_SEQ,
                          ratio=first_ratio, note=note)
                table.add(f"{label} p50", med(first, "p50"), med(first_raw, "p50"), "us")
                summary[phase.replace("-", "_")] = {
                    "sdk_rate": med(first, "rate"), "raw_rate": med(first_raw, "rate"), "ratio": first_ratio,
                    "sdk_p50_us": med(first, "p50") * 1e6, "raw_p50_us": med(first_raw, "p50") * 1e6}
        if rid_v in seq[name]:
            rid = seq[name][rid_v]
            id_ratio = _ratio_median([x.rate for x in sdk], [x.rate for x in rid])
            table.add(f"{labels[name]} throughput vs raw + Msg-Id", med(sdk, "rate"), med(rid, "rate"), "/s",
                      ratio=id_ratio, note="raw: js.publish with the SDK's Nats-Msg-Id header")
            summary[name].update(raw_id_rate=med(rid, "rate"), ratio_vs_raw_id=id_ratio)
    sdk, raw, rid = seq["pipeline"][sdk_v], seq["pipeline"][raw_v], seq["pipeline"][rid_v]
    ratio = _ratio_median([x.rate for x in sdk], [x.rate for x in raw])
    id_ratio = _ratio_median([x.rate for x in sdk], [x.rate for x in rid])
    table.add("pipelined writes", med(sdk, "rate"), med(raw, "rate"), "/s", min_ratio=TARGET_PIPE, ratio=ratio,
              note="raw: js.publish_async + gather")
    table.add("pipelined writes vs raw + Msg-Id", med(sdk, "rate"), med(rid, "rate"), "/s", ratio=id_ratio,
              note="raw: the same with the SDK's Nats-Msg-Id header")
    summary["pipeline"] = {"sdk_rate": med(sdk, "rate"), "raw_rate": med(raw, "rate"), "ratio": ratio,
                           "raw_id_rate": med(rid, "rate"), "ratio_vs_raw_id": id_ratio}
    if f"plain{suffix}" in seq["pipeline"]:
        plain = seq["pipeline"][f"plain{suffix}"]
        plain_ratio = _ratio_median([x.rate for x in plain], [x.rate for x in raw])
        cost = _ratio_median([x.rate for x in sdk], [x.rate for x in plain])
        table.add("pipelined writes, signatures off", med(plain, "rate"), med(raw, "rate"), "/s",
                  min_ratio=TARGET_PIPE_PLAIN, ratio=plain_ratio, note="SDK with security.sign/verify false")
        table.add("pipelined writes: signatures on / off", med(sdk, "rate"), med(plain, "rate"), "/s",
                  ratio=cost, note="what signing costs the pipeline")
        summary["pipeline"].update(plain_rate=med(plain, "rate"), plain_ratio=plain_ratio, signature_cost=cost)
    sdk_f, raw_f = fan[sdk_v], fan[raw_v]
    watchers = ctx.args.watchers
    p99_ratio = _ratio_median([f.p99 for f in sdk_f], [f.p99 for f in raw_f])
    table.add(f"fan-out p50 ({watchers} watchers)", median([f.p50 for f in sdk_f]), median([f.p50 for f in raw_f]),
              "ms", ratio=_ratio_median([f.p50 for f in sdk_f], [f.p50 for f in raw_f]))
    table.add(f"fan-out p99 ({watchers} watchers)", median([f.p99 for f in sdk_f]), median([f.p99 for f in raw_f]),
              "ms", max_ratio=TARGET_FANOUT_P99, ratio=p99_ratio, note="raw: kv.watch's ordered consumer")
    table.add("fan-out, all watchers got it: p50", median([f.all_p50 for f in sdk_f]),
              median([f.all_p50 for f in raw_f]), "ms")
    table.add("fan-out, all watchers got it: p99", median([f.all_p99 for f in sdk_f]),
              median([f.all_p99 for f in raw_f]), "ms")
    summary["fanout"] = {"sdk_p50_ms": median([f.p50 for f in sdk_f]) * 1e3,
                         "raw_p50_ms": median([f.p50 for f in raw_f]) * 1e3,
                         "sdk_p99_ms": median([f.p99 for f in sdk_f]) * 1e3,
                         "raw_p99_ms": median([f.p99 for f in raw_f]) * 1e3, "p99_ratio": p99_ratio}
    return table, summary


def _auth_cost(seq: dict[str, dict[str, list[LatencyStats]]], fan: dict[str, list[FanoutStats]]) -> Table:
    """What authorization costs: each figure on the authorized bus next to the open bus's in the
    same run (median of the per-round ratios, rounds alternating between the two servers)."""
    table = Table("cost of authorization (JWT + TLS) in the same run: authorized bus / open bus "
                  "(median of per-round ratios; throughput: below 1 is slower)",
                  measured_label="authorized", baseline_label="open bus")

    def med(stats: list[LatencyStats], attr: str) -> float:
        return median([getattr(x, attr) for x in stats])

    for name, label in (("put", "put"), ("get", "get (direct)"), ("cas", "CAS update"), ("pipeline", "pipelined")):
        for side in ("sdk", "raw"):
            on, off = seq[name][side], seq[name][side + OPEN]
            table.add(f"{label} throughput, {side}", med(on, "rate"), med(off, "rate"), "/s",
                      ratio=_ratio_median([x.rate for x in on], [x.rate for x in off]))
        if name != "pipeline":
            for side in ("sdk", "raw"):
                on, off = seq[name][side], seq[name][side + OPEN]
                table.add(f"{label} p50, {side}", med(on, "p50"), med(off, "p50"), "us",
                          ratio=_ratio_median([x.p50 for x in on], [x.p50 for x in off]))
    for side in ("sdk", "raw"):
        on_f, off_f = fan[side], fan[side + OPEN]
        table.add(f"fan-out p99, {side}", median([f.p99 for f in on_f]), median([f.p99 for f in off_f]), "ms",
                  ratio=_ratio_median([f.p99 for f in on_f], [f.p99 for f in off_f]))
    return table


@contextlib.asynccontextmanager
async def _bench_bus(args: argparse.Namespace, base: Settings, sync_interval: str, open_bus: bool
                     ) -> AsyncIterator[Ctx]:
    """A server (authorized unless ``open_bus``), the SDK agent and the raw connection with the
    agent's identity (its ``.creds``, the CA, ``_INBOX.<agent>``; nothing on the open bus)."""
    async with embedded_nats(sync_interval, open_bus=open_bus, settings=base) as bus:
        settings = bus.settings
        raw_nc = await bus.raw_connect(AGENT, name="bench-raw", pending_size=64 * 1024 * 1024)
        try:
            plain_settings = settings.model_copy(update={"security": settings.security.model_copy(
                update={"sign": False, "verify": False})})
            async with Agent.connect(AGENT, settings=settings) as agent, \
                    Agent.connect(AGENT, settings=plain_settings) as plain, \
                    Agent.connect(WRITER, settings=settings) as writer:
                js = raw_nc.jetstream(timeout=settings.nats.request_timeout)
                # What js.key_value() returns, without its stream-info call (an agent may not).
                subjects = Subjects(settings.board.bucket)
                kv = KeyValue(name=settings.board.bucket, stream=subjects.kv_stream, pre=subjects.kv_prefix, js=js,
                              direct=True)
                value = {"text": "x" * args.value_bytes, "n": 12345}
                payload = encode_entry(value, author=agent.id)
                yield Ctx(args, bus, settings, agent, agent.board(BOARD), plain.board(BOARD), writer.board(BOARD),
                          raw_nc, js, kv, value, payload)
        finally:
            await raw_nc.close()


async def run(args: argparse.Namespace) -> int:
    base = Settings()
    sync_interval = args.sync_interval or base.nats.sync_interval
    base = base.model_copy(update={"nats": base.nats.model_copy(update={"sync_interval": sync_interval})})
    async with contextlib.AsyncExitStack() as stack:
        ctxs = {"": await stack.enter_async_context(
            _bench_bus(args, base, sync_interval, args.insecure_open_bus))}
        if args.with_open_bus and not args.insecure_open_bus:
            ctxs[OPEN] = await stack.enter_async_context(_bench_bus(args, base, sync_interval, True))
        return await _measure(ctxs, sync_interval)


#: Variants measured on the authorized bus only (the open bus has no signatures to turn off).
_SIGNED_ONLY = frozenset({"plain", "new-sdk", "new-raw", "alone-sdk", "alone-raw"})


def _variants(ctxs: dict[str, Ctx], fns: dict[str, Callable[[Ctx, int], Awaitable[Any]]]
              ) -> dict[str, Callable[[int], Awaitable[Any]]]:
    """Every variant of ``fns`` on every bus (named ``<variant><bus suffix>``), bound to its Ctx
    (the signature-only variants on the authorized bus only)."""
    def bind(fn: Callable[[Ctx, int], Awaitable[Any]], ctx: Ctx) -> Callable[[int], Awaitable[Any]]:
        return lambda r: fn(ctx, r)

    return {f"{name}{suffix}": bind(fn, ctx) for suffix, ctx in ctxs.items() for name, fn in fns.items()
            if not (ctx.bus.open_bus and name in _SIGNED_ONLY)}


async def _measure(ctxs: dict[str, Ctx], sync_interval: str) -> int:
    ctx = ctxs[""]
    args, raw_nc = ctx.args, ctx.raw_nc
    print(f"board_bench: python {platform.python_version()}, nats-py {_version('nats-py')}, "
          f"nats-server {raw_nc.connected_server_version}, sync_interval={sync_interval}, "
          f"envelope {len(ctx.payload)} B, {args.rounds} rounds x {args.ops} ops (blocks of {args.block}), "
          f"pipeline {args.pipeline_rounds} x {args.pipeline_ops}, fan-out {args.fanout_rounds} rounds x "
          f"{args.watchers} watchers x {args.rate:g}/s x {args.fanout_seconds:g}s", flush=True)
    for suffix, c in ctxs.items():
        raw = f"the agent's credential ({AGENT}.creds), the same CA, inbox prefix {c.raw_nc._inbox_prefix.decode()}" \
            if c.bus.auth is not None else "no credential, no TLS"
        print(f"{'and ' if suffix else ''}{c.bus.label}: SDK agent {AGENT!r} and raw nats-py with {raw}"
              f" ({c.bus.url})", flush=True)
    started = time.perf_counter()

    # warm-up (not measured): connections, caches, stream files
    await interleaved_ops(1, args.ops, args.block, _variants(ctxs, {"raw": raw_put, "sdk": sdk_put}))

    seq: dict[str, dict[str, list[LatencyStats]]] = {}
    phases: list[tuple[str, dict[str, Callable[[Ctx, int], Awaitable[Op]]]]] = [
        ("put", {"raw": raw_put, "raw+id": raw_put_id, "sdk": sdk_put, "plain": plain_put}),
        ("get", {"raw": raw_get, "sdk": sdk_get, "plain": plain_get}),
        ("get-new", {"new-raw": raw_get_new, "new-sdk": sdk_get_new}),
        ("get-alone", {"alone-raw": raw_get_alone, "alone-sdk": sdk_get_alone}),
        ("cas", {"raw": raw_cas, "sdk": sdk_cas, "plain": plain_cas}),
    ]
    for name, fns in phases:
        seq[name] = await interleaved_ops(args.rounds, args.ops, args.block, _variants(ctxs, fns))
        print(f"  {name}: done ({time.perf_counter() - started:.0f}s)", flush=True)
    seq["pipeline"] = await alternate(
        args.pipeline_rounds,
        _variants(ctxs, {"raw": raw_pipeline, "raw+id": raw_pipeline_id, "sdk": sdk_pipeline,
                         "plain": plain_pipeline}),
        between=_between)
    print(f"  pipeline: done ({time.perf_counter() - started:.0f}s)", flush=True)
    fan = await alternate(args.fanout_rounds, _variants(ctxs, {"raw": raw_fanout, "sdk": sdk_fanout}),
                          between=_between)
    print(f"  fan-out: done ({time.perf_counter() - started:.0f}s)", flush=True)

    summary: dict[str, Any] = {}
    misses: list[str] = []
    for suffix, c in ctxs.items():
        table, part = _report(c, seq, fan, suffix)
        part["sync_interval"] = sync_interval
        summary["open_bus" if suffix else "main"] = part
        print()
        print(table.render())
        print(f"per-round ratios (SDK/raw), {c.bus.label}: " + ", ".join(
            f"{name} " + " ".join(f"{s.rate / r.rate:.2f}" for s, r in zip(
                seq[name]["sdk" + suffix], seq[name]["raw" + suffix], strict=True))
            for name in ("put", "get", "cas", "pipeline"))
            + ("" if c.bus.open_bus else ", get (new revisions) " + " ".join(
                f"{s.rate / r.rate:.2f}" for s, r in zip(seq["get-new"]["new-sdk"], seq["get-new"]["new-raw"],
                                                         strict=True))
               + ", get (new, signed alone) " + " ".join(
                f"{s.rate / r.rate:.2f}" for s, r in zip(seq["get-alone"]["alone-sdk"],
                                                         seq["get-alone"]["alone-raw"], strict=True)))
            + "; fan-out p99 " + " ".join(f"{s.p99 / r.p99:.2f}" for s, r in zip(
                fan["sdk" + suffix], fan["raw" + suffix], strict=True)))
        misses += [f"{r.name} ({c.bus.label})" for r in table.misses]
    if OPEN in ctxs:
        print()
        print(_auth_cost(seq, fan).render())
    print(f"targets: put/get/CAS >= {TARGET_SEQ}x raw (signing and verifying; {TARGET_SEQ_PLAIN}x with "
          f"signatures off), pipelined >= {TARGET_PIPE}x raw async publish ({TARGET_PIPE_PLAIN}x off), "
          f"fan-out p99 <= {TARGET_FANOUT_P99}x raw KV watch -> "
          + ("all met" if not misses else "missed: " + ", ".join(misses)))
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    if args.profile is not None:
        print()
        print(await _profile(ctx, args.profile, args.profile_top))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description="Board benchmark: SDK next to raw nats-py KV.")
    parser.add_argument("--sync-interval", default=None,
                        help="JetStream sync_interval of the embedded server ('always' or a duration; "
                             "default: the settings default)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of put/get/CAS (default 10)")
    parser.add_argument("--ops", type=int, default=1000, help="sequential ops per round and variant")
    parser.add_argument("--block", type=int, default=100,
                        help="sequential ops per block; SDK and raw blocks alternate (default 100)")
    parser.add_argument("--pipeline-rounds", type=int, default=12, help="rounds of pipelined writes (default 12)")
    parser.add_argument("--pipeline-ops", type=int, default=5000, help="pipelined writes per round and variant")
    parser.add_argument("--fanout-rounds", type=int, default=5, help="rounds of fan-out (default 5)")
    parser.add_argument("--keys", type=int, default=100, help="distinct keys the ops cycle over")
    parser.add_argument("--value-bytes", type=int, default=200, help="size of the text in the value")
    parser.add_argument("--watchers", type=int, default=20)
    parser.add_argument("--rate", type=float, default=500.0, help="fan-out writes per second")
    parser.add_argument("--fanout-seconds", type=float, default=1.5, help="fan-out writing time per round")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    add_bus_option(parser)
    parser.add_argument("--with-open-bus", action="store_true",
                        help="also measure everything on an open-bus server in the same run (variants of both "
                             "servers alternate) and print what authorization costs")
    parser.add_argument("--profile", nargs="*", choices=sorted(_PROFILED), default=None,
                        help="afterwards, cProfile one SDK round of these phases (all when none named)")
    parser.add_argument("--profile-top", type=int, default=30)
    args = parser.parse_args(argv)
    if args.profile is not None and not args.profile:
        args.profile = list(_PROFILED)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
